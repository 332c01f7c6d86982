"""`domino_sglang.cpu.kernels` against SGLang's own Triton kernels, bit for bit.

The references are SGLang 0.5.23's Triton kernels run by the Triton interpreter. The interpreter
must be switched on (TRITON_INTERPRET=1) before triton is first imported, and SGLang must not see
SGLANG_USE_CPU_ENGINE=1 (or it would dispatch to the very ops under test), so all references run
in ONE subprocess per test module: this module draws the random cases, `torch.save`s them, the
subprocess runs every reference and `torch.save`s the results, and each test runs our op on the
same inputs in this process and asserts exact equality of every output / mutated tensor
(untouched elements included: buffers start with random contents). The pytest process itself
never imports triton or sglang and never sets SGLANG_USE_CPU_ENGINE.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from domino_sglang.cpu import kernels as K

torch.set_num_threads(1)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("sglang") is None or importlib.util.find_spec("triton") is None,
    reason="needs sglang and triton for the reference kernels",
)

Case = dict[str, Any]

# --------------------------------------------------------------------------------------------
# random cases (drawn in this process, shared with the reference subprocess)
# --------------------------------------------------------------------------------------------


def _ranges(g: torch.Generator, bs: int, rpi_dtype, off_dtype, negative: bool = False) -> Case:
    """Ragged [start, end) column ranges in a [bs + 5, 96] int32 req_to_token table.

    Lengths go up to 56 (> the kernels' 32-wide blocks) and include empty ranges. With
    `negative`, one later request has end < start (it copies nothing, but its length still
    shifts the later requests' packed offsets, as in the Triton kernels).
    """
    pool_len, rows = 96, bs + 5
    rpi = torch.randperm(rows, generator=g)[:bs]  # distinct requests
    start = torch.randint(0, 40, (bs,), generator=g)
    lens = torch.randint(0, 57, (bs,), generator=g)
    if negative:
        lens[0] = 5
        lens[bs // 2 + 1] = -2
    end = start + lens
    total = int(lens.clamp(min=0).sum())
    return {
        "req_pool_indices": rpi.to(rpi_dtype),
        "req_to_token": torch.randint(0, 50_000, (rows, pool_len), generator=g, dtype=torch.int32),
        "start_offset": start.to(off_dtype),
        "end_offset": end.to(off_dtype),
        "out_cache_loc": torch.randint(0, 50_000, (total + 3,), generator=g),
    }


_RANGE_DTYPES = [
    (torch.int64, torch.int64),  # req_pool_indices, seq_lens (alloc_for_spec_decode, ngram)
    (torch.int32, torch.int32),
    (torch.int64, torch.int32),  # fill_front_out_cache_loc_func: arange rows, int32 lengths
]


def _cases_assign_req_to_token_pool(g: torch.Generator) -> list[Case]:
    cases = []
    for bs in (1, 3, 8, 17):
        for rpi_dtype, off_dtype in _RANGE_DTYPES:
            cases.append(_ranges(g, bs, rpi_dtype, off_dtype))
    cases.append(_ranges(g, 6, torch.int64, torch.int64, negative=True))
    return cases


def _cases_assign_extend_cache_locs(g: torch.Generator) -> list[Case]:
    return [
        _ranges(g, bs, rpi_dtype, off_dtype)
        for bs in (1, 3, 8, 17)
        for rpi_dtype, off_dtype in _RANGE_DTYPES
    ]


def _cases_assign_draft_cache_locs_contiguous(g: torch.Generator) -> list[Case]:
    cases = []
    shapes = [(1, 1, 3), (4, 2, 3), (9, 4, 5), (3, 1, 1), (2, 4, 40)]  # 4 * 40 > 128 block
    for i, (bs, topk, num_cols) in enumerate(shapes):
        idx_dtype = torch.int64 if i % 2 == 0 else torch.int32
        pool_len, rows = 256, bs + 4
        copy_len = topk * num_cols
        cases.append(
            {
                "req_pool_indices": torch.randperm(rows, generator=g)[:bs].to(idx_dtype),
                "req_to_token": torch.randint(
                    0, 50_000, (rows, pool_len), generator=g, dtype=torch.int32
                ),
                "seq_lens": torch.randint(0, pool_len - copy_len + 1, (bs,), generator=g).to(
                    idx_dtype
                ),
                "out_cache_loc": torch.randint(0, 50_000, (bs * copy_len + 2,), generator=g),
                "topk": topk,
                "num_cols": num_cols,
            }
        )
    return cases


def _cases_fill_bonus_tokens(g: torch.Generator) -> list[Case]:
    cases = []
    for bs, stride in [(1, 2), (5, 4), (13, 6), (32, 3)]:
        for lens_dtype in (torch.int32, torch.int64):
            cases.append(
                {
                    "accept_tokens": torch.randint(
                        0, 32_000, (bs, stride), generator=g, dtype=torch.int32
                    ),
                    "accept_lens": torch.randint(1, stride + 1, (bs,), generator=g).to(lens_dtype),
                    "bonus_tokens": torch.randint(0, 9, (bs,), generator=g, dtype=torch.int32),
                    "accept_stride": stride,
                }
            )
    return cases


def _cases_fill_accept_out_cache_loc(g: torch.Generator) -> list[Case]:
    cases = []
    for bs, slots, n in [(1, 2, 4), (4, 4, 6), (9, 5, 8), (16, 3, 3)]:
        # SGLang's layout: per request, the accepted global indices first, then -1 padding.
        accepted = torch.randint(1, slots + 1, (bs,), generator=g)
        ai = torch.full((bs, slots), -1, dtype=torch.int32)
        for b in range(bs):
            picks = torch.sort(torch.randperm(n, generator=g)[: int(accepted[b])]).values
            ai[b, : len(picks)] = (b * n + picks).to(torch.int32)
        for accept_index in (ai, _scatter_minus_one(g, bs, slots, n)):
            cases.append(
                {
                    "accept_index": accept_index,
                    "out_cache_loc": torch.randint(0, 50_000, (bs * n,), generator=g),
                    "accept_out_cache_loc": torch.randint(0, 9, (bs * slots,), generator=g),
                }
            )
    return cases


def _scatter_minus_one(g: torch.Generator, bs: int, slots: int, n: int) -> torch.Tensor:
    """accept_index with -1 holes anywhere (the kernels' semantics cover that too)."""
    ai = torch.randperm(bs * n, generator=g)[: bs * slots].view(bs, slots).to(torch.int32)
    ai[torch.rand(bs, slots, generator=g) < 0.4] = -1
    return ai


def _eagle_tree(g: torch.Generator, bs: int, topk: int, depth: int, n: int) -> Case:
    """parent_list / top_scores_index exactly as SGLang's EAGLE draft loop produces them."""
    scores = torch.rand(bs, topk, generator=g) * 0.9 + 0.05  # step 0 (b, topk)
    score_list = [scores]
    parents = [torch.arange(-1, topk).expand(bs, -1)]
    for i in range(1, depth):
        topk_p = torch.rand(bs, topk, topk, generator=g) * 0.9 + 0.05
        expand = scores[:, :, None] * topk_p  # (b, topk, topk)
        score_list.append(expand.flatten(1))
        scores, idx = torch.topk(expand.flatten(1), topk, dim=-1)
        parents.append(idx + (topk * topk * (i - 1) + topk))
    all_scores = torch.cat(score_list, dim=1)
    top = torch.sort(torch.topk(all_scores, n - 1, dim=-1).indices).values
    if len(parents) > 1:
        parent_list = torch.cat(parents[:-1], dim=1).contiguous()
    else:
        parent_list = torch.empty(bs, 0, dtype=torch.long)
    return {"parent_list": parent_list, "selected_index": top.contiguous()}


def _cases_build_tree(g: torch.Generator) -> list[Case]:
    cases = []
    # (bs, topk, depth, draft_token_num)
    shapes = [(1, 1, 3, 4), (3, 2, 3, 6), (4, 4, 4, 12), (2, 8, 3, 16), (5, 1, 1, 2), (2, 3, 1, 4)]
    for i, (bs, topk, depth, n) in enumerate(shapes):
        tree = _eagle_tree(g, bs, topk, depth, n)
        for mode in (0, 1):  # FULL_MASK (GPU), QLEN_ONLY (SGLang's CPU default)
            cases.append(_tree_case(g, tree, bs, topk, depth, n, mode, seq_int32=(i % 2 == 1)))
    # Not a well-formed EAGLE tree: parents that are never selected (left unlinked) and
    # retrieve buffers that do not start at -1.
    bs, topk, depth, n = 3, 2, 3, 7
    plen = topk * (depth - 1) + 1
    sel = torch.stack([torch.randperm(topk * plen, generator=g)[: n - 1] for _ in range(bs)])
    tree = {
        "parent_list": torch.randint(0, topk * plen, (bs, plen), generator=g),
        "selected_index": torch.sort(sel).values.contiguous(),
    }
    for mode in (0, 1):
        case = _tree_case(g, tree, bs, topk, depth, n, mode, seq_int32=False)
        case["retrive_next_token"] = torch.randint(-1, n, (bs, n), generator=g)
        case["retrive_next_sibling"] = torch.randint(-1, n, (bs, n), generator=g)
        cases.append(case)
    return cases


def _tree_case(g, tree, bs, topk, depth, n, mode, seq_int32) -> Case:
    seq_lens = torch.randint(1, 20, (bs,), generator=g)
    mask_len = int(seq_lens.sum()) * n + bs * n * n if mode == 0 else bs * n * n
    return {
        **{k: v.clone() for k, v in tree.items()},
        "verified_seq_len": seq_lens.to(torch.int32 if seq_int32 else torch.int64),
        "tree_mask": torch.rand(mask_len, generator=g) < 0.5,
        "positions": torch.randint(0, 9, (bs * n,), generator=g),
        "retrive_index": torch.randint(0, 9, (bs, n), generator=g),
        "retrive_next_token": torch.full((bs, n), -1, dtype=torch.long),
        "retrive_next_sibling": torch.full((bs, n), -1, dtype=torch.long),
        "topk": topk,
        "depth": depth,
        "draft_token_num": n,
        "tree_mask_mode": mode,
    }


def _random_tree_links(g: torch.Generator, bs: int, n: int, ascending: bool):
    """Random rooted trees (parent[i] < i) as retrieve arrays; siblings in either order."""
    rnt = torch.full((bs, n), -1, dtype=torch.long)
    rns = torch.full((bs, n), -1, dtype=torch.long)
    for b in range(bs):
        children: list[list[int]] = [[] for _ in range(n)]
        for i in range(1, n):
            children[int(torch.randint(0, i, (1,), generator=g))].append(i)
        for p, kids in enumerate(children):
            if not ascending:
                kids = [kids[int(j)] for j in torch.randperm(len(kids), generator=g)]
            if kids:
                rnt[b, p] = kids[0]
                for a, c in itertools.pairwise(kids):
                    rns[b, a] = c
    ri = torch.arange(bs * n).view(bs, n)
    return ri, rnt, rns


def _cases_verify_tree_greedy(g: torch.Generator) -> list[Case]:
    cases = []
    for bs, n, slots, vocab, ascending in [
        (1, 4, 4, 2, True),
        (3, 8, 4, 3, True),
        (8, 16, 6, 3, False),
        (5, 6, 2, 2, False),
        (4, 12, 12, 2, True),
    ]:
        ri, rnt, rns = _random_tree_links(g, bs, n, ascending)
        fresh = bs % 2 == 1  # SGLang's initial buffers, or random ones
        cases.append(
            {
                "predicts": torch.zeros(bs * n, dtype=torch.int32)
                if fresh
                else torch.randint(0, 99, (bs * n,), generator=g, dtype=torch.int32),
                "accept_index": torch.full((bs, slots), -1, dtype=torch.int32)
                if fresh
                else torch.randint(0, 99, (bs, slots), generator=g, dtype=torch.int32),
                "accept_token_num": torch.randint(0, 9, (bs,), generator=g, dtype=torch.int32),
                "candidates": torch.randint(0, vocab, (bs, n), generator=g),
                "retrive_index": ri,
                "retrive_next_token": rnt,
                "retrive_next_sibling": rns,
                "target_predict": torch.randint(0, vocab, (bs, n), generator=g),
            }
        )
    # Trees from the EAGLE builder (children ascending, as the CPU engine produces them).
    for bs, topk, depth, n in [(4, 2, 3, 6), (3, 4, 4, 12)]:
        tree = _eagle_tree(g, bs, topk, depth, n)
        case = _tree_case(g, tree, bs, topk, depth, n, 1, seq_int32=False)
        K.build_tree_kernel_efficient_cpu(**case)
        cases.append(
            {
                "predicts": torch.zeros(bs * n, dtype=torch.int32),
                "accept_index": torch.full((bs, depth + 1), -1, dtype=torch.int32),
                "accept_token_num": torch.empty(bs, dtype=torch.int32),
                "candidates": torch.randint(0, 2, (bs, n), generator=g),
                "retrive_index": case["retrive_index"],
                "retrive_next_token": case["retrive_next_token"],
                "retrive_next_sibling": case["retrive_next_sibling"],
                "target_predict": torch.randint(0, 2, (bs, n), generator=g),
            }
        )
    return cases


def _cases_copy_all_layer_kv_cache(g: torch.Generator) -> list[Case]:
    rows = 40

    def buffers() -> list[torch.Tensor]:
        return [
            torch.randn(rows, 2, 8, generator=g).to(torch.bfloat16),  # 32 B rows (K)
            torch.randn(rows, 2, 6, generator=g),  # 48 B rows, fp32 (V, other head dim)
            torch.randn(rows, 4, 16, generator=g),  # 256 B rows: several 128 B tiles
            torch.randint(0, 256, (rows, 1, 5), generator=g, dtype=torch.uint8),  # fp8-like
            torch.randn(rows, 3, generator=g).to(torch.float16),  # 6 B rows
        ]

    cases = []
    for num, idx_dtype, overlap in [
        (1, torch.int64, False),
        (5, torch.int32, True),
        (17, torch.int64, True),
        (12, torch.int32, False),
    ]:
        perm = torch.randperm(rows, generator=g)
        tgt = perm[:num]
        # `overlap`: some targets are also sources (the copy must read before it writes).
        src = perm[num // 2 : num // 2 + num] if overlap else perm[num : 2 * num]
        cases.append(
            {"buffers": buffers(), "tgt_loc": tgt.to(idx_dtype), "src_loc": src.to(idx_dtype)}
        )
    return cases


def _cases_reconstruct_tree(g: torch.Generator) -> list[Case]:
    cases = []
    for bs, n, noisy in [(1, 1, False), (1, 4, False), (3, 8, False), (6, 12, False), (4, 8, True)]:
        mask = torch.zeros(bs, n, n, dtype=torch.bool)
        for b in range(bs):
            parent = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
            for i in range(n):  # NGRAM's mask: each node sees itself and its ancestors
                j = i
                while j >= 0:
                    mask[b, i, j] = True
                    j = parent[j]
        if noisy:  # not a tree mask at all: the kernels' formulas still define the result
            mask ^= torch.rand(bs, n, n, generator=g) < 0.3
        cases.append(
            {
                "tree_mask": mask.reshape(-1) if bs % 2 else mask.reshape(-1).to(torch.uint8),
                "verified_seq_len": torch.randint(1, 50, (bs,), generator=g),
                "positions": torch.randint(0, 9, (bs * n,), generator=g),
                "retrive_index": torch.randint(0, 9, (bs, n), generator=g),
                "retrive_next_token": torch.randint(0, 9, (bs, n), generator=g),
                "retrive_next_sibling": torch.randint(0, 9, (bs, n), generator=g),
                "batch_size": bs,
                "draft_token_num": n,
            }
        )
    return cases


GENERATORS = {
    "assign_req_to_token_pool": _cases_assign_req_to_token_pool,
    "assign_extend_cache_locs": _cases_assign_extend_cache_locs,
    "assign_draft_cache_locs_contiguous": _cases_assign_draft_cache_locs_contiguous,
    "fill_bonus_tokens": _cases_fill_bonus_tokens,
    "fill_accept_out_cache_loc": _cases_fill_accept_out_cache_loc,
    "build_tree": _cases_build_tree,
    "verify_tree_greedy": _cases_verify_tree_greedy,
    "copy_all_layer_kv_cache": _cases_copy_all_layer_kv_cache,
    "reconstruct_tree": _cases_reconstruct_tree,
}

# The tensors each op writes (everything that is compared besides the read-only inputs).
MUTATED = {
    "assign_req_to_token_pool": ["req_to_token"],
    "assign_extend_cache_locs": ["out_cache_loc"],
    "assign_draft_cache_locs_contiguous": ["out_cache_loc"],
    "fill_bonus_tokens": ["bonus_tokens"],
    "fill_accept_out_cache_loc": ["accept_out_cache_loc"],
    "build_tree": [
        "tree_mask",
        "positions",
        "retrive_index",
        "retrive_next_token",
        "retrive_next_sibling",
    ],
    "verify_tree_greedy": ["predicts", "accept_index", "accept_token_num"],
    "copy_all_layer_kv_cache": ["buffers"],
    "reconstruct_tree": [
        "positions",
        "retrive_index",
        "retrive_next_token",
        "retrive_next_sibling",
    ],
}

# --------------------------------------------------------------------------------------------
# the reference subprocess
# --------------------------------------------------------------------------------------------

_REFERENCE_SCRIPT = textwrap.dedent(
    """
    import sys

    import torch

    torch.set_num_threads(1)
    import triton  # noqa: F401  (TRITON_INTERPRET=1 is already in the environment)

    from sglang.kernels.ops.kvcache.cache_move import copy_all_layer_kv_cache_func
    from sglang.kernels.ops.speculative import cache_locs, eagle, spec_tree
    from sglang.srt.mem_cache.allocation import assign_req_to_token_pool_func
    from sglang.srt.utils import is_cpu, next_power_of_2

    # reconstruct_tree.py imports the compiled op from sgl_kernel.speculative at import time
    # on non-CUDA/XPU hosts; only its Triton fallback is used here, so stub that import (last,
    # so that no other module sees the stub).
    import types

    def _compiled_op_unavailable(*args, **kwargs):
        raise RuntimeError("stub")

    _stub = types.ModuleType("sgl_kernel.speculative")
    _stub.reconstruct_indices_from_tree_mask = _compiled_op_unavailable
    sys.modules.setdefault("sgl_kernel", types.ModuleType("sgl_kernel"))
    sys.modules.setdefault("sgl_kernel.speculative", _stub)
    from sglang.kernels.ops.speculative.reconstruct_tree import (
        reconstruct_indices_from_tree_mask_triton,
    )

    assert not is_cpu(), "the references must take SGLang's Triton paths"
    cases = torch.load(sys.argv[1])
    out = {}

    def run(name, fn):
        results = []
        for case in cases[name]:
            c = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
            fn(c)
            results.append(c)
        out[name] = results

    def assign_req(c):
        assign_req_to_token_pool_func(
            c["req_pool_indices"], c["req_to_token"], c["start_offset"], c["end_offset"],
            c["out_cache_loc"], c["req_pool_indices"].numel(),
        )

    def assign_extend(c):
        bs = c["req_pool_indices"].numel()
        cache_locs.assign_extend_cache_locs[(bs,)](
            c["req_pool_indices"], c["req_to_token"], c["start_offset"], c["end_offset"],
            c["out_cache_loc"], c["req_to_token"].shape[1], next_power_of_2(bs),
        )

    def assign_draft(c):
        cache_locs.assign_draft_cache_locs_contiguous_func(
            c["req_pool_indices"], c["req_to_token"], c["seq_lens"], c["out_cache_loc"],
            c["topk"], c["num_cols"],
        )

    def bonus(c):
        eagle.fill_bonus_tokens_func(
            c["accept_tokens"], c["accept_lens"], c["bonus_tokens"], c["accept_stride"],
            c["accept_lens"].numel(),
        )

    def accept_loc(c):
        eagle.fill_accept_out_cache_loc_func(
            c["accept_index"], c["out_cache_loc"], c["accept_out_cache_loc"],
            c["accept_index"].numel(),
        )

    def build_tree(c):
        spec_tree.sgl_build_tree_kernel_triton(
            c["parent_list"], c["selected_index"], c["verified_seq_len"], c["tree_mask"],
            c["positions"], c["retrive_index"], c["retrive_next_token"],
            c["retrive_next_sibling"], c["topk"], c["depth"], c["draft_token_num"],
            spec_tree.TreeMaskMode(c["tree_mask_mode"]),
        )

    def verify(c):
        spec_tree.verify_tree_greedy_triton(
            predicts=c["predicts"], accept_index=c["accept_index"],
            accept_token_num=c["accept_token_num"], candidates=c["candidates"],
            retrieve_index=c["retrive_index"], retrieve_next_token=c["retrive_next_token"],
            retrieve_next_sibling=c["retrive_next_sibling"],
            target_predict=c["target_predict"],
        )

    def copy_kv(c):
        bufs = [b.clone() for b in c["buffers"]]
        c["buffers"] = bufs
        ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
        strides = torch.tensor([b.stride(0) * b.dtype.itemsize for b in bufs])
        tile = 128
        cfg = {
            "bytes_per_tile": tile,
            "byte_tiles": -(-int(strides.max()) // tile),
            "num_warps": 4,
        }
        n = c["tgt_loc"].numel()
        copy_all_layer_kv_cache_func(
            ptrs, strides, c["tgt_loc"], c["src_loc"], n, next_power_of_2(n), cfg
        )

    def reconstruct(c):
        reconstruct_indices_from_tree_mask_triton(
            c["tree_mask"], c["verified_seq_len"], c["positions"], c["retrive_index"],
            c["retrive_next_token"], c["retrive_next_sibling"], c["batch_size"],
            c["draft_token_num"],
        )

    run("assign_req_to_token_pool", assign_req)
    run("assign_extend_cache_locs", assign_extend)
    run("assign_draft_cache_locs_contiguous", assign_draft)
    run("fill_bonus_tokens", bonus)
    run("fill_accept_out_cache_loc", accept_loc)
    run("build_tree", build_tree)
    run("verify_tree_greedy", verify)
    run("copy_all_layer_kv_cache", copy_kv)
    run("reconstruct_tree", reconstruct)
    torch.save(out, sys.argv[2])
    """
)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[dict[str, list[Case]], dict[str, list[Case]]]:
    g = torch.Generator().manual_seed(20250523)
    cases = {name: gen(g) for name, gen in GENERATORS.items()}
    tmp: Path = tmp_path_factory.mktemp("cpu_kernels_ref")
    cases_file, out_file, script = tmp / "cases.pt", tmp / "ref.pt", tmp / "reference.py"
    torch.save(cases, cases_file)
    script.write_text(_REFERENCE_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_USE_CPU_ENGINE"}
    env.update(TRITON_INTERPRET="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(script), str(cases_file), str(out_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"reference subprocess failed:\n{proc.stderr[-4000:]}"
    return cases, torch.load(out_file)


# --------------------------------------------------------------------------------------------
# our ops, called exactly as SGLang's CPU call sites call them
# --------------------------------------------------------------------------------------------


def _ours(name: str, case: Case) -> Case:
    c = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    if name == "assign_req_to_token_pool":  # allocation.assign_req_to_token_pool_func
        K.assign_req_to_token_pool_cpu(
            c["req_pool_indices"],
            c["req_to_token"],
            c["start_offset"],
            c["end_offset"],
            c["out_cache_loc"],
            c["req_to_token"].shape[1],
        )
    elif name == "assign_extend_cache_locs":  # cache_locs.assign_extend_cache_locs_func
        K.assign_extend_cache_locs_cpu(
            c["req_pool_indices"],
            c["req_to_token"],
            c["start_offset"],
            c["end_offset"],
            c["out_cache_loc"],
            c["req_to_token"].shape[1],
        )
    elif name == "assign_draft_cache_locs_contiguous":
        K.assign_draft_cache_locs_contiguous_cpu(
            c["req_pool_indices"],
            c["req_to_token"],
            c["seq_lens"],
            c["out_cache_loc"],
            c["req_to_token"].shape[1],
            c["topk"],
            c["num_cols"],
        )
    elif name == "fill_bonus_tokens":
        K.fill_bonus_tokens_cpu(
            c["accept_tokens"], c["accept_lens"], c["bonus_tokens"], c["accept_stride"]
        )
    elif name == "fill_accept_out_cache_loc":
        K.fill_accept_out_cache_loc_cpu(
            c["accept_index"], c["out_cache_loc"], c["accept_out_cache_loc"]
        )
    elif name == "build_tree":  # spec_tree.build_tree_kernel_efficient_func (positional)
        K.build_tree_kernel_efficient_cpu(
            c["parent_list"],
            c["selected_index"],
            c["verified_seq_len"],
            c["tree_mask"],
            c["positions"],
            c["retrive_index"],
            c["retrive_next_token"],
            c["retrive_next_sibling"],
            c["topk"],
            c["depth"],
            c["draft_token_num"],
            c["tree_mask_mode"],
        )
    elif name == "verify_tree_greedy":  # spec_tree.verify_tree_greedy_func (keywords)
        K.verify_tree_greedy_cpu(
            predicts=c["predicts"],
            accept_index=c["accept_index"],
            accept_token_num=c["accept_token_num"],
            candidates=c["candidates"],
            retrive_index=c["retrive_index"],
            retrive_next_token=c["retrive_next_token"],
            retrive_next_sibling=c["retrive_next_sibling"],
            target_predict=c["target_predict"],
        )
    elif name == "copy_all_layer_kv_cache":  # cache_move.copy_all_layer_kv_cache_func
        bufs = [b.clone() for b in c["buffers"]]
        c["buffers"] = bufs
        ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
        strides = torch.tensor([b.stride(0) * b.dtype.itemsize for b in bufs])
        n = c["tgt_loc"].numel()
        K.copy_all_layer_kv_cache_cpu(ptrs, strides, c["tgt_loc"][:n], c["src_loc"][:n])
    elif name == "reconstruct_tree":  # reconstruct_tree.reconstruct_indices_from_tree_mask_func
        K.reconstruct_indices_from_tree_mask(
            c["tree_mask"],
            c["verified_seq_len"],
            c["positions"],
            c["retrive_index"],
            c["retrive_next_token"],
            c["retrive_next_sibling"],
            c["batch_size"],
            c["draft_token_num"],
        )
    else:
        raise KeyError(name)
    return c


def _assert_same(name: str, idx: int, ours: Case, ref: Case) -> None:
    for key, ref_value in ref.items():
        mine = ours[key]
        pairs = zip(mine, ref_value, strict=True) if key == "buffers" else [(mine, ref_value)]
        for a, b in pairs:
            if isinstance(b, torch.Tensor):
                assert a.dtype == b.dtype and a.shape == b.shape, f"{name}[{idx}].{key}"
                assert torch.equal(a, b), f"{name}[{idx}].{key} differs from SGLang's kernel"
            else:
                assert a == b, f"{name}[{idx}].{key}"


def _changed(before: Any, after: Any) -> bool:
    if isinstance(before, list):
        return any(_changed(x, y) for x, y in zip(before, after, strict=True))
    return not torch.equal(before, after)


@pytest.mark.parametrize("name", list(GENERATORS))
def test_matches_sglang_reference(reference, name: str) -> None:
    cases, refs = reference
    assert len(refs[name]) == len(cases[name]) > 0
    for idx, (case, ref) in enumerate(zip(cases[name], refs[name], strict=True)):
        _assert_same(name, idx, _ours(name, case), ref)
    # Not vacuous: in most cases the reference really wrote each output (a case may leave one
    # as initialised, e.g. only empty ranges, chains without siblings, nothing accepted).
    for key in MUTATED[name]:
        written = [_changed(c[key], r[key]) for c, r in zip(cases[name], refs[name], strict=True)]
        assert sum(written) * 2 > len(written), f"{name}.{key} rarely written: {written}"


def test_verify_cases_exercise_acceptance(reference) -> None:
    """The verify cases cover no acceptance, partial and full-depth acceptance."""
    _, refs = reference
    ratios = set()
    for ref in refs["verify_tree_greedy"]:
        slots = ref["accept_index"].shape[1]
        for num in ref["accept_token_num"].tolist():
            ratios.add(0 if num == 0 else (2 if num == slots - 1 else 1))
    assert ratios == {0, 1, 2}


def test_build_tree_cases_exercise_branching(reference) -> None:
    """Some built trees have siblings and paths deeper than one step."""
    cases, refs = reference
    assert any(bool((r["retrive_next_sibling"] != -1).any()) for r in refs["build_tree"])
    depths = [
        r["positions"].view(len(c["verified_seq_len"]), -1)
        - c["verified_seq_len"].to(torch.long)[:, None]
        for c, r in zip(cases["build_tree"], refs["build_tree"], strict=True)
    ]
    assert max(int(d.max()) for d in depths) >= 3


def test_off_by_one_variants_differ(reference) -> None:
    """Sanity: the equality checks have teeth; an op off by one in its indexing would fail."""
    cases, refs = reference

    case = cases["assign_extend_cache_locs"][4]
    shifted = dict(case, start_offset=case["start_offset"] + 1, end_offset=case["end_offset"] + 1)
    out = _ours("assign_extend_cache_locs", shifted)["out_cache_loc"]
    assert not torch.equal(out, refs["assign_extend_cache_locs"][4]["out_cache_loc"])

    case = cases["fill_bonus_tokens"][2]
    lens = case["accept_lens"]
    shifted = dict(case, accept_lens=torch.where(lens > 1, lens - 1, lens + 1))
    out = _ours("fill_bonus_tokens", shifted)["bonus_tokens"]
    assert not torch.equal(out, refs["fill_bonus_tokens"][2]["bonus_tokens"])

    case = cases["build_tree"][2]  # FULL_MASK, bs = 3: move one prefix token (same mask size)
    seq = case["verified_seq_len"].clone()
    seq[0] += 1
    seq[-1] -= 1
    shifted = dict(case, verified_seq_len=seq)
    out = _ours("build_tree", shifted)
    assert not torch.equal(out["positions"], refs["build_tree"][2]["positions"])
    assert not torch.equal(out["tree_mask"], refs["build_tree"][2]["tree_mask"])

    case = cases["copy_all_layer_kv_cache"][2]
    out = _ours("copy_all_layer_kv_cache", dict(case, src_loc=(case["src_loc"] + 1) % 40))
    ref = refs["copy_all_layer_kv_cache"][2]["buffers"]
    assert not all(torch.equal(a, b) for a, b in zip(out["buffers"], ref, strict=True))


# --------------------------------------------------------------------------------------------
# properties that need no reference
# --------------------------------------------------------------------------------------------


def test_op_names_cover_sglang_cpu_imports() -> None:
    """Every `from sgl_kernel import X_cpu` that SGLang runs at import time under `_is_cpu` in
    the modules a CPU Llama server (with EAGLE/NGRAM speculation) loads is provided."""
    import ast

    root = Path(importlib.util.find_spec("sglang").origin).parent
    files = [
        "kernels/ops/kvcache/cache_move.py",
        "kernels/ops/speculative/cache_locs.py",
        "kernels/ops/speculative/eagle.py",
        "kernels/ops/speculative/spec_tree.py",
        "srt/mem_cache/allocation.py",
    ]
    imported = set()
    for rel in files:
        for node in ast.walk(ast.parse((root / rel).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "sgl_kernel":
                imported |= {a.name for a in node.names if a.name.endswith("_cpu")}
    assert imported == set(K.SGL_KERNEL_CPU_OPS)
    # NGRAM also needs `sgl_kernel.speculative.reconstruct_indices_from_tree_mask` on CPU.
    tree = ast.parse((root / "kernels/ops/speculative/reconstruct_tree.py").read_text())
    speculative = {
        a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "sgl_kernel.speculative"
        for a in node.names
    }
    assert speculative == set(K.SGL_KERNEL_SPECULATIVE_OPS)
    assert all(callable(getattr(K, name)) for name in K.SGL_KERNEL_SPECULATIVE_OPS)
    assert len(set(K.SGL_KERNEL_CPU_OPS)) == len(K.SGL_KERNEL_CPU_OPS)
    assert all(callable(getattr(K, name)) for name in K.SGL_KERNEL_CPU_OPS)


def test_copy_kv_cache_in_place_swap_and_rejects_negative() -> None:
    buf = torch.arange(6 * 5, dtype=torch.int16).view(6, 5)
    before = buf.clone()
    ptrs = torch.tensor([buf.data_ptr()], dtype=torch.uint64)
    strides = torch.tensor([buf.stride(0) * buf.dtype.itemsize])
    K.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([1, 4]), torch.tensor([4, 1]))
    assert torch.equal(buf[1], before[4]) and torch.equal(buf[4], before[1])
    assert torch.equal(buf[[0, 2, 3, 5]], before[[0, 2, 3, 5]])
    with pytest.raises(IndexError):
        K.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([-1]), torch.tensor([0]))
    # No locations: nothing to do (SGLang's warm-up passes num_locs=1 of zeros, also a no-op).
    K.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([0])[:0], torch.tensor([0])[:0])
    K.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([0]), torch.tensor([0]))
    assert torch.equal(buf[0], before[0])


def test_bitpacked_tree_mask_is_rejected() -> None:
    with pytest.raises(NotImplementedError):
        K.build_tree_kernel_efficient_cpu(
            torch.zeros(1, 1, dtype=torch.long),
            torch.zeros(1, 1, dtype=torch.long),
            torch.ones(1, dtype=torch.long),
            torch.zeros(2, dtype=torch.uint8),
            torch.zeros(2, dtype=torch.long),
            *torch.full((3, 1, 2), -1, dtype=torch.long),
            1,
            1,
            2,
            2,
        )
