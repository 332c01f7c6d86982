"""Adaptive speculation: how many chain tokens to verify this round (L = 1 .. B; L = 1 is plain
decoding: no draft, the target decodes one token per request).

Cost, in units of one plain round at the same batch size bs:
    cost(bs, 1) = 1;  cost(bs, L) = 1 + DRAFT + slope(bs) * (L - 1)
    slope(bs) = SLOPE_0 + SLOPE_PER_REQ * bs
Acceptance: each draft is accepted with probability alpha given the ones before it (geometric),
so L tokens commit E(L) = (1 - alpha^L) / (1 - alpha). The policy picks the L maximising
E(L) / cost(bs, L) and speculates only where that beats plain decoding by MARGIN with the
estimates' doubt priced in (alpha's Wilson lower bound, the costs' upper bound): L = 1 is always
a candidate, so it never plans a loss against plain decoding.

alpha is a running estimate (`AcceptanceStats`: the truncated-geometric MLE with exponential
forgetting and an optimistic prior, so a new server speculates and learns). While the policy
decodes plainly it probes with the cheapest speculative round (L = 2), spaced so probes cost at
most PROBE_BUDGET of the plain rounds' time and more often near break-even; plain rounds age the
estimate so a stale low alpha fades. Costs are learned on the server itself per batch-size
bucket from its own round times (costs.py, `OnlineCosts`) from a device-neutral prior; a bucket
that has timed no speculative round of its own verifies at most PROBE_LEN tokens. `COSTS` keeps
recorded CPU profiles for benchmarks and simulations only.

Offered drafts (proposers/protocol.py: prompt lookup, ...): a round where every request has an
offered draft runs no draft pass (cost less DRAFT) and is sized by `offer_len` from an estimate
per offering proposer, learned from the rows it drafted only; the longest L that pays, since
such drafts are right in runs rather than geometrically.

Draft trees (tree.py; --speculative-domino-tree-width K > 0): a round the chain would speculate
in (L > 1, not a probe or calibration round) may verify a tree of N tokens instead, N among the
sizes the planner allows on TREE_GRID. What a tree commits is learned per size, as the mean
tokens per request-round of that size's tree rounds (`TreeTokens`), not through a per-level
alpha: a tree's depth is capped by its shape (its kept chain, its branches), so a geometric fit
over N - 1 levels reads its shallow levels too low, and a chain's alpha, learned at the short L
the policy verifies, says nothing of them. A size's prior is the chain model's tokens at that
size times TREE_GAIN, fading as the size's own rounds come in. A tree round costs the chain's
of its size plus a learned extra (costs.py). `tree_len` picks the N whose tokens per cost, at
their upper bound (Z_PROBE: optimism under doubt), beat the chain's E(alpha, L) / cost(bs, L)
at alpha's upper bound, if those tokens also beat plain decoding by MARGIN at the costs' upper
bound (a size untried is priced by its prior, from the chain's alpha, which says little of a
tree where the chain's drafts are sampled and the tree's are the head's likeliest: its doubt
decides). The estimate not used ages as in a plain round, so the one left behind is tried
again now and then (its doubt grows) and follows the content; a size whose trees lose is, once
tried, held at its mean by its rounds until its doubt grows back.

Switches (options.py): --speculative-domino-adaptive off verifies the full block every round;
--speculative-domino-debug-draft-len pins L or cycles a pattern by committed length (tests).
The measurements behind the constants and the design history: docs/design.md, "The adaptive
policy". Depends on nothing but the standard library.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from domino_sglang.spec.costs import (  # noqa: F401  (re-exported: the policy's price list)
    CAL_MIN_GAP,
    CAL_REFRESH,
    NEUTRAL,
    PLAIN_MIN,
    PLAIN_SPACING,
    TREE_EXTRA,
    CostModel,
    OnlineCosts,
    bs_bucket,
)
from domino_sglang.spec.costs import Z as Z_COST

MARGIN = 0.02
PROBE_BUDGET = 0.02  # a probe's gross overhead per plain round's time
NEAR_BUDGET = 0.005  # its expected loss (beyond the tokens it commits) per plain round's time
PROBE_LEN = 2
PLAIN_DECAY = 0.98  # how a plain round ages the acceptance estimate (a judged round: 0.95)
AGE_FLOOR = 4.0  # judged drafts plain rounds age the estimate down to (its bounds stay finite)
Z_PROBE = 1.0  # ... and the upper bound that keeps probes at their base rate
Z_ALPHA = 0.25  # alpha's lower bound: this many binomial sd under the estimate
BACKOFF, MAX_LOSSES = 2, 3  # probe spacing x BACKOFF per losing probe, at most MAX_LOSSES times
TREE_GRID = (6, 8, 12, 16, 24, 32)  # the tree sizes the adaptive policy weighs (and learns)
TREE_GAIN = 1.1  # a size's prior: the chain model's tokens at that size, times this
TREE_PRIOR_ROWS = 2.0  # request-rounds behind the prior
TREE_SPREAD = 1.0  # sd of one request-round's committed tokens (a size's upper bound)
TREE_AGE_FLOOR = 1.0  # request-rounds a size's estimate ages down to while the chain is chosen


COSTS = {
    "cpu-bf16": CostModel(draft=0.35, slope_0=0.05, slope_per_req=0.0065),
    "cpu-fp32": CostModel(draft=0.599, slope_0=0.1088, slope_per_req=0.01466),
    "cpu-bf16-short": CostModel(draft=0.293, slope_0=0.0698, slope_per_req=0.0148),
}
DEFAULT_COST = COSTS["cpu-bf16"]


def cost_model(device: str, dtype: str, override: tuple[float, float, float] | None = None,
               short_draft: bool = False) -> tuple[str, CostModel]:
    """(name, constants) of the cost prior the server starts from (costs.NEUTRAL: the same for
    any `device`, `dtype` and `short_draft`, learned from there; module docstring); `override`
    = (DRAFT, SLOPE_0, SLOPE_PER_REQ) replaces it (--speculative-domino-debug-cost, parsed by
    options.py)."""
    if override is not None:
        return "debug-cost", CostModel(*override)
    # the same prior on every device, dtype and draft shape: the server learns its own costs
    return "neutral (learned online)", NEUTRAL


def expected_tokens(alpha: float, draft_len: int) -> float:
    """E[committed tokens] of a round verifying draft_len tokens (bonus included)."""
    return float(sum(alpha**k for k in range(draft_len)))


def choose_draft_len(bs: int, alpha: float, block: int, margin: float = MARGIN,
                     cost: CostModel = DEFAULT_COST, widths: tuple[int, ...] | None = None) -> int:
    """The L in 1..block (among `widths`, the captured verify widths, where given) maximising
    expected_tokens / round_cost; 1 unless it beats plain decoding by `margin` (relative)."""
    best, best_rate = 1, 1.0 + margin
    candidates = range(2, block + 1) if widths is None else [w for w in widths if 2 <= w <= block]
    for draft_len in candidates:
        rate = expected_tokens(alpha, draft_len) / cost(bs, draft_len)
        if rate > best_rate:
            best, best_rate = draft_len, rate
    return best


def probe_interval(bs: int, block: int, cost: CostModel = DEFAULT_COST,
                   alpha: float = 0.0) -> int | None:
    """Plain rounds between two probes at batch size bs, the drafter's estimated acceptance
    being alpha (None: never worth probing; module docstring)."""
    if choose_draft_len(bs, 1.0, block, cost=cost) == 1:
        return None
    gross = cost(bs, PROBE_LEN) - 1.0  # plain rounds' time a probe adds
    loss = cost(bs, PROBE_LEN) - expected_tokens(alpha, PROBE_LEN)  # ... net of what it commits
    return max(1, math.ceil(min(gross / PROBE_BUDGET, loss / NEAR_BUDGET)))


@dataclass
class AcceptanceStats:
    """Running per-draft acceptance rate alpha = accepted / judged, forgetting old rounds. The
    prior enters as pseudo-counts that are forgotten like any round (after 60 rounds it weighs
    5 %): a prior added afresh at every read never fades, and at bs 1 (where a round judges ~1
    draft) it held a weak drafter's alpha well above its rate, enough to make it speculate at a
    loss (docs/design.md)."""

    prior_alpha: float = 0.7  # optimistic: a new server tries its drafter first (see above)
    prior_weight: float = 8.0  # pseudo-judged drafts behind the prior
    decay: float = 0.95  # per round
    accepted: float = 0.0
    judged: float = 0.0

    def __post_init__(self) -> None:
        self.accepted += self.prior_alpha * self.prior_weight
        self.judged += self.prior_weight

    @property
    def alpha(self) -> float:
        if self.judged < 1e-9:  # no prior and nothing judged yet (or forgotten)
            return self.prior_alpha
        return self.accepted / self.judged

    def bounds(self, z: float | None = None) -> tuple[float, float]:
        """(lower, upper): the Wilson score interval of z (default Z_ALPHA) sd around alpha
        over the judged drafts (prior included, forgotten like them). Wilson, not alpha -+ z sd:
        that is 0 wide at alpha 0 or 1, so a few failed probes would look certain."""
        z = Z_ALPHA if z is None else z
        n, alpha = max(self.judged, 1e-9), self.alpha
        shrink = 1.0 + z * z / n
        center = (alpha + z * z / (2 * n)) / shrink
        half = z / shrink * math.sqrt(alpha * (1.0 - alpha) / n + z * z / (4 * n * n))
        return max(center - half, 0.0), min(center + half, 1.0)

    def forget(self, decay: float = PLAIN_DECAY, floor: float = 0.0) -> None:
        """A round that judged no draft (plain decoding): the estimate ages, by `decay`, but
        not below `floor` judged drafts (alpha unchanged either way)."""
        if self.judged > floor:
            decay = max(decay, floor / self.judged)
            self.accepted *= decay
            self.judged *= decay

    def update(self, accepted: int, judged: int) -> None:
        """One round: `accepted` drafts kept over `judged` drafts compared (a request with
        accept length a + 1 out of L judged min(a + 1, L - 1))."""
        self.accepted = self.decay * self.accepted + accepted
        self.judged = self.decay * self.judged + judged


@dataclass
class TreeTokens:
    """Committed tokens per request-round of a draft tree, by its size N: forgotten sums over
    that size's tree rounds, with a prior of TREE_PRIOR_ROWS request-rounds at the caller's
    `prior` (module docstring, "Draft trees")."""

    decay: float = 0.95  # per tree round of the size
    sums: dict[int, list[float]] = field(default_factory=dict)  # N -> [tokens, request-rounds]

    def mean(self, size: int, prior: float) -> float:
        tokens, rows = self.sums.get(size, (0.0, 0.0))
        return (tokens + TREE_PRIOR_ROWS * prior) / (rows + TREE_PRIOR_ROWS)

    def upper(self, size: int, prior: float, z: float = Z_PROBE) -> float:
        """The mean + z sd of it, one request-round's tokens spreading TREE_SPREAD."""
        _, rows = self.sums.get(size, (0.0, 0.0))
        return self.mean(size, prior) + z * TREE_SPREAD / math.sqrt(rows + TREE_PRIOR_ROWS)

    def update(self, size: int, tokens: int, rows: int) -> None:
        """A tree round of `size`: `rows` requests committed `tokens` in all."""
        total, n = self.sums.get(size, (0.0, 0.0))
        self.sums[size] = [self.decay * total + tokens, self.decay * n + rows]

    def forget(self, decay: float = PLAIN_DECAY, floor: float = TREE_AGE_FLOOR) -> None:
        """A round that kept the chain: every size's estimate ages (its mean unchanged, its
        doubt wider, down to `floor` request-rounds)."""
        for entry in self.sums.values():
            if entry[1] > floor:
                keep = max(decay, floor / entry[1])
                entry[0] *= keep
                entry[1] *= keep


class SpeculationPolicy:
    """Chooses each round's draft length; `enabled=False` always returns the full block.
    `cost` is the prior the learned costs start from (`calibrate=True`, costs.OnlineCosts) or,
    with `calibrate=False`, the costs as they are (simulations,
    --speculative-domino-debug-calibrate off)."""

    def __init__(self, block: int, enabled: bool = True, stats: AcceptanceStats | None = None,
                 cost: CostModel = NEUTRAL, calibrate: bool = True):
        self.block = block
        self.enabled = enabled
        self.stats = stats or AcceptanceStats()
        self.cost = cost
        self.calibration = OnlineCosts(prior=cost) if calibrate else None
        self._plain_rounds = 0
        self._rounds = 0
        self._calibrated_at = -CAL_MIN_GAP  # round of the last calibration round
        # each offering proposer's drafts' alpha, by its name (offer_stats)
        self._offer_stats: dict[str, AcceptanceStats] = {}
        self.calibrating = False  # the last draft_len was a calibration round (must stay plain)
        # the widths the target verifies from captured graphs (graphs.verify_widths; None:
        # every L): the policy chooses among them, as the planner verifies at them
        self.widths: tuple[int, ...] | None = None
        self.losses = 0  # probes in a row after which the policy still decoded plainly
        self._probed = False  # the last draft_len was a probe
        self.trees = TreeTokens()  # draft trees' committed tokens, by size

    @classmethod
    def from_config(cls, config, cost: CostModel = DEFAULT_COST) -> SpeculationPolicy:
        """The policy of a server (options.DominoConfig): `adaptive` off = the full block every
        round; `draft_len` (L0,L1,.. in 1..B, validated by options.py) = L0 every round, or a
        pattern cycled by committed length (measuring the cost model, tests); `calibrate` off =
        the profile's costs as they are (no calibration from round times)."""
        policy = cls(config.block_size, enabled=config.adaptive, cost=cost,
                     calibrate=config.calibrate)
        policy.pinned = config.draft_len
        return policy

    pinned: tuple[int, ...] | None = None  # --speculative-domino-debug-draft-len, overriding

    @property
    def cycles(self) -> bool:
        """Whether draft_len needs the batch's committed length (a pinned pattern)."""
        return self.pinned is not None and len(self.pinned) > 1

    def draft_len(self, bs: int, committed: int = 0) -> int:
        """L for a round of bs requests; `committed` (the first request's committed length)
        matters only to a pinned pattern."""
        if self.pinned is not None:
            return self.pinned[committed % len(self.pinned)]
        if not self.enabled:
            return self.block
        self._rounds += 1
        self.calibrating = False
        probed, self._probed = self._probed, False
        chosen = self.speculative_len(bs)
        if chosen > 1:
            self._plain_rounds = self.losses = 0
            calibration = self.calibration
            # the first PLAIN_MIN plain times of a batch size come PLAIN_SPACING rounds apart
            # (a speculating server learns nothing of its costs before it has them), later
            # ones CAL_MIN_GAP apart
            gap = (CAL_MIN_GAP if calibration is None or calibration.plain_time(bs) is not None
                   else PLAIN_SPACING)
            if (calibration is not None and calibration.needs_plain(bs)
                    and self._rounds - self._calibrated_at >= gap):
                self._calibrated_at = self._rounds
                self.calibrating = True
                return 1  # calibration round: time a plain round at this batch size
            return chosen
        mean = self.cost_fn(bs)
        promising = self.promising(bs, mean)
        if probed and not promising:  # a probe said speculation cannot pay yet
            self.losses = min(self.losses + 1, MAX_LOSSES)
        self._plain_rounds += 1
        self.stats.forget(floor=AGE_FLOOR)  # a plain round ages the estimate too (PLAIN_DECAY)
        interval = probe_interval(bs, self.block, mean, self.stats.alpha)
        backoff = 1 if promising else BACKOFF ** self.losses
        if interval is not None and self.calibration is not None and (
                self.calibration.plain_time(bs) is None):
            # a probe is timed against the bucket's plain rounds: first let it have them
            # (probes every round near break-even would leave it none, and its costs a prior)
            interval = max(interval, PLAIN_SPACING)
        if interval is not None and self._plain_rounds >= interval * backoff:
            self._plain_rounds = 0
            self._probed = True
            return min(PROBE_LEN, self.block)  # probe: measure the drafter again, cheaply
        return 1

    def speculative_len(self, bs: int) -> int:
        """The floor (module docstring): the best L at the estimates' means if it beats plain
        decoding by MARGIN at alpha's lower bound and the costs' upper bound; else the best L
        at those bounds if one does; else 1. At most PROBE_LEN where bs's bucket has timed no
        round of its own (`longest_len`)."""
        alpha = self.stats.alpha
        low, _ = self.stats.bounds()
        mean, high = self.cost_fn(bs), self.cost_fn(bs, Z_COST)
        longest = self.longest_len(bs)
        best = choose_draft_len(bs, alpha, longest, cost=mean, widths=self.widths)
        if best > 1 and expected_tokens(low, best) / high(bs, best) > 1.0 + MARGIN:
            return best
        return choose_draft_len(bs, low, longest, cost=high, widths=self.widths)

    def longest_len(self, bs: int) -> int:
        """The longest L the policy may verify at bs: the block once bs's bucket has timed
        speculative rounds of its own (or with fixed costs), PROBE_LEN before. A bucket's first
        costs are a prior (neutral, or a neighbour's), whose per-token price can be several
        times off on a device where large batches are compute-bound: a load jump would then
        verify long chains at many plain rounds' cost until the bucket learned (docs/design.md,
        "The adaptive policy"). The cheapest round times the bucket as well and loses the least
        while it is wrong."""
        calibration = self.calibration
        if calibration is None or calibration.knows(bs):
            return self.block
        return min(PROBE_LEN, self.block)

    def promising(self, bs: int, cost: Callable[[int, int], float]) -> bool:
        """Whether speculation could pay at alpha's upper bound (Z_PROBE sd: wider than the
        floor's, so a drafter just under break-even keeps being probed) and the costs' means:
        a probe that leaves it so is not a loss (the doubt is worth resolving)."""
        _, high = self.stats.bounds(Z_PROBE)
        return choose_draft_len(bs, high, self.block, cost=cost) > 1

    def cost_fn(self, bs: int, z: float = 0.0) -> Callable[[int, int], float]:
        """cost(bs, L) in plain rounds at bs: the learned costs' mean (+ z sd), or the fixed
        costs (calibration off)."""
        calibration = self.calibration
        if calibration is None:
            return self.cost
        return lambda b, draft_len: calibration.cost(b, draft_len, z)

    def tree_len(self, bs: int, chain_len: int, sizes: Sequence[int]) -> int:
        """N in `sizes`: verify a draft tree of N tokens this round instead of the chain of
        chain_len (this round's draft_len, at a verify width), or 0: the chain (module
        docstring, "Draft trees"). Pinned or switched off: the chain's own L as a tree where
        it is one of the sizes."""
        if self.pinned is not None or not self.enabled:
            return chain_len if chain_len in sizes else 0
        if chain_len <= 1 or self._probed or self.calibrating:
            return 0
        calibration = self.calibration

        def cost(size: int, z: float = 0.0) -> float:  # a tree round's, in plain rounds
            if calibration is None:
                return self.cost(bs, size) + TREE_EXTRA
            return calibration.tree_cost(bs, size, z)

        _, chain_hope = self.stats.bounds(Z_PROBE)
        best, best_rate = 0, (expected_tokens(chain_hope, chain_len)
                              / self.cost_fn(bs)(bs, chain_len))
        longest = self.longest_len(bs)
        for size in sizes:
            if size > longest:
                break
            if size in TREE_GRID:
                rate = self.trees.upper(size, self.tree_prior(size)) / cost(size)
                if rate > best_rate:
                    best, best_rate = size, rate
        if best and (self.trees.upper(best, self.tree_prior(best)) / cost(best, Z_COST)
                     > 1.0 + MARGIN):
            self.stats.forget(floor=AGE_FLOOR)
            return best
        self.trees.forget()
        return 0

    def tree_prior(self, size: int) -> float:
        """A tree size's prior tokens: the chain model's at that size, times TREE_GAIN."""
        return TREE_GAIN * expected_tokens(self.stats.alpha, size)

    def may_offer_instead(self) -> bool:
        """Whether a round the policy made plain may still verify offered drafts: it chose plain
        decoding for the drafter's sake (not a calibration round, not a pinned L)."""
        return self.enabled and self.pinned is None and not self.calibrating

    def offer_stats(self, name: str) -> AcceptanceStats:
        """The acceptance estimate of offering proposer `name`'s drafts."""
        return self._offer_stats.setdefault(name, AcceptanceStats())

    def offer_len(self, name: str, bs: int, longest: int) -> int:
        """L for a round whose every request verifies a draft offered by proposer `name` (at
        most `longest` tokens): no draft pass, that proposer's alpha (module docstring,
        "Offered drafts"); the whole offer with the policy off."""
        if not self.enabled:
            return 1 + longest
        alpha = self.offer_stats(name).alpha
        for draft_len in range(1 + longest, 1, -1):  # the longest chain that still pays
            if expected_tokens(alpha, draft_len) / self.offer_cost(bs, draft_len) > 1.0 + MARGIN:
                return draft_len
        return 1

    def offer_cost(self, bs: int, draft_len: int) -> float:
        """cost(bs, L) of an offer-only round (no draft pass), in plain rounds: learned from
        the bucket's own rounds, offer-only ones included, at the costs' upper bound (the
        floor's doubt: a bucket that never verified so long a chain is priced cautiously);
        the fixed costs' per-token term with calibration off."""
        if self.calibration is None:
            _, per_token = self.learned(bs)
            return 1.0 + per_token * (draft_len - 1)
        return self.calibration.cost(bs, draft_len, Z_COST, draft_pass=False)

    def learned(self, bs: int) -> tuple[float, float]:
        """(draft, per_token) overhead of a speculative round at bs, in plain rounds: learned
        (calibration on) or the fixed costs'."""
        if self.calibration is None:
            return self.cost.draft, self.cost.slope_0 + self.cost.slope_per_req * bs
        draft, per_token, _ = self.calibration.learned(bs)
        return draft, per_token

    def observe_offer(self, name: str, accept_lens: list[int], draft_len: int) -> None:
        """accept_lens: a + 1 per request of a round that verified draft_len tokens whose drafts
        proposer `name` offered."""
        if draft_len > 1 and self.enabled and accept_lens:
            self.offer_stats(name).update(sum(a1 - 1 for a1 in accept_lens),
                                          sum(min(a1, draft_len - 1) for a1 in accept_lens))

    def observe_time(self, bs: int, draft_len: int, seconds: float,
                     draft_pass: bool = True, tree: bool = False) -> None:
        """A round of bs requests verifying draft_len tokens took `seconds`, from its start to
        the next round's start (the worker drops a round followed by a prefill); `draft_pass`
        False: an offer-only round; `tree`: a draft tree's round."""
        if self.calibration is not None and self.enabled and self.pinned is None:
            self.calibration.observe(bs, draft_len, seconds, draft_pass, tree)

    def observe(self, accept_lens: list[int], draft_len: int, tree: bool = False) -> None:
        """accept_lens: a + 1 per request of a round that verified draft_len tokens (`tree`:
        as a draft tree of draft_len tokens; a + 1 the path's tokens committed)."""
        if draft_len <= 1 or not self.enabled:
            return
        accepted = sum(a1 - 1 for a1 in accept_lens)
        judged = sum(min(a1, draft_len - 1) for a1 in accept_lens)
        if tree:
            self.trees.update(draft_len, sum(accept_lens), len(accept_lens))
        else:
            self.stats.update(accepted, judged)
