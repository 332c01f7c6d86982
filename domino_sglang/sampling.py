"""Lossless speculative sampling, draft side: the request's sampling transform, seeded uniforms,
and the sampled head rollout (the verifier, `verify.verify_sampled`, consumes its output).

Terms and shapes (bs requests, block size B, vocabulary V, n = B-1 proposal positions):

    rows        SamplingRows, one row per request: temperature, top_k, top_p, min_p, seed
    processed   the distribution SGLang's sampler draws from for a row: softmax(logits / T),
                then top-k (rank < k), top-p (keep a token while the mass strictly before it
                in descending order is <= p), min-p (keep prob >= min_p * max prob), then
                renormalised. Same rule and order as `sglang.srt.layers.sampler.
                top_k_top_p_min_p_sampling_from_probs_torch` (the CPU sampler); checked
                against it in tests/test_sampling.py. Greedy rows (top_k <= 1) are one-hot at
                torch.argmax, exactly the greedy path.
    q           [bs, n, V] processed draft distributions: q_0 = processed(base_0),
                q_i = processed(base_i + head correction | GRU over x_t, d_1..d_i)
    d_{i+1}     ~ q_i, drawn by inverse CDF from one uniform; the GRU consumes the SAMPLED token
    scale       the drafter's draft temperature scale s: q is processed at temperature T * s
                (top-k / top-p / min-p as the request asks). Verification is exact for any q;
                s < 1 sharpens a drafter whose distributions are flatter than the target's, which
                raises the acceptance sum_v min(p, q) (docs/studies/draft_temperature.py; tuning
                the draft's temperature is an old trick of speculative sampling). Greedy rows are
                one-hot whatever s.

Randomness is counter-based: every uniform is a hash of (request seed, absolute token position,
stream), computed on the device in a few integer ops, so a request with `sampling_seed` is
reproducible whatever its batch and no host synchronisation or per-request generator is needed.
Streams: DRAFT (d at position P), ACCEPT (the coin deciding d at P), RESAMPLE (the residual or
bonus token at P). Reusing a (seed, P, stream) in a later round is sound: a round's committed
tokens are a function of the uniforms at positions <= its last committed position only (the
draft at P depends on drafts before P; the first rejection stops the chain), so uniforms at
later positions are still independent of everything committed when the next round uses them.
Requests without a seed get a fresh random seed every round (one device-side randint).

Depends on torch and `rollout` only (no SGLang import), so it is testable in isolation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from domino_sglang.kernels import argmax
from domino_sglang.pointer import PointerCopy, copy_wins
from domino_sglang.rollout import (
    HeadParams,
    base_logits,
    copy_column,
    gru_step,
    head_step,
    make_candidates,
)

DRAFT, ACCEPT, RESAMPLE = 0, 1, 2
_M32 = 0xFFFFFFFF


@dataclass
class SamplingRows:
    """Per-request sampling parameters (device tensors, one row per request)."""

    temperature: torch.Tensor  # [N] float32, > 0 (SGLang stores 1.0 for greedy rows)
    top_k: torch.Tensor  # [N] int64; <= 1 means greedy
    top_p: torch.Tensor  # [N] float32
    min_p: torch.Tensor  # [N] float32
    seed: torch.Tensor  # [N] int64
    # host flags (over-approximations are safe: they only cost a pass over [N, V])
    need_sort: bool = True  # some row filters by top-k or top-p
    need_min_p: bool = True  # some row filters by min-p
    has_greedy: bool = True  # some row is greedy (top_k <= 1)

    @property
    def greedy(self) -> torch.Tensor:  # [N] bool
        return self.top_k <= 1

    def tempered(self, scale: float) -> SamplingRows:
        """The same rows at temperature T * scale (the draft side's q; the target's p keeps T)."""
        if scale == 1.0:
            return self
        return replace(self, temperature=self.temperature * scale)

    def repeat(self, n: int) -> SamplingRows:
        """Each row repeated n times (rows of a flattened [N, n, V] tensor)."""
        r = lambda t: t.repeat_interleave(n, dim=0)  # noqa: E731
        return SamplingRows(r(self.temperature), r(self.top_k), r(self.top_p), r(self.min_p),
                            r(self.seed), self.need_sort, self.need_min_p, self.has_greedy)

    @classmethod
    def from_sampling_info(cls, info, seeds: list[int | None]) -> SamplingRows:
        """From SGLang's SamplingBatchInfo (`temperatures` [bs, 1], `top_ks`, `top_ps`,
        `min_ps`, the need_* flags) and each request's `sampling_seed` (None: a fresh random
        seed this round). SGLang ORs its flags when batches merge and keeps them when requests
        leave, so they over-approximate; a greedy row has top_k = 1, which sets
        need_top_k_sampling."""
        device = info.temperatures.device
        seed = torch.randint(0, 2**62, (len(seeds),), dtype=torch.int64, device=device)
        if any(s is not None for s in seeds):  # one host-to-device copy, only with seeds
            given = torch.tensor([[s if s is not None else 0 for s in seeds],
                                  [s is not None for s in seeds]], dtype=torch.int64,
                                 device=device)
            seed = torch.where(given[1] > 0, given[0], seed)
        return cls(temperature=info.temperatures.view(-1).float(), top_k=info.top_ks.long(),
                   top_p=info.top_ps.float(), min_p=info.min_ps.float(), seed=seed,
                   need_sort=bool(info.need_top_k_sampling or info.need_top_p_sampling),
                   need_min_p=bool(info.need_min_p_sampling),
                   has_greedy=bool(info.need_top_k_sampling))


def process_logits(logits: torch.Tensor, rows: SamplingRows) -> torch.Tensor:
    """logits [N, V] -> the processed distribution [N, V] (float32) each row is sampled from.

    Passes over [N, V] are skipped when the host flags say no row needs them: temperature-only
    rows cost the division and the softmax."""
    probs = torch.softmax(logits.float() / rows.temperature[:, None], dim=-1)
    if rows.need_sort:
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        mass_before = sorted_p.cumsum(dim=-1) - sorted_p  # from the UNfiltered sort, as SGLang
        rank = torch.arange(probs.shape[-1], device=probs.device)
        drop = (rank[None] >= rows.top_k[:, None]) | (mass_before > rows.top_p[:, None])
        probs = torch.zeros_like(probs).scatter_(-1, idx, sorted_p.masked_fill(drop, 0.0))
    if rows.need_min_p:  # min-p relative to the top probability (never removed by top-k / p)
        top = probs.amax(dim=-1, keepdim=True)
        probs = probs.masked_fill(probs < top * rows.min_p[:, None], 0.0)
    if rows.need_sort or rows.need_min_p:
        probs = probs / probs.sum(dim=-1, keepdim=True)
    if rows.has_greedy:  # greedy rows: one-hot at the argmax, in place (probs is our own tensor)
        pick = argmax(logits)[:, None]  # [N, 1]
        greedy = rows.greedy[:, None]  # [N, 1]
        at_pick = torch.where(greedy, 1.0, probs.gather(1, pick))  # others: unchanged
        probs.masked_fill_(greedy, 0.0).scatter_(1, pick, at_pick)
    return probs


def _mix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser on int64 tensors holding values in [0, 2^32).

    Products overflow int64 and wrap; the low 32 bits (kept by the mask) are still exact.
    """
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _M32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def seeded_uniform(seed: torch.Tensor, positions: torch.Tensor, stream: int) -> torch.Tensor:
    """Uniforms in (0, 1), float64, a pure function of (seed [N], positions [N, ...], stream)."""
    seed = seed.view(-1, *([1] * (positions.dim() - 1)))
    h = _mix32(torch.full_like(positions, stream + 0x9E3779B9) & _M32)
    h = _mix32(h ^ (positions & _M32))
    h = _mix32(h ^ (seed & _M32))
    h = _mix32(h ^ ((seed >> 32) & _M32))
    return (h.double() + 0.5) / 2.0**32


@dataclass
class RoundUniforms:
    """All uniforms of one round: draft [bs, n], accept [bs, n], resample [bs, B]."""

    draft: torch.Tensor
    accept: torch.Tensor
    resample: torch.Tensor

    @classmethod
    def for_round(cls, seed: torch.Tensor, prefix_lens: torch.Tensor, block: int
                  ) -> RoundUniforms:
        """x_t sits at position prefix_lens; d_k and its coin at prefix + k (k = 1..B-1); the
        token committed at chain index a (residual or bonus) at prefix + 1 + a (a = 0..B-1)."""
        pos = prefix_lens.long()[:, None] + torch.arange(1, block + 1, device=seed.device)
        return cls(draft=seeded_uniform(seed, pos[:, :-1], DRAFT),
                   accept=seeded_uniform(seed, pos[:, :-1], ACCEPT),
                   resample=seeded_uniform(seed, pos, RESAMPLE))


def sample_from(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: weights [N, V] (>= 0, unnormalised), u [N] in (0, 1) -> ids [N].

    The first index whose cumulative weight exceeds u * total: it always has positive weight.
    """
    cdf = weights.double().cumsum(dim=-1)  # [N, V]
    x = (u.double() * cdf[:, -1])[:, None]
    idx = torch.searchsorted(cdf, x, right=True).squeeze(-1)
    return idx.clamp_(max=weights.shape[-1] - 1)


def spread(qd: torch.Tensor, head: HeadParams) -> torch.Tensor:
    """A distribution over the draft vocabulary [.., Vd] -> over the vocabulary [.., V], zero
    outside: exactly the full vocabulary's distribution with -inf logits outside the draft
    vocabulary (top-k / top-p rank those last). The identity without a draft vocabulary."""
    if head.vocab is None:
        return qd
    return qd.new_zeros(*qd.shape[:-1], head.vocab_size).index_copy_(-1, head.vocab, qd)


def pointer_sample(copy: PointerCopy, i: int, logits: torch.Tensor,
                   probs: torch.Tensor, rows: SamplingRows, u: torch.Tensor, head: HeadParams,
                   pool_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A pointer drafter's sampled draft at one position (pointer.py): d ~ q with
    q = (1 - g) probs + g onehot(c), probs [bs, K] the processed distribution over position i's
    columns (copy_column), logits [bs, K] before processing. A greedy row drafts q's
    argmax (g becomes 1 where c wins, else 0), as greedy_rollout. Returns (d [bs], q [bs, V]);
    q is exactly what d was drawn from, so verification stays exact."""
    c, n = copy.candidates()
    log_g, log_1mg = copy.log_gate(i, c, n)
    if rows.has_greedy:
        logp = torch.log_softmax(logits.float(), dim=-1)
        col, present = copy_column(c, head, pool_ids)
        lp_c = logp.gather(1, col[:, None]).squeeze(1).masked_fill(~present, float("-inf"))
        wins = copy_wins(logp.amax(dim=-1), lp_c, c, log_g, log_1mg)
        g = torch.where(rows.greedy, wins.float(), log_g.exp())  # [bs]
    else:
        g = log_g.exp()  # 0 where there is no candidate
    cols = (pool_ids if pool_ids is not None
            else (head.vocab if head.vocab is not None
                  else torch.arange(probs.shape[1], device=probs.device)).expand_as(probs))
    kept = probs * (1.0 - g)[:, None]  # [bs, K]
    ids = torch.cat((cols, c.clamp(min=0)[:, None]), dim=1)  # [bs, K + 1]
    d = ids.gather(1, sample_from(torch.cat((kept, g[:, None]), dim=1), u)[:, None]).squeeze(1)
    q = kept.new_zeros(kept.shape[0], head.vocab_size).scatter_(1, cols, kept)
    q.scatter_add_(1, c.clamp(min=0)[:, None], g[:, None])
    copy.append(d)
    return d, q


@torch.no_grad()
def sampled_rollout(z: torch.Tensor, bonus: torch.Tensor, head: HeadParams, rows: SamplingRows,
                    u_draft: torch.Tensor, candidate_pool: int = 0, use_head: bool = True,
                    logit_bias: torch.Tensor | None = None, temperature_scale: float = 1.0,
                    copy: PointerCopy | None = None, out: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled chain: drafts [bs, n] and the distributions they were drawn from, q [bs, n, V].

    z [bs, B, H], bonus [bs] (x_t), u_draft [bs, n], logit_bias [bs, V] (the request's, added
    to every draft logit as the target gets it). With a candidate pool, q is zero outside it.
    temperature_scale: q at temperature T * scale (module docstring). copy: a pointer
    drafter's copy path: every q is mixed with the copy candidate (pointer_sample). out: a
    float32 [bs, n, V] buffer q is written into (graphs.RolloutGraphs: one per batch bucket).
    """
    if out is not None and (out.shape[0] != z.shape[0] or out.shape[1] != z.shape[1] - 1):
        raise ValueError(f"sampled_rollout: out has shape {tuple(out.shape)}, q needs "
                         f"[{z.shape[0]}, {z.shape[1] - 1}, V]")
    rows = rows.tempered(temperature_scale)
    base = base_logits(z, head)  # [bs, n, V] fp32 ([bs, n, Vd] over a draft vocabulary)
    if logit_bias is not None:
        bias = logit_bias if head.vocab is None else logit_bias[:, head.vocab]
        base = base + bias[:, None, :]
    n, vocab = base.shape[1], head.vocab_size
    if copy is not None:
        copy.start(z[:, :n])
    if not use_head and copy is None:
        qd = process_logits(base.reshape(-1, base.shape[2]), rows.repeat(n))
        drafts = head.token_ids(sample_from(qd, u_draft.reshape(-1))).view(-1, n)
        q = spread(qd, head).view(-1, n, vocab)
        return drafts, q if out is None else out.copy_(q)
    if not use_head:  # backbone only, position by position: the copies depend on the chain
        picks = [pointer_sample(copy, i, base[:, i], process_logits(base[:, i], rows), rows,
                                u_draft[:, i], head) for i in range(n)]
        q = torch.stack([q for _, q in picks], dim=1)
        return torch.stack([d for d, _ in picks], dim=1), q if out is None else out.copy_(q)
    cand = make_candidates(base, head, candidate_pool)
    # q [bs, n, V]; with a pool, q_i (i >= 1) is 0 outside it; with a draft vocabulary, outside
    # that
    q = base.new_zeros(base.shape[0], n, vocab) if out is None else out.zero_()
    q0 = process_logits(base[:, 0], rows)
    if copy is not None:
        d0, q[:, 0] = pointer_sample(copy, 0, base[:, 0], q0, rows, u_draft[:, 0], head)
        drafts = [d0]
    else:
        q[:, 0] = spread(q0, head)
        drafts = [head.token_ids(sample_from(q0, u_draft[:, 0]))]
    gdtype = head.prefix_gru.weight_hh_l0.dtype
    s = z.new_zeros(z.shape[0], head.prefix_gru.hidden_size, dtype=gdtype)
    s = gru_step(head.prefix_gru, head.embed(bonus).to(gdtype), s)
    s = gru_step(head.prefix_gru, head.embed(drafts[0]).to(gdtype), s)
    zh = z.to(gdtype)
    for i in range(1, n):
        logits = head_step(head, zh[:, i], s, base[:, i].to(gdtype), cand, i).float()
        if copy is not None:
            d, q[:, i] = pointer_sample(copy, i, logits, process_logits(logits, rows),
                                        rows, u_draft[:, i], head,
                                        None if cand is None else cand.ids)
        elif cand is None:
            qd = process_logits(logits, rows)
            q[:, i] = spread(qd, head)
            d = head.token_ids(sample_from(qd, u_draft[:, i]))
        else:
            # Processed over the pool alone [bs, K]: the same distribution as over the full
            # vocabulary with -inf outside the pool (those tokens get probability 0 and rank
            # last for top-k / top-p), at K / V of the cost; d is drawn from exactly the q kept.
            q_pool = process_logits(logits, rows)
            q[:, i].scatter_(1, cand.ids, q_pool)
            d = cand.ids.gather(1, sample_from(q_pool, u_draft[:, i])[:, None]).squeeze(1)
        drafts.append(d)
        if i + 1 < n:
            s = gru_step(head.prefix_gru, head.embed(d).to(gdtype), s)
    return torch.stack(drafts, dim=1), q
