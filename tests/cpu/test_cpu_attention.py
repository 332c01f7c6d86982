"""The CPU attention backend's batched paths against a plain per-request SDPA reference.

Covers ragged prefixes and new-token counts (EXTEND / DECODE / TARGET_VERIFY chains), the
non-causal block a parallel drafter needs, tree masks in both SGLang layouts, GQA, scattered
(paged) KV slots, bf16 and fp32. Tolerances: fp32 atol 1e-5; bf16 atol 2e-2 (one bf16 ulp at the
output scale, the reference runs the same bf16 SDPA per request).
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.functional import scaled_dot_product_attention

from domino_sglang.cpu.attention import build_plan, paged_attention

torch.set_num_threads(1)
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _make_batch(prefix_lens, new_lens, hq=6, hkv=2, d=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    bs = len(prefix_lens)
    slots = 512
    k_cache = torch.randn(slots, hkv, d, generator=g).to(dtype)
    v_cache = torch.randn(slots, hkv, d, generator=g).to(dtype)
    # Paged KV: every request's prefix lives at scattered, disjoint slots.
    perm = torch.randperm(slots, generator=g)
    req_to_token = torch.zeros(bs + 3, 128, dtype=torch.int32)
    req_pool_indices = torch.tensor([3 + i for i in range(bs)][::-1], dtype=torch.int64) - 3
    used = 0
    for b, p in enumerate(prefix_lens):
        req_to_token[req_pool_indices[b], :p] = perm[used : used + p].to(torch.int32)
        used += p
    t = sum(new_lens)
    q = torch.randn(t, hq, d, generator=g).to(dtype)
    k_new = torch.randn(t, hkv, d, generator=g).to(dtype)
    v_new = torch.randn(t, hkv, d, generator=g).to(dtype)
    return q, k_new, v_new, k_cache, v_cache, req_to_token, req_pool_indices


def _reference(q, k_new, v_new, k_cache, v_cache, req_to_token, rpi, prefix_lens, new_lens,
               inner_masks, prefix_masks=None):
    """Per-request SDPA over explicitly gathered keys. inner_masks[b]: [N_b, N_b] bool."""
    outs, start = [], 0
    for b, (p, n) in enumerate(zip(prefix_lens, new_lens)):
        locs = req_to_token[rpi[b], :p].long()
        keys = torch.cat([k_cache[locs], k_new[start : start + n]])  # [p + n, Hkv, D]
        vals = torch.cat([v_cache[locs], v_new[start : start + n]])
        pm = torch.ones(n, p, dtype=torch.bool) if prefix_masks is None else prefix_masks[b]
        mask = torch.cat([pm, inner_masks[b]], dim=1)  # [n, p + n]
        o = scaled_dot_product_attention(
            q[start : start + n].transpose(0, 1)[None],
            keys.transpose(0, 1)[None],
            vals.transpose(0, 1)[None],
            attn_mask=mask[None, None],
            scale=0.25,
            enable_gqa=True,
        )[0].transpose(0, 1)
        outs.append(o)
        start += n
    return torch.cat(outs)


CASES = {
    "extend_ragged": ([0, 5, 17, 3], [7, 1, 4, 9]),
    "decode": ([4, 31, 1, 12, 7], [1, 1, 1, 1, 1]),
    "verify_chain_b4": ([10, 3, 25], [4, 4, 4]),
    "verify_chain_b16": ([6, 40], [16, 16]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("non_causal", [False, True])
def test_batched_matches_per_request_reference(case, dtype, non_causal):
    prefix_lens, new_lens = CASES[case]
    q, kn, vn, kc, vc, r2t, rpi = _make_batch(prefix_lens, new_lens, dtype=dtype)
    plan = build_plan(r2t, rpi, torch.tensor(prefix_lens), torch.tensor(new_lens))
    mask = plan.block_mask if non_causal else plan.causal_mask
    out = paged_attention(q, kn, vn, kc, vc, plan, mask, scaling=0.25)
    inner = [
        torch.ones(n, n, dtype=torch.bool) if non_causal else torch.ones(n, n).tril().bool()
        for n in new_lens
    ]
    ref = _reference(q, kn, vn, kc, vc, r2t, rpi, prefix_lens, new_lens, inner)
    assert out.shape == ref.shape == (sum(new_lens), 6, 16)
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype], rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("kernel", ["torch", "native"])
def test_keys_written_to_the_cache_read_back_in_one_gather(case, dtype, kernel, monkeypatch):
    """A forward that stores its new K/V before attending (the backend does) reads every key of
    a request from the cache in one gather: the same numbers as attending over the cached prefix
    and the new K/V passed in. In bf16 the native kernel reads them in place from the pool where
    it runs (its own fp32 sums: equal within a bf16 step)."""
    from domino_sglang.cpu import native

    if kernel == "native" and (dtype != torch.bfloat16 or not native.available()):
        pytest.skip("the native attention runs bf16, where the kernels build")
    if kernel == "torch":
        monkeypatch.setattr(native, "available", lambda: False)
    prefix_lens, new_lens = CASES[case]
    q, kn, vn, kc, vc, r2t, rpi = _make_batch(prefix_lens, new_lens, dtype=dtype)
    taken = {int(s) for b, p in enumerate(prefix_lens) for s in r2t[rpi[b], :p]}
    slots = torch.tensor([s for s in range(kc.shape[0]) if s not in taken][: sum(new_lens)])
    slots = slots[torch.randperm(len(slots), generator=torch.Generator().manual_seed(1))]
    kc[slots], vc[slots] = kn, vn
    plan = build_plan(r2t, rpi, torch.tensor(prefix_lens), torch.tensor(new_lens),
                      new_slots=slots)
    for mask in (plan.causal_mask, plan.block_mask):
        passed = paged_attention(q, kn, vn, kc, vc, plan, mask, scaling=0.25)
        read = paged_attention(q, kn * 0, vn * 0, kc, vc, plan, mask, scaling=0.25,
                               keys_written=True)  # the new K/V come from the cache
        if kernel == "torch":
            assert torch.equal(read, passed)
        else:
            torch.testing.assert_close(read.float(), passed.float(), atol=TOL[dtype], rtol=0)


def test_causal_and_block_masks_really_differ():
    """Power check: a non-causal block must change the answer of every query but the last."""
    q, kn, vn, kc, vc, r2t, rpi = _make_batch([5], [8])
    plan = build_plan(r2t, rpi, torch.tensor([5]), torch.tensor([8]))
    causal = paged_attention(q, kn, vn, kc, vc, plan, plan.causal_mask, 0.25)
    block = paged_attention(q, kn, vn, kc, vc, plan, plan.block_mask, 0.25)
    assert not torch.allclose(causal[:-1], block[:-1], atol=1e-3)
    torch.testing.assert_close(causal[-1], block[-1])


@pytest.mark.parametrize("layout", ["qlen_only", "full_mask"])
def test_tree_mask_layouts(layout):
    prefix_lens, n = [7, 2, 11], 5
    new_lens = [n] * 3
    q, kn, vn, kc, vc, r2t, rpi = _make_batch(prefix_lens, new_lens, seed=3)
    g = torch.Generator().manual_seed(1)
    inner = [(torch.rand(n, n, generator=g) > 0.5) | torch.eye(n, dtype=torch.bool)
             for _ in prefix_lens]
    if layout == "qlen_only":
        flat, prefix_masks = torch.cat([m.flatten() for m in inner]), None
    else:
        prefix_masks = [torch.rand(n, p, generator=g) > 0.3 for p in prefix_lens]
        flat = torch.cat([torch.cat([pm, m], 1).flatten() for pm, m in zip(prefix_masks, inner)])
    plan = build_plan(r2t, rpi, torch.tensor(prefix_lens), torch.tensor(new_lens), flat)
    out = paged_attention(q, kn, vn, kc, vc, plan, plan.causal_mask, 0.25)
    ref = _reference(q, kn, vn, kc, vc, r2t, rpi, prefix_lens, new_lens, inner, prefix_masks)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


def test_bad_tree_mask_is_rejected():
    q, kn, vn, kc, vc, r2t, rpi = _make_batch([3], [4])
    with pytest.raises(ValueError, match="custom_mask has 5 entries"):
        build_plan(r2t, rpi, torch.tensor([3]), torch.tensor([4]), torch.ones(5, dtype=torch.bool))
