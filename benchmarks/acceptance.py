"""Acceptance length (tau) and decode speed per dataset: AR, NGRAM, DOMINO (backbone, +lookup).

Every method is served in turn by `domino-sglang serve` on loopback (same target, dtype, threads),
and answers the same prompts: MT-Bench (80, first turn), HumanEval (164), GSM8K (first 200 of the
test set), chat template applied by the server, greedy, `--max-tokens` new tokens; `--limit`
takes the first N of each set (this CPU decodes ~7 tok/s). Per dataset and method:

    tau            committed tokens per verify round, bonus included (SGLang's convention:
                   output tokens / spec_verify_calls, so the prefill's first token counts too
                   and all-plain decoding of n tokens scores n / (n - 1))
                   = completion tokens / delta of sglang:spec_verify_calls_total
    by position    share of rounds whose draft at position p was accepted
                   (delta of domino_accepted_tokens_by_position_total / rounds; DOMINO only)
    decode tok/s   completion tokens / time after the first token, over the whole set (c = 1)

"DOMINO backbone-only" is the same checkpoint with the head switched off (DOMINO_HEAD=0): the
DFlash baseline; for a pointer drafter (pointer.py) its copy path stays on, and "DOMINO head and
copy off" (`bare`, DOMINO_COPY=0 too) is the baseline proper. All of these verify the full block
every round (DOMINO_ADAPTIVE=0) drafted by the drafter alone (DOMINO_LOOKUP=0). "DOMINO +
lookup" adds prompt lookup (lookup.py: a request whose last tokens recur in its own history
verifies the copy instead); "DOMINO adaptive" is the default
server (lookup on), whose policy may verify fewer tokens, down to plain decoding rounds.
Each server first answers one warm-up prompt (not in any set) of `--max-tokens` tokens, unmeasured.
Output: benchmarks/results/<out>.json, .md (with command, machine, revision,
date) and .png (tau by dataset and method; acceptance by position).

    python benchmarks/acceptance.py --limit 10 --max-tokens 128
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402

from domino_sglang import data  # noqa: E402
from domino_sglang.cpu.dtype import default_cpu_dtype  # noqa: E402
from domino_sglang.local_server import sse_chunks, start_server  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DATASETS = {"mtbench": 80, "humaneval": 164, "gsm8k": 200}

# method -> (label, `domino-sglang serve` flags ({drafter} filled in), extra environment)
METHODS: dict[str, tuple[str, list[str], dict[str, str]]] = {
    "ar": ("AR", ["--no-speculation"], {}),
    "ngram": ("NGRAM", ["--no-speculation", "--", "--speculative-algorithm", "NGRAM",
                        "--speculative-num-draft-tokens", "{block}"], {}),
    # acceptance is a property of the drafter: the full block is verified every round, drafted
    # by the drafter alone (no prompt lookup)
    "backbone": ("DOMINO head off", ["--drafter", "{drafter}"],
                 {"DOMINO_HEAD": "0", "DOMINO_ADAPTIVE": "0", "DOMINO_LOOKUP": "0"}),
    # a pointer drafter's backbone without its copy path either: the DFlash baseline proper
    # (the same as "backbone" for a drafter without a copy gate)
    "bare": ("DOMINO head and copy off", ["--drafter", "{drafter}"],
             {"DOMINO_HEAD": "0", "DOMINO_COPY": "0", "DOMINO_ADAPTIVE": "0",
              "DOMINO_LOOKUP": "0"}),
    "domino": ("DOMINO", ["--drafter", "{drafter}"],
               {"DOMINO_ADAPTIVE": "0", "DOMINO_LOOKUP": "0"}),
    # a pointer drafter's head without its copy path (the 2 x 2 of head and copy)
    "nocopy": ("DOMINO copy off", ["--drafter", "{drafter}"],
               {"DOMINO_COPY": "0", "DOMINO_ADAPTIVE": "0", "DOMINO_LOOKUP": "0"}),
    # the same, sampled drafts at the request's own temperature (draft_temperature_scale 1;
    # the shipped drafter samples at 0.6 T): differs from "domino" at --temperature > 0 only
    "domino-s1": ("DOMINO at T", ["--drafter", "{drafter}"],
                  {"DOMINO_ADAPTIVE": "0", "DOMINO_LOOKUP": "0",
                   "DOMINO_DRAFT_TEMPERATURE_SCALE": "1"}),
    # the full block, copied from the request's own history where its last tokens recur
    # (lookup.py; then no draft pass and L = 1 + the copy)
    "lookup": ("DOMINO + lookup", ["--drafter", "{drafter}"], {"DOMINO_ADAPTIVE": "0"}),
    # as served by default: lookup, and policy.py may verify fewer tokens (down to plain
    # decoding)
    "adaptive": ("DOMINO adaptive", ["--drafter", "{drafter}"], {}),
}


# One answer of --max-tokens before the sets, in every method's server: the adaptive policy
# (policy.py) learns alpha and its cost calibration k from real rounds, which a served stream
# has long done; measured from a cold server its first set (MT-Bench) paid for that learning.
WARMUP_PROMPT = "Explain how a hash table works, with a short Python example."


def chat(url: str, prompt: str, max_tokens: int, temperature: float = 0.0
         ) -> tuple[int, float, float]:
    """Stream one chat completion (greedy by default): (completion tokens, TTFT s, total s)."""
    body = {"model": "default", "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": temperature, "stream": True,
            "stream_options": {"include_usage": True}}
    start, first, tokens = time.perf_counter(), None, 0
    with requests.post(f"{url}/v1/chat/completions", json=body, stream=True, timeout=1800) as r:
        r.raise_for_status()
        for chunk in sse_chunks(r):
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif first is None and chunk.get("choices"):
                first = time.perf_counter()
    end = time.perf_counter()
    return tokens, (first or end) - start, end - start


def scrape(url: str) -> dict[str, float]:
    """Counters summed over label sets, keyed by name (+ position label when present)."""
    out: dict[str, float] = {}
    for line in requests.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("#") or "_total" not in line.split(" ")[0]:
            continue
        name = line.split("{")[0].split(" ")[0]
        if 'position="' in line:
            name += "@" + line.split('position="')[1].split('"')[0]
        out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def run_dataset(url: str, prompts: list[str], max_tokens: int, temperature: float = 0.0
                ) -> dict:
    before = scrape(url)
    tokens = decode_s = 0.0
    for p in prompts:
        n, ttft, total = chat(url, p, max_tokens, temperature)
        tokens += n
        decode_s += total - ttft
    after = scrape(url)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    rounds = delta.get("sglang:spec_verify_calls_total", 0.0)
    by_pos = {}
    for key, value in delta.items():
        if key.startswith("domino_accepted_tokens_by_position_total@") and rounds:
            by_pos[int(key.split("@")[1])] = round(value / rounds, 4)
    return {"requests": len(prompts), "tokens": int(tokens), "rounds": int(rounds),
            "tau": round(tokens / rounds, 3) if rounds else 1.0,
            "decode_tok_s": round(tokens / decode_s, 2) if decode_s else None,
            "accept_by_position": [by_pos[p] for p in sorted(by_pos)]}


def plot(results: dict, methods: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(DATASETS)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(methods)
    for i, m in enumerate(methods):
        taus = [results[m][s]["tau"] for s in sets]
        ax1.bar([j + i * width for j in range(len(sets))], taus, width, label=METHODS[m][0])
        for s in sets:
            pos = results[m][s]["accept_by_position"]
            if pos:
                ax2.plot(range(1, len(pos) + 1), pos, marker="o", label=f"{METHODS[m][0]} {s}")
    ax1.set_xticks([j + 0.4 - width / 2 for j in range(len(sets))], sets)
    ax1.set_ylabel("tau (tokens per verify round)")
    ax1.legend()
    ax2.set_xlabel("draft position")
    ax2.set_ylabel("P(accepted)")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--limit", type=int, default=0, help="first N prompts per set (0 = all)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--drafter", default=None, help="drafter folder (default: the shipped one)")
    ap.add_argument("--block-size", type=int, default=16, help="NGRAM draft tokens")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default=default_cpu_dtype(),
                    help="server dtype (default: the CPU server's, cpu/dtype.py)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sampling temperature of every request (default 0: greedy)")
    ap.add_argument("--out", default="acceptance")
    args = ap.parse_args()
    if args.limit < 0 or args.max_tokens < 1 or args.temperature < 0:
        ap.error("--limit must be >= 0, --max-tokens >= 1 and --temperature >= 0")

    from domino_sglang.paths import shipped_drafter_dir

    drafter = args.drafter or str(shipped_drafter_dir())
    prov = provenance.collect()
    prompts = {s: data.load(s, args.limit or n)[: args.limit or n] for s, n in DATASETS.items()}
    results: dict = {}
    for m in args.methods:
        label, flags, env = METHODS[m]
        flags = [f.format(drafter=drafter, block=args.block_size) for f in flags]
        cut = flags.index("--") if "--" in flags else len(flags)
        serve, sglang = flags[:cut] + ["--dtype", args.dtype], flags[cut + 1:]
        try:
            server = start_server(f"accept-{m}", serve, sglang, threads=args.threads, env=env)
        except RuntimeError as exc:  # recorded, and the other methods still run
            print(f"{m}: server failed to start: {str(exc)[:300]}", flush=True)
            continue
        with server:
            chat(server.url, WARMUP_PROMPT, args.max_tokens, args.temperature)  # warm-up
            results[m] = {}
            for s, ps in prompts.items():
                results[m][s] = run_dataset(server.url, ps, args.max_tokens, args.temperature)
                print(json.dumps({"method": m, "dataset": s, **results[m][s]}), flush=True)
    args.methods = [m for m in args.methods if m in results]

    RESULTS.mkdir(exist_ok=True)
    out = {"provenance": prov, "max_tokens": args.max_tokens, "limit": args.limit,
           "temperature": args.temperature,
           "drafter": drafter, "dtype": args.dtype, "results": results}
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=2) + "\n")
    ar = results.get("ar", {})
    mode = f"temperature {args.temperature}" if args.temperature > 0 else "greedy"
    lines = [f"## Acceptance ({args.max_tokens} new tokens, {mode}, {args.dtype}, concurrency 1, "
             f"{'first ' + str(args.limit) if args.limit else 'all'} prompts per set)", "",
             provenance.markdown_header(prov), f"- drafter: `{drafter}`", "",
             "| dataset | method | tau | decode tok/s | vs AR | accepted at positions 1..4 |",
             "|---|---|---|---|---|---|"]
    for s in DATASETS:
        for m in args.methods:
            r = results[m][s]
            speed = (f"{r['decode_tok_s'] / ar[s]['decode_tok_s']:.2f}x"
                     if s in ar and ar[s]["decode_tok_s"] else "")
            pos = " ".join(f"{p:.2f}" for p in r["accept_by_position"][:4])
            lines.append(f"| {s} | {METHODS[m][0]} | {r['tau']} | {r['decode_tok_s']} | "
                         f"{speed} | {pos} |")
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    plot(results, args.methods, RESULTS / f"{args.out}.png")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
