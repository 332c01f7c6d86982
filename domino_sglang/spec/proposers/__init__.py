"""Proposers: what drafts a round's tokens (protocol.py). The drafter (domino.py) drafts every
row with a draft pass; offering proposers offer drafts found without one (lookup.py), asked in
the order of OFFERING. A new offering proposer is its own file and one line in OFFERING."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from domino_sglang.spec.history import HistoryIndexes
from domino_sglang.spec.proposers.lookup import PromptLookup
from domino_sglang.spec.proposers.protocol import OfferingProposer


@dataclass(frozen=True)
class ProposerContext:
    """What an offering proposer is built from: the drafter's block B, its mask token, the
    device, the vocabulary size V of the verifier's distributions, the serving options and the
    running requests' history indexes (history.py, shared with the pointer drafter's copy)."""

    block_size: int
    mask_token_id: int
    device: Any
    vocab_size: int
    options: Any  # options.DominoConfig
    histories: HistoryIndexes


def _lookup(ctx: ProposerContext) -> OfferingProposer | None:
    """Prompt lookup, unless --speculative-domino-lookup off."""
    if not ctx.options.lookup:
        return None
    return PromptLookup(ctx.block_size, ctx.mask_token_id, ctx.device, ctx.vocab_size,
                        ctx.histories)


# name -> factory (None: off on this server), in the order a round asks them
OFFERING: dict[str, Callable[[ProposerContext], OfferingProposer | None]] = {
    "lookup": _lookup,
}


def offering_proposers(ctx: ProposerContext) -> list[OfferingProposer]:
    """The offering proposers a server runs, in order."""
    built = [make(ctx) for make in OFFERING.values()]
    return [p for p in built if p is not None]
