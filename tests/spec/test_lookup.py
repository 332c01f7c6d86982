"""Prompt lookup (lookup.py): the vectorised match and the incremental per-request index equal a
direct scan, on random histories; PromptLookup offers what the batched lookup finds."""

from __future__ import annotations

import random
from types import SimpleNamespace

import torch

from domino_sglang.spec.history import HistoryIndex
from domino_sglang.spec.proposers.lookup import PromptLookup
from tests.harness.lookup_reference import lookup_batch, lookup_draft


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


def growing_histories(seed: int, n: int):
    """n (prompt, output steps, max_tokens, min_match, max_match) cases: a prompt, then an
    output committed a few tokens at a time (one at a time in a third of the cases); tokens are
    random over a small vocabulary or copies of an earlier stretch (long matches, runs)."""
    rng = random.Random(seed)
    for case in range(n):
        vocab = rng.randint(2, 12)

        def more(h: list[int], k: int, vocab: int = vocab) -> list[int]:
            if h and rng.random() < 0.4:  # a copy of an earlier stretch
                s = rng.randrange(len(h))
                return (h[s:] * k)[:k]
            return [rng.randrange(vocab) for _ in range(k)]

        prompt = more([], rng.randint(0, 30))
        history, steps = list(prompt), []
        for _ in range(rng.randint(1, 20)):
            step = more(history, 1 if case % 3 == 0 else rng.randint(1, 6))
            history += step
            steps.append(step)
        min_match = rng.randint(1, 3)
        yield (prompt, steps, rng.randint(0, 15), min_match, rng.randint(min_match, 12))


def test_the_index_equals_a_direct_scan_as_the_history_grows():
    """Asked after every commit, the incremental index drafts exactly what the definition
    does (and so what lookup_batch does, tested above)."""
    found = asked = 0
    for prompt, steps, max_tokens, min_match, max_match in growing_histories(2, 1500):
        index, output = HistoryIndex(max_tokens, min_match, max_match), []
        for step in steps:
            output.extend(step)  # the request's own list, appended in place
            index.sync(prompt, output)
            want = scan(prompt + output, max_tokens, min_match, max_match)
            assert index.draft() == want, (prompt, output, max_tokens, min_match, max_match)
            assert index.last_token == (prompt + output)[-1]
            found, asked = found + bool(want), asked + 1
    assert 0.3 < found / asked < 0.9  # both outcomes are exercised
    # the default rule, on lookup_batch's own examples
    index = HistoryIndex(4)
    index.sync([1, 2, 9, 1, 2], [8, 1, 2])
    assert index.draft() == [9, 1, 2, 8] and index.find() == (1, 4)  # the end of "1 2" at 1
    index = HistoryIndex(8)
    index.sync([3], [4] * 20)  # inside a run longer than max_match: 8 more
    assert index.draft() == [4] * 8


def test_a_history_that_no_longer_extends_the_index_is_indexed_afresh():
    """A shorter output, other tokens at the last indexed positions or another prompt length
    (a restarted request) re-index: nothing of the earlier history is left. A history that
    extends the indexed one keeps its index."""
    index = HistoryIndex(4)
    index.sync([1, 2, 3, 4], [1, 2])
    assert index.draft() == [3, 4, 1, 2]
    grams = index.grams
    index.sync([1, 2, 3, 4], index.output + [3])  # extends it: indexed on
    assert index.grams is grams and index.draft() == [4, 1, 2, 3]
    restarts = [
        ([1, 2, 3, 4], [5, 1, 2, 3]),  # longer, another token at the last indexed position
        ([1, 2, 3, 4], [7]),  # shorter
        ([1, 2, 3], [4, 7, 1, 2]),  # extends it, but the prompt is another length
        ([9, 9, 9], [9, 1, 2, 9, 9]),  # longer, another token at the last indexed position
        ([9, 9, 9], [8, 1, 2, 9, 9, 3]),  # the same last indexed token, another before it
    ]
    for prompt, output in restarts:
        grams = index.grams
        index.sync(prompt, output)
        assert index.grams is not grams, (prompt, output)
        assert index.draft() == scan(prompt + output, 4), (prompt, output)
        fresh = HistoryIndex(4)
        fresh.sync(prompt, output)
        assert index.grams == fresh.grams and index.length == fresh.length == len(prompt + output)


def old_offer(reqs, bonus: list[int], capped: list[bool], n: int, mask: int):
    """What PromptLookup offered before its index (batched lookup_batch over each request's
    prompt + output): (found_host, found, drafts, longest), or None."""
    histories = [r.origin_input_ids + r.output_ids for r in reqs]
    rows = [i for i, c in enumerate(capped) if not c]
    if not rows:
        return None
    drafts, lens = lookup_batch([torch.tensor(histories[i]) for i in rows], n)
    if not bool((lens > 0).any()):
        return None
    found_host, found, out = [False] * len(reqs), [False] * len(reqs), [[mask] * n for _ in reqs]
    for row, i in enumerate(rows):
        m = int(lens[row])
        if m:
            found_host[i], found[i] = True, histories[i][-1] == bonus[i]
            out[i][:m] = drafts[row, :m].tolist()
    return found_host, found, out, int(lens.max())


def test_prompt_lookup_offers_what_the_batched_lookup_found_over_rounds():
    """Requests commit a few tokens a round, some leave and others join, some are capped, one
    row's recorded output does not end in its bonus token: every round's offer (and may_cover)
    is what the batched lookup over the rebuilt histories gave, and the indexes kept after the
    planner's keep_only are those of the batch's requests."""
    B, mask = 6, 1  # the mask token is also a token of the histories
    lookup = PromptLookup(B, mask, "cpu", 16)
    rng = random.Random(3)
    cases = growing_histories(4, 10**6)
    made = 0

    def request():
        nonlocal made
        prompt, steps, *_ = next(cases)
        made += 1
        return SimpleNamespace(rid=f"r{made}", origin_input_ids=prompt, output_ids=steps[0],
                               more=steps[1:])

    reqs = [request() for _ in range(6)]
    offered = asked = 0
    for _ in range(40):
        for r in reqs:  # this round's commits (the request's own list, in place)
            if r.more:
                r.output_ids.extend(r.more.pop(0))
        left = [r.rid for r in reqs if not r.more]
        reqs = [r for r in reqs if r.more] + [request() for _ in range(rng.randint(0, 2))]
        bonus = [r.output_ids[-1] for r in reqs]
        bonus[0] += rng.randint(0, 1)  # sometimes not x_t: drafts nothing
        capped = [rng.random() < 0.15 for _ in reqs]
        batch = SimpleNamespace(reqs=reqs)
        want = old_offer(reqs, bonus, capped, B - 1, mask)
        covers = want is not None and all(c or f for c, f in zip(capped, want[0]))
        lookup.keep_only(reqs)  # as the planner asks every round
        assert lookup.may_cover(batch, capped) == covers
        got = lookup.offer(batch, torch.tensor(bonus), capped)
        assert (got is None) == (want is None)
        if got is not None:
            assert got.found_host == want[0] and got.found.tolist() == want[1]
            assert got.drafts.tolist() == want[2] and got.longest == want[3]
            offered += sum(want[0])
        asked += len(reqs)
        assert set(lookup.indexes) <= {r.rid for r in reqs}
        assert not set(lookup.indexes) & set(left)  # the requests that left are dropped
    assert 0.2 < offered / asked < 0.9  # both outcomes are exercised
    assert made > 20  # requests came and went


def test_prompt_lookup_and_the_pointer_copy_read_one_index_per_request():
    """The two copying proposers share each request's HistoryIndex (history.py): prompt lookup
    indexes a request's history when it asks, the pointer's copy path of the same round reads
    that index (nothing indexed twice), both answer by their own rules (a direct scan, the
    training table), and a request that left is dropped for both."""
    from domino_sglang.spec.history import HistoryIndexes
    from domino_sglang.spec.pointer import CopyPaths, copy_table

    B, mask = 8, 0
    histories = HistoryIndexes(B - 1)
    lookup = PromptLookup(B, mask, "cpu", 16, histories)
    gate = torch.nn.Linear(4 + 13, 1)
    paths = CopyPaths(gate, "cpu", on_device=False, histories=histories)
    rng = random.Random(5)
    reqs = [SimpleNamespace(rid=f"r{i}", origin_input_ids=[rng.randrange(6) for _ in range(30)],
                            output_ids=[]) for i in range(3)]
    for _ in range(6):  # rounds: lookup asks first, then the drafter's copy path
        for r in reqs:
            r.output_ids.append(rng.randrange(6))
        bonus = torch.tensor([r.output_ids[-1] for r in reqs])
        lookup.offer(SimpleNamespace(reqs=reqs), bonus, None)
        indexed = {rid: (ix.grams, ix.length) for rid, ix in histories.indexes.items()}
        sizes = {rid: sum(map(len, ix.grams)) for rid, ix in histories.indexes.items()}
        copy = paths.for_round(reqs, bonus, B - 1)
        for r, index in zip(reqs, copy.indexes):
            assert index is histories.indexes[r.rid]  # the one index, not a second
            assert (index.grams, index.length) == indexed[r.rid]
            assert sum(map(len, index.grams)) == sizes[r.rid]  # nothing indexed again
            h = r.origin_input_ids + r.output_ids
            assert index.draft() == scan(h, B - 1)
            cand, match = copy_table(h)
            assert index.copy_candidate([]) == (int(cand[-1]), int(match[-1]))
    paths.for_round(reqs[1:], bonus[1:], B - 1)
    assert set(histories) == {"r1", "r2"} and set(lookup.indexes) == {"r1", "r2"}
    # a history that does not end in x_t: the round copies from x_t alone, the request's own
    # index untouched
    kept = histories.indexes["r1"]
    odd = (reqs[0].output_ids[-1] + 1) % 6
    copy = paths.for_round(reqs[1:], torch.tensor([odd, int(bonus[2])]), B - 1)
    assert copy.indexes[0] is not kept and copy.indexes[0].length == 1
    assert copy.indexes[0].copy_candidate([]) == (-1, 0) and histories.indexes["r1"] is kept
