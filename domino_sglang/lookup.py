"""Prompt lookup: drafts copied from a request's own history, for rounds that need no draft pass.

Answers restate their prompt and repeat themselves (code, arithmetic, lists). When the last
`n >= MIN_MATCH` tokens of a request (prompt + output, x_t last) occurred earlier in that same
history, the tokens that followed the most recent longest such occurrence are a draft that costs
no model pass (the idea of prompt lookup decoding, Saxena 2023, and of SGLang's NGRAM drafter,
kept to one request so a request's drafts never depend on what else is being served).

The worker (`PromptLookup.find`, asked by planner.py: every request in one `lookup_batch`)
uses a lookup draft in place of the Domino block for that request; a batch whose every request
has one skips the draft pass (32 requests of 300 tokens: 0.4 ms batched, 6 ms one by one).
Verification is unchanged: greedy rows keep the longest matching prefix; sampled rows verify the
copied tokens as a deterministic proposal, q = one-hot (min(1, p / q) = p(d), residual p
without d): still exact.
Replaying the target's greedy answers to the first 20 MT-Bench / HumanEval / GSM8K prompts
(128 tokens; stage-19 drafter) this takes 4,121 verify rounds down to 3,292.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from domino_sglang.copyrule import suffix_matches
from domino_sglang.proposer import DraftSlots, Proposal

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
    the most. (Replay as in the module docstring: 3,359 rounds taking the last occurrence,
    3,318 the first, 3,292 this rule.)

    The match lengths are copyrule.suffix_matches (the rule the pointer copy shares), one set
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
    change a plain round (planner.py `plain_round_may_copy`)."""
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



@dataclass(frozen=True)
class LookupDrafts:
    """A round's prompt-lookup drafts: found_host / found [bs] bool (the rows that copy, on the
    host and on the device), drafts [bs, B-1] int64 on the device (the mask token where a row
    has none), longest (the longest copy, in tokens)."""

    found_host: list[bool]
    found: torch.Tensor
    drafts: torch.Tensor
    longest: int


class PromptLookup:
    """The prompt-lookup proposer (proposer.Proposer) of a worker drafting blocks of
    `block_size` tokens over a vocabulary of `vocab_size` (its sampled q are one-hot over it).
    The planner asks `find` (which rows copy decides L); `propose` then writes the copies."""

    def __init__(self, block_size: int, mask_token_id: int, device, vocab_size: int):
        self.block_size, self.mask_token_id, self.device = block_size, mask_token_id, device
        self.vocab_size = vocab_size

    def propose(self, batch, plan, at: DraftSlots, proposal: Proposal) -> Proposal:
        """The copying rows' drafts over the chain, [x_t, copy, MASK..]; in a sampled round
        their q one-hot on them (one_hot_proposal), the drafter's rows keeping theirs."""
        if plan.copies is None:
            return proposal
        chain, copies = at.chain, plan.copies
        chain[:, 1:] = torch.where(copies.found[:, None], copies.drafts, chain[:, 1:])
        if not plan.sampled:
            return proposal
        q = one_hot_proposal(chain[:, 1:plan.length], copies.found, proposal.q, self.vocab_size)
        return replace(proposal, q=q)

    def find(self, batch, bonus: torch.Tensor, capped: list[bool] | None) -> LookupDrafts | None:
        """Lookup drafts from each request's prompt + output so far (SGLang Reqs: batch.reqs),
        or None when no request has one. Capped requests take none. The lookup runs on the host
        lists; its result reaches the device in one copy. A request whose recorded output does
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
        copies, lens = lookup_batch(histories, n)  # [m, B-1] (-1 padded), [m]
        if not bool((lens > 0).any()):
            return None
        # [bs, B + 1]: drafts, found, the history's last token (host, then one copy)
        packed = torch.full((len(batch.reqs), n + 2), mask, dtype=torch.int64)
        index = torch.tensor(rows)
        packed[index, :n] = torch.where(copies >= 0, copies, mask)
        packed[:, n] = 0
        packed[index, n] = (lens > 0).long()
        packed[index, n + 1] = torch.stack([h[-1] for h in histories])
        found_host = (packed[:, n] > 0).tolist()
        dev = packed.to(self.device)
        found = (dev[:, n] > 0) & (dev[:, n + 1] == bonus)
        return LookupDrafts(found_host, found, dev[:, :n], int(lens.max()))


def one_hot_proposal(drafts: torch.Tensor, rows: torch.Tensor, q: torch.Tensor | None,
                     vocab: int) -> torch.Tensor:
    """q [bs, n, V] with `rows` [bs] replaced by one-hot distributions on their drafts [bs, n]
    (q None: every row one-hot). A draft fixed before verification, whatever chose it, is a
    proposal drawn from its one-hot q: verify_sampled keeps it with probability p(d) and
    recovers from p without d, exact as for any q."""
    one_hot = torch.zeros(*drafts.shape, vocab, dtype=torch.float32, device=drafts.device)
    one_hot.scatter_(2, drafts[..., None], 1.0)
    if q is None:
        return one_hot
    return torch.where(rows[:, None, None], one_hot.to(q.dtype), q)  # no boolean indexing
