"""`domino-sglang serve`: check the drafter and flags, then become a stock `sglang serve`.

`serve` builds a stock `sglang serve` command line (SGLang's current entry point; our plugin is
loaded by SGLang itself through its entry point) and replaces this process with it, so the
server's PID is the one the user started. `--model-path` and `--drafter` take a local folder or a
Hugging Face hub id (model/hub.py). Imports no SGLang (local_server uses `sglang_serve_argv`).
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from pathlib import Path

from domino_sglang import paths
from domino_sglang.cli.common import fail
from domino_sglang.http.flags import GUARDS_FLAG, KEY_FILE_FLAGS, flag_value, read_key_file
from domino_sglang.http.guards import redact_command
from domino_sglang.spec.options import DominoOptionError


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def build_serve_command(args: argparse.Namespace, extra: list[str]) -> tuple[list[str], dict]:
    """Return (argv, env overrides) of the SGLang launch for `serve`."""
    model = str(args.model_path)
    cmd = [
        *sglang_serve_argv(),
        "--model-type", "llm",  # skip `sglang serve`'s diffusion probe (a hub request per id)
        "--model-path", model,
        "--host", args.host,
        "--port", str(args.port),
        "--enable-metrics",
    ]
    if not _has_flag(extra, GUARDS_FLAG):  # serve's servers are guarded, DOMINO or not
        cmd += [GUARDS_FLAG, "on"]
    cmd += _key_args(args.api_key, args.api_key_file, "--api-key")
    cmd += _key_args(args.admin_api_key, args.admin_api_key_file, "--admin-api-key")
    if args.tp_size < 1:
        fail(f"--tp-size must be >= 1, got {args.tp_size}")
    if args.tp_size > 1:
        if _has_flag(extra, "--tp-size"):
            fail("--tp-size is given twice (before and after `--`): give it once")
        cmd += ["--tp-size", str(args.tp_size)]
    env: dict[str, str] = {}
    drafter = None if args.no_speculation else (args.drafter or _default_drafter())
    if drafter is not None and not _has_flag(extra, "--speculative-algorithm"):
        cmd += ["--speculative-algorithm", "DOMINO", "--speculative-draft-model-path", str(drafter)]
    device = args.device or ("cuda" if _cuda_available() else "cpu")
    if device == "cpu":
        # SGLang's CPU path keys off SGLANG_USE_CPU_ENGINE; our .pth hook then provides the
        # sgl_kernel ops and `domino_cpu` attention handles verify (torch_native cannot).
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        env["OMP_NUM_THREADS"] = str(max(1, args.threads // args.tp_size))
        if args.cpu_hugepages == "on":
            # glibc then advises transparent huge pages for the memory it maps (the weights, the
            # KV pool): a decode step streams every weight, slower through 4 KB pages
            # (docs/cpu-runtime.md)
            from domino_sglang.cpu.bootstrap import malloc_tunables_with_hugepages

            env["GLIBC_TUNABLES"] = malloc_tunables_with_hugepages()
        if args.tp_size > 1:
            # SGLang asks for one core set per rank once there are more ranks than NUMA nodes
            env["SGLANG_CPU_OMP_THREADS_BIND"] = args.cpu_binding or cpu_binding(
                args.tp_size, sorted(os.sched_getaffinity(0)))
        cmd += ["--device", "cpu", "--attention-backend", "domino_cpu"]
        from domino_sglang.cpu.dtype import default_cpu_dtype

        cmd += ["--dtype", args.dtype or default_cpu_dtype()]
        if not _has_flag(extra, "--max-total-tokens"):
            cmd += ["--max-total-tokens", str(args.max_total_tokens)]
        # On a CPU the KV pool is capped by --max-total-tokens; SGLang's --mem-fraction-static
        # only gates start-up: it refuses to start when the weights (target + draft) take more
        # than that fraction of the RAM it measured free before loading them. That measure
        # moves under cgroups (page cache counts against memory.max) and with a second replica
        # loading beside this one: at 0.3 a replica started beside another refused
        # (docs/cpu-runtime.md). 0.8 keeps the guard and leaves those swings room.
        if not _has_flag(extra, "--mem-fraction-static"):
            cmd += ["--mem-fraction-static", "0.8"]
        # An idle SGLang scheduler busy-polls its sockets at 100% of a core; on a CPU server
        # that core is the one decoding, so block on the sockets instead (wakes on arrival).
        if not _has_flag(extra, "--sleep-on-idle"):
            cmd += ["--sleep-on-idle"]
    else:
        cmd += ["--device", device, "--attention-backend", "flashinfer"]
        if args.dtype:
            cmd += ["--dtype", args.dtype]
    return cmd + extra, env


def _key_args(key: str | None, path: str | None, flag: str) -> list[str]:
    """SGLang's arguments for one key: from its file (`--api-key-file`: checked here, passed as
    the plugin's key-file flag, so the key is in no command line), else the key given (passed
    as `flag KEY`, visible in the server's process list)."""
    file_flag = next(f for f, k in KEY_FILE_FLAGS.items() if k == flag)
    if path is not None:
        if key is not None:
            fail(f"serve: {flag} and {flag}-file are both given: give one")
        try:
            read_key_file(path, f"{flag}-file")
        except DominoOptionError as exc:
            fail(f"serve: {exc}")
        return [file_flag, str(Path(path).resolve())]
    return [flag, key] if key else []


def cpu_binding(ranks: int, cores: list[int]) -> str:
    """SGLANG_CPU_OMP_THREADS_BIND for `ranks` CPU ranks over `cores`: contiguous equal shares
    ("0-3|4-7"), or one core each, reused in turn, when there are fewer cores than ranks."""
    if len(cores) < ranks:
        return "|".join(str(cores[i % len(cores)]) for i in range(ranks))
    per = len(cores) // ranks
    parts = []
    for i in range(ranks):
        share = cores[i * per:(i + 1) * per]
        contiguous = share[-1] - share[0] == len(share) - 1
        parts.append(f"{share[0]}-{share[-1]}" if contiguous and len(share) > 1
                     else ",".join(map(str, share)))
    return "|".join(parts)


def sglang_serve_argv() -> list[str]:
    """`sglang serve` of this interpreter's environment (its console script, else the module)."""
    script = Path(sys.executable).parent / "sglang"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script), "serve"]
    # sglang.cli.main.main: listed in sglang_compat.TOUCHPOINTS (not imported here: no SGLang)
    return [sys.executable, "-c", "import sys; from sglang.cli.main import main; "
            "sys.argv[0] = 'sglang'; sys.exit(main())", "serve"]


def _default_drafter() -> Path | None:
    """The drafter shipped in the package for the default target, if this build has one."""
    path = paths.shipped_drafter_dir()
    return path if (path / "config.json").is_file() else None


def _has_flag(argv: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def _check_plugin_flags(extra: list[str]) -> dict:
    """The plugin's flags among the SGLang flags after `--` (`--speculative-domino-*`,
    `--domino-*`), parsed as SGLang will parse them: a bad value fails here, with one line
    naming the flag, instead of a minute later in SGLang's start-up. Returns the DOMINO flags
    given ({field: value})."""
    from domino_sglang.integration.server_flags import check_flags
    from domino_sglang.spec.options import DominoOptionError

    try:
        return check_flags(extra)
    except DominoOptionError as exc:
        fail(f"serve: {exc}")


def _check_drafter(drafter: Path, target_cfg: dict | None, extra: list[str],
                   model_path: str | Path, flags: dict | None = None) -> None:
    """Everything the DOMINO worker checks at start-up (config, match with the target, weight
    names / shapes / finiteness, safetensors only, the draft vocabulary, the DOMINO options
    against the drafter's block size), before SGLang spends minutes loading the target: a
    malformed drafter or option fails here with one line. `flags`: _check_plugin_flags'."""
    from domino_sglang.model.config import (
        DrafterConfigError,
        check_against_target,
        load_draft_config,
        load_draft_weights,
    )
    from domino_sglang.model.vocab import load_draft_vocab
    from domino_sglang.spec import options

    block = flag_value(extra, "--speculative-num-draft-tokens")
    try:
        conf = load_draft_config(drafter, int(block) if block and block.isdigit() else None,
                                 tokenizer_path=flag_value(extra, "--tokenizer-path") or model_path)
        if target_cfg is not None:
            t = target_cfg.get("text_config") or target_cfg  # multimodal configs nest it
            check_against_target(conf, t["hidden_size"], t["vocab_size"], t["num_hidden_layers"])
        load_draft_weights(conf)
        load_draft_vocab(conf.path, conf.vocab_size)
    except DrafterConfigError as exc:
        fail(f"serve: {exc}")
    algorithm = flag_value(extra, "--speculative-algorithm")
    if algorithm is not None and algorithm.upper() != "DOMINO":
        return
    # the launcher's resolution (algorithm.resolve_server_args) of what the command line decides
    given = dict(flags or {})
    adaptive_file = flag_value(extra, "--speculative-adaptive-config")
    if adaptive_file:
        given["speculative_adaptive_config"] = adaptive_file
    pool = flag_value(extra, options.POOL_FLAG)
    try:
        options.resolve(conf, conf.block_size, given,
                        pool_flag=int(pool) if pool and pool.lstrip("-").isdigit() else None)
    except options.DominoOptionError as exc:
        fail(f"serve: {exc}")


def cmd_serve(args: argparse.Namespace, extra: list[str]) -> int:
    flags = _check_plugin_flags(extra)
    if args.model_path is None:
        from domino_sglang.model.target import TargetError, prepare_target

        try:
            args.model_path = prepare_target()
        except TargetError as exc:
            fail(f"serve: {exc}")
    from domino_sglang.model.hub import DRAFTER_FILES, HubError, resolve_folder, target_config

    try:  # a hub id stays an id for SGLang; its config.json (cached / fetched) serves the check
        target_cfg = target_config(args.model_path)
        if args.drafter is not None and not args.no_speculation:
            args.drafter = resolve_folder(args.drafter, "--drafter", DRAFTER_FILES)
    except HubError as exc:
        fail(f"serve: {exc}")
    if args.drafter is not None and not args.no_speculation:
        _check_drafter(Path(args.drafter), target_cfg, extra, args.model_path, flags)
    if _port_in_use(args.host, args.port):
        fail(f"serve: port {args.port} on {args.host} is already in use; choose another --port")
    cmd, env = build_serve_command(args, extra)
    print(f"domino-sglang: serving {args.model_path} at http://{args.host}:{args.port}/v1",
          flush=True)
    for key, value in env.items():
        print(f"domino-sglang: env {key}={value}", flush=True)
    print("domino-sglang: " + " ".join(redact_command(cmd)), flush=True)
    if args.dry_run:
        return 0
    os.environ.update(env)
    os.execv(cmd[0], cmd)
    return 0  # unreachable


def _serve_epilog() -> str:
    """The DOMINO flags SGLang takes after `--` (options.py), for `serve --help`."""
    from domino_sglang.spec.options import FLAGS

    lines = ["DOMINO options, passed to SGLang after `--` (see `python -m sglang.launch_server "
             "--help`), e.g.", "  domino-sglang serve -- --speculative-domino-adaptive off", ""]
    for flag in FLAGS:
        lines.append(f"  {flag.name} {flag.metavar}")
    lines += ["  --domino-allowed-origins, --domino-allowed-hosts, --domino-max-request-bytes, "
              "--domino-request-guards on|off"]
    return "\n".join(lines)



def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `serve` subcommand and its flags (SGLang's own after `--`)."""
    s = sub.add_parser(
        "serve", help="launch the SGLang server (extra SGLang flags after `--`)",
        epilog=_serve_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=30000)
    s.add_argument("--model-path", default=None,
                   help="target: a local folder or a Hugging Face hub id, e.g. Qwen/Qwen3-8B "
                        f"(default: the prepared {paths.DEFAULT_TARGET_NAME})")
    s.add_argument("--no-speculation", action="store_true", help="plain decoding")
    s.add_argument("--drafter", default=None,
                   help="Domino drafter: a local folder or a hub id, e.g. "
                        "Huang2020/Qwen3-8B-Domino-b16 (default: the shipped one, if any)")
    s.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: auto")
    s.add_argument("--dtype", default=None,
                   help="model dtype (CPU default: bfloat16 where the CPU has native bf16 "
                        "matmuls, AVX512-BF16 or AMX; float32 otherwise, see cpu/dtype.py)")
    s.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                   help="torch threads of the CPU server, shared by its tensor-parallel ranks "
                        "(default: cores - 1)")
    s.add_argument("--tp-size", type=int, default=1,
                   help="tensor-parallel ranks (SGLang's --tp-size); on a CPU each rank gets "
                        "its share of the cores (--cpu-binding)")
    s.add_argument("--cpu-binding", default=None,
                   help="the CPU ranks' cores, SGLang's SGLANG_CPU_OMP_THREADS_BIND (e.g. "
                        "'0-3|4-7'; default: equal shares of this process's cores)")
    s.add_argument("--cpu-hugepages", choices=["on", "off"], default="on",
                   help="back the CPU server's weights and KV pool with transparent huge pages "
                        "where the kernel allows them (glibc.malloc.hugetlb=1 added to "
                        "GLIBC_TUNABLES; default on)")
    s.add_argument("--max-total-tokens", type=int, default=65536,
                   help="CPU KV pool size in tokens (default 65536)")
    s.add_argument("--api-key", default=None,
                   help="require `Authorization: Bearer KEY` on the API (SGLang's --api-key; "
                        "/health and /metrics stay open). A key given here is on the server's "
                        "command line, which local users can list: --api-key-file keeps it off")
    s.add_argument("--api-key-file", default=None, metavar="PATH",
                   help="read --api-key from this file (e.g. a mounted Kubernetes Secret)")
    s.add_argument("--admin-api-key", default=None,
                   help="the key of the admin routes (weight updates, cache flush, aborts, "
                        "profiling; SGLang's --admin-api-key); without it they answer 403. "
                        "More HTTP options after `--`: --domino-allowed-origins, "
                        "--domino-allowed-hosts, --domino-max-request-bytes")
    s.add_argument("--admin-api-key-file", default=None, metavar="PATH",
                   help="read --admin-api-key from this file")
    s.add_argument("--dry-run", action="store_true", help="print the command, do not run it")
