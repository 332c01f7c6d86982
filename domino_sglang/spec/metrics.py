"""`domino_` Prometheus metrics, exported on SGLang's own `/metrics`.

SGLang serves `/metrics` from its HTTP process with prometheus_client's multiprocess collector
(`PROMETHEUS_MULTIPROC_DIR`, set by the launcher and inherited by the scheduler processes). A
counter or histogram created in the scheduler process writes its values to that folder, so the
metrics below need no server of their own: create them where the worker runs, and they appear
next to `sglang:*`. Monotonic counters and histograms, from which rates and ratios are derived in
PromQL (README, "Metrics"), and one gauge in prometheus_client's `mostrecent` multiprocess mode
(the last value any process set): the learned costs (cost scale, draft and per-token overhead).

Terms (per request and round; draft length L = tokens in the verified chain [x_t, d_1..d_{L-1}]):

    verify round      one request verified once (SGLang's `spec_verify_ct` counts the same)
    proposed          L - 1 draft tokens
    accepted          a, the drafts the target kept; the round commits a + 1 tokens (tau)
    position p        draft d_p, p = 1..L-1; accepted at p means a >= p
    reached           position p <= a + 1: verification compared d_p with the target's own token
                      (the prefix before it was all accepted); later positions were never judged
    head changed      the head's d_p differs from the backbone's argmax at p; counted only at
                      reached positions, outcome right (d_p accepted) or wrong (d_p rejected)
    copied            a pointer drafter's d_p is its copy candidate, which won the greedy pick
                      (pointer.py); reached positions, by outcome; not counted as head changes

Cost per round: one device-to-host copy of a [L + 1] vector (done once, after the round's
kernels are queued; the scheduler synchronises on accept_lens right after anyway; none in a plain
round) and ~L metric updates. Round times on CUDA are read from events only once they have
completed (RoundClock.ready), so usually a round later. With metrics off (no
`--enable-metrics`, or a non-logging TP rank) every call returns at once.

Depends on prometheus_client and torch; the integration decides where they are enabled
(integration/worker.py `scheduler_metrics`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

PREFIX = "domino_"
TIME_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0)
DRAFT_LEN_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64)
# Reasons a request is decoded without speculation, created at zero so dashboards show them:
# the adaptive policy chose a plain round, or the request commits one token per round because
# its logits depend on its own output (penalties, min_new_tokens, history-reading custom logit
# processors; planner.one_token_flags). Every other request feature (sampling, logit bias, grammar
# masks, logprobs) is verified speculatively.
FALLBACK_REASONS = ("adaptive_policy", "one_token_requests")
ROUND_KINDS = ("plain", "draft", "mixed", "copy", "tree")
# what a tree round's accepted path ran along, per request (tree_path_counts)
TREE_PATHS = ("none", "chain", "copy", "alternative", "lookup")
MAX_PENDING_CLOCKS = 64  # round clocks kept until their CUDA events complete (RoundClock)


def draft_outcomes(mask: torch.Tensor, drafts: torch.Tensor, target_choice: torch.Tensor,
                   accept_lens: torch.Tensor, rows: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Reached draft positions in mask [bs, L-1], split by outcome: 0-d tensors (right, wrong).

    drafts [bs, L-1] (d_1..d_{L-1}), target_choice [bs, L] (y_0..y_{L-1}), accept_lens [bs]
    (a + 1), rows [bs] bool: only these requests (None: all); on the device, without host
    synchronisation (a row mask, not boolean indexing).
    """
    n = drafts.shape[1]
    reached = torch.arange(n, device=drafts.device)[None, :] < accept_lens[:, None]  # p <= a + 1
    counted = mask & reached
    if rows is not None:
        counted = counted & rows[:, None]
    kept = drafts == target_choice[:, :n]
    return (counted & kept).sum(), (counted & ~kept).sum()


def head_change_outcomes(drafts: torch.Tensor, base_pick: torch.Tensor,
                         target_choice: torch.Tensor, accept_lens: torch.Tensor,
                         copied: torch.Tensor | None = None, rows: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Reached draft positions where the head overrode the backbone, split by outcome.

    base_pick [bs, L-1] (backbone argmax at each position); copied [bs, L-1] bool: positions a
    pointer drafter's copy drafted, which are not the head's (counted by copy_outcomes); rows
    [bs] bool: the requests counted (None: all).
    Returns 0-d tensors (right, wrong) as draft_outcomes.
    """
    changed = drafts != base_pick
    if copied is not None:
        changed = changed & ~copied
    return draft_outcomes(changed, drafts, target_choice, accept_lens, rows)


def tree_path_counts(won: torch.Tensor, accept_lens: torch.Tensor,
                     copied: torch.Tensor | None = None) -> torch.Tensor:
    """A tree round's requests by what their accepted path ran along, as counts [5] in
    TREE_PATHS order: none (no draft accepted), chain (the drafted chain, the head's own
    choices: the chain alone would have committed as much), copy (the drafted chain through a
    pointer copy), alternative (a head alternative off the chain), lookup (an offered draft:
    prompt lookup's, off the chain).

    won [bs]: tree.winning_branch (0: the drafted chain, the first given branch; >= 1 an
    offer's; -1: an alternative; -2: none); copied [bs, L-1] bool: the chain's positions the
    pointer copy drafted (None: no pointer). On the device, no host sync."""
    chain = won == 0
    via_copy = torch.zeros_like(chain)
    if copied is not None:
        reached = (torch.arange(copied.shape[1], device=copied.device)[None, :]
                   < (accept_lens - 1)[:, None])  # positions 1..a of the path
        via_copy = chain & (copied & reached).any(dim=1)
    return torch.stack(((won == -2).sum(), (chain & ~via_copy).sum(), via_copy.sum(),
                        (won == -1).sum(), (won >= 1).sum()))


class RoundClock:
    """Wall time between marks. On CUDA it records events, which are read only once the last
    one has completed (`ready()`, a non-blocking `Event.query()`): `elapsed_time` on an event the
    device has not reached raises ("Both events must be completed"), and a plain round (L = 1)
    has no host synchronisation of its own before `record_round`. DominoMetrics keeps a clock
    that is not ready and observes it at a later round (`_observe_ready`)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.points: list = []
        self.mark()

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.points.append(event)
        else:
            self.points.append(time.perf_counter())

    def ready(self) -> bool:
        """Whether every mark's work has completed (always on the CPU); never blocks."""
        return not self.cuda or bool(self.points[-1].query())

    def spans(self) -> list[float] | None:
        """Seconds between consecutive marks, or None while the device has not reached the last
        mark (no synchronisation, nothing raised)."""
        if self.cuda:
            if not self.ready():
                return None
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self.points, self.points[1:])]
        return [b - a for a, b in zip(self.points, self.points[1:])]


class _NullClock:
    def mark(self) -> None:
        pass


class DominoMetrics:
    """The `domino_` series of one scheduler process. `enabled=False` makes every call a no-op.

    `registry=None` (the server) registers nowhere in-process: the multiprocess files are what
    `/metrics` reads. Tests pass a `CollectorRegistry` to read values directly.
    """

    def __init__(self, labels: dict[str, str] | None = None, max_draft_len: int = 16,
                 enabled: bool = True, registry=None, cuda: bool = False):
        self.enabled = enabled
        self.cuda = cuda
        # rounds' clocks whose events the device has not reached yet (RoundClock.ready)
        self._pending_clocks: list[RoundClock] = []
        if not enabled:
            return
        from prometheus_client import Counter, Histogram

        self.labels = dict(labels or {})
        names = list(self.labels)

        def counter(name, doc, extra=()):
            return Counter(PREFIX + name, doc, [*names, *extra], registry=registry)

        def histogram(name, doc, buckets):
            return Histogram(PREFIX + name, doc, names, buckets=buckets, registry=registry)

        self.verify_rounds = counter(
            "verify_rounds_total", "Requests verified, one per request per round.")
        self.proposed = counter(
            "draft_tokens_proposed_total", "Draft tokens sent to verification (L - 1 per round).")
        self.accepted = counter(
            "draft_tokens_accepted_total",
            "Draft tokens the target kept (the bonus token not included).")
        self.accepted_at = counter(
            "accepted_tokens_by_position_total",
            "Rounds whose draft at `position` (1-based) was accepted.", ("position",))
        self.head_changed = counter(
            "head_changed_tokens_total",
            "Reached draft positions where the head overrode the backbone's argmax, by "
            "`outcome` (right = accepted, wrong = rejected).", ("outcome",))
        self.copied = counter(
            "copied_tokens_total",
            "Reached draft positions a pointer-generator drafter drafted by copying from the "
            "request's history (greedy requests), by `outcome`.", ("outcome",))
        self.lookup_rounds = counter(
            "lookup_rounds_total",
            "Request-rounds drafted by an offering `proposer` (lookup: prompt lookup, copied "
            "from the request's own history) instead of the Domino drafter; included in the "
            "series above.", ("proposer",))
        self.lookup_accepted = counter(
            "lookup_tokens_accepted_total",
            "Draft tokens an offering `proposer` drafted that the target kept.", ("proposer",))
        self.round_kinds = counter(
            "rounds_total",
            "Batched decode rounds by `kind`: plain (L = 1), draft (the drafter's), mixed (the "
            "drafter's and copied rows), copy (every row copied, no draft pass), tree (the "
            "drafter's draft tree).", ("kind",))
        self.tree_paths = counter(
            "tree_paths_total",
            "Requests of tree rounds by what the accepted path ran along (`branch`): none (no "
            "draft accepted), chain (the drafted chain, the head's first choices), copy (the "
            "drafted chain through a pointer copy), alternative (a head alternative off the "
            "chain: what the tree added), lookup (prompt lookup's draft, a branch of the tree "
            "off the chain).", ("branch",))
        self.fallbacks = counter(
            "fallback_requests_total",
            "Request-rounds decoded without speculation (L = 1), by `reason`.",
            ("reason",))
        self.eager_rounds = counter(
            "eager_rounds_total",
            "Rounds (or a round's part) that ran eagerly on a server with CUDA graphs (or in "
            "the GPU-shaped debug mode), by `reason`: draft_pass (SGLang's draft graph runner "
            "declined the batch), batch_size / sampled_batch_size / history_length (the head "
            "rollout's graphs have no bucket for it), not_captured (a rollout key not built at "
            "start-up, e.g. a logit bias or a longer history: its static buffers run eagerly), "
            "host_copy_index, verify_width (a verify at a width without captured graphs), "
            "tree (a tree round's rollout and verify).",
            ("reason",))
        self.draft_time = histogram(
            "draft_seconds", "Wall time of one round's draft (backbone + head rollout).",
            TIME_BUCKETS)
        self.verify_time = histogram(
            "verify_seconds", "Wall time of one round's verification (target forward + accept).",
            TIME_BUCKETS)
        self.draft_len = histogram(
            "draft_length", "Draft length L chosen for a round (verified chain, x_t included).",
            DRAFT_LEN_BUCKETS)
        from prometheus_client import Gauge

        self.cost_scale = Gauge(
            PREFIX + "cost_scale",
            "Learned k: how many times the neutral prior's speculative overhead (L = 2) this "
            "server's rounds really take, at the last timed batch size with costs of its own "
            "(costs.py; 1 = as assumed).", names, registry=registry,
            multiprocess_mode="mostrecent")
        self.cost_learned = Gauge(
            PREFIX + "cost_overhead",
            "Learned overhead of a speculative round over a plain one, in plain rounds, at the "
            "batch size of the last timed round (costs.py): part=draft (any L), part=per_token "
            "(each verified token beyond the first).", [*names, "part"], registry=registry,
            multiprocess_mode="mostrecent")

        # Children created up front so every series exists (at 0) from the first scrape.
        lv = self.labels
        self._rounds = self.verify_rounds.labels(**lv)
        self._proposed = self.proposed.labels(**lv)
        self._accepted = self.accepted.labels(**lv)
        self._at = [self.accepted_at.labels(**lv, position=str(p))
                    for p in range(1, max_draft_len)]
        self._right = self.head_changed.labels(**lv, outcome="right")
        self._wrong = self.head_changed.labels(**lv, outcome="wrong")
        self._copy_right = self.copied.labels(**lv, outcome="right")
        self._copy_wrong = self.copied.labels(**lv, outcome="wrong")
        self._offered: dict[str, tuple] = {}  # offering proposer -> its children
        for reason in FALLBACK_REASONS:
            self.fallbacks.labels(**lv, reason=reason)
        self._kinds = {k: self.round_kinds.labels(**lv, kind=k) for k in ROUND_KINDS}
        self._tree_paths = [self.tree_paths.labels(**lv, branch=b) for b in TREE_PATHS]
        self._draft_time = self.draft_time.labels(**lv)
        self._verify_time = self.verify_time.labels(**lv)
        self._draft_len = self.draft_len.labels(**lv)
        self._cost_scale = self.cost_scale.labels(**lv)
        self._cost_scale.set(1.0)
        self._cost_parts = {p: self.cost_learned.labels(**lv, part=p) for p in ("draft",
                                                                                 "per_token")}

    def clock(self) -> RoundClock | _NullClock:
        """Start timing a round; call `.mark()` after the draft and after the verification."""
        return RoundClock(self.cuda) if self.enabled else _NullClock()

    @staticmethod
    def round_stats(accept_lens: torch.Tensor, draft_len: int,
                    head_outcomes: tuple[torch.Tensor, torch.Tensor] | None = None,
                    copy_outcomes: tuple[torch.Tensor, torch.Tensor] | None = None,
                    offered: dict[str, torch.Tensor] | None = None,
                    tree_paths: torch.Tensor | None = None) -> torch.Tensor:
        """What record_round reads back, as one int64 device vector (no host sync): the
        per-position accepted counts [L-1], (right, wrong, copy right, copy wrong), for
        each offering proposer of `offered` (name -> the rows [bs] bool it drafted), in order,
        (rows, their accepted drafts), and a tree round's `tree_path_counts` [5]. The worker
        reads it back together with the policy's accept lengths (one sync a round)."""
        n = draft_len - 1
        positions = torch.arange(1, n + 1, device=accept_lens.device)
        # accepted_at[p] = #requests with a >= p; their sum is the total accepted drafts
        at = ((accept_lens[:, None] - 1) >= positions[None, :]).sum(dim=0)  # [L-1]
        parts = [at, *(torch.stack(o) if o is not None else at.new_zeros(2)
                       for o in (head_outcomes, copy_outcomes))]
        for rows in (offered or {}).values():
            parts.append(torch.stack((rows.sum(), ((accept_lens - 1) * rows).sum())))
        if tree_paths is not None:
            parts.append(tree_paths)
        return torch.cat([p.to(torch.int64) for p in parts])

    def record_round(self, accept_lens: torch.Tensor, draft_len: int,
                     clock: RoundClock | _NullClock,
                     head_outcomes: tuple[torch.Tensor, torch.Tensor] | None = None,
                     copy_outcomes: tuple[torch.Tensor, torch.Tensor] | None = None,
                     offered: dict[str, torch.Tensor] | None = None,
                     stats: list[int] | None = None,
                     tree_paths: torch.Tensor | None = None) -> None:
        """Count one batched round: accept_lens [bs] (a + 1 per request, device tensor),
        draft_len L (the chain length verified for every request this round), the round's clock
        (marked after draft and after verify), `head_change_outcomes(...)` /
        `draft_outcomes(copied, ...)` if computed, the rows each offering proposer drafted
        (name -> [bs] bool), and a tree round's `tree_path_counts`.
        stats: `round_stats(...)` already read back by the caller (else read here: one sync,
        none in a plain round)."""
        if not self.enabled:
            return
        bs, n = int(accept_lens.shape[0]), draft_len - 1
        if stats is None:
            if n > 0 or head_outcomes is not None or copy_outcomes is not None or offered:
                stats = self.round_stats(accept_lens, draft_len, head_outcomes, copy_outcomes,
                                         offered, tree_paths).tolist()  # one sync
            else:  # a plain round (L = 1): nothing drafted, nothing to read back
                stats = [0, 0, 0, 0]
        at_counts, (right, wrong, copy_right, copy_wrong) = stats[:n], stats[n:n + 4]

        self._rounds.inc(bs)
        if n > 0:
            self._proposed.inc(bs * n)
            self._accepted.inc(sum(at_counts))
        for p, count in enumerate(at_counts, start=1):
            if count:
                self._position(p).inc(count)
        if right:
            self._right.inc(right)
        if wrong:
            self._wrong.inc(wrong)
        if copy_right:
            self._copy_right.inc(copy_right)
        if copy_wrong:
            self._copy_wrong.inc(copy_wrong)
        for i, name in enumerate(offered or {}):
            rows, accepted = stats[n + 4 + 2 * i:n + 6 + 2 * i]
            self.record_offered(name, rows, accepted)
        if tree_paths is not None:
            for series, count in zip(self._tree_paths, stats[n + 4 + 2 * len(offered or {}):]):
                if count:
                    series.inc(count)
        self._draft_len.observe(draft_len)
        if isinstance(clock, RoundClock):
            self._pending_clocks.append(clock)
        self._observe_ready()

    def _observe_ready(self) -> None:
        """Observe the draft / verify times of every pending round clock that is ready (on the
        CPU: this round's, at once; on CUDA: usually the previous rounds', the scheduler having
        synchronised on their accept_lens since). At most MAX_PENDING_CLOCKS wait; older ones
        are dropped unobserved rather than synchronised on."""
        waiting = []
        for clock in self._pending_clocks:
            spans = clock.spans()
            if spans is None:
                waiting.append(clock)
            elif len(spans) >= 2:
                self._draft_time.observe(spans[0])
                self._verify_time.observe(spans[1])
        self._pending_clocks = waiting[-MAX_PENDING_CLOCKS:]

    def declare_offering(self, proposer: str) -> None:
        """Export offering proposer `proposer`'s series (at 0 until it drafts)."""
        if self.enabled:
            self._offered_series(proposer)

    def _offered_series(self, proposer: str) -> tuple:
        """(rows, accepted) children of `proposer`, made once (a round only increments)."""
        series = self._offered.get(proposer)
        if series is None:
            series = self._offered[proposer] = (
                self.lookup_rounds.labels(**self.labels, proposer=proposer),
                self.lookup_accepted.labels(**self.labels, proposer=proposer))
        return series

    def record_offered(self, proposer: str, rows: int, accepted: int) -> None:
        """`rows` request-rounds drafted by offering proposer `proposer`, `accepted` of their
        draft tokens kept."""
        rows_series, accepted_series = self._offered_series(proposer)
        rows_series.inc(rows)
        accepted_series.inc(accepted)

    def record_cost_scale(self, k: float, draft: float | None = None,
                          per_token: float | None = None) -> None:
        """The adaptive policy's learned costs (costs.OnlineCosts): k (L = 2's overhead over the
        prior's) and, when given, the draft and per-token overhead in plain rounds."""
        if self.enabled:
            self._cost_scale.set(k)
            if draft is not None and per_token is not None:
                self._cost_parts["draft"].set(draft)
                self._cost_parts["per_token"].set(per_token)

    def record_kind(self, kind: str) -> None:
        """One batched round of `kind` (ROUND_KINDS)."""
        if self.enabled:
            self._kinds[kind].inc()

    def record_fallback(self, reason: str, requests: int = 1) -> None:
        """Requests decoded without speculation (e.g. the adaptive policy chose L = 1)."""
        if self.enabled and requests:
            self.fallbacks.labels(**self.labels, reason=reason).inc(requests)

    def record_eager(self, reason: str) -> None:
        """A round part run eagerly where CUDA graphs are on (eager_rounds_total)."""
        if self.enabled:
            self.eager_rounds.labels(**self.labels, reason=reason).inc()

    def _position(self, p: int):
        if p <= len(self._at):
            return self._at[p - 1]
        return self.accepted_at.labels(**self.labels, position=str(p))


def accepted_by_position(accept_lens: Sequence[int], draft_len: int) -> list[int]:
    """Host reference of the per-position counts (tests): #requests with a >= p, p = 1..L-1."""
    return [sum(1 for a1 in accept_lens if a1 - 1 >= p) for p in range(1, draft_len)]
