"""The adaptive speculation policy: its decisions at chosen batch sizes and acceptance rates."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from domino_sglang.policy import (
    COSTS,
    PROBE_LEN,
    AcceptanceStats,
    CostModel,
    SpeculationPolicy,
    choose_draft_len,
    cost_model,
    expected_tokens,
    probe_interval,
    round_cost,
)

B = 16
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


def test_fp32_profile_is_the_fit_of_its_recorded_table():
    # the cpu-fp32 constants are benchmarks/fit_cost.py's least squares over the recorded
    # benchmarks/results/round_cost_fp32.json (AMD EPYC, fp32), rounded
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fit_cost

    points = fit_cost.measured_points([ROOT / "benchmarks/results/round_cost_fp32.json"])
    assert len(points) == 16
    draft, slope_0, slope_per_req = fit_cost.fit(points)
    fp32 = COSTS["cpu-fp32"]
    assert fp32.draft == pytest.approx(draft, abs=0.005)
    assert fp32.slope_0 == pytest.approx(slope_0, abs=0.0005)
    assert fp32.slope_per_req == pytest.approx(slope_per_req, abs=0.00005)
    assert fp32(8, 1) == 1.0


def test_cost_profile_by_device_and_dtype(monkeypatch):
    monkeypatch.delenv("DOMINO_COST", raising=False)
    assert cost_model("cpu", "torch.float32") == ("cpu-fp32", COSTS["cpu-fp32"])
    assert cost_model("cpu", "torch.bfloat16") == ("cpu-bf16", COSTS["cpu-bf16"])
    assert cost_model("cuda", "torch.float32")[0] == "cpu-bf16"  # GPU: unmeasured, see policy.py
    monkeypatch.setenv("DOMINO_COST", "0.5,0.1,0.01")
    assert cost_model("cpu", "torch.float32") == ("DOMINO_COST", CostModel(0.5, 0.1, 0.01))
    for bad in ("0.5,0.1", "a,b,c", "0.5,-0.1,0.01", "0.5,nan,0.1", ""):
        monkeypatch.setenv("DOMINO_COST", bad)
        with pytest.raises(ValueError, match="DOMINO_COST must be three non-negative numbers"):
            cost_model("cpu", "torch.float32")


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


def test_switched_off_is_fixed_block(monkeypatch):
    monkeypatch.setenv("DOMINO_ADAPTIVE", "0")
    policy = SpeculationPolicy.from_env(B)
    for _ in range(40):
        policy.observe([1] * 8, B)
    assert policy.draft_len(32) == B


def test_pinned_draft_len(monkeypatch):
    monkeypatch.setenv("DOMINO_DRAFT_LEN", "3")
    assert SpeculationPolicy.from_env(B).draft_len(32) == 3
    monkeypatch.setenv("DOMINO_DRAFT_LEN", "16,1")  # a pattern, by the committed length
    policy = SpeculationPolicy.from_env(B)
    assert policy.cycles
    assert [policy.draft_len(4, n) for n in (100, 101, 102, 7)] == [16, 1, 16, 1]
    for bad in ("0", "17", "x", "4,", "2,0"):
        monkeypatch.setenv("DOMINO_DRAFT_LEN", bad)
        with pytest.raises(ValueError, match="must be an integer in 1..16 .* list"):
            SpeculationPolicy.from_env(B)
