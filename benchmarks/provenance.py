"""Provenance of a benchmark run: command, machine, software revision, date."""

from __future__ import annotations

import datetime as dt
import os
import platform
import shlex
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from domino_sglang.cpu.dtype import native_bf16

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str, cwd: Path = ROOT) -> str:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except Exception:
        return "unknown"


def git_revision(tree: Path = ROOT) -> str:
    """Short revision of a checkout, `-dirty` if tracked files differ from it."""
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no", cwd=tree))
    return _git("rev-parse", "--short", "HEAD", cwd=tree) + ("-dirty" if dirty else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _pkg(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"


def collect() -> dict:
    return {
        "command": " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv]),
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S"),
        "revision": git_revision(),
        "machine": f"{_cpu_model()}, {os.cpu_count()} cores, "
                   f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, "
                   f"native bf16: {'yes' if native_bf16() else 'no'}",
        "python": platform.python_version(),
        "torch": _pkg("torch"),
        "sglang": _pkg("sglang"),
    }


def markdown_header(prov: dict) -> str:
    return "\n".join([
        f"- command: `{prov['command']}`",
        f"- machine: {prov['machine']}",
        f"- revision: {prov['revision']} (torch {prov['torch']}, sglang {prov['sglang']})"
        + (f"; the `-base` methods served from {prov['base_tree_revision']}"
           if "base_tree_revision" in prov else ""),
        f"- date: {prov['date_utc']} UTC",
    ])
