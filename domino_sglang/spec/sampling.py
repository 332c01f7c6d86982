"""Lossless speculative sampling's primitives: the request's sampling transform, the seeded
uniforms, the inverse-CDF draw. The sampled head rollout (rollout.py) draws its drafts with them
and the verifier (verify.py) its coins and recovered tokens.

Terms and shapes (bs requests, block size B, vocabulary V, n = B-1 proposal positions):

    rows        SamplingRows, one row per request: temperature, top_k, top_p, min_p, seed
    processed   the distribution SGLang's sampler draws from for a row: softmax(logits / T),
                then top-k (rank < k), top-p (keep a token while the mass strictly before it
                in descending order is <= p), min-p (keep prob >= min_p * max prob), then
                renormalised. Same rule and order as `sglang.srt.layers.sampler.
                top_k_top_p_min_p_sampling_from_probs_torch` (the CPU sampler); checked
                against it in tests/spec/test_sampling.py. Greedy rows (top_k <= 1) are one-hot at
                torch.argmax, exactly the greedy path.
    q           [bs, n, V] processed draft distributions: q_0 = processed(base_0),
                q_i = processed(base_i + head correction | GRU over x_t, d_1..d_i); or the
                same kept as its support (`SparseQ`, [bs, n, S] ids and probabilities), where
                every row's support is known to be small: rows whose top_k is bounded, the
                candidate pool's, an offer's one-hot
    d_{i+1}     ~ q_i, drawn by inverse CDF from one uniform; the GRU consumes the SAMPLED token
    scale       the drafter's draft temperature scale s: q is processed at temperature T * s
                (top-k / top-p / min-p as the request asks). Verification is exact for any q;
                s < 1 sharpens a drafter whose distributions are flatter than the target's, which
                raises the acceptance sum_v min(p, q) (benchmarks/studies/draft_temperature.py;
                tuning the draft's temperature is an old trick of speculative sampling). Greedy
                rows are one-hot whatever s.

Randomness is counter-based: every uniform is a hash of (request seed, absolute token position,
stream), computed on the device in a few integer ops, so a request with `sampling_seed` is
reproducible whatever its batch and no host synchronisation or per-request generator is needed.
Streams: DRAFT (d at position P), ACCEPT (the coin deciding d at P), RESAMPLE (the residual or
bonus token at P). Reusing a (seed, P, stream) in a later round is sound: a round's committed
tokens are a function of the uniforms at positions <= its last committed position only (the
draft at P depends on drafts before P; the first rejection stops the chain), so uniforms at
later positions are still independent of everything committed when the next round uses them.
Requests without a seed get a fresh random seed every round (one device-side randint).

Depends on torch and primitives.py only (no SGLang import), so it is testable in isolation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from domino_sglang.spec.primitives import argmax

DRAFT, ACCEPT, RESAMPLE = 0, 1, 2
_M32 = 0xFFFFFFFF
# top-k / top-p read only the TOP_K_BOUND most likely tokens of each row when every row's top_k
# is at most this (`SamplingRows.top_k_bounded`): a partial top-k instead of a whole-vocabulary
# sort, [N, TOP_K_BOUND] temporaries instead of several [N, V] ones
TOP_K_BOUND = 1024


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
    top_k_bounded: bool = False  # every row's top_k <= TOP_K_BOUND (False is always safe)
    # the K a bounded filter ranks: at least every row's top_k (the batch's largest where the
    # host knows it: a partial top-k costs with K; TOP_K_BOUND in static shapes, graphs.py)
    top_k_width: int = TOP_K_BOUND

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
                            r(self.seed), self.need_sort, self.need_min_p, self.has_greedy,
                            self.top_k_bounded, self.top_k_width)

    @classmethod
    def from_sampling_info(cls, info, seeds: list[int | None], top_k_bounded: bool = False,
                           top_k_width: int = TOP_K_BOUND) -> SamplingRows:
        """From SGLang's SamplingBatchInfo (`temperatures` [bs, 1], `top_ks`, `top_ps`,
        `min_ps`, the need_* flags) and each request's `sampling_seed` (None: a fresh random
        seed this round); `top_k_bounded` and `top_k_width` read on the host (RoundPlan).
        SGLang ORs its flags when batches merge and keeps them when requests leave, so they
        over-approximate; a greedy row has top_k = 1, which sets need_top_k_sampling."""
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
                   has_greedy=bool(info.need_top_k_sampling), top_k_bounded=top_k_bounded,
                   top_k_width=top_k_width)


def process_logits(logits: torch.Tensor, rows: SamplingRows) -> torch.Tensor:
    """logits [N, V] -> the processed distribution [N, V] (float32) each row is sampled from.

    Passes over [N, V] are skipped when the host flags say no row needs them: temperature-only
    rows cost the division and the softmax. With every row's top_k <= TOP_K_BOUND
    (rows.top_k_bounded), top-k / top-p rank only the K = rows.top_k_width most likely tokens
    (torch.topk, sorted): every token past rank K is dropped by top-k anyway, and the mass
    before each of the first K is the same prefix sum of the same descending probabilities
    as the whole sort's, so the kept set is the same."""
    probs = torch.softmax(logits.float() / rows.temperature[:, None], dim=-1)
    if rows.need_sort:
        if rows.top_k_bounded:
            sorted_p, idx = probs.topk(min(rows.top_k_width, probs.shape[-1]), dim=-1)  # [N, K]
        else:
            sorted_p, idx = probs.sort(dim=-1, descending=True)  # [N, V]
        mass_before = sorted_p.cumsum(dim=-1) - sorted_p  # from the UNfiltered sort, as SGLang
        rank = torch.arange(sorted_p.shape[-1], device=probs.device)
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


@dataclass(frozen=True)
class SparseQ:
    """Draft distributions [bs, n, V] kept as their support: q_k(v) = sum_j probs[b, k, j] over
    the j with ids[b, k, j] == v (ids [bs, n, S] int64 may repeat a token; padding entries have
    probability 0), probs [bs, n, S] float32. Verification reads q twice (verify.py): at the
    drafts, and one row densified per request (the residual at its first rejection); [bs, n, S]
    instead of [bs, n, V] is what lets a rollout over a large batch keep its q (graphs.py)."""

    ids: torch.Tensor
    probs: torch.Tensor
    vocab: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.ids.shape[0], self.ids.shape[1], self.vocab)

    def at(self, drafts: torch.Tensor) -> torch.Tensor:
        """q_k(d_{k+1}) [bs, n] of drafts [bs, n]."""
        return (self.probs * (self.ids == drafts[..., None])).sum(dim=-1)

    def row(self, index: torch.Tensor) -> torch.Tensor:
        """Row index[b] of each request's q, densified: [bs, V]."""
        at = index.long()[:, None, None].expand(-1, 1, self.ids.shape[2])  # [bs, 1, S]
        ids, probs = self.ids.gather(1, at).squeeze(1), self.probs.gather(1, at).squeeze(1)
        return probs.new_zeros(ids.shape[0], self.vocab).scatter_add_(1, ids, probs)

    def dense(self) -> torch.Tensor:
        """The whole q [bs, n, V] (tests, small shapes)."""
        return self.probs.new_zeros(self.shape).scatter_add_(2, self.ids, self.probs)

    @staticmethod
    def one_hot(drafts: torch.Tensor, vocab: int) -> SparseQ:
        """Every row one-hot at its drafts [bs, n] (an offer: a proposal fixed in advance)."""
        return SparseQ(drafts[..., None], torch.ones(*drafts.shape, 1, dtype=torch.float32,
                                                     device=drafts.device), vocab)


def support(q: torch.Tensor | tuple[torch.Tensor, torch.Tensor], width: int
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """One position's distributions, dense q [N, V] or (ids [N, m], weights [N, m]: sum
    semantics), as exactly `width` entries (ids [N, width] int64, probs [N, width]): padded with
    probability 0, or the `width` most likely tokens of the dense rows (exact when every row has
    at most `width` tokens of positive probability, which the caller knows)."""
    if isinstance(q, tuple):
        ids, weights = q
    else:
        weights, ids = q.topk(min(width, q.shape[1]), dim=-1, sorted=False)
    pad = width - ids.shape[1]
    if pad < 0:
        raise ValueError(f"support: {ids.shape[1]} entries, {width} kept")
    return (torch.nn.functional.pad(ids, (0, pad)), torch.nn.functional.pad(weights, (0, pad)))


def top_k_support(logits: torch.Tensor, rows: SamplingRows) -> tuple[torch.Tensor, torch.Tensor]:
    """process_logits for rows that are all top-k bounded, kept as the support: (probs [N, K],
    ids [N, K]), K = min(rows.top_k_width, V), the K most likely tokens in descending order
    (greedy rows: all the mass at column 0, on their argmax). The same distribution as
    process_logits(logits, rows) (the same filters in the same order), without any pass over
    [N, V] after the softmax and the partial top-k: a token drawn from it costs K, not V."""
    probs = torch.softmax(logits.float() / rows.temperature[:, None], dim=-1)
    sorted_p, ids = probs.topk(min(rows.top_k_width, probs.shape[-1]), dim=-1)  # [N, K]
    mass_before = sorted_p.cumsum(dim=-1) - sorted_p
    rank = torch.arange(sorted_p.shape[-1], device=probs.device)
    drop = (rank[None] >= rows.top_k[:, None]) | (mass_before > rows.top_p[:, None])
    kept = sorted_p.masked_fill(drop, 0.0)
    if rows.need_min_p:  # relative to the top probability, column 0 (never filtered)
        kept = kept.masked_fill(kept < kept[:, :1] * rows.min_p[:, None], 0.0)
    kept = kept / kept.sum(dim=-1, keepdim=True)
    if rows.has_greedy:  # one-hot at the first maximal index, as process_logits
        greedy = rows.greedy[:, None]  # [N, 1]
        ids = torch.where(greedy & (rank[None] == 0), argmax(logits)[:, None], ids)
        kept = torch.where(greedy, (rank[None] == 0).to(kept.dtype), kept)
    return kept, ids


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
