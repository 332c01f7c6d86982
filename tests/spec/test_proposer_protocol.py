"""The proposer protocol (spec/proposers/protocol.py): a toy offering proposer in its own file
(tests/spec/toy_proposer.py) plus one registration line in proposers.OFFERING serves rounds beside
prompt lookup, and the round's output equals plain greedy decoding token for token.

The round is the worker's (integration/worker.py `decode_round`) without SGLang: the planner's
plan, the proposers in order over the chain, greedy verification, the committed tokens. The
target is a toy whose next token depends on the last one only (`TABLE`), with fixed points
(where it repeats itself: the toy proposer's drafts are right) and cycles (prompt lookup's)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from domino_sglang.spec.history import HistoryIndexes
from domino_sglang.spec.plan import RoundPlan
from domino_sglang.spec.planner import RoundPlanner
from domino_sglang.spec.proposers import OFFERING, ProposerContext, offering_proposers
from domino_sglang.spec.proposers.protocol import DraftSlots, Proposal
from domino_sglang.spec.verify import verify_greedy
from tests.spec import toy_proposer

B, V, MASK = 5, 32, 31
g = torch.Generator().manual_seed(0)
TABLE = torch.randint(0, V - 1, (V,), generator=g)  # the toy target: next = TABLE[last]
TABLE[[3, 11, 17]] = torch.tensor([3, 11, 17])  # fixed points: runs of one token


class Policy:
    """The policy interface the planner asks: the drafter's L, the offers' L (the whole offer)."""

    enabled, pinned, cycles = True, None, False

    def draft_len(self, bs, committed=0):
        return 4

    def offer_len(self, name, bs, longest):
        return 1 + longest

    def may_offer_instead(self):
        return True


def request(prompt: list[int], rid: int):
    params = SimpleNamespace(top_k=1, sampling_seed=None, frequency_penalty=0.0,
                             presence_penalty=0.0, repetition_penalty=1.0, min_new_tokens=0)
    first = int(TABLE[prompt[-1]])  # the prefill's token, x_t of the first round
    return SimpleNamespace(rid=rid, origin_input_ids=prompt, output_ids=[first],
                           sampling_params=params, custom_logit_processor=None)


def serve(prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], dict[str, int]]:
    """Decode every prompt to `max_tokens` output tokens in batched rounds; returns the outputs
    and, per offering proposer, the draft tokens of its rows the target kept."""
    ctx = ProposerContext(B, MASK, "cpu", V, SimpleNamespace(lookup=True), HistoryIndexes(B - 1))
    offering = offering_proposers(ctx)
    planner = RoundPlanner(Policy(), B, "cpu", offering)
    reqs = [request(p, i) for i, p in enumerate(prompts)]
    kept = {p.name: 0 for p in offering}
    while any(len(r.output_ids) < max_tokens for r in reqs):
        batch = SimpleNamespace(
            reqs=reqs, seq_lens_cpu=None,
            spec_info=SimpleNamespace(bonus_tokens=torch.tensor([r.output_ids[-1] for r in reqs])),
            sampling_info=SimpleNamespace(has_custom_logit_processor=False))
        plan: RoundPlan = planner.plan(batch)
        chain = torch.full((len(reqs), B), MASK, dtype=torch.int64)
        chain[:, 0] = batch.spec_info.bonus_tokens
        at = DraftSlots(chain, torch.zeros_like(chain), torch.zeros_like(chain))
        proposal = Proposal()
        for proposer in offering:  # (no drafter here: its rows keep the mask token)
            proposal = proposer.propose(batch, plan, at, proposal)
        chain = chain[:, :plan.length]
        tokens, accept_lens = verify_greedy(chain, TABLE[chain])  # the target's choices
        for name, offer in plan.offers.items():
            kept[name] += int(((accept_lens - 1) * offer.found).sum())
        for r, row, n in zip(reqs, tokens.tolist(), accept_lens.tolist()):
            r.output_ids += row[:n]
    return [r.output_ids[:max_tokens] for r in reqs], kept


def plain(prompt: list[int], max_tokens: int) -> list[int]:
    out = [int(TABLE[prompt[-1]])]
    while len(out) < max_tokens:
        out.append(int(TABLE[out[-1]]))
    return out


PROMPTS = [[i, (7 * i) % (V - 1), (3 * i + 1) % (V - 1)] for i in range(V - 1)]


def test_a_registered_toy_proposer_serves_rounds_losslessly(monkeypatch):
    monkeypatch.setitem(OFFERING, "repeat", toy_proposer.for_server)  # the one line
    outputs, kept = serve(PROMPTS, 24)
    assert outputs == [plain(p, 24) for p in PROMPTS]
    assert kept["repeat"] > 0 and kept["lookup"] > 0  # both proposers' drafts were kept


def test_without_its_registration_the_toy_drafts_nothing():
    outputs, kept = serve(PROMPTS, 24)
    assert outputs == [plain(p, 24) for p in PROMPTS]
    assert "repeat" not in kept and kept["lookup"] > 0


@pytest.mark.parametrize("order", [("lookup", "repeat"), ("repeat", "lookup")])
def test_a_row_found_by_an_earlier_proposer_is_not_offered_again(monkeypatch, order):
    makers = {"lookup": OFFERING["lookup"], "repeat": toy_proposer.for_server}
    monkeypatch.setattr("domino_sglang.spec.proposers.OFFERING", {n: makers[n] for n in order})
    ctx = ProposerContext(B, MASK, "cpu", V, SimpleNamespace(lookup=True), HistoryIndexes(B - 1))
    planner = RoundPlanner(Policy(), B, "cpu", offering_proposers(ctx))
    reqs = [request([3, 5, 3, 5, 3], 0), request([1, 2, 4], 1)]  # "3 5" recurs in the first
    reqs[0].output_ids = [5]
    batch = SimpleNamespace(
        reqs=reqs, seq_lens_cpu=None,
        spec_info=SimpleNamespace(bonus_tokens=torch.tensor([r.output_ids[-1] for r in reqs])),
        sampling_info=SimpleNamespace(has_custom_logit_processor=False))
    plan = planner.plan(batch)
    found = {name: offer.found_host for name, offer in plan.offers.items()}
    if order[0] == "lookup":
        assert found == {"lookup": [True, False], "repeat": [False, True]}
    else:  # the toy offers every row: lookup is left none
        assert found == {"repeat": [True, True]}
    assert plan.kind == "copy" and plan.offered.tolist() == [True, True]
