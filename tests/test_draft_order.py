"""The order of a pointer drafter's round on the device: the copy history's one host-to-device
copy is queued before the draft pass, so on a GPU the host never waits for the pass to finish
before it can launch the head rollout (a pageable copy queued behind the pass would block it)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from domino_sglang.worker import DominoWorker

B, H, BS = 4, 8, 2


class Stop(Exception):
    """Raised where the test has seen enough of the round."""


@pytest.mark.parametrize("static", [False, True])
def test_the_copy_history_is_sent_before_the_draft_pass(static):
    calls = []
    worker = object.__new__(DominoWorker)  # the round's own code, SGLang's pieces stubbed
    worker.short_draft, worker.block_size = False, B
    worker.copy_gate, worker.device_histories = object(), object()
    history = (torch.zeros(BS, 3, dtype=torch.int64), torch.ones(BS, dtype=torch.int64))

    def copy_history(batch, bonus):
        calls.append("copy_history")
        return history

    def draft_block(batch, chain, positions, slots):
        calls.append("draft_block")
        return torch.zeros(BS, B, H)

    def rollout(*args, **kwargs):
        calls.append("rollout")
        raise Stop

    worker.copy_history, worker.draft_block = copy_history, draft_block
    worker.rollout_graphs = object() if static else None
    worker.static_rollout = rollout
    worker.pointer_copy = rollout
    chain = torch.zeros(BS, B, dtype=torch.int64)
    positions = torch.arange(B).repeat(BS, 1)
    with pytest.raises(Stop):
        worker.draft(SimpleNamespace(reqs=[None] * BS), chain, positions, positions, B, None,
                     None)
    assert calls == ["copy_history", "draft_block", "rollout"]
