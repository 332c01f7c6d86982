"""The `domino-sglang` command: one module a subcommand, wired to argparse here.

Subcommands: prepare_target, init_drafter, regenerate, data_snapshot, draft_vocab, train, serve,
export_llamacpp;
`main` is the console script. Importing this package imports no SGLang and no torch: each
subcommand imports what it needs when it runs. local_server.py (local servers started and
stopped by PID: `regenerate`, the tests, the benchmarks) is imported by subcommands only.
"""

from __future__ import annotations

import argparse
import sys

from domino_sglang.cli import (
    data_snapshot,
    draft_vocab,
    export_llamacpp,
    init_drafter,
    prepare_target,
    regenerate,
    serve,
    train,
)

# in the order `domino-sglang --help` lists them
SUBCOMMANDS = (prepare_target, init_drafter, regenerate, data_snapshot, draft_vocab, train, serve,
               export_llamacpp)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="domino-sglang",
        description="DOMINO speculative decoding on SGLang: serve a model, prepare the demo "
                    "target, build training data, train a drafter.")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    args = make_parser().parse_args(argv)
    if args.command == "prepare-target":
        return prepare_target.cmd_prepare_target(args)
    if args.command == "serve":
        return serve.cmd_serve(args, extra)
    if args.command == "init-drafter":
        return init_drafter.cmd_init_drafter(args)
    if args.command == "regenerate":
        return regenerate.cmd_regenerate(args)
    if args.command == "data-snapshot":
        return data_snapshot.cmd_data_snapshot(args)
    if args.command == "train":
        return train.cmd_train(args)
    if args.command == "draft-vocab":
        return draft_vocab.cmd_draft_vocab(args)
    if args.command == "export-llamacpp":
        return export_llamacpp.cmd_export_llamacpp(args)
    return 2
