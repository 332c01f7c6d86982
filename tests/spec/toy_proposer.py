"""A toy offering proposer (tests/spec/test_proposer_protocol.py): it offers every request its last
token, repeated, which is right wherever the target repeats itself. Its own file, and one line
in proposers.OFFERING registers it: what adding a proposer takes."""

from __future__ import annotations

import torch

from domino_sglang.spec.plan import Offer
from domino_sglang.spec.proposers import ProposerContext
from domino_sglang.spec.proposers.protocol import OfferingProposer


class RepeatLast(OfferingProposer):
    """Offers x_t repeated B - 1 times to every request not capped or found before."""

    name = "repeat"

    def __init__(self, block_size: int, device, vocab_size: int):
        super().__init__(vocab_size)
        self.block_size, self.device = block_size, device

    def may_cover(self, batch, capped: list[bool] | None) -> bool:
        return True

    def offer(self, batch, bonus: torch.Tensor, capped: list[bool] | None) -> Offer | None:
        found_host = [not c for c in (capped or [False] * len(batch.reqs))]
        if not any(found_host):
            return None
        n = self.block_size - 1
        drafts = bonus[:, None].expand(-1, n).clone()  # [bs, B-1]
        found = torch.tensor(found_host, device=self.device)
        return Offer(found_host, found, drafts, n, found.long() * n)


def for_server(ctx: ProposerContext) -> RepeatLast:
    return RepeatLast(ctx.block_size, ctx.device, ctx.vocab_size)
