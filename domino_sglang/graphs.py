"""Static-buffer runners for the draft side: one function over fixed-shape input buffers, replayed
as a CUDA graph on CUDA, run eagerly on the same buffers elsewhere (issue 64, item 3).

A `StaticRunner` owns its input buffers (one per named tensor, the shapes of one batch-size
bucket); a call copies the round's inputs into them and either replays the captured graph or runs
the function on them. Outputs are the runner's own buffers, overwritten by the next call. Torch
only: benchmarks/gpu_check.py runs it on a bare CUDA machine.

Verified: on the CPU, the eager static-buffer path equals the dynamic call (tests/test_rollout.py,
greedy / sampled / pointer rollouts). UNVERIFIED (no GPU in the session that wrote it): the CUDA
capture path (`capture=True`) is written to torch's documented recipe (warm-up on a side stream,
`torch.cuda.graph`, replay) and checked only by benchmarks/gpu_check.py, which has not yet run on
a GPU. The worker does not use it yet: the served draft pass goes through SGLang's attention
backend over the draft KV pool, whose graph capture this module does not cover.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# SGLang's default CUDA-graph batch sizes start 1, 2, 4, 8, then every 8 (graph runner buckets);
# a batch runs in the smallest bucket holding it, padded
BUCKETS = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)


def bucket_for(bs: int, buckets: tuple[int, ...] = BUCKETS) -> int | None:
    """The smallest bucket >= bs, or None when bs is larger than every bucket (run eagerly)."""
    for b in buckets:
        if b >= bs:
            return b
    return None


class StaticRunner:
    """fn(**inputs) -> tuple of tensors, over static input buffers shaped like `example`."""

    def __init__(self, fn: Callable[..., tuple[torch.Tensor, ...]],
                 example: dict[str, torch.Tensor], capture: bool, warmup: int = 2):
        self.fn = fn
        self.inputs = {k: v.clone() for k, v in example.items()}
        self.graph = None
        if capture:  # UNVERIFIED on a GPU (module docstring)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(warmup):  # allocator / cuBLAS warm-up outside the capture
                    fn(**self.inputs)
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.outputs = fn(**self.inputs)
        else:
            self.outputs = None

    def __call__(self, **inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Copy `inputs` (same names, shapes and dtypes as the example) into the buffers and run."""
        for name, value in inputs.items():
            buf = self.inputs[name]
            if value.shape != buf.shape:
                raise ValueError(f"StaticRunner: input {name!r} has shape {tuple(value.shape)}, "
                                 f"the buffer {tuple(buf.shape)}")
            buf.copy_(value)
        if self.graph is not None:
            self.graph.replay()
        else:
            self.outputs = self.fn(**self.inputs)
        return self.outputs
