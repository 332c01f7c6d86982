"""Pure-torch stand-ins for the `sgl_kernel.*_cpu` ops SGLang 0.5.23 imports on its CPU engine.

With `SGLANG_USE_CPU_ENGINE=1`, SGLang imports these names from `sgl_kernel` (a CPU build of
sgl-kernel that is not on PyPI) at module import time; `domino_sglang.cpu.bootstrap` serves them
from this module when no real `sgl_kernel` is installed. Every op keeps the exact call signature
of its SGLang call site and the in-place semantics of the Triton kernel it replaces (results are
bit-identical; `tests/cpu/test_cpu_kernels.py` checks that against SGLang's kernels run under the
Triton interpreter):

- `copy_all_layer_kv_cache_cpu`           <- kernels/ops/kvcache/cache_move.py
- `assign_req_to_token_pool_cpu`          <- srt/mem_cache/allocation.py
- `assign_extend_cache_locs_cpu`          <- kernels/ops/speculative/cache_locs.py
- `assign_draft_cache_locs_contiguous_cpu` <- kernels/ops/speculative/cache_locs.py
- `fill_bonus_tokens_cpu`, `fill_accept_out_cache_loc_cpu` <- kernels/ops/speculative/eagle.py
- `build_tree_kernel_efficient_cpu`, `verify_tree_greedy_cpu`
                                          <- kernels/ops/speculative/spec_tree.py
- `reconstruct_indices_from_tree_mask` (NGRAM; `sgl_kernel.speculative`, see below)
                                          <- kernels/ops/speculative/reconstruct_tree.py

Conventions shared by all ops (they mirror the Triton kernels' raw pointer arithmetic):
- every tensor is addressed as the flat, row-major buffer the kernel's pointer arithmetic sees
  (`row * stride + col`), so tensors that are written must be contiguous;
- indices are computed in int64 and values are cast to the destination dtype on store, like
  `tl.store` does (e.g. int64 cache locations stored into an int32 `req_to_token`);
- an index the GPU kernel would turn into an out-of-bounds access raises `IndexError` here
  (`index_select` / `index_copy_` / `index_fill_` reject negative and too-large indices) instead
  of reading or writing foreign memory.

The tree ops live in tree_kernels.py, the flat-buffer helpers in flat.py; this module is the
stand-in's namespace. Only `torch` and `ctypes` are imported (no triton, no sglang), so
importing it stays cheap.
"""

from __future__ import annotations

import ctypes

import torch

from domino_sglang.cpu.flat import I64 as _I64
from domino_sglang.cpu.flat import flat_in as _flat_in
from domino_sglang.cpu.flat import flat_out as _flat_out
from domino_sglang.cpu.tree_kernels import (
    build_tree_kernel_efficient_cpu,
    reconstruct_indices_from_tree_mask,
    verify_tree_greedy_cpu,
)

__all__ = [
    "SGL_KERNEL_CPU_OPS",
    "SGL_KERNEL_SPECULATIVE_OPS",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "reconstruct_indices_from_tree_mask",
    "verify_tree_greedy_cpu",
]

# The attribute names the `sgl_kernel` stand-in module exposes (see bootstrap.py).
SGL_KERNEL_CPU_OPS: tuple[str, ...] = (
    "copy_all_layer_kv_cache_cpu",
    "assign_req_to_token_pool_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "fill_bonus_tokens_cpu",
    "fill_accept_out_cache_loc_cpu",
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
)

# Not a `*_cpu` op: `sglang.kernels.ops.speculative.reconstruct_tree` runs
# `from sgl_kernel.speculative import reconstruct_indices_from_tree_mask` at import time on every
# platform but CUDA/HIP/XPU, CPU included, and the NGRAM worker calls it with CPU tensors. It
# belongs in a `sgl_kernel.speculative` submodule of the stand-in.
SGL_KERNEL_SPECULATIVE_OPS: tuple[str, ...] = ("reconstruct_indices_from_tree_mask",)




# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _ragged_ranges(
    start_offset: torch.Tensor, end_offset: torch.Tensor, bs: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Flatten the per-request ranges [start[i], end[i]) of the `assign_*` kernels.

    Returns, for every element of every range: its request `row` [N], its column in the
    request's `req_to_token` row `col` [N], and its position `out_pos` [N] in the packed
    `out_cache_loc`. Request i's packed block starts at sum_{j<i}(end[j] - start[j]), the
    Triton kernels' `tl.sum(end - start)` over the earlier programs (negative lengths included,
    though such a request itself copies nothing).
    """
    start = start_offset.reshape(-1)[:bs].to(_I64)  # [bs]
    end = end_offset.reshape(-1)[:bs].to(_I64)  # [bs]
    lens = end - start  # [bs]
    out_base = torch.cumsum(lens, 0) - lens  # [bs] exclusive prefix sum
    counts = lens.clamp(min=0)  # [bs]
    row = torch.repeat_interleave(torch.arange(bs, device=start.device), counts)  # [N]
    first = torch.cumsum(counts, 0) - counts  # [bs]
    k = torch.arange(row.numel(), device=start.device) - first[row]  # [N] offset in range
    return row, start[row] + k, out_base[row] + k


# --------------------------------------------------------------------------------------------
# KV cache move
# --------------------------------------------------------------------------------------------


def _widest_word(stride_bytes: int, ptr: int) -> torch.dtype:
    """Widest integer dtype that tiles a row and matches the buffer's alignment (bit copy)."""
    for dtype in (torch.int64, torch.int32, torch.int16):
        size = dtype.itemsize
        if stride_bytes % size == 0 and ptr % size == 0:
            return dtype
    return torch.uint8


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """Copy slot rows `src_loc` -> `tgt_loc` in every per-layer KV buffer, in place.

    data_ptrs: [L] uint64 (or int64), `buf.data_ptr()` of each contiguous per-layer buffer.
    strides:   [L] int64, bytes per slot row (`buf.stride(0) * itemsize`); also the copy width.
    tgt_loc:   [N] int32/int64 target slot rows (SGLang passes `tgt_loc[:num_locs]`).
    src_loc:   [N] int32/int64 source slot rows.

    Semantics of `copy_all_layer_kv_cache_tiled`: per layer, all source rows are read before
    any target row is written ("safe for in-place copy"), byte-exact.

    How the raw pointers become tensors: SGLang hands over only integer addresses (built in
    `MHATokenToKVPool._init_data_ptrs_and_strides`), so for each layer a ctypes byte array is
    laid over `[ptr, ptr + (max_loc + 1) * stride)` with `from_address` and wrapped, without a
    copy, by `torch.frombuffer` (viewed as the widest integer words the row size and alignment
    allow); `index_select` then gathers the source rows into a temporary before `index_copy_`
    scatters them. Nothing is cached: the views (and ctypes arrays) die when the call returns, so
    no pointer outlives the call and buffers that SGLang frees or reallocates are never touched
    later. The view spans only rows up to the largest location the call names, exactly the
    memory the Triton kernel itself touches, so the precondition is the kernel's own: every
    location is a valid slot row of every layer buffer. Negative locations (which would address
    memory before the buffer) raise IndexError. CPU tensors only (host addresses).
    """
    n = int(tgt_loc.numel())
    if n != int(src_loc.numel()):
        raise ValueError(f"tgt_loc has {n} locations but src_loc has {src_loc.numel()}")
    num_layers = int(data_ptrs.numel())
    if n == 0 or num_layers == 0:
        return
    if data_ptrs.device.type != "cpu":
        raise ValueError("copy_all_layer_kv_cache_cpu needs host (CPU) buffer addresses")
    if int(strides.numel()) != num_layers:
        raise ValueError(f"{num_layers} data_ptrs but {strides.numel()} strides")
    tgt = tgt_loc.reshape(-1).to(_I64)  # [N]
    src = src_loc.reshape(-1).to(_I64)  # [N]
    lo = min(int(tgt.min()), int(src.min()))
    if lo < 0:
        raise IndexError(f"negative KV slot location {lo}")
    num_rows = max(int(tgt.max()), int(src.max())) + 1
    # uint64 -> int64 reinterpretation keeps the bits; user-space addresses are < 2**63.
    ptrs = data_ptrs.reshape(-1)
    if ptrs.dtype == torch.uint64:
        ptrs = ptrs.view(torch.int64)
    for ptr, stride in zip(ptrs.tolist(), strides.reshape(-1).tolist(), strict=True):
        stride = int(stride)
        if ptr == 0 or stride <= 0:
            raise ValueError(f"invalid KV buffer pointer/stride ({ptr:#x}, {stride})")
        word = _widest_word(stride, ptr)
        raw = (ctypes.c_uint8 * (num_rows * stride)).from_address(ptr)
        rows = torch.frombuffer(raw, dtype=word).view(num_rows, stride // word.itemsize)
        rows.index_copy_(0, tgt, rows.index_select(0, src))  # gather (a copy), then scatter
        del rows, raw


# --------------------------------------------------------------------------------------------
# req_to_token / out_cache_loc bookkeeping
# --------------------------------------------------------------------------------------------


def _pool_ranges(
    req_pool_indices: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    pool_len: int,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Pair each req_to_token cell of the ranges [start[i], end[i]) of request i with its
    position in the packed out_cache_loc: (flat pool index [N], packed index [N]), or None."""
    bs = int(req_pool_indices.numel())
    if bs == 0:
        return None
    row, col, out_pos = _ragged_ranges(start_offset, end_offset, bs)
    if row.numel() == 0:
        return None
    req = req_pool_indices.reshape(-1).to(_I64)  # [bs]
    return req[row] * pool_len + col, out_pos


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """req_to_token[req_pool_indices[i], start[i]:end[i]] = next packed block of out_cache_loc.

    req_pool_indices: [bs] int32/int64
    req_to_token:     [R, pool_len] int32, contiguous, written in place
    start_offset:     [bs] int32/int64 (first column to write)
    end_offset:       [bs] int32/int64 (one past the last column)
    out_cache_loc:    [>= sum(end - start)] int64, request i's block follows request i-1's
    pool_len:         row stride of req_to_token (`req_to_token.shape[1]`)
    """
    pairs = _pool_ranges(req_pool_indices, start_offset, end_offset, pool_len)
    if pairs is None:
        return
    pool_pos, out_pos = pairs
    values = _flat_in(out_cache_loc).index_select(0, out_pos)  # [N]
    out = _flat_out(req_to_token, "req_to_token")
    out.index_copy_(0, pool_pos, values.to(out.dtype))


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Pack req_to_token[req_pool_indices[i], start[i]:end[i]] into out_cache_loc, in order.

    The reverse of `assign_req_to_token_pool_cpu`: it READS req_to_token and writes
    out_cache_loc.

    req_pool_indices: [bs] int32/int64
    req_to_token:     [R, pool_len] int32 (read only)
    start_offset:     [bs] int32/int64
    end_offset:       [bs] int32/int64
    out_cache_loc:    [>= sum(end - start)] int64, contiguous, written in place
    pool_len:         row stride of req_to_token
    """
    pairs = _pool_ranges(req_pool_indices, start_offset, end_offset, pool_len)
    if pairs is None:
        return
    pool_pos, out_pos = pairs
    values = _flat_in(req_to_token).index_select(0, pool_pos)  # [N]
    out = _flat_out(out_cache_loc, "out_cache_loc")
    out.index_copy_(0, out_pos, values.to(out.dtype))


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_cols: int,
) -> None:
    """out_cache_loc[i*C:(i+1)*C] = req_to_token[req_pool_indices[i], seq_lens[i]:][:C].

    C = topk * num_cols (each request's draft slots, stored contiguously after its prefix).

    req_pool_indices: [bs] int32/int64
    req_to_token:     [R, pool_len] int32 (read only)
    seq_lens:         [bs] int32/int64 (first column of each request's draft slots)
    out_cache_loc:    [>= bs * topk * num_cols] int64, contiguous, written in place
    (The Triton kernel's optional `positions`/`mrope` outputs are never requested on CPU.)
    """
    bs = int(seq_lens.shape[0])  # Triton grid: (seq_lens.shape[0],)
    copy_len = int(topk) * int(num_cols)
    if bs == 0 or copy_len <= 0:
        return
    req = req_pool_indices.reshape(-1)[:bs].to(_I64)  # [bs]
    start = req * pool_len + seq_lens.reshape(-1).to(_I64)  # [bs]
    src = start[:, None] + torch.arange(copy_len, device=start.device)  # [bs, C]
    values = _flat_in(req_to_token).index_select(0, src.reshape(-1))  # [bs*C]
    out = _flat_out(out_cache_loc, "out_cache_loc")
    out[: bs * copy_len] = values.to(out.dtype)


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
) -> None:
    """bonus_tokens[i] = accept_tokens.flat[i * accept_stride + accept_lens[i] - 1].

    accept_tokens: [bs, accept_stride] int32 (read as its flat buffer)
    accept_lens:   [bs] int32/int64, accepted count per request incl. the bonus token (>= 1)
    bonus_tokens:  [>= bs] int32, contiguous, written in place
    """
    bs = int(accept_lens.numel())
    if bs == 0:
        return
    lens = accept_lens.reshape(-1).to(_I64)  # [bs]
    idx = torch.arange(bs, device=lens.device) * int(accept_stride) + lens - 1  # [bs]
    values = _flat_in(accept_tokens).index_select(0, idx)  # [bs]
    out = _flat_out(bonus_tokens, "bonus_tokens")
    out[:bs] = values.to(out.dtype)


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,
    size: int | None = None,
) -> None:
    """Compact out_cache_loc[accept_index[p]] for the accepted (> -1) entries, in order.

    accept_index:         [bs, spec_steps + 1] int32, -1 marks a rejected slot
    out_cache_loc:        [bs * num_draft_tokens] int64 (read only)
    accept_out_cache_loc: [>= #accepted] int64, contiguous, written in place
    size: number of accept_index entries to scan; SGLang 0.5.23's CPU call site passes three
        arguments and means all of them (its Triton grid is `accept_index.numel()`). The
        optional fourth argument matches older sgl-kernel CPU builds' signature.

    Triton `fill_accept_out_cache_loc`: program p writes to slot #{q < p : accept_index[q] != -1}
    if accept_index[p] > -1.
    """
    ai = accept_index.reshape(-1)  # [P]
    if size is not None:
        ai = ai[: int(size)]
    if ai.numel() == 0:
        return
    ai = ai.to(_I64)
    counted = (ai != -1).to(_I64)  # [P]
    dst = torch.cumsum(counted, 0) - counted  # [P] exclusive count
    keep = ai > -1  # [P]
    values = _flat_in(out_cache_loc).index_select(0, ai[keep])  # [K]
    out = _flat_out(accept_out_cache_loc, "accept_out_cache_loc")
    out.index_copy_(0, dst[keep], values.to(out.dtype))
