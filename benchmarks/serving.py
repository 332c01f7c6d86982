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
from methods import CHOICES, METHODS, canonical  # noqa: E402

from domino_sglang.cli.local_server import sse_chunks, start_server  # noqa: E402
from domino_sglang.cpu.dtype import default_cpu_dtype  # noqa: E402
from domino_sglang.train import prompt_sets  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

def resolve_drafter(spec: str | None, block_size: int) -> str | None:
    """`random` builds a randomly initialised drafter (the pure-overhead floor)."""
    if spec != "random":
        return spec
    import tempfile

    from domino_sglang import cli
    from domino_sglang.paths import target_dir

    out = Path(tempfile.mkdtemp(prefix="domino-random-")) / "drafter"
    cli.main(["init-drafter", str(target_dir()), str(out), "--block-size", str(block_size)])
    return str(out)


def mixed_prompts(n: int) -> list[str]:
    """Round-robin over the evaluation sets so every run sees the same, varied prompts."""
    sets = [prompt_sets.load(name) for name in prompt_sets.EVAL_SETS]
    return [sets[i % len(sets)][i // len(sets)] for i in range(n)]


def one_request(url: str, prompt: str, max_tokens: int, temperature: float = 0.0,
                sampling: dict | None = None) -> dict:
    """Stream one chat completion (`sampling`: more sampling parameters, e.g. top_k / top_p);
    return tokens, TTFT and inter-token gaps."""
    body = {
        **(sampling or {}),
        "model": "default",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": temperature,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    arrivals, tokens, pieces = [], 0, []
    with requests.post(f"{url}/v1/chat/completions", json=body, stream=True, timeout=600) as r:
        r.raise_for_status()
        for chunk in sse_chunks(r):
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                arrivals.append(time.perf_counter())
                pieces.append(chunk["choices"][0]["delta"]["content"])
    if not arrivals:
        raise RuntimeError("no content streamed")
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return {"tokens": tokens, "ttft": arrivals[0] - start, "gaps": gaps,
            "latency": arrivals[-1] - start, "text": "".join(pieces)}


def counters(url: str) -> dict[str, float]:
    """Sum of each `sglang:` (or llama.cpp's `llamacpp:`) counter over its label sets, from
    /metrics (and DOMINO's gauge `domino_cost_scale`, the adaptive policy's calibrated k;
    `domino_rounds_total`, tree rounds apart as `domino_tree_rounds`)."""
    out: dict[str, float] = {}
    for line in requests.get(f"{url}/metrics", timeout=30).text.splitlines():
        if ((line.startswith(("sglang:", "llamacpp:")) and "_total" in line.split(" ")[0])
                or line.startswith(("domino_cost_scale", "domino_rounds_total"))):
            name = line.split("{")[0].split(" ")[0]
            value = float(line.rsplit(" ", 1)[1])
            if name == "domino_rounds_total" and 'kind="tree"' in line:
                # the rounds that verified a draft tree, counted in the total too
                out["domino_tree_rounds"] = out.get("domino_tree_rounds", 0.0) + value
            out[name] = out.get(name, 0.0) + value
    return out


def share(after: dict[str, float], before: dict[str, float], part: str,
          whole: str) -> float | None:
    """part's share of whole's growth between two scrapes (None: whole did not grow)."""
    grown = after.get(whole, 0.0) - before.get(whole, 0.0)
    if grown <= 0:
        return None
    return round((after.get(part, 0.0) - before.get(part, 0.0)) / grown, 3)


def run_point(url: str, prompts: list[str], concurrency: int, max_tokens: int,
              temperature: float = 0.0, sampling: dict | None = None) -> dict:
    before = counters(url)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(
            lambda p: one_request(url, p, max_tokens, temperature, sampling), prompts))
    wall = time.perf_counter() - t0
    tokens = sum(r["tokens"] for r in results)
    gaps = [g for r in results for g in r["gaps"]]
    after = counters(url)
    rounds = after.get("sglang:spec_verify_calls_total", 0) - before.get(
        "sglang:spec_verify_calls_total", 0)
    drafted = "llamacpp:spec_decode_num_drafts_total"
    if after.get(drafted, 0) > before.get(drafted, 0):  # llama.cpp: each decode round of a
        # request commits its accepted drafts + 1, the prefill its first token
        accepted = after["llamacpp:spec_decode_num_accepted_tokens_total"] - before.get(
            "llamacpp:spec_decode_num_accepted_tokens_total", 0)
        rounds = tokens - len(results) - accepted
    return {
        # tau = committed tokens per verify round (bonus included); only for speculative servers.
        # SGLang's convention: output tokens / verify calls, the prefill's first token included
        # (all-plain decoding of n tokens per request scores n / (n - 1), e.g. 1.016 at 64)
        "tau": round(tokens / rounds, 3) if rounds > 0 else None,
        "cost_scale": (round(after["domino_cost_scale"], 3) if "domino_cost_scale" in after
                       else None),  # k after the point (policy.CostCalibration)
        "tree_share": share(after, before, "domino_tree_rounds", "domino_rounds_total"),
        "texts": [r["text"] for r in results],
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
    ap.add_argument("--methods", nargs="+", default=["ar"], choices=CHOICES,
                    help="names in benchmarks/methods.py")
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--requests-per-level", type=int, default=0,
                    help="requests per concurrency level (default: max(8, 2 x concurrency))")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    ap.add_argument("--drafter", default=None,
                    help="drafter folder of the DOMINO methods (default: the shipped one), or "
                         "`random`")
    ap.add_argument("--block-size", type=int, default=16, help="block size of a random drafter")
    ap.add_argument("--dtype", default=default_cpu_dtype(),
                    help="server dtype (default: the CPU server's, cpu/dtype.py)")
    ap.add_argument("--out", default="serving", help="result file stem under benchmarks/results/")
    args = ap.parse_args()
    args.methods = list(dict.fromkeys(canonical(m) for m in args.methods))

    prov = provenance.collect()
    from domino_sglang.paths import shipped_drafter_dir

    drafter = resolve_drafter(args.drafter, args.block_size) or str(shipped_drafter_dir())
    rows = []
    for method in args.methods:
        serve, sglang = METHODS[method].server_args(drafter, args.dtype, args.block_size)
        with start_server(f"bench-{method}", serve, sglang, threads=args.threads,
                          env=dict(METHODS[method].env)) as server:
            one_request(server.url, "Hello!", 8)  # warm-up
            for c in args.concurrency:
                n = args.requests_per_level or max(8, 2 * c)
                point = run_point(server.url, mixed_prompts(n), c, args.max_tokens)
                point["method"] = method
                rows.append(point)
                print(json.dumps(point), flush=True)

    base = {r["concurrency"]: r for r in rows if r["method"] == "ar"}
    for r in rows:
        ar = base.get(r["concurrency"])
        if ar is not None:
            r["speedup_vs_ar"] = round(r["output_tok_s"] / ar["output_tok_s"], 3)
            # greedy outputs identical to plain decoding (bf16 can flip near-tied argmaxes)
            same = sum(a == b for a, b in zip(r["texts"], ar["texts"]))
            r["same_output_as_ar"] = f"{same}/{len(ar['texts'])}"
    for r in rows:
        r.pop("texts")

    RESULTS.mkdir(exist_ok=True)
    out = {"provenance": prov, "max_tokens": args.max_tokens, "dtype": args.dtype,
           "drafter": args.drafter, "rows": rows}
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = [f"## Serving throughput ({args.max_tokens} output tokens, greedy, ignore_eos, "
             f"{args.dtype}, drafter: {args.drafter or '-'})", "",
             provenance.markdown_header(prov), "",
             "| method | concurrency | requests | output tok/s | speed-up vs AR | tau "
             "| TTFT p50 (s) | ITL mean (ms) | same output as AR |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['concurrency']} | {r['requests']} | "
                     f"{r['output_tok_s']} | {r.get('speedup_vs_ar', '')} | {r.get('tau', '')} | "
                     f"{r['ttft_p50_s']} | {r['itl_mean_ms']} | {r.get('same_output_as_ar', '')} |")
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
