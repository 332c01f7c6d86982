"""Prompt lookup: drafts taken from a request's own history, offered before the round (no model
pass).

Answers restate their prompt and repeat themselves (code, arithmetic, lists). When the last
`n >= MIN_MATCH` tokens of a request (prompt + output, x_t last) occurred earlier in that same
history, the tokens that followed the most recent longest such occurrence are a draft that costs
no model pass (the idea of prompt lookup decoding, Saxena 2023, and of SGLang's NGRAM drafter,
kept to one request so a request's drafts never depend on what else is being served).

`PromptLookup` is an offering proposer (protocol.OfferingProposer): the planner asks `offer`
and its drafts take the place of the Domino block for the rows it found; a batch whose every
request has one skips the draft pass. Each running request's history index (history.py, shared
with the pointer drafter's copy) is extended round by round by the tokens committed since, so a
round's host work per request is bounded by the tokens it committed, not by its context length.
The rule, per history h [T] (x_t at T - 1):

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

import torch

from domino_sglang.spec.history import HistoryIndexes
from domino_sglang.spec.plan import Offer
from domino_sglang.spec.proposers.protocol import OfferingProposer


class PromptLookup(OfferingProposer):
    """The prompt-lookup proposer of a worker drafting blocks of `block_size` tokens over a
    vocabulary of `vocab_size` (its sampled q are one-hot over it). It reads each running
    request's HistoryIndex (`histories`, by request id, shared with the pointer drafter's copy
    path; its own where none is given), brought up to the tokens committed since the last
    round; the indexes of requests that left the batch are dropped (keep_only, asked by the
    planner every round)."""

    name = "lookup"

    def __init__(self, block_size: int, mask_token_id: int, device, vocab_size: int,
                 histories: HistoryIndexes | None = None):
        super().__init__(vocab_size)
        self.block_size, self.mask_token_id, self.device = block_size, mask_token_id, device
        # request id -> its index
        self.indexes = HistoryIndexes(block_size - 1) if histories is None else histories
        if self.indexes.max_tokens != block_size - 1:
            raise ValueError(f"histories: keep {block_size - 1} ends per n-gram (the block's "
                             f"drafts), got {self.indexes.max_tokens}")

    def keep_only(self, reqs) -> None:
        """Drop the indexes of requests no longer in the batch."""
        self.indexes.keep_only(reqs)

    def may_cover(self, batch, capped: list[bool] | None) -> bool:
        """Whether every request not capped has a draft (its index, request by request until
        one has none)."""
        skip = [False] * len(batch.reqs) if capped is None else capped
        return all(s or self.indexes.synced(r).find()[1] > 0 for s, r in zip(skip, batch.reqs))

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
                index = self.indexes.synced(req)
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
