"""Each running request's history indexed by its recurring n-grams, incrementally: the one host
index both copying proposers read (prompt lookup's drafts, the pointer drafter's copy).

Both rules (suffix_match.py states them) ask for the earlier occurrences of the longest suffix
of a request's history h (prompt + output, x_t last): prompt lookup for a draft after one of
them (n >= MIN_MATCH, proposers/lookup.py), the pointer drafter for the token after the most
recent one (n >= 1) of h + the chain drafted so far this round (pointer.py). One index per
request (`HistoryIndexes`, by request id) serves both, extended by the tokens each round
committed, so a request's prompt is indexed once, in the first round that asks, and a round's
host work per request is bounded by the tokens it committed, whatever the context.
"""

from __future__ import annotations

from collections.abc import Sequence

from domino_sglang.model.config import COPY_MAX_MATCH
from domino_sglang.spec.suffix_match import NO_COPY

MIN_MATCH = 2  # prompt lookup: suffix tokens that must recur (a 1-token match mostly copies noise)
MAX_MATCH = COPY_MAX_MATCH  # longest suffix compared (12: as SGLang's NGRAM max match window)


class HistoryIndex:
    """One request's history h (prompt + output, x_t last) by its n-grams, kept across rounds.

    h is read by position from the request's own lists (the prompt fixed, the output
    append-only; never concatenated or copied) and indexed incrementally, each round only the
    ends e <= len(h) - 2 committed since the last one (x_t's own n-grams are not occurrences
    before x_t). grams[n] maps an n-gram (a tuple of n tokens, 1 <= n <= max_match) to the
    ends of its occurrences:
        e                  while it occurred once (a plain int)
        (e_1, .., e_k)     once it recurs: its most recent k <= keep ends, increasing
    (ints and tuples of ints only: the garbage collector stops tracking them). An n-gram with
    n > 1 is kept only while its (n-1)-token suffix has recurred: the n-grams that extend a
    suffix seen once are implied by its one end, and join when that suffix recurs. So a
    position costs an entry for each of its n-grams up to the shortest that occurs nowhere
    else (a few in text), and a new token O(max_match) dict operations.

    `longest` looks up the suffixes of a sequence from one token up while each occurred at two
    or more ends: the last one found is the longest suffix that occurred before x_t, or one
    that occurred at a single end e, where any longer one can only end too (its length then
    read by comparing tokens back from e). No history is scanned: O(max_match) dict lookups
    per question. `find` / `draft` answer prompt lookup's rule, `copy_candidate` the pointer's.
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
        self.recent: tuple[int, ...] = ()  # h's last max_match tokens when indexed

    @property
    def last_token(self) -> int:
        """h[length - 1] when indexed (x_t), -1 before anything is."""
        return self.recent[-1] if self.recent else -1

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
        extends what was indexed (a shorter history, another prompt length, or other tokens
        at the last max_match indexed positions: a restarted request), which is indexed
        afresh. (A restart that kept all of those would keep the old index; a request's
        history in SGLang only grows, a retracted one's too.)"""
        self.prompt, self.output = prompt, output
        total = len(prompt) + len(output)
        if self.length and (total < self.length or len(prompt) != self.prompt_len or tuple(
                self.tokens(self.length - len(self.recent), self.length)) != self.recent):
            self._reset()
        elif total == self.length:
            return  # nothing new (a second proposer asking in the same round)
        self.prompt_len = len(prompt)
        first = max(self.length - 1, 0)  # the first end not yet indexed
        lo = max(first - self.max_match + 1, 0)
        seg = self.tokens(lo, max(total - 1, lo))  # seg[i] = h[lo + i]: every new end's n-grams
        grams, keep, high = self.grams, self.keep, self.max_match
        for e in range(first, total - 1):
            gram, n = (seg[e - lo],), 1  # the n-grams ending at e, from 1 up while they recur
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
        self.recent = tuple(self.tokens(max(total - self.max_match, 0), total))

    def longest(self, tail: Sequence[int], limit: int) -> tuple[int, int | tuple[int, ...]]:
        """(n, ends): the longest n <= limit such that the last n tokens of `tail` (a
        sequence's suffix of at least limit tokens) end somewhere in h at e <= len(h) - 2, and
        the ends of that n-gram (an int: the only one; a tuple: the most recent `keep`,
        increasing); (0, ()) when even its last token is new."""
        ends: int | tuple[int, ...] = ()
        n = 0
        for k in range(1, limit + 1):
            at = self.grams[k].get(tuple(tail[len(tail) - k:]))
            if at is None:
                break
            ends, n = at, k
            if type(at) is int:  # seen once: a longer match can only end there too
                while n < limit and at - n >= 0 and self._at(at - n) == tail[-1 - n]:
                    n += 1
                break
        return n, ends

    def find(self) -> tuple[int, int]:
        """Prompt lookup's draft (proposers/lookup.py's rule) as (s, m): the draft is
        h[s+1 : s+1+m]; (-1, 0) when no suffix of min_match tokens recurs (or max_tokens < 1).
        Among the ends of the longest, the last followed by max_tokens known tokens (<= last -
        max_tokens), else the first. At most max_tokens - 1 ends lie in (last - max_tokens,
        last - 1]: the last end <= last - max_tokens, where there is one, is among the
        max_tokens most recent; where there is none, there are fewer than max_tokens ends, all
        kept, the first among them."""
        last = self.length - 1
        if self.max_tokens < 1 or last < 1:
            return -1, 0
        tail = self.tokens(max(self.length - self.max_match, 0), self.length)
        n, ends = self.longest(tail, min(self.max_match, last))
        if n < self.min_match:
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

    def copy_candidate(self, chain: Sequence[int]) -> tuple[int, int]:
        """The pointer's (c, n) of the history + chain S (pointer.py): the token after the most
        recent occurrence of S's longest recurring suffix (n <= max_match tokens, ending
        before S's last token); (NO_COPY, 0) if S's last token is new. Occurrences ending at
        x_t or inside the chain (e >= len(h) - 1, at most len(chain) + 1 of them, each
        starting at or after len(h) - max_match) are compared directly, the rest come from the
        index; at equal length the scanned ones are the more recent."""
        h_len = self.length
        off = max(h_len - self.max_match, 0)
        tail = [*self.tokens(off, h_len), *chain]  # tail[k] = S[k + off]
        t = h_len + len(chain) - 1  # S's last position
        limit = min(self.max_match, t)
        best_n, best_e = 0, -1
        for e in range(t - 1, h_len - 2, -1):  # at x_t or in the chain, most recent first
            n = 0
            while n < limit and e - n >= 0 and tail[e - n - off] == tail[t - n - off]:
                n += 1
            if n > best_n:
                best_n, best_e = n, e
        n, ends = self.longest(tail, min(limit, h_len - 1)) if h_len >= 2 else (0, ())
        if best_n >= n and best_n > 0:
            return tail[best_e + 1 - off], best_n
        if n > 0:
            return self._at((ends if type(ends) is int else ends[-1]) + 1), n
        return NO_COPY, 0


class HistoryIndexes:
    """The running requests' HistoryIndexes by request id, each kept up to its request's prompt
    + output (SGLang Reqs: rid, origin_input_ids, output_ids); `max_tokens`: prompt lookup's
    longest draft (the ends kept per n-gram)."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self.indexes: dict[str, HistoryIndex] = {}

    def __iter__(self):
        return iter(self.indexes)

    def synced(self, req) -> HistoryIndex:
        """The request's index, brought up to its prompt + output."""
        index = self.indexes.get(req.rid)
        if index is None:
            index = self.indexes[req.rid] = HistoryIndex(self.max_tokens)
        index.sync(req.origin_input_ids, req.output_ids)
        return index

    def keep_only(self, reqs) -> None:
        """Drop the indexes of requests no longer in the batch."""
        running = {r.rid for r in reqs}
        if not self.indexes.keys() <= running:
            self.indexes = {rid: ix for rid, ix in self.indexes.items() if rid in running}
