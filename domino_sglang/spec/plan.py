"""A decode round's plan: what it verifies, decided before any model work (planner.py decides it;
the proposers, the verifier and the observer read it)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from domino_sglang.spec.sampling import TOP_K_BOUND


@dataclass(frozen=True)
class Offer:
    """An offering proposer's drafts for a round (protocol.OfferingProposer): found_host /
    found [bs] bool (the rows it drafts, on the host and on the device), drafts [bs, B-1] int64
    on the device (the mask token where a row has none), longest (its longest draft, in
    tokens), lens [bs] int64 on the device (each row's draft length, 0 without one)."""

    found_host: list[bool]
    found: torch.Tensor
    drafts: torch.Tensor
    longest: int
    lens: torch.Tensor

    def branch(self, depth: int) -> torch.Tensor:
        """[bs, depth] the drafts as a tree branch (tree.grow_tree): -1 past each row's draft,
        and in the rows it does not draft."""
        at = torch.arange(depth, device=self.drafts.device)
        keep = self.found[:, None] & (at[None, :] < self.lens[:, None])
        return torch.where(keep, self.drafts[:, :depth], -1)


ROUND_KINDS = ("plain", "draft", "copy", "mixed", "tree")  # metrics.ROUND_KINDS counts these


@dataclass(frozen=True)
class RoundPlan:
    """What one decode round verifies, decided before any model work.

    length:     L, the chain tokens verified per request (1: a plain decoding round)
    draft_pass: whether the drafter's backbone + head run (False: plain, or every row offered)
    offers:     offering proposer name -> its drafts this round (rows found by an earlier
                proposer are not offered again); empty: no row takes an offer
    capped:     [bs] bool on the host / device: rows committing one token (None: no row does)
    sampled:    whether any request samples (else every row is greedy)
    seeds:      each request's sampling_seed (None: fresh randomness)
    top_k_bounded: every request's top_k <= sampling.TOP_K_BOUND (read on the host)
    top_k_width: the largest request's top_k where bounded (the K its filter ranks)
    asked:      whether offering proposers were asked this round (debug log)
    tree_width: K > 0: the L tokens verified form a draft tree, K children a node (tree.py),
                the offers branches of it (their proposers write nothing); 0: a chain
    """

    length: int
    draft_pass: bool
    offers: dict[str, Offer]
    capped_host: list[bool] | None
    capped: torch.Tensor | None
    sampled: bool
    seeds: list[int | None]
    asked: bool
    top_k_bounded: bool = False
    top_k_width: int = TOP_K_BOUND
    tree_width: int = 0

    @property
    def kind(self) -> str:
        """plain (L = 1), copy (no draft pass, every row offered), draft (no offers), mixed,
        tree (the drafter's tree)."""
        if self.length == 1:
            return "plain"
        if self.tree_width:
            return "tree"
        if not self.draft_pass:
            return "copy"
        return "mixed" if self.offers else "draft"

    @property
    def offered(self) -> torch.Tensor | None:
        """[bs] bool on the device: the rows drafted by an offering proposer (None: none)."""
        found = [offer.found for offer in self.offers.values()]
        if not found:
            return None
        return found[0] if len(found) == 1 else torch.stack(found).any(dim=0)
