"""Cost of one layer of the CPU attention backend (domino_sglang/cpu/attention.py) per forward.

Times `paged_attention` (per request, exact keys) against the padded batched layout it replaced
(every request padded to the batch's longest prefix, one SDPA call with a ragged bool mask), on
SmolLM2-135M's attention shape (9 query / 3 KV heads, head dim 64) with KV slots scattered over a
65,536-slot pool, for decode and verify batches. Checks both give the same output first.

    OMP_NUM_THREADS=1 python benchmarks/studies/attention_cost.py
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import torch
from torch.nn.functional import scaled_dot_product_attention

from domino_sglang.cpu.attention import build_plan, paged_attention

SLOTS, HQ, HKV, D = 65536, 9, 3, 64
CASES = [  # (label, batch size, prefix range, new tokens per request)
    ("decode, long prompts (regeneration)", 64, (50, 770), 1),
    ("decode, chat prompts", 32, (60, 200), 1),
    ("decode, chat prompts", 4, (60, 200), 1),
    ("decode, one request", 1, (300, 301), 1),
    ("verify 16, one request", 1, (300, 301), 16),
    ("verify 16, chat prompts", 16, (60, 200), 16),
]


def padded_attention(q, k_new, v_new, k_cache, v_cache, r2t, prefix, new, scaling):
    """The replaced layout: pad to [bs, Pmax + Qmax], one SDPA call, causal ragged mask."""
    bs, p_max, q_max = prefix.shape[0], int(prefix.max()), int(new.max())
    pos, qpos = torch.arange(p_max), torch.arange(q_max)
    prefix_ok = pos[None, :] < prefix[:, None]  # [bs, Pmax]
    locs = torch.where(prefix_ok, r2t[:, :p_max].long(), 0)
    valid = qpos[None, :] < new[:, None]  # [bs, Qmax]
    index = torch.where(valid, (torch.cumsum(new, 0) - new)[:, None] + qpos[None, :], 0)
    causal = (qpos[:, None] >= qpos[None, :])[None] & valid[:, None, :]  # [bs, Qmax, Qmax]
    mask = torch.cat([prefix_ok[:, None, :].expand(bs, q_max, p_max), causal], 2)[:, None]
    keys = torch.cat([k_cache[locs], k_new[index]], 1).transpose(1, 2)
    vals = torch.cat([v_cache[locs], v_new[index]], 1).transpose(1, 2)
    out = scaled_dot_product_attention(q[index].transpose(1, 2), keys, vals, attn_mask=mask,
                                       scale=scaling, enable_gqa=True)
    return out.transpose(1, 2)[valid]


def time_ms(fn, reps: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    k_cache = torch.randn(SLOTS, HKV, D, generator=g).to(dtype)
    v_cache = torch.randn(SLOTS, HKV, D, generator=g).to(dtype)
    print(f"threads {torch.get_num_threads()}, {args.dtype}; ms per layer, padded -> per request")
    for label, bs, (lo, hi), n in CASES:
        prefix = torch.randint(lo, hi, (bs,), generator=g)
        new = torch.full((bs,), n)
        r2t = torch.zeros(bs, hi, dtype=torch.int32)
        slots = torch.randperm(SLOTS, generator=g)
        for b in range(bs):
            r2t[b, : prefix[b]] = slots[b * hi : b * hi + int(prefix[b])].int()
        q = torch.randn(bs * n, HQ, D, generator=g).to(dtype)
        k_new = torch.randn(bs * n, HKV, D, generator=g).to(dtype)
        v_new = torch.randn(bs * n, HKV, D, generator=g).to(dtype)
        plan = build_plan(r2t, torch.arange(bs), prefix, new)
        ours = partial(paged_attention, q, k_new, v_new, k_cache, v_cache, plan,
                       plan.causal_mask, 0.125)
        padded = partial(padded_attention, q, k_new, v_new, k_cache, v_cache, r2t, prefix, new,
                         0.125)
        torch.testing.assert_close(ours().float(), padded().float(), atol=2e-2, rtol=0)
        t_pad, t_ours = time_ms(padded, args.reps), time_ms(ours, args.reps)
        print(f"{label:38s} bs {bs:2d}, prefix {lo}..{hi - 1}, new {n:2d}: "
              f"{t_pad:7.2f} -> {t_ours:6.2f} ms ({t_pad / t_ours:.1f}x)")


if __name__ == "__main__":
    main()
