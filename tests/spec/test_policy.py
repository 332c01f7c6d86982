"""The adaptive speculation policy: its decisions at chosen batch sizes and acceptance rates."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from domino_sglang.spec.options import resolve
from domino_sglang.spec.policy import (
    AGE_FLOOR,
    BACKOFF,
    COSTS,
    DEFAULT_COST,
    MAX_LOSSES,
    NEUTRAL,
    PLAIN_DECAY,
    PROBE_LEN,
    AcceptanceStats,
    CostModel,
    SpeculationPolicy,
    bs_bucket,
    choose_draft_len,
    cost_model,
    expected_tokens,
    probe_interval,
)

B = 16
DRAFTER = SimpleNamespace(candidate_pool=0, short_draft=False, draft_temperature_scale=1.0)


def test_cost_model_matches_the_measurements():
    # benchmarks/results/round_cost.md: L = 2 ~1.4 steps at any bs; L = 16 ~2.2 / 4.1 / 5.2
    # steps at bs 1 / 16 / 32 (the sweep's fixed-block rounds)
    assert DEFAULT_COST(1, 2) == pytest.approx(1.4, abs=0.05)
    assert DEFAULT_COST(32, 2) == pytest.approx(1.6, abs=0.05)
    assert DEFAULT_COST(1, 16) == pytest.approx(2.2, abs=0.05)
    assert DEFAULT_COST(16, 16) == pytest.approx(3.7, abs=0.1)
    assert DEFAULT_COST(32, 16) == pytest.approx(5.2, abs=0.1)
    assert DEFAULT_COST(32, 1) == 1.0


def test_cost_prior_is_the_same_on_every_device():
    # no CPU constant in the decision path: every device starts from the neutral prior and
    # learns its own costs (costs.py; tests/spec/test_policy_costs.py)
    for device, dtype, short in (("cpu", "torch.float32", False), ("cpu", "torch.bfloat16", True),
                                 ("cuda", "torch.bfloat16", False), ("cuda", "float16", True)):
        assert cost_model(device, dtype, short_draft=short)[1] == NEUTRAL
    assert SpeculationPolicy(B).calibration.prior == NEUTRAL
    assert cost_model("cpu", "torch.float32", override=(0.5, 0.1, 0.01)) == (
        "debug-cost", CostModel(0.5, 0.1, 0.01))
    for bad in ("0.5,0.1", "a,b,c", "0.5,-0.1,0.01", "0.5,nan,0.1", ""):  # refused by options.py
        with pytest.raises(ValueError, match="--speculative-domino-debug-cost must be three "
                                             "non-negative numbers"):
            resolve(DRAFTER, B, {"cost": bad})


@pytest.mark.parametrize(("bs", "alpha", "expected_bf16", "expected_fp32"), [
    (1, 0.2, 1, 1),
    (1, 0.5, 4, 1),   # in fp32 on AVX2 the draft pass costs more: a better drafter must pay
    (4, 0.5, 4, 1),
    (1, 0.7, 7, 6),
    (1, 0.9, 15, 12),
    (16, 0.7, 5, 1),
    (16, 0.9, 10, 7),
    (32, 0.9, 8, 5),
])
def test_decisions_per_profile(bs, alpha, expected_bf16, expected_fp32):
    assert choose_draft_len(bs, alpha, B, cost=COSTS["cpu-bf16"]) == expected_bf16
    assert choose_draft_len(bs, alpha, B, cost=COSTS["cpu-fp32"]) == expected_fp32
    # the policy object decides with its fixed costs (calibration off) and a certain alpha
    policy = SpeculationPolicy(B, stats=AcceptanceStats(prior_alpha=alpha, prior_weight=1e9),
                               cost=COSTS["cpu-fp32"], calibrate=False)
    assert policy.draft_len(bs) == expected_fp32


@pytest.mark.parametrize(("bs", "alpha", "expected"), [
    (1, 0.0, 1),    # a drafter that is never right: plain decoding
    (1, 0.2, 1),    # the shipped drafter's level: the draft pass does not pay for itself
    (1, 0.9, 15),   # a good drafter alone: (nearly) the full block
    (8, 0.9, 12),   # a busier target: shorter chains
    (8, 0.5, 4),
    (32, 0.5, 1),   # heavy load, mediocre drafter: plain decoding
    (32, 0.7, 4),
    (48, 0.5, 1),
])
def test_decisions(bs, alpha, expected):
    assert choose_draft_len(bs, alpha, B) == expected


def rate(bs: int, alpha: float, cost: CostModel = COSTS["cpu-bf16"]) -> float:
    draft_len = choose_draft_len(bs, alpha, B, cost=cost)
    return expected_tokens(alpha, draft_len) / cost(bs, draft_len)


@pytest.mark.parametrize("profile", sorted(COSTS))
def test_never_predicted_slower_than_plain_and_no_cliff(profile):
    cost = COSTS[profile]
    for alpha in [i / 20 for i in range(21)]:
        previous = B
        for bs in range(1, 65):
            assert rate(bs, alpha, cost) >= 1.0
            draft_len = choose_draft_len(bs, alpha, B, cost=cost)
            assert draft_len <= previous  # shrinks as the batch grows
            previous = draft_len
            # the predicted throughput moves continuously with bs (max of continuous rates)
            assert abs(rate(bs + 1, alpha, cost) - rate(bs, alpha, cost)) <= 0.1 * rate(
                bs, alpha, cost)
    for bs in (1, 8, 32):  # grows with acceptance
        lens = [choose_draft_len(bs, a / 20, B, cost=cost) for a in range(21)]
        assert lens == sorted(lens)


def test_probes_are_cheap_and_only_where_they_can_pay():
    for bs in (1, 4, 16, 32):
        interval = probe_interval(bs, B)
        # one probe round per `interval` plain rounds costs at most 2% extra
        assert (DEFAULT_COST(bs, PROBE_LEN) - 1) / interval <= 0.02
    assert probe_interval(1, B) == 21
    assert probe_interval(10_000, B) is None  # not even a perfect drafter would pay
    for bs in (1, 4, 16, 32):
        for alpha in (0.0, 0.2, 0.3, 0.4, 0.5):
            interval = probe_interval(bs, B, alpha=alpha)
            assert interval <= probe_interval(bs, B)  # never rarer than by the overhead alone
            # what a probe loses beyond the tokens it commits: at most 2% of plain time
            loss = DEFAULT_COST(bs, PROBE_LEN) - expected_tokens(alpha, PROBE_LEN)
            assert loss / interval <= 0.02
    # near break-even (bs 4: alpha ~0.43 on the shipped profile) a probe is nearly free: often
    assert probe_interval(4, B, alpha=0.4) <= 6 < probe_interval(4, B) == 22


def test_probes_climb_out_of_a_pessimistic_estimate():
    # c = 2 on the short-draft profile at this machine's k (~0.65 at bs 2): a drafter right 42 %
    # of the time pays at L = 2-3, but the estimate entering the run is 0.25 (the previous
    # run's last requests were hard), worth 60 judged drafts: under break-even (~0.28). Probes
    # spaced by their gross overhead only (one per 13 plain rounds) left such a server plain
    # for hundreds of rounds (throughput_bucket_k_ab: c = 2 at 1.0x AR after a 1.13-1.36x run)
    import random

    cost = COSTS["cpu-bf16-short"].scaled(0.65)
    truth = 0.42
    assert choose_draft_len(2, truth, B, cost=cost) > 1
    assert choose_draft_len(2, 0.25, B, cost=cost) == 1
    best = max(expected_tokens(truth, n) / cost(2, n) for n in range(1, B + 1))
    for seed in range(3):
        rng = random.Random(seed)
        policy = SpeculationPolicy(B, stats=AcceptanceStats(prior_alpha=0.25, prior_weight=60),
                                   cost=cost, calibrate=False)
        tokens = seconds = 0.0
        for _ in range(200):
            draft_len = policy.draft_len(2)
            accept_lens = []
            for _ in range(2):  # geometric acceptance, truncated at L - 1 drafts
                a = 0
                while a < draft_len - 1 and rng.random() < truth:
                    a += 1
                accept_lens.append(a + 1)
            policy.observe(accept_lens, draft_len)
            tokens += sum(accept_lens) / 2
            seconds += cost(2, draft_len)
        # committed tokens per request per plain round's time (plain decoding: 1)
        assert tokens / seconds >= 0.9 * best, (seed, tokens / seconds, best)
        assert policy.stats.alpha > 0.3


def test_plain_rounds_age_the_estimate():
    # a stretch of hard requests (alpha 0.25) then easy ones (0.5), 200 rounds each, x 5, at
    # bs 2: the estimate that switched speculation off in a hard stretch moved only with the
    # sparse probes and stayed under break-even for much of the next easy stretch (the c = 2,
    # T = 0.7 runs that decoded plainly for whole runs, 2026-12-02). Plain rounds now age it too
    # (PLAIN_DECAY), so each probe counts for more: committed tokens per plain step's time
    # 1.099-1.125 over these seeds, 1.039-1.083 without the aging; 1.087-1.119 with the floor's
    # bounds (alpha's lower bound, the aging floor AGE_FLOOR: policy.py, "The floor")
    import random

    from benchmarks.simulated import serve  # the simulated drafter of benchmarks/policy_sim.py

    cost = COSTS["cpu-bf16"].scaled(0.85)
    assert choose_draft_len(2, 0.25, B, cost=cost) == 1 < choose_draft_len(2, 0.5, B, cost=cost)
    for seed in range(4):
        rng = random.Random(seed)
        policy = SpeculationPolicy(B, cost=cost, calibrate=False)
        tokens = seconds = 0.0
        for _ in range(5):
            for alpha in (0.25, 0.5):
                t, s = serve(policy, lambda i, a=alpha: a, 2, 200, cost, rng)
                tokens, seconds = tokens + t, seconds + s
        assert tokens / seconds > 1.08, (seed, tokens / seconds)
    stats = AcceptanceStats(prior_weight=0.0)
    stats.update(3, 4)
    stats.forget()
    assert (stats.accepted, stats.judged) == (pytest.approx(3 * PLAIN_DECAY),
                                              pytest.approx(4 * PLAIN_DECAY))
    assert stats.alpha == pytest.approx(0.75)  # aging alone does not move alpha
    for _ in range(500):  # ... and stops at the floor: alpha's bounds stay finite
        stats.forget(floor=AGE_FLOOR)
    assert stats.judged == pytest.approx(4 * PLAIN_DECAY)  # already under the floor: kept
    stats.update(30, 40)
    for _ in range(500):
        stats.forget(floor=AGE_FLOOR)
    assert stats.judged == pytest.approx(AGE_FLOOR) and stats.alpha == pytest.approx(33 / 44,
                                                                                    abs=0.01)


def test_running_stats_switch_off_then_probe_with_backoff():
    policy = SpeculationPolicy(B)  # prior alpha 0.7: tries the drafter first (the served prior)
    assert policy.draft_len(1) == PROBE_LEN  # ... at the shortest L: no round of bs 1 timed yet
    for cost in (*COSTS.values(), NEUTRAL):  # with fixed costs, at once, on every profile
        assert SpeculationPolicy(B, cost=cost, calibrate=False).draft_len(1) > PROBE_LEN
    fixed = SpeculationPolicy(B, cost=COSTS["cpu-bf16"], calibrate=False)
    for _ in range(100):  # the drafter is never right
        fixed.observe([1] * 4, B)
    assert fixed.stats.alpha < 0.07  # the floor left by the prior: 0.7 * 8 / (8 + 4 / 0.05)
    interval = probe_interval(4, B, COSTS["cpu-bf16"], fixed.stats.alpha)
    chosen = []
    for _ in range(40 * interval):
        chosen.append(fixed.draft_len(4))
        fixed.observe([1] * 4, chosen[-1])  # every probe loses
    probes = [i for i, n in enumerate(chosen) if n > 1]
    assert {chosen[i] for i in probes} == {PROBE_LEN}  # short probes
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    # the first at the base interval, then spaced BACKOFF times more per lost probe, up to
    # BACKOFF ** MAX_LOSSES: a drafter that never pays is probed ever more rarely
    assert probes[0] == interval - 1 and gaps[0] == BACKOFF * interval
    assert gaps == sorted(gaps) and gaps[-1] == BACKOFF ** MAX_LOSSES * interval
    assert fixed.losses == MAX_LOSSES
    for _ in range(40):  # ... until it is right again: probes see every draft accepted
        fixed.observe([PROBE_LEN] * 4, PROBE_LEN)
    assert fixed.draft_len(4) == choose_draft_len(4, fixed.stats.alpha, B,
                                                  cost=COSTS["cpu-bf16"]) > 8
    assert fixed.losses == 0  # speculating again: the backoff is reset


def test_truncated_geometric_estimate():
    stats = AcceptanceStats(prior_weight=0.0, decay=1.0)
    policy = SpeculationPolicy(4, stats=stats)
    policy.observe([1, 2, 4], 4)  # accepted 0+1+3 = 4 of judged 1+2+3 = 6
    assert stats.alpha == pytest.approx(4 / 6)


def test_switched_off_is_fixed_block():
    policy = SpeculationPolicy.from_config(resolve(DRAFTER, B, {"adaptive": "off"}))
    for _ in range(40):
        policy.observe([1] * 8, B)
    assert policy.draft_len(32) == B


def test_pinned_draft_len():
    def pinned(text: str) -> SpeculationPolicy:
        return SpeculationPolicy.from_config(resolve(DRAFTER, B, {"draft_len": text}))

    assert pinned("3").draft_len(32) == 3
    policy = pinned("16,1")  # a pattern, by the committed length
    assert policy.cycles
    assert [policy.draft_len(4, n) for n in (100, 101, 102, 7)] == [16, 1, 16, 1]
    for bad in ("0", "17", "x", "4,", "2,0"):
        with pytest.raises(ValueError, match="--speculative-domino-debug-draft-len must be"):
            pinned(bad)


FP32 = COSTS["cpu-fp32"]


def test_scaled_cost_scales_the_speculative_overhead():
    for k in (0.5, 1.0, 2.5):
        for bs, draft_len in ((1, 2), (4, 16), (32, 7)):
            assert FP32.scaled(k)(bs, draft_len) - 1 == pytest.approx(k * (FP32(bs, draft_len) - 1))
        assert FP32.scaled(k)(8, 1) == 1.0


def test_bs_buckets():
    assert [bs_bucket(b) for b in (1, 2, 7, 8, 9, 10, 15, 16, 19, 20, 31, 33, 48)] == [
        1, 2, 7, 8, 8, 10, 14, 16, 16, 20, 28, 32, 48]


def test_the_prior_is_forgotten_at_low_load():
    # bs 1, probes of L = 2: one judged draft per round, a drafter right 1 time in 4. A prior
    # re-added at every read (8 pseudo-drafts at 0.7 against ~20 forgotten-weighted real ones)
    # read 0.38 here; forgotten like any round, it leaves the drafter's own rate
    policy = SpeculationPolicy(B)
    assert policy.stats.alpha == 0.7
    for i in range(200):
        policy.observe([2 if i % 4 == 0 else 1], PROBE_LEN)
    assert policy.stats.alpha == pytest.approx(0.25, abs=0.05)


def test_offered_rounds_have_their_own_alpha_and_no_draft_cost():
    """Offered drafts (policy.offer_len): an offer-only round is priced without the draft pass
    and sized by the offering proposer's own acceptance, learned apart from the drafter's and
    from every other proposer's."""
    policy = SpeculationPolicy(B, cost=COSTS["cpu-bf16"], calibrate=False)
    for _ in range(60):  # the drafter is useless: plain decoding...
        policy.observe([1], 4)
    assert policy.draft_len(1) in (1, PROBE_LEN)
    assert policy.may_offer_instead()  # ... which copies may still beat
    assert policy.stats.alpha < 0.1 and policy.offer_stats("lookup").alpha == pytest.approx(0.7)
    assert policy.offer_len("lookup", 1, 15) == B  # no draft pass: a long copy pays at bs 1
    assert policy.offer_len("lookup", 1, 3) == 4  # never longer than the copy
    # at bs 32 a verified token costs ~5x more: the same alpha pays for a shorter chain only
    assert 1 < policy.offer_len("lookup", 32, 15) < policy.offer_len("lookup", 1, 15)
    no_draft = CostModel(0.0, policy.cost.slope_0, policy.cost.slope_per_req)
    n = policy.offer_len("lookup", 32, 15)
    assert expected_tokens(0.7, n) / no_draft(32, n) > 1.02 >= (
        expected_tokens(0.7, n + 1) / no_draft(32, n + 1))
    # copies the target rejects switch copying off, the drafter's alpha untouched
    before = policy.stats.alpha
    for _ in range(60):
        policy.observe_offer("lookup", [1], B)
    assert policy.offer_stats("lookup").alpha < 0.1 and policy.stats.alpha == before
    assert policy.offer_len("lookup", 1, 15) == 1
    assert policy.offer_len("other", 1, 15) == B  # another proposer keeps its own estimate
    # copies the target keeps: back to long chains
    for _ in range(60):
        policy.observe_offer("lookup", [B], B)
    assert policy.offer_len("lookup", 1, 15) == B
    # a fixed block verifies the whole copy; a pinned L or a calibration round is not replaced
    assert SpeculationPolicy(B, enabled=False).offer_len("lookup", 32, 5) == 6
    pinned = SpeculationPolicy(B)
    pinned.pinned = (1,)
    assert not pinned.may_offer_instead()
    calibrating = SpeculationPolicy(B)
    calibrating.calibrating = True
    assert not calibrating.may_offer_instead()


def test_tree_len_follows_the_pinned_length_and_never_replaces_a_probe():
    """policy.tree_len: pinned or off, the chain's own L as a tree where it is a tree size;
    adaptive, never a plain round, a probe or a calibration round; what a tree commits is
    learned per size apart from the chain's alpha (TreeTokens): a size whose trees commit much
    more is chosen, one whose trees commit one token a round is not."""
    sizes = range(6, B + 1)
    pinned = SpeculationPolicy(B)
    pinned.pinned = (8,)
    assert pinned.tree_len(1, 8, sizes) == 8 and pinned.tree_len(1, 4, sizes) == 0
    assert SpeculationPolicy(B, enabled=False).tree_len(1, B, sizes) == B
    policy = SpeculationPolicy(B, cost=COSTS["cpu-bf16"], calibrate=False)
    assert policy.tree_len(1, 1, sizes) == 0
    for _ in range(30):  # the chain commits about 2.4 tokens a round at L = 6
        policy.observe([2, 3], 6)
    for _ in range(30):  # trees of 8 commit 6
        policy.observe([6, 6], 8, tree=True)
    alpha = policy.stats.alpha
    length = policy.draft_len(1)
    assert length > 1 and policy.tree_len(1, length, sizes) == 8
    policy.calibrating = True
    assert policy.tree_len(1, length, sizes) == 0
    policy.calibrating = False
    for size in (6, 8, 12, 16):  # trees of every size that commit one token a round
        for _ in range(60):
            policy.observe([1], size, tree=True)
    assert policy.stats.alpha == alpha and policy.trees.mean(8, 0.0) < 1.3
    assert policy.tree_len(1, policy.draft_len(1), sizes) == 0
