"""Prompt lookup (lookup.py): the vectorised match equals a direct scan, on random histories."""

from __future__ import annotations

import random

import torch

from domino_sglang.spec.proposers.lookup import (
    has_recurring_suffix,
    lookup_batch,
    lookup_draft,
)


def scan(history: list[int], max_tokens: int, min_match: int = 2, max_match: int = 12
         ) -> list[int]:
    """The definition, directly: the longest suffix n (max_match..min_match) that occurred
    earlier with at least one token after it; the continuation of its latest occurrence
    followed by max_tokens tokens, else of its first."""
    T = len(history)
    for n in range(min(max_match, T - 1), min_match - 1, -1):
        starts = [s for s in range(T - n) if history[s:s + n] == history[T - n:]]
        if starts:
            full = [s for s in starts if s + n + max_tokens <= T]
            start = full[-1] if full else starts[0]
            return history[start + n:start + n + max_tokens]
    return []


def random_histories(seed: int, n: int, max_vocab: int, lengths: tuple[int, int]):
    """n (history, min_match) cases: short histories over tiny vocabularies (many repeats)."""
    rng = random.Random(seed)
    for _ in range(n):
        vocab, T = rng.randint(2, max_vocab), rng.randint(*lengths)
        yield [rng.randrange(vocab) for _ in range(T)], rng.randint(1, 3), rng


def test_recurring_suffix_is_exactly_when_lookup_drafts():
    """The host pre-check says yes exactly when the batched lookup finds a draft."""
    yes = 0
    for history, min_match, _ in random_histories(1, 3000, 8, (0, 40)):
        drafted = bool(scan(history, 1, min_match)) if history else False
        assert has_recurring_suffix(history, min_match) == drafted, (history, min_match)
        yes += drafted
    assert 500 < yes < 2500  # both outcomes are exercised
    assert has_recurring_suffix([5, 6, 7, 5, 6])  # the suffix 5 6 at 0
    assert not has_recurring_suffix([5, 6, 7, 6, 5])
    assert has_recurring_suffix([4, 4, 4])  # overlapping: 4 4 at 0
    assert not has_recurring_suffix([4, 4])  # its only occurrence is itself


def test_lookup_equals_a_direct_scan():
    found = 0
    for history, min_match, rng in random_histories(0, 2000, 6, (1, 50)):
        max_tokens = rng.randint(1, 15)
        got = lookup_draft(torch.tensor(history), max_tokens, min_match=min_match).tolist()
        assert got == scan(history, max_tokens, min_match), (history, max_tokens, min_match)
        found += bool(got)
    assert 500 < found < 2000  # both outcomes are exercised


def test_batched_lookup_equals_each_history_alone():
    """Histories of different lengths in one batch (right-aligned, padded) get what each gets
    alone, and rows without a match get length 0."""
    rng = random.Random(1)
    for _ in range(300):
        batch = [[rng.randrange(rng.randint(2, 5)) for _ in range(rng.randint(1, 40))]
                 for _ in range(rng.randint(1, 6))]
        max_tokens, min_match = rng.randint(1, 15), rng.randint(1, 3)
        drafts, lengths = lookup_batch([torch.tensor(h) for h in batch], max_tokens,
                                       min_match=min_match)
        assert drafts.shape == (len(batch), max_tokens)
        for row, history in enumerate(batch):
            want = scan(history, max_tokens, min_match)
            assert int(lengths[row]) == len(want), (batch, row)
            assert drafts[row, :len(want)].tolist() == want
            assert bool((drafts[row, len(want):] == -1).all())


def test_lookup_on_a_repetition():
    # "a b c d a b c" -> the suffix "a b c" recurs at 0: copy what followed it ("d a b c")
    assert lookup_draft(torch.tensor([1, 2, 3, 4, 1, 2, 3]), 4).tolist() == [4, 1, 2, 3]
    # the longest match wins over a more recent shorter one; ties go to the most recent
    assert lookup_draft(torch.tensor([7, 1, 2, 9, 5, 1, 2, 8, 7, 1, 2]), 1).tolist() == [9]
    assert lookup_draft(torch.tensor([1, 2, 9, 1, 2, 8, 1, 2]), 1).tolist() == [8]
    # ... followed by max_tokens tokens: else the first (a run copies the longest stretch)
    assert lookup_draft(torch.tensor([1, 2, 9, 1, 2, 8, 1, 2]), 4).tolist() == [9, 1, 2, 8]
    # inside a run longer than max_match: 8 more, not the 1 after the latest occurrence
    assert lookup_draft(torch.tensor([3] + [4] * 20), 8).tolist() == [4] * 8
    # no suffix of two tokens recurs; too short a history; nothing asked for
    assert lookup_draft(torch.tensor([1, 2, 3, 1, 4]), 4).tolist() == []
    assert lookup_draft(torch.tensor([5]), 4).tolist() == []
    assert lookup_draft(torch.tensor([1, 1, 1, 1]), 0).tolist() == []


def test_host_lookup_costs_no_host_device_sync():
    """lookup_batch runs on the requests' host lists: none of its ops is a host-device transfer
    or synchronisation (syncs.py, the budget of tests/server/test_sync_budget.py)."""
    from domino_sglang.spec.syncs import SyncCounter

    histories = [torch.tensor([7, 8, 9, 7, 8, 9, 7, 8]), torch.tensor([1, 2, 3, 1, 2])]
    with SyncCounter() as counter:
        drafts, lengths = lookup_batch(histories, 5)
    assert drafts.tolist() == [[9, 7, 8, -1, -1], [3, 1, 2, -1, -1]] and lengths.tolist() == [3, 3]
    assert counter.total("domino") == 0
