"""How small a draft vocabulary can be: first-draft accuracy when the draft may only propose the
N most frequent tokens of the target's regenerated answers.

The draft pass reads the whole lm_head for its base logits (49,152 x 576 for SmolLM2); a draft
vocabulary (domino_sglang/model/vocab.py) reads N rows instead. This measures what that costs in
acceptance: the first draft (block position 0, which every speculative round needs),
teacher-forced at every position of the target's greedy answers to evaluation prompts, with
the argmax over the full vocabulary and over the N most frequent answer tokens (records with
id <= --max-id, the drafter's training records; never the evaluation answers), for several N.

    python benchmarks/studies/draft_vocab.py --max-id 3850 --sizes 4096 8192 16384 32768
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
from compare_drafters import DEFAULT_DATA, eval_records, offline_drafter  # noqa: E402

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"  # study outputs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", type=Path, default=None, help="default: the shipped drafter")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="regenerated JSONL")
    ap.add_argument("--max-id", type=int, required=True, help="the drafter's training records")
    ap.add_argument("--sizes", nargs="+", type=int, default=[4096, 8192, 16384, 32768])
    ap.add_argument("--eval-set", nargs="+", default=["mtbench", "humaneval", "gsm8k"])
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="draft_vocab")
    args = ap.parse_args()
    if min(args.sizes) < 1 or args.limit < 1:
        ap.error("--sizes >= 1 and --limit >= 1")
    if not args.data.is_file():
        ap.error(f"--data {args.data} not found")
    torch.set_num_threads(args.threads)

    from domino_sglang.model.vocab import build_draft_vocab
    from domino_sglang.paths import shipped_drafter_dir
    from domino_sglang.train.config import TrainConfig

    prov = provenance.collect()
    folder = args.drafter or shipped_drafter_dir()
    dconf, feats, module = offline_drafter(folder, served_vocab=False)
    masks = {}  # N -> [V] additive mask: 0 inside the draft vocabulary, -inf outside
    for n in args.sizes:
        ids = torch.tensor(build_draft_vocab(args.data, n, args.max_id))
        masks[n] = torch.full((dconf.vocab_size,), float("-inf")).index_fill_(0, ids, 0.0)
    hits = dict.fromkeys(["full", *args.sizes], 0)
    total = 0
    max_seq_len = TrainConfig(data="-", out="-").max_seq_len
    with torch.no_grad():
        for name in args.eval_set:
            for rec in eval_records(name, args.limit, args.max_tokens, None, max_seq_len):
                ids, f = torch.tensor(rec["ids"]), feats(rec)
                anchors = list(range(rec["start"], len(rec["ids"]) - 1))  # every answer token
                z, _, labels = module._blocks(ids, f, anchors, dconf.block_size)
                base = F.linear(z[:, 0], module.lm_head_weight)  # [n, V] first-draft logits
                total += len(anchors)
                hits["full"] += int((base.argmax(-1) == labels[:, 0]).sum())
                for n in args.sizes:
                    hits[n] += int(((base + masks[n]).argmax(-1) == labels[:, 0]).sum())
    rows = [{"draft_vocab": k, "first_draft_accuracy": round(v / total, 4), "positions": total}
            for k, v in hits.items()]
    for row in rows:
        print(json.dumps(row), flush=True)
    out = {"provenance": prov, "drafter": str(folder), "data": str(args.data),
           "max_id": args.max_id, "eval_sets": args.eval_set, "limit": args.limit,
           "max_tokens": args.max_tokens, "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = [f"## First-draft accuracy by draft vocabulary ({', '.join(args.eval_set)}, first "
             f"{args.limit} prompts, {args.max_tokens} tokens)", "",
             provenance.markdown_header(prov), f"- drafter: `{folder}`",
             f"- draft vocabularies: the most frequent answer tokens of `{args.data.name}` "
             f"records with id <= {args.max_id}", "",
             "| draft vocabulary | first-draft accuracy | positions |", "|---|---|---|"]
    lines += [f"| {r['draft_vocab']} | {r['first_draft_accuracy']} | {r['positions']} |"
              for r in rows]
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
