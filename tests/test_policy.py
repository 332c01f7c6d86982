"""The adaptive speculation policy: its decisions at chosen batch sizes and acceptance rates."""

from __future__ import annotations

import pytest

from domino_sglang.policy import (
    PROBE_EVERY,
    AcceptanceStats,
    SpeculationPolicy,
    choose_draft_len,
    expected_tokens,
    round_cost,
)

B = 16


def test_cost_model_matches_the_measurements():
    assert round_cost(1, 16) == pytest.approx(1.5)
    assert round_cost(8, 16) == pytest.approx(2.4)
    assert round_cost(32, 1) == 1.0


@pytest.mark.parametrize(("bs", "alpha", "expected"), [
    (1, 0.0, 1),    # a drafter that is never right: plain decoding
    (1, 0.9, 16),   # a good drafter alone: the full block
    (8, 0.9, 11),   # a busier target: shorter chains
    (8, 0.5, 3),
    (32, 0.5, 2),
    (32, 0.3, 1),   # heavy load, mediocre drafter: plain decoding
    (1, 0.1, 2),
    (1, 0.02, 1),
])
def test_decisions(bs, alpha, expected):
    assert choose_draft_len(bs, alpha, B) == expected


def test_never_predicted_slower_than_plain_and_no_cliff():
    for alpha in [i / 20 for i in range(20)]:
        previous = B
        for bs in range(1, 65):
            draft_len = choose_draft_len(bs, alpha, B)
            rate = expected_tokens(alpha, draft_len) / round_cost(bs, draft_len)
            assert rate >= 1.0
            assert draft_len <= previous  # shrinks gradually as the batch grows
            previous = draft_len
    for bs in (1, 8, 32):  # grows with acceptance
        lens = [choose_draft_len(bs, a / 20, B) for a in range(20)]
        assert lens == sorted(lens)


def test_running_stats_switch_off_then_probe():
    policy = SpeculationPolicy(B)  # prior alpha 0.5
    assert policy.draft_len(1) > 1
    for _ in range(100):  # the drafter is never right
        policy.observe([1] * 4, B)
    assert policy.stats.alpha < 0.05
    chosen = [policy.draft_len(4) for _ in range(PROBE_EVERY)]
    assert chosen[:-1] == [1] * (PROBE_EVERY - 1) and chosen[-1] == B  # periodic probe
    for _ in range(40):  # ... until it is right again
        policy.observe([B] * 4, B)
    assert policy.draft_len(4) == B


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
