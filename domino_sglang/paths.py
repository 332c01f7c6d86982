"""Where domino_sglang keeps rebuilt artefacts (the converted target) and the shipped drafter."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_TARGET_NAME = "SmolLM2-135M-Instruct"


def home() -> Path:
    """Cache root: `$DOMINO_SGLANG_HOME`, default `~/.cache/domino_sglang`."""
    env = os.environ.get("DOMINO_SGLANG_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "domino_sglang"


def target_dir(name: str = DEFAULT_TARGET_NAME) -> Path:
    return home() / "targets" / name


def shipped_drafter_dir() -> Path:
    """The drafter committed inside the package (trained for the default target)."""
    return Path(__file__).parent / "drafters" / f"{DEFAULT_TARGET_NAME}-domino"
