"""The benchmarks' paired speed-up estimates (benchmarks/speedups.py, used by
benchmarks/throughput.py and acceptance.py)."""

import math

import pytest

from benchmarks.speedups import paired_cell, paired_speedup, vs_ar


def _runs(method: str, tok_s: list[float], repeats: list[int], c: int = 8) -> list[dict]:
    return [{"method": method, "temperature": 0.0, "concurrency": c, "repeat": i,
             "output_tok_s": x} for i, x in zip(repeats, tok_s)]


def test_paired_ratios_cancel_drift_and_give_a_student_t_interval():
    # the machine halves its speed between repeats; each repeat's DOMINO run is AR's
    # x e^-0.1, x 1, x e^0.1: paired log ratios -0.1, 0, 0.1 (mean 0, sd 0.1)
    ar = _runs("ar", [100.0, 50.0, 25.0], [0, 3, 6])
    mine = _runs("domino-adaptive", [100 * math.exp(-0.1), 50.0, 25 * math.exp(0.1)], [0, 3, 6])
    other_point = _runs("domino-adaptive", [1.0, 1.0, 1.0], [1, 4, 7], c=16)  # not paired
    got = paired_speedup(ar + mine + other_point, "domino-adaptive", 0.0, 8)
    half = 2.919986 * 0.1 / math.sqrt(3)  # t_{0.95, 2} sd / sqrt(n)
    assert got["ratios"] == [round(math.exp(-0.1), 3), 1.0, round(math.exp(0.1), 3)]
    assert got["geomean"] == 1.0
    assert got["ci_low"] == pytest.approx(math.exp(-half), abs=1e-3)
    assert got["ci_high"] == pytest.approx(math.exp(half), abs=1e-3)
    # the ratio of medians here would be 50 / 50 = 1.0 as well, but a constant 3 % loss under
    # drift is found exactly by pairing (zero spread), which medians of 3 cannot resolve
    slower = _runs("domino-plain", [97.0, 48.5, 24.25], [0, 3, 6])
    tight = paired_speedup(ar + slower, "domino-plain", 0.0, 8)
    assert tight["geomean"] == tight["ci_low"] == tight["ci_high"] == 0.97
    assert paired_cell(tight) == "0.97 [0.97, 0.97]"


def test_paired_speedup_needs_two_pairs():
    runs = _runs("ar", [100.0, 90.0], [0, 1]) + _runs("domino-plain", [95.0], [0])
    with pytest.raises(ValueError, match="has 1 run.* paired with AR, needs 2"):
        paired_speedup(runs, "domino-plain", 0.0, 8)


def _answers(method: str, run: str, seconds: dict[int, float], tokens: int = 256) -> list[dict]:
    return [{"method": method, "dataset": "gsm8k", "i": i, "run": run, "tokens": tokens,
             "decode_s": t} for i, t in seconds.items()]


def test_acceptance_speed_over_ar_counts_only_prompts_both_answered_in_one_run():
    # run a: the machine is fast, DOMINO twice AR's speed on prompts 0 and 1; run b (after a
    # --resume on a machine twice as slow): 1.5x on prompt 2; prompt 3 DOMINO answered in run b
    # and AR in run a (not a pair), prompt 4 AR never answered
    ar = _answers("ar", "a", {0: 10.0, 1: 10.0, 3: 10.0}) + _answers("ar", "b", {2: 30.0})
    mine = (_answers("adaptive", "a", {0: 5.0, 1: 5.0}) + _answers("adaptive", "b", {2: 20.0})
            + _answers("adaptive", "b", {3: 1.0, 4: 1.0}))
    ratio, pairs = vs_ar(mine, ar)
    assert pairs == 3
    # totals over the pairs: 768 tokens in 30 s vs 768 in 50 s
    assert ratio == pytest.approx(50 / 30)
    assert vs_ar(mine, []) == (None, 0)
