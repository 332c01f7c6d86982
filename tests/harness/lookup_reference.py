"""The prompt-lookup rule stated over whole histories: the reference `HistoryIndex` (the served,
incremental proposer, domino_sglang/spec/proposers/lookup.py) is tested against, and the
"before" of benchmarks/lookup_host.py. Tests and benchmarks only: nothing served calls it."""

from __future__ import annotations

import torch

from domino_sglang.spec.history import MAX_MATCH, MIN_MATCH
from domino_sglang.spec.suffix_match import suffix_matches


def lookup_draft(history: torch.Tensor, max_tokens: int, min_match: int = MIN_MATCH,
                 max_match: int = MAX_MATCH) -> torch.Tensor:
    """Up to max_tokens tokens [m] that followed an earlier occurrence of the longest suffix of
    history [T] (int64, the request's prompt + output, x_t last) of length min_match..max_match;
    empty when no suffix of min_match tokens recurs (`lookup_batch` for one history)."""
    drafts, lengths = lookup_batch([history], max_tokens, min_match, max_match)
    return drafts[0, :int(lengths[0])]


def lookup_batch(histories: list[torch.Tensor], max_tokens: int, min_match: int = MIN_MATCH,
                 max_match: int = MAX_MATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """Lookup drafts of n histories at once, by tensor compares over the whole histories (the
    rule's statement, which HistoryIndex answers incrementally: PromptLookup asks the index):
    (drafts [n, max_tokens] int64, padded with -1; lengths [n], 0 where no suffix of min_match
    tokens recurs), by the rule of lookup.py's module docstring.

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
