"""The base-anchored curriculum: position weights, the lambda schedule, the teacher-forced loss.

For one training block at anchor a (block size B, positions k = 0..B-2, label y_k = x_{a+k+1}):

    base_k   = lm_head(z_k)                                       (the parallel backbone alone)
    s_k      = GRU(embed(x_a), ..., embed(x_{a+k}))      teacher-forced over GROUND-TRUTH tokens
    final_0  = base_0 ;  final_k = base_k + W2 silu(W1 [z_k ; s_k])   (k >= 1)
    w_k      = exp(-k / gamma)                                    early positions matter most
    L        = (1 - lambda) * CE_w(final) + lambda * CE_w(base)
    lambda   = 1 -> 0 linearly over the first `decay_frac` of training

With lambda = 1 the head is not evaluated at all (no gradient reaches it); the backbone first
learns to draft on its own, then the head learns to correct it (Domino paper, section 5 of
shared/notes/domino-method.md). tau_sim = 1 + sum_k prod_{i<=k} acc_i is the cheap proxy of the
acceptance length that greedy verification would see.

With a draft vocabulary (vocab.py; token ids [Vd]) the logits are the Vd rows of the lm_head and
of the head's output projection only, as the worker serves them: the softmax runs over Vd tokens,
a label outside them is left out of the loss (it cannot be drafted) but counts as a miss in the
accuracies. 6x fewer logit rows at Vd = 8,192 of V = 49,152.

Distillation (optional, weight beta): the greedy label is only the target's argmax, but a sampled
request accepts a draft with probability sum_v min(p, q) (1 - total variation), which only a
drafter whose whole distribution q follows the target's p maximises. With the target's top-k
logits at each label position (features.TargetFeatures.soft), every CE above becomes

    CE_x = (1 - beta) * CE(x, y) + beta * sum_v -p_tau(v) log softmax(x)(v)
    p_tau = softmax(target top-k logits / tau), renormalised over the top-k tokens inside the
            draft vocabulary (the tail past top-k is dropped: an approximation of p)

(soft-label knowledge distillation, Hinton et al. 2015; for drafters, DistillSpec, Zhou et al.
2023, which found the target's own distribution a better teacher for speculative acceptance.)

Pointer-generator drafters (pointer.py; `copy` below): every CE, hard and soft, base and final,
scores the mixture q = (1 - g) softmax(x) + g onehot(c) instead of softmax(x), with c the copy
candidate of the teacher-forced history and g the drafter's gate; a label outside the draft
vocabulary counts where it is the candidate (q puts g on it). The accuracies are q's argmax.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from domino_sglang.spec.pointer import copy_wins, log_gate, mixed_log_prob

IGNORE = -100


def lambda_at(step: int, total_steps: int, decay_frac: float) -> float:
    """Weight of the base loss at `step` (0-based): 1 at step 0, 0 from decay_frac*total on."""
    span = decay_frac * total_steps
    if span <= 0:
        return 0.0
    return max(0.0, 1.0 - step / span)


def position_weights(n: int, gamma: float, device=None) -> torch.Tensor:
    """w_k = exp(-k / gamma), k = 0..n-1  [n]."""
    return torch.exp(-torch.arange(n, device=device, dtype=torch.float32) / gamma)


def weighted_ce(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                extra: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """logits [N, P, V], labels [N, P] (IGNORE = masked), weights [P] -> scalar.

    extra = (CE sum, count) of more position-0 samples (weight w_0 = 1), averaged in as if they
    were rows of `logits` with only their first label.
    """
    n, p, v = logits.shape
    ce = F.cross_entropy(logits.reshape(n * p, v).float(), labels.reshape(-1),
                         ignore_index=IGNORE, reduction="none").view(n, p)
    w = weights[None, :] * (labels != IGNORE)
    total, count = (ce * w).sum(), w.sum()
    if extra is not None:
        total, count = total + extra[0], count + extra[1]
    return total / count.clamp_min(1e-6)


def soft_ce(logits: torch.Tensor, soft_ids: torch.Tensor, soft_logits: torch.Tensor,
            tau: float, vocab: torch.Tensor | None = None, vocab_size: int = 0,
            copy: tuple[torch.Tensor, ...] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of `logits` [.., V or Vd] against the target's top-k distribution.

    soft_ids [.., k] token ids and soft_logits [.., k] the target's logits of its k most likely
    tokens; with a draft vocabulary `vocab` [Vd] the ids outside it are dropped and p is
    renormalised over the rest. copy = (candidates, log g, log(1 - g)) [..]: the CE of the
    pointer mixture q instead (module docstring), the candidate kept even outside `vocab`.
    Returns (ce [..], ok [..]): ok is False where no top-k token can be drafted (ce is 0 there).
    """
    idx = soft_ids if vocab is None else vocab_labels(soft_ids, vocab, vocab_size)  # [.., k]
    inside = idx != IGNORE
    if copy is not None:  # the candidate is in q's support where g > 0
        inside = inside | ((soft_ids == copy[0][..., None]) & (copy[0][..., None] >= 0)
                           & (copy[1][..., None] > float("-inf")))
    z = (soft_logits.float() / tau).masked_fill(~inside, float("-inf"))
    ok = inside.any(-1)
    p = torch.softmax(z.masked_fill(~ok[..., None], 0.0), -1) * inside  # [.., k]
    logq = torch.log_softmax(logits.float(), -1).gather(-1, idx.clamp_min(0))  # [.., k]
    if copy is not None:
        cand, log_g, log_1mg = (t[..., None] for t in copy)
        logq = mixed_log_prob(logq.masked_fill(idx == IGNORE, float("-inf")), soft_ids, cand,
                              log_g, log_1mg).masked_fill(~inside, 0.0)
    return -(p * logq).sum(-1) * ok, ok


def gated_nll(logits: torch.Tensor, labels: torch.Tensor, ys: torch.Tensor,
              copy: tuple[torch.Tensor, ...], vocab: torch.Tensor | None = None,
              vocab_size: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-log q(y) of the pointer mixture (pointer.py) at every position.

    logits [.., V or Vd], labels [..] token ids (IGNORE = masked), ys [..] their logit indices
    (IGNORE outside the vocabulary `vocab` [Vd] of the full vocabulary's `vocab_size`),
    copy = (candidates, log g, log(1 - g)) [..]. Returns
    (nll [..], ok [..], q's greedy pick [..] token ids); ok is False where y cannot be drafted
    (nll is 0 there).
    """
    cand, log_g, log_1mg = copy
    logp = torch.log_softmax(logits.float(), -1)
    lp_y = logp.gather(-1, ys.clamp_min(0)[..., None])[..., 0].masked_fill(ys == IGNORE,
                                                                          float("-inf"))
    lq = mixed_log_prob(lp_y, labels, cand, log_g, log_1mg)
    ok = (labels != IGNORE) & torch.isfinite(lq)
    lp_pick, pick = logp.max(-1)
    if vocab is not None:
        pick = vocab[pick]
        c_idx = vocab_labels(cand.clamp_min(0), vocab, vocab_size)
    else:
        c_idx = cand.clamp_min(0)
    lp_c = logp.gather(-1, c_idx.clamp_min(0)[..., None])[..., 0]
    lp_c = lp_c.masked_fill((c_idx == IGNORE) | (cand < 0), float("-inf"))
    pick = torch.where(copy_wins(lp_pick, lp_c, cand, log_g, log_1mg), cand, pick)
    return (-lq).masked_fill(~ok, 0.0), ok, pick


def head_correction(prefix_gru: nn.GRU, embed_proj: nn.Sequential, z: torch.Tensor,
                    prev_embeds: torch.Tensor, vocab: torch.Tensor | None = None
                    ) -> torch.Tensor:
    """Teacher-forced correction for positions 1..P-1.

    z [N, P, H] backbone states of the P label positions; prev_embeds [N, P, H] target embeddings
    of x_a .. x_{a+P-1} (the GRU inputs). Returns [N, P-1, V] (added to base[:, 1:]), or
    [N, P-1, Vd] over the draft vocabulary `vocab` [Vd].
    """
    s, _ = prefix_gru(prev_embeds.to(prefix_gru.weight_ih_l0.dtype))  # [N, P, G]; s[:, k] = s_k
    x = torch.cat((z[:, 1:], s[:, 1:]), dim=-1)  # [N, P-1, H+G]
    if vocab is None:
        return embed_proj(x)  # [N, P-1, V]
    hidden = embed_proj[1](embed_proj[0](x))  # [N, P-1, E]: silu(W1 [z; s])
    return F.linear(hidden, embed_proj[2].weight[vocab])  # [N, P-1, Vd]: W2's rows at vocab


def vocab_labels(labels: torch.Tensor, vocab: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Token-id labels -> indices into the draft vocabulary `vocab` [Vd]; IGNORE for a label
    outside it (and for IGNORE)."""
    index = torch.full((vocab_size,), IGNORE, dtype=torch.long, device=labels.device)
    index[vocab] = torch.arange(len(vocab), device=labels.device)
    return torch.where(labels == IGNORE, IGNORE, index[labels.clamp_min(0)])


def block_loss(z: torch.Tensor, prev_embeds: torch.Tensor, labels: torch.Tensor,
               lm_head_weight: torch.Tensor, prefix_gru: nn.GRU, embed_proj: nn.Sequential,
               lam: float, gamma: float,
               first: tuple[torch.Tensor, torch.Tensor] | None = None,
               vocab: torch.Tensor | None = None, soft: tuple | None = None,
               distill: float = 0.0, tau: float = 1.0,
               copy: tuple[torch.Tensor, ...] | None = None) -> tuple[torch.Tensor, dict]:
    """The curriculum loss of N blocks and its per-position accuracies.

    z [N, P, H] (P = B-1 label positions), prev_embeds [N, P, H], labels [N, P] (token ids).
    first = (z0 [M, H], y0 [M]): position 0 of M more blocks. final_0 = base_0 (the head never
    corrects the first draft), so they enter both CE terms with weight w_0 = 1 and cost one
    lm_head row each instead of P.
    vocab: the draft vocabulary [Vd] (token ids; None = all V): logits over it only.
    soft = (ids [N, P, k], logits [N, P, k], ids0 [M, k], logits0 [M, k]): the target's top-k at
    every label (and first-only label); with distill = beta > 0 each CE mixes in the soft CE at
    temperature tau (module docstring). Weighted and masked as the hard CE (its labels' IGNORE).
    copy = (candidates [N, P], gate logits [N, P], candidates0 [M], gate logits0 [M]): a
    pointer-generator drafter's copy path (pointer.py); every CE scores its mixture q.
    Returns (loss, stats) with stats = base/final CE and per-position accuracy counts.
    """
    n, p, h = z.shape
    w = position_weights(p, gamma, z.device)
    rows = lm_head_weight if vocab is None else lm_head_weight[vocab]  # [V or Vd, H]
    ys = labels if vocab is None else vocab_labels(labels, vocab, lm_head_weight.shape[0])
    base = F.linear(z.reshape(n * p, h), rows).view(n, p, -1).float()  # [N, P, V or Vd]
    extra = first_logits = None
    if first is not None and first[1].numel():
        y0 = first[1] if vocab is None else vocab_labels(first[1], vocab, lm_head_weight.shape[0])
        first_logits = F.linear(first[0], rows).float()  # [M, V or Vd]
        extra = (F.cross_entropy(first_logits, y0, ignore_index=IGNORE, reduction="sum"),
                 (y0 != IGNORE).sum())
    use_soft = soft is not None and distill > 0
    vsize = lm_head_weight.shape[0]
    gate = gate0 = None  # (candidates, log g, log(1 - g)) of the blocks and the first-only rows
    if copy is not None:
        gate = (copy[0], *log_gate(copy[1], copy[0]))
        gate0 = (copy[2], *log_gate(copy[3], copy[2]))

    def hard_ce(logits: torch.Tensor) -> torch.Tensor:
        if gate is None:
            return weighted_ce(logits, ys, w, extra)
        nll, ok, _ = gated_nll(logits, labels, ys, gate, vocab, vsize)
        wp = w[None, :] * ok
        total, count = (nll * wp).sum(), wp.sum()
        if first_logits is not None:
            nll0, ok0, _ = gated_nll(first_logits, first[1], y0, gate0, vocab, vsize)
            total, count = total + nll0.sum(), count + ok0.sum()
        return total / count.clamp_min(1e-6)

    def ce(logits: torch.Tensor) -> torch.Tensor:  # [N, P, V or Vd] -> the mixed CE
        hard = hard_ce(logits)
        if not use_soft:
            return hard
        ce_p, ok = soft_ce(logits, soft[0], soft[1], tau, vocab, vsize, gate)  # [N, P]
        wp = w[None, :] * ok * (labels != IGNORE)
        total, count = (ce_p * wp).sum(), wp.sum()
        if first_logits is not None:
            ce0, ok0 = soft_ce(first_logits, soft[2], soft[3], tau, vocab, vsize, gate0)  # [M]
            ok0 = ok0 & (first[1] != IGNORE)
            total, count = total + (ce0 * ok0).sum(), count + ok0.sum()
        return (1.0 - distill) * hard + distill * total / count.clamp_min(1e-6)

    ce_base = ce(base)
    if lam >= 1.0:
        final, ce_final, loss = base, ce_base, ce_base
    else:
        corr = head_correction(prefix_gru, embed_proj, z, prev_embeds, vocab).float()
        final = torch.cat((base[:, :1], base[:, 1:] + corr), dim=1)  # [N, P, V or Vd]
        ce_final = ce(final)
        loss = (1.0 - lam) * ce_final + lam * ce_base
    valid = labels != IGNORE  # a label outside the draft vocabulary is valid: always a miss

    def token(logits: torch.Tensor, lab: torch.Tensor, y: torch.Tensor, g) -> torch.Tensor:
        if g is not None:  # a pointer drafter drafts q's argmax
            return gated_nll(logits, lab, y, g, vocab, vsize)[2]
        idx = logits.argmax(-1)  # the drafted token ids (greedy)
        return idx if vocab is None else vocab[idx]

    with torch.no_grad():
        stats = {
            "ce_base": float(ce_base), "ce_final": float(ce_final),
            "valid": valid.sum(0).tolist(),
            "correct_base": ((token(base, labels, ys, gate) == labels) & valid).sum(0).tolist(),
            "correct_final": ((token(final, labels, ys, gate) == labels) & valid).sum(0).tolist(),
        }
        if first_logits is not None:  # position 0: base = final
            hit = int(((token(first_logits, first[1], y0, gate0) == first[1])
                       & (first[1] != IGNORE)).sum())
            stats["valid"][0] += int((first[1] != IGNORE).sum())  # misses too
            stats["correct_base"][0] += hit
            stats["correct_final"][0] += hit
    return loss, stats


def tau_sim(accuracy: list[float]) -> float:
    """1 + sum_k prod_{i<=k} acc_i: expected committed tokens per round if positions were
    independent (the bonus token counts)."""
    out, run = 1.0, 1.0
    for a in accuracy:
        run *= a
        out += run
    return out


def accuracies(valid: list[int], correct: list[int]) -> list[float]:
    return [c / v if v else math.nan for c, v in zip(correct, valid)]
