"""Where the first draft fails: its accuracy by the target's confidence, and what a copy would fix.

The first draft (block position 0, the served greedy rollout over the drafter's draft vocabulary)
bounds every round's tau. This measures it teacher-forced at every position of the target's
greedy answers to evaluation prompts (offline, the trainer's code path; the answers are cached by
compare_drafters.py and kept in git) and splits it:
  - by p_max, the target's own top-1 probability for that next token (from its top-64 logits):
    where the target is nearly sure, a miss is the drafter's, not the target's entropy;
  - by whether the next token lies outside the draft vocabulary (no draft can propose it), and
    whether such a token already occurs in the request's context (prompt + answer so far);
  - against copies from the context: the token that followed the last earlier occurrence of the
    anchor token (1-gram) or of the anchor's 2-gram (what prompt lookup continues), counting the
    drafter's misses a copy would fix and its hits a copy would break.

    python benchmarks/studies/first_draft.py --eval-set mtbench humaneval gsm8k --limit 20
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # provenance, ..
import provenance  # noqa: E402
from compare_drafters import add_eval_args, eval_records, offline_drafter  # noqa: E402

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"  # study outputs
BINS = (0.0, 0.3, 0.5, 0.7, 0.9)  # lower edges of the p_max bins


def copies(ids: list[int], start: int) -> tuple[list[int | None], list[int | None]]:
    """For each anchor a in start..len-2: the token after the last earlier occurrence of ids[a]
    (1-gram copy) and of (ids[a-1], ids[a]) (2-gram copy), None where there is none."""
    last1: dict[int, int] = {}
    last2: dict[tuple[int, int], int] = {}
    out1, out2 = [], []
    for t in range(len(ids) - 1):
        if t >= start:
            out1.append(last1.get(ids[t]))
            out2.append(last2.get((ids[t - 1], ids[t])) if t >= 1 else None)
        last1[ids[t]] = ids[t + 1]
        if t >= 1:
            last2[(ids[t - 1], ids[t])] = ids[t + 1]
    return out1, out2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_eval_args(ap)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="first_draft")
    args = ap.parse_args()
    if args.limit < 1 or args.max_tokens < 1:
        ap.error("--limit and --max-tokens must be >= 1")
    torch.set_num_threads(args.threads)

    from domino_sglang.model.config import DEFAULT_CANDIDATE_POOL
    from domino_sglang.paths import shipped_drafter_dir
    from domino_sglang.spec.rollout import greedy_rollout
    from domino_sglang.train.config import TrainConfig
    from domino_sglang.train.evaluate import head_params

    prov = provenance.collect()
    folder = args.drafter or shipped_drafter_dir()
    dconf, feats, module = offline_drafter(folder, topk=64)
    vocab = module.draft_vocab  # [Vd] or None
    in_vocab = torch.ones(dconf.vocab_size, dtype=torch.bool)
    if vocab is not None:
        in_vocab = torch.zeros_like(in_vocab).index_fill_(0, vocab, True)
    head = head_params(module)
    max_seq_len = TrainConfig(data="-", out="-").max_seq_len
    rows = []
    with torch.no_grad():
        for name in args.eval_set:
            c = {k: 0 for k in ("n", "hit", "oov", "oov_ctx", "miss_fix1", "miss_fix2",
                                "hit_break1", "hit_break2")}
            by_bin = [[0, 0] for _ in BINS]  # [positions, hits] per p_max bin
            for rec in eval_records(name, args.limit, args.max_tokens, None, max_seq_len):
                ids, start = rec["ids"], rec["start"]
                t_ids = torch.tensor(ids)
                f, (_, top_logits) = feats._forward(rec)  # [T, K*H]; [T, 64]
                anchors = torch.arange(start, len(ids) - 1)  # every answer token but the last
                z, _, labels = module._blocks(t_ids, f, anchors.tolist(), dconf.block_size)
                z = torch.cat((z, z[:, -1:]), dim=1)[:, :2]  # [n, 2, H]: a 2-token round
                first = greedy_rollout(z, t_ids[anchors], head, DEFAULT_CANDIDATE_POOL)[:, 0]
                label = labels[:, 0]  # [n] the target's next token
                hit = first == label
                p_max = torch.softmax(top_logits[anchors].float(), dim=-1)[:, 0]  # [n]
                b = torch.bucketize(p_max, torch.tensor(BINS[1:]), right=True)
                for i in range(len(BINS)):
                    by_bin[i][0] += int((b == i).sum())
                    by_bin[i][1] += int(hit[b == i].sum())
                c1, c2 = copies(ids, start)
                seen = set(ids[:start])
                for j, a in enumerate(anchors.tolist()):
                    y = ids[a + 1]
                    seen.add(ids[a])
                    c["n"] += 1
                    if not in_vocab[y]:
                        c["oov"] += 1
                        c["oov_ctx"] += y in seen
                    if hit[j]:
                        c["hit"] += 1
                        c["hit_break1"] += c1[j] is not None and c1[j] != y
                        c["hit_break2"] += c2[j] is not None and c2[j] != y
                    else:
                        c["miss_fix1"] += c1[j] == y
                        c["miss_fix2"] += c2[j] == y
            miss = c["n"] - c["hit"]
            row = {"set": name, "positions": c["n"],
                   "first_draft_accuracy": round(c["hit"] / c["n"], 4),
                   "by_p_max": [{"p_max_from": lo, "share": round(n / c["n"], 4),
                                 "accuracy": round(h / max(n, 1), 4)}
                                for lo, (n, h) in zip(BINS, by_bin)],
                   "outside_draft_vocab": round(c["oov"] / c["n"], 4),
                   "outside_in_context": round(c["oov_ctx"] / max(c["oov"], 1), 4),
                   "misses_fixed_by_copy1": round(c["miss_fix1"] / max(miss, 1), 4),
                   "misses_fixed_by_copy2": round(c["miss_fix2"] / max(miss, 1), 4),
                   "hits_broken_by_copy1": round(c["hit_break1"] / max(c["hit"], 1), 4),
                   "hits_broken_by_copy2": round(c["hit_break2"] / max(c["hit"], 1), 4)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = {"provenance": prov, "drafter": str(folder), "limit": args.limit,
           "max_tokens": args.max_tokens, "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=2) + "\n")
    edges = [f"{lo}-{hi}" for lo, hi in zip(BINS, (*BINS[1:], 1.0))]
    lines = [f"## First draft: accuracy by the target's confidence, and copies (first "
             f"{args.limit} prompts per set, {args.max_tokens} tokens, every position)", "",
             provenance.markdown_header(prov), f"- drafter: `{folder}`", "",
             "| set | positions | first-draft acc | "
             + " | ".join(f"p_max {e}: share / acc" for e in edges)
             + " | outside draft vocab (in context) | misses a copy fixes (1-gram / 2-gram)"
             " | hits a copy breaks (1-gram / 2-gram) |",
             "|---" * (len(BINS) + 6) + "|"]
    for r in rows:
        lines.append(
            f"| {r['set']} | {r['positions']} | {r['first_draft_accuracy']} | "
            + " | ".join(f"{x['share']} / {x['accuracy']}" for x in r["by_p_max"])
            + f" | {r['outside_draft_vocab']} ({r['outside_in_context']}) | "
            f"{r['misses_fixed_by_copy1']} / {r['misses_fixed_by_copy2']} | "
            f"{r['hits_broken_by_copy1']} / {r['hits_broken_by_copy2']} |")
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
