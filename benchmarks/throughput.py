"""Concurrency sweep: AR vs DOMINO fixed block vs DOMINO adaptive, at temperature 0 and 0.7.

One run starts a server per method (same target, dtype, threads, prompts: MT-Bench / GSM8K /
HumanEval round-robin) and keeps them all up (an idle server sleeps: --sleep-on-idle), then, for
every temperature and concurrency, measures the methods back to back, in alternating order from
one point to the next, so the machine's drift (this shared CPU's speed wanders by +-30% over tens
of minutes) hits all methods alike. Each measurement streams `2 x concurrency` (at least
`--min-requests`, 8) chat completions of exactly `--max-tokens` tokens (ignore_eos), after
`--warmup` (1) unrecorded runs of each method at the point: a point's first run prefills its
prompts cold and meets its batch size's first rounds, the others hit the prefix cache (the
first of 4 repeats at c = 4 had TTFT p50 1.27 s, the next three 0.21-0.40 s). Reported per
point:
output tokens/s, TTFT p50, mean inter-token latency, tau (committed tokens per verify round, from
sglang:spec_verify_calls_total), k (the adaptive policy's calibrated cost scale after the point,
`domino_cost_scale`; 1 = the profile as measured), trees (the share of decode rounds that
verified a draft tree, `domino_rounds_total{kind="tree"}`) and the speed-up over AR at the same
point: the ratio of the median runs and, with --repeats > 1, the paired estimate (`paired_speedup`).
"fixed" verifies the whole block every round (--speculative-domino-adaptive off); "adaptive" lets
policy.py pick the draft length.
`--llamacpp` adds llama.cpp's server (benchmarks/llamacpp.py: built from source, the same target
as a bf16 GGUF, the same threads) as a CPU peer, measured in the same alternation and paired
against like AR; `--llamacpp plain ngram dspark` adds its own speculation too (ngram-mod, and
draft-dspark running the drafter's exported backbone; tau from its /metrics).
Output: benchmarks/results/<out>.json, .md (command, machine, revision, date) and .png.

    python benchmarks/throughput.py --concurrency 1 2 4 8 16 32 --max-tokens 64
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from contextlib import ExitStack
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
from methods import CHOICES, METHODS, Method, canonical  # noqa: E402
from serving import RESULTS, mixed_prompts, one_request, run_point  # noqa: E402
from speedups import paired_cell, paired_speedup  # noqa: E402

from domino_sglang.cli.local_server import start_server, stop_servers_on_sigterm  # noqa: E402
from domino_sglang.cpu.dtype import default_cpu_dtype  # noqa: E402


def warmed(server):
    """The server after one short request (its first request's one-off costs, not measured)."""
    one_request(server.url, "Hello!", 8)
    return server


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temps = sorted({r["temperature"] for r in rows})
    fig, axes = plt.subplots(1, len(temps), figsize=(5.5 * len(temps), 4), squeeze=False)
    for ax, t in zip(axes[0], temps):
        for m in dict.fromkeys(r["method"] for r in rows):
            pts = sorted((r["concurrency"], r["output_tok_s"]) for r in rows
                         if r["method"] == m and r["temperature"] == t)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=m)
        ax.set_xscale("log", base=2)
        ax.set_title(f"temperature {t}")
        ax.set_xlabel("concurrency")
        ax.set_ylabel("output tokens/s")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _blank(value) -> str:
    """A table cell: the value, or empty where there is none (0 stays 0)."""
    return "" if value is None else str(value)


def main() -> None:
    stop_servers_on_sigterm()  # a SIGTERM stops the servers this run started
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=["ar", "domino-fixed", "domino-adaptive"],
                    choices=CHOICES, help="names in benchmarks/methods.py")
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 0.7])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--drafter", default=None, help="default: the shipped drafter")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default=default_cpu_dtype(),
                    help="server dtype (default: the CPU server's, cpu/dtype.py)")
    ap.add_argument("--settle", type=float, default=5.0,
                    help="seconds of quiet before each measurement (a server that just finished "
                         "a heavy point can keep a core busy for a moment)")
    ap.add_argument("--min-requests", type=int, default=8,
                    help="requests per measurement: 2 x concurrency, at least this many (short "
                         "measurements at low concurrency are the noisiest)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="measure every point this many times (methods back to back each time); "
                         "the table reports the median run of each method")
    ap.add_argument("--base-tree", type=Path, default=None,
                    help="another checkout of this repository: adds method <m>-base for each "
                         "of --base-methods (<m> served by that checkout's domino_sglang), e.g. "
                         "a `git worktree` of the parent (a checkout older than the "
                         "--speculative-domino-* flags took them as DOMINO_* environment "
                         "variables: serve it only methods without them, e.g. ar, "
                         "domino-adaptive)")
    ap.add_argument("--base-methods", nargs="+", default=["ar"], choices=CHOICES,
                    help="the methods --base-tree serves too (default: ar)")
    ap.add_argument("--base-drafter", type=Path, default=None,
                    help="the drafter the -base methods serve (default: --drafter's), e.g. "
                         "the base tree's own shipped one to compare drafters")
    ap.add_argument("--cost", default=None, metavar="DRAFT,SLOPE_0,SLOPE_PER_REQ",
                    help="serve every DOMINO method on this cost profile "
                         "(--speculative-domino-debug-cost, policy.py), e.g. a wrong one, to "
                         "see what calibration recovers")
    ap.add_argument("--warmup", type=int, default=1,
                    help="unrecorded runs of each method before each point's repeats (the first "
                         "run of a prompt set prefills it cold; later ones hit the prefix cache)")
    ap.add_argument("--llamacpp", nargs="*", default=None,
                    choices=["plain", "ngram", "dspark", "dspark-block"],
                    help="add llama.cpp's server: built from source, the same target as a bf16 "
                         "GGUF, the same threads (benchmarks/llamacpp.py), as methods llamacpp "
                         "(plain decoding; alone without a value), llamacpp-ngram (its "
                         "ngram-mod speculation), llamacpp-dspark (its draft-dspark running "
                         "the drafter's backbone, exported; dspark-block: drafts of the block's "
                         "B - 1 tokens); every other method is also paired "
                         "against llamacpp; skipped, with the reason reported, when it cannot "
                         "be built here")
    ap.add_argument("--paired-against", nargs="+", default=[], metavar="M",
                    help="also pair every other method against these methods of the run (e.g. "
                         "a draft tree against the chain of its size), as against llama.cpp")
    ap.add_argument("--top-k", type=int, default=None,
                    help="sampled points (T > 0) also ask this top-k (Qwen3's default: 20)")
    ap.add_argument("--top-p", type=float, default=None,
                    help="sampled points (T > 0) also ask this top-p (Qwen3's default: 0.95)")
    ap.add_argument("--out", default="throughput")
    args = ap.parse_args()
    args.methods = list(dict.fromkeys(canonical(m) for m in args.methods))
    args.paired_against = [canonical(m) for m in args.paired_against]
    for m in args.paired_against:
        if m not in args.methods:
            ap.error(f"--paired-against: {m} is not among --methods")
    args.base_methods = list(dict.fromkeys(canonical(m) for m in args.base_methods))
    methods: dict[str, Method] = dict(METHODS)  # this run's, with --cost and -base variants
    if (min(args.concurrency) < 1 or args.max_tokens < 1 or min(args.temperatures) < 0
            or args.repeats < 1 or args.min_requests < 1 or args.warmup < 0):
        ap.error("--concurrency, --max-tokens, --repeats and --min-requests must be >= 1, "
                 "--temperatures and --warmup >= 0")

    if args.cost is not None:
        from domino_sglang.spec.options import BY_FIELD, DominoOptionError

        try:
            BY_FIELD["cost"].parse(args.cost, "--cost")
        except DominoOptionError as exc:
            ap.error(str(exc))
        for m, method in methods.items():
            if method.speculative:
                methods[m] = method.with_options("--speculative-domino-debug-cost", args.cost)
    if args.base_tree is not None:
        if not (args.base_tree / "domino_sglang" / "__init__.py").is_file():
            ap.error(f"--base-tree: no domino_sglang package in {args.base_tree}")
        for m in args.base_methods:  # the base tree's CLI too: `python -m` would otherwise
            # put the working directory (this checkout) before PYTHONPATH (PYTHONSAFEPATH)
            methods[f"{m}-base"] = methods[m].with_env(PYTHONPATH=str(args.base_tree.resolve()),
                                                       PYTHONSAFEPATH="1")
        args.methods = [*args.methods, *(f"{m}-base" for m in args.base_methods)]
    if args.base_drafter is not None:
        if args.base_tree is None:
            ap.error("--base-drafter needs --base-tree")
        if not (args.base_drafter / "config.json").is_file():
            ap.error(f"--base-drafter: no config.json in {args.base_drafter}")

    from domino_sglang.paths import shipped_drafter_dir

    drafter = args.drafter or str(shipped_drafter_dir())
    prov = provenance.collect()
    if args.base_tree is not None:
        prov["base_tree_revision"] = provenance.git_revision(args.base_tree)
    base_drafter = str(args.base_drafter) if args.base_drafter is not None else drafter
    rows = []
    peer_note = ""
    with ExitStack() as stack:
        servers, fresh = {}, {}
        if args.llamacpp is not None:
            import llamacpp

            from domino_sglang.model.config import load_draft_config
            from domino_sglang.paths import target_dir

            peers = list(dict.fromkeys("llamacpp" if m == "plain" else f"llamacpp-{m}"
                                       for m in args.llamacpp or ["plain"]))
            try:
                draft = (llamacpp.drafter_gguf(Path(drafter), target_dir())
                         if any(m.startswith("llamacpp-dspark") for m in peers) else None)
                block = load_draft_config(drafter).block_size
                for m in peers:
                    start = partial(llamacpp.llama_server, target_dir(), args.threads,
                                    slots=max(args.concurrency),
                                    spec=tuple(llamacpp.SPECS[m](draft, args.threads, block)))
                    if m in llamacpp.FRESH:  # a new server for every run (llamacpp.FRESH)
                        fresh[m] = start
                        continue
                    servers[m] = warmed(stack.enter_context(start()))
                args.methods = [*args.methods, *peers]
                peer_note = (f"- llamacpp: llama.cpp's llama-server ({llamacpp.PACKAGE} "
                             f"source, GGML_NATIVE=OFF), the target as a bf16 GGUF, "
                             f"{args.threads} thread(s); " + "; ".join(
                                 f"{m}: `{' '.join(llamacpp.SPECS[m]('D', args.threads, block))}`"
                                 for m in peers if m != "llamacpp") + "\n")
            except llamacpp.Unavailable as exc:
                peer_note = f"- llamacpp: skipped, {exc}\n"
                print(f"llamacpp: skipped: {exc}", flush=True)
        for m in args.methods:  # started one at a time: start-up is CPU-heavy
            if m.startswith("llamacpp"):
                continue
            serve, sglang = methods[m].server_args(
                base_drafter if m.endswith("-base") else drafter, args.dtype)
            servers[m] = warmed(stack.enter_context(start_server(
                f"tput-{m}", serve, sglang, threads=args.threads, env=dict(methods[m].env))))
        points = [(t, c) for t in args.temperatures for c in args.concurrency]
        sampling = {k: v for k, v in (("top_k", args.top_k), ("top_p", args.top_p))
                    if v is not None}
        runs = []
        plan = [(t, c, w < args.warmup) for t, c in points
                for w in range(args.warmup + args.repeats)]
        for i, (t, c, warmup) in enumerate(plan):
            order = args.methods if i % 2 == 0 else args.methods[::-1]
            for m in order:
                time.sleep(args.settle)
                with ExitStack() as run:
                    if m in fresh:
                        servers[m] = warmed(run.enter_context(fresh[m]()))
                    point = run_point(servers[m].url,
                                      mixed_prompts(max(args.min_requests, 2 * c)), c,
                                      args.max_tokens, t, sampling if t > 0 else None)
                point.pop("texts")
                point.update(method=m, temperature=t, repeat=i)  # runs of one i are paired
                if warmup:
                    point["warmup"] = True
                else:
                    runs.append(point)
                print(json.dumps(point), flush=True)
    for t, c in points:  # the median run (by output tokens/s) of each method at each point
        for m in args.methods:
            same = sorted((r for r in runs if (r["temperature"], r["concurrency"], r["method"])
                           == (t, c, m)), key=lambda r: r["output_tok_s"])
            row = dict(same[(len(same) - 1) // 2])
            row["runs_tok_s"] = [r["output_tok_s"] for r in same]
            rows.append(row)
    ar = {(r["temperature"], r["concurrency"]): r for r in rows if r["method"] == "ar"}
    references = [m for m in dict.fromkeys(["llamacpp", *args.paired_against])
                  if m in args.methods]  # what every other method is paired against too
    for r in rows:
        base = ar.get((r["temperature"], r["concurrency"]))
        if base is not None:
            r["speedup_vs_ar"] = round(r["output_tok_s"] / base["output_tok_s"], 3)
        if base is not None and r["method"] != "ar" and args.repeats > 1:
            r["paired_vs_ar"] = paired_speedup(runs, r["method"], r["temperature"],
                                               r["concurrency"])
        for ref in references:
            if r["method"] != ref and args.repeats > 1:
                r[f"paired_vs_{ref}"] = paired_speedup(runs, r["method"], r["temperature"],
                                                       r["concurrency"], baseline=ref)

    RESULTS.mkdir(exist_ok=True)
    out = {"provenance": prov, "max_tokens": args.max_tokens, "dtype": args.dtype,
           "cost": args.cost,
           "repeats": args.repeats, "warmup": args.warmup, "drafter": drafter,
           "base_drafter": base_drafter,
           "rows": rows, "runs": runs}
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=2) + "\n")
    median = f", median of {args.repeats} runs" if args.repeats > 1 else ""
    median += f" after {args.warmup} unrecorded" if args.warmup else ""
    cost = (f"- DOMINO methods on cost profile --speculative-domino-debug-cost {args.cost}\n"
            if args.cost else "")
    if base_drafter != drafter:
        cost += f"- the -base methods' drafter: `{base_drafter}`\n"
    lines = [f"## Throughput sweep ({args.max_tokens} output tokens, ignore_eos, {args.dtype}"
             f"{median})", "", provenance.markdown_header(prov),
             f"{cost}{peer_note}- drafter: `{drafter}`",
             "",
             "| temperature | concurrency | method | output tok/s | vs AR | paired vs AR [90% CI] "
             "| tau | k | trees | TTFT p50 (s) | ITL mean (ms) | runs (tok/s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["temperature"], r["concurrency"])):
        lines.append(f"| {r['temperature']} | {r['concurrency']} | {r['method']} | "
                     f"{r['output_tok_s']} | {r.get('speedup_vs_ar', '')} | "
                     f"{paired_cell(r.get('paired_vs_ar'))} | {r['tau'] or ''} | "
                     f"{r.get('cost_scale') or ''} | {_blank(r.get('tree_share'))} | "
                     f"{r['ttft_p50_s']} | {r['itl_mean_ms']} | "
                     f"{' / '.join(map(str, r['runs_tok_s']))} |")
    for m in args.methods:
        mine = [r["speedup_vs_ar"] for r in rows if r["method"] == m and "speedup_vs_ar" in r]
        if m != "ar" and mine:
            geo = math.exp(sum(map(math.log, mine)) / len(mine))
            lines.append(f"\n{m} vs AR: geometric mean {geo:.3f}x, min {min(mine):.3f}x, "
                         f"max {max(mine):.3f}x over {len(mine)} points")
            paired = [r["paired_vs_ar"] for r in rows if r["method"] == m and "paired_vs_ar" in r]
            if paired:
                geo = math.exp(statistics.fmean(math.log(p["geomean"]) for p in paired))
                below = sum(p["ci_high"] < 0.98 for p in paired)
                lines.append(f"{m} vs AR, paired: geometric mean {geo:.3f}x, min "
                             f"{min(p['geomean'] for p in paired):.3f}x; {below} of "
                             f"{len(paired)} points with the whole 90% CI under 0.98x")
    for ref in references:
        peer = [r for r in rows if f"paired_vs_{ref}" in r]
        if peer:
            name = "llama.cpp's server" if ref == "llamacpp" else ref
            lines += ["", f"Paired against {name} (same points, same runs):", "",
                      f"| temperature | concurrency | method | paired vs {ref} [90% CI] |",
                      "|---|---|---|---|"]
            lines += [f"| {r['temperature']} | {r['concurrency']} | {r['method']} | "
                      f"{paired_cell(r[f'paired_vs_{ref}'])} |" for r in peer]
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    plot(rows, RESULTS / f"{args.out}.png")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
