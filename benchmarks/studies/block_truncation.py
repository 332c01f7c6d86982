"""First-draft accuracy of a truncated block: what a short draft pass costs a drafter.

The backbone attends over its block NON-causally, so the B-1 mask positions after x_t feed the
first draft too (they are extra computation the model learned to use, not padding). A round that
verifies only L < B tokens can run the backbone over [x_t, MASK x (L-1)] and save most of the
draft pass (the worker does for a drafter trained with `short_blocks`), but it pays only if the
drafts stay as good. This measures the first draft (block position
0, which every speculative round needs) teacher-forced at every position of the target's greedy
answers to evaluation prompts, with the backbone run over blocks of B' = 16, 8, 4, 3, 2 tokens
(offline, the trainer's code path; the answers are cached by compare_drafters.py).
`--top-k K` also counts the target's token among the first draft's K best: the first position a
K-way tree of first drafts would accept (every position after x_t is verified in one pass either
way), which bounds what branching the first draft could add to a round.

    python benchmarks/studies/block_truncation.py --eval-set mtbench humaneval gsm8k --limit 20
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # provenance, ..
import provenance  # noqa: E402
from compare_drafters import add_eval_args, eval_records, offline_drafter  # noqa: E402

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"  # study outputs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_eval_args(ap)
    ap.add_argument("--blocks", nargs="+", type=int, default=[16, 8, 4, 3, 2])
    ap.add_argument("--top-k", type=int, default=1, help="also count top-2..K hits")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="block_truncation")
    args = ap.parse_args()
    if min(args.blocks) < 2 or args.limit < 1 or args.top_k < 1:
        ap.error("--blocks >= 2, --limit >= 1 and --top-k >= 1")
    torch.set_num_threads(args.threads)

    from domino_sglang.model.config import load_draft_config
    from domino_sglang.paths import shipped_drafter_dir
    from domino_sglang.train.config import TrainConfig

    prov = provenance.collect()
    folder = args.drafter or shipped_drafter_dir()
    if max(args.blocks) > load_draft_config(folder).block_size:
        ap.error(f"--blocks: at most the drafter's block size "
                 f"{load_draft_config(folder).block_size}")
    dconf, feats, module = offline_drafter(folder, served_vocab=False)
    max_seq_len = TrainConfig(data="-", out="-").max_seq_len
    ks = range(1, args.top_k + 1)
    hits = {b: [0] * args.top_k for b in args.blocks}  # [k-1]: target token in the top k
    total = 0
    with torch.no_grad():
        for name in args.eval_set:
            for rec in eval_records(name, args.limit, args.max_tokens, None, max_seq_len):
                ids, f = torch.tensor(rec["ids"]), feats(rec)
                anchors = list(range(rec["start"], len(rec["ids"]) - 1))  # every answer token
                total += len(anchors)
                for b in args.blocks:
                    z, _, labels = module._blocks(ids, f, anchors, b)  # z [n, b-1, H]
                    logits = F.linear(z[:, 0], module.lm_head_weight)  # [n, V]
                    best = logits.topk(args.top_k, dim=-1).indices  # [n, K], best first
                    found = (best == labels[:, :1]).cumsum(dim=-1).bool()  # [n, K]: in top k
                    for k in ks:
                        hits[b][k - 1] += int(found[:, k - 1].sum())
    rows = [{"block": b, "first_draft_accuracy": round(hits[b][0] / total, 4),
             **{f"top{k}": round(hits[b][k - 1] / total, 4) for k in ks if k > 1},
             "positions": total} for b in args.blocks]
    for row in rows:
        print(json.dumps(row), flush=True)
    out = {"provenance": prov, "drafter": str(folder), "eval_sets": args.eval_set,
           "limit": args.limit, "max_tokens": args.max_tokens, "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = [f"## First-draft accuracy by backbone block length ({', '.join(args.eval_set)}, "
             f"first {args.limit} prompts, {args.max_tokens} tokens)", "",
             provenance.markdown_header(prov), f"- drafter: `{folder}`", "",
             "| block B' | first-draft accuracy | "
             + "".join(f"top-{k} | " for k in ks if k > 1) + "positions |",
             "|---" * (args.top_k + 2) + "|"]
    lines += [f"| {r['block']} | {r['first_draft_accuracy']} | "
              + "".join(f"{r[f'top{k}']} | " for k in ks if k > 1) + f"{r['positions']} |"
              for r in rows]
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
