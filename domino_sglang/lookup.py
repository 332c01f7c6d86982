"""Prompt lookup: drafts copied from a request's own history, for rounds that need no draft pass.

Answers restate their prompt and repeat themselves (code, arithmetic, lists). When the last
`n >= MIN_MATCH` tokens of a request (prompt + output, x_t last) occurred earlier in that same
history, the tokens that followed the most recent longest such occurrence are a draft that costs
no model pass (the idea of prompt lookup decoding, Saxena 2023, and of SGLang's NGRAM drafter,
kept to one request so a request's drafts never depend on what else is being served).

The worker (worker.py `lookup_rows`) uses a lookup draft in place of the Domino block for that
request; a batch whose every request has one skips the draft pass. Verification is unchanged:
greedy rows keep the longest matching prefix; sampled rows verify the copied tokens as a
deterministic proposal, q = one-hot (min(1, p / q) = p(d), residual p without d): still exact.
Replaying the target's greedy answers to the first 20 MT-Bench / HumanEval / GSM8K prompts
(128 tokens; stage-19 drafter) this takes 4,121 verify rounds down to 3,292.
"""

from __future__ import annotations

import os

import torch

MIN_MATCH = 2  # suffix tokens that must recur: a 1-token match mostly copies noise
MAX_MATCH = 12  # longest suffix compared (as SGLang's NGRAM max match window)


def lookup_draft(history: torch.Tensor, max_tokens: int, min_match: int = MIN_MATCH,
                 max_match: int = MAX_MATCH) -> torch.Tensor:
    """Up to max_tokens tokens [m] that followed an earlier occurrence of the longest suffix of
    history [T] (int64, the request's prompt + output, x_t last) of length min_match..max_match;
    empty when no suffix of min_match tokens recurs.

        match[s] = max n such that history[s-n+1 .. s] == history[T-n .. T-1], s < T - 1
        s* = the last s of the largest match followed by max_tokens known tokens, else the first
        draft = history[s*+1 : s*+1+max_tokens]
    The most recent occurrence is the likeliest continuation, but inside a run ("cat cat cat")
    it is the one just before the suffix, followed by a single token; the first is followed by
    the most. (Replay as in the module docstring: 3,359 rounds taking the last occurrence,
    3,318 the first, 3,292 this rule.)
    """
    T = history.numel()
    n_max = min(max_match, T - 1)
    if n_max < min_match or max_tokens < 1:
        return history[:0]
    # padded[n_max + s] = history[s]; -1 before the start never equals a token
    padded = torch.cat((history.new_full((n_max,), -1), history[:-1]))  # [n_max + T - 1]
    ends = torch.arange(T - 1, device=history.device)  # s = 0 .. T-2, occurrences ending there
    # eq[j, s] = history[s - j] == history[T - 1 - j]  (j = 0 .. n_max-1)
    eq = torch.stack([padded[n_max - j + ends] == history[T - 1 - j] for j in range(n_max)])
    match = eq.int().cumprod(dim=0).sum(dim=0)  # [T-1], longest common suffix ending at s
    best = int(match.max())
    if best < min_match:
        return history[:0]
    ends = torch.nonzero(match == best)[:, 0]  # ascending
    full = ends[ends <= T - 1 - max_tokens]
    s = int(full[-1]) if len(full) else int(ends[0])
    return history[s + 1:s + 1 + max_tokens]


def lookup_from_env() -> bool:
    """Whether the worker drafts by prompt lookup where it can: env DOMINO_LOOKUP=1 (default)
    or 0 (Domino drafts only: measuring the drafter alone, benchmarks/acceptance.py)."""
    value = os.environ.get("DOMINO_LOOKUP", "1")
    if value not in ("0", "1"):
        raise ValueError(f"DOMINO_LOOKUP must be 0 or 1, got {value!r}")
    return value == "1"
