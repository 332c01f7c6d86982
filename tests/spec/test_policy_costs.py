"""The adaptive policy with costs learned online (costs.py): properties under a GPU-like cost
shape (verify flat in L, the draft pass the main cost) and a CPU-like one (verify growing with
rows), from the device-neutral prior, on simulated round times."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from domino_sglang.spec.costs import (
    CAL_MIN_GAP,
    CAL_REFRESH,
    NEUTRAL,
    PLAIN_MIN,
    PLAIN_SPACING,
    TREE_EXTRA,
    OnlineCosts,
    bs_bucket,
)
from domino_sglang.spec.policy import (
    PROBE_LEN,
    AcceptanceStats,
    CostModel,
    SpeculationPolicy,
    choose_draft_len,
    expected_tokens,
)

B = 16
STEP = 0.02  # seconds of a plain round
# per_token(bs) and draft(bs) in plain rounds; the draft pass dominates on the GPU at small
# batch (a verify of 16 tokens ~ one decode step), verified rows dominate on the CPU
GPU = CostModel(draft=0.45, slope_0=0.004, slope_per_req=0.0)
CPU = CostModel(draft=0.3, slope_0=0.05, slope_per_req=0.012)
SHAPES = {"gpu": GPU, "cpu": CPU}


def serve(policy: SpeculationPolicy, truth: CostModel, bs: int, alpha: float, rounds: int,
          rng: random.Random, noise: float = 0.05) -> tuple[float, float, list[int]]:
    """Rounds of bs requests, drafts kept with probability alpha each (geometric), each round
    taking STEP * truth(bs, L) seconds x lognormal noise, timed into the policy as the worker
    does. (committed tokens per request, plain rounds' time, the L chosen)."""
    tokens = seconds = 0.0
    chosen = []
    for _ in range(rounds):
        draft_len = policy.draft_len(bs)
        lens = []
        for _ in range(bs):
            a = 0
            while a < draft_len - 1 and rng.random() < alpha:
                a += 1
            lens.append(a + 1)
        policy.observe(lens, draft_len)
        policy.observe_time(bs, draft_len, STEP * truth(bs, draft_len)
                            * rng.lognormvariate(0.0, noise))
        tokens += sum(lens) / bs
        seconds += truth(bs, draft_len)
        chosen.append(draft_len)
    return tokens, seconds, chosen


def best_rate(truth: Callable[[int, int], float], bs: int, alpha: float) -> float:
    """The best fixed L's committed tokens per plain round's time (plain decoding: 1)."""
    return max(expected_tokens(alpha, n) / truth(bs, n) for n in range(1, B + 1))


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("bs", [1, 4, 16])
def test_learned_costs_converge_from_the_neutral_prior(shape, bs):
    truth = SHAPES[shape]
    rng = random.Random(bs)
    costs = OnlineCosts()
    assert costs.cost(bs, 2) == NEUTRAL(bs, 2) and costs.scale(bs) == 1.0  # the prior
    assert not costs.knows(bs)
    for i in range(400):  # rounds at the L a policy picks as alpha moves, plain ones between
        draft_len = 1 if i % 8 == 0 else rng.randint(2, B)
        costs.observe(bs, draft_len, STEP * truth(bs, draft_len) * rng.lognormvariate(0, 0.05))
    draft, per_token, n = costs.learned(bs)
    expected = truth.slope_0 + truth.slope_per_req * bs
    # (the draft term within 0.1: at bs 16 on the CPU shape a 5 % noise on a 5-plain-round
    # round is 0.25 in y, and the intercept is what a fit knows least)
    assert draft == pytest.approx(truth.draft, abs=0.1)
    assert per_token == pytest.approx(expected, abs=0.01)
    for draft_len in (2, 8, 16):  # the price of every L within 5 %
        assert costs.cost(bs, draft_len) == pytest.approx(truth(bs, draft_len), rel=0.05)
        assert costs.cost(bs, draft_len, z=1.0) >= costs.cost(bs, draft_len)  # the upper bound
    assert n > 50 and costs.knows(bs) and costs.scale(bs) != 1.0


def test_one_absurd_round_does_not_move_the_fit():
    costs = OnlineCosts()
    rng = random.Random(0)
    for i in range(200):
        draft_len = 1 if i % 8 == 0 else rng.randint(2, B)
        costs.observe(4, draft_len, STEP * CPU(4, draft_len))
    before = costs.cost(4, 8)
    costs.observe(4, 8, STEP * 1000)  # a GC pause
    costs.observe(4, 8, STEP * 0.2)  # a round timed faster than plain
    assert costs.cost(4, 8) == pytest.approx(before, rel=0.03)
    costs.observe(4, 1, STEP * 50)  # nor a plain one (the low median of the window)
    assert costs.plain_time(4) == pytest.approx(STEP)


def test_a_new_batch_size_is_priced_cautiously():
    # a bucket without rounds of its own starts from the dearer of the neutral prior and the
    # nearest learned bucket, never cheaper than either (a load jump must not speculate on a
    # low-load bucket's cheap costs)
    costs = OnlineCosts()
    rng = random.Random(1)
    expensive = CostModel(draft=0.9, slope_0=0.2, slope_per_req=0.0)
    for i in range(300):
        draft_len = 1 if i % 8 == 0 else rng.randint(2, 6)
        costs.observe(2, draft_len, STEP * expensive(2, draft_len))
    for draft_len in (2, 4, 6):  # (bs 2 was timed at L = 2..6)
        assert costs.cost(8, draft_len) >= expensive(8, draft_len) * 0.97
        assert costs.cost(8, draft_len) >= NEUTRAL(8, draft_len)
    cheap = OnlineCosts()
    for i in range(300):
        draft_len = 1 if i % 8 == 0 else rng.randint(2, 6)
        cheap.observe(2, draft_len, STEP * CostModel(0.05, 0.0, 0.0)(2, draft_len))
    assert cheap.cost(8, 4) == pytest.approx(NEUTRAL(8, 4))  # the prior, not bs 2's
    assert bs_bucket(8) not in cheap.fits


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("bs", [1, 4, 16])
def test_low_acceptance_converges_to_plain_and_probes_rarely(shape, bs):
    truth = SHAPES[shape]
    alpha = 0.08  # a drafter that pays nowhere
    assert choose_draft_len(bs, alpha, B, cost=truth) == 1
    for seed in range(1 if bs > 4 else 2):
        policy = SpeculationPolicy(B)
        tokens, seconds, chosen = serve(policy, truth, bs, alpha, 1500, random.Random(seed))
        tail = chosen[500:]
        probes = sum(n > 1 for n in tail)
        # probes (L = 2) spaced by their overhead and backed off as they lose: at most 2 % of
        # rounds, costing under 1 % of plain decoding's time; the whole run (the optimistic
        # prior's first speculative rounds included) within 2 % of plain decoding
        assert probes <= 0.02 * len(tail), (seed, probes)
        assert set(tail) <= {1, PROBE_LEN}
        tail_time = sum(truth(bs, n) for n in tail)
        assert tail_time <= 1.01 * len(tail)
        assert tokens / seconds >= 0.98, (seed, tokens / seconds)


@pytest.mark.parametrize("shape, bs, alpha", [
    ("gpu", 1, 0.8), ("gpu", 16, 0.8), ("gpu", 16, 0.5), ("cpu", 1, 0.8), ("cpu", 1, 0.6),
    ("cpu", 4, 0.7),
])
def test_high_acceptance_speculates(shape, bs, alpha):
    truth = SHAPES[shape]
    best = best_rate(truth, bs, alpha)
    assert best > 1.2  # speculation pays here
    for seed in range(2):
        policy = SpeculationPolicy(B)
        tokens, seconds, chosen = serve(policy, truth, bs, alpha, 1000, random.Random(seed))
        tail = chosen[300:]
        # nearly every round speculates (calibration rounds aside), at a rate close to the best
        assert sum(n > 1 for n in tail) >= 0.95 * len(tail)
        rate = sum(expected_tokens(alpha, n) for n in tail) / sum(truth(bs, n) for n in tail)
        assert rate >= 0.95 * best, (seed, rate, best)


def test_the_shape_decides_the_length():
    # at bs 16 with alpha 0.7 a GPU-like device verifies long chains (rows are nearly free)
    # while a CPU-like one verifies short ones (each row costs ~0.24 plain rounds there: the
    # best fixed L is 4)
    lens = {}
    for shape, truth in SHAPES.items():
        policy = SpeculationPolicy(B)
        _, _, chosen = serve(policy, truth, 16, 0.7, 800, random.Random(3))
        tail = [n for n in chosen[400:] if n > 1]
        lens[shape] = sorted(tail)[len(tail) // 2]
    assert lens["gpu"] >= 8 and lens["cpu"] <= 5


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_floor_holds_at_every_acceptance(shape):
    # whatever the drafter, the policy learning everything online never falls more than 2 %
    # under plain decoding, and never more than 6 % under the best fixed L in hindsight
    truth = SHAPES[shape]
    for bs in (2, 8):
        for alpha in (0.2, 0.4, 0.6):
            policy = SpeculationPolicy(B)
            tokens, seconds, _ = serve(policy, truth, bs, alpha, 800, random.Random(7))
            rate = tokens / seconds
            assert rate >= 0.98, (bs, alpha, rate)
            assert rate >= 0.94 * best_rate(truth, bs, alpha), (bs, alpha, rate)


def test_calibration_rounds_are_rare():
    policy = SpeculationPolicy(B, stats=AcceptanceStats(prior_alpha=0.9, prior_weight=1e12))
    _, _, chosen = serve(policy, GPU, 8, 0.9, 10 * CAL_MIN_GAP, random.Random(0), noise=0.0)
    assert chosen[0] > 1 and chosen[1] == 1  # bs 8 has no plain time: measure one
    plain = [i for i, n in enumerate(chosen) if n == 1]
    # its first PLAIN_MIN plain times PLAIN_SPACING rounds apart (costs are learned from the
    # 20th round or so), later ones at least CAL_MIN_GAP apart
    assert plain[:PLAIN_MIN] == [1 + i * PLAIN_SPACING for i in range(PLAIN_MIN)]
    assert all(b - a >= CAL_MIN_GAP for a, b in zip(plain[PLAIN_MIN - 1:], plain[PLAIN_MIN:]))
    assert policy.calibration.knows(8) and policy.calibration.learned(8)[2] > 0
    assert len(plain) <= PLAIN_MIN + 10 * CAL_MIN_GAP // CAL_REFRESH


def test_a_jump_to_a_dear_batch_size_verifies_short_until_timed():
    """Load jumps from bs 1 to bs 32 on a CPU-like device where one more verified token costs
    0.37 plain rounds there (the AMD EPYC in bf16, 2026-12-04: L = 2 / 5 took 2.0 / 3.1 plain
    rounds). Until bs 32's bucket has timed rounds of its own the policy verifies at most
    PROBE_LEN tokens (its prior, neutral, prices L = 5 at 1.5 plain rounds), so the jump's first
    50 rounds keep >= 0.85 of plain decoding's rate (without the rule: 0.79-0.81, L = 5-6 for
    15 rounds), and the policy settles at plain decoding."""
    dear = CostModel(draft=0.63, slope_0=0.37, slope_per_req=0.0)
    cheap = CostModel(draft=0.3, slope_0=0.05, slope_per_req=0.0)
    for seed in range(3):
        policy = SpeculationPolicy(B)
        serve(policy, cheap, 1, 0.6, 40, random.Random(seed))
        rng, tokens, seconds = random.Random(seed + 10), 0.0, 0.0
        for i in range(300):
            known = policy.calibration.knows(32)
            t, s, (draft_len,) = serve(policy, dear, 32, 0.6, 1, rng)
            assert known or draft_len <= PROBE_LEN, (seed, i, draft_len)
            tokens, seconds = tokens + t, seconds + s
            if i == 49:
                assert tokens / seconds >= 0.85, (seed, tokens / seconds)
                tokens = seconds = 0.0
        assert tokens / seconds >= 0.97, (seed, tokens / seconds)


@pytest.mark.parametrize("bs,alpha", [(1, 0.8), (16, 0.7), (4, 0.5)])
def test_the_policy_chooses_among_the_captured_widths(bs, alpha):
    """Where the target verifies from captured graphs (widths 1, 2, 4, 8, 16), the policy
    picks among those widths only, and learns to speculate as well as the best of them."""
    from domino_sglang.spec.graphs import verify_widths

    widths = verify_widths(B)
    best = max(expected_tokens(alpha, n) / GPU(bs, n) for n in widths)
    policy = SpeculationPolicy(B)
    policy.widths = widths
    tokens, seconds, chosen = serve(policy, GPU, bs, alpha, 800, random.Random(3))
    assert set(chosen) <= set(widths), sorted(set(chosen))
    tail = chosen[300:]
    rate = sum(expected_tokens(alpha, n) for n in tail) / sum(GPU(bs, n) for n in tail)
    assert rate >= 0.93 * best, (rate, best)


def test_offer_only_rounds_price_their_own_long_verifies():
    """An offer-only round (prompt lookup's copies, no draft pass) is timed as a sample of the
    per-token term: where its long verifies cost far more than the prior says (a CPU at bs 2:
    a 16-token verify ~3.5 plain rounds), the offers it pays for get shorter; untimed, they
    stayed at the prior's price and verified the whole block at a loss."""
    bs, truth_per_token = 2, 2.5 / 15  # cost(2, 16) = 3.5 plain rounds without a draft pass

    def offer_rounds(timed: bool) -> list[int]:
        policy = SpeculationPolicy(B, cost=NEUTRAL)
        for _ in range(60):
            policy.observe_offer("lookup", [3], B)  # 2 of 3 judged copies kept: alpha ~0.67
        for _ in range(PLAIN_MIN * PLAIN_SPACING):  # the bucket's plain rounds
            policy.observe_time(bs, 1, STEP)
        chosen = []
        for _ in range(40):
            n = policy.offer_len("lookup", bs, B - 1)
            chosen.append(n)
            if timed and n > 1:
                policy.observe_time(bs, n, STEP * (1 + truth_per_token * (n - 1)),
                                    draft_pass=False)
        return chosen

    untimed, timed = offer_rounds(False), offer_rounds(True)
    assert set(untimed) == {B}  # the prior's 0.04 per token: the whole block pays, always
    alpha = 2 / 3
    pays = [n for n in range(2, B + 1)
            if expected_tokens(alpha, n) / (1 + truth_per_token * (n - 1)) > 1.02]
    assert timed[0] == B and 1 < timed[-1] < B  # learned from its own rounds
    assert abs(timed[-1] - max(pays)) <= 2, (timed, max(pays))


def test_offer_only_rounds_teach_the_per_token_term_alone():
    """A bucket that timed only offer-only rounds still prices the draft pass by its prior: it
    does not count as knowing its costs (the drafter's longest L stays PROBE_LEN), nor prices
    its neighbours."""
    costs = OnlineCosts(prior=NEUTRAL)
    for _ in range(PLAIN_MIN * PLAIN_SPACING):
        costs.observe(4, 1, STEP)
    for _ in range(20):
        costs.observe(4, 16, STEP * 3.0, draft_pass=False)
    draft, per_token, _ = costs.learned(4)
    assert not costs.knows(4) and draft == pytest.approx(NEUTRAL.draft, abs=1e-9)
    assert per_token == pytest.approx(2.0 / 15, rel=0.05)  # learned from the offers
    assert costs.fit(5).prior == (NEUTRAL.draft, NEUTRAL.slope_0)  # not a neighbour's
    costs.observe(4, 2, STEP * 1.5)  # one round with a draft pass
    assert costs.knows(4)


TREE_SIZES = range(6, B + 1)


def serve_trees(policy: SpeculationPolicy, truth: CostModel, bs: int, alpha: float,
                tree_alpha: float, tree_extra: float, rounds: int,
                rng: random.Random) -> tuple[float, float, list[int]]:
    """serve(), with a draft tree of N tokens wherever the policy prefers one (the planner's
    step 7): its path goes one level deeper with probability tree_alpha, and it costs
    tree_extra plain rounds over the chain of its size. (tokens, time, the sizes of the tree
    rounds: 0 for a chain round)."""
    tokens = seconds = 0.0
    trees = []
    for _ in range(rounds):
        draft_len = policy.draft_len(bs)
        size = policy.tree_len(bs, draft_len, TREE_SIZES)
        length, p = (size, tree_alpha) if size else (draft_len, alpha)
        lens = []
        for _ in range(bs):
            a = 0
            while a < length - 1 and rng.random() < p:
                a += 1
            lens.append(a + 1)
        policy.observe(lens, length, tree=size > 0)
        cost = truth(bs, length) + (tree_extra if size else 0.0)
        policy.observe_time(bs, length, STEP * cost * rng.lognormvariate(0.0, 0.05),
                            tree=size > 0)
        tokens += sum(lens) / bs
        seconds += cost
        trees.append(size)
    return tokens, seconds, trees


def best_tree_rate(truth: CostModel, bs: int, tree_alpha: float, tree_extra: float) -> float:
    return max(expected_tokens(tree_alpha, n) / (truth(bs, n) + tree_extra) for n in TREE_SIZES)


def tree_runs(shape: str, tree_alpha: float, tree_extra: float) -> tuple[float, float]:
    """Over 6 seeded servers (400 rounds' warm-up, then 600 counted) at bs 1, the chain's
    per-level acceptance 0.6: (the mean share of tree rounds, the mean committed rate)."""
    shares, rates = [], []
    for seed in range(6):
        policy, rng = SpeculationPolicy(B), random.Random(seed)
        serve_trees(policy, SHAPES[shape], 1, 0.6, tree_alpha, tree_extra, 400, rng)
        tokens, seconds, trees = serve_trees(policy, SHAPES[shape], 1, 0.6, tree_alpha,
                                             tree_extra, 600, rng)
        shares.append(sum(n > 0 for n in trees) / len(trees))
        rates.append(tokens / seconds)
    return sum(shares) / len(shares), sum(rates) / len(rates)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_trees_are_verified_where_they_pay(shape):
    """A tree whose path goes deeper than the chain (per level 0.75 against 0.6) at a small
    extra cost: after a warm-up the policy verifies trees, within 15 % of the best fixed tree's
    rate (it weighs the sizes of TREE_GRID and keeps exploring them), the larger sizes tried."""
    share, rate = tree_runs(shape, 0.75, 0.05)
    assert share > 0.8 and rate > 0.85 * best_tree_rate(SHAPES[shape], 1, 0.75, 0.05)
    policy, rng = SpeculationPolicy(B), random.Random(0)
    serve_trees(policy, SHAPES[shape], 1, 0.6, 0.75, 0.05, 400, rng)
    assert max(policy.trees.sums) in (12, 16)  # the sizes where trees pay most were tried


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("tree_alpha, tree_extra", [(0.55, 0.05), (0.65, 0.6)])
def test_trees_that_do_not_pay_leave_the_chain(shape, tree_alpha, tree_extra):
    """A tree that goes no deeper than the chain, or costs much more: the policy tries it (its
    estimate's doubt), learns, and mostly keeps the chain, within 7 % of the best chain's rate
    (the estimates are noisy at bs 1: a geometric level a round)."""
    share, rate = tree_runs(shape, tree_alpha, tree_extra)
    assert share < 0.2 and rate > 0.93 * best_rate(SHAPES[shape], 1, 0.6)


def test_tree_rounds_price_their_extra_apart_from_the_chain():
    """costs.py: a tree round's time teaches tree_extra (its cost over the chain's of its size),
    never the chain's fit; the extra starts at its prior."""
    costs = OnlineCosts()
    for _ in range(PLAIN_MIN * PLAIN_SPACING):
        costs.observe(1, 1, STEP)
    for _ in range(60):
        costs.observe(1, 6, STEP * 1.5)
    assert costs.tree_extra(1) == pytest.approx(TREE_EXTRA)
    chain = costs.learned(1)
    for _ in range(200):
        costs.observe(1, 6, STEP * 1.8, tree=True)
    assert costs.learned(1) == chain
    assert costs.tree_extra(1) == pytest.approx(0.3, abs=0.02)
    assert costs.tree_cost(1, 6) == pytest.approx(costs.cost(1, 6) + costs.tree_extra(1))
