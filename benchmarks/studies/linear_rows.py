"""bf16 linears by input rows, the project's kernel against oneDNN's: a forward's worth of
SmolLM2-135M's linears (30 layers of q/k/v, o, gate/up, down, then the lm_head) over a few
input rows, run by the bf16 kernel (cpu/native.c, as cpu/linear.py's packed_linear runs a bf16
weight where the kernel builds) and by oneDNN's packed bf16 linear (packed_linear's fallback,
2 rows run as 4), with the weights cold in cache (each weight read once per pass, as in a
forward). Repeats interleave the variants so the machine's drift hits them alike; reported: the
median pass in ms.

    OMP_NUM_THREADS=1 python benchmarks/studies/linear_rows.py --repeats 15
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # provenance, ..
import provenance  # noqa: E402

from domino_sglang.cpu import linear, native  # noqa: E402

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"  # study outputs

# SmolLM2-135M: hidden 576, 9 query / 3 KV heads of 64, MLP 1536, vocabulary 49,152
LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # [N, K] per layer
HEAD_SHAPE, LAYERS = (49152, 576), 30


def forward_pass(weights: list, head, rows: int, variant: int) -> float:
    """ms of one pass over every weight with `rows` input rows, each weight's pack number
    `variant` run through packed_linear."""
    xs = {k: torch.randn(rows, k, dtype=torch.bfloat16) for k in (576, 1536)}
    start = time.perf_counter()
    for layer in weights:
        for (_, k), packs in zip(LAYER_SHAPES, layer):
            linear.packed_linear(xs[k], packs[variant])
    linear.packed_linear(xs[576], head[variant])
    return (time.perf_counter() - start) * 1e3


def both_packs(weight: torch.Tensor) -> tuple:
    """(the kernel's pack, oneDNN's pack) of one bf16 weight."""
    return native.pack(weight), linear.onednn_pack(weight)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6, 8, 16, 32])
    ap.add_argument("--out", default="linear_rows")
    args = ap.parse_args()
    if args.repeats < 2:
        ap.error("--repeats must be >= 2")
    torch.set_num_threads(1)
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        sys.exit("linear_rows: oneDNN bf16 linears are not available on this machine")
    if not native.available():
        sys.exit(f"linear_rows: the bf16 kernel is not available: {native.unavailable_reason()}")
    weights = [[both_packs(torch.randn(n, k, dtype=torch.bfloat16) * 0.02)
                for n, k in LAYER_SHAPES] for _ in range(LAYERS)]
    head = both_packs(torch.randn(*HEAD_SHAPE, dtype=torch.bfloat16) * 0.02)
    variants = {"bf16 kernel": 0, "oneDNN": 1}
    times = {(r, v): [] for r in args.rows for v in variants}
    for _ in range(args.repeats):
        for rows in args.rows:
            for name, index in variants.items():
                times[(rows, name)].append(forward_pass(weights, head, rows, index))
    prov = provenance.collect()
    rows_out = [{"rows": r, "variant": v, "median_ms": round(statistics.median(t[1:]), 2),
                 "min_ms": round(min(t), 2)} for (r, v), t in times.items()]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(
        {"provenance": prov, "repeats": args.repeats, "rows": rows_out}, indent=2) + "\n")
    lines = ["## bf16 linears by input rows (one forward's weights, cold, ms)", "",
             provenance.markdown_header(prov), "",
             "| rows | bf16 kernel (median / min) | oneDNN packed (median / min) "
             "| oneDNN / kernel |",
             "|---|---|---|---|"]
    for r in args.rows:
        a, b = (next(x for x in rows_out if x["rows"] == r and x["variant"] == v)
                for v in variants)
        lines.append(f"| {r} | {a['median_ms']} / {a['min_ms']} | {b['median_ms']} / "
                     f"{b['min_ms']} | {b['median_ms'] / a['median_ms']:.2f}x |")
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
