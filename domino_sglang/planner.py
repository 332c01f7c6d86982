"""The round planner: the one place a decode round's draft length L is decided, handed on as data.

`RoundPlanner.plan(batch)` looks at the batch (pinned seeds, one-token rows, the adaptive
policy's choice, prompt-lookup copies) and returns a frozen `RoundPlan`: L, the copied rows, and
whether the drafter runs. The worker's round only carries the plan out (worker.py
`decode_round`), and the observer learns from it (observer.py). The order of the decision:

  1. a batch holding a seeded sampled request verifies the full block B (its realised tokens
     depend on L: coins vs. plain draws, sampling.py);
  2. a batch whose every request commits one token per round (penalties, ...: `one_token_flags`)
     decodes plainly (L = 1) under the adaptive policy: speculation only costs it;
  3. otherwise the policy's L (policy.py: adaptive, the full block, or a pinned pattern cycled
     by the first request's committed length, tests);
  4. prompt lookup (lookup.py) is asked for copies when L > 1, or when a plain round's requests
     could all copy instead (`plain_round_may_copy`); a round whose every uncapped request has a
     copy runs no draft pass and the policy sizes it for copies (policy.lookup_len), unless that
     does not pay (the round of step 3 then, copies dropped) or L is pinned (seeds, env);
  5. a plain round (L = 1) verifies no copies;
  6. L is rounded up to a width the target's verify has graphs for (`widths`; every L on a
     CPU outside the GPU-shaped mode), with that many real drafts.
Depends on torch, lookup.py, the policy's interface (draft_len, lookup_len, may_copy_instead,
enabled, pinned) and SGLang's schedule batch (reqs, seq_lens_cpu, spec_info, sampling_info) with
one SGLang helper, through sglang_compat.py.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from domino_sglang.graphs import width_for
from domino_sglang.lookup import LookupDrafts, PromptLookup, has_recurring_suffix
from domino_sglang.sglang_compat import supports_sampling_mask

logger = logging.getLogger(__name__)

ROUND_KINDS = ("plain", "draft", "copy", "mixed")  # metrics.ROUND_KINDS counts these


@dataclass(frozen=True)
class RoundPlan:
    """What one decode round verifies, decided before any model work.

    length:     L, the chain tokens verified per request (1: a plain decoding round)
    draft_pass: whether the drafter's backbone + head run (False: plain, or every row copies)
    copies:     prompt-lookup drafts of the rows that copy (None: no row does)
    capped:     [bs] bool on the host / device: rows committing one token (None: no row does)
    sampled:    whether any request samples (else every row is greedy)
    seeds:      each request's sampling_seed (None: fresh randomness)
    looked_up:  whether prompt lookup was asked this round (debug log)
    """

    length: int
    draft_pass: bool
    copies: LookupDrafts | None
    capped_host: list[bool] | None
    capped: torch.Tensor | None
    sampled: bool
    seeds: list[int | None]
    looked_up: bool

    @property
    def kind(self) -> str:
        """plain (L = 1), copy (no draft pass, every row copies), draft (no copies), mixed."""
        if self.length == 1:
            return "plain"
        if not self.draft_pass:
            return "copy"
        return "draft" if self.copies is None else "mixed"

    @property
    def copied(self) -> torch.Tensor | None:
        """[bs] bool on the device: the rows drafted by copying (None: none)."""
        return None if self.copies is None else self.copies.found


class RoundPlanner:
    """Decides each round's RoundPlan (module docstring). `lookup`: the prompt-lookup proposer
    (None: --speculative-domino-lookup off)."""

    def __init__(self, policy, block_size: int, device, lookup: PromptLookup | None):
        self.policy = policy
        self.block_size = block_size
        self.device = device
        self.lookup = lookup
        # the widths a round may verify (graphs.verify_widths where the verify replays captured
        # graphs): L is rounded up to one, with that many real drafts (padding would be verified
        # at the same cost and could never be accepted)
        self.widths: tuple[int, ...] = tuple(range(1, block_size + 1))
        self._warned = False

    def plan(self, batch) -> RoundPlan:
        bs, seeds = len(batch.reqs), [r.sampling_params.sampling_seed for r in batch.reqs]
        # per row, not SamplingBatchInfo.is_all_greedy: filter_batch never recomputes that flag;
        # SGLang's own greedy test (top_k <= 1, what `top_ks` holds), read on the host
        greedy_host = [r.sampling_params.top_k <= 1 for r in batch.reqs]
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
        # 4: copies instead of drafts where the rows have them
        looked_up = self.lookup is not None and not all_capped and (
            length > 1 or (self.policy.may_copy_instead()
                           and self.plain_round_may_copy(batch, capped_host)))
        copies = (self.lookup.find(batch, batch.spec_info.bonus_tokens, capped_host)
                  if looked_up else None)
        copy_only = copies is not None and all(
            lk or cp for lk, cp in zip(copies.found_host, capped_host or [False] * bs))
        if copy_only and not pinned and self.policy.pinned is None:
            copy_len = self.policy.lookup_len(bs, copies.longest)
            if copy_len > 1:
                length = copy_len
            else:  # copies do not pay: the round the policy chose (the drafter's, or plain)
                copies, copy_only = None, False
        if copies is not None and length == 1:  # 5: plain decoding after all
            copies, copy_only = None, False
        length = width_for(length, self.widths)  # 6: at a captured width
        return RoundPlan(length=length, draft_pass=length > 1 and not copy_only, copies=copies,
                         capped_host=capped_host, capped=capped, sampled=not all(greedy_host),
                         seeds=seeds, looked_up=looked_up)

    def plain_round_may_copy(self, batch, capped: list[bool] | None) -> bool:
        """Whether a round the policy made plain could verify copies instead: only as a
        copy-only round (every uncapped request has a copy) whose copies pay at this batch size
        even at their longest (policy.lookup_len). Both are asked on the host first, request by
        request until one has no recurring suffix (lookup.has_recurring_suffix), so a plain
        round under load does not pay for a batched lookup (1.4 ms at bs 32 on the CPU, ~0.7 %
        of the round) whose copies it could not use. Exact for the tokens and the policy's
        statistics (the rounds are the same); the plain rounds' measured times shrink by the
        lookup they skip. Assumes PromptLookup.find matches with lookup.py's default MIN_MATCH."""
        if self.policy.lookup_len(len(batch.reqs), self.block_size - 1) <= 1:
            return False
        skip = [False] * len(batch.reqs) if capped is None else capped
        return all(s or has_recurring_suffix(r.origin_input_ids + r.output_ids)
                   for s, r in zip(skip, batch.reqs))

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
                 or (processors and _reads_history(r.custom_logit_processor))
                 for r in batch.reqs]
        if not any(flags):
            return None
        if not self._warned:
            self._warned = True
            logger.info("DOMINO: requests with penalties, min_new_tokens or a history-reading "
                        "custom logit processor commit one token per round (exact, no "
                        "speculative speed-up)")
        return flags


def _reads_history(processor: str | None) -> bool:
    """Whether a request's serialized custom logit processor may read its output so far:
    any but SGLang's DisallowedTokensLogitsProcessor (`supports_sampling_mask`: a fixed ban)."""
    return bool(processor) and not supports_sampling_mask(processor)


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
