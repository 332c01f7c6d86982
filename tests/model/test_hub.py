"""`serve --model-path / --drafter` with Hugging Face hub ids, resolved offline from a hub-cache
layout built here (no network): the id reaches SGLang as is, the drafter as its snapshot folder,
and an id missing from the cache fails with one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from domino_sglang import paths
from domino_sglang.model.hub import is_hub_id

ROOT = Path(__file__).resolve().parents[2]
TARGET_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
DRAFTER_ID = "Huang2020/SmolLM2-135M-Instruct-Domino-b16"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _cache_repo(hub: Path, repo_id: str, files: dict[str, Path | str]) -> Path:
    """huggingface_hub's cache layout: blobs/, refs/main -> commit, snapshots/<commit>/ links."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for i, (name, src) in enumerate(files.items()):
        blob = repo / "blobs" / f"{i:040x}"
        if isinstance(src, Path):
            shutil.copyfile(src, blob)
        else:
            blob.write_text(src)
        (snap / name).symlink_to(os.path.relpath(blob, snap))
    return snap


@pytest.fixture()
def hf_home(tmp_path, target_path):
    hub = tmp_path / "hf" / "hub"
    target_cfg = json.loads((Path(target_path) / "config.json").read_text())
    _cache_repo(hub, TARGET_ID, {"config.json": json.dumps(target_cfg)})
    wide = dict(target_cfg, hidden_size=target_cfg["hidden_size"] * 2)
    _cache_repo(hub, "someone/wider-model", {"config.json": json.dumps(wide)})
    shipped = paths.shipped_drafter_dir()
    snap = _cache_repo(hub, DRAFTER_ID, {f.name: f for f in sorted(shipped.iterdir())
                                         if f.suffix in (".json", ".safetensors")})
    return tmp_path / "hf", snap


def _serve(hf: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    env.update(HF_HOME=str(hf), HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "domino_sglang.cli", "serve", "--dry-run",
                           "--port", "0", "--device", "cpu", *args], capture_output=True,
                          text=True, env=env, timeout=120, stdin=subprocess.DEVNULL)


def _command(stdout: str) -> list[str]:
    line = next(x for x in stdout.splitlines() if " serve " in x and "--model-path" in x)
    return line.removeprefix("domino-sglang: ").split()


def test_hub_ids_resolve_from_the_cache_offline(hf_home):
    hf, snap = hf_home
    proc = _serve(hf, "--model-path", TARGET_ID, "--drafter", DRAFTER_ID)
    assert proc.returncode == 0, proc.stderr
    cmd = _command(proc.stdout)
    assert cmd[1:3] == ["serve", "--model-type"] and Path(cmd[0]).name in ("sglang", "python3",
                                                                            "python")
    assert cmd[cmd.index("--model-path") + 1] == TARGET_ID  # SGLang resolves the id itself
    assert cmd[cmd.index("--speculative-draft-model-path") + 1] == str(snap)
    assert "sglang.launch_server" not in proc.stdout  # the deprecated entry point is gone


def test_hub_target_config_is_checked_against_the_drafter(hf_home):
    hf, _ = hf_home
    proc = _serve(hf, "--model-path", "someone/wider-model", "--drafter", DRAFTER_ID)
    assert proc.returncode == 2
    assert "field 'hidden_size' is 576 but the target's is 1152" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("flag,ref,message", [
    ("--drafter", "Huang2020/not-cached", "--drafter Huang2020/not-cached: not in the Hugging "
                                          "Face cache"),
    ("--model-path", "Qwen/not-cached", "--model-path Qwen/not-cached: not in the Hugging Face "
                                        "cache"),
    ("--model-path", "./no/such/folder/here", "--model-path ./no/such/folder/here does not "
                                              "exist, and is not a hub id"),
    ("--drafter", "/no/such/drafter", "--drafter /no/such/drafter: no such folder, and not a "
                                      "hub id"),
])
def test_unresolvable_references_fail_with_one_line(hf_home, target_path, flag, ref, message):
    hf, _ = hf_home
    args = ["--model-path", str(target_path), "--drafter", DRAFTER_ID]
    args[args.index(flag) + 1] = ref
    proc = _serve(hf, *args)
    assert proc.returncode == 2, proc.stdout
    assert message in proc.stderr
    assert ("HF_HUB_OFFLINE is set" in proc.stderr) == ("cache" in message)
    assert proc.stderr.startswith("domino-sglang: error: serve: ")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_is_hub_id(tmp_path):
    assert is_hub_id("Qwen/Qwen3-8B") and is_hub_id("Huang2020/Qwen3-8B-Domino-b16")
    for bad in ("Qwen3-8B", "a/b/c", "../etc", "/abs/path", "org/..", "org/name-", ""):
        assert not is_hub_id(bad), bad
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "name").mkdir()
    assert not is_hub_id(str(tmp_path / "org" / "name"))  # an existing folder is a folder


LAUNCHER = """
import sys
from domino_sglang.integration import plugin
plugin.register()  # as SGLang's plugin loader does before parsing
from sglang.srt.arg_groups.overrides import resolved_view
from sglang.srt.server_args import prepare_server_args
args = prepare_server_args(sys.argv[1:])
args.resolve_once()
print("DRAFTER", resolved_view(args).speculative_draft_model_path)
"""


def test_sglangs_own_launcher_resolves_a_drafter_hub_id_offline(hf_home, target_path):
    """`python -m sglang.launch_server ... --speculative-draft-model-path ORG/NAME` (README's
    command): SGLang's own argument pipeline, with the plugin loaded, turns the id into its
    snapshot folder from the cache, offline; an id missing from the cache stops start-up."""
    hf, snap = hf_home
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    env.update(HF_HOME=str(hf), HF_HUB_OFFLINE="1", SGLANG_USE_CPU_ENGINE="1")
    argv = ["--model-path", str(target_path), "--device", "cpu", "--attention-backend",
            "domino_cpu", "--speculative-algorithm", "DOMINO",
            "--speculative-draft-model-path"]
    proc = subprocess.run([sys.executable, "-c", LAUNCHER, *argv, DRAFTER_ID],
                          capture_output=True, text=True, env=env, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"DRAFTER {snap}" in proc.stdout
    missing = subprocess.run([sys.executable, "-c", LAUNCHER, *argv, "someone/not-cached"],
                             capture_output=True, text=True, env=env, timeout=300,
                             stdin=subprocess.DEVNULL)
    # SGLang reads the draft config itself first (its algorithm alias check) and stops there
    assert missing.returncode != 0 and "cached files" in missing.stderr
