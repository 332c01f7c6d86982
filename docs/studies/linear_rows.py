"""oneDNN's packed bf16 linears by row count: a forward's worth of SmolLM2-135M's linears (30
layers of q/k/v, o, gate/up, down, then the lm_head) over 1-6 input rows, as packed_linear runs
them (2 rows run as 4, cpu/linear.py PADDED_ROWS) and unpadded, with the weights cold in cache
(each weight read once per pass, as in a forward). Repeats interleave the variants so the
machine's drift hits them alike; reported: the median pass in ms.

    OMP_NUM_THREADS=1 python docs/studies/linear_rows.py --repeats 15
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # provenance, ..
import provenance  # noqa: E402

from domino_sglang.cpu import linear  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"  # docs/results: study outputs

# SmolLM2-135M: hidden 576, 9 query / 3 KV heads of 64, MLP 1536, vocabulary 49,152
LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # [N, K] per layer
HEAD_SHAPE, LAYERS = (49152, 576), 30


def forward_pass(weights: list, head, rows: int, run) -> float:
    """ms of one pass over every weight with `rows` input rows through `run(x, packed)`."""
    xs = {k: torch.randn(rows, k, dtype=torch.bfloat16) for k in (576, 1536)}
    start = time.perf_counter()
    for layer in weights:
        for (_, k), packed in zip(LAYER_SHAPES, layer):
            run(xs[k], packed)
    run(xs[576], head)
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default="linear_rows")
    args = ap.parse_args()
    if args.repeats < 2:
        ap.error("--repeats must be >= 2")
    torch.set_num_threads(1)
    if linear.pack(torch.randn(8, 8, dtype=torch.bfloat16)) is None:
        sys.exit("linear_rows: oneDNN bf16 linears are not available on this machine")
    weights = [[linear.pack(torch.randn(n, k, dtype=torch.bfloat16) * 0.02)
                for n, k in LAYER_SHAPES] for _ in range(LAYERS)]
    head = linear.pack(torch.randn(*HEAD_SHAPE, dtype=torch.bfloat16) * 0.02)
    variants = {"packed_linear": linear.packed_linear,
                "unpadded": lambda x, p: linear._onednn_linear(x, p, None)}
    times = {(r, v): [] for r in range(1, 7) for v in variants}
    for _ in range(args.repeats):
        for rows in range(1, 7):
            for name, run in variants.items():
                times[(rows, name)].append(forward_pass(weights, head, rows, run))
    prov = provenance.collect()
    rows_out = [{"rows": r, "variant": v, "median_ms": round(statistics.median(t[1:]), 2),
                 "min_ms": round(min(t), 2)} for (r, v), t in times.items()]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(
        {"provenance": prov, "repeats": args.repeats, "rows": rows_out}, indent=2) + "\n")
    lines = ["## Packed bf16 linears by input rows (one forward's weights, cold, ms)", "",
             provenance.markdown_header(prov), "",
             "| rows | packed_linear (median / min) | unpadded oneDNN (median / min) |",
             "|---|---|---|"]
    for r in range(1, 7):
        a, b = (next(x for x in rows_out if x["rows"] == r and x["variant"] == v)
                for v in variants)
        lines.append(f"| {r} | {a['median_ms']} / {a['min_ms']} | {b['median_ms']} / "
                     f"{b['min_ms']} |")
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
