"""The adaptive speculation policy: its decisions at chosen batch sizes and acceptance rates."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from domino_sglang.options import resolve
from domino_sglang.policy import (
    CAL_MIN_GAP,
    CAL_REFRESH,
    COSTS,
    K_MAX,
    PLAIN_DECAY,
    PLAIN_MIN,
    PLAIN_SPACING,
    PROBE_LEN,
    AcceptanceStats,
    CostCalibration,
    CostModel,
    SpeculationPolicy,
    bs_bucket,
    choose_draft_len,
    cost_model,
    expected_tokens,
    probe_interval,
    round_cost,
)

B = 16
DRAFTER = SimpleNamespace(candidate_pool=0, short_draft=False, draft_temperature_scale=1.0)
ROOT = Path(__file__).resolve().parents[1]


def test_cost_model_matches_the_measurements():
    # benchmarks/results/round_cost.md: L = 2 ~1.4 steps at any bs; L = 16 ~2.2 / 4.1 / 5.2
    # steps at bs 1 / 16 / 32 (the sweep's fixed-block rounds)
    assert round_cost(1, 2) == pytest.approx(1.4, abs=0.05)
    assert round_cost(32, 2) == pytest.approx(1.6, abs=0.05)
    assert round_cost(1, 16) == pytest.approx(2.2, abs=0.05)
    assert round_cost(16, 16) == pytest.approx(3.7, abs=0.1)
    assert round_cost(32, 16) == pytest.approx(5.2, abs=0.1)
    assert round_cost(32, 1) == 1.0


@pytest.mark.parametrize("profile, tables, short_draft, n_points", [
    ("cpu-fp32", ["round_cost_fp32.json"], False, 16),  # AMD EPYC, fp32, bs 1..32
    ("cpu-bf16-short", ["round_cost_short_bf16_v2.json", "round_cost_short_bf16_v2_c16.json"],
     True, 12),  # AMD EPYC, bf16, bs 1, 4 and 16
])
def test_profile_is_the_fit_of_its_recorded_table(profile, tables, short_draft, n_points):
    # the constants are benchmarks/fit_cost.py's least squares over the recorded
    # benchmarks/results/<tables> (`--short-draft`: the rounds drafting only their L tokens)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fit_cost

    paths = [ROOT / "benchmarks/results" / table for table in tables]
    points = fit_cost.measured_points(paths, short_draft=short_draft)
    assert len(points) == n_points
    draft, slope_0, slope_per_req = fit_cost.fit(points)
    cost = COSTS[profile]
    assert cost.draft == pytest.approx(draft, abs=0.005)
    assert cost.slope_0 == pytest.approx(slope_0, abs=0.0005)
    assert cost.slope_per_req == pytest.approx(slope_per_req, abs=0.00005)
    assert cost(8, 1) == 1.0


def test_short_draft_rounds_are_cheaper_and_kept_apart():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fit_cost

    table = ROOT / "benchmarks/results/round_cost_short_bf16.json"
    whole = fit_cost.measured_points([table])  # the same table's whole-block rounds
    short = fit_cost.measured_points([table], short_draft=True)
    assert len(whole) == len(short) == 8 and set(whole).isdisjoint(short)
    assert COSTS["cpu-bf16-short"](1, 2) < COSTS["cpu-bf16"](1, 2)


def test_cost_profile_by_device_and_dtype():
    assert cost_model("cpu", "torch.float32") == ("cpu-fp32", COSTS["cpu-fp32"])
    assert cost_model("cpu", "torch.bfloat16") == ("cpu-bf16", COSTS["cpu-bf16"])
    assert cost_model("cuda", "torch.float32")[0] == "cpu-bf16"  # GPU: unmeasured, see policy.py
    assert cost_model("cpu", "torch.bfloat16", short_draft=True) == (
        "cpu-bf16-short", COSTS["cpu-bf16-short"])
    assert cost_model("cpu", "torch.float32", short_draft=True)[0] == "cpu-fp32"  # unmeasured
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
    # the policy object uses its own profile (prior alpha, no rounds seen, no probe due yet)
    policy = SpeculationPolicy(B, stats=AcceptanceStats(prior_alpha=alpha),
                               cost=COSTS["cpu-fp32"])
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
    return expected_tokens(alpha, draft_len) / round_cost(bs, draft_len, cost)


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
        assert (round_cost(bs, PROBE_LEN) - 1) / interval <= 0.02
    assert probe_interval(1, B) == 21
    assert probe_interval(10_000, B) is None  # not even a perfect drafter would pay
    for bs in (1, 4, 16, 32):
        for alpha in (0.0, 0.2, 0.3, 0.4, 0.5):
            interval = probe_interval(bs, B, alpha=alpha)
            assert interval <= probe_interval(bs, B)  # never rarer than by the overhead alone
            # what a probe loses beyond the tokens it commits: at most 2% of plain time
            loss = round_cost(bs, PROBE_LEN) - expected_tokens(alpha, PROBE_LEN)
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
    # 1.099-1.125 over these seeds, 1.039-1.083 without the aging
    import random

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from policy_sim import serve  # the simulated drafter of benchmarks/policy_sim.py

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
        assert tokens / seconds > 1.09, (seed, tokens / seconds)
    stats = AcceptanceStats(prior_weight=0.0)
    stats.update(3, 4)
    stats.forget()
    assert (stats.accepted, stats.judged) == (pytest.approx(3 * PLAIN_DECAY),
                                              pytest.approx(4 * PLAIN_DECAY))
    assert stats.alpha == pytest.approx(0.75)  # aging alone does not move alpha


def test_running_stats_switch_off_then_probe():
    policy = SpeculationPolicy(B)  # prior alpha 0.7: tries the drafter first, on every profile
    assert policy.draft_len(1) > 1
    for cost in COSTS.values():
        assert SpeculationPolicy(B, cost=cost).draft_len(1) > 1
    for _ in range(100):  # the drafter is never right
        policy.observe([1] * 4, B)
    assert policy.stats.alpha < 0.07  # the floor left by the prior: 0.7 * 8 / (8 + 4 / 0.05)
    interval = probe_interval(4, B)
    chosen = [policy.draft_len(4) for _ in range(2 * interval)]
    probes = [i for i, n in enumerate(chosen) if n > 1]
    assert probes == [interval - 1, 2 * interval - 1]  # periodic, short probes
    assert {chosen[i] for i in probes} == {PROBE_LEN}
    for _ in range(40):  # ... until it is right again: probes see every draft accepted
        policy.observe([PROBE_LEN] * 4, PROBE_LEN)
    assert policy.draft_len(4) == choose_draft_len(4, policy.stats.alpha, B) > 8


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


# ---- calibration of the cost profile from round times ----
FP32 = COSTS["cpu-fp32"]
STEP = 0.08  # seconds of a plain round at every bs, in the simulated machines below


def fixed_alpha(alpha: float) -> AcceptanceStats:
    return AcceptanceStats(prior_alpha=alpha, prior_weight=1e12)  # rounds do not move it


def run(policy: SpeculationPolicy, true_cost: CostModel, bs: int, rounds: int,
        jitter: float = 0.0) -> list[int]:
    """Serve `rounds` rounds on a machine whose rounds take STEP * true_cost(bs, L) seconds
    (times alternately jitter % slow and fast); the draft lengths chosen."""
    chosen = []
    for i in range(rounds):
        draft_len = policy.draft_len(bs)
        seconds = STEP * true_cost(bs, draft_len) * (1 + jitter * (-1) ** i)
        policy.observe_time(bs, draft_len, seconds)
        chosen.append(draft_len)
    return chosen


def test_scaled_cost_scales_the_speculative_overhead():
    for k in (0.5, 1.0, 2.5):
        for bs, draft_len in ((1, 2), (4, 16), (32, 7)):
            assert FP32.scaled(k)(bs, draft_len) - 1 == pytest.approx(k * (FP32(bs, draft_len) - 1))
        assert FP32.scaled(k)(8, 1) == 1.0


def test_bs_buckets():
    assert [bs_bucket(b) for b in (1, 2, 7, 8, 9, 10, 15, 16, 19, 20, 31, 33, 48)] == [
        1, 2, 7, 8, 8, 10, 14, 16, 16, 20, 28, 32, 48]


def test_calibration_learns_the_machines_overhead():
    cal = CostCalibration()
    assert cal.scale(4) == 1.0 and not cal.needs_plain(4)  # nothing timed: the profile as is
    cal.observe(4, 8, STEP * 3, FP32)  # no plain time at bs 4 yet: no sample of k
    assert cal.scale(4) == 1.0 and cal.needs_plain(4)
    # the first plain rounds: one of them pays a one-off set-up (20x); not trusted before 3
    for seconds in (20 * STEP, STEP, STEP):
        assert cal.needs_plain(4)
        for _ in range(PLAIN_SPACING - 1):
            cal.observe(4, 8, STEP * 3, FP32)
        assert cal.scale(4) == 1.0
        cal.observe(4, 1, seconds, FP32)
        cal.observe(4, 1, 30 * STEP, FP32)  # the next plain round of a spell: not kept
    assert cal.plain_time(4) == STEP and not cal.needs_plain(4) and cal.needs_plain(16)
    assert len(cal.plain[4]) == PLAIN_MIN
    truth = FP32.scaled(2.0)  # this machine pays twice the profiled overhead
    for i in range(60):
        draft_len = 2 + i % 15
        cal.observe(4, draft_len, STEP * truth(4, draft_len), FP32)
    assert cal.scale(4) == pytest.approx(2.0)
    # bs 5 has no plain time of its own (exact buckets up to 8): its rounds teach nothing; it
    # has no k of its own either, and is priced at max(1, the recent k of any bs) = 2
    cal.observe(5, 8, STEP * 100, FP32)
    assert cal.scale(4) == pytest.approx(2.0) and cal.scale(5) == pytest.approx(2.0)
    # absurd rounds (a GC pause: 1000x; a round timed faster than plain) do not move a median
    cal.observe(4, 2, STEP * 1000, FP32)
    cal.observe(4, 2, STEP * 0.5, FP32)
    assert cal.scale(4) == pytest.approx(2.0)
    cal.observe(4, 1, STEP * 50, FP32)  # nor a plain one
    assert cal.plain_time(4) == STEP


def test_noisy_rounds_near_plain_cost_do_not_drag_k_to_zero():
    # a cheap profile (L = 2 overhead 0.055) where L = 2 really costs 1.5 plain rounds (k ~9):
    # with +-30 % round-time noise, t / t_plain - 1 is often <= 0, which a mean of logs turned
    # into k ~0.4 on a real server; the median keeps k near the truth
    import random

    cheap = CostModel(0.05, 0.005, 0.0)
    rng = random.Random(0)
    cal = CostCalibration()
    for _ in range(PLAIN_MIN):
        cal.observe(1, 1, STEP, cheap)
    k = []
    for i in range(400):
        noise = rng.uniform(0.7, 1.3)
        if i % 4 == 0:
            cal.observe(1, 1, STEP * noise, cheap)
        else:
            cal.observe(1, 2, STEP * 1.5 * noise, cheap)
        k.append(cal.scale(1))
    truth = 0.5 / (cheap(1, 2) - 1)
    assert all(0.5 * truth < x < 1.5 * truth for x in k[-200:])


def test_a_slow_spell_of_plain_rounds_does_not_bias_k_for_long():
    # c = 1 on the shipped profile where the machine pays 0.75x its overhead: the server decodes
    # plainly for a spell of rounds on a moment the machine runs 20 % slow (the drafter out of
    # its depth on one request), then speculates at L = 4. With a short plain window that the
    # spell fills and rare refreshes, t_plain stayed 20 % high and k came out ~0.25 for
    # hundreds of rounds (the server drafted more than pays); the refreshed window outvotes
    # the spell within a few hundred rounds.
    profile = COSTS["cpu-bf16-short"]
    truth = profile.scaled(0.75)
    cal = CostCalibration()
    rounds = 0
    for _ in range(12):  # the slow spell
        cal.observe(1, 1, STEP * 1.2, profile)
    scales = []
    for i in range(1500):  # speculating, with the calibration rounds a policy would ask for
        if cal.needs_plain(1) and i - rounds >= CAL_MIN_GAP:
            rounds = i
            cal.observe(1, 1, STEP, profile)
        else:
            cal.observe(1, 4, STEP * truth(1, 4), profile)
        scales.append(cal.scale(1))
    assert scales[100] < 0.5  # the spell's t_plain: k too low at first
    assert all(0.75 * 0.9 < k < 0.75 * 1.1 for k in scales[400:])


def test_a_load_jump_does_not_inherit_a_low_k():
    # The short-draft profile on the AMD EPYC (policy docstring, "Calibration"): this machine
    # pays ~0.6x its speculative overhead at bs 1 but ~1.1x at bs 8. A server speculating at
    # bs 1 that then meets 8 requests at once must not price bs 8 with bs 1's k: at alpha 0.45
    # that k says L = 2-3 pays at bs 8, where it loses ~5 % (one k for every bs did, for the
    # ~100 rounds bs 8 needs to learn its own: throughput_stage22_c148_r5, c = 8 at 0.87x AR).
    profile = COSTS["cpu-bf16-short"]
    low, high = profile.scaled(0.6), profile.scaled(1.1)
    alpha = 0.45
    assert choose_draft_len(8, alpha, B, cost=low) > 1  # bs 1's k would speculate at bs 8
    assert choose_draft_len(8, alpha, B, cost=high) == 1  # where it does not pay
    policy = SpeculationPolicy(B, stats=fixed_alpha(alpha), cost=profile)
    run(policy, low, 1, 600)
    assert policy.calibration.scale(1) == pytest.approx(0.6, rel=0.05)
    assert policy.calibration.scale(8) == 1.0  # no k of its own yet: the profile, not bs 1's
    chosen = run(policy, high, 8, 150)
    # committed tokens per unit of plain-round time, against plain decoding's 1
    rate = sum(expected_tokens(alpha, n) for n in chosen) / sum(high(8, n) for n in chosen)
    assert rate >= 0.99, (rate, chosen)
    assert policy.calibration.scale(1) == pytest.approx(0.6, rel=0.05)  # bs 1 keeps its own
    # back to one request: bs 1's k is still there, speculation resumes at once (after one
    # calibration round: bs 1's plain time is CAL_REFRESH rounds old)
    assert run(policy, low, 1, 10).count(1) <= 1
    # and where this machine pays more everywhere, a new batch size starts from that, not 1
    expensive = SpeculationPolicy(B, stats=fixed_alpha(alpha), cost=profile)
    run(expensive, profile.scaled(3.0), 1, 600)
    assert expensive.calibration.scale(16) == pytest.approx(3.0, rel=0.05)


def test_wrong_profile_is_corrected_by_round_times():
    # a profile that calls speculation nearly free, on a machine where it costs what the fp32
    # profile says: uncalibrated, a weak drafter (alpha 0.3) speculates every round and loses
    cheap = CostModel(0.05, 0.005, 0.0)
    assert choose_draft_len(1, 0.3, B, cost=cheap) > 1
    assert choose_draft_len(1, 0.3, B, cost=FP32) == 1
    fixed = SpeculationPolicy(B, stats=fixed_alpha(0.3), cost=cheap, calibrate=False)
    assert set(run(fixed, FP32, 1, 200)) == {choose_draft_len(1, 0.3, B, cost=cheap)}
    policy = SpeculationPolicy(B, stats=fixed_alpha(0.3), cost=cheap)
    chosen = run(policy, FP32, 1, 400, jitter=0.1)
    # the first timed speculative round asks for a plain one; k then grows to FP32's overhead
    assert chosen[1] == 1
    # what the probes (L = 2) measure: (FP32(1, 2) - 1) / (cheap(1, 2) - 1) = 13.1, noisy here
    # (+-10 % round times: samples 7..22)
    k = (FP32(1, PROBE_LEN) - 1) / (cheap(1, PROBE_LEN) - 1)
    assert 0.6 * k < policy.calibration.scale(1) <= K_MAX
    tail = chosen[-100:]
    assert tail.count(1) >= 95  # plain decoding, probes aside
    assert set(tail) <= {1, PROBE_LEN}


def test_calibration_lets_an_overcautious_profile_speculate():
    # the fp32 profile on a machine whose speculation costs half of it (the AVX2 EPYC's L = 2 is
    # 1.53 steps vs the profile's 1.72): alpha 0.5 at bs 1 pays there, and is found by probes
    truth = FP32.scaled(0.5)
    assert choose_draft_len(1, 0.5, B, cost=FP32) == 1
    assert choose_draft_len(1, 0.5, B, cost=truth) > 1
    policy = SpeculationPolicy(B, stats=fixed_alpha(0.5), cost=FP32)
    chosen = run(policy, truth, 1, 2000)
    assert policy.calibration.scale(1) == pytest.approx(0.5, rel=0.05)
    tail = chosen[-200:]
    usual = max(set(tail), key=tail.count)
    best = choose_draft_len(1, 0.5, B, cost=truth)
    assert expected_tokens(0.5, usual) / truth(1, usual) >= 0.99 * (
        expected_tokens(0.5, best) / truth(1, best))
    assert tail.count(1) <= 200 // CAL_REFRESH + 1  # calibration rounds: one per CAL_REFRESH


def test_calibration_rounds_are_rare_and_switchable():
    policy = SpeculationPolicy(B, stats=fixed_alpha(0.9), cost=FP32)  # a good drafter
    chosen = run(policy, FP32, 8, 10 * CAL_MIN_GAP)
    assert chosen[0] > 1 and chosen[1] == 1  # bs 8 has no plain time: measure one
    # PLAIN_MIN of them, CAL_MIN_GAP apart; then one each time the last is CAL_REFRESH old
    first = [1 + i * CAL_MIN_GAP for i in range(PLAIN_MIN)]
    plain = [i for i, n in enumerate(chosen) if n == 1]
    assert plain[:PLAIN_MIN] == first
    # (the first round at which the last one is CAL_REFRESH rounds old when it is timed)
    assert [b - a for a, b in zip(plain[PLAIN_MIN - 1:], plain[PLAIN_MIN:])] == [
        CAL_REFRESH + 1] * (len(plain) - PLAIN_MIN)
    assert len(plain) == PLAIN_MIN + (10 * CAL_MIN_GAP - 1 - first[-1]) // (CAL_REFRESH + 1)
    chosen = []
    for bs in range(9, 30):  # each round a new batch size: calibration rounds stay spaced
        chosen += run(policy, FP32, bs, 4)
    plain = [i for i, n in enumerate(chosen) if n == 1]
    assert all(b - a >= CAL_MIN_GAP for a, b in zip(plain, plain[1:]))
    assert policy.calibration.scale(8) == pytest.approx(1.0, rel=0.02)  # the profile is right
    off = SpeculationPolicy.from_config(resolve(DRAFTER, B, {"calibrate": "off"}), cost=FP32)
    assert off.calibration is None
    off.observe_time(1, 1, STEP)
    off.observe_time(1, 2, 100 * STEP)
    assert off.effective_cost(1) == FP32
    assert SpeculationPolicy.from_config(resolve(DRAFTER, B, {"calibrate": "on"}),
                                         cost=FP32).calibration is not None


def test_the_prior_is_forgotten_at_low_load():
    # bs 1, probes of L = 2: one judged draft per round, a drafter right 1 time in 4. A prior
    # re-added at every read (8 pseudo-drafts at 0.7 against ~20 forgotten-weighted real ones)
    # read 0.38 here; forgotten like any round, it leaves the drafter's own rate
    policy = SpeculationPolicy(B)
    assert policy.stats.alpha == 0.7
    for i in range(200):
        policy.observe([2 if i % 4 == 0 else 1], PROBE_LEN)
    assert policy.stats.alpha == pytest.approx(0.25, abs=0.05)


def test_copied_rounds_have_their_own_alpha_and_no_draft_cost():
    """Prompt lookup (policy.lookup_len): a copy-only round is priced without the draft pass
    and sized by the copies' own acceptance, learned apart from the drafter's."""
    policy = SpeculationPolicy(B, calibrate=False)
    for _ in range(60):  # the drafter is useless: plain decoding...
        policy.observe([1], 4)
    assert policy.draft_len(1) in (1, PROBE_LEN)
    assert policy.may_copy_instead()  # ... which copies may still beat
    assert policy.stats.alpha < 0.1 and policy.lookup_stats.alpha == pytest.approx(0.7)
    assert policy.lookup_len(1, 15) == B  # no draft pass: a long copy pays at bs 1
    assert policy.lookup_len(1, 3) == 4  # never longer than the copy
    # at bs 32 a verified token costs ~5x more: the same alpha pays for a shorter chain only
    assert 1 < policy.lookup_len(32, 15) < policy.lookup_len(1, 15)
    no_draft = CostModel(0.0, policy.cost.slope_0, policy.cost.slope_per_req)
    n = policy.lookup_len(32, 15)
    assert expected_tokens(0.7, n) / no_draft(32, n) > 1.02 >= (
        expected_tokens(0.7, n + 1) / no_draft(32, n + 1))
    # copies the target rejects switch copying off, the drafter's alpha untouched
    before = policy.stats.alpha
    for _ in range(60):
        policy.observe_lookup([1], B)
    assert policy.lookup_stats.alpha < 0.1 and policy.stats.alpha == before
    assert policy.lookup_len(1, 15) == 1
    # copies the target keeps: back to long chains
    for _ in range(60):
        policy.observe_lookup([B], B)
    assert policy.lookup_len(1, 15) == B
    # a fixed block verifies the whole copy; a pinned L or a calibration round is not replaced
    assert SpeculationPolicy(B, enabled=False).lookup_len(32, 5) == 6
    pinned = SpeculationPolicy(B)
    pinned.pinned = (1,)
    assert not pinned.may_copy_instead()
    calibrating = SpeculationPolicy(B)
    calibrating.calibrating = True
    assert not calibrating.may_copy_instead()
