"""Static-buffer runners for the draft side: one function over fixed-shape input buffers, replayed
as a CUDA graph on CUDA, run eagerly on the same buffers elsewhere.

A `StaticRunner` owns (or is given) its input buffers, the shapes of one batch-size bucket; a call
copies the round's inputs into them and either replays the captured graph or runs the function
on them. Outputs are the runner's own, overwritten by its next call. `RolloutGraphs` keeps one
runner per (batch bucket, L, ...) for the head rollout (greedy, sampled, with a pointer
drafter's device copy path): rows beyond the batch are padding, reset every round, their
outputs dropped.

Every decision is the same on every device: the buckets are the batch sizes SGLang captured
(sglang_compat.graph_batch_sizes), the runners built at start-up (`capture_startup`) are the
only ones captured, and a round whose key was not built then runs its runner eagerly on the
same buffers (`replayed` says which). On CUDA (SGLang's CUDA graphs on) `capture=True` turns
the start-up runners into graphs; on the CPU under `--speculative-domino-debug-gpu-shape on`
the same runners run eagerly (the tests' view of the GPU path). The draft backbone pass is
captured by SGLang's own draft graph runner (worker.init_cuda_graphs), not here. Torch only:
benchmarks/gpu_check.py runs this module on a bare CUDA machine.

Verified: on the CPU the static-buffer path, padding included, equals the dynamic rollout token
for token and q for q (tests/spec/test_graphs.py: greedy / sampled / pointer) and the served output
equals plain decoding with it on (tests/server/test_domino_server.py). UNVERIFIED (no GPU so far):
the CUDA capture itself (`capture=True`), written to torch's documented recipe (warm-up on a side
stream, `torch.cuda.graph` with one shared memory pool, replay) and exercised only by
benchmarks/gpu_check.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from domino_sglang.spec.pointer import DevicePointerCopy
from domino_sglang.spec.rollout import HeadParams, greedy_rollout, sampled_rollout
from domino_sglang.spec.sampling import TOP_K_BOUND, SamplingRows, SparseQ

# Batch-size buckets where SGLang's own capture list is not at hand (unit tests, gpu_check.py):
# its default sizes start 1, 2, 4, 8, then every 8; a batch runs in the smallest bucket holding it
BUCKETS = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)


# The verify (and short draft) widths captured besides the full block B: a round that wants L
# tokens verifies the smallest of these >= L, with that many real drafts (RoundPlanner.widths).
# The GPU's verify costs about as much at B as at 2 (it is launch- and weight-bound), so a few
# widths cover it; the CPU's cost grows with L, and outside the GPU shape it keeps every L.
CAPTURED_WIDTHS = (1, 2, 4, 8)


def verify_widths(block: int) -> tuple[int, ...]:
    """The widths rounds verify at when the target's verify runs from captured graphs."""
    return tuple(sorted({w for w in CAPTURED_WIDTHS if w < block} | {block}))


def width_for(length: int, widths: tuple[int, ...]) -> int:
    """The smallest width >= length (the largest if none is)."""
    return next((w for w in widths if w >= length), widths[-1])


def bucket_for(bs: int, buckets: tuple[int, ...] = BUCKETS) -> int | None:
    """The smallest bucket >= bs, or None when bs is larger than every bucket (run eagerly)."""
    for b in buckets:
        if b >= bs:
            return b
    return None


class StaticRunner:
    """fn(**inputs) -> tuple of tensors, over static input buffers: copies of `example`, or
    `example`'s tensors themselves with `own=False` (buffers shared with other runners). `pool`:
    a CUDA graph memory pool shared by runners that never replay concurrently. `stream`: the
    stream to warm up and capture on (SGLang's graph-capture stream, under which its TP
    collectives are the capturable ones); None: a fresh side stream."""

    def __init__(self, fn: Callable[..., tuple[torch.Tensor, ...]],
                 example: dict[str, torch.Tensor], capture: bool, warmup: int = 2,
                 own: bool = True, pool=None, stream=None):
        self.fn = fn
        self.inputs = {k: v.clone() for k, v in example.items()} if own else dict(example)
        self.graph = None
        self.outputs = None
        if capture:  # UNVERIFIED on a GPU (module docstring)
            stream = stream or torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(warmup):  # allocator / cuBLAS warm-up outside the capture
                    fn(**self.inputs)
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            # thread_local: another thread's CUDA call during a (lazy) capture is not an error
            with torch.cuda.graph(self.graph, pool=pool, stream=stream,
                                  capture_error_mode="thread_local"):
                self.outputs = fn(**self.inputs)

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

    def replay(self) -> tuple[torch.Tensor, ...]:
        """Run over the buffers as they are (the caller filled them in place)."""
        if self.graph is not None:
            self.graph.replay()
        else:
            self.outputs = self.fn(**self.inputs)
        return self.outputs


# The sampled rollout's dense q [bucket, B-1, V] float32 is one buffer per bucket (q of bucket
# 64 at Qwen3's 152k vocabulary would be 583 MB): kept up to this bucket; larger batches whose
# rows are not all top-k bounded roll out eagerly. Bounded rows (every top_k <= TOP_K_BOUND, as
# Qwen3's defaults) keep q as its support at every bucket (sparse_width entries a position).
SAMPLED_MAX_BUCKET = 16


def sparse_width(candidate_pool: int) -> int:
    """S, the support a position's q keeps for top-k bounded rows: at most TOP_K_BOUND tokens
    pass their top-k (at position 0, or over the whole vocabulary without a pool), the pool's K
    at the others, plus a pointer drafter's copy candidate."""
    return max(TOP_K_BOUND, candidate_pool) + 1
# A pointer drafter's history buffer widths (tokens): the copy index scans the whole width at
# every draft position, so a round runs at the smallest width holding its longest history.
# Start-up builds the first two (a chat's 256, a long prompt's 4096: on a GPU a scan of 4096
# positions per draft position costs little next to the head); a longer history runs at the
# next power of two, eagerly
HISTORY_WIDTHS = (256, 4096, *(8192 << i for i in range(7)))  # .. 512k
STARTUP_HISTORY_WIDTHS = HISTORY_WIDTHS[:2]


def history_width(tokens: int) -> int:
    """The smallest HISTORY_WIDTHS entry >= tokens (the largest if none is)."""
    return next((w for w in HISTORY_WIDTHS if w >= tokens), HISTORY_WIDTHS[-1])

_TOP_K_OFF = 1 << 30  # a padding row's top-k: no filter (top_k <= 1 would make it greedy)
# The sampled runners captured at start-up, by their filter flags (need_sort, need_min_p,
# has_greedy, top_k_bounded): temperature-only rows, and every filter on (exact for any mix of
# rows: a flag only skips work its rows do not need), top-k / top-p over the TOP_K_BOUND most
# likely tokens (every row's top_k within it, as Qwen3's defaults: q kept sparse) or over the
# whole sorted vocabulary. A round with other flags runs a filters-on runner; bounded rows always
# the bounded one.
SAMPLED_VARIANTS = ((False, False, False, False), (True, True, True, True),
                    (True, True, True, False))


class RolloutGraphs:
    """The head rollout (rollout.greedy_rollout, rollout.sampled_rollout) over static buffers:
    one StaticRunner per (kind, batch bucket, L, sampling flags, logit bias), all of a bucket
    reading the same input buffers (z [bucket, B, H], the sampling rows, a pointer drafter's
    history [bucket, W] at the smallest HISTORY_WIDTHS entry W holding the round's longest history,
    a key part too) and, sampled, writing q into one buffer per bucket (dense, up to
    SAMPLED_MAX_BUCKET) or returning it as its support (top-k bounded rows, any bucket). Their
    memory (q of bucket 16: 16 x (B-1) x V float32) is the plugin's, outside SGLang's static
    reservation.

    `buckets`: the batch sizes SGLang captured its decode graphs for. `capture`: CUDA graphs
    (one memory pool: safe because a round replays one rollout and consumes its outputs before
    the next), for the runners `capture_startup` builds (greedy: every bucket, L = 2..B, the
    smallest history width; sampled: the SAMPLED_VARIANTS, no logit bias, at buckets up to
    SAMPLED_MAX_BUCKET, the top-k bounded one at every bucket); a key first seen while serving
    gets a runner that runs eagerly (never a capture inside a serving round). Without
    `capture` every runner runs eagerly over the same buffers. Rows bs..bucket-1 are padding:
    every op of the rollout is row-wise, so they never reach a real row, and their outputs are
    dropped.
    `copy_gate`: a pointer drafter's gate, copy index on the device (pointer.DevicePointerCopy),
    or None."""

    def __init__(self, head: HeadParams, block: int, hidden: int, dtype: torch.dtype,
                 device: torch.device | str, *, candidate_pool: int, use_head: bool,
                 temperature_scale: float, copy_gate: torch.nn.Module | None,
                 history_cap: int, capture: bool, buckets: tuple[int, ...] = BUCKETS,
                 lengths: tuple[int, ...] | None = None):
        self.head, self.block, self.hidden, self.dtype = head, block, hidden, dtype
        self.device = torch.device(device)
        self.candidate_pool, self.use_head = candidate_pool, use_head
        self.temperature_scale, self.copy_gate = temperature_scale, copy_gate
        self.history_cap, self.capture, self.buckets = history_cap, capture, buckets
        # the rollout lengths built at start-up: the planner's verify widths above 1 (rounds
        # verify only at those), every 2..B where none are given
        self.lengths = tuple(range(2, block + 1)) if lengths is None else tuple(
            n for n in lengths if 2 <= n <= block)
        self.pool = None  # the CUDA graphs' memory pool, made by capture_startup
        self.buffers: dict[int, dict[str, torch.Tensor]] = {}  # bucket -> name -> buffer
        self.runners: dict[tuple, StaticRunner] = {}
        self.captured: set[tuple] = set()  # the keys built by capture_startup
        self._starting = False  # inside capture_startup: the only place a runner is captured
        self._stream = None  # capture_startup's capture stream
        self.input_rows = self._input_rows()

    def eager_reason(self, bs: int, sampled: bool, history_len: int | None = None,
                     bounded: bool = False) -> str | None:
        """Why a round of bs requests cannot use the runners (a label of
        domino_eager_rounds_total), or None when it can. `bounded`: every sampled row's top_k
        is at most TOP_K_BOUND (its q kept sparse: any bucket)."""
        bucket = bucket_for(bs, self.buckets)
        if bucket is None:
            return "batch_size"
        if sampled and not bounded and bucket > SAMPLED_MAX_BUCKET:
            return "sampled_batch_size"
        if history_len is not None and history_len > self.history_cap:
            return "history_length"
        return None

    # ---- the two rollouts ----
    def greedy(self, z: torch.Tensor, bonus: torch.Tensor, history: torch.Tensor | None = None,
               lens: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """greedy_rollout's (chain [bs, L-1], base picks [bs, L-1]) and, with the copy path
        (history [bs, T], lens [bs]), its copied positions [bs, L-1] bool; z [bs, L, H]."""
        bs, length = z.shape[0], z.shape[1]
        bucket = bucket_for(bs, self.buckets)
        self._fill(bucket, z, bonus, history, lens)
        out = self.runner(self.greedy_key(bs, length, history)).replay()
        return out[0][:bs], out[1][:bs], out[2][:bs] if len(out) > 2 else None

    def sampled(self, z: torch.Tensor, bonus: torch.Tensor, rows: SamplingRows,
                u_draft: torch.Tensor, logit_bias: torch.Tensor | None = None,
                history: torch.Tensor | None = None, lens: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """sampled_rollout's (drafts [bs, L-1], q [bs, L-1, V]); z [bs, L, H], u_draft
        [bs, L-1], logit_bias [bs, V] or None. q is a view of the bucket's buffer, valid until
        the next sampled rollout of that bucket: dense, or its support (SparseQ) where every
        row's top_k is bounded (sampled_key)."""
        bs, length = z.shape[0], z.shape[1]
        bucket = bucket_for(bs, self.buckets)
        bufs = self._fill(bucket, z, bonus, history, lens)
        for name in ("temperature", "top_k", "top_p", "min_p", "seed"):
            bufs[name][:bs].copy_(getattr(rows, name))
        bufs["u"][:bs, :length - 1].copy_(u_draft)
        if logit_bias is not None:
            self._buffer(bucket, "bias", (self.head.vocab_size,), torch.float32, 0)[:bs].copy_(
                logit_bias)
        key = self.sampled_key(bs, length, history, rows, logit_bias is not None)
        out = self.runner(key).replay()
        if self.sparse(key):
            return out[0][:bs], SparseQ(out[1][:bs], out[2][:bs], self.head.vocab_size)
        return out[0][:bs], out[1][:bs]

    # ---- which runner a round uses: the one decision, every device ----
    def greedy_key(self, bs: int, length: int, history: torch.Tensor | None) -> tuple:
        return ("greedy", bucket_for(bs, self.buckets), length, self._width(history))

    def sampled_key(self, bs: int, length: int, history: torch.Tensor | None,
                    rows: SamplingRows, bias: bool) -> tuple:
        flags = (rows.need_sort, rows.need_min_p, rows.has_greedy)
        variant = (SAMPLED_VARIANTS[1] if rows.top_k_bounded
                   else SAMPLED_VARIANTS[0] if not any(flags) else SAMPLED_VARIANTS[2])
        return ("sampled", bucket_for(bs, self.buckets), length, self._width(history), *variant,
                bias)

    @staticmethod
    def sparse(key: tuple) -> bool:
        """Whether a sampled runner keeps q as its support: its variant's rows are all top-k
        bounded (SAMPLED_VARIANTS' last flag), so no position has more than sparse_width
        tokens of positive probability."""
        return key[0] == "sampled" and key[7]

    def round_shape(self, bs: int, length: int, history: torch.Tensor | None,
                    rows: SamplingRows | None, bias: bool) -> tuple[tuple, bool]:
        """(the runner key, whether it replays a start-up runner) of a round of bs requests
        verifying `length` (rows: sampled, None: greedy): the one decision every device takes
        (drafter.static_rollout; tests/spec/test_graphs.py replays a recorded trace through it)."""
        key = (self.sampled_key(bs, length, history, rows, bias) if rows is not None
               else self.greedy_key(bs, length, history))
        return key, self.replayed(key)

    def replayed(self, key: tuple) -> bool:
        """Whether the round of `key` replays a runner built at start-up (a CUDA graph on
        CUDA); False: it runs eagerly over the static buffers."""
        return key in self.captured

    def startup_keys(self) -> list[tuple]:
        """The runners capture_startup builds (class docstring)."""
        lengths, widths = self.lengths, self.startup_widths()
        keys = [("greedy", b, n, w) for w in widths for b in self.buckets for n in lengths]
        keys += [("sampled", b, n, w, *variant, False) for w in widths for b in self.buckets
                 for n in lengths for variant in SAMPLED_VARIANTS
                 if b <= SAMPLED_MAX_BUCKET or variant[3]]  # bounded: q sparse, any bucket
        return keys

    def startup_widths(self) -> tuple[int, ...]:
        """The history widths start-up builds (STARTUP_HISTORY_WIDTHS up to the first holding
        the longest history served, `history_cap`); (0,) without a copy path."""
        if self.copy_gate is None:
            return (0,)
        widths = STARTUP_HISTORY_WIDTHS
        return widths[:next((i + 1 for i, w in enumerate(widths) if w >= self.history_cap),
                            len(widths))]

    def capture_startup(self, stream=None) -> int:
        """Build (capture, with `capture`) every start-up runner: the number built. Later keys
        run eagerly. `stream`: the capture stream (StaticRunner); at TP > 1 the caller holds
        SGLang's graph-capture context, so the head's all-gathers and all-reduces are captured
        through SGLang's capturable communicators, not torch.distributed's NCCL."""
        keys = self.startup_keys()
        if self.capture and self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        self._starting, self._stream = True, stream
        try:
            for key in keys:
                self.runner(key)
        finally:
            self._starting, self._stream = False, None
        self.captured.update(keys)
        return len(keys)

    def buffer_bytes(self) -> int:
        """The bytes of every buffer the start-up runners use, computed from the shapes alone
        (outside SGLang's memory reservation: checked against free memory before capture)."""
        rows = sum(math.prod(shape) * dtype.itemsize
                   for shape, dtype, _fill in self.input_rows.values())
        total = 0
        for b in self.buckets:
            total += b * rows
            if self.copy_gate is not None:
                total += b * sum(self.startup_widths()) * torch.int64.itemsize
            if b <= SAMPLED_MAX_BUCKET:  # the sampled q buffer
                total += b * (self.block - 1) * self.head.vocab_size * torch.float32.itemsize
        return total

    def pool_bytes(self) -> int:
        """An estimate of the CUDA graph memory pool the start-up runners share (they never run
        at once, so the pool holds the largest one's intermediates): the base logits of the
        largest bucket at the longest length, this rank's columns in the weight's dtype and
        the whole row in float32 (base_logits; at TP > 1 gathered over every rank's columns),
        twice over for the rollout's temporaries of their size. Only a measurement on the
        device says more (benchmarks/gpu_check.py reports both)."""
        weight = self.head.lm_head_weight if self.head.vocab is None else self.head.vocab_lm_head
        local = weight.shape[0]  # this rank's rows: V / N at TP > 1, or Vd
        whole = self.head.vocab_size if self.head.vocab is None else local
        rows = max(self.buckets) * (max(self.lengths, default=2) - 1)
        sparse = rows * sparse_width(self.candidate_pool) * (torch.int64.itemsize
                                                             + torch.float32.itemsize)
        return 2 * rows * (local * weight.dtype.itemsize + whole * torch.float32.itemsize) + sparse

    def _width(self, history: torch.Tensor | None) -> int:
        return 0 if history is None else history_width(history.shape[1])

    # ---- buffers and runners ----
    def _buffer(self, bucket: int, name: str, shape: tuple[int, ...], dtype: torch.dtype,
                fill: float) -> torch.Tensor:
        bufs = self.buffers.setdefault(bucket, {})
        if name not in bufs:
            bufs[name] = torch.full((bucket, *shape), fill, dtype=dtype, device=self.device)
        return bufs[name]

    def _fill(self, bucket: int, z: torch.Tensor, bonus: torch.Tensor,
              history: torch.Tensor | None, lens: torch.Tensor | None
              ) -> dict[str, torch.Tensor]:
        """Copy the round's rows into the bucket's buffers and reset its padding rows (bs..) to
        their harmless values: rows left from an earlier, larger batch would otherwise keep
        their history lengths, past a narrower history buffer of this round."""
        bs, length = z.shape[0], z.shape[1]
        self._inputs(bucket)
        bufs = self.buffers[bucket]
        for name, (_shape, _dtype, fill) in self.input_rows.items():
            bufs[name][bs:].fill_(fill)
        bufs["z"][:bs, :length].copy_(z)
        bufs["bonus"][:bs].copy_(bonus)
        if history is not None:
            width = history_width(history.shape[1])
            self._buffer(bucket, f"history{width}", (width,), torch.int64, 0)[
                :bs, :history.shape[1]].copy_(history)
            bufs["lens"][:bs].copy_(lens)
        return bufs

    def _input_rows(self) -> dict[str, tuple[tuple[int, ...], torch.dtype, float]]:
        """A bucket's input buffers: name -> (row shape, dtype, a padding row's value: a
        temperature of 1, no top-k / top-p / min-p filter, a one-token history)."""
        inputs = {"z": ((self.block, self.hidden), self.dtype, 0),
                  "bonus": ((), torch.int64, 0),
                  "temperature": ((), torch.float32, 1.0),
                  "top_p": ((), torch.float32, 1.0),
                  "min_p": ((), torch.float32, 0.0),
                  "top_k": ((), torch.int64, _TOP_K_OFF),
                  "seed": ((), torch.int64, 0),
                  "u": ((self.block - 1,), torch.float64, 0.5)}  # sampling.seeded_uniform's
        if self.copy_gate is not None:
            inputs["lens"] = ((), torch.int64, 1)
        return inputs

    def _inputs(self, bucket: int) -> None:
        """A bucket's input buffers (`input_rows`), allocated on first use."""
        for name, (shape, dtype, fill) in self.input_rows.items():
            self._buffer(bucket, name, shape, dtype, fill)

    def runner(self, key: tuple) -> StaticRunner:
        """The runner of `key`, built on first use: captured only inside capture_startup."""
        found = self.runners.get(key)
        if found is None:
            found = self.runners[key] = self._build(key)
        return found

    def _build(self, key: tuple) -> StaticRunner:
        kind, bucket, length, width = key[:4]
        self._inputs(bucket)
        bufs = self.buffers[bucket]
        n = length - 1
        inputs = {"z": bufs["z"][:, :length], "bonus": bufs["bonus"]}
        if self.copy_gate is not None:
            history = self._buffer(bucket, f"history{width}", (width,), torch.int64, 0)
            inputs.update(history=history, lens=bufs["lens"])
        head, pool, use_head = self.head, self.candidate_pool, self.use_head
        gate = self.copy_gate

        def copy_path(history, lens):
            return None if gate is None else DevicePointerCopy(gate, history, lens, n)

        if kind == "greedy":
            def fn(z, bonus, history=None, lens=None):
                copy = copy_path(history, lens)
                chain, picks = greedy_rollout(z, bonus, head, pool, use_head=use_head,
                                              return_base_pick=True, copy=copy)
                return (chain, picks) if copy is None else (chain, picks, copy.copied())
        else:
            need_sort, need_min_p, has_greedy, bounded, bias = key[4:]
            width = sparse_width(self.candidate_pool) if self.sparse(key) else 0
            if not width:
                self._buffer(bucket, "q", (self.block - 1, self.head.vocab_size), torch.float32,
                             0)
            if bias:
                self._buffer(bucket, "bias", (self.head.vocab_size,), torch.float32, 0)
            inputs.update({name: bufs[name] for name in
                           ("temperature", "top_k", "top_p", "min_p", "seed")})
            inputs.update(u=bufs["u"][:, :n])
            if not width:
                inputs.update(q=bufs["q"][:, :n])
            if bias:
                inputs["logit_bias"] = bufs["bias"]
            scale = self.temperature_scale

            def fn(z, bonus, temperature, top_k, top_p, min_p, seed, u, q=None, logit_bias=None,
                   history=None, lens=None):
                rows = SamplingRows(temperature, top_k, top_p, min_p, seed, need_sort,
                                    need_min_p, has_greedy, bounded)
                drafts, q = sampled_rollout(z, bonus, head, rows, u, pool, use_head=use_head,
                                            logit_bias=logit_bias, temperature_scale=scale,
                                            copy=copy_path(history, lens), out=q, sparse=width)
                return (drafts, q.ids, q.probs) if width else (drafts, q)
        return StaticRunner(fn, inputs, capture=self.capture and self._starting, own=False,
                            pool=self.pool, stream=self._stream)
