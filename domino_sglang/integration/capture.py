"""The round's CUDA graphs, captured once at start-up after the target's: the draft pass, the
head rollout's static runners and the target's verify at each width the planner may choose.

Where SGLang captured decode graphs (CUDA, no --disable-cuda-graph), at the batch sizes it
captured: the draft pass by SGLang's own draft graph runner (TARGET_VERIFY at width B, as its
DFLASH worker does) and per smaller draft width, the head rollout's start-up runners
(spec/graphs.py), and a target verify runtime per captured width below B (graphs.verify_widths:
plain rounds at width 1). Rounds then verify only at those widths (the planner rounds L up).
`--speculative-domino-debug-gpu-shape on` takes every one of these decisions where no graphs
run (the CPU): the same buckets, widths and start-up runners, run eagerly.
UNVERIFIED on a GPU: no session that wrote it had one (README, GPU).

Private SGLang internals (sglang_compat.py): the decode graph runner's batch sizes, the draft
worker's `init_cuda_graphs`, `verify_graph_runtime`.
"""

from __future__ import annotations

import logging

from domino_sglang.integration.build import RoundParts
from domino_sglang.sglang_compat import (
    attention_workspace_bytes,
    capture_stream,
    decode_graph_batch_sizes,
    free_device_memory,
    graph_batch_sizes,
    verify_graph_runtime,
)
from domino_sglang.spec.graphs import BUCKETS, RolloutGraphs, verify_widths
from domino_sglang.spec.tp import RankAgreement

logger = logging.getLogger("domino_sglang.integration.worker")  # the start-up lines: the worker's
# Free device memory a per-width graph capture needs to start (SGLang's DFLASH asks the same
# before capturing its draft graphs)
RUNTIME_MIN_FREE = 1 << 30


def capture_graphs(parts: RoundParts, model_runner, device, verify_runtimes: dict) -> bool:
    """Capture the round's graphs (module docstring) into the parts and `verify_runtimes`
    (width -> runtime); returns whether rounds are GPU-shaped (static buffers, captured
    widths), with or without graphs."""
    captured = decode_graph_batch_sizes(device)
    opts, drafter, block = parts.options, parts.drafter, parts.block_size
    gpu_shape = bool(captured) if opts.gpu_shape is None else opts.gpu_shape
    parts.draft_pass.graph_bs = captured
    parts.draft_worker.init_cuda_graphs(capture_decode_cuda_graph=bool(captured))
    if not gpu_shape:
        return False
    buckets = graph_batch_sizes(model_runner, captured, BUCKETS)
    widths = verify_widths(block)
    parts.planner.widths = parts.policy.widths = widths
    copy = drafter.copy
    graphs = drafter.rollout_graphs = RolloutGraphs(
        drafter.head, block, parts.conf.hidden_size, parts.draft_model_runner.dtype,
        device, candidate_pool=opts.candidate_pool, use_head=opts.head,
        temperature_scale=opts.draft_temperature_scale,
        copy_gate=copy.gate if copy is not None and copy.on_device else None,
        history_cap=model_runner.model_config.context_len,
        capture=bool(captured), buckets=buckets, lengths=widths)
    workspace = attention_workspace_bytes(model_runner)  # each verify runtime's own
    need = graphs.buffer_bytes() + (graphs.pool_bytes() if captured else 0)
    free = parts.agree.least(free_device_memory(device))  # the TP group's least
    logger.info("DOMINO: CUDA-graph shapes: batch buckets %s, verify widths %s; outside "
                "SGLang's reservation: %.1f MB of static rollout buffers and graph pool, "
                "%.1f MB of attention workspace per verify width (%s free)",
                list(buckets), list(widths), need / 2**20, workspace / 2**20,
                "n/a" if free is None else f"{free / 2**20:.0f} MB")
    if free is not None and need > free:
        raise RuntimeError(
            f"DOMINO: the head rollout's static buffers and graph pool need about "
            f"{need / 2**20:.0f} MB but {free / 2**20:.0f} MB of device memory is free on the "
            f"least free rank: lower --mem-fraction-static (or --max-running-requests, or "
            f"--disable-cuda-graph)")
    with capture_stream(bool(captured)) as stream:  # SGLang's graph-capture context
        built = graphs.capture_startup(stream)
    logger.info("DOMINO: %d head-rollout runners built at start-up (%s)", built,
                "CUDA graphs" if captured else "run eagerly: no CUDA graphs here")
    if not captured:
        return True
    for width in widths:
        if width < block:
            capture_runtime(verify_runtimes, model_runner, width, "verify", device,
                            parts.agree, workspace)
            if opts.short_draft and width > 1:
                capture_runtime(parts.draft_pass.runtimes, parts.draft_model_runner, width,
                                "draft pass", device, parts.agree, workspace)
    logger.info("DOMINO: target verify CUDA graphs captured at widths %s, draft pass at %s",
                sorted(verify_runtimes) + [block], sorted(parts.draft_pass.runtimes) + [block])
    return True


def capture_runtime(runtimes: dict, model_runner, width: int, what: str, device,
                    agree: RankAgreement, workspace: int = 0) -> None:
    """Capture `model_runner`'s graphs at `width` into runtimes[width], logging the device
    memory they took (outside SGLang's reservation: its attention `workspace`, known before,
    and the graphs, known only once captured). A width whose capture fails, or that would
    start with less than its workspace + RUNTIME_MIN_FREE free, is served eagerly
    (exact, slower; counted in domino_eager_rounds_total) and said, rather than refusing to
    start: these graphs are an optimisation. Decided for the TP group as one (tp.py): by its
    least free memory, and a capture counts only where it succeeded on every rank, so every
    rank replays the same widths and meets the same collectives. What agreement cannot undo:
    a capture that fails on one rank after the others entered its collectives (its warm-up
    forward) leaves them waiting there; the least-free-memory gate makes the likeliest cause,
    running out of memory, unlikely."""
    before = agree.least(free_device_memory(device))
    if before is not None and before < workspace + RUNTIME_MIN_FREE:
        logger.warning("DOMINO: %.0f MB free: the %s CUDA graphs at width %d are not "
                       "captured (rounds at that width run eagerly); lower "
                       "--mem-fraction-static to leave room", before / 2**20, what, width)
        return
    runtime = None
    try:
        runtime = verify_graph_runtime(model_runner, width)
    except Exception:  # noqa: BLE001 (any capture failure: the eager path stays correct)
        logger.exception("DOMINO: could not capture the %s CUDA graphs at width %d; rounds "
                         "at that width run eagerly", what, width)
    if not agree.every(runtime is not None):
        if runtime is not None:
            logger.warning("DOMINO: the %s CUDA graphs at width %d failed on another tensor-"
                           "parallel rank; rounds at that width run eagerly", what, width)
        return
    runtimes[width] = runtime
    after = free_device_memory(device)
    if before is not None and after is not None:
        logger.info("DOMINO: %s CUDA graphs at width %d took %.1f MB", what, width,
                    (before - after) / 2**20)
