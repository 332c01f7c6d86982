"""Serving throughput through the OpenAI API, every method in one run (the AR baseline included).

For each method the script starts `domino-sglang serve` with that method's flags on a loopback
port, sends real prompts (MT-Bench / GSM8K / HumanEval, chat template applied by the server) with
a fixed output length (`ignore_eos`), at each concurrency, streams the answers and records output
tokens/s, TTFT and inter-token latency. Results: JSON + Markdown with command, machine, revision
and date under benchmarks/results/.

    python benchmarks/serving.py --methods ar --concurrency 1 8 --max-tokens 128
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402

from domino_sglang import data  # noqa: E402
from domino_sglang.local_server import start_server  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

# Method name -> `domino-sglang serve` flags.
METHODS: dict[str, list[str]] = {
    "ar": ["--no-speculation"],
}


def mixed_prompts(n: int) -> list[str]:
    """Round-robin over the evaluation sets so every run sees the same, varied prompts."""
    sets = [data.load(name) for name in data.EVAL_SETS]
    return [sets[i % len(sets)][i // len(sets)] for i in range(n)]


def one_request(url: str, prompt: str, max_tokens: int) -> dict:
    """Stream one chat completion; return tokens, TTFT and inter-token gaps."""
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    arrivals, tokens = [], 0
    with requests.post(f"{url}/v1/chat/completions", json=body, stream=True, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                arrivals.append(time.perf_counter())
    if not arrivals:
        raise RuntimeError("no content streamed")
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return {"tokens": tokens, "ttft": arrivals[0] - start, "gaps": gaps,
            "latency": arrivals[-1] - start}


def run_point(url: str, prompts: list[str], concurrency: int, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda p: one_request(url, p, max_tokens), prompts))
    wall = time.perf_counter() - t0
    tokens = sum(r["tokens"] for r in results)
    gaps = [g for r in results for g in r["gaps"]]
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "output_tokens": tokens,
        "wall_s": round(wall, 3),
        "output_tok_s": round(tokens / wall, 2),
        "ttft_p50_s": round(statistics.median(r["ttft"] for r in results), 4),
        "itl_mean_ms": round(1000 * statistics.fmean(gaps), 2) if gaps else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=["ar"], choices=sorted(METHODS))
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--requests-per-level", type=int, default=0,
                    help="requests per concurrency level (default: max(8, 2 x concurrency))")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    ap.add_argument("--out", default="serving", help="result file stem under benchmarks/results/")
    args = ap.parse_args()

    prov = provenance.collect()
    rows = []
    for method in args.methods:
        with start_server(f"bench-{method}", METHODS[method], threads=args.threads) as server:
            one_request(server.url, "Hello!", 8)  # warm-up
            for c in args.concurrency:
                n = args.requests_per_level or max(8, 2 * c)
                point = run_point(server.url, mixed_prompts(n), c, args.max_tokens)
                point["method"] = method
                rows.append(point)
                print(json.dumps(point), flush=True)

    base = {r["concurrency"]: r["output_tok_s"] for r in rows if r["method"] == "ar"}
    for r in rows:
        if r["concurrency"] in base:
            r["speedup_vs_ar"] = round(r["output_tok_s"] / base[r["concurrency"]], 3)

    RESULTS.mkdir(exist_ok=True)
    out = {"provenance": prov, "max_tokens": args.max_tokens, "rows": rows}
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = [f"## Serving throughput ({args.max_tokens} output tokens, greedy, ignore_eos)", "",
             provenance.markdown_header(prov), "",
             "| method | concurrency | requests | output tok/s | speed-up vs AR | TTFT p50 (s) "
             "| ITL mean (ms) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['concurrency']} | {r['requests']} | "
                     f"{r['output_tok_s']} | {r.get('speedup_vs_ar', '')} | {r['ttft_p50_s']} | "
                     f"{r['itl_mean_ms']} |")
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
