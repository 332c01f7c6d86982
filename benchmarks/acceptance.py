"""Acceptance length (tau) and decode speed per dataset: AR, NGRAM, DOMINO (backbone, +lookup).

Every method is served in turn by `domino-sglang serve` on loopback (same target, dtype, threads),
and answers the same prompts: MT-Bench (80, first turn), HumanEval (164), GSM8K (first 200 of the
test set), chat template applied by the server, greedy, `--max-tokens` new tokens; `--limit`
takes the first N of each set (this CPU decodes ~7 tok/s). Per dataset and method:

    tau            committed tokens per verify round, bonus included (SGLang's convention:
                   output tokens / spec_verify_calls, so the prefill's first token counts too
                   and all-plain decoding of n tokens scores n / (n - 1))
                   = completion tokens / delta of sglang:spec_verify_calls_total
    quartiles      of the answers' own tau (tokens / rounds of one answer): a set's tau made by a
                   few looping answers shows a high upper quartile and a low median
    by position    share of rounds whose draft at position p was accepted
                   (delta of domino_accepted_tokens_by_position_total / rounds; DOMINO only)
    decode tok/s   completion tokens / time after the first token, over the whole set (c = 1)

"DOMINO backbone-only" is the same checkpoint with the head switched off
(--speculative-domino-debug-head off): the DFlash baseline; for a pointer drafter (pointer.py)
its copy path stays on, and "DOMINO head and copy off" (`domino-bare`,
--speculative-domino-debug-copy off too) is the baseline proper. All of these verify the full
block every round (--speculative-domino-adaptive off) drafted by the drafter alone
(--speculative-domino-lookup off). "DOMINO +
lookup" adds prompt lookup (lookup.py: a request whose last tokens recur in its own history
verifies the copy instead); "DOMINO adaptive" is the default
server (lookup on), whose policy may verify fewer tokens, down to plain decoding rounds.
Each server first answers one warm-up prompt (not in any set) of `--max-tokens` tokens, unmeasured.
Output: benchmarks/results/<out>.json, .md (with command, machine, revision,
date) and .png (tau by dataset and method; acceptance by position).

Every answer is recorded as it finishes in benchmarks/results/<out>.jsonl (its tokens, verify
rounds, decode time and accepted drafts by position: deltas of the server's counters around that
one request), so a run cut short continues with `--resume` where it stopped: the full sets at 256
tokens take hours on these CPUs. tau and acceptance are deterministic and add up across runs;
decode tok/s is shown only where a set was measured in one run, and "vs AR" over the prompts
that AR and the method answered in one run. With `--paired` every method's server is up at once
and each prompt is answered by all of them back to back (the order rotating per prompt), so the
ratio holds on a machine whose speed drifts, and across `--resume`d runs on other machines.

    python benchmarks/acceptance.py --limit 10 --max-tokens 128
    python benchmarks/acceptance.py --methods domino-drafter domino-backbone --out acceptance_full \
        --resume
    python benchmarks/acceptance.py --out acceptance_full --report-only   # tables from the log
    python benchmarks/acceptance.py --methods ar domino-adaptive --paired \
        --out acceptance_full_speed
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import requests
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
from methods import CHOICES, METHODS, canonical  # noqa: E402
from speedups import vs_ar  # noqa: E402

from domino_sglang.cli.local_server import sse_chunks, start_server, stop_servers_on_sigterm  # noqa: E402
from domino_sglang.cpu.dtype import default_cpu_dtype  # noqa: E402
from domino_sglang.train import prompt_sets  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DATASETS = {"mtbench": 80, "humaneval": 164, "gsm8k": 200}

# the methods a run serves by default (benchmarks/methods.py; --methods picks others)
DEFAULT_METHODS = ["ar", "ngram", "domino-backbone", "domino-bare", "domino-drafter",
                   "domino-nocopy", "domino-drafter-s1", "domino-fixed", "domino-adaptive"]


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


def measure(url: str, prompt: str, max_tokens: int, temperature: float = 0.0) -> dict:
    """One answer and the deltas of the server's counters around it (c = 1: nothing else runs)."""
    before = scrape(url)
    n, ttft, total = chat(url, prompt, max_tokens, temperature)
    after = scrape(url)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    accepted = {int(k.split("@")[1]): v for k, v in delta.items()
                if k.startswith("domino_accepted_tokens_by_position_total@")}
    return {"tokens": n, "rounds": int(delta.get("sglang:spec_verify_calls_total", 0.0)),
            "decode_s": round(total - ttft, 4),
            "accepted": [int(accepted[p]) for p in sorted(accepted)]}


def summarize(rows: list[dict], expected: int) -> dict:
    """One set's answers (possibly from several runs) -> tau, tok/s, acceptance by position."""
    tokens = sum(r["tokens"] for r in rows)
    rounds = sum(r["rounds"] for r in rows)
    decode_s = sum(r["decode_s"] for r in rows)
    width = max((len(r["accepted"]) for r in rows), default=0)
    accepted = [sum(r["accepted"][p] for r in rows if p < len(r["accepted"]))
                for p in range(width)]
    runs = sorted({r["run"] for r in rows})
    # per answer: long greedy answers of a small target can loop, and a loop is all copies;
    # the quartiles show whether a set's tau is a few such answers or most of them
    per_answer = sorted(r["tokens"] / r["rounds"] for r in rows if r["rounds"])
    quartiles = ([round(q, 2) for q in statistics.quantiles(per_answer, n=4, method="inclusive")]
                 if len(per_answer) > 1 else [])
    return {"requests": len(rows), "of": expected, "tokens": tokens, "rounds": rounds,
            "tau": round(tokens / rounds, 3) if rounds else 1.0,
            "tau_quartiles": quartiles,
            "decode_tok_s": round(tokens / decode_s, 2) if decode_s and len(runs) == 1 else None,
            "runs": runs,
            "accept_by_position": [round(a / rounds, 4) for a in accepted] if rounds else []}


def plot(results: dict, methods: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(DATASETS)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(methods)
    for i, m in enumerate(methods):
        # a set with no answers yet has no bar (not a tau-1.0 one)
        taus = [results[m][s]["tau"] if results[m][s]["requests"] else float("nan")
                for s in sets]
        ax1.bar([j + i * width for j in range(len(sets))], taus, width, label=METHODS[m].label)
        for s in sets:
            pos = results[m][s]["accept_by_position"]
            if pos:
                ax2.plot(range(1, len(pos) + 1), pos, marker="o", label=f"{METHODS[m].label} {s}")
    ax1.set_xticks([j + 0.4 - width / 2 for j in range(len(sets))], sets)
    ax1.set_ylabel("tau (tokens per verify round)")
    ax1.legend()
    ax2.set_xlabel("draft position")
    ax2.set_ylabel("P(accepted)")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def load_log(path: Path, settings: dict) -> tuple[list[dict], list[dict]]:
    """A run log's (runs, answers); its settings must be these (the answers must add up)."""
    runs, rows = [], []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a kill: that answer is measured again
            print(f"{path}: line {n} is not JSON, ignored", flush=True)
            continue
        if "settings" in rec and rec["settings"] != settings:
            diff = sorted(k for k in settings if rec["settings"].get(k) != settings[k])
            was = ", ".join(f"{k} {rec['settings'].get(k)} there, {settings[k]} now" for k in diff)
            raise SystemExit(f"error: --resume: {path} was run with other settings ({was})")
        if "run" in rec and "provenance" in rec:
            runs.append(rec)
        elif "method" in rec:  # logs from before benchmarks/methods.py: old names mapped
            rows.append({**rec, "method": canonical(rec["method"])})
    return runs, rows


def main() -> None:
    stop_servers_on_sigterm()  # a SIGTERM stops the servers this run started
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, choices=CHOICES,
                    help="names in benchmarks/methods.py (old names accepted)")
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
    ap.add_argument("--resume", action="store_true",
                    help="continue <out>.jsonl: answers already recorded are not asked again")
    ap.add_argument("--report-only", action="store_true",
                    help="write <out>.json / .md / .png from <out>.jsonl as it is; serve nothing")
    ap.add_argument("--paired", action="store_true",
                    help="serve every method at once and ask each prompt of all of them in turn "
                         "(speed ratios that survive a noisy machine and --resume)")
    args = ap.parse_args()
    args.methods = list(dict.fromkeys(canonical(m) for m in args.methods))
    if args.limit < 0 or args.max_tokens < 1 or args.temperature < 0:
        ap.error("--limit must be >= 0, --max-tokens >= 1 and --temperature >= 0")

    from domino_sglang.paths import shipped_drafter_dir

    drafter = args.drafter or str(shipped_drafter_dir())
    settings = {"max_tokens": args.max_tokens, "limit": args.limit,
                "temperature": args.temperature, "drafter": drafter, "dtype": args.dtype,
                "block_size": args.block_size, "threads": args.threads}
    RESULTS.mkdir(exist_ok=True)
    log = RESULTS / f"{args.out}.jsonl"
    if args.report_only:
        if not log.exists():
            ap.error(f"--report-only: {log} does not exist")
        settings = json.loads(log.read_text().splitlines()[0])["settings"]
        args.limit = settings["limit"]
    prompts = {s: prompt_sets.load(s, args.limit or n)[: args.limit or n]
               for s, n in DATASETS.items()}
    if args.report_only:
        write_report(args.out, settings, *load_log(log, settings), prompts)
        return
    resumed = args.resume and log.exists()
    runs, rows = load_log(log, settings) if resumed else ([], [])
    if not resumed:
        log.write_text(json.dumps({"settings": settings}) + "\n")
    prov = provenance.collect()
    run = prov["date_utc"]
    runs.append({"run": run, "provenance": prov})
    with log.open("a") as f:
        f.write(json.dumps(runs[-1]) + "\n")
    done = {(r["method"], r["dataset"], r["i"]) for r in rows}
    # sequential: one server at a time; --paired: every method's server up at once and each
    # prompt answered by all of them back to back, so a drift of the machine's speed hits both
    # sides of every AR ratio alike
    for group in ([args.methods] if args.paired else [[m] for m in args.methods]):
        todo = {s: [i for i in range(len(ps)) if any((m, s, i) not in done for m in group)]
                for s, ps in prompts.items()}
        if not any(todo.values()):
            continue
        with ExitStack() as stack:
            servers = {}
            for m in group:
                if not any((m, s, i) not in done for s, ids in todo.items() for i in ids):
                    continue
                serve, sglang = METHODS[m].server_args(drafter, args.dtype, args.block_size)
                try:
                    servers[m] = stack.enter_context(start_server(
                        f"accept-{m}", serve, sglang, threads=args.threads,
                        env=dict(METHODS[m].env)))
                except RuntimeError as exc:  # recorded, and the other methods still run
                    print(f"{m}: server failed to start: {str(exc)[:300]}", flush=True)
            for server in servers.values():
                chat(server.url, WARMUP_PROMPT, args.max_tokens, args.temperature)  # warm-up
            order = list(servers)
            for s, ids in todo.items():
                for i in tqdm(ids, desc=f"{'+'.join(order)} {s}", file=sys.stdout):
                    # the order rotates per prompt: no method always answers first
                    for m in order[i % len(order):] + order[: i % len(order)]:
                        if (m, s, i) in done:
                            continue
                        row = {"method": m, "dataset": s, "i": i, "run": run,
                               **measure(servers[m].url, prompts[s][i], args.max_tokens,
                                         args.temperature)}
                        rows.append(row)
                        with log.open("a") as f:  # one whole line per answer, appended
                            f.write(json.dumps(row) + "\n")
                for m in order:
                    r = summarize([x for x in rows if (x["method"], x["dataset"]) == (m, s)],
                                  len(prompts[s]))
                    print(json.dumps({"method": m, "dataset": s, **r}), flush=True)
    write_report(args.out, settings, runs, rows, prompts)


def write_report(out_name: str, settings: dict, runs: list[dict], rows: list[dict],
                 prompts: dict[str, list[str]]) -> None:
    """<out>.json / .md / .png from every recorded answer (this run's and resumed ones)."""
    methods = [m for m in METHODS if any(r["method"] == m for r in rows)]
    results = {m: {s: summarize([r for r in rows if (r["method"], r["dataset"]) == (m, s)],
                                len(ps))
                   for s, ps in prompts.items()} for m in methods}
    used = {run for m in methods for s in DATASETS for run in results[m][s]["runs"]}
    runs = [r for r in runs if r["run"] in used]
    out = {"provenance": runs[-1]["provenance"] if runs else provenance.collect(),
           "runs": runs, **settings, "results": results}
    (RESULTS / f"{out_name}.json").write_text(json.dumps(out, indent=2) + "\n")
    def mine(m: str, s: str) -> list[dict]:
        return [r for r in rows if (r["method"], r["dataset"]) == (m, s)]

    mode = (f"temperature {settings['temperature']}" if settings["temperature"] > 0
            else "greedy")
    limit = settings["limit"]
    lines = [f"## Acceptance ({settings['max_tokens']} new tokens, {mode}, {settings['dtype']}, "
             f"concurrency 1, {'first ' + str(limit) if limit else 'all'} prompts per set)", ""]
    for n, r in enumerate(runs, 1):
        if len(runs) > 1:
            lines.append(f"Run {n} of {len(runs)}:")
        lines.append(provenance.markdown_header(r["provenance"]))
    lines += [f"- drafter: `{settings['drafter']}`", "",
              "| dataset | method | answers | tau | per answer: quartiles | decode tok/s | vs AR "
              "| accepted at positions 1..4 |", "|---|---|---|---|---|---|---|---|"]
    for s in DATASETS:
        for m in methods:
            r = results[m][s]
            if not r["requests"]:
                continue
            ratio, pairs = vs_ar(mine(m, s), mine("ar", s)) if m != "ar" else (None, 0)
            speed = "" if ratio is None else f"{ratio:.2f}x" + (
                f" ({pairs} of {r['requests']})" if pairs < r["requests"] else "")
            pos = " ".join(f"{p:.2f}" for p in r["accept_by_position"][:4])
            quart = " / ".join(f"{q:.2f}" for q in r["tau_quartiles"])
            lines.append(f"| {s} | {METHODS[m].label} | {r['requests']} of {r['of']} | {r['tau']} "
                         f"| {quart} | {r['decode_tok_s'] or ''} | {speed} | {pos} |")
    if len(runs) > 1:
        lines += ["", "decode tok/s only where a set was measured in one run; vs AR over the "
                  "prompts AR answered in the same run (their count in brackets when not all)."]
    (RESULTS / f"{out_name}.md").write_text("\n".join(lines) + "\n")
    plot(results, methods, RESULTS / f"{out_name}.png")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
