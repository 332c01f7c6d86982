"""The head rollout over static per-bucket buffers (graphs.RolloutGraphs, what a GPU server replays
as CUDA graphs) equals the dynamic rollout, run eagerly on the CPU: greedy, sampled and a pointer
drafter's copy path, padded batches, stale padding rows from an earlier larger batch. The drafts
equal token for token; q bit for bit where the batch fills its bucket, to float32 rounding where
it is padded (the head's GEMMs over more rows)."""

from __future__ import annotations

import random

import pytest
import torch

from domino_sglang.spec.graphs import BUCKETS, RolloutGraphs, bucket_for
from domino_sglang.spec.pointer import DevicePointerCopy
from domino_sglang.spec.rollout import greedy_rollout, sampled_rollout
from domino_sglang.spec.sampling import RoundUniforms, SamplingRows, SparseQ
from tests.spec.test_pointer import _gate
from tests.spec.test_rollout import B, H, V, make_head

HISTORY_CAP = 40


def _histories(bs: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-aligned histories [bs, T] with recurring tokens (so copies win), lengths [bs]."""
    rng = random.Random(seed)
    seqs = [[rng.randrange(4) for _ in range(rng.randrange(3, 30))] for _ in range(bs)]
    t = max(map(len, seqs))
    buf = torch.tensor([s + [rng.randrange(V)] * (t - len(s)) for s in seqs])
    return buf, torch.tensor([len(s) for s in seqs])


def _rows(bs: int, kind: str) -> SamplingRows:
    g = torch.Generator().manual_seed(bs)
    temperature = 0.5 + torch.rand(bs, generator=g)
    top_k = torch.full((bs,), 1 << 30, dtype=torch.int64)
    top_p, min_p = torch.ones(bs), torch.zeros(bs)
    filters = kind in ("filters", "bounded")
    if filters:  # mixed rows: top-k, top-p, min-p and a greedy one
        top_k[0], top_p[1 % bs], min_p[-1] = 3, 0.7, 0.1
        if bs > 2:
            top_k[2] = 1
    if kind == "bounded":  # every row's top_k small (Qwen3's defaults: 20)
        top_k = top_k.clamp(max=20)
    return SamplingRows(temperature, top_k, top_p, min_p, torch.arange(bs) * 7 + 1,
                        need_sort=filters, need_min_p=filters, has_greedy=filters,
                        top_k_bounded=kind == "bounded")


def _graphs(head, pool, use_head, gate) -> RolloutGraphs:
    return RolloutGraphs(head, B, H, torch.float32, "cpu", candidate_pool=pool,
                         use_head=use_head, temperature_scale=0.6, copy_gate=gate,
                         history_cap=HISTORY_CAP, capture=False)


def test_buckets_are_sglangs_and_the_reasons_name_what_does_not_fit():
    assert (bucket_for(1), bucket_for(3), bucket_for(9), bucket_for(65)) == (1, 4, 16, None)
    graphs = _graphs(make_head(0), 0, True, None)
    assert graphs.eager_reason(8, sampled=False) is None
    assert graphs.eager_reason(BUCKETS[-1] + 1, sampled=False) == "batch_size"
    assert graphs.eager_reason(32, sampled=True) == "sampled_batch_size"
    assert graphs.eager_reason(64, sampled=True, bounded=True) is None  # q sparse: any bucket
    assert graphs.eager_reason(3, sampled=True, history_len=HISTORY_CAP + 1) == "history_length"


@pytest.mark.parametrize("pointer", [False, True])
@pytest.mark.parametrize("pool,use_head,vocab", [(0, True, None), (5, True, None),
                                                 (0, True, [9, 2, 5, 0, 7]), (0, False, None)])
def test_static_greedy_rollout_equals_dynamic(pool, use_head, vocab, pointer):
    head = make_head(1)
    if vocab is not None:
        head = head.with_vocab(torch.tensor(vocab))
    gate = _gate(0.5) if pointer else None
    graphs = _graphs(head, pool, use_head, gate)
    g = torch.Generator().manual_seed(2)
    # bs 8 first: its rows stay in the bucket-8 buffers as padding for bs 5 and 6
    for bs, length in ((8, B), (5, B), (6, 2), (3, 4), (1, 3), (5, 5)):
        z = torch.randn(bs, length, H, generator=g)
        bonus = torch.randint(0, V, (bs,), generator=g)
        history = lens = copy = None
        if pointer:
            history, lens = _histories(bs, seed=bs + length)
            bonus = history.gather(1, (lens - 1)[:, None]).squeeze(1)
            copy = DevicePointerCopy(gate, history, lens, length - 1)
        with torch.no_grad():
            want = greedy_rollout(z, bonus, head, pool, use_head=use_head, return_base_pick=True,
                                  copy=copy)
        chain, picks, copied = graphs.greedy(z, bonus, history, lens)
        assert torch.equal(chain, want[0]) and torch.equal(picks, want[1]), (bs, length)
        if pointer:
            assert torch.equal(copied, copy.copied()), (bs, length)
    if pointer:  # the copy path really drafted something
        assert bool(copied.any()) or bool(copy.copied().any())
    assert len(graphs.runners) == 5  # (bucket, L): (8, 6) twice


@pytest.mark.parametrize("pointer", [False, True])
@pytest.mark.parametrize("kind", ["temperature", "filters", "bounded"])
@pytest.mark.parametrize("pool,vocab,bias", [(0, None, False), (5, None, True),
                                             (0, [9, 2, 5, 0, 7], True)])
def test_static_sampled_rollout_equals_dynamic(pool, vocab, bias, kind, pointer):
    head = make_head(2)
    if vocab is not None:
        head = head.with_vocab(torch.tensor(vocab))
    gate = _gate(0.5) if pointer else None
    graphs = _graphs(head, pool, True, gate)
    g = torch.Generator().manual_seed(3)
    for bs, length in ((8, B), (5, 3), (7, B), (1, 2), (3, 5)):
        z = torch.randn(bs, length, H, generator=g)
        rows = _rows(bs, kind)
        u = RoundUniforms.for_round(rows.seed, torch.randint(5, 50, (bs,), generator=g), length)
        logit_bias = torch.randn(bs, V, generator=g) if bias else None
        history = lens = copy = None
        bonus = torch.randint(0, V, (bs,), generator=g)
        if pointer:
            history, lens = _histories(bs, seed=bs * length)
            bonus = history.gather(1, (lens - 1)[:, None]).squeeze(1)
            copy = DevicePointerCopy(gate, history, lens, length - 1)
        want_d, want_q = sampled_rollout(z, bonus, head, rows, u.draft, pool,
                                         logit_bias=logit_bias, temperature_scale=0.6, copy=copy)
        drafts, q = graphs.sampled(z, bonus, rows, u.draft, logit_bias, history, lens)
        assert torch.equal(drafts, want_d), (bs, length)
        assert tuple(q.shape) == (bs, length - 1, V)
        assert isinstance(q, SparseQ) == (kind == "bounded")  # bounded rows: q as its support
        if isinstance(q, SparseQ):
            q = q.dense()
        if bs == bucket_for(bs):
            assert torch.equal(q, want_q), (bs, length)
        else:  # a padded batch: the head's GEMMs run over more rows, and blocking by the row
            # count moves the last bits (float32 rounding; the drafts are drawn from the q
            # verified, so exactness does not depend on it)
            diff = float((q - want_q).abs().max())
            assert diff < 1e-6, (bs, length, diff)


@pytest.mark.parametrize("pointer", [False, True])
def test_bounded_rows_roll_out_from_start_up_runners_at_every_bucket(pointer):
    """Rows whose top_k is bounded (Qwen3's defaults) keep q as its support, [bucket, L-1, S]
    instead of [bucket, L-1, V]: start-up builds their runner at every bucket (the other
    sampled variants only up to SAMPLED_MAX_BUCKET), and a batch of 20 or 40 replays one, with
    the drafts and q of the dynamic rollout (q densified equal to the dense one, bit for bit
    where the batch fills its bucket)."""
    from domino_sglang.spec.graphs import SAMPLED_MAX_BUCKET, sparse_width

    head, pool = make_head(4), 5
    gate = _gate(0.5) if pointer else None
    graphs = RolloutGraphs(head, B, H, torch.float32, "cpu", candidate_pool=pool,
                           use_head=True, temperature_scale=0.6, copy_gate=gate,
                           history_cap=HISTORY_CAP, capture=False, buckets=(8, 16, 24, 40))
    keys = graphs.startup_keys()
    sampled = {(k[1], k[7]) for k in keys if k[0] == "sampled"}
    assert {b for b, bounded in sampled if not bounded} == {8, 16}
    assert {b for b, bounded in sampled if bounded} == {8, 16, 24, 40}
    graphs.capture_startup()
    g = torch.Generator().manual_seed(6)
    for bs in (20, 40, 24):
        z = torch.randn(bs, B, H, generator=g)
        rows = _rows(bs, "bounded")
        u = RoundUniforms.for_round(rows.seed, torch.randint(5, 50, (bs,), generator=g), B)
        history = lens = copy = None
        bonus = torch.randint(0, V, (bs,), generator=g)
        if pointer:
            history, lens = _histories(bs, seed=bs)
            bonus = history.gather(1, (lens - 1)[:, None]).squeeze(1)
            copy = DevicePointerCopy(gate, history, lens, B - 1)
        key, replayed = graphs.round_shape(bs, B, history, rows, bias=False)
        assert replayed and graphs.eager_reason(bs, True, bounded=True) is None
        assert bs <= SAMPLED_MAX_BUCKET or graphs.eager_reason(bs, True) == "sampled_batch_size"
        want_d, want_q = sampled_rollout(z, bonus, head, rows, u.draft, pool,
                                         temperature_scale=0.6, copy=copy)
        drafts, q = graphs.sampled(z, bonus, rows, u.draft, None, history, lens)
        assert torch.equal(drafts, want_d), bs
        assert isinstance(q, SparseQ) and q.ids.shape == (bs, B - 1, sparse_width(pool))
        diff = float((q.dense() - want_q).abs().max())
        assert (diff == 0.0) if bs == bucket_for(bs, graphs.buckets) else diff < 1e-6, (bs, diff)


def test_long_histories_run_at_a_wider_history_buffer():
    """A pointer drafter's history buffer is as wide as the smallest HISTORY_WIDTHS entry
    holding the round's longest history (the copy index scans the whole width): a 300-token
    history rolls out at width 4096, exactly as the dynamic rollout, under a key of its own;
    start-up builds the widths 256 and 4096 (up to the longest history served)."""
    from domino_sglang.spec.graphs import HISTORY_WIDTHS, history_width

    assert (history_width(1), history_width(256), history_width(257)) == (256, 256, 4096)
    assert (history_width(4097), history_width(10**9)) == (8192, HISTORY_WIDTHS[-1])
    head, gate = make_head(3), _gate(0.5)
    graphs = RolloutGraphs(head, B, H, torch.float32, "cpu", candidate_pool=0, use_head=True,
                           temperature_scale=1.0, copy_gate=gate, history_cap=4096,
                           capture=False)
    g = torch.Generator().manual_seed(9)
    for t in (40, 300):
        history = torch.randint(0, 3, (2, t), generator=g)  # 3 tokens: copies everywhere
        lens = torch.tensor([t, t - 7])
        bonus = history.gather(1, (lens - 1)[:, None]).squeeze(1)
        z = torch.randn(2, B, H, generator=g)
        copy = DevicePointerCopy(gate, history, lens, B - 1)
        with torch.no_grad():
            want = greedy_rollout(z, bonus, head, 0, return_base_pick=True, copy=copy)
        chain, picks, copied = graphs.greedy(z, bonus, history, lens)
        assert torch.equal(chain, want[0]) and torch.equal(copied, copy.copied()), t
    assert sorted(k[3] for k in graphs.runners) == [256, 4096]
    assert graphs.startup_widths() == (256, 4096)
    short = RolloutGraphs(head, B, H, torch.float32, "cpu", candidate_pool=0, use_head=True,
                          temperature_scale=1.0, copy_gate=gate, history_cap=200, capture=False)
    assert short.startup_widths() == (256,)  # no history served is longer


def test_runners_are_built_at_start_up_only(pointer=False):
    """capture_startup builds every greedy runner (each bucket, L = 2..B) and the sampled ones
    (buckets up to 16, every variant); a replayed trace of rounds after it builds nothing it
    would capture: a key first seen while serving (a logit bias, a wider history) runs eagerly
    over the static buffers, and says so."""
    graphs = RolloutGraphs(make_head(0), B, H, torch.float32, "cpu", candidate_pool=0,
                           use_head=True, temperature_scale=1.0, copy_gate=None,
                           history_cap=HISTORY_CAP, capture=False, buckets=(1, 2, 4))
    built = graphs.capture_startup()
    assert built == 3 * (B - 1) * 4 == len(graphs.runners)  # greedy + 3 sampled variants
    g = torch.Generator().manual_seed(4)
    for bs, kind in ((3, "plain"), (1, "filters"), (4, "plain"), (2, "filters")):
        z, bonus = torch.randn(bs, B, H, generator=g), torch.randint(0, V, (bs,), generator=g)
        graphs.greedy(z, bonus)
        rows = _rows(bs, kind)
        u = torch.rand(bs, B - 1, generator=g, dtype=torch.float64)
        graphs.sampled(z, bonus, rows, u)
        assert graphs.replayed(graphs.greedy_key(bs, B, None))
        assert graphs.replayed(graphs.sampled_key(bs, B, None, rows, False))
    assert len(graphs.runners) == built  # the trace built no runner
    mixed = _rows(2, "plain")
    mixed.need_sort = True  # a top-k row only: the filters-on runner serves it
    assert graphs.replayed(graphs.sampled_key(2, B, None, mixed, False))
    z, bonus = torch.randn(2, B, H), torch.randint(0, V, (2,))
    graphs.sampled(z, bonus, _rows(2, "plain"), torch.rand(2, B - 1, dtype=torch.float64),
                   logit_bias=torch.zeros(2, V))
    assert len(graphs.runners) == built + 1  # a bias round: built while serving, not captured
    assert not graphs.replayed(graphs.sampled_key(2, B, None, _rows(2, "plain"), True))


def test_buffer_bytes_are_the_tensors_allocated():
    """The memory figure logged and checked before capture is the buffers' actual size."""
    for gate in (None, _gate(0.5)):
        graphs = RolloutGraphs(make_head(2), B, H, torch.float32, "cpu", candidate_pool=0,
                               use_head=True, temperature_scale=1.0, copy_gate=gate,
                               history_cap=HISTORY_CAP, capture=False, buckets=(1, 2, 4, 8, 32))
        graphs.capture_startup()
        allocated = sum(t.nbytes for bufs in graphs.buffers.values() for t in bufs.values())
        assert graphs.buffer_bytes() == allocated


@pytest.mark.parametrize("sampled", [False, True])
def test_padding_rows_never_index_past_a_narrower_history(sampled):
    """A padded batch's spare rows are reset on every round: after a bs 4 round at history width
    512, a bs 2 round at width 256 in the same bucket must not read the earlier rows' lengths
    (300 > 256: an index past the buffer, a device assert on CUDA)."""
    head, gate = make_head(5), _gate(0.5)
    graphs = RolloutGraphs(head, B, H, torch.float32, "cpu", candidate_pool=0, use_head=True,
                           temperature_scale=1.0, copy_gate=gate, history_cap=4096,
                           capture=False, buckets=(4,))
    g = torch.Generator().manual_seed(11)
    for bs, t in ((4, 300), (2, 40)):
        history = torch.randint(0, 3, (bs, t), generator=g)
        lens = torch.full((bs,), t)
        bonus = history.gather(1, (lens - 1)[:, None]).squeeze(1)
        z = torch.randn(bs, B, H, generator=g)
        copy = DevicePointerCopy(gate, history, lens, B - 1)
        with torch.no_grad():
            if sampled:
                rows = _rows(bs, "plain")
                u = torch.rand(bs, B - 1, generator=g, dtype=torch.float64)
                want, _ = sampled_rollout(z, bonus, head, rows, u, 0, copy=copy)
                got, _ = graphs.sampled(z, bonus, rows, u, history=history, lens=lens)
            else:
                want = greedy_rollout(z, bonus, head, 0, copy=copy)
                got = graphs.greedy(z, bonus, history, lens)[0]
        assert torch.equal(got, want), (bs, t)


def test_a_recorded_trace_takes_the_same_shapes_on_every_device():
    """The (bucket, width, runner) of every round comes from one function (round_shape and the
    planner's widths), whatever the device: replayed through a rollout configured as the CPU's
    GPU-shaped mode runs it and one configured as CUDA would (capture on, nothing captured
    here), a trace of shrinking and growing batches, widths and sampling takes the same
    shapes, every one a start-up runner."""
    from domino_sglang.spec.graphs import verify_widths, width_for

    # (bs, L wanted, sampled kind or None, history length): a recorded mix of rounds
    trace = [(8, 6, None, 5000), (3, 3, "plain", 40), (5, 5, "filters", 120), (1, 2, None, 20),
             (4, 4, "plain", 250), (2, 6, None, 30), (8, 3, "filters", 60)]
    shapes = {}
    for device_view, capture in (("cpu-gpu-shape", False), ("cuda", True)):
        widths = verify_widths(B)
        graphs = RolloutGraphs(make_head(0), B, H, torch.float32, "cpu", candidate_pool=0,
                               use_head=True, temperature_scale=1.0, copy_gate=_gate(0.5),
                               history_cap=4096, capture=capture, buckets=(1, 2, 4, 8),
                               lengths=widths)
        # what capture_startup would build: only the planner's widths, never a length it
        # cannot choose (4 buckets x lengths 2, 4, 6 x greedy + 3 sampled variants x history
        # widths 256 and 4096)
        assert {k[2] for k in graphs.startup_keys()} == {2, 4, 6}
        assert len(graphs.startup_keys()) == 4 * 3 * 4 * 2
        graphs.captured.update(graphs.startup_keys())
        seq = []
        for bs, wanted, kind, t in trace:
            length = width_for(wanted, widths)
            history = torch.zeros(bs, t, dtype=torch.int64)
            rows = None if kind is None else _rows(bs, kind)
            key, replayed = graphs.round_shape(bs, length, history, rows, bias=False)
            seq.append((bucket_for(bs, graphs.buckets), length, key, replayed))
        shapes[device_view] = seq
    assert shapes["cpu-gpu-shape"] == shapes["cuda"]
    assert [s[1] for s in shapes["cuda"]] == [6, 4, 6, 2, 4, 6, 4]  # widths 1, 2, 4, B = 6
    # replayed unless the history outgrew the start-up widths (4096): those run eagerly
    assert [s[3] for s in shapes["cuda"]] == [False, True, True, True, True, True, True]
