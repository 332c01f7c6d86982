"""Measure the draft temperature scale a drafter should sample at (config
`draft_temperature_scale`, sampling.py): the acceptance rate of sampled drafts, per draft
position, when the target samples at temperature T and the drafter at T * s.

Offline, on the target's greedy answers to evaluation prompts (compare_drafters' cached
records): at every answer position a, the drafter drafts the short block [x_a, MASK x P] from
the target features of positions < a, the head teacher-forced on the answer (GRU over x_a,
x_{a+1}, ..); for draft position k the acceptance probability of a draft drawn from q_k is the
overlap sum_v min(p_k(v), q_k(v)) (Leviathan et al. 2023), p_k = softmax(target logits / T) and
q_k = softmax(drafter logits / (T * s)) over the draft vocabulary (s = 0: the argmax, one-hot).
Temperature only (no top-k / top-p), what the throughput sweep sends. A pointer-generator drafter
(pointer.py) is measured as it samples (rollout.pointer_sample): q_k = (1 - g_k) q_k + g_k
onehot(c_k), c_k the copy candidate of the teacher-forced history x_0..x_{a+k}, which may lie
outside the draft vocabulary (then min(p_k(c_k), g_k) is added); at s = 0 the greedy pick.

    OMP_NUM_THREADS=2 python benchmarks/studies/draft_temperature.py --temperatures 0.7 1.0
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
from compare_drafters import eval_records  # noqa: E402

from domino_sglang.paths import shipped_drafter_dir, target_dir  # noqa: E402

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"  # study outputs


@torch.no_grad()
def overlaps(module, target, rec: dict, temperatures: list[float], scales: list[float],
             positions: int) -> tuple[dict, int]:
    """Sum over the record's anchors of sum_v min(p_k, q_k), per (T, s): {(T, s): [P]}, and
    the number of anchors."""
    from domino_sglang.spec.pointer import copy_table, copy_wins, gate_inputs, log_gate
    from domino_sglang.train.curriculum import head_correction

    drafter, vocab = module.drafter, module.draft_vocab
    ids = torch.tensor(rec["ids"])  # [T]
    out = target(input_ids=ids[None], output_hidden_states=True)
    logits = out.logits[0].float()  # [T, V]
    feats = torch.cat([out.hidden_states[i + 1][0] for i in drafter.conf.target_layer_ids], -1)
    anchors = list(range(rec["start"] - 1, len(ids) - positions - 1))
    lengths = torch.full((len(anchors),), positions + 1)
    z, prev, _ = module._blocks(ids, feats, anchors, drafter.conf.block_size, lengths)
    z, prev = z[:, :positions], prev[:, :positions]  # [n, P, H]
    rows = module.lm_head_weight if vocab is None else module.lm_head_weight[vocab]
    q_logits = F.linear(z, rows).float()  # [n, P, Vd] base logits
    q_logits[:, 1:] += head_correction(drafter.prefix_gru, drafter.embed_proj, z, prev,
                                       vocab).float()
    after = torch.tensor(anchors)[:, None] + torch.arange(positions)  # [n, P]: p after x_{a+k}
    g = None
    if drafter.copy_gate is not None:  # the copy path, as trained (DrafterTrainModule._copies)
        cand, match = copy_table(rec["ids"])
        c = cand[after]  # [n, P]
        log_g, log_1mg = log_gate(drafter.copy_gate(gate_inputs(z, match[after])).squeeze(-1), c)
        g = log_g.exp()  # [n, P], 0 without a candidate
        vd = q_logits.shape[-1]
        column = torch.full((logits.shape[-1],), -1, dtype=torch.long)
        column[vocab if vocab is not None else torch.arange(vd)] = torch.arange(vd)
        col = torch.where(c >= 0, column[c.clamp(min=0)], -1)  # [n, P]: -1 outside the vocab
        inside = (col >= 0)[..., None]
        at_c = F.one_hot(col.clamp(min=0), vd).float() * inside  # [n, P, Vd]
        outside = (c >= 0) & (col < 0)
        # the greedy pick (s = 0): argmax q, as rollout.pointer_pick
        logp = torch.log_softmax(q_logits, -1)
        lp_c = logp.gather(-1, col.clamp(min=0)[..., None]).squeeze(-1).masked_fill(
            col < 0, float("-inf"))
        wins = copy_wins(logp.amax(-1), lp_c, c, log_g, log_1mg)  # [n, P]
    sums = {}
    for t in temperatures:
        full = torch.softmax(logits[after] / t, -1)  # [n, P, V]
        # p over the draft vocabulary only: q is 0 outside it (but for a copy), so min(p, q) is
        p = full if vocab is None else full[..., vocab]
        for s in scales:
            q = (F.one_hot(q_logits.argmax(-1), q_logits.shape[-1]).float() if s == 0
                 else torch.softmax(q_logits / (t * s), -1))
            extra = 0.0
            if g is not None:
                gs = wins.float() if s == 0 else g  # the greedy pick is one-hot
                q = q * (1 - gs)[..., None] + gs[..., None] * at_c
                p_c = full.gather(-1, c.clamp(min=0)[..., None]).squeeze(-1)  # [n, P]
                extra = (torch.minimum(p_c, gs) * outside).double().sum(0)
            sums[(t, s)] = torch.minimum(p, q).double().sum(-1).sum(0) + extra  # [P]
    return sums, len(anchors)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", type=Path, default=shipped_drafter_dir())
    ap.add_argument("--eval-set", nargs="+", default=["mtbench", "humaneval", "gsm8k"])
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperatures", nargs="+", type=float, default=[0.7, 1.0])
    ap.add_argument("--scales", nargs="+", type=float,
                    default=[0.0, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.2])
    ap.add_argument("--positions", type=int, default=4, help="draft positions measured")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="draft_temperature")
    args = ap.parse_args()
    if min(args.temperatures) <= 0 or min(args.scales) < 0 or args.positions < 1:
        ap.error("--temperatures must be > 0, --scales >= 0, --positions >= 1")
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM

    from domino_sglang.model.config import load_draft_config
    from domino_sglang.model.drafter import DominoDrafter
    from domino_sglang.model.vocab import load_draft_vocab
    from domino_sglang.train.module import DrafterTrainModule

    dconf = load_draft_config(args.drafter)
    if args.positions >= dconf.block_size:
        ap.error(f"--positions must be < the block size {dconf.block_size}")
    target = AutoModelForCausalLM.from_pretrained(str(target_dir()), dtype=torch.bfloat16).eval()
    drafter = DominoDrafter.from_pretrained(dconf, dtype=torch.float32).eval()
    module = DrafterTrainModule(drafter, target.get_input_embeddings().weight.detach().float(),
                                target.get_output_embeddings().weight.detach().float(),
                                load_draft_vocab(dconf.path, dconf.vocab_size))
    totals = {(t, s): torch.zeros(args.positions, dtype=torch.float64)
              for t in args.temperatures for s in args.scales}
    anchors = 0
    for name in args.eval_set:
        for rec in eval_records(name, args.limit, args.max_tokens, None, 1 << 20):
            sums, n = overlaps(module, target, rec, args.temperatures, args.scales,
                               args.positions)
            for key, v in sums.items():
                totals[key] += v
            anchors += n
        print(f"{name}: {anchors} anchors so far", flush=True)

    results = {f"T={t} s={s}": [round(x, 4) for x in (totals[(t, s)] / anchors).tolist()]
               for t, s in totals}
    meta = provenance.collect()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(
        {"meta": meta, "args": {k: str(v) for k, v in vars(args).items()}, "anchors": anchors,
         "acceptance": results}, indent=1))
    cols = " | ".join(f"k = {k + 1}" for k in range(args.positions))
    md = [f"# Sampled acceptance by draft temperature scale ({anchors} anchors)", "",
          provenance.markdown_header(meta), f"- drafter: `{args.drafter}`",
          f"- data: target greedy answers, {', '.join(args.eval_set)}, first {args.limit} "
          f"prompts, {args.max_tokens} tokens", "",
          "sum_v min(p_k, q_k) at draft position k (teacher-forced); s = 0: argmax drafts", "",
          f"| T | s | {cols} |", "|---|---|" + "---|" * args.positions]
    for t in args.temperatures:
        best = max(args.scales, key=lambda s: float(totals[(t, s)].sum()))
        for s in args.scales:
            mark = " (best)" if s == best else ""
            md.append(f"| {t} | {s}{mark} | "
                      + " | ".join(f"{x:.3f}" for x in results[f'T={t} s={s}']) + " |")
    (RESULTS / f"{args.out}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md[-(len(args.scales) * len(args.temperatures)):]))


if __name__ == "__main__":
    main()
