"""Compare drafters offline on regenerated records none of them trained on (no server).

For each drafter folder: `tau_rollout` (the served greedy rollout over 16 random anchors per
record, head on / backbone only; `trainer.rollout_tau`) and the exact served-equivalent replay
of each whole answer with a fixed block (`trainer.replay_rounds`: generated tokens / verify
rounds, what a DOMINO server would report for that answer), target features in float32.

    python benchmarks/compare_drafters.py --min-id 1391 --max-id 1426 \
        /tmp/drafter_stage2 domino_sglang/drafters/SmolLM2-135M-Instruct-domino

Pick the id range from the stages' recipes (`max_id`, held-out = the last `eval_records`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from domino_sglang.config import load_draft_config
from domino_sglang.model import DominoDrafter
from domino_sglang.paths import target_dir
from domino_sglang.train.trainer import (
    DrafterTrainModule,
    TargetFeatures,
    TrainConfig,
    load_records,
    replay_rounds,
    rollout_tau,
)

DEFAULT_DATA = Path("~/.cache/domino_sglang/data/sharegpt-greedy256.jsonl").expanduser()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("drafters", nargs="+", type=Path)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--min-id", type=int, required=True)
    ap.add_argument("--max-id", type=int, required=True)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    conf = TrainConfig(data=str(args.data), out="-")  # anchors / max_seq_len as in training
    records = [r for r in load_records(args.data, conf.max_seq_len, args.max_id)
               if r["id"] >= args.min_id]
    if not records:
        raise SystemExit(f"compare_drafters: no records with ids {args.min_id}..{args.max_id} "
                         f"in {args.data}")
    print(f"{len(records)} records: ids {[r['id'] for r in records]}")
    feats = None
    for folder in args.drafters:
        dconf = load_draft_config(folder)
        if feats is None:
            feats = TargetFeatures(target_dir(), list(dconf.target_layer_ids), torch.float32)
        drafter = DominoDrafter.from_pretrained(dconf, dtype=torch.float32).eval()
        module = DrafterTrainModule(drafter, feats.embed_weight, feats.lm_head_weight)
        taus = rollout_tau(module, feats, records, conf)
        rounds = [replay_rounds(module, feats, r) for r in records]
        generated = sum(len(r["ids"]) - r["start"] for r in records)
        print(folder, json.dumps({**{k: round(v, 3) for k, v in taus.items()},
                                  "tau_replay": round(generated / sum(rounds), 3),
                                  "rounds": rounds}))


if __name__ == "__main__":
    main()
