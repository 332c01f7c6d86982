"""Training's target-feature throughput: one target forward per record (TargetFeatures.__call__)
vs records grouped by length into batched forwards (TargetFeatures.many) at several batch
budgets, on the same records, in one run. Reports records/s, target tokens/s and the ratio.

Target: a tiny random Qwen3-shaped model built here (tests/harness/new_target_fixtures.py; no hub),
or a checkpoint folder (--target). Records: random token sequences of lengths drawn uniformly in
[--min-len, --max-len]. Features in float32 on the CPU (bf16 on CUDA), no cache.

    OMP_NUM_THREADS=1 python benchmarks/studies/train_throughput.py --out train_throughput
    python benchmarks/studies/train_throughput.py --device cuda --target Qwen3-8B --records 256
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import provenance  # noqa: E402
from domino_sglang.train.features import TargetFeatures  # noqa: E402


def make_records(n: int, low: int, high: int, vocab: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"id": i, "ids": [rng.randrange(vocab) for _ in range(rng.randint(low, high))]}
            for i in range(n)]


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", type=Path, default=None, help="a checkpoint folder (default: "
                    "a tiny random Qwen3 built here)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--records", type=int, default=64)
    ap.add_argument("--min-len", type=int, default=64)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--batch-tokens", type=int, nargs="+", default=[1024, 2048, 8192],
                    help="padded tokens per batched forward: one row of the table each")
    ap.add_argument("--layers", type=int, default=8, help="the built target's layers")
    ap.add_argument("--hidden", type=int, default=256, help="the built target's hidden size")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="train_throughput")
    args = ap.parse_args(argv)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    with tempfile.TemporaryDirectory() as tmp:
        target = args.target
        if target is None:
            from tests.harness.new_target_fixtures import make_qwen3_target

            target = make_qwen3_target(Path(tmp) / "target", layers=args.layers,
                                       hidden=args.hidden)
        config = json.loads((Path(target) / "config.json").read_text())
        layers = config["num_hidden_layers"]
        ids = sorted({1, layers // 2, layers - 2})
        feats = TargetFeatures(target, ids, dtype, device=args.device)
        records = make_records(args.records, args.min_len, args.max_len,
                               config["vocab_size"], seed=0)
        tokens = sum(len(r["ids"]) for r in records)
        times: dict[str, list[float]] = {"one record per forward": []}
        for _ in range(args.repeats):  # interleaved: drifts hit every path the same
            times["one record per forward"].append(timed(lambda: [feats(r) for r in records]))
            for n in args.batch_tokens:
                times.setdefault(f"batched by length, <= {n} tokens", []).append(
                    timed(lambda n=n: feats.many(records, max_tokens=n)))
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    rows = {name: med(ts) for name, ts in times.items()}
    one = rows["one record per forward"]
    prov = provenance.collect()
    result = {"provenance": prov, "records": args.records, "tokens": tokens,
              "lengths": [args.min_len, args.max_len], "batch_tokens": args.batch_tokens,
              "target": str(args.target or f"tiny Qwen3 ({args.layers} layers, hidden "
                                                f"{args.hidden})"),
              "device": args.device, "dtype": str(dtype),
              "seconds": rows, "speedup": {k: one / v for k, v in rows.items()}}
    lines = ["## Training features: one forward per record vs batched by length", "",
             provenance.markdown_header(prov),
             f"- target: {result['target']}, {args.device}, {dtype}, feature layers {ids}",
             f"- records: {args.records} of {args.min_len}-{args.max_len} tokens ({tokens} "
             f"tokens), median of {args.repeats} interleaved repeats", "",
             "| path | seconds | records/s | target tokens/s | vs one record |",
             "|---|---|---|---|---|"]
    for name, sec in rows.items():
        lines.append(f"| {name} | {sec:.3f} | {args.records / sec:.1f} | {tokens / sec:.0f} | "
                     f"{one / sec:.2f}x |")
    lines.append("")
    out = ROOT / "benchmarks" / "results" / args.out
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
