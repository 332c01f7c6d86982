"""`domino-sglang draft-vocab`: write a drafter's draft vocabulary from regenerated data."""

from __future__ import annotations

import argparse
from pathlib import Path

from domino_sglang import paths
from domino_sglang.cli.common import fail


def cmd_draft_vocab(args: argparse.Namespace) -> int:
    from domino_sglang.model.config import DrafterConfigError, load_draft_config
    from domino_sglang.model.vocab import build_draft_vocab, special_token_ids, write_draft_vocab

    try:
        conf = load_draft_config(args.drafter)
    except DrafterConfigError as exc:
        fail(f"draft-vocab: {exc}")
    if not 1 <= args.size <= conf.vocab_size:
        fail(f"draft-vocab: --size must be in [1, {conf.vocab_size}] (the drafter's "
              f"vocab_size), got {args.size}")
    if not args.data.is_file():
        fail(f"draft-vocab: --data {args.data} not found (a regenerated JSONL)")
    target = args.target or paths.target_dir()
    if not Path(target).is_dir():
        fail(f"draft-vocab: --target {target} is not a folder (the target's checkpoint)")
    try:
        ids = build_draft_vocab(args.data, args.size, args.max_id,
                                always=special_token_ids(target))
    except (KeyError, ValueError) as exc:
        fail(f"draft-vocab: --data {args.data} is not a regenerated JSONL ({exc!r})")
    print(write_draft_vocab(args.drafter, ids, source=args.data.name, max_id=args.max_id))
    return 0



def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `draft-vocab` subcommand and its flags."""
    v = sub.add_parser("draft-vocab",
                       help="write a drafter's draft vocabulary (its most frequent answer tokens)")
    v.add_argument("drafter", type=Path, help="drafter folder (draft_vocab.json is written there)")
    v.add_argument("--data", type=Path, required=True, help="regenerated JSONL")
    v.add_argument("--size", type=int, default=8192, help="tokens kept (default 8192)")
    v.add_argument("--max-id", type=int, default=None,
                   help="only records with id <= this (the training records)")
    v.add_argument("--target", default=None,
                   help="the target's folder, whose special tokens are always kept (default: "
                        "the prepared demo target)")
