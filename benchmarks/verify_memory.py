"""Peak memory and time of one sampled verify (spec/verify.py verify_mixed) at a served shape:
top-k / top-p over the whole sorted vocabulary against over the TOP_K_BOUND most likely tokens
(sampling.process_logits with `top_k_bounded`, what a round of requests whose top_k is at most
TOP_K_BOUND takes).

Each variant runs in its own process (one torch thread): the verify's inputs are built (the
target's verify logits [bs, B, V] and the draft distributions q [bs, B-1, V], float32), then
the process's peak resident memory is read before and after the verify
(getrusage ru_maxrss): the difference is what the verify itself allocated at its peak, above
its inputs (glibc serves tensors this large from mmap, so freed ones leave the resident set).
Sampling: Qwen3's generation defaults (temperature 0.6, top-k 20, top-p 0.95) on every row.

    python benchmarks/verify_memory.py --bs 48 --block 16 --vocab 151936
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def peak_rss() -> int:
    """The process's peak resident memory so far, bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def one(bs: int, block: int, vocab: int, bounded: bool, repeats: int) -> dict:
    """One variant, in this process: peak bytes above the inputs, median seconds."""
    import torch

    from domino_sglang.spec.sampling import RoundUniforms, SamplingRows
    from domino_sglang.spec.verify import verify_mixed

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(bs, block, vocab, generator=g)  # [bs, B, V]
    q = torch.softmax(3 * torch.randn(bs, block - 1, vocab, generator=g), dim=-1)  # [bs, B-1, V]
    chain = torch.randint(0, vocab, (bs, block), generator=g)
    full = lambda v, dt: torch.full((bs,), v, dtype=dt)  # noqa: E731
    rows = SamplingRows(full(0.6, torch.float32), full(20, torch.int64), full(0.95, torch.float32),
                        full(0.0, torch.float32), torch.arange(bs), need_sort=True,
                        need_min_p=False, has_greedy=True, top_k_bounded=bounded)
    u = RoundUniforms.for_round(rows.seed, torch.full((bs,), 100), block)
    before = peak_rss()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        tokens, lens = verify_mixed(chain, logits, q, rows, u)
        times.append(time.perf_counter() - t0)
    return {"peak_bytes_above_inputs": peak_rss() - before, "seconds": statistics.median(times),
            "inputs_bytes": (logits.numel() + q.numel()) * 4,
            "accepted_mean": float(lens.float().mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bs", type=int, default=48)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="verify_memory")
    ap.add_argument("--variant", choices=["sort", "bounded"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.variant:  # the child: one variant, its figures as JSON on stdout
        print(json.dumps(one(args.bs, args.block, args.vocab, args.variant == "bounded",
                             args.repeats)))
        return
    prov = provenance.collect()
    shape = ["--bs", str(args.bs), "--block", str(args.block), "--vocab", str(args.vocab),
             "--repeats", str(args.repeats)]
    found = {}
    for variant in ("sort", "bounded"):
        out = subprocess.run([sys.executable, __file__, "--variant", variant, *shape],
                             capture_output=True, text=True, check=True,
                             env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
        found[variant] = json.loads(out.stdout.strip().splitlines()[-1])
        print(variant, found[variant], flush=True)
    sort, bounded = found["sort"], found["bounded"]
    result = {**prov, "bs": args.bs, "block": args.block, "vocab": args.vocab, "variants": found,
              "peak_ratio": bounded["peak_bytes_above_inputs"] / sort["peak_bytes_above_inputs"],
              "time_ratio": bounded["seconds"] / sort["seconds"]}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(result, indent=1) + "\n")
    gb = 2**30
    lines = [f"## A sampled verify's peak memory: bs {args.bs}, B {args.block}, V {args.vocab}",
             "", provenance.markdown_header(prov),
             "- float32 inputs (verify logits and q) of "
             f"{sort['inputs_bytes'] / gb:.2f} GiB; Qwen3's sampling defaults on every row; "
             "one torch thread; peak = the process's resident high-water mark above the inputs",
             "", "| top-k / top-p | peak above the inputs | verify time |", "|---|---|---|",
             f"| whole-vocabulary sort | {sort['peak_bytes_above_inputs'] / gb:.2f} GiB | "
             f"{sort['seconds'] * 1e3:.0f} ms |",
             f"| over the TOP_K_BOUND most likely tokens | "
             f"{bounded['peak_bytes_above_inputs'] / gb:.2f} GiB | "
             f"{bounded['seconds'] * 1e3:.0f} ms |", "",
             f"Bounded / sort: peak {result['peak_ratio']:.2f}x, time {result['time_ratio']:.2f}x.",
             ""]
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
