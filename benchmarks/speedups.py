"""Speed-up estimates of the benchmarks: a method's speed over AR's from paired measurements
(benchmarks/throughput.py: paired runs; benchmarks/acceptance.py: paired prompts). Pairing
cancels the machine's slow drift (a shared CPU's speed wanders by +-30% over tens of minutes),
which a ratio of medians keeps."""

from __future__ import annotations

import math
import statistics


def paired_speedup(runs: list[dict], method: str, temperature: float, concurrency: int,
                   confidence: float = 0.9, baseline: str = "ar") -> dict:
    """The speed-up of `method` over `baseline` (AR by default) at one point from paired runs:
    each repeat measures the
    methods back to back, so the ratio of the two runs of one repeat cancels the machine's slow
    drift, which the ratio of medians does not. Returned: the geometric mean of the n paired
    ratios r_i and a Student-t interval on their logs,
        exp(mean(log r) +- t_{(1+confidence)/2, n-1} * sd(log r) / sqrt(n)),
    and the ratios themselves."""
    from scipy.stats import t as student_t

    def by_repeat(m: str) -> dict[int, float]:
        return {r["repeat"]: r["output_tok_s"] for r in runs
                if (r["method"], r["temperature"], r["concurrency"]) == (m, temperature,
                                                                          concurrency)}

    mine, ar = by_repeat(method), by_repeat(baseline)
    ratios = [mine[i] / ar[i] for i in sorted(mine.keys() & ar.keys())]
    if len(ratios) < 2:
        name = "AR" if baseline == "ar" else baseline
        raise ValueError(f"paired_speedup: {method} at T = {temperature}, c = {concurrency} "
                         f"has {len(ratios)} run(s) paired with {name}, needs 2")
    logs = [math.log(x) for x in ratios]
    mean, sd, n = statistics.fmean(logs), statistics.stdev(logs), len(logs)
    half = student_t.ppf((1 + confidence) / 2, n - 1) * sd / math.sqrt(n)
    return {"geomean": round(math.exp(mean), 3), "ci_low": round(math.exp(mean - half), 3),
            "ci_high": round(math.exp(mean + half), 3), "confidence": confidence,
            "ratios": [round(x, 3) for x in ratios]}


def paired_cell(paired: dict | None) -> str:
    """A table cell for a paired_speedup result: 'geomean [low, high]' ('' without one)."""
    if paired is None:
        return ""
    return f"{paired['geomean']} [{paired['ci_low']}, {paired['ci_high']}]"


def vs_ar(rows: list[dict], ar_rows: list[dict]) -> tuple[float | None, int]:
    """Decode speed over AR's on the prompts both answered in one run: (ratio, pairs).

    A pair is one prompt answered by both servers of a run (back to back with --paired):
    ratios from pairs survive a machine that speeds up or slows down between runs.
    """
    ar = {(r["i"], r["run"]): r for r in ar_rows}
    pairs = [(r, ar[(r["i"], r["run"])]) for r in rows if (r["i"], r["run"]) in ar]
    own_s, ar_s = sum(r["decode_s"] for r, _ in pairs), sum(a["decode_s"] for _, a in pairs)
    if not pairs or not own_s or not ar_s:
        return None, len(pairs)
    own = sum(r["tokens"] for r, _ in pairs) / own_s
    return own / (sum(a["tokens"] for _, a in pairs) / ar_s), len(pairs)
