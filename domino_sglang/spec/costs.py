"""Round costs learned online from the server's own round times, on any device (the adaptive
policy's price list; policy.py decides with it). Depends on nothing but the standard library.

Unit: one plain round (L = 1) of this server at the same batch size bs, timed here: what
decoding plainly costs is 1 by definition, so the policy's floor needs no device constant.
A round verifying L >= 2 tokens per request costs

    cost(bs, L) = 1 + draft(bs) + per_token(bs) * (L - 1)

draft: the draft pass and whatever a verify round pays over a plain one whatever L (extend
instead of decode metadata, the context write); per_token: one more verified row per request
(and, drafting short blocks, one more drafted one). Both shapes seen so far fit it: on a CPU
per_token grows with bs (the target's forward turns compute-bound at bs * L rows;
benchmarks/results/round_cost_*.md), on a GPU at small batch a verify of 16 tokens costs about
one decode step (per_token ~0) and the draft pass is the main cost. Nothing about either is
assumed: (draft, per_token) is learned per batch-size bucket by Bayesian least squares on the
samples

    y = t(bs, L) / t_plain(bs) - 1 = draft + per_token * (L - 1) + noise

with exponential forgetting (FORGET per sample: costs drift as contexts grow), starting from a
device-neutral prior (NEUTRAL, weak: PRIOR_DRAFT / PRIOR_PER_TOKEN pseudo-samples) or, for a
bucket with no samples of its own, the dearer of that prior and the nearest learned bucket's
fit (a load jump is priced cautiously: plain decoding until its own rounds say otherwise).
The fit's posterior gives the policy an upper bound (mean + Z * sd) to decide with. Samples
are clipped to OUTLIER sd of the fit (a GC pause makes one round huge; a noisy cheap round
comes out below plain) so one round cannot move it much.

A draft tree's round (tree.py) verifies as many rows as a chain of its size N and pays the
tree's growth and its masked verify on top (eager on a GPU, where chains replay graphs): it
costs cost(bs, N) + tree_extra(bs), tree_extra the bucket's forgotten mean of its tree rounds'
samples less the chain fit's prediction (from TREE_EXTRA, TREE_EXTRA_WEIGHT pseudo-samples).
Tree rounds stay out of the chain's fit.

t is the wall time from one decode round's start to the next's (the scheduler's own work
included; the worker drops a round followed by a prefill; offer-only rounds, without a draft
pass, are samples of the per-token term alone: their long verifies are what prices an offer)
and t_plain(bs) the low median of the bucket's last PLAIN_WINDOW plain rounds (kept at most
one per PLAIN_SPACING rounds, so a slow spell of consecutive plain rounds is a couple of the
window's times), used once it has PLAIN_MIN; a speculating server runs a plain round (a
calibration round) when its bucket has too few or stale (CAL_REFRESH rounds) plain times, at
most one per CAL_MIN_GAP rounds (policy.py). Buckets: exact to 8, then 4 per octave.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

PLAIN_WINDOW, PLAIN_MIN = 9, 3  # plain-round times kept per bucket; needed before use
PLAIN_SPACING = 8  # rounds between two plain times kept (a spell of plain rounds gives a few)
CAL_MIN_GAP = 32  # rounds between two calibration rounds (plain rounds while speculating)
CAL_REFRESH = 96  # rounds after which a batch size's plain time is measured again
FORGET = 0.99  # per sample of a bucket: its fit weighs the last ~100 rounds
PRIOR_DRAFT, PRIOR_PER_TOKEN = 2.0, 2.0  # the prior's weight, in pseudo-samples (per_token's at
PRIOR_L = 6  # L = PRIOR_L: a sample of a long round says more about per_token)
NOISE_PRIOR, NOISE_WEIGHT = 0.15, 4.0  # sd of y assumed before any sample, and its weight
OUTLIER = 3.0  # samples farther than this many sd from the fit are clipped there
OUTLIER_FLOOR = 0.25  # ... but never closer than this (y units)
OWN_MIN = 5.0  # effective samples a bucket needs before it prices other buckets' priors
Z = 1.0  # the upper bound's sd multiple
TREE_EXTRA, TREE_EXTRA_WEIGHT = 0.1, 2.0  # a tree round's cost over the chain's, prior


@dataclass(frozen=True)
class CostModel:
    """cost(bs, L) = 1 + draft + (slope_0 + slope_per_req * bs) * (L - 1) plain rounds."""

    draft: float
    slope_0: float
    slope_per_req: float

    def __call__(self, bs: int, draft_len: int) -> float:
        if draft_len <= 1:
            return 1.0
        return 1.0 + self.draft + (self.slope_0 + self.slope_per_req * bs) * (draft_len - 1)

    def scaled(self, k: float) -> CostModel:
        """The model whose speculative overhead cost - 1 is k times this one's."""
        return CostModel(k * self.draft, k * self.slope_0, k * self.slope_per_req)


# The device-neutral prior: a speculative round costs 1.4 plain rounds at L = 2 and 0.04 more
# per verified token, whatever bs. Between the shapes above (a CPU's L = 2 round about as dear,
# docs/design.md; a GPU's draft pass cheaper, its verify nearly flat in L); weighted as ~4
# rounds, so a server's own rounds outvote it within a few dozen.
NEUTRAL = CostModel(draft=0.36, slope_0=0.04, slope_per_req=0.0)


def bs_bucket(bs: int) -> int:
    """The batch sizes sharing a plain-round time and a cost fit: exact up to 8, then 4 buckets
    per octave (8, 10, 12, 14, 16, 20, ...)."""
    if bs <= 8:
        return bs
    shift = bs.bit_length() - 3
    return (bs >> shift) << shift


def _solve(a: list[float], b: list[float]) -> tuple[list[float], list[float]]:
    """(P^-1 b, P^-1 as [p00, p01, p11]) for the symmetric 2x2 P = [[a0, a1], [a1, a2]]."""
    det = a[0] * a[2] - a[1] * a[1]
    inv = [a[2] / det, -a[1] / det, a[0] / det]
    return [inv[0] * b[0] + inv[1] * b[1], inv[1] * b[0] + inv[2] * b[1]], inv


@dataclass
class BucketFit:
    """One bucket's posterior over (draft, per_token): forgotten sufficient statistics of the
    samples (sum x x^T as [s00, s01, s11], sum x y) plus a prior added at read time. A sample's
    x is (h, L - 1), h = 1 for a round with a draft pass and 0 for an offer-only round (no
    draft pass: prompt lookup's copies), which prices the same per-token verify."""

    prior: tuple[float, float]
    xx: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    xy: list[float] = field(default_factory=lambda: [0.0, 0.0])
    n: float = 0.0  # effective samples
    n_draft: float = 0.0  # ... of rounds with a draft pass (what the draft term is learned from)
    sq: float = NOISE_PRIOR ** 2 * NOISE_WEIGHT  # forgotten sum of squared residuals (+ prior)
    sq_n: float = NOISE_WEIGHT

    def posterior(self) -> tuple[list[float], list[float]]:
        """(mean [draft, per_token], covariance [c00, c01, c11])."""
        w_d, w_v = PRIOR_DRAFT, PRIOR_PER_TOKEN * (PRIOR_L - 1) ** 2
        p = [self.xx[0] + w_d, self.xx[1], self.xx[2] + w_v]
        b = [self.xy[0] + w_d * self.prior[0], self.xy[1] + w_v * self.prior[1]]
        mean, inv = _solve(p, b)
        var = self.sq / self.sq_n
        return mean, [var * c for c in inv]

    def predict(self, draft_len: int, draft_pass: bool = True) -> tuple[float, float]:
        """(mean, sd) of the overhead cost(bs, L) - 1, the mean's terms floored at 0."""
        if draft_len <= 1:
            return 0.0, 0.0
        (d, v), c = self.posterior()
        h, x = float(draft_pass), draft_len - 1
        mean = h * max(d, 0.0) + max(v, 0.0) * x
        return mean, math.sqrt(max(h * c[0] + 2 * h * c[1] * x + c[2] * x * x, 0.0))

    def add(self, draft_len: int, y: float, draft_pass: bool = True) -> None:
        """A sample y = t / t_plain - 1 of a round verifying draft_len >= 2 tokens."""
        mean, _ = self.predict(draft_len, draft_pass)
        sd = math.sqrt(self.sq / self.sq_n)
        limit = max(OUTLIER * sd, OUTLIER_FLOOR)
        residual = min(max(y - mean, -limit), limit)
        y = mean + residual
        h, x = float(draft_pass), float(draft_len - 1)
        self.xx = [FORGET * self.xx[0] + h, FORGET * self.xx[1] + h * x,
                   FORGET * self.xx[2] + x * x]
        self.xy = [FORGET * self.xy[0] + h * y, FORGET * self.xy[1] + x * y]
        self.n = FORGET * self.n + 1.0
        self.n_draft = FORGET * self.n_draft + h
        self.sq = FORGET * self.sq + residual * residual
        self.sq_n = FORGET * self.sq_n + 1.0


@dataclass
class OnlineCosts:
    """The learned price list (module docstring): per bucket a plain-round time and a fit of the
    speculative overhead. `prior` prices a bucket before its own rounds (NEUTRAL by default)."""

    prior: CostModel = NEUTRAL
    fits: dict[int, BucketFit] = field(default_factory=dict)
    plain: dict[int, deque] = field(default_factory=dict)  # bucket -> last plain-round seconds
    plain_at: dict[int, int] = field(default_factory=dict)  # bucket -> round of its last kept
    trees: dict[int, list[float]] = field(default_factory=dict)  # bucket -> [sum, n] forgotten
    rounds: int = 0  # timed rounds so far

    def _prior(self, bs: int) -> tuple[float, float]:
        """The neutral prior at bs, or the nearest learned bucket's fit where it is dearer."""
        d = self.prior.draft
        v = self.prior.slope_0 + self.prior.slope_per_req * bs
        learned = [(abs(b - bs_bucket(bs)), b) for b, f in self.fits.items()
                   if f.n_draft >= OWN_MIN and b != bs_bucket(bs)]
        if learned:
            (nd, nv), _ = self.fits[min(learned)[1]].posterior()
            d, v = max(d, nd), max(v, nv)
        return d, v

    def fit(self, bs: int) -> BucketFit:
        """bs's bucket's fit (a fresh one, from the prior, if it has none: not stored). A fit
        with fewer than OWN_MIN samples takes its prior afresh (a neighbour learned since its
        first sample may price it dearer)."""
        bucket = bs_bucket(bs)
        got = self.fits.get(bucket)
        if got is None:
            return BucketFit(self._prior(bs))
        if got.n_draft < OWN_MIN:
            got.prior = self._prior(bs)
        return got

    def cost(self, bs: int, draft_len: int, z: float = 0.0, draft_pass: bool = True) -> float:
        """cost(bs, L) in plain rounds: the fit's mean, plus z sd (z = Z: the upper bound);
        `draft_pass` False: an offer-only round's (no draft pass)."""
        mean, sd = self.fit(bs).predict(draft_len, draft_pass)
        return 1.0 + max(mean + z * sd, 0.0) if draft_len > 1 else 1.0

    def tree_cost(self, bs: int, size: int, z: float = 0.0) -> float:
        """cost of a draft tree's round of `size` tokens at bs: the chain's of that size plus
        the bucket's tree_extra (module docstring)."""
        return self.cost(bs, size, z) + self.tree_extra(bs)

    def tree_extra(self, bs: int) -> float:
        """What a tree round costs over a chain round of its size, in plain rounds (>= 0)."""
        total, n = self.trees.get(bs_bucket(bs), (0.0, 0.0))
        return max((total + TREE_EXTRA * TREE_EXTRA_WEIGHT) / (n + TREE_EXTRA_WEIGHT), 0.0)

    def learned(self, bs: int) -> tuple[float, float, float]:
        """(draft, per_token, effective samples) at bs: what /metrics and the log show."""
        fit = self.fit(bs)
        (d, v), _ = fit.posterior()
        return max(d, 0.0), max(v, 0.0), fit.n

    def knows(self, bs: int) -> bool:
        """Whether bs's bucket has learned from speculative rounds of its own with a draft pass
        (else it is priced by the prior or a neighbour; offer-only rounds teach the per-token
        term alone)."""
        fit = self.fits.get(bs_bucket(bs))
        return fit is not None and fit.n_draft > 0.0

    def scale(self, bs: int) -> float:
        """k: the learned overhead of an L = 2 round at bs over the neutral prior's (1: as
        assumed; the `domino_cost_scale` gauge)."""
        return (self.cost(bs, 2) - 1.0) / (self.prior(bs, 2) - 1.0)

    def plain_time(self, bs: int) -> float | None:
        """Seconds of a plain round at this batch size: the low median of the bucket's last
        PLAIN_WINDOW plain rounds, once it has PLAIN_MIN (None before)."""
        times = self.plain.get(bs_bucket(bs))
        if times is None or len(times) < PLAIN_MIN:
            return None
        return statistics.median_low(times)

    def observe(self, bs: int, draft_len: int, seconds: float, draft_pass: bool = True,
                tree: bool = False) -> None:
        """A round of bs requests verifying draft_len tokens took `seconds` (start to start);
        `draft_pass` False: an offer-only round; `tree`: a draft tree's round."""
        self.rounds += 1
        bucket = bs_bucket(bs)
        if draft_len <= 1:
            if self.rounds - self.plain_at.get(bucket, -PLAIN_SPACING) >= PLAIN_SPACING:
                self.plain.setdefault(bucket, deque(maxlen=PLAIN_WINDOW)).append(seconds)
                self.plain_at[bucket] = self.rounds
            return
        plain = self.plain_time(bs)
        if plain is None or plain <= 0.0 or not math.isfinite(seconds):
            return
        y = seconds / plain - 1.0
        if tree:  # what the round cost over the chain fit's prediction, clipped around the
            fit = self.fit(bs)  # extra's own estimate
            mean, _ = fit.predict(draft_len)
            limit = max(OUTLIER * math.sqrt(fit.sq / fit.sq_n), OUTLIER_FLOOR)
            known = self.tree_extra(bs)
            extra = known + min(max(y - mean - known, -limit), limit)
            total, n = self.trees.get(bucket, (0.0, 0.0))
            self.trees[bucket] = [FORGET * total + extra, FORGET * n + 1.0]
            return
        if bucket not in self.fits:
            self.fits[bucket] = BucketFit(self._prior(bs))
        self.fits[bucket].add(draft_len, y, draft_pass)

    def needs_plain(self, bs: int) -> bool:
        """Whether a speculating server should time a plain round at this batch size: rounds
        are being timed and the bucket has fewer than PLAIN_MIN plain times or its last is
        CAL_REFRESH rounds old."""
        at = self.plain_at.get(bs_bucket(bs))
        return self.rounds > 0 and (self.plain_time(bs) is None or at is None
                                    or self.rounds - at >= CAL_REFRESH)
