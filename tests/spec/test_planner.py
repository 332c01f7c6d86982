"""The round planner (planner.py): the one place a round's draft length and offered rows are
decided. Tiny fake batches (SGLang's Req / ScheduleBatch fields the planner reads), a stub policy
whose choices the test sets."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from domino_sglang.spec.options import resolve
from domino_sglang.spec.planner import RoundPlanner
from domino_sglang.spec.policy import SpeculationPolicy
from domino_sglang.spec.proposers.lookup import PromptLookup
from domino_sglang.spec.tree import MIN_SIZE as MIN_TREE_SIZE

B, MASK, VOCAB = 6, 99, 128


class StubPolicy:
    """The policy interface the planner uses, with the answers fixed by the test."""

    def __init__(self, length=4, copy_len=5, enabled=True, pinned=None, may_copy=True):
        self.length, self.copy_len, self.enabled = length, copy_len, enabled
        self.pinned, self.may_copy = pinned, may_copy
        self.cycles = pinned is not None and len(pinned) > 1
        self.asked: list[tuple] = []

    def draft_len(self, bs, committed=0):
        self.asked.append(("draft_len", bs))
        return self.length

    def offer_len(self, name, bs, longest):
        self.asked.append(("offer_len", name, bs, longest))
        return min(self.copy_len, 1 + longest)

    def may_offer_instead(self):
        return self.may_copy

    tree = None  # the tree size tree_len answers (None: the chain's L where it is a size)

    def tree_len(self, bs, chain_len, sizes):
        self.asked.append(("tree_len", bs, chain_len))
        if self.tree is not None:
            return self.tree
        return chain_len if chain_len in sizes else 0


def req(tokens, top_k=1, seed=None, penalty=0.0, rid="r"):
    params = SimpleNamespace(top_k=top_k, sampling_seed=seed, frequency_penalty=penalty,
                             presence_penalty=0.0, repetition_penalty=1.0, min_new_tokens=0)
    return SimpleNamespace(rid=rid, origin_input_ids=list(tokens[:2]), output_ids=list(tokens[2:]),
                           sampling_params=params, custom_logit_processor=None)


def batch(*reqs):
    bonus = torch.tensor([r.output_ids[-1] for r in reqs])  # x_t: the last output token
    lens = torch.tensor([len(r.origin_input_ids) + len(r.output_ids) - 1 for r in reqs])
    return SimpleNamespace(reqs=list(reqs), seq_lens_cpu=lens,
                           spec_info=SimpleNamespace(bonus_tokens=bonus),
                           sampling_info=SimpleNamespace(has_custom_logit_processor=False))


NEW = [1, 2, 3, 4, 5]  # no recurring suffix: no copy
REPEAT = [7, 8, 9, 7, 8, 9, 7, 8]  # "7 8" recurs: copies 9 7 8 (the first occurrence's run)


def planner(policy, lookup=True):
    return RoundPlanner(policy, B, "cpu", [PromptLookup(B, MASK, "cpu", VOCAB)] if lookup else [])


def test_the_policy_decides_a_drafter_round():
    plan = planner(StubPolicy(length=4)).plan(batch(req(NEW), req(NEW, rid="s")))
    assert (plan.length, plan.draft_pass, plan.offers, plan.kind) == (4, True, {}, "draft")
    assert plan.asked and not plan.sampled and plan.capped is None


def test_a_seeded_sampled_request_pins_the_full_block():
    policy = StubPolicy(length=1)
    plan = planner(policy).plan(batch(req(NEW, top_k=50, seed=3)))
    assert (plan.length, plan.kind, plan.sampled, plan.seeds) == (B, "draft", True, [3])
    assert ("draft_len", 1) not in policy.asked  # the policy is not asked at all
    # a seed on a greedy request does not pin
    assert planner(StubPolicy(length=1)).plan(batch(req(NEW, seed=3))).length == 1


def test_all_capped_rows_decode_plainly_without_lookup():
    plan = planner(StubPolicy(length=4)).plan(batch(req(REPEAT, penalty=0.5)))
    assert (plan.length, plan.kind, plan.offers, plan.asked) == (1, "plain", {}, False)
    assert plan.capped_host == [True] and plan.capped.tolist() == [True]
    # the policy off (fixed block): capped rows still verify the block, committing one token
    assert planner(StubPolicy(length=B, enabled=False)).plan(
        batch(req(REPEAT, penalty=0.5))).length == B


def test_a_copy_only_round_is_sized_for_copies():
    policy = StubPolicy(length=4, copy_len=3)
    plan = planner(policy).plan(batch(req(REPEAT), req(REPEAT, rid="s")))
    assert (plan.length, plan.draft_pass, plan.kind) == (3, False, "copy")
    assert plan.offers["lookup"].found_host == [True, True] and plan.offers["lookup"].longest == 3
    assert plan.offers["lookup"].drafts[0, :3].tolist() == [9, 7, 8]
    # copies that do not pay: the policy's drafter round, copies dropped
    plan = planner(StubPolicy(length=4, copy_len=1)).plan(batch(req(REPEAT)))
    assert (plan.length, plan.kind, plan.offers) == (4, "draft", {})


def test_mixed_rounds_draft_at_the_drafters_length():
    plan = planner(StubPolicy(length=4, copy_len=2)).plan(batch(req(REPEAT), req(NEW, rid="s")))
    assert (plan.length, plan.draft_pass, plan.kind) == (4, True, "mixed")
    assert plan.offered.tolist() == [True, False]


def test_a_plain_round_may_verify_copies_instead():
    plan = planner(StubPolicy(length=1, copy_len=4)).plan(batch(req(REPEAT)))
    assert (plan.length, plan.kind) == (4, "copy")
    # not when a request could not copy (no batched lookup is paid), nor on a calibration round
    for policy, b in ((StubPolicy(length=1), batch(req(REPEAT), req(NEW, rid="s"))),
                      (StubPolicy(length=1, may_copy=False), batch(req(REPEAT)))):
        plan = planner(policy).plan(b)
        assert (plan.length, plan.kind, plan.asked) == (1, "plain", False)


def test_lookup_off_never_copies():
    plan = planner(StubPolicy(length=4), lookup=False).plan(batch(req(REPEAT)))
    assert (plan.length, plan.kind, plan.asked) == (4, "draft", False)


def test_a_pinned_length_is_not_resized_for_copies():
    policy = StubPolicy(length=4, copy_len=2, pinned=(4,))
    plan = planner(policy).plan(batch(req(REPEAT)))
    assert (plan.length, plan.kind) == (4, "copy")
    assert not [a for a in policy.asked if a[0] == "offer_len"]


def pinned_policy(draft_len: str) -> SpeculationPolicy:
    """The policy of a server started with --speculative-domino-debug-draft-len `draft_len`."""
    drafter = SimpleNamespace(candidate_pool=0, short_draft=False, draft_temperature_scale=1.0)
    return SpeculationPolicy.from_config(resolve(drafter, B, {"draft_len": draft_len}))


def test_a_pinned_pattern_cycles_by_the_first_requests_committed_length():
    """The policy cycles the pattern (policy.draft_len); the planner hands it the committed
    length, from SGLang's host copy of the lengths or else from the request."""
    plan = RoundPlanner(pinned_policy("6,1,2"), B, "cpu").plan
    b = batch(req(NEW))  # committed 4 (the host copy of the lengths): pattern[4 % 3] = 1
    assert plan(b).length == 1
    b.seq_lens_cpu = None  # from the request: prompt + output without x_t = 4
    assert plan(b).length == 1
    b.reqs[0].output_ids.append(3)  # committed 5: pattern[2]
    assert plan(b).length == 2
    assert RoundPlanner(pinned_policy("3"), B, "cpu").plan(b).length == 3


def test_the_plan_is_frozen():
    plan = planner(StubPolicy()).plan(batch(req(NEW)))
    with pytest.raises(AttributeError):
        plan.length = 2


@pytest.mark.parametrize("wanted,verified", [(1, 1), (2, 2), (3, 4), (5, 6), (6, 6)])
def test_rounds_verify_at_a_captured_width(wanted, verified):
    """Where the target verifies from captured graphs (graphs.verify_widths), a round that
    wants L verifies the smallest captured width >= L, with that many real drafts; outside the
    GPU shape (the CPU) every L is a width."""
    from domino_sglang.spec.graphs import verify_widths

    assert verify_widths(B) == (1, 2, 4, B) and verify_widths(16) == (1, 2, 4, 8, 16)
    shaped = planner(StubPolicy(length=wanted), lookup=False)
    shaped.widths = verify_widths(B)
    assert shaped.plan(batch(req(NEW))).length == verified
    assert planner(StubPolicy(length=wanted), lookup=False).plan(batch(req(NEW))).length == wanted


def test_buckets_are_the_batch_sizes_sglang_captured():
    """The rollout's buckets are the batch sizes SGLang's graph runner really captured (its
    configured list clamped to the request pool); where it captured none (the CPU's GPU-shaped
    mode), the sizes it would capture for that pool."""
    from domino_sglang.sglang_compat import graph_batch_sizes
    from domino_sglang.spec.graphs import BUCKETS

    runner = SimpleNamespace(decode_cuda_graph_capture_bs=[4, 1, 2])
    assert graph_batch_sizes(runner, captured=(1, 2, 4, 8, 16), buckets=BUCKETS) == (1, 2, 4)
    cpu = SimpleNamespace(decode_cuda_graph_capture_bs=[],
                          req_to_token_pool=SimpleNamespace(size=48))
    assert (graph_batch_sizes(cpu, captured=(), buckets=BUCKETS)
            == (1, 2, 4, 8, 16, 24, 32, 40, 48))
    small = SimpleNamespace(decode_cuda_graph_capture_bs=[],
                            req_to_token_pool=SimpleNamespace(size=6))
    assert graph_batch_sizes(small, captured=(), buckets=BUCKETS) == (1, 2, 4, 6)


def test_a_sampled_round_knows_on_the_host_whether_top_k_bounds_its_filters():
    """top_k_bounded (sampling.process_logits without a whole-vocabulary sort) holds exactly
    when every request's top_k is at most TOP_K_BOUND: Qwen3's default 20 and greedy rows
    do, top-k off (SGLang's 1 << 30) does not."""
    from domino_sglang.spec.sampling import TOP_K_BOUND

    plan = planner(StubPolicy()).plan
    assert plan(batch(req(NEW, top_k=20), req(NEW, top_k=1, rid="g"))).top_k_bounded
    assert plan(batch(req(NEW, top_k=TOP_K_BOUND))).top_k_bounded
    assert not plan(batch(req(NEW, top_k=20), req(NEW, top_k=1 << 30, rid="o"))).top_k_bounded
    assert not plan(batch(req(NEW, top_k=1))).top_k_bounded  # greedy: nothing sampled


def test_every_round_drops_what_finished_requests_left_in_the_proposers():
    """A plain round that asks no proposer still has prompt lookup forget the indexes of
    requests that left the batch (keep_only, every round): under load, where offers do not pay
    and nothing is asked, finished requests' histories are not held."""
    policy = StubPolicy(length=4)
    pl = planner(policy)
    pl.plan(batch(req(REPEAT, rid="a"), req(NEW, rid="b")))  # a draft round: both indexed
    lookup = pl.offering[0]
    assert set(lookup.indexes) == {"a", "b"}
    policy.length, policy.copy_len = 1, 1  # plain, and offers never pay: nothing asked
    plan = pl.plan(batch(req(REPEAT, rid="a")))
    assert not plan.asked and set(lookup.indexes) == {"a"}


def test_trees_from_the_smallest_size_offers_as_branches():
    """Step 7: with trees on, a drafter round of L >= tree.MIN_SIZE verifies a tree, offered
    rows' drafts as branches; a shorter one, an offer-only round, a grammar or logprobs keep
    the chain; trees off never."""
    def plan(length, tokens=NEW, width=3, **flags):
        b = batch(req(tokens), req(NEW, rid="s"))
        b.has_grammar, b.return_logprob = flags.get("grammar", False), flags.get("logprob", False)
        return RoundPlanner(StubPolicy(length=length), B, "cpu",
                            [PromptLookup(B, MASK, "cpu", VOCAB)], tree_width=width).plan(b)

    assert (plan(MIN_TREE_SIZE).tree_width, plan(MIN_TREE_SIZE).kind) == (3, "tree")
    assert plan(B).tree_width == 3
    assert plan(MIN_TREE_SIZE - 1).tree_width == 0
    assert plan(B, width=0).tree_width == 0
    assert plan(B, grammar=True).tree_width == 0 and plan(B, logprob=True).tree_width == 0
    offered = plan(B, tokens=REPEAT)  # one row offered: its draft a branch of its tree
    assert offered.offers and offered.draft_pass and offered.tree_width == 3
    b = batch(req(REPEAT), req(REPEAT, rid="s"))
    b.has_grammar = b.return_logprob = False
    every = RoundPlanner(StubPolicy(length=B), B, "cpu", [PromptLookup(B, MASK, "cpu", VOCAB)],
                         tree_width=3).plan(b)  # every row offered: the copy round, no tree
    assert (every.kind, every.tree_width) == ("copy", 0)


def test_the_policy_sizes_the_tree():
    """Step 7 asks the policy (tree_len) whether a tree pays over the round's chain, with the
    tree sizes the planner allows; its N is the round's length, 0 keeps the chain."""
    policy = StubPolicy(length=3)
    pl = RoundPlanner(policy, B, "cpu", tree_width=2)
    assert pl.tree_sizes == tuple(range(MIN_TREE_SIZE, B + 1))
    policy.tree = B
    b = batch(req(NEW), req(NEW, rid="s"))
    b.has_grammar = b.return_logprob = False
    plan = pl.plan(b)
    assert (plan.length, plan.tree_width, plan.draft_pass) == (B, 2, True)
    assert ("tree_len", 2, 3) in policy.asked
    policy.tree = 0
    plan = pl.plan(b)
    assert (plan.length, plan.tree_width, plan.kind) == (3, 0, "draft")
