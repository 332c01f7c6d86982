"""Where a served decode round's time goes on the CPU, plain decoding and DOMINO, by stage.

Each server runs with benchmarks/profile_site on its PYTHONPATH: its sitecustomize.py times
every decode round in SGLang's scheduler process by stage (DOMINO: plan, open chain, draft
pass, head rollout, copy index, lookup, verify forward, logits processing, accept, commit,
draft context, observe; plain: the target forward and the sample) and, every few rounds
instead, counts the torch ops each stage dispatches. At each concurrency c, 2c chat requests
(c at a time, ignore_eos) run against the server; the rounds at batch size c are tabulated:
mean ms per round and share of the round's cost, where the cost counts the scheduler's own
time between two rounds (its batch bookkeeping and output processing; a gap with a prefill in
it is the prefill's, not counted). The client's time per
round (the point's wall time / its rounds) adds what the tokenizer and detokenizer processes
cost on the same 2 cores. Beside each table: the target's bare transformers forward at the same
batch and width (width 1: a plain step; DOMINO: its median verified L), timed and op-counted in
this process, with the server's dtype and one thread.

    python benchmarks/round_profile.py --concurrency 1 8
    python benchmarks/round_profile.py --concurrency 1 --draft-len 4 --out round_profile_l4
(--draft-len: DOMINO's rounds pinned to L, --speculative-domino-debug-draft-len, so its draft
rounds are profiled however rarely the adaptive policy would draft; --tree-width K adds DOMINO
with draft trees, `--speculative-domino-tree-width K`, whose stages add the tree's growth, mask,
acceptance and settling)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
from serving import RESULTS, mixed_prompts, run_point  # noqa: E402

from domino_sglang.cli.local_server import start_server, stop_servers_on_sigterm  # noqa: E402
from domino_sglang.cpu.dtype import default_cpu_dtype  # noqa: E402

SITE = Path(__file__).resolve().parent / "profile_site"
METHODS = {"plain decoding": ["--no-speculation"], "DOMINO (served default)": []}


def bare_forward(dtype: str, bs: int, width: int, context: int = 256, repeats: int = 20
                 ) -> tuple[float, int]:
    """(ms, torch ops) of the target's transformers forward over [bs, width] new tokens after a
    cached context of `context` tokens, one thread."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import AutoModelForCausalLM, DynamicCache

    from domino_sglang.paths import target_dir

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(str(target_dir()), dtype=getattr(torch, dtype))
    model.eval()
    ids = torch.randint(0, model.config.vocab_size, (bs, context + width))
    with torch.inference_mode():
        cache = DynamicCache()
        model(input_ids=ids[:, :context], past_key_values=cache, use_cache=True)

        def step():
            model(input_ids=ids[:, context:], past_key_values=cache, use_cache=True)
            cache.crop(context)

        step()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)

        class Count(TorchDispatchMode):
            n = 0

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                Count.n += 1
                return func(*args, **(kwargs or {}))

        with Count():
            step()
    return statistics.median(times), Count.n


def summarise(rounds: list[dict], bs: int) -> dict[str, dict]:
    """Per round kind at batch size bs: timed rounds' mean ms per stage (+ the gap before a
    round, the scheduler's), counted rounds' mean ops per stage, the rounds and their L."""
    out: dict[str, dict] = {}
    for kind in sorted({r["kind"] for r in rounds if r["bs"] == bs}):
        mine = [r for r in rounds if r["bs"] == bs and r["kind"] == kind]
        timed = [r for r in mine if not r["counting"]]
        counted = [r for r in mine if r["counting"]]
        if not timed:
            continue
        ms: dict[str, float] = defaultdict(float)
        for r in timed:
            for name, v in r["stages"].items():
                ms[name] += v / len(timed)
        gaps = [r["gap_ms"] for r in timed if r["gap_ms"] is not None]
        ms["scheduler between rounds"] = statistics.fmean(gaps) if gaps else 0.0
        ops: dict[str, float] = defaultdict(float)
        for r in counted:
            for name, v in r["ops"].items():
                ops[name] += v / len(counted)
        out[kind] = {"rounds": len(mine), "ms": dict(ms), "ops": dict(ops),
                     "L": statistics.median(r["L"] for r in mine)}
    return out


def main() -> None:
    stop_servers_on_sigterm()  # a SIGTERM stops the servers this run started
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dtype", default=default_cpu_dtype())
    ap.add_argument("--draft-len", type=int, default=None,
                    help="pin DOMINO's L (default: the served default's adaptive policy)")
    ap.add_argument("--tree-width", type=int, default=None,
                    help="also profile DOMINO with draft trees of this width (with --draft-len: "
                         "every round a tree of L tokens)")
    ap.add_argument("--out", default="round_profile")
    args = ap.parse_args()
    methods = dict(METHODS)
    if args.draft_len is not None:
        methods[f"DOMINO, L = {args.draft_len}"] = [
            "--", "--speculative-domino-debug-draft-len", str(args.draft_len)]
        del methods["DOMINO (served default)"]
    if args.tree_width is not None:
        pinned = ([] if args.draft_len is None
                  else ["--speculative-domino-debug-draft-len", str(args.draft_len)])
        methods[f"DOMINO with trees of width {args.tree_width}"] = [
            "--", *pinned, "--speculative-domino-tree-width", str(args.tree_width)]
    prov = provenance.collect()
    results: dict = {}
    for method, flags in methods.items():
        log = Path(tempfile.mkdtemp()) / "rounds.jsonl"
        env = {"PYTHONPATH": str(SITE), "DOMINO_PROFILE_OUT": str(log)}
        if method == "plain decoding":
            env["DOMINO_PROFILE_PLAIN"] = "1"
        cut = flags.index("--") if "--" in flags else len(flags)
        server = start_server("round-profile", [*flags[:cut], "--dtype", args.dtype],
                              sglang_args=flags[cut + 1:], env=env)
        try:
            run_point(server.url, mixed_prompts(2), 1, 16)  # warm-up, not recorded
            for c in args.concurrency:
                seen = len(log.read_text().splitlines()) if log.exists() else 0
                point = run_point(server.url, mixed_prompts(2 * c), c, args.max_tokens)
                records = [json.loads(x) for x in log.read_text().splitlines()[seen:]]
                rounds = [r for r in records if not r.get("prefill")]
                prefills = [r for r in records if r.get("prefill")]
                results[(method, c)] = {
                    "point": point, "kinds": summarise(rounds, c), "rounds": len(rounds),
                    "decode_ms": sum(r["round_ms"] + (r["gap_ms"] or 0.0) for r in rounds
                                     if not r["counting"]),
                    "timed_rounds": sum(not r["counting"] for r in rounds),
                    "prefills": len(prefills), "prefill_ms": sum(r["ms"] for r in prefills),
                    "prefill_tokens": sum(r["tokens"] for r in prefills)}
        finally:
            server.stop()
    lines = ["## Where a served round's time goes (CPU)", "", provenance.markdown_header(prov),
             f"- dtype {args.dtype}, one torch thread per server, {args.max_tokens} tokens per "
             f"request, 2c requests c at a time; ms are means over the rounds at batch size c, "
             "ops the mean torch ops dispatched (counted on every 4th round, not timed); "
             "the scheduler's time between rounds leaves out the gaps a prefill ran in", ""]
    bare_cache: dict = {}
    for (method, c), res in results.items():
        point = res["point"]
        per_round = 1e3 * point["wall_s"] / max(res["rounds"], 1)
        lines += [f"### {method}, c = {c} ({point['output_tok_s']} tok/s; client: "
                  f"{per_round:.1f} ms per round end to end, {res['rounds']} rounds)", "",
                  f"In the scheduler: {res['prefills']} prefills of {res['prefill_tokens']} "
                  f"tokens in all, {res['prefill_ms']:.0f} ms; decode rounds at any batch size "
                  f"{res['decode_ms'] / max(res['timed_rounds'], 1):.1f} ms each with the gap "
                  f"before them (timed rounds only: {res['timed_rounds']}).", ""]
        for kind, k in res["kinds"].items():
            total = sum(k["ms"].values())
            lines += [f"{kind} rounds at bs {c} ({k['rounds']}, median L {k['L']:g}): "
                      f"{total:.1f} ms per round in the scheduler", "",
                      "| stage | ms | share | torch ops |", "|---|---|---|---|"]
            for name, ms in sorted(k["ms"].items(), key=lambda kv: -kv[1]):
                ops = k["ops"].get(name)
                lines.append(f"| {name} | {ms:.2f} | {ms / total:.1%} | "
                             f"{'' if ops is None else f'{ops:.0f}'} |")
            width = int(k["L"])
            key = (c, width)
            if key not in bare_cache:
                bare_cache[key] = bare_forward(args.dtype, c, width)
            bare_ms, bare_ops = bare_cache[key]
            lines += ["", f"Bare transformers forward of the target, bs {c} x width {width} "
                          f"after 256 cached tokens: {bare_ms:.2f} ms, {bare_ops} torch ops.", ""]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    (RESULTS / f"{args.out}.json").write_text(json.dumps(
        {"provenance": prov, "results": {f"{m} c={c}": r for (m, c), r in results.items()},
         "bare": {f"bs{c} w{w}": v for (c, w), v in bare_cache.items()}}, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
