"""The order of a pointer drafter's round on the device: the copy history's one host-to-device
copy is queued before the draft pass, so on a GPU the host never waits for the pass to finish
before it can launch the head rollout (a pageable copy queued behind the pass would block it)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from domino_sglang.spec.proposers.domino import DominoProposer
from domino_sglang.spec.proposers.protocol import DraftSlots, Proposal

B, H, BS = 4, 8, 2


class Stop(Exception):
    """Raised where the test has seen enough of the round."""


@pytest.mark.parametrize("static", [False, True])
def test_the_copy_history_is_sent_before_the_draft_pass(static):
    calls = []
    drafter = object.__new__(DominoProposer)  # the drafter's own code, SGLang's pieces stubbed
    drafter.short_draft, drafter.block_size = False, B
    history = (torch.zeros(BS, 3, dtype=torch.int64), torch.ones(BS, dtype=torch.int64))

    def copy_history(reqs, bonus):
        calls.append("copy_history")
        return history

    def draft_block(batch, chain, positions, slots):
        calls.append("draft_block")
        return torch.zeros(BS, B, H)

    def rollout(*args, **kwargs):
        calls.append("rollout")
        raise Stop

    drafter.copy = SimpleNamespace(on_device=True, history=copy_history, for_round=rollout)
    drafter.draft_pass = draft_block
    drafter.rollout_graphs = object() if static else None
    drafter.static_rollout = rollout
    chain = torch.zeros(BS, B, dtype=torch.int64)
    positions = torch.arange(B).repeat(BS, 1)
    plan = SimpleNamespace(draft_pass=True, length=B, tree_width=0)
    with pytest.raises(Stop):
        drafter.propose(SimpleNamespace(reqs=[None] * BS), plan,
                        DraftSlots(chain, positions, positions), Proposal())
    assert calls == ["copy_history", "draft_block", "rollout"]
