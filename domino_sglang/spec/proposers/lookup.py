"""Prompt lookup: drafts taken from a request's own history, offered before the round (no model
pass).

Answers restate their prompt and repeat themselves (code, arithmetic, lists). When the last
`n >= MIN_MATCH` tokens of a request (prompt + output, x_t last) occurred earlier in that same
history, the tokens that followed the most recent longest such occurrence are a draft that costs
no model pass (the idea of prompt lookup decoding, Saxena 2023, and of SGLang's NGRAM drafter,
kept to one request so a request's drafts never depend on what else is being served).

`PromptLookup` is an offering proposer (protocol.OfferingProposer): the planner asks `offer`
and its drafts take the place of the Domino block for the rows it found; a batch whose every
request has one skips the draft pass. Each running request keeps a `LookupIndex` of its
history, extended round by round by the tokens committed since, so a round's host work per
request is bounded by the tokens it committed, not by its context length. The rule, per history
h [T] (x_t at T - 1):

    match[s] = max n <= min(MAX_MATCH, T - 1) such that h[s-n+1 .. s] == h[T-n .. T-1],
               for s < T - 1 (occurrences ending before the suffix's own end)
    s* = the last s of the largest match followed by max_tokens known tokens, else the first
    draft = h[s*+1 : s*+1+max_tokens] when that match is >= MIN_MATCH tokens, else none
The most recent occurrence is the likeliest continuation, but inside a run ("cat cat cat") it
is the one just before the suffix, followed by a single token; the first is followed by the
most (a replay of the target's answers takes the fewest rounds with this rule). Stated as tensor
compares over whole histories (suffix_match.suffix_matches), it is the reference the index is
tested against (tests/harness/lookup_reference.py).
Verification is unchanged: greedy rows keep the longest matching prefix; sampled rows verify
the offered tokens as a deterministic proposal, q = one-hot (min(1, p / q) = p(d), residual p
without d): still exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from domino_sglang.spec.plan import Offer
from domino_sglang.spec.proposers.protocol import OfferingProposer

MIN_MATCH = 2  # suffix tokens that must recur: a 1-token match mostly copies noise
MAX_MATCH = 12  # longest suffix compared (as SGLang's NGRAM max match window)


class LookupIndex:
    """One request's prompt-lookup draft, by the module's rule, kept across rounds.

    The history h (prompt + output, x_t last) is read by position from the request's own lists
    (the prompt fixed, the output append-only; never concatenated or copied) and indexed
    incrementally, each round only the ends e <= len(h) - 2 committed since the last one (x_t's
    own n-grams are not occurrences before x_t). grams[n] maps an n-gram (a tuple of n tokens,
    min_match <= n <= max_match) to the ends of its occurrences:
        e                  while it occurred once (a plain int)
        (e_1, .., e_k)     once it recurs: its most recent k <= max_tokens ends, increasing
    (ints and tuples of ints only: the garbage collector stops tracking them). An n-gram with
    n > min_match is kept only while its (n-1)-token suffix has recurred: the n-grams that
    extend a suffix seen once are implied by its one end, and join when that suffix recurs. So
    a position costs an entry for each of its n-grams up to the shortest that occurs nowhere
    else (a few in text; max_match - min_match + 1 at most), and a new token O(max_match) dict
    operations, whatever the length of the history.

    `find` looks up the suffixes of h from min_match tokens up while each occurred at two or
    more ends: the last one found is the longest suffix that occurred before x_t, or one that
    occurred at a single end e, where any longer one can only occur too: e is the answer.
    Among the ends of the longest, the answer is the last followed by max_tokens known tokens
    (<= last - max_tokens), else the first. At most max_tokens - 1 ends lie in (last -
    max_tokens, last - 1]: the last end <= last - max_tokens, where there is one, is among the
    max_tokens most recent; where there is none, there are fewer than max_tokens ends, all
    kept, the first among them. No history is scanned: O(max_match) dict lookups per question.
    """

    def __init__(self, max_tokens: int, min_match: int = MIN_MATCH, max_match: int = MAX_MATCH):
        if min_match < 1 or max_match < min_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got {min_match}, {max_match}")
        self.max_tokens, self.min_match, self.max_match = max_tokens, min_match, max_match
        self.keep = max(max_tokens, 1)  # the most recent ends kept per n-gram
        self.prompt: Sequence[int] = []
        self.output: Sequence[int] = []
        self._reset()

    def _reset(self) -> None:
        """Forget everything indexed (a new or restarted history)."""
        self.grams: list[dict[tuple[int, ...], int | tuple[int, ...]]] = [
            {} for _ in range(self.max_match + 1)]
        self.length = 0  # tokens of h indexed: the ends 0 .. length - 2 are in `grams`
        self.prompt_len = 0  # len(prompt) when indexed
        self.last_token = -1  # h[length - 1] when indexed

    def _at(self, i: int) -> int:
        p = len(self.prompt)
        return self.prompt[i] if i < p else self.output[i - p]

    def tokens(self, start: int, stop: int) -> list[int]:
        """h[start:stop] (0 <= start <= stop <= len(h)), read from the request's lists."""
        p = len(self.prompt)
        if stop <= p:
            return list(self.prompt[start:stop])
        if start >= p:
            return list(self.output[start - p:stop - p])
        return [*self.prompt[start:], *self.output[:stop - p]]

    def sync(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        """Index the history prompt + output (x_t last): only its new tokens, unless it no longer
        extends what was indexed (a shorter history, another prompt length, or another token
        at the last indexed position: a restarted request), which is indexed afresh."""
        self.prompt, self.output = prompt, output
        total = len(prompt) + len(output)
        if self.length and (total < self.length or len(prompt) != self.prompt_len
                            or self._at(self.length - 1) != self.last_token):
            self._reset()
        self.prompt_len = len(prompt)
        first = max(self.length - 1, 0)  # the first end not yet indexed
        lo = max(first - self.max_match + 1, 0)
        seg = self.tokens(lo, max(total - 1, lo))  # seg[i] = h[lo + i]: every new end's n-grams
        grams, keep, low, high = self.grams, self.keep, self.min_match, self.max_match
        start = max(first, low - 1)  # the first new end with a min_match-gram
        # the min_match-grams ending at start .. total - 2, made at once
        lows = zip(*(seg[start - lo - low + 1 + k:] for k in range(low)))
        for e, gram in zip(range(start, total - 1), lows):
            n = low  # the n-grams ending at e, from low up while they recur
            while True:
                level = grams[n]
                ends = level.get(gram)
                if ends is None:  # new here: its longer n-grams stay implied by e
                    level[gram] = e
                    break
                if type(ends) is int:  # it recurs: the (n+1)-gram at its one earlier end joins
                    level[gram] = (ends, e)
                    if n < high and ends >= n:
                        grams[n + 1][(self._at(ends - n), *gram)] = ends
                else:
                    level[gram] = (*ends, e) if len(ends) < keep else (*ends[1:], e)
                n += 1
                if n > min(high, e + 1):
                    break
                gram = (seg[e + 1 - lo - n], *gram)
        self.length = total
        self.last_token = self._at(total - 1) if total else -1

    def find(self) -> tuple[int, int]:
        """(s, m): the draft is h[s+1 : s+1+m] (the module docstring's rule); (-1, 0)
        when no suffix of min_match tokens recurs (or max_tokens < 1)."""
        last = self.length - 1
        if self.max_tokens < 1:
            return -1, 0
        tail = self.tokens(max(self.length - self.max_match, 0), self.length)
        ends: int | tuple[int, ...] | None = None
        for n in range(self.min_match, min(self.max_match, last) + 1):
            at = self.grams[n].get(tuple(tail[len(tail) - n:]))
            if at is None:
                break
            ends = at
            if type(at) is int:  # seen once: longer matches can only end there too
                break
        if ends is None:
            return -1, 0
        if type(ends) is int:
            s = ends
        else:
            full = last - self.max_tokens  # an end <= full is followed by max_tokens tokens
            s = next((e for e in reversed(ends) if e <= full), ends[0])
        return s, min(last - s, self.max_tokens)

    def draft(self) -> list[int]:
        """The draft tokens `find` points at (empty when there are none)."""
        s, m = self.find()
        return self.tokens(s + 1, s + 1 + m)


class PromptLookup(OfferingProposer):
    """The prompt-lookup proposer of a worker drafting blocks of `block_size` tokens over a
    vocabulary of `vocab_size` (its sampled q are one-hot over it). It keeps a LookupIndex per
    running request (by request id) across rounds, extended by the tokens committed since the
    last round; the indexes of requests that left the batch are dropped (keep_only, asked by the
    planner every round)."""

    name = "lookup"

    def __init__(self, block_size: int, mask_token_id: int, device, vocab_size: int):
        super().__init__(vocab_size)
        self.block_size, self.mask_token_id, self.device = block_size, mask_token_id, device
        self.indexes: dict[str, LookupIndex] = {}  # request id -> its index

    def keep_only(self, reqs) -> None:
        """Drop the indexes of requests no longer in the batch."""
        running = {r.rid for r in reqs}
        if not self.indexes.keys() <= running:
            self.indexes = {rid: ix for rid, ix in self.indexes.items() if rid in running}

    def _index(self, req) -> LookupIndex:
        """The request's index, brought up to its prompt + output."""
        index = self.indexes.get(req.rid)
        if index is None:
            index = self.indexes[req.rid] = LookupIndex(self.block_size - 1)
        index.sync(req.origin_input_ids, req.output_ids)
        return index

    def may_cover(self, batch, capped: list[bool] | None) -> bool:
        """Whether every request not capped has a draft (its index, request by request until
        one has none)."""
        skip = [False] * len(batch.reqs) if capped is None else capped
        return all(s or self._index(r).find()[1] > 0 for s, r in zip(skip, batch.reqs))

    def offer(self, batch, bonus: torch.Tensor, capped: list[bool] | None) -> Offer | None:
        """Lookup drafts from each request's prompt + output so far (SGLang Reqs: batch.reqs),
        or None when no request has one. Capped requests (and rows another proposer found)
        take none. The drafts are found on the host (each request's index) and reach the device
        in one copy. A request whose recorded output does not end in its bonus token x_t (bonus
        [bs] on the device; it would: the scheduler runs rounds synchronously) takes none
        either: checked on the device, where x_t is (its row drafts the mask token then, still
        exact)."""
        n, mask = self.block_size - 1, self.mask_token_id
        skip = capped or [False] * len(batch.reqs)
        # per row: drafts (mask-padded to n), found, the history's last token, the draft's length
        packed, longest = [], 0
        for i, req in enumerate(batch.reqs):
            row = [mask] * n + [0, mask, 0]
            if not skip[i]:
                index = self._index(req)
                draft = index.draft()
                if draft:
                    row[:len(draft)] = draft
                    row[n], row[n + 1], row[n + 2] = 1, index.last_token, len(draft)
                    longest = max(longest, len(draft))
            packed.append(row)
        if not longest:
            return None
        found_host = [row[n] == 1 for row in packed]
        dev = torch.tensor(packed, dtype=torch.int64).to(self.device)  # [bs, B + 2]
        found = (dev[:, n] == 1) & (dev[:, n + 1] == bonus)
        return Offer(found_host, found, dev[:, :n], longest, dev[:, n + 2])
