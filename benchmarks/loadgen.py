"""The load test's pieces without locust (benchmarks/loadtest.py and locustfile.py import them;
locust's gevent patching must come first in the locustfile): the prompts file, the latency
metrics of a streamed answer, and a run's domino_ counter deltas from /metrics.

Prompts file (`--prompts`): one {"prompt": str} or {"messages": [...]} per line, the format
`python -m sglang.benchmark.serving --dataset-name openai` reads too (its extra keys, e.g.
max_tokens, are ignored here)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path


def load_prompt_file(path: str | Path) -> list[list[dict]]:
    """Chat messages from a JSONL file; a clear error naming the line that is not a prompt."""
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e})") from e
            if isinstance(rec, dict) and isinstance(rec.get("prompt"), str):
                out.append([{"role": "user", "content": rec["prompt"]}])
            elif isinstance(rec, dict) and isinstance(rec.get("messages"), list) \
                    and rec["messages"]:
                out.append(rec["messages"])
            else:
                raise ValueError(f"{path}:{n}: expected {{'prompt': str}} or "
                                 "{'messages': [...]}")
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out


def stream_latencies(start: float, chunk_times: list[float], tokens: int) -> dict[str, list]:
    """TTFT, TPOT and the inter-chunk gaps (ms) of one streamed answer: `chunk_times` are the
    perf_counter times of its content chunks, `tokens` its completion tokens (usage)."""
    out: dict[str, list] = {"TTFT": [], "TPOT": [], "ITL": []}
    if not chunk_times:
        return out
    out["TTFT"].append((chunk_times[0] - start) * 1e3)
    if tokens > 1:
        out["TPOT"].append((chunk_times[-1] - chunk_times[0]) * 1e3 / (tokens - 1))
    out["ITL"] = [(b - a) * 1e3 for a, b in zip(chunk_times, chunk_times[1:])]
    return out


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank-interpolated percentile (statistics.quantiles), None without samples."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def latency_summary(samples: list[tuple[str, str, float]]) -> dict:
    """{metric: {count, mean, p50, p90, p99} in ms} over the raw samples."""
    out = {}
    for metric in ("TTFT", "TPOT", "ITL"):
        v = [x for m, _, x in samples if m == metric]
        out[metric] = {"count": len(v),
                       "mean_ms": None if not v else round(statistics.fmean(v), 3),
                       **{f"p{int(q * 100)}_ms": None if not v else round(percentile(v, q), 3)
                          for q in (0.5, 0.9, 0.99)}}
    return out


def parse_domino_counters(text: str) -> dict[str, float]:
    """The domino_ series of a /metrics page: {name or name{label}: value}, summed over
    model_name (one server, or a router's replicas scraped one by one); histogram buckets
    are left out (their _count and _sum are kept)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("domino_") or "_bucket{" in line:
            continue
        series, value = line.rsplit(" ", 1)
        name, _, labels = series.partition("{")
        keep = ",".join(sorted(lab for lab in labels.rstrip("}").split(",")
                               if lab and not lab.startswith("model_name=")))
        key = f"{name}{{{keep}}}" if keep else name
        out[key] = out.get(key, 0.0) + float(value)
    return out


def domino_deltas(before: dict[str, float], after: dict[str, float]) -> dict:
    """The run's counter deltas (totals and histogram counts/sums), tau and the acceptance rate;
    tau = tokens committed per verify round, bonus included: (accepted + rounds) / rounds."""
    counters = {k: round(after[k] - before.get(k, 0.0), 6) for k in sorted(after)
                if k.split("{")[0].endswith(("_total", "_count", "_sum"))}
    rounds = counters.get("domino_verify_rounds_total", 0.0)
    accepted = counters.get("domino_draft_tokens_accepted_total", 0.0)
    proposed = counters.get("domino_draft_tokens_proposed_total", 0.0)
    return {"verify_rounds": rounds, "accepted_drafts": accepted,
            "tau": round((accepted + rounds) / rounds, 4) if rounds else None,
            "acceptance_rate": round(accepted / proposed, 4) if proposed else None,
            "cost_scale": after.get("domino_cost_scale"), "counters": counters}
