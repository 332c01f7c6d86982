"""GPU check of the project's pure-torch decode pieces: correctness of CUDA-graph capture + replay
against eager, and per-round draft time eager vs graph.

Runs on a bare CUDA machine: torch (>= 2.5 for SDPA's enable_gqa; the target machine has 2.11)
and the standard library only. SGLang, FlashInfer and the network are never touched: the
domino_sglang modules it imports (config, model, rollout, sampling, verify, pointer, graphs) do
not import SGLang (tests/project/test_gpu_check.py runs it with `import sglang` made to fail).

Pieces, with random weights at the chosen dimensions (default: Qwen3-8B's hidden 4096, 32 / 8
heads of 128, MLP 12288, vocabulary 151936; a 5-layer drafter, GRU 1024, head rank 256 are
assumptions, the shipped 135M drafter's ratios scaled up):
  backbone   DominoDrafter.backbone over the block [x_t, MASK x (B-1)] attending non-causally to
             C context K/V per layer (plain SDPA here; SGLang's backend in the server)
  greedy     the backbone + greedy head rollout (candidate pool 2048)
  sampled    the backbone + sampled head rollout (temperature 0.8, counter-based uniforms)
  pointer    the backbone + greedy rollout with the device copy index (pointer.DevicePointerCopy)
  verify     greedy and sampled acceptance over random target logits [bs, B, V]
  copy index pointer.device_candidates against the host copy_table
  rollout graphs  the worker's own runners (graphs.RolloutGraphs): captured replay == the same
             buffers run eagerly (tokens exactly, floats within FLOAT_TOL), greedy and sampled,
             padded batches included
  widths     the draft pass per verify width (graphs.verify_widths) at each batch size, eager
             and captured
  start-up   RolloutGraphs.capture_startup at the planner's widths: its time, its memory
             figure vs what it allocated, the device memory each kind of capture took, a trace
             that captures nothing more, shrinking batches and histories, the rollout time per
             verify width at each batch size
  sampled    a sampled verify at bs 1..64 (Qwen3's sampling defaults): top-k / top-p over the
             whole sorted vocabulary vs over the TOP_K_BOUND most likely tokens, the same
             tokens, the peak device memory and time of each
  train      a few AdamW steps of the drafter's training loss (train/module.DrafterTrainModule:
             the block drafts, the base-anchored curriculum, the copy gate) on one fixed batch
             of synthetic sequences, fp32 master weights under bf16 autocast on CUDA (as
             `domino-sglang train` runs there): every loss finite, the last below the first
Each draft variant is captured (graphs.StaticRunner) per batch size and its replay compared with
eager (token ids equal; floats within FLOAT_TOL of their scale); then timed eager vs replay.

    python benchmarks/gpu_check.py --device cuda                # H200: a few minutes
    python benchmarks/gpu_check.py --device cpu --quick         # small dims, < 1 min, no graphs

Writes a JSON result (--out; default benchmarks/results/gpu_check_<device>.json) and exits
non-zero if any check fails.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent

FULL = dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, inter=12288, vocab=151936,
            layers=5, gru=1024, emb=256, block=16, context=1024, pool=2048,
            batches=(1, 8, 32), history=2048, repeats=20,
            sampled_batches=(1, 8, 16, 32, 48, 64))
QUICK = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, inter=128, vocab=512, layers=2,
             gru=32, emb=16, block=8, context=24, pool=64, batches=(1, 3), history=40,
             repeats=3, sampled_batches=(1, 3))


def build(dims: dict, device: torch.device, dtype: torch.dtype):
    """A random drafter, target embedding / lm_head and head view at `dims`."""
    from domino_sglang.model.config import DraftConfig
    from domino_sglang.model.drafter import DominoDrafter
    from domino_sglang.spec.rollout import HeadParams

    conf = DraftConfig(
        path=Path("random"), block_size=dims["block"], hidden_size=dims["hidden"],
        num_layers=dims["layers"], num_heads=dims["heads"], num_kv_heads=dims["kv_heads"],
        head_dim=dims["head_dim"], intermediate_size=dims["inter"], rms_norm_eps=1e-6,
        rope_theta=1e6, vocab_size=dims["vocab"], max_position_embeddings=40960,
        target_layer_ids=(1, 2), mask_token_id=0, gru_hidden_dim=dims["gru"],
        emb_dim=dims["emb"], candidate_pool=dims["pool"], copy_gate=True)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.device(device):
        drafter = DominoDrafter(conf)
        embed = torch.nn.Embedding(dims["vocab"], dims["hidden"])
        lm_head = torch.empty(dims["vocab"], dims["hidden"])
    with torch.no_grad():
        for name, p in [*drafter.named_parameters(), ("embed", embed.weight),
                        ("lm_head", lm_head)]:
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02 if "embed" not in name else 1.0, generator=gen)
    drafter = drafter.to(dtype).eval()
    embed = embed.to(dtype)
    head = HeadParams.of(drafter, embed, lm_head.to(dtype))
    return conf, drafter, head


def make_attend(ctx_k: list[torch.Tensor], ctx_v: list[torch.Tensor], bs: int, block: int):
    """Non-causal block attention over [context ; block]: ctx_k/v per layer [bs, C, Hkv, D]."""
    def attend(i: int, q, k, v):
        t, hq, d = q.shape
        qb = q.view(bs, block, hq, d).transpose(1, 2)  # [bs, Hq, B, D]
        kb = torch.cat((ctx_k[i], k.view(bs, block, -1, d)), dim=1).transpose(1, 2)
        vb = torch.cat((ctx_v[i], v.view(bs, block, -1, d)), dim=1).transpose(1, 2)
        out = F.scaled_dot_product_attention(qb, kb, vb, enable_gqa=True)  # [bs, Hq, B, D]
        return out.transpose(1, 2).reshape(t, hq, d)
    return attend


def round_inputs(dims: dict, conf, bs: int, device, dtype, seed: int) -> dict:
    """One round's inputs for bs requests (random context, histories with repeats)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    c, b, kv, d = dims["context"], dims["block"], dims["kv_heads"], dims["head_dim"]
    t = dims["history"]
    hist = torch.randint(0, 50, (bs, t), generator=g)  # small alphabet: copies happen
    lens = torch.randint(t // 2, t + 1, (bs,), generator=g)
    bonus = hist.gather(1, (lens - 1)[:, None]).squeeze(1)
    prefix = lens.clone()  # committed tokens before x_t's position
    chain = torch.full((bs, b), conf.mask_token_id, dtype=torch.int64)
    chain[:, 0] = bonus
    positions = (prefix[:, None] + torch.arange(b)).reshape(-1)
    inputs = dict(chain=chain, positions=positions, bonus=bonus, history=hist, lens=lens,
                  seed=torch.arange(bs, dtype=torch.int64) + 7 * seed, prefix=prefix)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    for i in range(conf.num_layers):
        inputs[f"k{i}"] = torch.randn(bs, c, kv, d, generator=g).to(device, dtype)
        inputs[f"v{i}"] = torch.randn(bs, c, kv, d, generator=g).to(device, dtype)
    return inputs


def draft_fn(kind: str, conf, drafter, head, dims: dict, bs: int):
    """The round's draft side as one function of its inputs: (drafts [bs, B-1], q or picks)."""
    from domino_sglang.spec.pointer import DevicePointerCopy
    from domino_sglang.spec.rollout import greedy_rollout, sampled_rollout
    from domino_sglang.spec.sampling import RoundUniforms, SamplingRows

    block, n_layers = dims["block"], conf.num_layers

    def fn(chain, positions, bonus, history, lens, seed, prefix, **kv):
        ctx_k = [kv[f"k{i}"] for i in range(n_layers)]
        ctx_v = [kv[f"v{i}"] for i in range(n_layers)]
        embeds = head.embed(chain.reshape(-1))
        with torch.no_grad():
            z = drafter.backbone(embeds, positions, make_attend(ctx_k, ctx_v, bs, block))
            z = z.view(bs, block, -1)
            if kind == "backbone":
                return (z,)
            copy = (DevicePointerCopy(drafter.copy_gate, history, lens, block - 1)
                    if kind == "pointer" else None)
            if kind == "sampled":
                ones = torch.ones(bs, device=z.device)
                rows = SamplingRows(temperature=0.8 * ones, top_k=torch.full_like(seed, 1 << 30),
                                    top_p=ones, min_p=0 * ones, seed=seed, need_sort=False,
                                    need_min_p=False, has_greedy=False)
                u = RoundUniforms.for_round(seed, prefix, block)
                return sampled_rollout(z, bonus, head, rows, u.draft, dims["pool"])
            drafts, picks = greedy_rollout(z, bonus, head, dims["pool"], return_base_pick=True,
                                           copy=copy)
            return drafts, picks
    return fn


def timed(fn, repeats: int, device) -> float:
    """Median seconds of fn() over `repeats` calls (device synchronised around each)."""
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


# Replay vs eager: token ids exactly, floats within this tolerance relative to their scale.
# cuBLAS may pick another GEMM algorithm inside a capture, so low bits of bf16 outputs may move;
# float32 on the CPU runs the same kernels either way.
FLOAT_TOL = {torch.bfloat16: 2e-2, torch.float16: 2e-3, torch.float32: 1e-5}


def close(want: torch.Tensor, got: torch.Tensor, dtype: torch.dtype) -> tuple[bool, float]:
    """(equal under the rule above, max abs difference)."""
    if want.dtype in (torch.int64, torch.int32, torch.bool):
        return bool(torch.equal(want, got)), 0.0
    if not want.numel():
        return True, 0.0
    diff = float((want.float() - got.float()).abs().max())
    scale = max(1.0, float(want.float().abs().max()))
    return diff <= FLOAT_TOL.get(dtype, 1e-5) * scale, diff


def check_draft(kind, conf, drafter, head, dims, bs, device, dtype, graphs: bool) -> dict:
    """Static-buffer runner (captured on CUDA) vs the dynamic call, on two rounds' inputs."""
    from domino_sglang.spec.graphs import StaticRunner

    fn = draft_fn(kind, conf, drafter, head, dims, bs)
    first = round_inputs(dims, conf, bs, device, dtype, seed=1)
    t0 = time.perf_counter()
    runner = StaticRunner(fn, first, capture=graphs)
    setup = time.perf_counter() - t0
    out = {"kind": kind, "bs": bs, "graph": graphs, "setup_s": round(setup, 3)}
    ok = True
    for seed in (2, 3):  # replay on fresh inputs: the graph reads the buffers, not the example
        inputs = round_inputs(dims, conf, bs, device, dtype, seed=seed)
        want = fn(**inputs)
        got = runner(**inputs)
        for w, g in zip(want, got):
            same, diff = close(w, g, dtype)
            ok &= same
            if w.is_floating_point():
                out["max_abs_diff"] = max(out.get("max_abs_diff", 0.0), diff)
    out["equal"] = ok
    inputs = round_inputs(dims, conf, bs, device, dtype, seed=4)
    out["eager_ms"] = 1e3 * timed(lambda: fn(**inputs), dims["repeats"], device)
    if graphs:
        out["graph_ms"] = 1e3 * timed(lambda: runner(**inputs), dims["repeats"], device)
    return out


def check_rollout_graphs(conf, drafter, head, dims, device, dtype, graphs: bool) -> list[dict]:
    """The worker's own head-rollout runners (graphs.RolloutGraphs, pointer copy path on),
    built at start-up (capture_startup: captured on CUDA): replay == the same static buffers run
    eagerly (exact: this is the capture check), greedy and sampled, at a full bucket and a
    padded batch, and top-k bounded sampled rows at bucket 32 (q kept as its support: graphs
    above bucket 16); the share of drafts equal to the unpadded dynamic rollout (padding
    changes the GEMMs' row count, so low bits may move); the time of one L = B rollout,
    replayed vs dynamic."""
    from domino_sglang.spec.graphs import RolloutGraphs
    from domino_sglang.spec.pointer import DevicePointerCopy
    from domino_sglang.spec.rollout import greedy_rollout, sampled_rollout
    from domino_sglang.spec.sampling import RoundUniforms, SamplingRows, SparseQ

    block, hidden, cap = dims["block"], dims["hidden"], dims["history"]
    short = max(2, block // 3)
    make = lambda capture: RolloutGraphs(  # noqa: E731
        head, block, hidden, dtype, device, candidate_pool=dims["pool"], use_head=True,
        temperature_scale=0.6, copy_gate=drafter.copy_gate, history_cap=cap, capture=capture,
        buckets=(1, 2, 4, 8, 32), lengths=(short, block))
    replayed, eager = make(graphs), make(False)
    replayed.capture_startup()

    def dynamic(z, bonus, history, lens):
        copy = DevicePointerCopy(drafter.copy_gate, history, lens, z.shape[1] - 1)
        return greedy_rollout(z, bonus, head, dims["pool"], return_base_pick=True, copy=copy)

    rows_out = []
    for bs, length, bounded in ((8, block, False), (3, block, False), (5, short, False),
                                (20, block, True)):
        inputs = round_inputs(dims, conf, bs, device, dtype, seed=10 + bs)
        g = torch.Generator(device="cpu").manual_seed(bs)
        z = torch.randn(bs, length, hidden, generator=g).to(device, dtype)
        history, lens, bonus = inputs["history"], inputs["lens"], inputs["bonus"]
        ones = torch.ones(bs, device=device)
        top_k = torch.full_like(lens, 20 if bounded else 1 << 30)  # Qwen3's default: 20
        rows = SamplingRows(temperature=0.8 * ones, top_k=top_k, top_p=0.95 * ones if bounded
                            else ones, min_p=0 * ones, seed=inputs["seed"], need_sort=bounded,
                            need_min_p=False, has_greedy=False, top_k_bounded=bounded)
        u = RoundUniforms.for_round(rows.seed, inputs["prefix"], length).draft
        row = {"bs": bs, "L": length, "graph": graphs, "top_k_bounded": bounded,
               "replayed": replayed.round_shape(bs, length, history, rows, False)[1]}
        with torch.no_grad():
            a, b = replayed.greedy(z, bonus, history, lens), eager.greedy(z, bonus, history, lens)
            row["greedy_equal"] = all(torch.equal(x, y) for x, y in zip(a, b))
            want = dynamic(z, bonus, history, lens)
            row["greedy_same_as_dynamic"] = float((a[0] == want[0]).float().mean())
            (da, qa), (db, qb) = (replayed.sampled(z, bonus, rows, u, None, history, lens),
                                  eager.sampled(z, bonus, rows, u, None, history, lens))
            row["q_sparse"] = isinstance(qa, SparseQ)
            if row["q_sparse"]:
                qa, qb = qa.dense(), qb.dense()
            row["sampled_equal"] = bool(torch.equal(da, db)) and close(qa, qb, dtype)[0]
            dw, _ = sampled_rollout(z, bonus, head, rows, u, dims["pool"], temperature_scale=0.6,
                                    copy=DevicePointerCopy(drafter.copy_gate, history, lens,
                                                           length - 1))
            row["sampled_same_as_dynamic"] = float((da == dw).float().mean())
            if length == block:
                args = (z, bonus, history, lens)
                row["replay_ms"] = 1e3 * timed(partial(replayed.greedy, *args), dims["repeats"],
                                               device)
                row["dynamic_ms"] = 1e3 * timed(partial(dynamic, *args), dims["repeats"], device)
        rows_out.append(row)
    return rows_out


def check_draft_widths(conf, drafter, head, dims, device, dtype, graphs: bool) -> dict:
    """The draft pass (backbone over [x_t, MASK x (W-1)], a short draft) per verify width W at
    each batch size: eager and, on CUDA, captured (graphs.StaticRunner), in ms; the captured
    pass's drafts equal eager's within FLOAT_TOL."""
    from domino_sglang.spec.graphs import StaticRunner, verify_widths

    out, ok = {}, True
    for bs in dims["batches"]:
        for width in verify_widths(dims["block"])[1:]:
            dims_w = {**dims, "block": width}
            fn = draft_fn("backbone", conf, drafter, head, dims_w, bs)
            inputs = round_inputs(dims_w, conf, bs, device, dtype, seed=20 + width)
            row = {"eager_ms": round(1e3 * timed(partial(fn, **inputs), dims["repeats"],
                                                 device), 3)}
            if graphs:
                runner = StaticRunner(fn, inputs, capture=True)
                ok &= close(fn(**inputs)[0], runner(**inputs)[0], dtype)[0]
                row["graph_ms"] = round(1e3 * timed(partial(runner, **inputs),
                                                    dims["repeats"], device), 3)
            out[f"bs{bs}_W{width}"] = row
    return {"ok": ok, "ms": out}


def check_startup_runners(head, drafter, dims, device, dtype, graphs: bool) -> dict:
    """The worker's start-up capture (RolloutGraphs.capture_startup at SGLang-like buckets):
    the buffer bytes it computes from the shapes vs the memory it allocated, the number of
    runners, a replayed trace that builds none, the shrinking batch / history sequence that
    once indexed past a narrower history buffer (a device assert on CUDA), and the greedy
    rollout time per verify width at each batch size."""
    from domino_sglang.spec.graphs import RolloutGraphs, verify_widths

    block, hidden = dims["block"], dims["hidden"]
    buckets = tuple(sorted({1, 2, 4, 8, *dims["batches"]}))
    before = torch.cuda.memory_allocated(device) if graphs else 0
    rg = RolloutGraphs(head, block, hidden, dtype, device, candidate_pool=dims["pool"],
                       use_head=True, temperature_scale=0.6, copy_gate=drafter.copy_gate,
                       history_cap=dims["history"] * 4, capture=graphs, buckets=buckets,
                       lengths=verify_widths(block))
    per_capture = {}  # runner key -> device bytes its capture took (0 on the CPU)
    build_runner = rg.runner

    def measured_runner(key):
        at = torch.cuda.memory_allocated(device) if graphs else 0
        runner = build_runner(key)
        if key not in per_capture:
            per_capture[key] = (torch.cuda.memory_allocated(device) if graphs else 0) - at
        return runner

    rg.runner = measured_runner
    t0 = time.perf_counter()
    built = rg.capture_startup()
    rg.runner = build_runner
    kinds: dict[str, int] = {}
    for key, took in per_capture.items():
        name = f"{key[0]}_bs{key[1]}" + ("" if key[0] == "greedy" else f"_{key[4:8]}")
        kinds[name] = kinds.get(name, 0) + took
    out = {"buckets": list(buckets), "runners": built, "lengths": list(rg.lengths),
           "startup_s": round(time.perf_counter() - t0, 2), "buffer_bytes": rg.buffer_bytes(),
           "allocated_bytes": sum(t.nbytes for b in rg.buffers.values() for t in b.values()),
           "capture_bytes_by_kind": kinds, "pool_bytes_estimate": rg.pool_bytes()}
    if graphs:
        out["cuda_allocated_delta"] = torch.cuda.memory_allocated(device) - before
        out["pool_bytes_measured"] = out["cuda_allocated_delta"] - out["allocated_bytes"]
        out["cuda_max_allocated"] = torch.cuda.max_memory_allocated(device)
    g = torch.Generator(device="cpu").manual_seed(7)
    ok = True
    with torch.no_grad():
        for bs, t in ((4, 300), (2, 40), (3, 200), (1, 20)):  # widths 512, 256, 256, 256
            history = torch.randint(0, 3, (bs, t), generator=g).to(device)
            lens = torch.full((bs,), t, device=device)
            bonus = history[:, -1].clone()
            z = torch.randn(bs, block, hidden, generator=g).to(device, dtype)
            chain = rg.greedy(z, bonus, history, lens)[0]
            ok &= bool(((chain >= 0) & (chain < head.vocab_size)).all())
        if graphs:
            torch.cuda.synchronize(device)
        out["shrinking_sequence_ok"] = ok
        out["trace_built_nothing"] = len(rg.runners) == built + 1  # + the width-512 key
        times = {}
        for bs in dims["batches"]:
            history = torch.randint(0, 3, (bs, 100), generator=g).to(device)
            lens = torch.full((bs,), 100, device=device)
            for width in verify_widths(block)[1:]:
                z = torch.randn(bs, width, hidden, generator=g).to(device, dtype)
                times[f"bs{bs}_L{width}"] = round(1e3 * timed(
                    partial(rg.greedy, z, history[:, -1].clone(), history, lens),
                    dims["repeats"], device), 3)
        out["greedy_rollout_ms"] = times
    out["ok"] = ok and out["trace_built_nothing"] and out["buffer_bytes"] == out[
        "allocated_bytes"]
    return out


def check_verify(dims, device, bs: int) -> dict:
    """Greedy acceptance on the device equals the CPU's; sampled acceptance is a valid prefix."""
    from domino_sglang.spec.sampling import RoundUniforms, SamplingRows, process_logits
    from domino_sglang.spec.verify import verify_greedy, verify_mixed

    g = torch.Generator().manual_seed(5)
    b, v = dims["block"], dims["vocab"]
    logits = torch.randn(bs, b, v, generator=g)
    target = logits.argmax(-1)
    chain = torch.cat((torch.randint(0, v, (bs, 1), generator=g), target[:, :-1]), dim=1)
    chain[:, 1 + torch.randint(0, b - 1, (1,), generator=g)] = 0  # a rejection somewhere
    want = verify_greedy(chain, target)
    got = verify_greedy(chain.to(device), logits.to(device).argmax(-1))
    ok = all(torch.equal(w, x.cpu()) for w, x in zip(want, got))
    ones = torch.ones(bs)
    rows = SamplingRows(temperature=ones, top_k=torch.full((bs,), 1 << 30), top_p=ones,
                        min_p=0 * ones, seed=torch.arange(bs), need_sort=False,
                        need_min_p=False, has_greedy=False)
    q = process_logits(logits[:, :-1].reshape(-1, v), rows.repeat(b - 1)).view(bs, b - 1, v)
    dev = lambda t: t.to(device)  # noqa: E731
    drows = SamplingRows(*(dev(t) for t in (rows.temperature, rows.top_k, rows.top_p,
                                            rows.min_p, rows.seed)), False, False, False)
    u = RoundUniforms.for_round(drows.seed, torch.full((bs,), 100, device=device), b)
    tokens, lens = verify_mixed(dev(chain), dev(logits), dev(q), drows, u)
    ok &= bool(((lens >= 1) & (lens <= b)).all())
    t = 1e3 * timed(lambda: verify_mixed(dev(chain), dev(logits), dev(q), drows, u),
                    dims["repeats"], device)
    return {"bs": bs, "greedy_equal_cpu": ok, "sampled_verify_ms": t}


def check_sampled_rounds(dims, device) -> list[dict]:
    """A sampled verify at each batch size of SAMPLED_BATCHES (Qwen3's sampling defaults:
    T 0.6, top-k 20, top-p 0.95, every row): top-k / top-p over the whole sorted vocabulary
    against over the TOP_K_BOUND most likely tokens (SamplingRows.top_k_bounded), and the
    latter with q kept as its support (SparseQ, as the rollout graphs keep it for such rows):
    the same tokens, each one's peak device memory above its inputs (CUDA) and time, and the
    bytes of q dense and as its support."""
    from domino_sglang.spec.sampling import TOP_K_BOUND, RoundUniforms, SamplingRows, SparseQ
    from domino_sglang.spec.verify import verify_mixed

    b, v = dims["block"], dims["vocab"]
    out = []
    for bs in dims["sampled_batches"]:
        g = torch.Generator().manual_seed(bs)
        logits = (3 * torch.randn(bs, b, v, generator=g)).to(device)
        q = torch.softmax(3 * torch.randn(bs, b - 1, v, generator=g), dim=-1)
        top = q.topk(20, dim=-1)  # a draft's q after top-k 20: its support, 20 tokens
        q = torch.zeros_like(q).scatter_(-1, top.indices, top.values)
        q = (q / q.sum(-1, keepdim=True)).to(device)
        probs, ids = q.topk(min(TOP_K_BOUND + 1, v), dim=-1)
        sparse = SparseQ(ids, probs, v)
        row_q = {"q_dense_bytes": q.nbytes, "q_sparse_bytes": ids.nbytes + probs.nbytes}
        chain = torch.randint(0, v, (bs, b), generator=g).to(device)
        full = partial(lambda n, x, dt: torch.full((n,), x, dtype=dt, device=device), bs)
        row = {"bs": bs, **row_q}
        tokens = {}
        for bounded, q_kept in ((False, q), (True, q), (True, sparse)):
            rows = SamplingRows(full(0.6, torch.float32), full(20, torch.int64),
                                full(0.95, torch.float32), full(0.0, torch.float32),
                                torch.arange(bs, device=device), need_sort=True,
                                need_min_p=False, has_greedy=True, top_k_bounded=bounded)
            u = RoundUniforms.for_round(rows.seed, full(100, torch.int64), b)
            name = ("sparse_q" if q_kept is sparse else "bounded") if bounded else "sort"
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
                base = torch.cuda.memory_allocated(device)
            tokens[name] = [t.cpu() for t in verify_mixed(chain, logits, q_kept, rows, u)]
            if device.type == "cuda":
                row[f"{name}_peak_bytes"] = torch.cuda.max_memory_allocated(device) - base
            row[f"{name}_ms"] = round(1e3 * timed(
                partial(verify_mixed, chain, logits, q_kept, rows, u), dims["repeats"], device), 3)
        row["equal"] = all(torch.equal(a, c) for name in ("bounded", "sparse_q")
                           for a, c in zip(tokens["sort"], tokens[name]))
        out.append(row)
        del logits, q, sparse
    return out


def check_copy_index(dims, device) -> dict:
    """device_candidates on the device == copy_table on the host, every prefix of 4 histories."""
    from domino_sglang.spec.pointer import copy_table, device_candidates

    rng = random.Random(0)
    seqs = [[rng.randrange(6) for _ in range(rng.randrange(10, 200))] for _ in range(4)]
    t = max(map(len, seqs))
    buf = torch.tensor([s + [0] * (t - len(s)) for s in seqs], device=device)
    tables = [copy_table(s) for s in seqs]
    ok = True
    for pos in range(t):
        last = [min(pos, len(s) - 1) for s in seqs]
        c, n = device_candidates(buf, torch.tensor(last, device=device))
        want = [(int(cand[k]), int(m[k])) for (cand, m), k in zip(tables, last)]
        ok &= list(zip(c.tolist(), n.tolist())) == want
    big = torch.randint(0, 50, (32, dims["history"]), device=device)
    lens = torch.full((32,), dims["history"], device=device)
    ms = 1e3 * timed(lambda: device_candidates(big, lens - 1), dims["repeats"], device)
    return {"equal_copy_table": ok, "bs32_one_position_ms": ms}


TRAIN = dict(hidden=256, heads=4, kv_heads=2, head_dim=64, inter=512, vocab=4096, layers=2,
             gru=64, emb=32, block=16, seqs=4, length=160, anchors=8, first=8, steps=8)
TRAIN_QUICK = dict(hidden=32, heads=2, kv_heads=1, head_dim=16, inter=64, vocab=128, layers=1,
                   gru=16, emb=8, block=4, seqs=2, length=40, anchors=4, first=4, steps=6)


def check_train(dims: dict, device: torch.device) -> dict:
    """`steps` AdamW steps of the training loss on one fixed batch (fp32 master weights, bf16
    autocast on CUDA): losses finite and decreasing from the first step to the last. The
    sequences are learnable (x_{t+1} = x_t + stride), the features random."""
    from domino_sglang.model.config import DraftConfig
    from domino_sglang.model.drafter import DominoDrafter
    from domino_sglang.train.curriculum import lambda_at
    from domino_sglang.train.module import DrafterTrainModule
    from domino_sglang.train.records import sample_block_anchors

    conf = DraftConfig(
        path=Path("random"), block_size=dims["block"], hidden_size=dims["hidden"],
        num_layers=dims["layers"], num_heads=dims["heads"], num_kv_heads=dims["kv_heads"],
        head_dim=dims["head_dim"], intermediate_size=dims["inter"], rms_norm_eps=1e-6,
        rope_theta=1e6, vocab_size=dims["vocab"], max_position_embeddings=4096,
        target_layer_ids=(1, 2), mask_token_id=0, gru_hidden_dim=dims["gru"],
        emb_dim=dims["emb"], copy_gate=True)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    with torch.device(device):
        drafter = DominoDrafter(conf).float().train()
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
    v, h, t = dims["vocab"], dims["hidden"], dims["length"]
    embed = torch.randn(v, h, generator=g).to(device)  # [V, H]
    lm_head = (0.1 * torch.randn(v, h, generator=g)).to(device)  # [V, H]
    module = DrafterTrainModule(drafter, embed, lm_head)
    items = []
    for i in range(dims["seqs"]):
        ids = (3 + i + (1 + i % 3) * torch.arange(t)) % v  # [T]
        feats = torch.randn(t, 2 * h, generator=g)  # [T, K*H], K = 2 target layers
        anchors, first = sample_block_anchors(8, t, dims["anchors"], dims["first"], g)
        items.append((ids.to(device), feats.to(device), anchors, first))
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3, betas=(0.9, 0.95))
    bf16 = device.type == "cuda"
    losses = []
    t0 = time.perf_counter()
    for step in range(dims["steps"]):
        lam = lambda_at(step, dims["steps"], 0.25)  # the curriculum: lambda 1 -> 0
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss, _ = module(items, lam, 7.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    finite = all(x == x and abs(x) != float("inf") for x in losses)
    return {"steps": dims["steps"], "bf16_autocast": bf16, "losses": [round(x, 4) for x in losses],
            "finite": finite, "decreased": finite and losses[-1] < losses[0],
            "ms_per_step": round(1e3 * seconds / dims["steps"], 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), required=True)
    ap.add_argument("--quick", action="store_true", help="small dimensions (CI, < 1 minute)")
    ap.add_argument("--out", type=Path, default=None, help="result JSON path")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))  # the checkout's domino_sglang, installed or not
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    dims = QUICK if args.quick else FULL
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    graphs = device.type == "cuda"
    started = time.perf_counter()
    torch.manual_seed(0)
    conf, drafter, head = build(dims, device, dtype)
    result = {"device": torch.cuda.get_device_name() if graphs else "cpu",
              "torch": torch.__version__, "dims": {k: v for k, v in dims.items()},
              "dtype": str(dtype), "draft": [], "verify": []}
    for bs in dims["batches"]:
        for kind in ("backbone", "greedy", "sampled", "pointer"):
            row = check_draft(kind, conf, drafter, head, dims, bs, device, dtype, graphs)
            result["draft"].append(row)
            print(f"draft {kind:8s} bs {bs:3d}: equal {row['equal']}  eager "
                  f"{row['eager_ms']:.2f} ms" + (f"  graph {row['graph_ms']:.2f} ms"
                                                 if graphs else ""), flush=True)
        result["verify"].append(check_verify(dims, device, bs))
    result["rollout_graphs"] = check_rollout_graphs(conf, drafter, head, dims, device, dtype,
                                                    graphs)
    for row in result["rollout_graphs"]:
        print(f"rollout graphs: {row}", flush=True)
    result["draft_widths"] = check_draft_widths(conf, drafter, head, dims, device, dtype,
                                                graphs)
    print(f"draft pass per width: {result['draft_widths']}", flush=True)
    result["startup"] = check_startup_runners(head, drafter, dims, device, dtype, graphs)
    print(f"start-up runners: {result['startup']}", flush=True)
    result["sampled_rounds"] = check_sampled_rounds(dims, device)
    for row in result["sampled_rounds"]:
        print(f"sampled verify: {row}", flush=True)
    result["copy_index"] = check_copy_index(dims, device)
    result["train"] = check_train(TRAIN_QUICK if args.quick else TRAIN, device)
    print(f"train: {result['train']}", flush=True)
    result["seconds"] = round(time.perf_counter() - started, 1)
    ok = (all(r["equal"] for r in result["draft"])
          and all(r["greedy_equal"] and r["sampled_equal"] and r["replayed"]
                  and r["q_sparse"] == r["top_k_bounded"] for r in result["rollout_graphs"])
          and all(r["greedy_equal_cpu"] for r in result["verify"])
          and result["copy_index"]["equal_copy_table"]
          and result["startup"]["ok"] and result["draft_widths"]["ok"]
          and all(r["equal"] for r in result["sampled_rounds"])
          and result["train"]["decreased"])
    result["ok"] = ok
    print(f"verify: {result['verify']}\ncopy index: {result['copy_index']}\n"
          f"{'OK' if ok else 'FAILED'} in {result['seconds']} s", flush=True)
    out = args.out or ROOT / "benchmarks" / "results" / f"gpu_check_{args.device}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
