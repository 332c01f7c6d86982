"""The deferred draft-context writes of plain rounds (spec/context.py): every row reaches
its slot before anything reads or reuses it, one projection per flush, no slot twice in one."""

import pytest
import torch

from domino_sglang.spec.context import DeferredContext


class Store:
    """A fake draft KV cache: slot -> (feature, position), written as the worker writes."""

    def __init__(self):
        self.kv: dict[int, tuple[float, int]] = {}
        self.writes = 0

    def write(self, hidden, positions, slots):
        self.writes += 1
        assert hidden.shape[0] == positions.shape[0] == slots.shape[0]
        # one write is one batched index copy: a slot twice in it would land in any order
        assert len(set(slots.tolist())) == len(slots), f"slot twice in one write: {slots}"
        for h, p, s in zip(hidden[:, 0].tolist(), positions.tolist(), slots.tolist()):
            self.kv[s] = (h, p)


def plain_round(ctx, key, rows):
    """A plain round of the requests in `key`: rows = [(feature, position, slot)] per request."""
    ctx.before_round(key, speculative=False)
    hidden = torch.tensor([[f, f] for f, _, _ in rows])  # [bs, K*H]
    ctx.defer(hidden, torch.tensor([p for _, p, _ in rows]), torch.tensor([s for _, _, s in rows]))


def test_plain_rounds_are_written_once_before_the_draft_pass():
    store = Store()
    ctx = DeferredContext(store.write)
    for t in range(5):
        plain_round(ctx, ("a", "b"), [(10.0 + t, t, 100 + t), (20.0 + t, t, 200 + t)])
    assert store.writes == 0 and len(ctx) == 5  # nothing read them yet
    ctx.before_round(("a", "b"), speculative=True)
    assert store.writes == 1 and len(ctx) == 0  # one projection for 10 rows
    assert store.kv == {**{100 + t: (10.0 + t, t) for t in range(5)},
                        **{200 + t: (20.0 + t, t) for t in range(5)}}


def test_a_finished_requests_slot_goes_to_another_request():
    """Request a finishes; its slot 7 is handed to b's next position. a's held row must land
    before b's, not beside it in one write (the store rejects that) nor after it."""
    store = Store()
    ctx = DeferredContext(store.write)
    plain_round(ctx, ("a", "b"), [(1.0, 4, 7), (2.0, 9, 30)])
    plain_round(ctx, ("b",), [(3.0, 10, 7)])  # a left the batch: a's rows are written first
    assert store.writes == 1 and store.kv[7] == (1.0, 4)
    ctx.before_round(("b",), speculative=True)
    assert store.kv == {7: (3.0, 10), 30: (2.0, 9)}


def test_prefill_and_limit_flush():
    store = Store()
    ctx = DeferredContext(store.write, limit=3)
    for t in range(7):
        plain_round(ctx, ("a",), [(float(t), t, t)])
    assert store.writes == 2 and len(ctx) == 1  # at 3 and 6 held rounds
    ctx.flush()  # what the worker does before a prefill
    assert store.writes == 3 and store.kv == {t: (float(t), t) for t in range(7)}
    ctx.flush()
    assert store.writes == 3  # nothing held, nothing written


def test_held_features_are_copies():
    """A replayed graph overwrites its output buffer next round: the held row must not change."""
    store = Store()
    ctx = DeferredContext(store.write)
    buffer = torch.tensor([[5.0, 5.0]])
    ctx.before_round(("a",), speculative=False)
    ctx.defer(buffer, torch.tensor([0]), torch.tensor([3]))
    buffer.fill_(-1.0)
    ctx.flush()
    assert store.kv[3] == (5.0, 0)


def test_clear_drops_held_rows():
    store = Store()
    ctx = DeferredContext(store.write)
    plain_round(ctx, ("a",), [(1.0, 0, 0)])
    ctx.clear()
    ctx.before_round(("a",), speculative=True)
    assert store.writes == 0 and store.kv == {}


def test_limit_is_validated():
    with pytest.raises(ValueError, match="limit"):
        DeferredContext(lambda *_: None, limit=0)
