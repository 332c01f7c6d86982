"""Copy or draft, position by position: what a copy gate over the shipped drafter could gain.

The first draft's misses are mostly copies from the context (first_draft.py). This asks how many
verify rounds a per-position choice between the drafter's token and a copy would save, exactly
(greedy) and offline, before building it into the rollout:

  - every anchor a of the target's greedy answers, every block position i: the drafter's pick
    (the served greedy rollout: draft vocabulary, candidate pool, head), teacher-forced, and the
    copy candidate c = the token after the most recent occurrence of the longest suffix (<= 12
    tokens) of ids[:a+i+1] (ending before its last token), with its match length n.
    Teacher forcing is exact here: a round's accepted drafts ARE the target's tokens, so the
    round at a accepts the leading positions whose chosen token is right, and
        rounds: a = start; repeat: a += 1 + accepted(a)
  - rules: the drafter alone (= compare_drafters' replay); the served default's shape (a round
    copies when the anchor's suffix of >= 2 tokens recurs, else drafts: prompt lookup); a copy
    at every position with n >= 2 / 3; a learned gate (logistic regression on the drafter's
    log-probabilities of its pick and of c, n and i, and a pointer drafter's trained gate
    logit, fitted on held-out training-data answers the drafter never saw) at every position,
    or inside drafter rounds only (lookup rounds kept as served: no draft pass); and the
    oracle (the right one of the two, wherever either is).
  - a pointer-generator drafter (pointer.py, trained with its gate): its own greedy pick, the
    argmax of q = (1 - g) p + g onehot(c), at every position or inside drafter rounds only; p(c)
    is 0 where the served p has no row for c (outside the draft vocabulary or, after position
    0, the head's candidate pool).

    python benchmarks/studies/copy_gate.py --fit-min-id 3000000 --fit-count 200
    python benchmarks/studies/copy_gate.py --drafter RUN/drafter --fit-count 0   # a pointer drafter
    python benchmarks/studies/copy_gate.py --drafter RUN/drafter --out copy_gate_shipped_drafter_fit
        # + p's confidence: does a gate that sees it decide better than the trained one? (-0.6%)
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
from compare_drafters import DEFAULT_DATA, add_eval_args, eval_records, offline_drafter  # noqa: E402

from domino_sglang.spec.pointer import copy_table, copy_wins, gate_inputs, log_gate  # noqa: E402
from domino_sglang.spec.suffix_match import copy_candidate as _copy_candidate  # noqa: E402

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"  # study outputs
MAX_MATCH = 12  # as lookup.py
N_CLASSES = 6  # match lengths 1..5, 6+ as gate features


def copy_candidate(h: list[int]) -> tuple[int, int]:
    """The rule pointer.copy_table computes for every prefix at once (spec/suffix_match.py):
    (token, match length) after the most recent occurrence of the longest suffix (<= MAX_MATCH)
    of h ending before h's last token; (-1, 0) when h's last token never occurred before."""
    return _copy_candidate(h, MAX_MATCH)


@torch.no_grad()
def position_table(module, head, feats, rec: dict, pool: int) -> dict[str, torch.Tensor]:
    """Per anchor a (start .. T-2) and block position i (0 .. B-2), teacher-forced: labels,
    the drafter's pick and log-probability, the copy candidate, its match length and the
    drafter's log-probability of it (its full-vocabulary logit against the served logits'
    normaliser). All [n, B-1]."""
    from domino_sglang.spec.rollout import base_logits, gru_step, make_candidates

    ids, start = rec["ids"], rec["start"]
    t_ids, T = torch.tensor(ids), len(ids)
    B = module.drafter.conf.block_size
    anchors = list(range(start, T - 1))
    z, prev, labels = module._blocks(t_ids, feats(rec), anchors, B)  # [n, B-1, H] x2, [n, B-1]
    z = z.float()
    n = z.shape[0]
    base = base_logits(torch.cat((z, z[:, -1:]), dim=1), head)  # [n, B-1, Vd]
    cand = make_candidates(base, head, pool)
    pick, pick_lp, lse = (torch.zeros(n, B - 1, dtype=torch.long), torch.zeros(n, B - 1),
                          torch.zeros(n, B - 1))
    hidden = [None] * (B - 1)
    s = z.new_zeros(n, head.prefix_gru.hidden_size)
    for i in range(B - 1):
        s = gru_step(head.prefix_gru, prev[:, i].float(), s)  # has read x_a .. x_{a+i}
        if i == 0:  # position 0: the backbone's base logits
            logits, ids_of = base[:, 0], head.token_ids
        else:  # the head over the pool, its GRU fed the teacher-forced chain
            hidden[i] = head.embed_proj[1](head.embed_proj[0](torch.cat((z[:, i], s), -1)))
            logits = cand.base[:, i] + torch.bmm(cand.out_weight, hidden[i][..., None])[..., 0]

            def ids_of(p):
                return cand.ids.gather(1, p[:, None])[:, 0]
        p = logits.argmax(-1)
        lse[:, i] = torch.logsumexp(logits, -1)
        pick[:, i] = ids_of(p)
        pick_lp[:, i] = logits.gather(1, p[:, None])[:, 0] - lse[:, i]
    table_c, table_n = copy_table(ids)  # row e: the candidate of the history ids[:e + 1]
    ends = (torch.tensor(anchors)[:, None] + torch.arange(B - 1)).clamp(max=T - 1)  # [n, B-1]
    copy, match = table_c[ends], table_n[ends]
    copy_lp = torch.full((n, B - 1), float("-inf"))
    drafts = torch.ones(n, B - 1, dtype=torch.bool)  # whether p can draft the candidate at all
    lm, w2 = head.lm_head_weight.float(), head.embed_proj[2].weight.float()
    for i in range(B - 1):
        c = copy[:, i].clamp(min=0)
        logit = (lm[c] * z[:, i]).sum(-1)
        if i >= 1:
            logit = logit + (w2[c] * hidden[i]).sum(-1)
            drafts[:, i] = (cand.ids == c[:, None]).any(1)  # in the head's candidate pool
        elif head.vocab is not None:
            drafts[:, i] = torch.isin(c, head.vocab)
        copy_lp[:, i] = torch.where(copy[:, i] >= 0, logit - lse[:, i], copy_lp[:, i])
    out = {"labels": labels, "pick": pick, "pick_lp": pick_lp, "copy": copy, "match": match,
           "copy_lp": copy_lp}
    gate = module.drafter.copy_gate
    if gate is not None:  # a pointer drafter: q's greedy pick (pointer.py), p(c) = 0 where the
        #                  served p has no row for c (outside the vocabulary or the pool)
        out["gate_logit"] = gate(gate_inputs(z, match)).squeeze(-1)
        log_g, log_1mg = log_gate(out["gate_logit"], copy)
        lp_c = copy_lp.masked_fill(~drafts, float("-inf"))
        out["q_copies"] = copy_wins(pick_lp, lp_c, copy, log_g, log_1mg)
    return out


def gate_features(tab: dict[str, torch.Tensor]) -> torch.Tensor:
    """[n, B-1, F]: one-hot match length and position, the two log-probabilities, their
    difference and probabilities; a pointer drafter's trained gate logit too (so the fit asks
    what p's confidence adds to that gate)."""
    n_pos = tab["copy"].shape[1]
    lpp, lpc = tab["pick_lp"], tab["copy_lp"].clamp(min=-30)
    pos = torch.arange(n_pos).expand_as(tab["copy"])
    extra = [tab["gate_logit"]] if "gate_logit" in tab else []
    return torch.cat((F.one_hot((tab["match"].clamp(1, N_CLASSES) - 1), N_CLASSES).float(),
                      F.one_hot(pos, n_pos).float(),
                      torch.stack([lpp, lpc, lpc - lpp, lpp.exp(), lpc.exp()] + extra, -1)), -1)


def fit_gate(tables: list[dict], l2: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor,
                                                             torch.Tensor]:
    """Logistic regression: P(the copy is right | exactly one of copy and pick is right).
    Returns (w, mean, std) over gate_features."""
    xs, ys = [], []
    for tab in tables:
        c_ok, p_ok = tab["copy"] == tab["labels"], tab["pick"] == tab["labels"]
        keep = (tab["copy"] >= 0) & (c_ok ^ p_ok)
        xs.append(gate_features(tab)[keep])
        ys.append(c_ok[keep].float())
    x, y = torch.cat(xs), torch.cat(ys)
    mu, sd = x.mean(0), x.std(0) + 1e-4
    xs_ = (x - mu) / sd
    w = torch.zeros(x.shape[1] + 1, requires_grad=True)
    opt = torch.optim.LBFGS([w], max_iter=300, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = (F.binary_cross_entropy_with_logits(xs_ @ w[:-1] + w[-1], y)
                + l2 * w[:-1].pow(2).sum())
        loss.backward()
        return loss
    opt.step(closure)
    return w.detach(), mu, sd


def replay(tab: dict[str, torch.Tensor], use_copy: torch.Tensor) -> tuple[int, int]:
    """(tokens, verify rounds) with the copy chosen where use_copy [n, B-1]."""
    chosen = torch.where(use_copy & (tab["copy"] >= 0), tab["copy"], tab["pick"])
    accepted = (chosen == tab["labels"]).int().cumprod(1).sum(1).tolist()  # [n]
    a, rounds = 0, 0
    while a < len(accepted):
        rounds += 1
        a += 1 + accepted[a]
    return len(accepted), rounds


def rules(tab: dict, gate) -> dict[str, torch.Tensor]:
    """Each rule's use_copy [n, B-1]; the fitted gate's if `gate` is not None, a pointer
    drafter's own (its trained gate, q's argmax) if the table has it."""
    has = tab["copy"] >= 0
    lookup_round = (tab["match"][:, :1] >= 2) & has  # the anchor's suffix of >= 2 recurs
    right = (tab["copy"] == tab["labels"]) & (tab["pick"] != tab["labels"])
    out = {"drafter": torch.zeros_like(has), "served (lookup rounds)": lookup_round,
           "copy n>=2": tab["match"] >= 2, "copy n>=3": tab["match"] >= 3}
    if gate is not None:
        w, mu, sd = gate
        gated = has & (((gate_features(tab) - mu) / sd) @ w[:-1] + w[-1] > 0)
        out |= {"gate": gated, "gate in drafter rounds": torch.where(lookup_round, has, gated)}
    if "q_copies" in tab:
        q = tab["q_copies"]
        out |= {"pointer drafter": q,
                "pointer drafter in drafter rounds": torch.where(lookup_round, has, q)}
    return out | {"oracle": right}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_eval_args(ap)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the gate's fitting data")
    ap.add_argument("--fit-min-id", type=int, default=3000000,
                    help="first record id the gate is fitted on; keep it above the drafter's "
                         "training max_id (stage 26's recipe: 2999999)")
    ap.add_argument("--fit-count", type=int, default=200,
                    help="0: no fitted gate (a pointer drafter's own gate is always replayed)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="copy_gate")
    args = ap.parse_args()
    if args.limit < 1 or args.fit_count < 0:
        ap.error("--limit must be >= 1 and --fit-count >= 0")
    torch.set_num_threads(args.threads)

    from domino_sglang.model.config import DEFAULT_CANDIDATE_POOL
    from domino_sglang.paths import shipped_drafter_dir
    from domino_sglang.train.config import TrainConfig
    from domino_sglang.train.evaluate import head_params
    from domino_sglang.train.records import load_records

    prov = provenance.collect()
    folder = args.drafter or shipped_drafter_dir()
    dconf, feats, module = offline_drafter(folder)
    head = head_params(module)
    max_seq_len = TrainConfig(data="-", out="-").max_seq_len
    fit, gate = [], None
    if args.fit_count:
        fit_recs = [r for r in load_records(args.data, max_seq_len)
                    if args.fit_min_id <= r["id"] < args.fit_min_id + args.fit_count]
        if not fit_recs:
            ap.error(f"--data {args.data} has no records with ids from {args.fit_min_id}")
        fit = [position_table(module, head, feats, r, DEFAULT_CANDIDATE_POOL) for r in fit_recs]
        gate = fit_gate(fit)
        print(f"gate fitted on {len(fit)} records", flush=True)
    rows = []
    for name in args.eval_set:
        recs = eval_records(name, args.limit, args.max_tokens, None, max_seq_len)
        tables = [position_table(module, head, feats, r, DEFAULT_CANDIDATE_POOL) for r in recs]
        totals: dict[str, list[int]] = {}
        for tab in tables:
            for rule, use in rules(tab, gate).items():
                tokens, rounds = replay(tab, use)
                t = totals.setdefault(rule, [0, 0])
                t[0] += tokens
                t[1] += rounds
        row = {"set": name, "answers": len(tables),
               "rules": {k: {"rounds": r, "tau": round(g / r, 3)} for k, (g, r) in totals.items()}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = {"provenance": prov, "drafter": str(folder), "limit": args.limit,
           "max_tokens": args.max_tokens, "fit": {"data": str(args.data),
                                                  "min_id": args.fit_min_id,
                                                  "records": len(fit)}, "rows": rows}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=2) + "\n")
    names = list(rows[0]["rules"])
    lines = [f"## Copy or draft per position: verify rounds (tau = tokens / rounds), first "
             f"{args.limit} prompts per set, {args.max_tokens} tokens, fixed block "
             f"{dconf.block_size}, greedy, teacher-forced exact replay", "",
             provenance.markdown_header(prov), f"- drafter: `{folder}`",
             f"- gate fitted on {len(fit)} records of `{args.data}` from id {args.fit_min_id}"
             if fit else "- no fitted gate (--fit-count 0)",
             "", "| rule | " + " | ".join(r["set"] for r in rows) + " | total rounds |",
             "|---" * (len(rows) + 2) + "|"]
    for k in names:
        lines.append(f"| {k} | " + " | ".join(
            f"{r['rules'][k]['tau']} ({r['rules'][k]['rounds']})" for r in rows)
            + f" | {sum(r['rules'][k]['rounds'] for r in rows)} |")
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
