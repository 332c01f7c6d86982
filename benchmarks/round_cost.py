"""Measure the adaptive policy's cost model: the wall time of a DOMINO round verifying L tokens
per request, relative to a plain decode step of the AR server, at several batch sizes.

For each L a DOMINO server pins the draft length (--speculative-domino-debug-draft-len L); an AR
server gives the plain step. At concurrency c, `c` streamed chat completions of `--max-tokens`
tokens run at once (ignore_eos, temperature 0), so the batch holds c requests; the mean gap between
streamed chunks is the round time (one chunk per request per round). cost(c, L) = gap(DOMINO, L) /
gap(AR), with the AR gap measured right next to the DOMINO one (the AR server stays up; order
alternating), so this machine's drift over minutes (+-30% and more) does not enter the ratio.
The fitted constants of domino_sglang/spec/policy.py come from this table (benchmarks/fit_cost.py).

    python benchmarks/round_cost.py --lens 1 2 4 8 16 --concurrency 1 4 16 32
    python benchmarks/round_cost.py --lens 1 2 3 4 8 --concurrency 1 4 --short-draft
(--short-draft: rounds of L < B tokens also timed drafting only those L, the cpu-*-short profiles)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
from serving import RESULTS, mixed_prompts, one_request, run_point  # noqa: E402

from domino_sglang.cli.local_server import start_server, stop_servers_on_sigterm  # noqa: E402
from domino_sglang.cpu.dtype import default_cpu_dtype  # noqa: E402


def main() -> None:
    stop_servers_on_sigterm()  # a SIGTERM stops the servers this run started
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lens", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16, 32])
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--drafter", default=None, help="default: the shipped drafter")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default=default_cpu_dtype(),
                    help="server dtype (default: the CPU server's, cpu/dtype.py)")
    ap.add_argument("--plain-verify", action="store_true",
                    help="also time L=1 as a one-token TARGET_VERIFY forward "
                         "(--speculative-domino-debug-plain-decode off) next to the default DECODE "
                         "forward")
    ap.add_argument("--short-draft", action="store_true",
                    help="also time each L >= 2 drafting only its L tokens "
                         "(--speculative-domino-debug-short-draft on) next to drafting the whole "
                         "block")
    ap.add_argument("--out", default="round_cost")
    args = ap.parse_args()
    if min(args.lens) < 1 or min(args.concurrency) < 1 or args.max_tokens < 2:
        ap.error("--lens and --concurrency must be >= 1, --max-tokens >= 2")

    from domino_sglang.paths import shipped_drafter_dir

    drafter = args.drafter or str(shipped_drafter_dir())
    prov = provenance.collect()
    servers = []
    # every round drafted by the drafter (no prompt lookup): a copied round skips the draft pass,
    # which the profile prices separately (policy.lookup_len); DOMINO options (options.py)
    d = "--speculative-domino-"
    own = [d + "lookup", "off"]
    for n in args.lens:
        servers.append((f"L={n}", ["--drafter", drafter],
                        [*own, d + "debug-draft-len", str(n), d + "debug-short-draft", "off"]))
        if args.short_draft and n >= 2:
            servers.append((f"L={n} short draft", ["--drafter", drafter],
                            [*own, d + "debug-draft-len", str(n), d + "debug-short-draft", "on"]))
    if args.plain_verify:
        servers.append(("L=1 (verify forward)", ["--drafter", drafter],
                        [*own, d + "debug-draft-len", "1", d + "debug-plain-decode", "off"]))
    gaps: dict[str, dict[int, float]] = {}
    ar_gaps: dict[int, list[float]] = {}
    cost: dict[str, dict[int, float]] = {}
    texts: dict[str, dict[int, list[str]]] = {}

    def measure(name: str, server, c: int) -> float:
        point = run_point(server.url, mixed_prompts(c), c, args.max_tokens)
        texts.setdefault(name, {})[c] = point["texts"]
        print(json.dumps({"server": name, **{k: v for k, v in point.items() if k != "texts"}}),
              flush=True)
        return point["itl_mean_ms"]

    with start_server("cost-ar", ["--no-speculation", "--dtype", args.dtype],
                      threads=args.threads) as ar:
        one_request(ar.url, "Hello!", 8)  # warm-up
        for name, flags, options in servers:
            with start_server(f"cost-{name}", flags + ["--dtype", args.dtype], options,
                              threads=args.threads) as server:
                one_request(server.url, "Hello!", 8)
                for i, c in enumerate(args.concurrency):
                    if i % 2 == 0:
                        step, gap = measure("ar", ar, c), measure(name, server, c)
                    else:
                        gap, step = measure(name, server, c), measure("ar", ar, c)
                    gaps.setdefault(name, {})[c] = gap
                    ar_gaps.setdefault(c, []).append(step)
                    cost.setdefault(name, {})[c] = round(gap / step, 3)
    gaps["ar"] = {c: round(statistics.median(g), 2) for c, g in ar_gaps.items()}
    # greedy: every server must produce AR's text (a cheap losslessness check of the run)
    differ = [f"{name} c={c}" for name, row in texts.items() for c, t in row.items()
              if t != texts["ar"][c]]

    RESULTS.mkdir(exist_ok=True)
    out = {"provenance": prov, "max_tokens": args.max_tokens, "dtype": args.dtype,
           "drafter": drafter, "gap_ms": gaps, "ar_gap_ms_runs": ar_gaps,
           "cost_vs_ar_step": cost,
           "text_differs_from_ar": differ}
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = [f"## Round cost in plain decode steps ({args.dtype}, {args.max_tokens} tokens)", "",
             provenance.markdown_header(prov), f"- drafter: `{drafter}`", "",
             "| L \\ concurrency | " + " | ".join(map(str, args.concurrency)) + " |",
             "|---|" + "---|" * len(args.concurrency),
             "| AR step (ms, median) | "
             + " | ".join(f"{gaps['ar'][c]:.1f}" for c in args.concurrency) + " |"]
    for name, row in cost.items():
        lines.append(f"| {name} | " + " | ".join(str(row[c]) for c in args.concurrency) + " |")
    same = "yes, at every point" if not differ else "NO: " + ", ".join(differ)
    lines += ["", f"Greedy output equal to AR's: {same}"]
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
