"""The per-width CUDA graph captures of the worker's start-up (capture.capture_runtime), with the
device's memory and SGLang's capture stubbed: captured when there is room, with the memory they
took logged; skipped below RUNTIME_MIN_FREE free, naming --mem-fraction-static; a failed capture
is served eagerly rather than refusing to start."""

from __future__ import annotations

import contextlib

import pytest

from domino_sglang.integration import capture
from domino_sglang.integration.capture import RUNTIME_MIN_FREE
from domino_sglang.spec.tp import RankAgreement

GB = 1 << 30


@pytest.mark.parametrize("free,fails,captured,said", [
    ([8 * GB, 7 * GB], False, True, "verify CUDA graphs at width 4 took 1024.0 MB"),
    ([RUNTIME_MIN_FREE - 1], False, False, "lower --mem-fraction-static"),
    ([8 * GB], True, False, "could not capture the verify CUDA graphs at width 4"),
])
def test_a_width_is_captured_only_with_room(monkeypatch, caplog, free, fails, captured, said):
    readings = iter(free)
    monkeypatch.setattr(capture, "free_device_memory", lambda device: next(readings))

    def fake_capture(model_runner, width):
        if fails:
            raise RuntimeError("capture failed")
        return ("backend", f"runner{width}")

    monkeypatch.setattr(capture, "verify_graph_runtime", fake_capture)
    runtimes: dict = {}
    with caplog.at_level("INFO", logger="domino_sglang.integration.worker"):
        capture.capture_runtime(runtimes, object(), 4, "verify", "cuda", RankAgreement())
    assert (4 in runtimes) is captured and said in caplog.text


# ---- tensor parallel: every rank captures the same widths (spec/tp.py RankAgreement) ----

MB = 1 << 20
# rank -> free memory before each width's capture: rank 0 just above RUNTIME_MIN_FREE at width
# 1, rank 1 just below; rank 1's capture at width 2 fails
RANK_FREE = {0: [RUNTIME_MIN_FREE + 50 * MB] * 6, 1: [RUNTIME_MIN_FREE - 50 * MB] + [8 * GB] * 5}
RANK_FAILS = {0: (), 1: (2,)}


def _captured_widths(rank: int, agreed: bool) -> list[int]:
    """The widths 1, 2, 4 rank `rank` captures, with its own faked free memory and failures,
    deciding as one group (agreed) or each rank alone (as before RankAgreement.least/every)."""
    from domino_sglang.spec.tp import group_minimum

    readings = iter(RANK_FREE[rank])
    capture.free_device_memory = lambda device: next(readings)

    def fake_capture(model_runner, width):
        if width in RANK_FAILS[rank]:
            raise RuntimeError("capture failed")
        return ("backend", f"runner{width}")

    capture.verify_graph_runtime = fake_capture
    agree = RankAgreement(minimum=group_minimum()) if agreed else RankAgreement()
    runtimes: dict = {}
    for width in (1, 2, 4):
        capture.capture_runtime(runtimes, object(), width, "verify", "cuda", agree)
    return sorted(runtimes)


def _verdicts(rank: int) -> list[list[int]]:
    """Each rank's own (different) verdict, then rank 0's broadcast to every rank."""
    import torch
    import torch.distributed as dist

    def broadcast(values, sampled):
        dist.broadcast(values, src=0)
        return values

    tokens = torch.tensor([[5, 6, 7], [8, 9, 10]]) + 100 * rank  # [bs 2, L 3]
    accept, judged = torch.tensor([3, 1 + rank]), torch.tensor([3, 2])
    out = RankAgreement(verdict=broadcast).same_verdict(tokens, accept, judged, sampled=True)
    return [t.tolist() for t in out]


def _rank(rank: int) -> tuple:
    return (_captured_widths(rank, True), _captured_widths(rank, False), _verdicts(rank))


def test_tensor_parallel_ranks_decide_as_one():
    """Rank-local free memory and a capture failing on one rank: the group decides once (its
    least free memory, a capture kept only where every rank succeeded), so both ranks serve
    the same widths from graphs; deciding alone, they diverge (NCCL would hang). Each rank's
    own verdict gives way to rank 0's."""
    from tests.spec.test_tp import _run

    (agreed0, alone0, verdict0), (agreed1, alone1, verdict1) = _run(_rank)
    assert agreed0 == agreed1 == [4]  # width 1: the least free too low; 2: failed on rank 1
    assert (alone0, alone1) == ([1, 2, 4], [4])  # what each rank would do by itself
    assert verdict0 == verdict1 == [[[5, 6, 7], [8, 9, 10]], [3, 1], [3, 2]]


def test_start_up_refuses_in_one_line_when_the_rollout_graphs_do_not_fit(monkeypatch):
    """The rollout's static buffers and its graph pool (estimated from the shapes) are counted
    before any capture against the TP group's least free memory; too little refuses to start,
    naming --mem-fraction-static, before anything is allocated on the device."""
    from types import SimpleNamespace

    import torch

    from tests.spec.test_rollout import H, make_head

    block = 8
    monkeypatch.setattr(capture, "decode_graph_batch_sizes", lambda device: (1, 2, 4))
    monkeypatch.setattr(capture, "attention_workspace_bytes", lambda runner: 0)
    opts = SimpleNamespace(gpu_shape=None, candidate_pool=0, head=True, short_draft=False,
                           draft_temperature_scale=1.0)
    parts = SimpleNamespace(
        options=opts, drafter=SimpleNamespace(head=make_head(0), copy=None), block_size=block,
        draft_pass=SimpleNamespace(graph_bs=None, runtimes={}),
        draft_worker=SimpleNamespace(init_cuda_graphs=lambda **kw: None),
        planner=SimpleNamespace(widths=None), policy=SimpleNamespace(widths=None),
        conf=SimpleNamespace(hidden_size=H), draft_model_runner=SimpleNamespace(
            dtype=torch.float32), agree=RankAgreement())
    runner = SimpleNamespace(model_config=SimpleNamespace(context_len=4096),
                             decode_cuda_graph_capture_bs=[1, 2, 4])

    def start(free: int):
        monkeypatch.setattr(capture, "free_device_memory", lambda device: free)
        return capture.capture_graphs(parts, runner, "cuda", {})

    with pytest.raises(RuntimeError, match="lower --mem-fraction-static") as refused:
        start(1)
    assert "\n" not in str(refused.value) and "MB of device memory is free" in str(refused.value)
    graphs = parts.drafter.rollout_graphs
    need = graphs.buffer_bytes() + graphs.pool_bytes()
    assert graphs.pool_bytes() > 0 and graphs.lengths == (2, 4, 8)  # the planner's widths
    assert not graphs.runners  # refused before building any runner
    assert parts.planner.widths == (1, 2, 4, 8)
    monkeypatch.setattr(capture.RolloutGraphs, "capture_startup", lambda self, stream: 0)
    monkeypatch.setattr(capture, "capture_stream", lambda on: contextlib.nullcontext())
    monkeypatch.setattr(capture, "verify_graph_runtime", lambda runner, width: ("b", width))
    verify: dict = {}
    monkeypatch.setattr(capture, "free_device_memory", lambda device: need + 2 * GB)
    assert capture.capture_graphs(parts, runner, "cuda", verify) and sorted(verify) == [1, 2, 4]
