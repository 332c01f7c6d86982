"""bf16 attention of the CPU backend, the native kernel (cpu/native.c) against the torch path it
replaces for decode and verify batches: `paged_attention` over keys the forward has just stored
in the pool (as the served backend runs it), one layer of SmolLM2-135M's shape (9 query / 3 KV
heads of 64) with KV slots scattered over a 65,536-slot pool; microseconds per layer, median of
the repeats, the variants interleaved.

    OMP_NUM_THREADS=1 python benchmarks/studies/native_attention.py --repeats 30
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # provenance
import provenance  # noqa: E402

from domino_sglang.cpu import native  # noqa: E402
from domino_sglang.cpu.attention import build_plan, paged_attention  # noqa: E402

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"  # study outputs
SLOTS, HQ, HKV, D = 65536, 9, 3, 64
CASES = [  # (label, batch size, prefix range, new tokens per request)
    ("decode, one request, 300 keys", 1, (300, 301), 1),
    ("decode, one request, 1,000 keys", 1, (1000, 1001), 1),
    ("verify 4, one request", 1, (300, 301), 4),
    ("verify 16, one request", 1, (300, 301), 16),
    ("decode, 8 chat requests", 8, (60, 200), 1),
    ("verify 4, 8 chat requests", 8, (60, 200), 4),
]


def case_inputs(bs: int, prefix_range: tuple[int, int], new: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(*prefix_range, (bs,), generator=g)
    lens = torch.full((bs,), new)
    slots = torch.randperm(SLOTS, generator=g)
    r2t = torch.zeros(bs, int(prefix.max()), dtype=torch.int32)
    used = 0
    for b, p in enumerate(prefix.tolist()):
        r2t[b, :p] = slots[used:used + p].to(torch.int32)
        used += p
    new_slots = slots[used:used + bs * new]
    k_cache = torch.randn(SLOTS, HKV, D, generator=g).bfloat16()
    v_cache = torch.randn(SLOTS, HKV, D, generator=g).bfloat16()
    q = torch.randn(bs * new, HQ, D, generator=g).bfloat16()
    plan = build_plan(r2t, torch.arange(bs), prefix, lens, new_slots=new_slots)
    k_new, v_new = k_cache[new_slots], v_cache[new_slots]
    return q, k_new, v_new, k_cache, v_cache, plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", default="native_attention")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not native.available():
        sys.exit(f"native_attention: no native kernels here: {native.unavailable_reason()}")
    rows = []
    for label, bs, prefix_range, new in CASES:
        q, k_new, v_new, k_cache, v_cache, plan = case_inputs(bs, prefix_range, new)
        times: dict[str, list[float]] = {"native": [], "torch": []}
        outs = {}
        for _ in range(args.repeats + 1):
            for name, on in (("native", True), ("torch", False)):
                available = native.available
                native.available = (lambda: True) if on else (lambda: False)  # noqa: B023
                try:
                    start = time.perf_counter()
                    outs[name] = paged_attention(q, k_new, v_new, k_cache, v_cache, plan,
                                                 plan.causal_mask, 0.125, keys_written=True)
                    times[name].append((time.perf_counter() - start) * 1e6)
                finally:
                    native.available = available
        err = float((outs["native"].float() - outs["torch"].float()).abs().max())
        med = {k: statistics.median(v[1:]) for k, v in times.items()}
        rows.append({"case": label, "bs": bs, "new": new, "native_us": round(med["native"], 1),
                     "torch_us": round(med["torch"], 1), "max_abs_diff": float(f"{err:.2g}")})
    prov = provenance.collect()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(
        {"provenance": prov, "repeats": args.repeats, "rows": rows}, indent=2) + "\n")
    lines = ["## bf16 attention per layer, native kernel vs torch (us, median)", "",
             provenance.markdown_header(prov), "",
             "| case | native | torch (bmm) | torch / native | max abs diff |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['native_us']} | {r['torch_us']} | "
                     f"{r['torch_us'] / r['native_us']:.2f}x | {r['max_abs_diff']} |")
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
