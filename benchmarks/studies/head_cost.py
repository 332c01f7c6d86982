"""Time the draft-side rollout (base logits + head chain) by head dtype, candidate pool and batch.

Off-server micro-benchmark of `greedy_rollout` with the shipped drafter's head and the target's
embedding / lm_head: what one DOMINO round spends between the backbone pass and verification.
The backbone states z are random (timing does not depend on their values). "head off" is the
backbone-only chain (one lm_head GEMM + argmax), the floor every head setting is compared with.
The worker's defaults (fp32 head on CPU, pool 2048) come from this table.

    OMP_NUM_THREADS=1 python benchmarks/studies/head_cost.py --block 16 --batch 1 8
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # provenance, ..
import provenance  # noqa: E402

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"  # study outputs


def timed_ms(repeats: int, fn, *args, **kwargs) -> float:
    """Median wall time of fn(*args, **kwargs) over `repeats` calls, after one warm-up call."""
    fn(*args, **kwargs)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args, **kwargs)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--pools", nargs="+", type=int, default=[0, 256, 2048])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="head_cost")
    args = ap.parse_args()
    if args.block < 2 or min(args.batch) < 1 or min(args.pools) < 0 or args.repeats < 1:
        ap.error("--block >= 2, --batch >= 1, --pools >= 0, --repeats >= 1")
    torch.set_num_threads(args.threads)

    from safetensors.torch import load_file

    from domino_sglang.model.config import load_draft_config
    from domino_sglang.model.drafter import DominoDrafter
    from domino_sglang.paths import shipped_drafter_dir, target_dir
    from domino_sglang.spec.rollout import HeadParams, greedy_rollout

    prov = provenance.collect()
    conf = load_draft_config(shipped_drafter_dir(), args.block)
    target: dict[str, torch.Tensor] = {}
    for f in sorted(target_dir().glob("*.safetensors")):
        target.update(load_file(str(f)))
    embed_w = target["model.embed_tokens.weight"].to(torch.bfloat16)  # [V, H]
    lm_head = target.get("lm_head.weight", embed_w).to(torch.bfloat16)  # tied in SmolLM2
    embed = torch.nn.Embedding.from_pretrained(embed_w)
    gen = torch.Generator().manual_seed(0)

    rows = []
    for bs in args.batch:
        z = torch.randn(bs, args.block, conf.hidden_size, generator=gen).to(torch.bfloat16)
        bonus = torch.randint(0, conf.vocab_size, (bs,), generator=gen)
        settings = [("head off", torch.bfloat16, 0, False)] + [
            (f"{str(dt).split('.')[-1]} head, pool {k or 'full'}", dt, k, True)
            for dt in (torch.bfloat16, torch.float32) for k in args.pools]
        for label, dtype, pool, use_head in settings:
            head = HeadParams.of(DominoDrafter.from_pretrained(conf, dtype=torch.bfloat16),
                                 embed, lm_head, dtype)
            ms = timed_ms(args.repeats, greedy_rollout, z, bonus, head, pool, use_head=use_head)
            rows.append({"batch": bs, "setting": label, "ms": round(ms, 2)})
            print(json.dumps(rows[-1]), flush=True)

    RESULTS.mkdir(exist_ok=True)
    out = {"provenance": prov, "block": args.block, "threads": args.threads, "rows": rows}
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=2) + "\n")
    floor = {r["batch"]: r["ms"] for r in rows if r["setting"] == "head off"}
    lines = [f"## Draft rollout time per round (block {args.block}, median of {args.repeats})",
             "", provenance.markdown_header(prov), "",
             "| batch | setting | ms | head's share (ms over head off) |", "|---|---|---|---|"]
    lines += [f"| {r['batch']} | {r['setting']} | {r['ms']} | {r['ms'] - floor[r['batch']]:.1f} |"
              for r in rows]
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
