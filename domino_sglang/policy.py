"""Adaptive speculation: how many chain tokens to verify this round (L = 1 .. B; L = 1 is plain
decoding: no draft, the target decodes one token per request).

Cost model, in units of one plain decode step of the AR server at the same batch size bs
(measured by benchmarks/round_cost.py, fitted by benchmarks/fit_cost.py):

    cost(bs, 1) = 1                                        plain round
    cost(bs, L) = 1 + DRAFT + slope(bs) * (L - 1)          L >= 2
    slope(bs)   = SLOPE_0 + SLOPE_PER_REQ * bs

The constants depend on the hardware and the model dtype. `COSTS` records the profiles measured
on CPUs (reference data for benchmarks and simulations; the server no longer decides with them,
see "Costs on any device" below):
  - "cpu-bf16": SmolLM2-135M, bf16, 1 thread, 2-core Xeon with AMX
    (benchmarks/results/round_cost.md, fitted by hand with the fixed-block sweep's rounds);
    re-measured on an AMD EPYC with native bf16 and packed oneDNN linears
    (round_cost_bf16_epyc.md: L = 16 at 2.31 / 2.74 / 4.35 / 4.61 steps, bs 1 / 4 / 16 / 32;
    this profile predicts 2.20 / 2.49 / 3.66 / 5.22), close enough to keep;
  - "cpu-fp32": the same target in fp32 on a 2-core AMD EPYC, linears on packed oneDNN weights
    (cpu/linear.py; benchmarks/results/round_cost_fp32.md, least squares by fit_cost.py): the
    draft pass and each verified token cost more there relative to a plain step, so speculation
    needs a better drafter to pay;
  - "cpu-bf16-short": bf16 on the AMD EPYC with a drafter that drafts only the L tokens a round
    verifies (config `short_draft`, worker.py `propose`): the draft pass shrinks with L, so its
    price moves from DRAFT into the slope. Re-measured after the CPU attention's bf16 path
    made plain steps 9-32% cheaper (round_cost_short_bf16_v2{,_c16}.md, `round_cost.py
    --short-draft`, drafter rounds only, least squares by `fit_cost.py --short-draft` over bs
    1, 4 and 16; larger batches are extrapolated): L = 2 costs 1.35 / 1.38 / 1.64 plain steps at
    bs 1 / 4 / 16 drafting short (before the attention fix: 1.26 / 1.07 at bs 1 / 4, DRAFT
    0.126, slope 0.0622 + 0.00375 bs). fp32 with short drafts is unmeasured and keeps the
    cpu-fp32 profile.
A GPU has not been measured here. --speculative-domino-debug-cost DRAFT,SLOPE_0,SLOPE_PER_REQ
(what fit_cost.py prints) replaces the learned costs' prior.

DRAFT is the draft pass (one backbone pass over the whole block plus the head's first step),
paid by any speculative round whatever L (drafting short blocks: its part that does not grow
with L); slope is the price of one more verified token per
request, growing with bs as the target's forward turns from memory-bound into compute-bound
(bs * L tokens). Measured on the Xeon in bf16: L = 2 costs ~1.4 steps at bs 1..32; L = 16 costs
~1.7-2.2 steps at bs 1, ~2.4-3.0 at bs 4, ~4.1 at bs 16, ~4.3-5.3 at bs 32. On the AMD EPYC in
fp32 with packed oneDNN linears (which made plain steps 1.4-1.5x cheaper): L = 2 ~1.6-2.6
steps; L = 16 ~2.0 at bs 1, ~4.6 at bs 4, ~8.7 at bs 16, ~9.5 at bs 32. The linear model
overestimates bs 1 (L = 16: 3.45 vs 2.04; the policy errs towards plain decoding there) and
underestimates bs 16 (6.75 vs 8.73), where only alpha >~ 0.8 makes it speculate at all.

Acceptance model: each draft is accepted with probability alpha given the ones before it were
(geometric), so a round verifying L tokens commits E(L) = 1 + alpha + ... + alpha^(L-1) =
(1 - alpha^L) / (1 - alpha) tokens. The policy picks L maximising E(L) / cost(bs, L), the
expected committed tokens per unit of decode-step time, and speculates only if that beats plain
decoding (ratio 1) by MARGIN. Since L = 1 is always a candidate, the model never predicts a loss
against plain decoding at any batch size, and the choice moves smoothly (no threshold cliff).

alpha is a running estimate (`AcceptanceStats`): the truncated-geometric MLE accepted / judged
over recent rounds, with exponential forgetting and a prior that is forgotten the same way. The
prior (alpha 0.7, worth 8 judged drafts) is optimistic on purpose: a new server speculates at
low load on every profile and learns the drafter's real alpha from real rounds within a few
rounds; a prior that started it plain (0.5 on the fp32 profile) would leave a good drafter to be
found only by the sparse probes below (one judged draft per request per probe). While the
policy decodes plainly it probes the drafter with the cheapest speculative round (L = 2, which
measures alpha directly), spaced so probes cost at most PROBE_BUDGET of the plain rounds' time,
and more often near the break-even alpha, where a probe costs nearly nothing beyond the 1 + alpha
tokens it commits: probe every
    ceil(min((cost(bs, 2) - 1) / PROBE_BUDGET, (cost(bs, 2) - E(2)) / NEAR_BUDGET)) plain rounds,
and never when even a perfect drafter (alpha = 1) could not beat plain decoding at this bs.
Why the second term: the estimate that switched speculation off moves only with probes, so a
few hard requests could leave it just under break-even for good. At c = 2 the shipped drafter
sped the first run of 8 requests up 1.13-1.36x and then, entering the next run with the last
(hard) requests' alpha, decoded the same 8 requests plainly (tau 1.19, 0.95-1.0x AR;
throughput_bucket_k_ab, 2026-11-28) with one probe per ~18 plain rounds of 2 judged drafts.
Near break-even a probe loses ~cost(bs, 2) - E(2) ~ 0 plain rounds, so probing often there is
free, and the estimate climbs back within a few dozen rounds when the drafter is good again
(expected probe loss still under NEAR_BUDGET of plain time if alpha is right).
Plain rounds age the estimate too (by PLAIN_DECAY per round; a judged round by `decay`), so
after a hard stretch the stale low estimate fades and each probe counts for more. Without it
the estimate moved only with probes of ~2 judged drafts each: at c = 2, T = 0.7 with the
pointer drafter (its own rows kept at position 1 ~0.43 of the time at a pinned L = 2, lookup
copies apart) a server entering plain decoding at a pooled alpha of ~0.2 needed ~25 probes
(~400 plain rounds, two whole runs of 8 requests) to climb back over break-even (~0.32-0.37),
and decoded those runs plainly at ~1.0x AR while a pinned L = 4 ran 1.14-1.30x (debug round
logs and `benchmarks/throughput.py --methods domino-l2 domino-l3 domino-l4`, 2026-12-02).
Simulated (benchmarks/policy_sim.py, tests/test_policy.py): hard and easy stretches of 200
rounds at bs 2 give 1.10-1.13 plain steps' worth of tokens per step with the aging, 1.04-1.08
without; a drafter that never pays loses ~0.3 % more to probes (0.988 vs 0.991 of plain). 0.98
rather than `decay`: forgetting as fast as judged rounds gains a little more after hard
stretches (1.13 vs 1.11) but loses more where the drafter never pays (0.985).

Costs on any device (costs.py, `OnlineCosts`): the profiles above are recorded measurements
of one machine each (kept for benchmarks/policy_sim.py, fit_cost.py and
--speculative-domino-debug-cost), not the server's prices. The server learns its own: per
batch-size bucket, the draft and per-token
overhead of a speculative round in units of its own plain round, from its round times,
starting from a device-neutral prior (costs.NEUTRAL; `cost_model` returns it on every device).
--speculative-domino-debug-calibrate off keeps the prior (or the debug cost) as it is.

The floor (`SpeculationPolicy.draft_len`): a round speculates only where it beats plain decoding by
MARGIN with the estimates' doubt priced in: alpha's lower bound (Wilson interval, Z_ALPHA sd over
the forgotten judged count) and the costs' upper bound (costs.Z sd of the fit). L is the best rate
at the estimates' means if that L holds the floor, else the best rate at the bounds, else plain
decoding (L = 1, what plain decoding costs). A batch-size bucket that has timed no speculative
round of its own verifies at most PROBE_LEN tokens (`longest_len`: its costs are still a prior, and
a prior's per-token price can be 10x off, 0.04 vs 0.37 plain rounds at bs 32 on the AMD EPYC), and
its probes wait for its plain times (PLAIN_SPACING). Plain rounds probe (L = 2) every
probe_interval rounds (above), stretched by BACKOFF ** losses (at most MAX_LOSSES): a probe after
which the policy still decodes plainly, and even alpha's Z_PROBE upper bound could not pay, is a
loss; speculating resets the count, and while that upper bound could pay the probes keep their base
spacing (a drafter just under break-even is not given up on). Plain rounds age the estimate only
down to AGE_FLOOR judged drafts, so its bounds stay finite and a drafter that never pays is probed
at most PROBE_BUDGET / BACKOFF ** MAX_LOSSES of the plain time; where even alpha = 1 could not pay
(at the costs' means), never. Simulated on the recorded CPU round costs (benchmarks/policy_sim.py
--recorded; docs/benchmark-history.md, issue 69) and tested under GPU-like and CPU-like cost shapes
(tests/test_policy_costs.py).

Prompt lookup (lookup.py): a round in which every request has a copied draft runs no draft
pass, so its cost is cost(bs, L) - DRAFT, and its acceptance is the copies', not the drafter's:
a second estimate `lookup_stats` (same MLE, learned from copied rows only) and
`lookup_len(bs, longest)` = the longest L in 2..1 + longest whose E(L) / (cost(bs, L) - DRAFT)
beats plain decoding by MARGIN (1 if none: decode plainly instead). The longest, not the best
rate: copies are right in runs (a copied line of code is kept whole or lost at its first token;
on the evaluation answers 16 of 256 copied HumanEval rounds kept all 15 tokens), so their
acceptance is not geometric, and the geometric E(L) undervalues long chains. It is asked
whether the drafter's policy chose L > 1 or plain decoding (a copy can pay where the drafter
does not), but not on a calibration round.

Switches (options.py): --speculative-domino-adaptive off verifies the full block every round
(fixed block); --speculative-domino-debug-draft-len L pins L (measurement); L0,L1,.. cycles a
pattern by the committed length n of the batch's first request (L = pattern[n mod len]): a
deterministic mix of plain and speculative rounds that a one-request-at-a-time test can replay.
Depends on nothing but the standard library.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from domino_sglang.costs import (  # noqa: F401  (re-exported: the policy's price list)
    CAL_MIN_GAP,
    CAL_REFRESH,
    NEUTRAL,
    PLAIN_MIN,
    PLAIN_SPACING,
    CostModel,
    OnlineCosts,
    bs_bucket,
)
from domino_sglang.costs import Z as Z_COST

MARGIN = 0.02
PROBE_BUDGET = 0.02  # a probe's gross overhead per plain round's time
NEAR_BUDGET = 0.005  # its expected loss (beyond the tokens it commits) per plain round's time
PROBE_LEN = 2
PLAIN_DECAY = 0.98  # how a plain round ages the acceptance estimate (a judged round: 0.95)
AGE_FLOOR = 4.0  # judged drafts plain rounds age the estimate down to (its bounds stay finite)
Z_PROBE = 1.0  # ... and the upper bound that keeps probes at their base rate
Z_ALPHA = 0.25  # alpha's lower bound: this many binomial sd under the estimate
BACKOFF, MAX_LOSSES = 2, 3  # probe spacing x BACKOFF per losing probe, at most MAX_LOSSES times


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


def round_cost(bs: int, draft_len: int, cost: CostModel = DEFAULT_COST) -> float:
    """Cost of a round verifying `draft_len` tokens per request, in plain decode steps."""
    return cost(bs, draft_len)


def expected_tokens(alpha: float, draft_len: int) -> float:
    """E[committed tokens] of a round verifying draft_len tokens (bonus included)."""
    return float(sum(alpha**k for k in range(draft_len)))


def choose_draft_len(bs: int, alpha: float, block: int, margin: float = MARGIN,
                     cost: CostModel = DEFAULT_COST) -> int:
    """The L in 1..block maximising expected_tokens / round_cost; 1 unless it beats plain
    decoding by `margin` (relative)."""
    best, best_rate = 1, 1.0 + margin
    for draft_len in range(2, block + 1):
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
    5 %): a prior added afresh at every read kept a weak drafter's alpha at 0.36 instead of 0.25
    at bs 1 (where a round judges ~1 draft), enough to make it speculate at a loss."""

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
        self.lookup_stats = AcceptanceStats()  # the copied drafts' alpha (lookup.py)
        self.calibrating = False  # the last draft_len was a calibration round (must stay plain)
        self.losses = 0  # probes in a row after which the policy still decoded plainly
        self._probed = False  # the last draft_len was a probe

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
        best = choose_draft_len(bs, alpha, longest, cost=mean)
        if best > 1 and expected_tokens(low, best) / high(bs, best) > 1.0 + MARGIN:
            return best
        return choose_draft_len(bs, low, longest, cost=high)

    def longest_len(self, bs: int) -> int:
        """The longest L the policy may verify at bs: the block once bs's bucket has timed
        speculative rounds of its own (or with fixed costs), PROBE_LEN before. A bucket's first
        costs are a prior (neutral, or a neighbour's), and one more verified token costs 0.04
        plain rounds there but ~0.37 on the AMD EPYC at bs 32 (2026-12-04, bf16, debug round
        log: L = 2 / 5 took 2.0 / 3.1 plain rounds): a jump from bs 1 to 32 verified L = 5 at
        3.1x a plain round for the bucket's first ~25 rounds (its plain times come first),
        a run of 64 requests at 0.81x plain decoding. The cheapest round times the bucket as
        well and loses the least while it is wrong."""
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

    def may_copy_instead(self) -> bool:
        """Whether a round the policy made plain may still verify copied drafts: it chose plain
        decoding for the drafter's sake (not a calibration round, not a pinned L)."""
        return self.enabled and self.pinned is None and not self.calibrating

    def lookup_len(self, bs: int, longest: int) -> int:
        """L for a round whose every request verifies a copied draft (at most `longest` copied
        tokens): no draft pass, the copies' alpha (module docstring, "Prompt lookup"); the
        whole copy with the policy off."""
        if not self.enabled:
            return 1 + longest
        _, per_token = self.learned(bs)
        alpha = self.lookup_stats.alpha
        for draft_len in range(1 + longest, 1, -1):  # the longest chain that still pays
            if expected_tokens(alpha, draft_len) / (1.0 + per_token * (draft_len - 1)) > (
                    1.0 + MARGIN):
                return draft_len
        return 1

    def learned(self, bs: int) -> tuple[float, float]:
        """(draft, per_token) overhead of a speculative round at bs, in plain rounds: learned
        (calibration on) or the fixed costs'."""
        if self.calibration is None:
            return self.cost.draft, self.cost.slope_0 + self.cost.slope_per_req * bs
        draft, per_token, _ = self.calibration.learned(bs)
        return draft, per_token

    def observe_lookup(self, accept_lens: list[int], draft_len: int) -> None:
        """accept_lens: a + 1 per copied request of a round that verified draft_len tokens."""
        if draft_len > 1 and self.enabled and accept_lens:
            self.lookup_stats.update(sum(a1 - 1 for a1 in accept_lens),
                                     sum(min(a1, draft_len - 1) for a1 in accept_lens))

    def effective_cost(self, bs: int) -> CostModel:
        """The costs in use at bs as a CostModel (learned means; the fixed ones, calibration
        off)."""
        if self.calibration is None:
            return self.cost
        draft, per_token = self.learned(bs)
        return CostModel(draft, per_token, 0.0)

    def observe_time(self, bs: int, draft_len: int, seconds: float) -> None:
        """A round of bs requests verifying draft_len tokens took `seconds`, from its start to
        the next round's start (the worker drops a round followed by a prefill)."""
        if self.calibration is not None and self.enabled and self.pinned is None:
            self.calibration.observe(bs, draft_len, seconds)

    def observe(self, accept_lens: list[int], draft_len: int) -> None:
        """accept_lens: a + 1 per request of a round that verified draft_len tokens."""
        if draft_len <= 1 or not self.enabled:
            return
        accepted = sum(a1 - 1 for a1 in accept_lens)
        judged = sum(min(a1, draft_len - 1) for a1 in accept_lens)
        self.stats.update(accepted, judged)
