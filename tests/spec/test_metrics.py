"""The `domino_` metrics on tiny tensors: what each counter counts, checked against hand-made
rounds, and the rollout's base argmax that tells whether the head changed a draft."""

from __future__ import annotations

import pytest
import torch
from prometheus_client import CollectorRegistry

from domino_sglang.spec.metrics import (
    ROUND_KINDS,
    TREE_PATHS,
    DominoMetrics,
    RoundClock,
    accepted_by_position,
    draft_outcomes,
    head_change_outcomes,
    tree_path_counts,
)
from domino_sglang.spec.rollout import base_logits, greedy_rollout
from tests.spec.test_rollout import B, H, V, make_head


def value(registry, name, **labels):
    return registry.get_sample_value(name, {"model_name": "m", **labels}) or 0.0


def test_head_change_outcomes_only_count_reached_positions():
    # L = 5: drafts d_1..d_4; target choices y_0..y_4.
    drafts = torch.tensor([[7, 8, 9, 1],     # a = 2: d_1, d_2 kept, d_3 rejected, d_4 unreached
                           [5, 5, 5, 5]])    # a = 4: all kept
    base = torch.tensor([[7, 3, 2, 2],       # head changed d_2 (kept) and d_3 (rejected), d_4
                         [5, 5, 6, 5]])      # head changed d_3 (kept)
    target = torch.tensor([[7, 8, 4, 0, 0],
                           [5, 5, 5, 5, 3]])
    accept = torch.tensor([3, 5])            # a + 1
    right, wrong = head_change_outcomes(drafts, base, target, accept)
    # row 0: d_2 changed+kept (right), d_3 changed+rejected (wrong), d_4 changed but unreached
    # row 1: d_3 changed+kept (right)
    assert (int(right), int(wrong)) == (2, 1)
    # a pointer drafter's copies are not the head's: row 0's d_2, row 1's d_3 and d_4
    copied = torch.tensor([[False, True, False, False], [False, False, True, True]])
    right, wrong = head_change_outcomes(drafts, base, target, accept, copied)
    assert (int(right), int(wrong)) == (0, 1)  # only row 0's d_3 is the head's
    right, wrong = draft_outcomes(copied, drafts, target, accept)
    assert (int(right), int(wrong)) == (3, 0)  # row 0: d_2; row 1: d_3, d_4; all kept


def test_record_round_counts():
    reg = CollectorRegistry()
    m = DominoMetrics({"model_name": "m"}, max_draft_len=5, registry=reg)
    # every series exists at zero before the first round
    assert reg.get_sample_value("domino_verify_rounds_total", {"model_name": "m"}) == 0.0
    assert reg.get_sample_value("domino_accepted_tokens_by_position_total",
                                {"model_name": "m", "position": "4"}) == 0.0
    assert reg.get_sample_value("domino_fallback_requests_total",
                                {"model_name": "m", "reason": "adaptive_policy"}) == 0.0
    assert value(reg, "domino_cost_scale") == 1.0  # the profile as measured, until calibrated
    m.record_cost_scale(0.74)
    assert value(reg, "domino_cost_scale") == 0.74
    m.record_cost_scale(0.8, draft=0.31, per_token=0.02)  # the learned costs (costs.py)
    assert value(reg, "domino_cost_overhead", part="draft") == 0.31
    assert value(reg, "domino_cost_overhead", part="per_token") == 0.02
    rounds = [[1, 3, 5], [2, 2], [5]]
    for accept in rounds:
        clock = RoundClock(cuda=False)
        clock.mark()
        clock.mark()
        m.record_round(torch.tensor(accept), 5, clock,
                       (torch.tensor(2), torch.tensor(1)), (torch.tensor(4), torch.tensor(0)))
    flat = [a for r in rounds for a in r]
    assert value(reg, "domino_verify_rounds_total") == len(flat) == 6
    assert value(reg, "domino_draft_tokens_proposed_total") == 6 * 4
    assert value(reg, "domino_draft_tokens_accepted_total") == sum(a - 1 for a in flat) == 12
    expected = accepted_by_position(flat, 5)
    assert expected == [5, 3, 2, 2]
    for p, count in enumerate(expected, start=1):
        assert value(reg, "domino_accepted_tokens_by_position_total", position=str(p)) == count
    assert value(reg, "domino_head_changed_tokens_total", outcome="right") == 6
    assert value(reg, "domino_head_changed_tokens_total", outcome="wrong") == 3
    assert value(reg, "domino_copied_tokens_total", outcome="right") == 12
    assert value(reg, "domino_copied_tokens_total", outcome="wrong") == 0
    assert value(reg, "domino_draft_seconds_count") == 3
    assert value(reg, "domino_verify_seconds_count") == 3
    assert value(reg, "domino_draft_length_sum") == 15
    assert value(reg, "domino_draft_length_bucket", le="4.0") == 0
    assert value(reg, "domino_draft_length_bucket", le="5.0") == 3
    m.record_fallback("adaptive_policy", 2)
    assert value(reg, "domino_fallback_requests_total", reason="adaptive_policy") == 2
    m.record_eager("draft_pass")
    m.record_eager("draft_pass")
    m.record_eager("sampled_batch_size")
    assert value(reg, "domino_eager_rounds_total", reason="draft_pass") == 2
    assert value(reg, "domino_eager_rounds_total", reason="sampled_batch_size") == 1
    # a plain round (L = 1): counted as a round of bs requests, nothing proposed or accepted
    clock = RoundClock(cuda=False)
    clock.mark()
    clock.mark()
    m.record_round(torch.tensor([1, 1, 1, 1]), 1, clock)
    assert value(reg, "domino_verify_rounds_total") == 6 + 4
    assert value(reg, "domino_draft_tokens_proposed_total") == 6 * 4
    assert value(reg, "domino_draft_tokens_accepted_total") == 12
    assert [value(reg, "domino_accepted_tokens_by_position_total", position=str(p))
            for p in range(1, 5)] == expected
    assert value(reg, "domino_head_changed_tokens_total", outcome="right") == 6
    assert value(reg, "domino_draft_length_bucket", le="1.0") == 1
    assert value(reg, "domino_draft_length_sum") == 15 + 1
    assert value(reg, "domino_verify_seconds_count") == 4


@pytest.mark.parametrize("capped,block,policy,expected", [
    (None, 16, True, (0, 0)),                       # a speculative round: no fallback
    (None, 1, True, (3, 0)),                        # the policy chose a plain round
    (None, 1, False, (0, 0)),                       # debug-draft-len 1 (measurement): no choice
    ([True, False, False], 16, True, (0, 1)),       # a penalized row in a speculative round
    ([True, False, True], 1, True, (1, 2)),         # ... and in a plain round: each row once
])
def test_fallback_reasons_per_request_round(capped, block, policy, expected):
    from types import SimpleNamespace

    from domino_sglang.spec.observer import RoundObserver

    reg = CollectorRegistry()
    observer = RoundObserver(DominoMetrics({"model_name": "m"}, max_draft_len=16, registry=reg),
                             SimpleNamespace(enabled=policy))
    observer.record_fallbacks(3, block, capped)
    got = tuple(value(reg, "domino_fallback_requests_total", reason=r)
                for r in ("adaptive_policy", "one_token_requests"))
    assert got == expected


def test_offering_proposers_are_counted_by_name():
    """domino_lookup_* carry a `proposer` label: declared at 0 (lookup off on a server still
    exports them), then each offering proposer's rows and kept drafts apart, read back with
    the round's other counts."""
    reg = CollectorRegistry()
    m = DominoMetrics({"model_name": "m"}, max_draft_len=5, registry=reg)
    rows = "domino_lookup_rounds_total"
    assert reg.get_sample_value(rows, {"model_name": "m", "proposer": "lookup"}) is None
    m.declare_offering("lookup")
    assert value(reg, rows, proposer="lookup") == 0.0
    assert reg.get_sample_value(rows, {"model_name": "m", "proposer": "lookup"}) == 0.0
    accept = torch.tensor([3, 1, 4])
    offered = {"lookup": torch.tensor([True, False, False]),
               "toy": torch.tensor([False, True, True])}
    m.record_round(accept, 5, RoundClock(cuda=False), offered=offered)
    assert value(reg, rows, proposer="lookup") == 1 and value(reg, rows, proposer="toy") == 2
    kept = "domino_lookup_tokens_accepted_total"
    assert value(reg, kept, proposer="lookup") == 2 and value(reg, kept, proposer="toy") == 3
    assert value(reg, "domino_draft_tokens_accepted_total") == 2 + 0 + 3


def test_tree_paths_are_counted_by_what_they_ran_along():
    """domino_tree_paths_total{branch}: every branch exists at 0; a tree round's requests by
    tree_path_counts: no draft accepted, the chain (head's choices), the chain through a copy
    (a copied position among the path's 1..a), an alternative, an offer (prompt lookup)."""
    reg = CollectorRegistry()
    m = DominoMetrics({"model_name": "m"}, max_draft_len=8, registry=reg)
    assert [value(reg, "domino_tree_paths_total", branch=b) for b in TREE_PATHS] == [0] * 5
    won = torch.tensor([-2, 0, 0, 0, -1, 1])  # winning_branch per request
    accept = torch.tensor([1, 3, 3, 2, 4, 5])
    copied = torch.zeros(6, 5, dtype=torch.bool)
    copied[2, 1] = True  # request 2's path took the copy at position 2 (a = 2)
    copied[3, 1] = True  # request 3's copy lies past its path (a = 1): the head's chain
    counts = tree_path_counts(won, accept, copied)
    assert counts.tolist() == [1, 2, 1, 1, 1]
    assert tree_path_counts(won, accept).tolist() == [1, 3, 0, 1, 1]  # no pointer
    m.record_round(accept, 6, RoundClock(cuda=False), tree_paths=counts)
    assert [value(reg, "domino_tree_paths_total", branch=b)
            for b in TREE_PATHS] == [1, 2, 1, 1, 1]
    assert value(reg, "domino_draft_tokens_accepted_total") == 0 + 2 + 2 + 1 + 3 + 4


def test_round_kinds_are_counted():
    reg = CollectorRegistry()
    m = DominoMetrics({"model_name": "m"}, max_draft_len=16, registry=reg)
    assert reg.get_sample_value("domino_rounds_total",  # every kind exists from the start
                                {"model_name": "m", "kind": "copy"}) == 0
    for kind in ("plain", "plain", "draft", "copy", "tree", "tree", "tree"):
        m.record_kind(kind)
    assert [value(reg, "domino_rounds_total", kind=k) for k in ROUND_KINDS] == [2, 1, 0, 1, 3]


def test_disabled_metrics_are_no_ops():
    m = DominoMetrics(enabled=False)
    clock = m.clock()
    clock.mark()
    m.record_round(torch.tensor([3]), 4, clock)  # nothing to register, nothing raised
    m.record_fallback("adaptive_policy")


@pytest.mark.parametrize("use_head", [True, False])
def test_rollout_base_pick(use_head):
    head = make_head(1)
    z, bonus = torch.randn(4, B, H), torch.randint(0, V, (4,))
    chain = greedy_rollout(z, bonus, head, use_head=use_head)
    chain2, base_pick = greedy_rollout(z, bonus, head, use_head=use_head, return_base_pick=True)
    assert torch.equal(chain, chain2)  # same chain either way
    assert torch.equal(base_pick, base_logits(z, head).argmax(dim=-1))
    assert torch.equal(chain[:, 0], base_pick[:, 0])  # d_1 is always the backbone's
    if use_head:
        assert (chain != base_pick).any()  # this strong test head really overrides
    else:
        assert torch.equal(chain, base_pick)


class _PendingEvent:
    """A torch.cuda.Event stand-in the device has not reached until `done` is set: its
    elapsed_time raises as torch's does on an incomplete event."""

    done = False
    clock = 0.0

    def __init__(self, enable_timing: bool = False):
        self.t = None

    def record(self) -> None:
        _PendingEvent.clock += 0.004
        self.t = _PendingEvent.clock

    def query(self) -> bool:
        return _PendingEvent.done

    def elapsed_time(self, other) -> float:
        if not (_PendingEvent.done):
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        return (other.t - self.t) * 1e3  # ms


def test_cuda_round_clock_is_read_only_once_complete(monkeypatch):
    """Issue 64's crash: a plain round (L = 1) on CUDA reaches record_round before anything has
    synchronised; reading its events there raised. Now it is observed once complete, later."""
    monkeypatch.setattr(torch.cuda, "Event", _PendingEvent)
    monkeypatch.setattr(_PendingEvent, "done", False)
    with pytest.raises(RuntimeError, match="completed"):  # the stand-in fails as torch does
        _PendingEvent().elapsed_time(_PendingEvent())
    reg = CollectorRegistry()
    m = DominoMetrics({"model_name": "m"}, max_draft_len=5, registry=reg, cuda=True)
    for _ in range(2):  # two plain rounds, events still pending: nothing raised, nothing timed
        clock = m.clock()
        clock.mark()
        clock.mark()
        assert clock.spans() is None and not clock.ready()
        m.record_round(torch.tensor([1, 1]), 1, clock)
    assert value(reg, "domino_verify_rounds_total") == 4
    assert value(reg, "domino_draft_seconds_count") == 0
    _PendingEvent.done = True  # the device caught up: the next round observes all three
    clock = m.clock()
    clock.mark()
    clock.mark()
    m.record_round(torch.tensor([2, 1]), 2, clock)
    assert value(reg, "domino_draft_seconds_count") == 3
    assert value(reg, "domino_verify_seconds_count") == 3
    assert value(reg, "domino_draft_seconds_sum") == pytest.approx(3 * 0.004)
