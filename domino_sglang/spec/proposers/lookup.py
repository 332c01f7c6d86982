"""Prompt lookup: drafts taken from a request's own history, offered before the round (no model
pass).

Answers restate their prompt and repeat themselves (code, arithmetic, lists). When the last
`n >= MIN_MATCH` tokens of a request (prompt + output, x_t last) occurred earlier in that same
history, the tokens that followed the most recent longest such occurrence are a draft that costs
no model pass (the idea of prompt lookup decoding, Saxena 2023, and of SGLang's NGRAM drafter,
kept to one request so a request's drafts never depend on what else is being served).

`PromptLookup` is an offering proposer (protocol.OfferingProposer): the planner asks `offer`
(every request in one batched `lookup_batch`) and its drafts take the place of the Domino block
for the rows it found; a batch whose every request has one skips the draft pass (a batched
search is much cheaper than one per request). Verification is unchanged: greedy rows keep the
longest matching prefix; sampled rows verify the offered tokens as a deterministic proposal,
q = one-hot (min(1, p / q) = p(d), residual p without d): still exact.
"""

from __future__ import annotations

import torch

from domino_sglang.spec.plan import Offer
from domino_sglang.spec.proposers.protocol import OfferingProposer
from domino_sglang.spec.suffix_match import suffix_matches

MIN_MATCH = 2  # suffix tokens that must recur: a 1-token match mostly copies noise
MAX_MATCH = 12  # longest suffix compared (as SGLang's NGRAM max match window)


def lookup_draft(history: torch.Tensor, max_tokens: int, min_match: int = MIN_MATCH,
                 max_match: int = MAX_MATCH) -> torch.Tensor:
    """Up to max_tokens tokens [m] that followed an earlier occurrence of the longest suffix of
    history [T] (int64, the request's prompt + output, x_t last) of length min_match..max_match;
    empty when no suffix of min_match tokens recurs (`lookup_batch` for one history)."""
    drafts, lengths = lookup_batch([history], max_tokens, min_match, max_match)
    return drafts[0, :int(lengths[0])]


def lookup_batch(histories: list[torch.Tensor], max_tokens: int, min_match: int = MIN_MATCH,
                 max_match: int = MAX_MATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """Lookup drafts of n histories at once: (drafts [n, max_tokens] int64, padded with -1;
    lengths [n], 0 where no suffix of min_match tokens recurs). Per history h [T]:

        match[s] = max n <= min(max_match, T - 1) such that h[s-n+1 .. s] == h[T-n .. T-1],
                   for s < T - 1 (occurrences ending before the suffix's own end)
        s* = the last s of the largest match followed by max_tokens known tokens, else the first
        draft = h[s*+1 : s*+1+max_tokens]
    The most recent occurrence is the likeliest continuation, but inside a run ("cat cat cat")
    it is the one just before the suffix, followed by a single token; the first is followed by
    the most (a replay of the target's answers takes the fewest rounds with this rule).

    The match lengths are suffix_match.suffix_matches (the rule the pointer copy shares), one set
    of max_match tensor compares for the whole batch over the histories left-aligned in [n, T]
    (T the longest).
    """
    n = len(histories)
    empty = (torch.full((n, max(max_tokens, 0)), -1, dtype=torch.int64),
             torch.zeros(n, dtype=torch.int64))
    lens = torch.tensor([h.numel() for h in histories], dtype=torch.int64)  # [n]
    T = int(lens.max()) if n else 0
    if min(max_match, T - 1) < min_match or max_tokens < 1:
        return empty
    # the histories' device; None (the default) for host histories, as the worker's are, so
    # no tensor here is ever taken for a device one (syncs.py counts by provenance)
    device = None if histories[0].device.type == "cpu" else histories[0].device
    h = torch.nn.utils.rnn.pad_sequence(list(histories), batch_first=True,
                                        padding_value=-1)  # [n, T], left-aligned
    last = lens - 1 if device is None else (lens - 1).to(device)  # [n] x_t's position
    match = suffix_matches(h, last, max_match)  # [n, T], 0 at e >= last
    ends = torch.arange(T, device=device)  # e
    best = match.max(dim=1).values  # [n]
    at_best = match == best[:, None]  # [n, T]
    full = ends[None, :] <= (last - max_tokens)[:, None]  # followed by max_tokens known tokens
    last_full = torch.where(at_best & full, ends, -1).amax(dim=1)
    first = torch.where(at_best, ends, T).amin(dim=1)
    s = torch.where(last_full >= 0, last_full, first)  # [n]
    lengths = torch.where(best >= min_match, (last - s).clamp(max=max_tokens), 0)  # [n]
    offsets = torch.arange(max_tokens, device=device)
    idx = (s[:, None] + 1 + offsets).clamp(max=T - 1)  # [n, max_tokens]
    drafts = torch.where(offsets < lengths[:, None], h.gather(1, idx), -1)
    return drafts, lengths.cpu()


def has_recurring_suffix(history: list[int], min_match: int = MIN_MATCH) -> bool:
    """Whether the last min_match tokens of `history` (x_t last) occur earlier in it, ending
    before its last token: exactly when `lookup_batch` finds it a draft (length > 0). Plain
    Python on the host list: one C-level `list.index` scan per earlier occurrence of the
    suffix's first token (a few us for a chat turn; more for a long history full of one token).
    The worker asks it of every request before paying for a batched lookup that could not
    change a plain round (PromptLookup.may_cover)."""
    end = len(history) - min_match  # an earlier occurrence starts in [0, end)
    if end < 1:
        return False
    suffix, start = history[end:], 0
    while True:
        try:
            start = history.index(suffix[0], start, end)
        except ValueError:
            return False
        if history[start:start + min_match] == suffix:
            return True
        start += 1



class PromptLookup(OfferingProposer):
    """The prompt-lookup proposer of a worker drafting blocks of `block_size` tokens over a
    vocabulary of `vocab_size` (its sampled q are one-hot over it)."""

    name = "lookup"

    def __init__(self, block_size: int, mask_token_id: int, device, vocab_size: int):
        super().__init__(vocab_size)
        self.block_size, self.mask_token_id, self.device = block_size, mask_token_id, device

    def may_cover(self, batch, capped: list[bool] | None) -> bool:
        """Whether every request not capped has a recurring suffix (has_recurring_suffix, on the
        host lists, request by request until one has none). Assumes `offer` matches with the
        default MIN_MATCH."""
        skip = [False] * len(batch.reqs) if capped is None else capped
        return all(s or has_recurring_suffix(r.origin_input_ids + r.output_ids)
                   for s, r in zip(skip, batch.reqs))

    def offer(self, batch, bonus: torch.Tensor, capped: list[bool] | None) -> Offer | None:
        """Lookup drafts from each request's prompt + output so far (SGLang Reqs: batch.reqs),
        or None when no request has one. Capped requests (and rows another proposer found)
        take none. The lookup runs on the host lists; its result reaches the device in one
        copy. A request whose recorded output does
        not end in its bonus token x_t (bonus [bs] on the device; it would: the scheduler runs
        rounds synchronously) takes none either: checked on the device, where x_t is (its row
        drafts the mask token then, still exact)."""
        n, mask = self.block_size - 1, self.mask_token_id
        skip = capped or [False] * len(batch.reqs)
        rows, histories = [], []
        for i, req in enumerate(batch.reqs):
            history = req.origin_input_ids + req.output_ids
            # a history whose last MIN_MATCH tokens do not recur has no draft (lookup_batch's
            # length 0): asked on the host list first, it skips the batched tensor lookup
            if not skip[i] and has_recurring_suffix(history):
                rows.append(i)
                histories.append(torch.tensor(history, dtype=torch.int64))
        if not rows:
            return None
        drafts, lens = lookup_batch(histories, n)  # [m, B-1] (-1 padded), [m]
        if not bool((lens > 0).any()):
            return None
        # [bs, B + 1]: drafts, found, the history's last token (host, then one copy)
        packed = torch.full((len(batch.reqs), n + 2), mask, dtype=torch.int64)
        index = torch.tensor(rows)
        packed[index, :n] = torch.where(drafts >= 0, drafts, mask)
        packed[:, n] = 0
        packed[index, n] = (lens > 0).long()
        packed[index, n + 1] = torch.stack([h[-1] for h in histories])
        found_host = (packed[:, n] > 0).tolist()
        dev = packed.to(self.device)
        found = (dev[:, n] > 0) & (dev[:, n + 1] == bonus)
        return Offer(found_host, found, dev[:, :n], int(lens.max()))

