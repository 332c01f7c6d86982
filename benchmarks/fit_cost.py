"""Fit the adaptive policy's round-cost constants (spec/policy.py) to round_cost tables.

The policy's model of a round verifying L >= 2 tokens per request at batch size bs, in plain
decode steps, is linear in its three constants:

    cost(bs, L) - 1 = DRAFT + SLOPE_0 * (L - 1) + SLOPE_PER_REQ * bs * (L - 1)

so they are the least-squares solution over every measured (bs, L) point of one or more
`benchmarks/round_cost.py` JSON files (L = 1 points are not part of the fit: a plain round
costs 1 by definition). Prints the constants, the residuals per point and a
`--speculative-domino-debug-cost` value that a server can be started with to use them (or a
`CostModel(...)` line for policy.py).

    python benchmarks/fit_cost.py benchmarks/results/round_cost_fp32.json
    python benchmarks/fit_cost.py --short-draft benchmarks/results/round_cost_short_bf16.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np


def measured_points(paths: list[Path], short_draft: bool = False) -> list[tuple[int, int, float]]:
    """(bs, L, cost in plain decode steps) for every L >= 2 point of the given tables: rounds
    drafting the whole block, or (`short_draft`) only their L tokens (round_cost.py
    --short-draft)."""
    pattern = r"L=\d+ short draft" if short_draft else r"L=\d+"
    points = []
    for path in paths:
        table = json.loads(path.read_text())["cost_vs_ar_step"]
        for key, by_bs in table.items():
            if not re.fullmatch(pattern, key):
                continue  # e.g. "L=1 (verify forward)": not a round the policy can choose
            draft_len = int(key.removeprefix("L=").split()[0])
            if draft_len >= 2:
                points += [(int(bs), draft_len, float(cost)) for bs, cost in by_bs.items()]
    return points


def fit(points: list[tuple[int, int, float]]) -> tuple[float, float, float]:
    """Least-squares (DRAFT, SLOPE_0, SLOPE_PER_REQ) for the points."""
    if len({(bs, n) for bs, n, _ in points}) < 3:
        raise ValueError(f"need at least 3 distinct (bs, L >= 2) points to fit 3 constants, "
                         f"got {len(points)}")
    rows = np.array([[1.0, n - 1.0, bs * (n - 1.0)] for bs, n, _ in points])
    rhs = np.array([cost - 1.0 for _, _, cost in points])
    (draft, slope_0, slope_per_req), *_ = np.linalg.lstsq(rows, rhs, rcond=None)
    return float(draft), float(slope_0), float(slope_per_req)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tables", nargs="+", type=Path, help="round_cost.py JSON output(s)")
    ap.add_argument("--short-draft", action="store_true",
                    help="fit the rounds drafting only their L tokens (a cpu-*-short profile)")
    args = ap.parse_args()
    for path in args.tables:
        if not path.is_file():
            print(f"fit_cost: no such file: {path}", file=sys.stderr)
            return 2
    try:
        points = measured_points(args.tables, args.short_draft)
        draft, slope_0, slope_per_req = fit(points)
    except (KeyError, ValueError, json.JSONDecodeError) as exc:
        print(f"fit_cost: {exc}", file=sys.stderr)
        return 2
    print(f"DRAFT = {draft:.3f}, SLOPE_0 = {slope_0:.4f}, SLOPE_PER_REQ = {slope_per_req:.5f}")
    print("| bs | L | measured | model |")
    print("|---|---|---|---|")
    for bs, n, cost in sorted(points):
        model = 1 + draft + (slope_0 + slope_per_req * bs) * (n - 1)
        print(f"| {bs} | {n} | {cost:.2f} | {model:.2f} |")
    print(f"--speculative-domino-debug-cost {draft:.3f},{slope_0:.4f},{slope_per_req:.5f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
