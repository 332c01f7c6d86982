"""Draft trees against the chain at equal verified-token budgets, offline (greedy acceptance).

For each evaluation set (the target's greedy answers kept in git: benchmarks/data) and each
budget N (tokens verified a round, x_t included), every answer is replayed round by round as the
worker serves it (train.evaluate): the chain of N tokens (`replay_rounds`, the drafter's own
drafts, pointer copy included) and the tree of N tokens grown from the same block with that chain
as a kept branch (`replay_tree_rounds`, spec/tree.py) at each width K. Greedy verification commits
the path of drafts equal to the target's next tokens, so the record's tokens decide both without
a target forward: tau = generated tokens / verify rounds, what a server would report.
--lookup adds prompt lookup (lookup.py's rule) to both: a chain round where it finds a draft
verifies that instead of the drafter's (an offered row), a tree takes it as a second branch.

    python benchmarks/tree_acceptance.py --sizes 4 6 8 16 --widths 2 4 --limit 10 \
        --out tree_acceptance
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
from compare_drafters import add_eval_args, eval_records, offline_drafter  # noqa: E402

from domino_sglang.cpu.dtype import default_cpu_dtype  # noqa: E402
from domino_sglang.paths import shipped_drafter_dir  # noqa: E402
from domino_sglang.train.config import TrainConfig  # noqa: E402
from domino_sglang.train.evaluate import replay_rounds, replay_tree_rounds  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
LOOKUP_NOTE = "on (a chain round verifies its draft where it finds one, a tree as a branch)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_eval_args(ap)
    ap.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--widths", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lookup", action="store_true", help="prompt lookup in both (docstring)")
    ap.add_argument("--out", default=None, help="write results/<out>.json and .md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    folder = args.drafter or shipped_drafter_dir()
    conf = TrainConfig(data="-", out="-")
    dconf, feats, module = offline_drafter(folder, None, default_cpu_dtype())
    short = bool(dconf.short_draft)
    rows = []
    for name in args.eval_set:
        records = eval_records(name, args.limit, args.max_tokens, None, conf.max_seq_len)
        generated = sum(len(r["ids"]) - r["start"] for r in records)
        for size in args.sizes:
            started = time.time()
            chain = sum(replay_rounds(module, feats, r, draft_lens=(size,), short_draft=short,
                                      lookup=args.lookup) for r in records)
            row = {"set": name, "size": size, "answers": len(records), "tokens": generated,
                   "chain_rounds": chain, "chain_tau": generated / chain}
            for width in args.widths:
                tree = sum(replay_tree_rounds(module, feats, r, size, width, short_draft=short,
                                              lookup=args.lookup) for r in records)
                row[f"tree{width}_rounds"] = tree
                row[f"tree{width}_tau"] = generated / tree
                row[f"tree{width}_vs_chain"] = chain / tree
            row["seconds"] = round(time.time() - started, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    totals = []
    for size in args.sizes:
        sub = [r for r in rows if r["size"] == size]
        tokens, chain = sum(r["tokens"] for r in sub), sum(r["chain_rounds"] for r in sub)
        total = {"set": "all", "size": size, "tokens": tokens, "chain_rounds": chain,
                 "chain_tau": tokens / chain}
        for width in args.widths:
            tree = sum(r[f"tree{width}_rounds"] for r in sub)
            total.update({f"tree{width}_rounds": tree, f"tree{width}_tau": tokens / tree,
                          f"tree{width}_vs_chain": chain / tree})
        totals.append(total)
        print(json.dumps(total), flush=True)
    if args.out:
        meta = provenance.collect()
        (RESULTS / f"{args.out}.json").write_text(json.dumps(
            {"provenance": meta, "drafter": str(folder), "rows": rows + totals}, indent=1))
        head = ["set", "N", "chain tau"] + [f"tree K={w} tau (x chain)" for w in args.widths]
        lines = ["# Draft trees against the chain at equal budgets (greedy, offline replay)", "",
                 provenance.markdown_header(meta), f"- drafter: `{folder}`",
                 f"- data: first {args.limit} prompts of {', '.join(args.eval_set)}, the "
                 f"target's greedy answers of {args.max_tokens} tokens (benchmarks/data)",
                 f"- prompt lookup: {LOOKUP_NOTE if args.lookup else 'off'}",
                 "",
                 "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rows + totals:
            cells = [r["set"], str(r["size"]), f"{r['chain_tau']:.3f}"] + [
                f"{r[f'tree{w}_tau']:.3f} ({r[f'tree{w}_vs_chain']:.3f}x)" for w in args.widths]
            lines.append("| " + " | ".join(cells) + " |")
        (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
