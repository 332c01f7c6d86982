"""Served sampling compared in distribution: SAMPLES answers of TOKENS tokens drawn from two
servers, a two-sample chi-square test of homogeneity on the first token and on token pairs
(tests/server/test_served_sampling.py, tests/server/test_tp_server.py)."""

from __future__ import annotations

import zlib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import requests
from scipy.stats import chi2_contingency

SAMPLES = 400
TOKENS = 4
TEMPERATURE = 0.8
# 2 servers compared x 2 modes x 2 statistics at a family-wise 1%, Bonferroni
ALPHA = 0.01 / 8
MIN_CELL = 10  # outcomes seen fewer times (both servers together) are pooled
POOLS = 4  # rare outcomes fall into this many pools, by a fixed hash of the outcome


def draw(url: str, ids: list[int], seeded: bool, top_k: int | None = None
         ) -> list[tuple[int, ...]]:
    """SAMPLES answers of TOKENS tokens each (seeds 0..SAMPLES-1 when seeded; top_k: the
    requests' top-k, none by default)."""
    def one(i: int) -> tuple[int, ...]:
        params = {"temperature": TEMPERATURE, "max_new_tokens": TOKENS, "ignore_eos": True}
        if top_k is not None:
            params["top_k"] = top_k
        if seeded:
            params["sampling_seed"] = i
        r = requests.post(f"{url}/generate", json={"input_ids": ids, "sampling_params": params},
                          timeout=600)
        r.raise_for_status()
        return tuple(r.json()["output_ids"])

    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(one, range(SAMPLES)))


def _pooled(a: list, b: list, pool) -> tuple[list, list]:
    """a and b with each outcome seen fewer than MIN_CELL times (a and b together) replaced by
    pool(outcome)."""
    seen = Counter(a) + Counter(b)
    def cell(k):
        return k if seen[k] >= MIN_CELL else pool(k)
    return [cell(k) for k in a], [cell(k) for k in b]


def homogeneity(a: list, b: list) -> tuple[float, int]:
    """Two-sample chi-square test of homogeneity over the outcomes of a and b: (p-value, cells).
    Rare outcomes are pooled into POOLS cells by a fixed hash, pools still rare into one cell:
    a fixed map of the outcomes keeps the two distributions equal when they are, and a spread
    distribution (token pairs at T 0.8) still gives several cells instead of one common pair and
    the rest."""
    a, b = _pooled(a, b, lambda k: ("pool", zlib.crc32(repr(k).encode()) % POOLS))
    a, b = _pooled(a, b, lambda k: ("rest",))
    ca, cb = Counter(a), Counter(b)
    cells = sorted(ca.keys() | cb.keys(), key=repr)
    table = [[ca[k] for k in cells], [cb[k] for k in cells]]
    return float(chi2_contingency(table)[1]), len(cells)


def statistics(a: list[tuple[int, ...]], b: list[tuple[int, ...]]) -> dict[str, tuple]:
    return {"first token": homogeneity([s[0] for s in a], [s[0] for s in b]),
            "tokens 1-2": homogeneity([s[:2] for s in a], [s[:2] for s in b]),
            "tokens 2-3": homogeneity([s[1:3] for s in a], [s[1:3] for s in b])}
