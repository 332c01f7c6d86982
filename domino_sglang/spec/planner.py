"""The round planner: the one place a decode round's draft length L is decided, handed on as data.

`RoundPlanner.plan(batch)` looks at the batch (pinned seeds, one-token rows, the adaptive
policy's choice, the offering proposers' drafts) and returns a frozen `RoundPlan`: L, the
offered rows, and whether the drafter runs. The worker's round only carries the plan out
(worker.py `decode_round`), and the observer learns from it (observer.py). The order of the
decision:

  1. a batch holding a seeded sampled request verifies the full block B (its realised tokens
     depend on L: coins vs. plain draws, sampling.py);
  2. a batch whose every request commits one token per round (penalties, ...: `one_token_flags`)
     decodes plainly (L = 1) under the adaptive policy: speculation only costs it;
  3. otherwise the policy's L (policy.py: adaptive, the full block, or a pinned pattern cycled
     by the first request's committed length, tests);
  4. the offering proposers (protocol.OfferingProposer: prompt lookup, ...) are asked, in
     order, for drafts when L > 1, or when a plain round's requests could all take one instead
     (`plain_round_may_offer`); a row found by one is not offered again. A round whose every
     uncapped request has an offer runs no draft pass and the policy sizes it for the offers
     (policy.offer_len, by proposer), unless that does not pay (the round of step 3 then,
     offers dropped) or L is pinned (seeds, flags);
  5. a plain round (L = 1) verifies no offers;
  6. L is rounded up to a width the target's verify has graphs for (`widths`; every L on a
     CPU outside the GPU-shaped mode), with that many real drafts;
  7. with trees on (`tree_width` K > 0), a round with a draft pass may verify a draft tree
     (tree.py) of N >= tree.MIN_SIZE tokens instead, N the policy's (policy.tree_len: where a
     tree pays more than the chain of step 6; pinned or off, the chain's L as a tree); the
     offered rows' drafts are then branches of their trees beside the drafter's chain. Not
     where a row needs the chain: one-token rows, a grammar (its mask follows a linear
     chain), logprobs (read by chain position).
Depends on torch, the proposers' protocol, the policy's interface (draft_len, offer_len,
tree_len, may_offer_instead, enabled, pinned) and the fields of SGLang's schedule batch it reads
(reqs, seq_lens_cpu, spec_info, sampling_info, has_grammar, return_logprob); SGLang's own test
of a history-free logit processor is handed in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

from domino_sglang.spec.graphs import width_for
from domino_sglang.spec.plan import Offer, RoundPlan
from domino_sglang.spec.proposers.protocol import OfferingProposer
from domino_sglang.spec.sampling import TOP_K_BOUND
from domino_sglang.spec.tree import MIN_SIZE as MIN_TREE_SIZE

logger = logging.getLogger(__name__)


class RoundPlanner:
    """Decides each round's RoundPlan (module docstring). `offering`: the offering proposers,
    in the order they are asked (none: the drafter alone); `bans_only(processor)`: whether a
    serialized custom logit processor only bans fixed tokens, never reading the request's
    output (SGLang's `supports_sampling_mask`); by default every processor may read it."""

    def __init__(self, policy, block_size: int, device,
                 offering: Sequence[OfferingProposer] = (),
                 bans_only: Callable[[str], bool] = lambda processor: False,
                 tree_width: int = 0):
        self.policy = policy
        self.tree_width = tree_width  # K children a tree node; 0: chains only
        self.bans_only = bans_only
        self.block_size = block_size
        self.device = device
        self.offering = tuple(offering)
        # the widths a round may verify (graphs.verify_widths where the verify replays captured
        # graphs): L is rounded up to one, with that many real drafts (padding would be verified
        # at the same cost and could never be accepted)
        self.widths: tuple[int, ...] = tuple(range(1, block_size + 1))
        self._warned = False

    def plan(self, batch) -> RoundPlan:
        for proposer in self.offering:  # what finished requests left behind goes every round
            proposer.keep_only(batch.reqs)
        bs, seeds = len(batch.reqs), [r.sampling_params.sampling_seed for r in batch.reqs]
        # per row, not SamplingBatchInfo.is_all_greedy: filter_batch never recomputes that flag;
        # SGLang's own greedy test (top_k <= 1, what `top_ks` holds), read on the host
        top_ks = [r.sampling_params.top_k for r in batch.reqs]
        greedy_host = [k <= 1 for k in top_ks]
        capped_host = self.one_token_flags(batch)  # [bs] bool: commit one token this round
        capped = (None if capped_host is None  # the one host-to-device copy, only if any
                  else torch.tensor(capped_host, device=self.device))
        all_capped = capped_host is not None and all(capped_host)
        # 1-3: the drafter's L
        pinned = any(s is not None and not g for s, g in zip(seeds, greedy_host))
        if pinned:
            length = self.block_size
        elif self.policy.enabled and all_capped:
            length = 1
        else:
            length = self.policy.draft_len(bs, committed(batch) if self.policy.cycles else 0)
        # 4: offered drafts instead of the drafter's where the rows have them
        asked = bool(self.offering) and not all_capped and (
            length > 1 or (self.policy.may_offer_instead()
                           and self.plain_round_may_offer(batch, capped_host)))
        offers, taken = self.ask(batch, capped_host) if asked else ({}, capped_host)
        offer_only = bool(offers) and all(taken)
        if offer_only and not pinned and self.policy.pinned is None:
            # the longest L an offering proposer's own acceptance pays for
            offer_len = max(self.policy.offer_len(name, bs, offer.longest)
                            for name, offer in offers.items())
            if offer_len > 1:
                length = offer_len
            else:  # offers do not pay: the round the policy chose (the drafter's, or plain)
                offers, offer_only = {}, False
        if offers and length == 1:  # 5: plain decoding after all
            offers, offer_only = {}, False
        length = width_for(length, self.widths)  # 6: at a captured width
        sampled = not all(greedy_host)
        bounded = sampled and all(k <= TOP_K_BOUND for k in top_ks)
        tree = 0  # 7: N, the tree's size, where the policy verifies one instead of the chain
        if (self.tree_width > 0 and length > 1 and not offer_only and capped_host is None
                and not batch.has_grammar and not batch.return_logprob):
            tree = self.policy.tree_len(bs, length, self.tree_sizes)
            length = tree or length
        return RoundPlan(length=length, draft_pass=length > 1 and not offer_only, offers=offers,
                         capped_host=capped_host, capped=capped, sampled=sampled,
                         seeds=seeds, asked=asked, top_k_bounded=bounded,
                         top_k_width=max(top_ks) if bounded else TOP_K_BOUND,
                         tree_width=self.tree_width if tree else 0)

    @property
    def tree_sizes(self) -> tuple[int, ...]:
        """The sizes N a tree round may verify: the verify widths from tree.MIN_SIZE (the
        draft pass drafts at them where it replays graphs)."""
        return tuple(w for w in self.widths if w >= MIN_TREE_SIZE)

    def ask(self, batch, capped: list[bool] | None) -> tuple[dict[str, Offer], list[bool]]:
        """Every offering proposer's drafts, in order, each for the rows no earlier one found
        and that are not capped; and the rows taken (offered or capped) on the host."""
        taken = list(capped) if capped is not None else [False] * len(batch.reqs)
        offers = {}
        for proposer in self.offering:
            offer = proposer.offer(batch, batch.spec_info.bonus_tokens, taken)
            if offer is not None:
                offers[proposer.name] = offer
                taken = [t or f for t, f in zip(taken, offer.found_host)]
        return offers, taken

    def plain_round_may_offer(self, batch, capped: list[bool] | None) -> bool:
        """Whether a round the policy made plain could verify offered drafts instead: only as an
        offer-only round (every uncapped request has an offer) whose drafts pay at this batch
        size even at their longest (policy.offer_len). Both are asked on the host first
        (OfferingProposer.may_cover: prompt lookup asks each request's index until one has no
        draft), so a plain round under load does not pay for offers it could not use. Exact
        for the tokens and the policy's statistics (the rounds are the same); the plain rounds'
        measured times shrink by the search they skip."""
        bs, longest = len(batch.reqs), self.block_size - 1
        return any(self.policy.offer_len(p.name, bs, longest) > 1 and p.may_cover(batch, capped)
                   for p in self.offering)

    def one_token_flags(self, batch) -> list[bool] | None:
        """[bs] bool on the host: requests that commit one token per round (the accepted draft
        or recovered token at chain index 0), or None when there are none. These are the
        requests whose logits depend on their own output so far: frequency / presence /
        repetition penalties, min_new_tokens, and custom logit processors (they read the
        request's output_ids through `custom_params["__req__"]`) other than SGLang's
        history-free disallowed-tokens one.

        Their state is per request, not per chain position: chain index k > 0 would need it
        after d_1..d_k. Committing exactly one token per round, fed back at the next round's
        start (algorithm.cumulate_penalties for the penalizers, as plain decoding's
        prepare_for_decode does; the request's own output_ids for the processors), keeps these
        requests exact; any accepted token is a valid sample of its position, so truncating
        the accepted prefix is lossless."""
        processors = batch.sampling_info.has_custom_logit_processor
        flags = [_has_penalty(r.sampling_params)
                 or (processors and bool(r.custom_logit_processor)
                     and not self.bans_only(r.custom_logit_processor))
                 for r in batch.reqs]
        if not any(flags):
            return None
        if not self._warned:
            self._warned = True
            logger.info("DOMINO: requests with penalties, min_new_tokens or a history-reading "
                        "custom logit processor commit one token per round (exact, no "
                        "speculative speed-up)")
        return flags


def _has_penalty(params) -> bool:
    """A request whose logits depend on its own output so far (SGLang's penalizers)."""
    return (params.frequency_penalty != 0 or params.presence_penalty != 0
            or params.repetition_penalty != 1 or params.min_new_tokens > 0)


def committed(batch) -> int:
    """The first request's committed length (what a pinned pattern cycles by): SGLang's host
    copy of the lengths (no synchronisation), else prompt + output without x_t (not yet in the
    KV cache)."""
    if batch.seq_lens_cpu is not None:
        return int(batch.seq_lens_cpu[0])
    req = batch.reqs[0]
    return len(req.origin_input_ids) + len(req.output_ids) - 1
