"""`domino-sglang train`: train a Domino drafter from a TOML recipe and command-line overrides."""

from __future__ import annotations

import argparse
from pathlib import Path

from domino_sglang.cli.common import fail


def _parse_set(items: list[str]) -> dict:
    """`key=value` pairs; values parsed as TOML scalars (numbers, true/false), else strings."""
    import tomllib

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"train: --set expects key=value, got {item!r}")
        try:
            out[key] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = value
    return out


def cmd_train(args: argparse.Namespace) -> int:
    import json

    from domino_sglang.model.hub import HubError, resolve_folder
    from domino_sglang.train.config import TrainConfigError, target_defaults
    from domino_sglang.train.recipe import load_recipe, phase_step, plan, run_recipe

    overrides = _parse_set(args.set or [])
    defaults: dict = {}
    if args.target is not None:  # a folder or a hub id; defaults sized for it
        try:
            target = resolve_folder(args.target, "train: --target")
        except HubError as exc:
            fail(str(exc))
        if not (target / "config.json").is_file():
            fail(f"train: --target {args.target} has no config.json")
        overrides["target"] = str(target)
        if args.init is None and "init" not in overrides:
            try:
                defaults = target_defaults(json.loads((target / "config.json").read_text()))
            except TrainConfigError as exc:
                fail(str(exc))
    for key in ("data", "out", "init"):
        if getattr(args, key) is not None:
            overrides[key] = str(getattr(args, key))
    for key in ("steps", "device", "report_to", "strategy", "features"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    if args.max_length is not None:
        overrides["max_seq_len"] = args.max_length
    if args.chat_template is not None:
        overrides["chat_template"] = str(args.chat_template)
    try:
        phases, root = load_recipe(args.config, overrides, defaults)
        if args.plan:  # what would run, nothing trained (the data need not exist yet)
            print(plan(phases, root))
            return 0
        for data in sorted({p.conf.data for p in phases}):
            if not Path(data).is_file():
                fail(f"train: data {data} not found (a regenerated JSONL, or conversations: "
                      "ShareGPT JSON/JSONL or OpenAI chat JSONL)")
        if args.resume and not any(phase_step(p) for p in phases):
            fail(f"train: --resume, but {root or phases[0].conf.out} has no checkpoint")
        print(run_recipe(phases, root))
    except TrainConfigError as exc:
        fail(str(exc))
    return 0



def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `train` subcommand and its flags."""
    t = sub.add_parser("train", help="train a Domino drafter (base-anchored curriculum)")
    t.add_argument("--config", type=Path, default=None,
                   help="TOML recipe (keys: TrainConfig; [[phase]] tables run in order)")
    t.add_argument("--data", type=Path, default=None,
                   help="regenerated JSONL, or conversations used as written (off-policy): "
                        "ShareGPT JSON/JSONL or OpenAI chat JSONL")
    t.add_argument("--out", type=Path, default=None, help="run folder (resumed if present)")
    t.add_argument("--target", default=None,
                   help="target: a local folder or a hub id; the drafter's size, target layers "
                        "and curriculum default from its config.json")
    t.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None,
                   help="auto (default): CUDA when present, bf16 autocast; else the CPU")
    t.add_argument("--report-to", choices=("tensorboard",), default=None,
                   help="also log to OUT/tensorboard (needs the tensorboard package)")
    t.add_argument("--resume", action="store_true",
                   help="require a checkpoint in --out to resume from (a run always resumes "
                        "one that is there)")
    t.add_argument("--init", type=Path, default=None, help="start from this drafter")
    t.add_argument("--steps", type=int, default=None, help="steps (of every phase)")
    t.add_argument("--strategy", choices=("ddp", "fsdp"), default=None,
                   help="under torchrun: ddp (default; a replica per process) or fsdp (FSDP2: "
                        "the target and the drafter sharded, for targets one device cannot hold)")
    t.add_argument("--max-length", type=int, default=None,
                   help="tokens of a record kept, prompt + answer (config max_seq_len)")
    t.add_argument("--chat-template", type=Path, default=None,
                   help="conversations data: a Jinja chat template file to tokenise them with "
                        "(default: the target's own)")
    t.add_argument("--features", choices=("cache", "online"), default=None,
                   help="cache (default): the target's features written once per record under "
                        "OUT/features (safetensors; a run that would not fit the disk refuses "
                        "to start); online: computed in every step, nothing written")
    t.add_argument("--plan", action="store_true",
                   help="print the recipe's phases (settings, init, progress, the records, "
                        "tokens and feature cache size against the free disk) and exit")
    t.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key")
