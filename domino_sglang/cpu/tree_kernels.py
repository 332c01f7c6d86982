"""The tree speculation ops of the `sgl_kernel` CPU stand-in (kernels.py): EAGLE's tree build and
greedy tree verification, NGRAM's tree-mask metadata, in pure torch, bit-identical to SGLang's
Triton kernels (`tests/cpu/test_cpu_kernels.py`), with kernels.py's conventions."""

from __future__ import annotations

import torch

from domino_sglang.cpu.flat import I64 as _I64
from domino_sglang.cpu.flat import flat_in as _flat_in
from domino_sglang.cpu.flat import flat_out as _flat_out

# TreeMaskMode values (sglang.kernels.ops.speculative.spec_tree.TreeMaskMode).
_FULL_MASK = 0
_QLEN_ONLY = 1
_QLEN_ONLY_BITPACKING = 2


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
