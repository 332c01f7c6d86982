"""Every command in README's command blocks runs as written, as far as this machine can run it:
each `domino-sglang` command parses with the CLI's own parser (serve's SGLang flags after `--`
with the plugin's rules), each `python -m sglang.launch_server` command parses with SGLang's own
parser with the plugin loaded, each `make` target exists (`make -n`), `hf download` is a command
of the pinned huggingface_hub, every path a command names exists, and the Helm / Compose
commands render (`helm template`, `docker-compose config`) where those tools are installed. A
README that drifts from the code (a renamed flag, a removed target) fails here."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def command_blocks(text: str) -> list[list[str]]:
    """The README's indented blocks as shell commands: continuations joined, comments and
    blank lines dropped, one string per command."""
    blocks, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("    ") and line.strip():
            current.append(line[4:])
        elif current and not line.strip():
            blocks.append(current)
            current = []
    commands = []
    for block in blocks:
        joined = "\n".join(block).replace("\\\n", " ")
        out = []
        for line in joined.splitlines():
            words = shlex.split(line, comments=True)
            if words:
                out.append(" ".join(shlex.quote(w) for w in words))
        commands.append(out)
    return commands


def shell_commands(text: str) -> list[list[str]]:
    """The argv of every shell command (blocks of Python or PromQL are not commands)."""
    found = []
    for block in command_blocks(text):
        for line in block:
            argv = shlex.split(line)
            while argv and re.fullmatch(r"[A-Z_]+=\S*", argv[0]):  # VAR=value prefixes
                argv = argv[1:]
            if argv and argv[-1] == "&":
                argv = argv[:-1]
            if argv and argv[0] in ("make", "domino-sglang", "python", "hf", "helm", "docker",
                                    "kubectl", "pip"):
                found.append(argv)
    return found


def problem(argv: list[str]) -> str | None:
    """What is wrong with one README command (None: it runs as written here, or this machine
    cannot tell: a tool that is not installed)."""
    head = argv[0]
    if head == "domino-sglang":
        return _cli_problem(argv[1:])
    if head == "python" and argv[1:3] == ["-m", "sglang.launch_server"]:
        return _launcher_problem(argv[3:])
    if head == "make":
        done = subprocess.run(["make", "-n", *argv[1:]], cwd=ROOT, capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL)
        return None if done.returncode == 0 else done.stderr.strip().splitlines()[-1]
    if head == "hf":
        hf = Path(sys.executable).parent / "hf"
        done = subprocess.run([str(hf), argv[1], "--help"], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
        return None if done.returncode == 0 else f"hf {argv[1]}: {done.stderr.strip()[-200:]}"
    if head == "helm" and argv[1] == "install":
        return _helm_problem(argv[2:])
    if head == "docker" and argv[1] == "compose":
        return _compose_problem(argv[2:])
    if head == "kubectl" and argv[1] == "apply":
        flag = "-k" if "-k" in argv else "-f"
        path = ROOT / argv[argv.index(flag) + 1]
        if flag == "-k":
            path = path / "kustomization.yaml"
        return None if path.exists() else f"{path} does not exist"
    return None  # pip install, kubectl create: nothing of ours to check


def _cli_problem(args: list[str]) -> str | None:
    from domino_sglang import cli
    from domino_sglang.integration import server_flags
    from domino_sglang.spec import options

    own, extra = (args[:args.index("--")], args[args.index("--") + 1:]) if "--" in args \
        else (args, [])
    try:
        cli.make_parser().parse_args(own)
    except SystemExit:
        return f"domino-sglang {' '.join(own)}: the CLI refuses it"
    try:
        server_flags.check_flags(extra)
    except options.DominoOptionError as exc:
        return str(exc)
    return None


def _launcher_problem(args: list[str]) -> str | None:
    import argparse

    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import ServerArgs

    load_plugins()  # as the launcher does: the plugin's flags join SGLang's parser
    parser = argparse.ArgumentParser(exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    try:
        _, unknown = parser.parse_known_args(args)
    except argparse.ArgumentError as exc:
        return f"sglang.launch_server: {exc}"
    return f"sglang.launch_server: unknown flags {unknown}" if unknown else None


def _helm_problem(args: list[str]) -> str | None:
    helm = shutil.which("helm") or str(Path(sys.executable).parent / "helm")
    if not Path(helm).exists():
        return None
    done = subprocess.run([helm, "template", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    return None if done.returncode == 0 else f"helm template: {done.stderr.strip()[-300:]}"


def _compose_problem(args: list[str]) -> str | None:
    tool = shutil.which("docker-compose")
    if tool is None:
        return None
    args = [a for a in args if a not in ("up", "-d")] + ["config", "--quiet"]
    env = {**os.environ, "MODEL_PATH": "Qwen/Qwen3-8B", "DRAFTER": "x/y", "HF_TOKEN": "t"}
    done = subprocess.run([tool, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=env, stdin=subprocess.DEVNULL)
    return None if done.returncode == 0 else f"docker-compose: {done.stderr.strip()[-300:]}"


def test_every_readme_command_runs_as_written():
    commands = shell_commands(README.read_text())
    heads = {c[0] for c in commands}
    assert {"make", "domino-sglang", "python", "hf", "helm"} <= heads, heads
    launchers = [c for c in commands if c[:3] == ["python", "-m", "sglang.launch_server"]]
    assert len(launchers) >= 2  # the hub-id one and the local-folder one
    problems = [(" ".join(c), p) for c in commands if (p := problem(c)) is not None]
    assert problems == []


@pytest.mark.parametrize("stale", [
    "    domino-sglang serve --model-path m --drafter d --no-such-flag\n",
    "    domino-sglang serve --model-path m -- --speculative-domino-adaptive sometimes\n",
    "    python -m sglang.launch_server --model-path m --speculative-domino-no-such 1\n",
    "    make no-such-target\n",
    "    huggingface-cli download org/name\n",  # not a command this test knows: skipped ...
])
def test_a_stale_command_is_caught(stale):
    commands = shell_commands("Text.\n\n" + stale + "\nMore text.\n")
    if stale.split()[0] == "huggingface-cli":  # ... so the README must not carry it at all
        assert commands == [] and "huggingface-cli" not in README.read_text()
        return
    assert len(commands) == 1 and problem(commands[0]) is not None
