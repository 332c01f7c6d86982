"""The throughput benchmark's paired speed-up estimate (benchmarks/throughput.py)."""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import throughput  # noqa: E402


def _runs(method: str, tok_s: list[float], repeats: list[int], c: int = 8) -> list[dict]:
    return [{"method": method, "temperature": 0.0, "concurrency": c, "repeat": i,
             "output_tok_s": x} for i, x in zip(repeats, tok_s)]


def test_paired_ratios_cancel_drift_and_give_a_student_t_interval():
    # the machine halves its speed between repeats; each repeat's DOMINO run is AR's
    # x e^-0.1, x 1, x e^0.1: paired log ratios -0.1, 0, 0.1 (mean 0, sd 0.1)
    ar = _runs("ar", [100.0, 50.0, 25.0], [0, 3, 6])
    mine = _runs("domino-adaptive", [100 * math.exp(-0.1), 50.0, 25 * math.exp(0.1)], [0, 3, 6])
    other_point = _runs("domino-adaptive", [1.0, 1.0, 1.0], [1, 4, 7], c=16)  # not paired
    got = throughput.paired_speedup(ar + mine + other_point, "domino-adaptive", 0.0, 8)
    half = 2.919986 * 0.1 / math.sqrt(3)  # t_{0.95, 2} sd / sqrt(n)
    assert got["ratios"] == [round(math.exp(-0.1), 3), 1.0, round(math.exp(0.1), 3)]
    assert got["geomean"] == 1.0
    assert got["ci_low"] == pytest.approx(math.exp(-half), abs=1e-3)
    assert got["ci_high"] == pytest.approx(math.exp(half), abs=1e-3)
    # the ratio of medians here would be 50 / 50 = 1.0 as well, but a constant 3 % loss under
    # drift is found exactly by pairing (zero spread), which medians of 3 cannot resolve
    slower = _runs("domino-plain", [97.0, 48.5, 24.25], [0, 3, 6])
    tight = throughput.paired_speedup(ar + slower, "domino-plain", 0.0, 8)
    assert tight["geomean"] == tight["ci_low"] == tight["ci_high"] == 0.97
    assert throughput.paired_cell(tight) == "0.97 [0.97, 0.97]"


def test_paired_speedup_needs_two_pairs():
    runs = _runs("ar", [100.0, 90.0], [0, 1]) + _runs("domino-plain", [95.0], [0])
    with pytest.raises(ValueError, match="has 1 run.* paired with AR, needs 2"):
        throughput.paired_speedup(runs, "domino-plain", 0.0, 8)
