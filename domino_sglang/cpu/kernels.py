"""Pure-torch stand-ins for the `sgl_kernel.*_cpu` ops SGLang 0.5.23 imports on its CPU engine.

With `SGLANG_USE_CPU_ENGINE=1`, SGLang imports these names from `sgl_kernel` (a CPU build of
sgl-kernel that is not on PyPI) at module import time; `domino_sglang.cpu.bootstrap` serves them
from this module when no real `sgl_kernel` is installed. Every op keeps the exact call signature
of its SGLang call site and the in-place semantics of the Triton kernel it replaces (results are
bit-identical; `tests/test_cpu_kernels.py` checks that against SGLang's kernels run under the
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

Only `torch` and `ctypes` are imported (no triton, no sglang), so importing this module stays
cheap.
"""

from __future__ import annotations

import ctypes

import torch

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

_I64 = torch.int64

# TreeMaskMode values (sglang.kernels.ops.speculative.spec_tree.TreeMaskMode).
_FULL_MASK = 0
_QLEN_ONLY = 1
_QLEN_ONLY_BITPACKING = 2


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _flat_in(t: torch.Tensor) -> torch.Tensor:
    """Read-only flat view (a copy only if `t` is not contiguous)."""
    return t.reshape(-1)


def _flat_out(t: torch.Tensor, name: str) -> torch.Tensor:
    """Flat view of a tensor that is written in place; it must be contiguous."""
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (it is written in place)")
    return t.view(-1)


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


# --------------------------------------------------------------------------------------------
# EAGLE / NGRAM tree speculation
# --------------------------------------------------------------------------------------------


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Build the draft tree's mask, positions and retrieval links, in place.

    Mirrors `sgl_build_tree_kernel_efficient_triton` (spec_tree.py). With n = draft_token_num:
    parent_list:          [bs, topk * (depth - 1) + 1] int64 ([bs, 0] when depth == 1)
    selected_index:       [bs, n - 1] int64 (top_scores_index)
    verified_seq_len:     [bs] int64 (int32 also works)
    tree_mask:            flat bool/uint8, written in place;
                          FULL_MASK (0): [sum(seq_lens) * n + bs * n * n], row t of request b
                              at n*n*b + n*prefix(b) + (seq_len_b + n) * t, tree part after
                              the seq_len_b prefix columns (which this op leaves untouched);
                          QLEN_ONLY (1): [bs * n * n], row t of request b at (b * n + t) * n;
                          QLEN_ONLY_BITPACKING (2) is rejected (as by SGLang's Triton kernel
                          and by sgl-kernel's CPU build); SGLang's CPU engine uses QLEN_ONLY
                          (`default_tree_mask_mode()`).
    positions:            [bs * n] int64, written
    retrive_index:        [bs, n] int64, written (b * n + i)
    retrive_next_token:   [bs, n] int64, updated (callers pre-fill it with -1)
    retrive_next_sibling: [bs, n] int64, updated (callers pre-fill it with -1)

    Node i (1 <= i < n) is draft token selected_index[b, i-1]; its parent is the root (0) if
    selected_index // topk == 0, else the first node whose selected_index equals
    parent_list[b, selected_index // topk] (nodes whose parent is not found stay unlinked).
    Children of a node are linked in ascending order through next_token/next_sibling; the
    mask row of node t marks the root column and each ancestor on its path (at most `depth`
    steps), and positions[t] = seq_len + path length.
    """
    mode = int(tree_mask_mode)
    if mode == _QLEN_ONLY_BITPACKING:
        raise NotImplementedError("QLEN_ONLY_BITPACKING tree masks are not supported on CPU")
    if mode not in (_FULL_MASK, _QLEN_ONLY):
        raise ValueError(f"invalid tree_mask_mode {tree_mask_mode!r}")
    n = int(draft_token_num)
    bs = int(verified_seq_len.shape[0])
    if bs == 0 or n <= 0:
        return
    dev = verified_seq_len.device
    m = n - 1  # non-root nodes per request
    seq = verified_seq_len.reshape(-1).to(_I64)  # [bs]
    b_idx = torch.arange(bs, device=dev)  # [bs]
    sel = selected_index[:, :m].to(_I64)  # [bs, m], node q + 1 <-> sel[:, q]

    # Parent of each non-root node i = q + 1 (the tid == 0 part of the kernel).
    ptb = torch.div(sel, int(topk), rounding_mode="trunc")  # [bs, m] parent's top-k block
    has_parent_tok = ptb != 0  # [bs, m]; ptb == 0 -> parent is the root
    ptok = torch.zeros_like(sel)  # [bs, m] parent's token index (only where has_parent_tok)
    if bool(has_parent_tok.any()):
        if parent_list.dim() > 1:
            plist = parent_list.contiguous()
            pl_stride = int(plist.shape[1])
        else:
            plist = parent_list
            pl_stride = int(parent_list.shape[0])
        pl_idx = (b_idx[:, None] * pl_stride + ptb)[has_parent_tok]
        ptok[has_parent_tok] = plist.reshape(-1).index_select(0, pl_idx).to(_I64)
    eq = sel[:, None, :] == ptok[:, :, None]  # [bs, m(q), m(cp)]
    match_found = eq.any(-1)  # [bs, m]
    # [bs, m] first cp with sel[cp] == ptok (argmax returns the first maximum)
    match_pos = eq.to(torch.uint8).argmax(-1) if m > 0 else torch.zeros_like(sel)
    linked = ~has_parent_tok | match_found  # [bs, m] node has a parent
    parent_pos = torch.where(has_parent_tok, match_pos + 1, 0)  # [bs, m], 0 = root

    # Retrieval links. Processing i = n-1 .. 1 and pushing i at the front of its parent's
    # child list leaves children in ascending order: next_token[p] = smallest child,
    # next_sibling[c] = next larger child of the same parent, and the largest child inherits
    # next_token[p]'s previous value when that was not -1.
    ri = _flat_out(retrive_index, "retrive_index")[: bs * n].view(bs, n)
    rnt = _flat_out(retrive_next_token, "retrive_next_token")[: bs * n].view(bs, n)
    rns = _flat_out(retrive_next_sibling, "retrive_next_sibling")[: bs * n].view(bs, n)
    ri.copy_(b_idx[:, None] * n + torch.arange(n, device=dev))
    if m > 0:
        node = torch.arange(1, n, device=dev)  # [m] node ids 1..n-1
        old_first = rnt.to(_I64).gather(1, parent_pos)  # [bs, m] parent's previous next_token
        same_parent = (
            (parent_pos[:, :, None] == parent_pos[:, None, :])
            & linked[:, :, None]
            & linked[:, None, :]
            & (node[None, None, :] > node[None, :, None])
        )  # [bs, m(i), m(j)]: j is a later sibling of i
        has_next = same_parent.any(-1)  # [bs, m]
        next_sib = same_parent.to(torch.uint8).argmax(-1) + 1  # [bs, m] smallest later sibling
        new_rns = torch.where(has_next, next_sib, old_first)
        write_rns = linked & (has_next | (old_first != -1))  # [bs, m]
        rns_tail = rns[:, 1:]
        rns_tail.copy_(torch.where(write_rns, new_rns.to(rns.dtype), rns_tail))
        children = linked[:, None, :] & (
            parent_pos[:, None, :] == torch.arange(n, device=dev)[None, :, None]
        )  # [bs, n(p), m(i)]
        has_child = children.any(-1)  # [bs, n]
        first_child = children.to(torch.uint8).argmax(-1) + 1  # [bs, n]
        rnt.copy_(torch.where(has_child, first_child.to(rnt.dtype), rnt))

    # Mask rows and positions (the tid > 0 part). Walking up from node t: cur = t - 1, mark
    # column cur + 1, then continue with the parent's index unless the parent is the root or
    # was not found; at most `depth` steps, as in the Triton kernel.
    t_idx = torch.arange(n, device=dev)  # [n]
    if mode == _FULL_MASK:
        prefix = torch.cumsum(seq, 0) - seq  # [bs]
        seq_tree = n * n * b_idx + prefix * n  # [bs]
        row_one = seq_tree[:, None] + (seq + n)[:, None] * t_idx[None, :] + seq[:, None]
    else:
        row_one = n * n * b_idx[:, None] + n * t_idx[None, :]  # [bs, n]
    # row_one: [bs, n] flat index of the root column of each draft token's mask row.
    mask = _flat_out(tree_mask, "tree_mask")
    cols = torch.arange(1, n, device=dev)  # [m]
    mask.index_fill_(0, (row_one[:, :, None] + cols).reshape(-1), 0)
    ones = [row_one.reshape(-1)]
    path_len = torch.zeros(bs, m, dtype=_I64, device=dev)  # [bs, m] for tokens t = 1..n-1
    if m > 0:
        step_up = has_parent_tok & match_found  # [bs, m] walk continues past node q + 1
        cur = torch.arange(m, device=dev).expand(bs, m).clone()  # [bs, m] cur = t - 1
        active = torch.ones(bs, m, dtype=torch.bool, device=dev)
        rows_t = row_one[:, 1:]  # [bs, m]
        for _ in range(int(depth)):
            if not bool(active.any()):
                break
            path_len += active
            ones.append((rows_t + cur + 1)[active])
            nxt = match_pos.gather(1, cur)
            active = active & step_up.gather(1, cur)
            cur = torch.where(active, nxt, cur)
    mask.index_fill_(0, torch.cat(ones), 1)

    pos = _flat_out(positions, "positions")[: bs * n].view(bs, n)
    pos[:, 0] = seq.to(pos.dtype)
    pos[:, 1:] = (seq[:, None] + path_len).to(pos.dtype)


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree verification, in place (SGLang calls it with keyword arguments).

    Mirrors `verify_tree_greedy_kernel_triton` (spec_tree.py). With n draft tokens, S slots:
    predicts:             [bs * n] int32, written at the accepted nodes' global indices
    accept_index:         [bs, S] int32, accept_index[b, k] for k <= accept_token_num[b]
    accept_token_num:     [bs] int32, number of accepted draft tokens (bonus excluded)
    candidates:           [bs, n] int64 draft token ids
    retrive_index:        [bs, n] int64 global index (b * n + i) of each node
    retrive_next_token:   [bs, n] int64 first child (local index) or -1
    retrive_next_sibling: [bs, n] int64 next sibling (local index) or -1
    target_predict:       [bs, n] int64 target argmax, addressed by global index

    From the root, each level scans the current node's children in sibling order and accepts
    the first whose candidate equals the target's prediction at the current node; it stops at
    the first level without a match (or after S - 1 levels). The loops run over tree levels
    and sibling steps (both bounded, early exit), each step vectorised over the batch.
    """
    bs, n = int(candidates.shape[0]), int(candidates.shape[1])
    num_slots = int(accept_index.shape[1])
    if bs == 0:
        return
    dev = candidates.device
    ri = _flat_in(retrive_index).to(_I64)  # [bs*n]
    rnt = _flat_in(retrive_next_token).to(_I64)  # [bs*n]
    rns = _flat_in(retrive_next_sibling).to(_I64)  # [bs*n]
    cand = _flat_in(candidates).to(_I64)  # [bs*n]
    target = _flat_in(target_predict)  # [bs*n]
    pred = _flat_out(predicts, "predicts")
    acc = _flat_out(accept_index, "accept_index")
    num_out = _flat_out(accept_token_num, "accept_token_num")

    row_base = torch.arange(bs, device=dev) * n  # [bs]
    acc_base = torch.arange(bs, device=dev) * num_slots  # [bs]
    last = ri.index_select(0, row_base)  # [bs] global index of the last accepted node
    acc.index_copy_(0, acc_base, last.to(acc.dtype))
    num_acc = torch.zeros(bs, dtype=_I64, device=dev)  # [bs]
    cur = torch.zeros(bs, dtype=_I64, device=dev)  # [bs] local index of the current node
    going = torch.ones(bs, dtype=torch.bool, device=dev)  # [bs] still descending

    for _ in range(1, num_slots):
        if not bool(going.any()):
            break
        cur = torch.where(going, rnt.index_select(0, row_base + cur.clamp(min=0)), cur)
        want = target.index_select(0, last).to(_I64)  # [bs] token the target predicts next
        searching = going.clone()
        matched = torch.zeros(bs, dtype=torch.bool, device=dev)
        for _ in range(n):
            if not bool(searching.any()):
                break
            valid = cur != -1
            g = row_base + torch.where(valid, cur, 0)  # [bs] global index of candidate node
            draft_idx = ri.index_select(0, g)
            hit = searching & valid & (cand.index_select(0, g) == want)  # [bs]
            if bool(hit.any()):
                pred.index_copy_(0, last[hit], want[hit].to(pred.dtype))
                acc.index_copy_(0, (acc_base + num_acc + 1)[hit], draft_idx[hit].to(acc.dtype))
                num_acc += hit
                last = torch.where(hit, draft_idx, last)
                matched |= hit
            step = searching & valid & ~hit
            cur = torch.where(step, rns.index_select(0, g), cur)
            searching = step
        going = going & matched

    num_out[:bs] = num_acc.to(num_out.dtype)
    pred.index_copy_(0, last, target.index_select(0, last).to(pred.dtype))


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """NGRAM verify metadata from a QLEN tree mask, in place (`sgl_kernel.speculative` op).

    Mirrors `_reconstruct_tree_mask_kernel` (reconstruct_tree.py, SGLang's Triton fallback with
    the same contract as the compiled op). With n = draft_token_num:
    tree_mask:             [bs * n * n] bool/uint8, row-major (b, i, j): j is an ancestor of i
                           (only j < i is read)
    verified_seq_len:      [bs] int64
    positions:             [bs * n] int64, written: #ancestors + seq_len
    retrive_index:         [bs, n] int64, written: b * n + i
    retrive_next_token:    [bs, n] int64, written: smallest descendant k > i, else -1
    retrive_next_sibling:  [bs, n] int64, written: smallest k > i with the same parent (the
                           largest ancestor), else -1; -1 for nodes without an ancestor
    """
    bs, n = int(batch_size), int(draft_token_num)
    if bs == 0 or n <= 0:
        return
    dev = verified_seq_len.device
    m = _flat_in(tree_mask)[: bs * n * n].view(bs, n, n) != 0  # [bs, n(i), n(j)]
    idx = torch.arange(n, device=dev)  # [n]
    anc = m & (idx[None, :] < idx[:, None])  # [bs, i, j] strict ancestors
    seq = verified_seq_len.reshape(-1)[:bs].to(_I64)  # [bs]
    pos = anc.sum(-1) + seq[:, None]  # [bs, n]
    parent = torch.where(anc, idx, -1).amax(-1)  # [bs, n] largest ancestor or -1
    first_desc = torch.where(anc, idx[:, None], n).amin(1)  # [bs, n] min k with anc[k, i]
    next_token = torch.where(first_desc < n, first_desc, -1)
    later_same = (parent[:, :, None] == parent[:, None, :]) & (idx[:, None] > idx[None, :])
    first_sib = torch.where(later_same, idx[:, None], n).amin(1)  # [bs, n] over k for each i
    next_sib = torch.where((parent >= 0) & (first_sib < n), first_sib, -1)

    b_idx = torch.arange(bs, device=dev)
    outs = (
        (positions, "positions", pos),
        (retrive_index, "retrive_index", b_idx[:, None] * n + idx),
        (retrive_next_token, "retrive_next_token", next_token),
        (retrive_next_sibling, "retrive_next_sibling", next_sib),
    )
    for tensor, name, value in outs:
        out = _flat_out(tensor, name)
        out[: bs * n] = value.reshape(-1).to(out.dtype)
