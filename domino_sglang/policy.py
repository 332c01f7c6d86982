"""Adaptive speculation: how many chain tokens to verify this round (L = 1 .. B; L = 1 is plain
decoding: no draft, the target decodes one token per request).

Cost model (measured on this 2-core CPU with SmolLM2-135M, bf16, 1 thread): a DOMINO round with
a B = 16 block costs about 1.5x a plain decode step at batch 1 and about 2.4x at batch 8. We
model the cost of a round verifying L tokens per request, in units of one plain decode step at
the same batch size bs, as linear in the extra tokens, with a slope that grows with bs (the
target's forward turns from memory-bound into compute-bound as bs * L grows):

    cost(bs, L) = 1                                  L = 1 (plain decoding)
    cost(bs, L) = 1 + slope(bs) * (L - 1)            slope(bs) = SLOPE_0 + SLOPE_PER_REQ * bs
    slope(1) = 0.5 / 15, slope(8) = 1.4 / 15  =>  SLOPE_PER_REQ = 0.9 / 105, SLOPE_0 = slope(1)
                                                  - SLOPE_PER_REQ   (draft cost folded in)

Acceptance model: each draft is accepted with probability alpha given the ones before it were
(geometric), so a round verifying L tokens commits E(L) = 1 + alpha + ... + alpha^(L-1) =
(1 - alpha^L) / (1 - alpha) tokens. The policy picks L maximising E(L) / cost(bs, L), the
expected committed tokens per unit of decode-step time, and speculates only if that beats plain
decoding (ratio 1) by MARGIN. Since L = 1 is always a candidate, the model never predicts a loss
against plain decoding at any batch size, and the choice moves smoothly (no threshold cliff).

alpha is a running estimate (`AcceptanceStats`): the truncated-geometric MLE accepted / judged
over recent rounds, with exponential forgetting and a prior, probed at the full block every
PROBE_EVERY plain rounds so a drafter that starts to match again is noticed.

Switch: env DOMINO_ADAPTIVE=0 verifies the full block every round (fixed block).
Depends on nothing but the standard library.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

SLOPE_PER_REQ = 0.9 / 105
SLOPE_0 = 0.5 / 15 - SLOPE_PER_REQ
MARGIN = 0.02
PROBE_EVERY = 16


def round_cost(bs: int, draft_len: int) -> float:
    """Cost of a round verifying `draft_len` tokens per request, in plain decode steps."""
    if draft_len <= 1:
        return 1.0
    return 1.0 + (SLOPE_0 + SLOPE_PER_REQ * bs) * (draft_len - 1)


def expected_tokens(alpha: float, draft_len: int) -> float:
    """E[committed tokens] of a round verifying draft_len tokens (bonus included)."""
    return float(sum(alpha**k for k in range(draft_len)))


def choose_draft_len(bs: int, alpha: float, block: int, margin: float = MARGIN) -> int:
    """The L in 1..block maximising expected_tokens / round_cost; 1 unless it beats plain
    decoding by `margin` (relative)."""
    best, best_rate = 1, 1.0 + margin
    for draft_len in range(2, block + 1):
        rate = expected_tokens(alpha, draft_len) / round_cost(bs, draft_len)
        if rate > best_rate:
            best, best_rate = draft_len, rate
    return best


@dataclass
class AcceptanceStats:
    """Running per-draft acceptance rate alpha = accepted / judged, forgetting old rounds."""

    prior_alpha: float = 0.5
    prior_weight: float = 8.0  # pseudo-judged drafts behind the prior
    decay: float = 0.95  # per round
    accepted: float = 0.0
    judged: float = 0.0

    @property
    def alpha(self) -> float:
        return ((self.accepted + self.prior_alpha * self.prior_weight)
                / (self.judged + self.prior_weight))

    def update(self, accepted: int, judged: int) -> None:
        """One round: `accepted` drafts kept over `judged` drafts compared (a request with
        accept length a + 1 out of L judged min(a + 1, L - 1))."""
        self.accepted = self.decay * self.accepted + accepted
        self.judged = self.decay * self.judged + judged


class SpeculationPolicy:
    """Chooses each round's draft length; `enabled=False` always returns the full block."""

    def __init__(self, block: int, enabled: bool = True, stats: AcceptanceStats | None = None):
        self.block = block
        self.enabled = enabled
        self.stats = stats or AcceptanceStats()
        self._plain_rounds = 0

    @classmethod
    def from_env(cls, block: int) -> SpeculationPolicy:
        return cls(block, enabled=os.environ.get("DOMINO_ADAPTIVE", "1") != "0")

    def draft_len(self, bs: int) -> int:
        if not self.enabled:
            return self.block
        chosen = choose_draft_len(bs, self.stats.alpha, self.block)
        if chosen == 1:
            self._plain_rounds += 1
            if self._plain_rounds % PROBE_EVERY == 0:
                return self.block  # probe: measure the drafter again
        return chosen

    def observe(self, accept_lens: list[int], draft_len: int) -> None:
        """accept_lens: a + 1 per request of a round that verified draft_len tokens."""
        if draft_len <= 1 or not self.enabled:
            return
        accepted = sum(a1 - 1 for a1 in accept_lens)
        judged = sum(min(a1, draft_len - 1) for a1 in accept_lens)
        self.stats.update(accepted, judged)
