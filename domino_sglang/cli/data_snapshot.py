"""`domino-sglang data-snapshot`: save regenerated data to a gzip'd snapshot, or restore it."""

from __future__ import annotations

import argparse
from pathlib import Path

from domino_sglang.cli.common import fail


def cmd_data_snapshot(args: argparse.Namespace) -> int:
    from domino_sglang.train.regenerate import restore_snapshot, write_snapshot

    if args.action == "save":
        if not args.data.is_file():
            fail(f"data-snapshot: --data {args.data} not found (a regenerated JSONL)")
        try:
            n = write_snapshot(args.data, args.snapshot)
        except (ValueError, KeyError) as exc:
            fail(f"data-snapshot: --data {args.data} is not a regenerated JSONL ({exc!r})")
        print(f"{args.snapshot}: {n} records")
        return 0
    if not args.snapshot.is_file():
        fail(f"data-snapshot: --snapshot {args.snapshot} not found")
    try:
        n = restore_snapshot(args.snapshot, args.data)
    except ValueError as exc:
        fail(f"data-snapshot: {exc}")
    print(f"{args.data}: {n} records restored from {args.snapshot}")
    return 0



def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `data-snapshot` subcommand and its flags."""
    ds = sub.add_parser("data-snapshot",
                        help="save the regenerated data to a gzip'd snapshot, or restore it")
    ds.add_argument("action", choices=["save", "restore"])
    ds.add_argument("--data", type=Path, required=True, help="regenerated JSONL (the cache)")
    ds.add_argument("--snapshot", type=Path, required=True, help="gzip'd JSONL snapshot")
