"""Pure-torch paged attention backend for SGLang on CPU, with speculative verification.

SGLang 0.5.23's `torch_native` backend cannot run TARGET_VERIFY, and `intel_amx` needs the CPU
build of sgl-kernel. This backend serves every forward mode a speculative decoder needs:

  EXTEND / MIXED   prefill chunks after a cached prefix, causal
  DECODE           one token per request
  TARGET_VERIFY    a chain (or tree, via the spec input's custom mask) of N draft tokens after the
                   committed prefix; causal inside the chain
  non-causal block layers with `AttentionType.ENCODER_ONLY` see the whole block (the parallel
                   drafter's `[bonus, MASK x (B-1)]` block) plus the prefix

Each request is attended on its own, over exactly its keys: per layer, its cached prefix is
gathered from the KV pool through `req_to_token` straight into a [prefix + new, Hkv, D] buffer,
its new K/V are appended, and one `scaled_dot_product_attention` call runs over it (GQA native,
a bool mask only where one is needed; in bf16 / fp16 two float32 `bmm` calls instead, see
`_attend_fp32`). Where a bf16 forward has just stored its K/V in the pool, the native kernel
(native.c) reads each request's keys and values in place from their slots instead, for a
request of at most 16 new tokens (a decode step, a verify, a short extend; longer prefills keep
the batched matmuls, faster there): one call per request, every query row on its own (a verify
row attends as the plain step's row does). The plan (slots and masks) is built once per
forward and shared by all layers. On a CPU this per-request loop is the fast layout: reading
the KV is what costs (memory-bound), and padding every request to the batch's longest prefix,
as one batched call must, multiplies the bytes read (the padded layout against this one, per
layer: docs/cpu-runtime.md, `attention.py`).

Depends on SGLang internals (imported through sglang_compat.py, which lists them):
`AttentionBackend`, `ForwardBatch` fields (`forward_mode`, `seq_lens`, `extend_prefix_lens`,
`extend_seq_lens`, `req_pool_indices`, `out_cache_loc`, `spec_info.custom_mask`) and the KV
pool's `set_kv_buffer` / `get_key_buffer`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn.functional import scaled_dot_product_attention

from domino_sglang.cpu import native

BACKEND_NAME = "domino_cpu"


@dataclass(frozen=True)
class KeyMask:
    """Which keys a request's queries see: `mask` [n, prefix + n] bool (True = may attend), or
    None with `causal` True (plain causal, prefix 0) / False (every key)."""

    mask: torch.Tensor | None = None
    causal: bool = False


@dataclass
class AttentionPlan:
    """Per-forward slots and masks, shared by all layers; request b owns the forward's tokens
    [starts[b], starts[b] + new_lens[b]).

    prefix_locs  per request, [prefix_b] int64 KV-pool slots of its cached prefix
    key_locs     per request, [prefix_b + new_b] int64 slots of all its keys (prefix, then the
                 forward's own tokens, whose K/V the backend writes before attending), or None
                 where the new tokens' slots are not known
    causal_mask  per request, KeyMask: causal (or the tree mask) inside the new tokens
    block_mask   per request, KeyMask: non-causal inside the new tokens (ENCODER_ONLY layers)
    """

    starts: list[int]
    new_lens: list[int]
    prefix_locs: list[torch.Tensor]
    causal_mask: list[KeyMask]
    block_mask: list[KeyMask]
    key_locs: list[torch.Tensor] | None = None


def build_plan(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    new_lens: torch.Tensor,
    custom_mask: torch.Tensor | None = None,
    new_slots: torch.Tensor | None = None,
) -> AttentionPlan:
    """Plan a forward where request b has `prefix_lens[b]` cached tokens and `new_lens[b]` new
    tokens (laid out request after request in the forward's token order).

    custom_mask: optional flat bool tree mask for the new tokens, either SGLang's QLEN_ONLY layout
    (bs x [N, N]) or FULL_MASK layout (per request [N, prefix + N], concatenated); it replaces the
    causal rule inside the new tokens (verification of token trees).
    new_slots: optional [sum(new_lens)] KV-pool slots the new tokens' K/V are written to (the
    forward's out_cache_loc): a forward that writes them before attending reads each request's
    keys in one gather (plan.key_locs).
    """
    prefix = [int(x) for x in prefix_lens.tolist()]
    new = [int(x) for x in new_lens.tolist()]
    rows = req_pool_indices.tolist()
    starts = [0] * len(new)
    for b in range(1, len(new)):
        starts[b] = starts[b - 1] + new[b - 1]
    prefix_locs = [req_to_token[r, :p].to(torch.int64) for r, p in zip(rows, prefix)]
    key_locs = None
    if new_slots is not None and new_slots.shape[0] == sum(new):
        slots = new_slots.to(torch.int64)
        key_locs = [torch.cat([locs, slots[s : s + n]])
                    for locs, s, n in zip(prefix_locs, starts, new)]
    if custom_mask is not None:
        trees = [KeyMask(m) for m in _unpack_custom_mask(custom_mask, prefix, new)]
        return AttentionPlan(starts, new, prefix_locs, trees, trees, key_locs)
    causal = [_causal(p, n) for p, n in zip(prefix, new)]
    return AttentionPlan(starts, new, prefix_locs, causal, [KeyMask()] * len(new), key_locs)


def _causal(prefix: int, n: int) -> KeyMask:
    """Query i (position prefix + i) sees keys 0 .. prefix + i."""
    if n <= 1:
        return KeyMask()  # one query sees everything before it and itself
    if prefix == 0:
        return KeyMask(causal=True)  # SDPA's own (top-left aligned) causal rule is exact here
    mask = torch.arange(n)[:, None] + prefix >= torch.arange(prefix + n)[None, :]
    return KeyMask(mask)


def _unpack_custom_mask(
    custom_mask: torch.Tensor, prefix: list[int], new: list[int]
) -> list[torch.Tensor]:
    """Per request [N, prefix + N] bool masks from a flat tree mask in either SGLang layout."""
    bs = len(new)
    n = max(new, default=0)
    if any(x != n for x in new):
        raise ValueError("tree verification needs the same number of draft tokens per request")
    custom_mask = custom_mask.to(torch.bool).flatten()
    if custom_mask.numel() == bs * n * n:  # QLEN_ONLY: the prefix is always visible
        inner = custom_mask.view(bs, n, n)
        return [torch.cat([torch.ones(n, p, dtype=torch.bool), inner[b]], dim=1)
                for b, p in enumerate(prefix)]
    full_len = sum(n * (p + n) for p in prefix)
    if custom_mask.numel() < full_len:
        raise ValueError(
            f"custom_mask has {custom_mask.numel()} entries; expected {bs * n * n} (QLEN_ONLY) "
            f"or {full_len} (FULL_MASK)"
        )
    out, offset = [], 0
    for p in prefix:
        out.append(custom_mask[offset : offset + n * (p + n)].view(n, p + n))
        offset += n * (p + n)
    return out


def paged_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: AttentionPlan,
    mask: list[KeyMask],
    scaling: float,
    keys_written: bool = False,
) -> torch.Tensor:
    """Attention of the forward's tokens over (cached prefix ++ the forward's new K/V).

    q      [T, Hq, D]      k_new / v_new [T, Hkv, D] / [T, Hkv, Dv]
    k_cache [slots, Hkv, D] v_cache [slots, Hkv, Dv]
    mask   plan.causal_mask or plan.block_mask
    keys_written: k_new / v_new are already in the caches at the plan's new slots, stored
           unchanged (same dtype): each request's keys are then one gather (plan.key_locs)
    returns [T, Hq, Dv]
    """
    in_cache = keys_written and plan.key_locs is not None
    dtype = q.dtype
    gqa = q.shape[1] != k_new.shape[1]
    out = q.new_empty(q.shape[0], q.shape[1], v_new.shape[2])
    # bf16 keys read in place from the pool by the native kernel (native.py) where it runs
    fused = (in_cache and dtype == torch.bfloat16 and k_cache.is_contiguous()
             and v_cache.is_contiguous() and native.available()
             and native.attention_fits(q.shape[2], v_cache.shape[2], q.shape[1],
                                       k_cache.shape[1]))
    for b, (s, n) in enumerate(zip(plan.starts, plan.new_lens)):
        if n == 0:
            continue
        if fused and n <= native.ATTEND_MAX_QUERIES:
            native.attend(q[s : s + n], k_cache, v_cache, plan.key_locs[b], mask[b].mask,
                          mask[b].causal, scaling, out[s : s + n])
            continue
        if in_cache:
            keys = k_cache.index_select(0, plan.key_locs[b]).to(dtype)  # [p + n, Hkv, D]
            vals = v_cache.index_select(0, plan.key_locs[b]).to(dtype)
        else:
            keys = _gather(k_cache, plan.prefix_locs[b], k_new[s : s + n]).to(dtype)
            vals = _gather(v_cache, plan.prefix_locs[b], v_new[s : s + n]).to(dtype)
        if dtype != torch.float32:  # bf16 / fp16: in float32 through bmm (see _attend_fp32)
            out[s : s + n] = _attend_fp32(q[s : s + n], keys, vals, mask[b], scaling)
            continue
        o = scaled_dot_product_attention(
            q[s : s + n].transpose(0, 1),  # [Hq, n, D]
            keys.transpose(0, 1),  # [Hkv, p + n, D]
            vals.transpose(0, 1),
            attn_mask=mask[b].mask,
            is_causal=mask[b].causal,
            scale=scaling,
            enable_gqa=gqa,
        )  # [Hq, n, Dv]
        out[s : s + n] = o.transpose(0, 1)
    return out


def _attend_fp32(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, mask: KeyMask,
                 scaling: float) -> torch.Tensor:
    """Queries q [n, Hq, D] over keys / vals [p + n, Hkv, D] under `mask`, in float32 through two
    batched matmuls; returns [n, Hq, Dv] in q's dtype. torch's CPU SDPA in bf16 takes a slow
    path, worst for a single query, so a plain decode step grew with its context far faster
    than through these matmuls (figures: docs/cpu-runtime.md, `attention.py`). Query head h
    reads KV head h // (Hq / Hkv), as SDPA's enable_gqa.
    """
    n, hq, d = q.shape
    hkv, keys_n = keys.shape[1], keys.shape[0]
    qg = q.float().transpose(0, 1).reshape(hkv, -1, d)  # [Hkv, g * n, D], head-major
    scores = torch.bmm(qg, keys.float().permute(1, 2, 0)) * scaling  # [Hkv, g * n, p + n]
    allowed = mask.mask
    if allowed is None and mask.causal:  # no prefix: plain causal over the n new tokens
        allowed = torch.ones(n, keys_n, dtype=torch.bool, device=q.device).tril(keys_n - n)
    if allowed is not None:
        scores.view(hkv, -1, n, keys_n).masked_fill_(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    o = torch.bmm(weights, vals.float().transpose(0, 1))  # [Hkv, g * n, Dv]
    return o.view(hq, n, -1).transpose(0, 1).to(q.dtype)


def _gather(cache: torch.Tensor, locs: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """[p + n, H, D]: cache rows `locs` then `new`, written once into one buffer."""
    p = locs.shape[0]
    buf = cache.new_empty((p + new.shape[0], *cache.shape[1:]))
    torch.index_select(cache, 0, locs, out=buf[:p])
    buf[p:] = new
    return buf


def _make_backend_class():
    """Build the SGLang backend class lazily so this module imports without SGLang."""
    from domino_sglang.sglang_compat import AttentionBackend, AttentionType, KVWriteLoc

    class DominoCpuAttnBackend(AttentionBackend):
        """SGLang adapter around `build_plan` + `paged_attention`."""

        def __init__(self, model_runner):
            super().__init__()
            self.device = model_runner.device
            self.req_to_token_pool = model_runner.req_to_token_pool
            self.token_to_kv_pool = model_runner.token_to_kv_pool
            self.forward_metadata: AttentionPlan | None = None

        def init_forward_metadata(self, forward_batch) -> None:
            mode = forward_batch.forward_mode
            if mode.is_idle():
                self.forward_metadata = None
                return
            bs = forward_batch.batch_size
            seq_lens = forward_batch.seq_lens[:bs]
            custom_mask = None
            if mode.is_decode():
                prefix, new = seq_lens - 1, torch.ones_like(seq_lens)
            elif mode.is_target_verify():
                # seq_lens = committed prefix; the N draft tokens follow it in this forward.
                n = forward_batch.out_cache_loc.shape[0] // bs
                prefix, new = seq_lens, torch.full_like(seq_lens, n)
                spec_info = forward_batch.spec_info
                custom_mask = getattr(spec_info, "custom_mask", None)
            else:  # EXTEND, MIXED, DRAFT_EXTEND
                prefix = forward_batch.extend_prefix_lens[:bs]
                new = forward_batch.extend_seq_lens[:bs]
            self.forward_metadata = build_plan(
                self.req_to_token_pool.req_to_token,
                forward_batch.req_pool_indices[:bs],
                prefix,
                new,
                custom_mask,
                forward_batch.out_cache_loc,
            )

        def _forward(self, q, k, v, layer, forward_batch, save_kv_cache):
            if layer.is_cross_attention or (layer.logit_cap or 0) > 0:
                raise NotImplementedError(
                    f"{BACKEND_NAME}: cross attention and logit soft-capping are not supported"
                )
            k_cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
            v_cache = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
            written = save_kv_cache and k is not None
            if written:
                self.token_to_kv_pool.set_kv_buffer(
                    layer, KVWriteLoc.for_batch(forward_batch), k, v
                )
            plan = self.forward_metadata
            non_causal = layer.attn_type == AttentionType.ENCODER_ONLY
            mask = plan.block_mask if non_causal else plan.causal_mask
            q_ = q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim)
            k_ = k.reshape(-1, layer.tp_k_head_num, layer.qk_head_dim)
            v_ = v.reshape(-1, layer.tp_v_head_num, layer.v_head_dim)
            o = paged_attention(
                q_,
                k_,
                v_,
                k_cache,
                v_cache,
                plan,
                mask,
                layer.scaling,
                # stored unchanged where the pool keeps K/V in their own dtype (a quantised
                # pool stores another)
                keys_written=written and k_cache.dtype == k.dtype and v_cache.dtype == v.dtype,
            )
            return o.reshape(-1, layer.tp_q_head_num * layer.v_head_dim)

        def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
            return self._forward(q, k, v, layer, forward_batch, save_kv_cache)

        def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
            return self._forward(q, k, v, layer, forward_batch, save_kv_cache)

        def support_triton(self) -> bool:
            return False

    return DominoCpuAttnBackend


def register_backend() -> None:
    """Add `--attention-backend domino_cpu` to SGLang's registry and CLI choices (idempotent)."""
    from domino_sglang.sglang_compat import (
        ATTENTION_BACKEND_CHOICES,
        ATTENTION_BACKENDS,
        DRAFT_ATTENTION_BACKEND_CHOICES,
    )

    if BACKEND_NAME in ATTENTION_BACKENDS:
        return
    backend_cls = _make_backend_class()
    ATTENTION_BACKENDS[BACKEND_NAME] = backend_cls
    for names in (ATTENTION_BACKEND_CHOICES, DRAFT_ATTENTION_BACKEND_CHOICES):
        if BACKEND_NAME not in names:
            names.append(BACKEND_NAME)
