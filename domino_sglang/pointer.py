"""The copy path of a pointer-generator drafter: copy candidates from a sequence's own history and
the gate that mixes them into the draft distribution.

The first draft's misses are mostly copies from the context (benchmarks/first_draft.py), and a
gate over a drafter trained without one gains little (benchmarks/copy_gate.py: 3-5% of verify
rounds, the oracle 16%). So the drafter is trained WITH the copy, as a pointer-generator (See et
al. 2017, the idea): at block position i, history h = x_0 .. x_{a+i} (teacher-forced in
training, committed tokens + the chain at serve time),

    c_i, n_i = the token after the most recent occurrence of the longest suffix (n_i <= 12
               tokens) of h that recurs earlier in h; c_i = -1, n_i = 0 when x_{a+i} is new
    g_i      = sigmoid(w . [z_i ; onehot(n_i)] + b)            (0 where c_i = -1)
    q_i(v)   = (1 - g_i) p_i(v) + g_i [v = c_i]

p_i the drafter's own distribution (backbone at i = 0, backbone + head after). q_i is what is
drafted and, sampled, what is verified (a proper distribution: exact as any other q). Trained in
the same CE as p (curriculum.py), p no longer has to spend its mass where the copy is right.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from domino_sglang.config import COPY_MAX_MATCH

NO_COPY = -1


def copy_table(ids: list[int], max_match: int = COPY_MAX_MATCH) -> tuple[torch.Tensor,
                                                                       torch.Tensor]:
    """(candidates [T], match lengths [T]) int64: row t is (c, n) of the history ids[:t + 1]
    (module docstring), ties between occurrences of the longest suffix to the most recent.

    One dict per suffix length n maps each n-gram to where it last ended: T * max_match lookups
    per sequence (a 768-token record in ~10 ms)."""
    last: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_match + 1)]
    cand = torch.full((len(ids),), NO_COPY, dtype=torch.long)
    match = torch.zeros(len(ids), dtype=torch.long)
    for t in range(len(ids)):
        top = min(max_match, t + 1)
        for n in range(top, 0, -1):  # the longest suffix that occurred before first
            s = last[n].get(tuple(ids[t - n + 1: t + 1]))
            if s is not None:
                cand[t], match[t] = ids[s + 1], n
                break
        for n in range(1, top + 1):  # then this position's n-grams become history
            last[n][tuple(ids[t - n + 1: t + 1])] = t
    return cand, match


def gate_inputs(z: torch.Tensor, match: torch.Tensor) -> torch.Tensor:
    """z [.., H] and match lengths [..] -> the gate's input [.., H + COPY_MAX_MATCH + 1]."""
    onehot = F.one_hot(match.clamp(0, COPY_MAX_MATCH), COPY_MAX_MATCH + 1).to(z.dtype)
    return torch.cat((z, onehot), dim=-1)


def log_gate(gate_logit: torch.Tensor, cand: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log g, log(1 - g)) [..] in float32; g = 0 where there is no candidate."""
    x = gate_logit.float()
    none = cand < 0
    return (F.logsigmoid(x).masked_fill(none, float("-inf")),
            F.logsigmoid(-x).masked_fill(none, 0.0))


def mixed_log_prob(log_p: torch.Tensor, token: torch.Tensor, cand: torch.Tensor,
                   log_g: torch.Tensor, log_1mg: torch.Tensor) -> torch.Tensor:
    """log q(token) = log((1 - g) p(token) + g [token = c]); all [..], log_p = log p(token)
    (-inf for a token the drafter cannot draft)."""
    drafted = log_1mg + log_p
    copied = torch.where((token == cand) & (cand >= 0), log_g, float("-inf"))
    # q = 0 where both are -inf; logaddexp's gradient there is NaN (even times 0), so it runs
    # on zeros at those positions
    zero = (drafted == float("-inf")) & (copied == float("-inf"))
    out = torch.logaddexp(drafted.masked_fill(zero, 0.0), copied.masked_fill(zero, 0.0))
    return out.masked_fill(zero, float("-inf"))


def copy_wins(log_p_pick: torch.Tensor, log_p_cand: torch.Tensor, cand: torch.Tensor,
              log_g: torch.Tensor, log_1mg: torch.Tensor) -> torch.Tensor:
    """Greedy argmax of q [..] bool: the candidate beats the drafter's own pick when
    (1 - g) p(c) + g > (1 - g) p(pick)."""
    return (cand >= 0) & (torch.logaddexp(log_1mg + log_p_cand, log_g) > log_1mg + log_p_pick)
