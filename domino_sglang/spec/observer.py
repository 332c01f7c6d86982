"""The round observer: what a decode round teaches the metrics and the adaptive policy.

After each round (worker.py `decode_round`) `RoundObserver.record` does, in order:
  - the round's one device-to-host read-back: the verifier's accept lengths (what the policy
    learns from) and the metrics' counts, in one vector; none in a plain round without policy
    statistics (tests/server/test_sync_budget.py holds the budget per round kind);
  - the Prometheus counters (metrics.py): accepted tokens, the drafter's head changes and
    pointer copies, each offering proposer's rows, round kinds, what tree rounds' accepted
    paths ran along (tree.winning_branch);
  - the policy's acceptance estimates (policy.py): the drafter's alpha from the rows it drafted,
    each offering proposer's from the rows it drafted; rows committing one token do not vote;
and at the next round's start (`start_round`) the cost calibration: the previous round's wall
time, start to start, to the policy (policy.py "Calibration"), with a debug log line per round.
Depends on metrics.py, tree.py, the policy's interface and tp.RankAgreement (at TP > 1 every
rank learns from rank 0's round times); no SGLang.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

from domino_sglang.spec.metrics import (
    RoundClock,
    draft_outcomes,
    head_change_outcomes,
    tree_path_counts,
)
from domino_sglang.spec.tp import RankAgreement
from domino_sglang.spec.tree import winning_branch

if TYPE_CHECKING:
    from domino_sglang.spec.plan import RoundPlan
    from domino_sglang.spec.proposers.protocol import Proposal
    from domino_sglang.spec.verify import Verdict

# the round log lines keep the worker's logger
logger = logging.getLogger("domino_sglang.integration.worker")


class RoundObserver:
    """Metrics, policy feedback and cost calibration of a worker's decode rounds."""

    def __init__(self, metrics, policy, agree: RankAgreement | None = None):
        self.metrics = metrics
        self.policy = policy
        self.agree = agree or RankAgreement()  # tensor parallel: rank 0's round times (tp.py)
        # (bs, L, start) of the last decode round, timed at the next one's start (calibration)
        # + kind, mean committed length and its clock (draft / verify marks), logged (debug)
        self._last_round: tuple[int, int, float, str, int, object] | None = None
        self._logged_scale = (1.0, 0.0)  # (k, time) last logged
        self.last_pointer = False  # whether the last round's draft used the pointer copy path

    @property
    def last_round(self) -> tuple[int, int, str] | None:
        """(bs, L, kind) of the last decode round (None after a prefill)."""
        if self._last_round is None:
            return None
        bs, length, _, kind, _, _ = self._last_round
        return bs, length, kind

    def skip_timing(self) -> None:
        """A prefill ran: the decode round before it is not timed."""
        self._last_round = None

    def start_round(self):
        """(now, the round's clock): the previous round timed (time_last_round), a new clock
        started for this one's draft / verify marks."""
        return self.time_last_round(), self.metrics.clock()

    def record(self, batch, plan: RoundPlan, proposal: Proposal | None, chain: torch.Tensor,
               verdict: Verdict, started: float, clock) -> None:
        """Learn from a finished round: chain [bs, L] as verified, verdict's accept lengths
        [bs] (a + 1 per request, one-token rows capped at 1)."""
        bs, length, offered = len(batch.reqs), plan.length, plan.offered
        report = None if proposal is None else proposal.reports.get("domino")  # the drafter's
        accept_lens, drafted = verdict.accept_lens, None if report is None else report.base_pick
        # a tree round's offers are branches: what they added is counted by the tree's paths
        offers = (None if plan.tree_width
                  else {name: offer.found for name, offer in plan.offers.items()} or None)
        observe = self.policy.enabled and length > 1  # the policy learns from drafted rounds
        readback = [verdict.judged.to(torch.int64)] if observe else []  # [bs]
        outcomes = copies = tree_paths = None
        if self.metrics.enabled:  # the head's changes and copies, on the rows it drafted
            pointer_copied = None if report is None else report.copied
            if not plan.sampled and drafted is not None:
                d = None if offered is None else ~offered
                outcomes = head_change_outcomes(chain[:, 1:], drafted, verdict.target_choice,
                                                accept_lens, pointer_copied, d)
                if pointer_copied is not None:
                    copies = draft_outcomes(pointer_copied, chain[:, 1:], verdict.target_choice,
                                            accept_lens, d)
            if proposal is not None and proposal.tree is not None and verdict.path is not None:
                tree_paths = tree_path_counts(
                    winning_branch(proposal.tree, verdict.path, accept_lens), accept_lens,
                    None if report is None else report.copied)
            if length > 1 or offers is not None:
                readback.append(self.metrics.round_stats(accept_lens, length, outcomes, copies,
                                                         offers, tree_paths))
        host = torch.cat(readback).tolist() if readback else []  # the one sync
        if self.metrics.enabled:  # plain round: no stats (nothing drafted), none read
            stats = host[bs:] if observe else host
            self.metrics.record_round(accept_lens, length, clock, outcomes, copies, offers,
                                      stats=stats if length > 1 or offers is not None else None,
                                      tree_paths=tree_paths)
        if observe:  # capped rows gain nothing from L: they do not vote
            lens_host = host[:bs]
            voters = ([not c for c in plan.capped_host] if plan.capped_host is not None
                      else [True] * bs)
            for name in offers or {}:  # each proposer's drafts have an alpha
                found = plan.offers[name].found_host
                self.policy.observe_offer(name, [a for a, f in zip(lens_host, found) if f], length)
                voters = [v and not f for v, f in zip(voters, found)]
            if plan.draft_pass:  # a tree round's rows all vote for the tree's estimate
                self.policy.observe([a for a, v in zip(lens_host, voters) if v], length,
                                    tree=plan.tree_width > 0)
        self.metrics.record_kind(plan.kind)
        kind = plan.kind + ("+offers" if plan.asked else "")
        context = (int(batch.seq_lens_cpu.sum()) // bs if batch.seq_lens_cpu is not None
                   else -1)  # mean committed length (debug log), from the host copy only
        self._last_round = (bs, length, started, kind, context, clock)
        self.last_pointer = report is not None and report.pointer

    def time_last_round(self) -> float:
        """Now; and the previous decode round's cost, start to start, to the policy's cost
        calibration (policy.py). The scheduler runs rounds synchronously (no overlap), so
        on any device this wall time is what the round cost, its output processing included."""
        now = time.perf_counter()
        if self._last_round is not None:
            bs, length, started, kind, context, clock = self._last_round
            if logger.isEnabledFor(logging.DEBUG):  # `-- --log-level debug`
                calibration = self.policy.calibration
                # draft: lookup + draft pass + head; verify: target forward + acceptance
                # (CUDA events the device has not reached yet read as 0: never synchronised on)
                spans = (clock.spans() if isinstance(clock, RoundClock) else None) or [0.0, 0.0]
                logger.debug("DOMINO round %s bs %d L %d context %d %.2f ms (draft %.2f verify "
                             "%.2f) k %.2f alpha %.2f", kind, bs, length, context,
                             1e3 * (now - started), 1e3 * spans[0], 1e3 * spans[1],
                             calibration.scale(bs) if calibration else 1.0, self.policy.stats.alpha)
            # offer-only ("copy") rounds price the per-token verify alone (costs.py)
            self.policy.observe_time(bs, length, self.agree.seconds(now - started),
                                     draft_pass=not kind.startswith("copy"),
                                     tree=kind.startswith("tree"))
            self.report_cost_scale(bs, now)
        return now

    def report_cost_scale(self, bs: int, now: float) -> None:
        """Export the learned costs at the batch size of the round just timed, once that batch
        size has learned from rounds of its own (costs.py); log them when k moved by 10 % (at
        most once a minute)."""
        calibration = self.policy.calibration
        if calibration is None or not self.policy.enabled or not calibration.knows(bs):
            return
        k = calibration.scale(bs)
        draft, per_token, _ = calibration.learned(bs)
        self.metrics.record_cost_scale(k, draft, per_token)
        logged, at = self._logged_scale
        if abs(k - logged) > 0.1 * logged and now - at > 60.0:
            self._logged_scale = (k, now)
            logger.info("DOMINO learned costs at bs %d: a speculative round costs 1 + %.3f + "
                        "%.3f (L - 1) plain rounds, %.2fx the prior's overhead at L = 2 (%d "
                        "rounds timed)", bs, draft, per_token, k, calibration.rounds)

    def record_fallbacks(self, bs: int, length: int, capped: list[bool] | None) -> None:
        """Request-rounds decoded without speculation, by reason: `one_token_requests` (capped
        rows [bs] on the host, whatever L), `adaptive_policy` (the others, when the policy chose
        L = 1)."""
        if not self.metrics.enabled:
            return
        n_capped = 0 if capped is None else sum(map(bool, capped))
        self.metrics.record_fallback("one_token_requests", n_capped)
        if length == 1 and self.policy.enabled:
            self.metrics.record_fallback("adaptive_policy", bs - n_capped)
