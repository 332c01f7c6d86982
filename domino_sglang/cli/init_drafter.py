"""`domino-sglang init-drafter`: write a randomly initialised Domino drafter for a target."""

from __future__ import annotations

import argparse
from pathlib import Path

from domino_sglang.cli.common import fail


def cmd_init_drafter(args: argparse.Namespace) -> int:
    import json

    from domino_sglang.model.config import (
        DrafterConfigError,
        load_draft_config,
        make_draft_config,
    )
    from domino_sglang.model.drafter import init_drafter_weights, save_drafter

    target_cfg_path = Path(args.target) / "config.json"
    if not target_cfg_path.is_file():
        fail(f"init-drafter: {target_cfg_path} not found (TARGET must be a checkpoint folder)")
    cfg = make_draft_config(json.loads(target_cfg_path.read_text()), num_layers=args.layers,
                            block_size=args.block_size, num_features=args.num_features,
                            gru_hidden_dim=args.gru_hidden_dim, emb_dim=args.emb_dim)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)  # validate the config before writing weights
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    try:
        conf = load_draft_config(out)
    except DrafterConfigError as exc:
        fail(f"init-drafter: {exc}")
    save_drafter(out, cfg, init_drafter_weights(conf, seed=args.seed))
    print(out)
    return 0



def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `init-drafter` subcommand and its flags."""
    d = sub.add_parser("init-drafter", help="write a randomly initialised Domino drafter")
    d.add_argument("target", type=Path, help="target checkpoint folder (its config.json)")
    d.add_argument("out", type=Path)
    d.add_argument("--layers", type=int, default=2, help="draft decoder layers (default 2)")
    d.add_argument("--block-size", type=int, default=16)
    d.add_argument("--num-features", type=int, default=None,
                   help="target layers read (default max(3, layers))")
    d.add_argument("--gru-hidden-dim", type=int, default=256)
    d.add_argument("--emb-dim", type=int, default=64)
    d.add_argument("--seed", type=int, default=0)
