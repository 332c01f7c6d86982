"""Pure-torch paged attention backend for SGLang on CPU, with speculative verification.

SGLang 0.5.23's `torch_native` backend cannot run TARGET_VERIFY, and `intel_amx` needs the CPU
build of sgl-kernel. This backend serves every forward mode a speculative decoder needs:

  EXTEND / MIXED   prefill chunks after a cached prefix, causal
  DECODE           one token per request
  TARGET_VERIFY    a chain (or tree, via the spec input's custom mask) of N draft tokens after the
                   committed prefix; causal inside the chain
  non-causal block layers with `AttentionType.ENCODER_ONLY` see the whole block (the parallel
                   drafter's `[bonus, MASK x (B-1)]` block) plus the prefix

Every request of a batch is handled in ONE `scaled_dot_product_attention` call per layer: queries
are padded to [bs, Qmax], keys to [bs, Pmax + Qmax] (cached prefix gathered through
`req_to_token`, then the forward's own new K/V), and one boolean mask encodes ragged lengths,
causality and tree masks. The plan (indices and masks) is built once per forward and shared by
all layers. Paged KV needs nothing special: `req_to_token` already maps each position to its slot.

Depends on SGLang internals: `AttentionBackend`, `ForwardBatch` fields (`forward_mode`,
`seq_lens`, `extend_prefix_lens`, `extend_seq_lens`, `req_pool_indices`, `out_cache_loc`,
`spec_info.custom_mask`) and the KV pool's `set_kv_buffer` / `get_key_buffer`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn.functional import scaled_dot_product_attention

BACKEND_NAME = "domino_cpu"


@dataclass
class AttentionPlan:
    """Per-forward gather indices and mask, shared by all layers.

    prefix_locs  [bs, Pmax]  KV-pool slots of each request's cached prefix (padding -> slot 0)
    token_index  [bs, Qmax]  flat index of each padded query in the forward's tokens (pad -> 0)
    token_valid  [bs, Qmax]  bool, real (not padding) queries
    causal_mask  [bs, 1, Qmax, Pmax + Qmax]  bool, True = may attend; causal (or the tree mask)
                 inside the new tokens
    block_mask   same, but non-causal inside the new tokens (ENCODER_ONLY layers)
    """

    prefix_locs: torch.Tensor
    token_index: torch.Tensor
    token_valid: torch.Tensor
    causal_mask: torch.Tensor
    block_mask: torch.Tensor


def build_plan(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    new_lens: torch.Tensor,
    custom_mask: torch.Tensor | None = None,
) -> AttentionPlan:
    """Plan a batched forward where request b has `prefix_lens[b]` cached tokens and
    `new_lens[b]` new tokens (laid out request after request in the forward's token order).

    custom_mask: optional flat bool tree mask for the new tokens, either SGLang's QLEN_ONLY layout
    (bs x [N, N]) or FULL_MASK layout (per request [N, prefix + N], concatenated); it replaces the
    causal rule inside the new tokens (verification of token trees).
    """
    device = req_to_token.device
    bs = prefix_lens.shape[0]
    prefix_lens = prefix_lens.to(torch.int64)
    new_lens = new_lens.to(torch.int64)
    p_max = int(prefix_lens.max()) if bs else 0
    q_max = max(int(new_lens.max()) if bs else 0, 1)

    # Prefix slots: [bs, Pmax]
    pos = torch.arange(p_max, device=device)
    prefix_valid = pos[None, :] < prefix_lens[:, None]  # [bs, Pmax]
    rows = req_to_token[:, :p_max][req_pool_indices.to(torch.int64)].to(torch.int64)
    prefix_locs = torch.where(prefix_valid, rows, torch.zeros_like(rows))

    # New tokens: [bs, Qmax]
    q_pos = torch.arange(q_max, device=device)
    token_valid = q_pos[None, :] < new_lens[:, None]
    starts = torch.cumsum(new_lens, 0) - new_lens  # [bs]
    token_index = torch.where(token_valid, starts[:, None] + q_pos[None, :], 0)

    # Keys of the new tokens, relative index m in [0, Qmax): m < N_b
    new_key_valid = token_valid[:, None, :].expand(bs, q_max, q_max)  # [bs, Qmax(i), Qmax(m)]
    prefix_part = prefix_valid[:, None, :].expand(bs, q_max, p_max)  # [bs, Qmax, Pmax]
    causal = q_pos[None, :, None] >= q_pos[None, None, :]  # [1, Qmax, Qmax]

    if custom_mask is not None:
        prefix_part, inner = _unpack_custom_mask(custom_mask, prefix_lens, new_lens, p_max, q_max)
        inner = inner & new_key_valid
        masks = [torch.cat([prefix_part, inner], dim=2)]
    else:
        masks = [
            torch.cat([prefix_part, new_key_valid & causal], dim=2),
            torch.cat([prefix_part, new_key_valid], dim=2),
        ]
    # Padding query rows attend to key 0 only, so softmax never sees an all-masked row.
    masks = [_guard_padding_rows(m, token_valid) for m in masks]
    return AttentionPlan(
        prefix_locs=prefix_locs,
        token_index=token_index,
        token_valid=token_valid,
        causal_mask=masks[0][:, None],
        block_mask=masks[-1][:, None],
    )


def _guard_padding_rows(mask: torch.Tensor, token_valid: torch.Tensor) -> torch.Tensor:
    empty_row = ~mask.any(dim=2)  # [bs, Qmax]
    if bool(empty_row.any()):
        mask = mask.clone()
        mask[..., 0] |= empty_row | ~token_valid
    return mask


def _unpack_custom_mask(
    custom_mask: torch.Tensor,
    prefix_lens: torch.Tensor,
    new_lens: torch.Tensor,
    p_max: int,
    q_max: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (prefix part [bs, Qmax, Pmax], inner part [bs, Qmax, Qmax]) of a tree mask."""
    bs = prefix_lens.shape[0]
    n = q_max
    if not bool((new_lens == n).all()):
        raise ValueError("tree verification needs the same number of draft tokens per request")
    custom_mask = custom_mask.to(torch.bool).flatten()
    device = custom_mask.device
    pos = torch.arange(p_max, device=device)
    prefix_valid = (pos[None, :] < prefix_lens[:, None])[:, None, :].expand(bs, n, p_max)
    if custom_mask.numel() == bs * n * n:  # QLEN_ONLY: the prefix is always visible
        return prefix_valid, custom_mask.view(bs, n, n)
    full_len = int((n * (prefix_lens + n)).sum())
    if custom_mask.numel() < full_len:
        raise ValueError(
            f"custom_mask has {custom_mask.numel()} entries; expected {bs * n * n} (QLEN_ONLY) "
            f"or {full_len} (FULL_MASK)"
        )
    prefix_part = torch.zeros(bs, n, p_max, dtype=torch.bool, device=device)
    inner = torch.zeros(bs, n, n, dtype=torch.bool, device=device)
    offset = 0
    for b in range(bs):  # tree masks are rare on CPU (NGRAM verify); a loop over requests is fine
        p = int(prefix_lens[b])
        rows = custom_mask[offset : offset + n * (p + n)].view(n, p + n)
        prefix_part[b, :, :p] = rows[:, :p]
        inner[b] = rows[:, p:]
        offset += n * (p + n)
    return prefix_part, inner


def paged_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: AttentionPlan,
    mask: torch.Tensor,
    scaling: float,
) -> torch.Tensor:
    """Attention of the forward's tokens over (cached prefix ++ the forward's new K/V).

    q      [T, Hq, D]      k_new / v_new [T, Hkv, D] / [T, Hkv, Dv]
    k_cache [slots, Hkv, D] v_cache [slots, Hkv, Dv]
    returns [T, Hq, Dv]
    """
    dtype = q.dtype
    # [bs, Qmax, H, D] -> [bs, H, Qmax, D]
    q_pad = q[plan.token_index].transpose(1, 2)
    k_keys = torch.cat([k_cache[plan.prefix_locs].to(dtype), k_new[plan.token_index].to(dtype)], 1)
    v_keys = torch.cat([v_cache[plan.prefix_locs].to(dtype), v_new[plan.token_index].to(dtype)], 1)
    out = scaled_dot_product_attention(
        q_pad,
        k_keys.transpose(1, 2),  # [bs, Hkv, Pmax + Qmax, D]
        v_keys.transpose(1, 2),
        attn_mask=mask,
        scale=scaling,
        enable_gqa=q.shape[1] != k_new.shape[1],
    )  # [bs, Hq, Qmax, Dv]
    return out.transpose(1, 2)[plan.token_valid]  # [T, Hq, Dv]


def _make_backend_class():
    """Build the SGLang backend class lazily so this module imports without SGLang."""
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
    from sglang.srt.layers.radix_attention import AttentionType
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

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
            )

        def _forward(self, q, k, v, layer, forward_batch, save_kv_cache):
            if layer.is_cross_attention or (layer.logit_cap or 0) > 0:
                raise NotImplementedError(
                    f"{BACKEND_NAME}: cross attention and logit soft-capping are not supported"
                )
            if save_kv_cache and k is not None:
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
                self.token_to_kv_pool.get_key_buffer(layer.layer_id),
                self.token_to_kv_pool.get_value_buffer(layer.layer_id),
                plan,
                mask,
                layer.scaling,
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
    from sglang.srt.arg_groups import choices
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    if BACKEND_NAME in ATTENTION_BACKENDS:
        return
    backend_cls = _make_backend_class()
    ATTENTION_BACKENDS[BACKEND_NAME] = backend_cls
    for names in (choices.ATTENTION_BACKEND_CHOICES, choices.DRAFT_ATTENTION_BACKEND_CHOICES):
        if BACKEND_NAME not in names:
            names.append(BACKEND_NAME)
