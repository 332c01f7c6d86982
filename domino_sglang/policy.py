"""Adaptive speculation: how many chain tokens to verify this round (L = 1 .. B; L = 1 is plain
decoding: no draft, the target decodes one token per request).

Cost model, in units of one plain decode step of the AR server at the same batch size bs
(measured by benchmarks/round_cost.py, fitted by benchmarks/fit_cost.py):

    cost(bs, 1) = 1                                        plain round
    cost(bs, L) = 1 + DRAFT + slope(bs) * (L - 1)          L >= 2
    slope(bs)   = SLOPE_0 + SLOPE_PER_REQ * bs

The constants depend on the hardware and the model dtype, so there is one `CostModel` per
measured profile (`COSTS`), chosen by `cost_model(device, dtype)`:
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
    cpu-fp32 profile (an overestimate: the calibration below scales it down).
A GPU has not been measured (no GPU here): it gets the cpu-bf16 constants, which overestimate what
verifying more tokens costs on a GPU (the policy errs towards plain decoding there), scaled by the
calibration below from the GPU's own round times (unverified without a GPU).
--speculative-domino-debug-cost DRAFT,SLOPE_0,SLOPE_PER_REQ overrides the profile (what
fit_cost.py prints).

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

Calibration (`CostCalibration`): a profile measured on one CPU is off on another (an AVX2-only
EPYC ran L = 2 at 1.53 plain steps where the cpu-fp32 profile says 1.72), a linear fit is off at
some batch sizes even where it was fitted (above), and a GPU has no profile. So the server
scales the profile's speculative overhead by k, learned from its own round times:
    cost_k(bs, L) = 1 + k * (cost(bs, L) - 1)
    sample of k  = (t(bs, L) / t_plain(bs) - 1) / (cost(bs, L) - 1)     from a round of L > 1
where t is the wall time from one decode round's start to the next's (what a round really costs:
the scheduler's own work included; a prefill in between voids the sample) and t_plain(bs) the
low median of the last PLAIN_WINDOW plain rounds' times at that batch size (bucketed: exact to
8, then 4 per octave; used once it has PLAIN_MIN, so a first round's one-off set-up cost does
not count). Plain times are kept at most one per PLAIN_SPACING rounds, and a speculating
server times a plain round again every CAL_REFRESH rounds: a spell of consecutive plain rounds
(the policy decoding plainly through a hard passage) on a moment the machine runs slow once
filled the whole window and, refreshed every 512 rounds, held t_plain ~15 % high and k at 0.40
where the rounds said ~0.75 for hundreds of rounds; now it is a couple of the window's times,
outvoted within a few refreshes, at the price of one plain round in 96 (~0.3 % of the
throughput at c = 1). k is the median of the last K_WINDOW samples and the prior 1 (the profile as
measured), clamped to [K_MIN, K_MAX]. A median, not a mean: on a noisy machine t / t_plain - 1
of a cheap round can come out near 0 or negative, and a GC pause makes one huge; neither moves
a median much. k is kept per batch-size bucket (the buckets of the plain times), because the
profile's error depends on bs: the fp32 fit is over at bs 1 and under at bs 16, and the shipped
bf16 drafter on the AMD EPYC pays k ~0.7 at bs 1-2 and ~1.0-1.2 at bs 4-8 (debug round times,
2026-11-28: L = 3 is 1.33 plain rounds at bs 1 and 2, L = 2 is 1.5 at bs 4 and 8). One k for
every bs, learned at low load, was carried to a load jump: the first c = 8 run after c = 4
speculated at a loss (0.87x AR, benchmarks/results/throughput_stage22_c148_r5.md) until bs 8's
own samples outvoted it. A bucket with fewer than K_OWN_MIN samples of its own uses
max(1, k of the last K_WINDOW samples of any bucket): the profile as measured, or more where
the machine pays more elsewhere, never less (a new load is priced cautiously: plain decoding
until its probes say otherwise, not a speculation that may lose). A plainly
decoding server learns k from its probes; a speculating one runs a plain round (a calibration
round) when its batch size has too few or no fresh plain times, at most one every CAL_MIN_GAP
rounds. --speculative-domino-debug-calibrate off keeps k = 1 (the profile as measured).

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
import statistics
from collections import deque
from dataclasses import dataclass, field

MARGIN = 0.02
PROBE_BUDGET = 0.02  # a probe's gross overhead per plain round's time
NEAR_BUDGET = 0.005  # its expected loss (beyond the tokens it commits) per plain round's time
PROBE_LEN = 2
PLAIN_DECAY = 0.98  # how a plain round ages the acceptance estimate (a judged round: 0.95)
K_MIN, K_MAX = 1 / 16, 16.0  # the range of k
K_WINDOW = 31  # k samples kept per bucket: k is their median (and the prior 1's)
K_OWN_MIN = 5  # a bucket's own samples needed before its k is used (else the cautious fallback)
PLAIN_WINDOW, PLAIN_MIN = 9, 3  # plain-round times kept per bucket; needed before use
PLAIN_SPACING = 8  # rounds between two plain times kept (a spell of plain rounds gives a few)
CAL_MIN_GAP = 32  # rounds between two calibration rounds (plain rounds while speculating)
CAL_REFRESH = 96  # rounds after which a batch size's plain time is measured again


@dataclass(frozen=True)
class CostModel:
    """cost(bs, L) = 1 + draft + (slope_0 + slope_per_req * bs) * (L - 1) plain decode steps."""

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


COSTS = {
    "cpu-bf16": CostModel(draft=0.35, slope_0=0.05, slope_per_req=0.0065),
    "cpu-fp32": CostModel(draft=0.599, slope_0=0.1088, slope_per_req=0.01466),
    "cpu-bf16-short": CostModel(draft=0.293, slope_0=0.0698, slope_per_req=0.0148),
}
DEFAULT_COST = COSTS["cpu-bf16"]


def cost_model(device: str, dtype: str, override: tuple[float, float, float] | None = None,
               short_draft: bool = False) -> tuple[str, CostModel]:
    """(profile name, constants) for a target on `device` ("cpu" / "cuda") in `dtype`
    ("float32", "bfloat16", ...), drafting the whole block or (`short_draft`) only the L tokens
    verified; `override` = (DRAFT, SLOPE_0, SLOPE_PER_REQ) replaces the profile
    (--speculative-domino-debug-cost, parsed by options.py)."""
    if override is not None:
        return "debug-cost", CostModel(*override)
    if device == "cpu" and dtype.removeprefix("torch.") == "float32":
        return "cpu-fp32", COSTS["cpu-fp32"]  # short drafts unmeasured in fp32: see COSTS
    if short_draft:
        return "cpu-bf16-short", COSTS["cpu-bf16-short"]
    return "cpu-bf16", DEFAULT_COST


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

    def forget(self, decay: float = PLAIN_DECAY) -> None:
        """A round that judged no draft (plain decoding): the estimate ages, by `decay`."""
        self.accepted *= decay
        self.judged *= decay

    def update(self, accepted: int, judged: int) -> None:
        """One round: `accepted` drafts kept over `judged` drafts compared (a request with
        accept length a + 1 out of L judged min(a + 1, L - 1))."""
        self.accepted = self.decay * self.accepted + accepted
        self.judged = self.decay * self.judged + judged


def bs_bucket(bs: int) -> int:
    """The batch sizes sharing a plain-round time: exact up to 8, then 4 buckets per octave
    (8, 10, 12, 14, 16, 20, ...)."""
    if bs <= 8:
        return bs
    shift = bs.bit_length() - 3
    return (bs >> shift) << shift


@dataclass
class CostCalibration:
    """k, how many times the profile's speculative overhead this machine really pays, learned
    from round times (module docstring, "Calibration")."""

    samples: dict[int, deque] = field(default_factory=dict)  # bucket -> last k samples
    recent: deque = field(default_factory=lambda: deque(maxlen=K_WINDOW))  # any bucket's
    plain: dict[int, deque] = field(default_factory=dict)  # bucket -> last plain-round seconds
    plain_at: dict[int, int] = field(default_factory=dict)  # bucket -> round of its last kept
    rounds: int = 0  # timed rounds so far

    def scale(self, bs: int) -> float:
        """k at this batch size, within [K_MIN, K_MAX]: the median of its bucket's samples and
        the prior 1 once the bucket has K_OWN_MIN samples; before, max(1, the median of the
        recent samples of any bucket and the prior 1)."""
        own = self.samples.get(bs_bucket(bs), ())
        if len(own) >= K_OWN_MIN:
            k = statistics.median([1.0, *own])
        else:
            k = max(1.0, statistics.median([1.0, *self.recent]))
        return min(max(k, K_MIN), K_MAX)

    def plain_time(self, bs: int) -> float | None:
        """Seconds of a plain round at this batch size: the low median of the bucket's last
        PLAIN_WINDOW plain rounds, once it has PLAIN_MIN (None before)."""
        times = self.plain.get(bs_bucket(bs))
        if times is None or len(times) < PLAIN_MIN:
            return None
        return statistics.median_low(times)

    def observe(self, bs: int, draft_len: int, seconds: float, cost: CostModel) -> None:
        """A round of bs requests verifying draft_len tokens took `seconds` (start to start)."""
        self.rounds += 1
        bucket = bs_bucket(bs)
        if draft_len <= 1:
            if self.rounds - self.plain_at.get(bucket, -PLAIN_SPACING) >= PLAIN_SPACING:
                self.plain.setdefault(bucket, deque(maxlen=PLAIN_WINDOW)).append(seconds)
                self.plain_at[bucket] = self.rounds
            return
        plain, overhead = self.plain_time(bs), cost(bs, draft_len) - 1.0
        if plain is not None and overhead > 0.0:
            k = (seconds / plain - 1.0) / overhead
            self.samples.setdefault(bucket, deque(maxlen=K_WINDOW)).append(k)
            self.recent.append(k)

    def needs_plain(self, bs: int) -> bool:
        """Whether a speculating server should time a plain round at this batch size: rounds
        are being timed and the bucket has fewer than PLAIN_MIN plain times or its last is
        CAL_REFRESH rounds old."""
        at = self.plain_at.get(bs_bucket(bs))
        return self.rounds > 0 and (self.plain_time(bs) is None or at is None
                                    or self.rounds - at >= CAL_REFRESH)


class SpeculationPolicy:
    """Chooses each round's draft length; `enabled=False` always returns the full block."""

    def __init__(self, block: int, enabled: bool = True, stats: AcceptanceStats | None = None,
                 cost: CostModel = DEFAULT_COST, calibrate: bool = True):
        self.block = block
        self.enabled = enabled
        self.stats = stats or AcceptanceStats()
        self.cost = cost
        self.calibration = CostCalibration() if calibrate else None
        self._plain_rounds = 0
        self._rounds = 0
        self._calibrated_at = -CAL_MIN_GAP  # round of the last calibration round
        self.lookup_stats = AcceptanceStats()  # the copied drafts' alpha (lookup.py)
        self.calibrating = False  # the last draft_len was a calibration round (must stay plain)

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
        cost = self.effective_cost(bs)
        chosen = choose_draft_len(bs, self.stats.alpha, self.block, cost=cost)
        if chosen > 1:
            self._plain_rounds = 0
            if (self.calibration is not None and self.calibration.needs_plain(bs)
                    and self._rounds - self._calibrated_at >= CAL_MIN_GAP):
                self._calibrated_at = self._rounds
                self.calibrating = True
                return 1  # calibration round: time a plain round at this batch size
            return chosen
        self._plain_rounds += 1
        self.stats.forget()  # a plain round ages the estimate too (PLAIN_DECAY)
        interval = probe_interval(bs, self.block, cost, self.stats.alpha)
        if interval is not None and self._plain_rounds >= interval:
            self._plain_rounds = 0
            return min(PROBE_LEN, self.block)  # probe: measure the drafter again, cheaply
        return 1

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
        cost = self.effective_cost(bs)
        no_draft = CostModel(0.0, cost.slope_0, cost.slope_per_req)
        alpha = self.lookup_stats.alpha
        for draft_len in range(1 + longest, 1, -1):  # the longest chain that still pays
            if expected_tokens(alpha, draft_len) / no_draft(bs, draft_len) > 1.0 + MARGIN:
                return draft_len
        return 1

    def observe_lookup(self, accept_lens: list[int], draft_len: int) -> None:
        """accept_lens: a + 1 per copied request of a round that verified draft_len tokens."""
        if draft_len > 1 and self.enabled and accept_lens:
            self.lookup_stats.update(sum(a1 - 1 for a1 in accept_lens),
                                     sum(min(a1, draft_len - 1) for a1 in accept_lens))

    def effective_cost(self, bs: int) -> CostModel:
        """The profile with its speculative overhead scaled by the calibrated k at this bs."""
        if self.calibration is None:
            return self.cost
        return self.cost.scaled(self.calibration.scale(bs))

    def observe_time(self, bs: int, draft_len: int, seconds: float) -> None:
        """A round of bs requests verifying draft_len tokens took `seconds`, from its start to
        the next round's start (the worker drops a round followed by a prefill)."""
        if self.calibration is not None and self.enabled and self.pinned is None:
            self.calibration.observe(bs, draft_len, seconds, self.cost)

    def observe(self, accept_lens: list[int], draft_len: int) -> None:
        """accept_lens: a + 1 per request of a round that verified draft_len tokens."""
        if draft_len <= 1 or not self.enabled:
            return
        accepted = sum(a1 - 1 for a1 in accept_lens)
        judged = sum(min(a1, draft_len - 1) for a1 in accept_lens)
        self.stats.update(accepted, judged)
