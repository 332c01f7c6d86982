"""Draft trees (spec/tree.py): the tree's shape and mask, growth against the greedy chain, greedy
acceptance against a brute-force search, and the sampled rule's output distribution against the
target's own (a planted wrong rule must fail the same test)."""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chisquare

from domino_sglang.spec.rollout import greedy_rollout
from domino_sglang.spec.sampling import SamplingRows
from domino_sglang.spec.tree import (
    DraftTree,
    follow,
    grow_tree,
    target_choices,
    winning_branch,
)
from domino_sglang.spec.verify import verify_greedy
from tests.spec.test_rollout import B, H, V, make_head


def _brute_force(tree: DraftTree, choice: torch.Tensor, b: int) -> list[int]:
    """Row b's committed tokens: the deepest node whose whole path matches the choices."""
    best, best_depth = 0, 0
    for j in range(tree.size):
        path = [j]
        while path[-1] != 0:
            path.append(int(tree.parents[b, path[-1]]))
        path.reverse()  # root .. j
        if all(int(tree.tokens[b, path[k + 1]]) == int(choice[b, path[k]])
               for k in range(len(path) - 1)) and len(path) - 1 > best_depth:
            best, best_depth = j, len(path) - 1
    path = [best]
    while path[-1] != 0:
        path.append(int(tree.parents[b, path[-1]]))
    return [int(choice[b, j]) for j in reversed(path)]


def test_a_chain_is_a_tree_with_one_branch():
    torch.manual_seed(0)
    chain = torch.randint(0, 3, (64, 6))
    choice = torch.randint(0, 3, (64, 6))
    tokens, lens, path = follow(DraftTree.chain(chain), choice)
    want_tokens, want_lens = verify_greedy(chain, choice)
    assert torch.equal(lens, want_lens)
    for b in range(64):
        n = int(lens[b])
        assert torch.equal(tokens[b, :n], want_tokens[b, :n])
        assert path[b, :n].tolist() == list(range(n))
    mask = DraftTree.chain(chain).mask()
    assert torch.equal(mask[0], torch.ones(6, 6, dtype=torch.bool).tril())


def _tree(rows: list[tuple[list[int], list[int]]]) -> DraftTree:
    """Trees from (tokens, parents) per row (depths computed)."""
    tokens = torch.tensor([t for t, _ in rows])
    parents = torch.tensor([p for _, p in rows])
    depths = torch.zeros_like(tokens)
    for j in range(1, tokens.shape[1]):
        depths[:, j] = depths.gather(1, parents[:, j, None]).squeeze(1) + 1
    return DraftTree(tokens, parents, depths, int(depths.max()))


def test_mask_sees_exactly_the_ancestors():
    #      0
    #    1   2
    #   3 4   5
    #   6
    tree = _tree([([9, 1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 1, 2, 3])])
    mask = tree.mask()[0]
    ancestors = {0: {0}, 1: {0, 1}, 2: {0, 2}, 3: {0, 1, 3}, 4: {0, 1, 4}, 5: {0, 2, 5},
                 6: {0, 1, 3, 6}}
    for j, seen in ancestors.items():
        assert set(mask[j].nonzero().flatten().tolist()) == seen
    assert tree.positions(torch.tensor([10]))[0].tolist() == [10, 11, 11, 12, 12, 12, 13]


def test_custom_mask_is_sglangs_full_mask_layout():
    """Per request its [N, prefix + N] rows, the prefix visible, the tree's mask after it,
    concatenated: what the CPU backend (and FlashInfer through DFLASH's verify input) reads."""
    tree = _tree([([9, 1, 2, 3], [0, 0, 0, 1]), ([9, 4, 5, 6], [0, 0, 1, 2])])
    prefix = torch.tensor([2, 3])
    flat = tree.custom_mask(prefix, 5)
    mask, want = tree.mask(), []
    for b, p in enumerate(prefix.tolist()):
        want.append(torch.cat((torch.ones(4, p, dtype=torch.bool), mask[b]), dim=1).flatten())
    assert torch.equal(flat, torch.cat(want))
    assert not torch.equal(mask[0], mask[1])  # two shapes: a mix-up of rows would show


def test_greedy_follow_is_the_longest_matching_path():
    torch.manual_seed(1)
    shape = [0, 0, 0, 1, 1, 2, 3, 3, 6]  # parents
    rows = [(torch.randint(0, 3, (9,)).tolist(), shape) for _ in range(400)]
    for t, _ in rows:  # siblings distinct, as grow_tree makes them
        t[2] = (t[1] + 1) % 3
        t[4] = (t[3] + 1) % 3
        t[7] = (t[6] + 1) % 3
    tree = _tree(rows)
    choice = torch.randint(0, 3, (400, 9))
    tokens, lens, path = follow(tree, choice)
    for b in range(400):
        want = _brute_force(tree, choice, b)
        assert tokens[b, :int(lens[b])].tolist() == want
        assert tree.depths[b, path[b, :int(lens[b])]].tolist() == list(range(int(lens[b])))
    assert lens.max() >= 4 and lens.min() == 1  # the rule was exercised deep and shallow


@pytest.mark.parametrize("seed", [0, 1])
def test_a_one_wide_tree_is_the_greedy_chain(seed):
    head = make_head(seed)
    z, bonus = torch.randn(7, B, H), torch.randint(0, V, (7,))
    chain = greedy_rollout(z, bonus, head)  # [7, B-1]
    tree = grow_tree(z, bonus, head, size=B, width=1)
    assert torch.equal(tree.tokens, torch.cat((bonus[:, None], chain), dim=1))
    assert tree.depths[0].tolist() == list(range(B))


@pytest.mark.parametrize("pool", [0, 7])
def test_grown_tree_is_well_formed_and_keeps_its_branches(pool):
    head = make_head(3)
    z, bonus = torch.randn(9, B, H), torch.randint(0, V, (9,))
    chain = greedy_rollout(z, bonus, head, candidate_pool=pool)
    spine = torch.randint(0, V, (9, 3))  # a branch the head would rarely grow
    tree = grow_tree(z, bonus, head, size=12, width=3, branches=(chain, spine),
                     candidate_pool=pool, kept_depth=B - 1)
    assert tree.size == 12
    for b in range(9):
        nodes = {}
        for j in range(1, 12):
            p = int(tree.parents[b, j])
            assert p < j and int(tree.depths[b, j]) == int(tree.depths[b, p]) + 1
            key = (p, int(tree.tokens[b, j]))
            assert key not in nodes  # siblings are distinct tokens
            nodes[key] = j
        for branch in (chain[b, :tree.depth], spine[b]):  # every kept branch is a path
            at = 0
            for t in branch.tolist():
                at = nodes[(at, t)]
    # the head's alternatives are in too: more than the two branches' nodes
    assert (tree.depths == 1).sum(dim=1).min() >= 2


def test_branches_are_kept_to_half_the_budget():
    head = make_head(4)
    z, bonus = torch.randn(16, B, H), torch.randint(0, V, (16,))
    spine = (torch.arange(B - 1) % V).expand(16, -1)  # a branch the head would not grow
    tree = grow_tree(z, bonus, head, size=6, width=3, branches=(spine,))
    for b in range(16):
        at = 0
        for k in range(3):  # size // 2 tokens of the branch, each the child of the last
            kids = [j for j in range(1, tree.size) if int(tree.parents[b, j]) == at
                    and int(tree.tokens[b, j]) == int(spine[b, k])]
            assert len(kids) == 1
            at = kids[0]
    assert (tree.depths == 1).sum(dim=1).max() >= 2  # the other half: the head's nodes


def _node_path(tree: DraftTree, b: int, j: int) -> list[int]:
    """Node j's path's tokens (d_1 .. d_depth) in row b."""
    path = []
    while j:
        path.append(int(tree.tokens[b, j]))
        j = int(tree.parents[b, j])
    return path[::-1]


def test_each_node_knows_the_branch_its_path_follows():
    """DraftTree.branch: the first given branch whose drafts the node's path is a prefix of
    (kept or grown by the head alike), -1 for the head's alternatives and the root."""
    head = make_head(5)
    z, bonus = torch.randn(6, B, H), torch.randint(0, V, (6,))
    chain = greedy_rollout(z, bonus, head)
    spine = torch.randint(0, V, (6, 3))
    tree = grow_tree(z, bonus, head, size=10, width=3, branches=(chain, spine))
    for b in range(6):
        assert int(tree.branch[b, 0]) == -1
        for j in range(1, tree.size):
            path = _node_path(tree, b, j)
            want = next((i for i, branch in enumerate((chain[b], spine[b]))
                         if branch[:len(path)].tolist() == path), -1)
            assert int(tree.branch[b, j]) == want
    assert (tree.branch == -1)[:, 1:].any() and (tree.branch == 1).any()


def test_kept_branches_over_the_budget_share_it_level_by_level():
    """Two kept branches longer than the budget: the tree takes them shallowest level first,
    the earlier branch first within a level, and stays a tree (every node's parent in it)."""
    head = make_head(6)
    z, bonus = torch.randn(4, B, H), torch.randint(0, V, (4,))
    one = torch.randint(0, V, (4, B - 1))
    two = (one + 1) % V  # differs from `one` at every depth
    tree = grow_tree(z, bonus, head, size=6, width=3, branches=(one, two), kept_depth=B - 1)
    for b in range(4):
        paths = [_node_path(tree, b, j) for j in range(1, 6)]
        for j in range(1, 6):
            p = int(tree.parents[b, j])
            assert p < j and int(tree.depths[b, j]) == int(tree.depths[b, p]) + 1
        want = [one[b, :1], two[b, :1], one[b, :2], two[b, :2], one[b, :3]]
        assert sorted(paths) == sorted(w.tolist() for w in want)


def test_the_winning_branch_of_an_accepted_path():
    """winning_branch: the branch of the accepted path's last node; -2 where nothing was
    accepted. Row 0 follows the chain (branch 0), row 1 leaves it for an alternative, row 2
    accepts no draft."""
    tree = _tree([([9, 1, 2, 3, 4], [0, 0, 0, 1, 2])] * 3)  # x_t; 1, 2 at depth 1; 3 < 1, 4 < 2
    tree = DraftTree(tree.tokens, tree.parents, tree.depths, tree.depth,
                     branch=torch.tensor([[-1, 0, -1, 0, -1]] * 3))
    choice = torch.tensor([[1, 3, 0, 7, 0], [2, 0, 4, 0, 8], [5, 0, 0, 0, 0]])  # y per node
    _, accept_lens, path = follow(tree, choice)
    assert accept_lens.tolist() == [3, 3, 1]
    assert winning_branch(tree, path, accept_lens).tolist() == [0, -1, -2]
    assert winning_branch(DraftTree.chain(torch.tensor([[9, 1, 3]])), torch.tensor([[0, 1, 2]]),
                          torch.tensor([3])).tolist() == [-1]  # no given branch: alternatives


def test_width_too_small_for_the_size_is_refused():
    head = make_head(0)
    with pytest.raises(ValueError, match="width 1 to depth 3 offers 3 nodes"):
        grow_tree(torch.randn(1, B, H), torch.tensor([1]), head, size=8, width=1, depth=3)


# ---- the sampled rule: committed tokens distributed as the target's own ----
VOCAB, TRIALS, TOKENS = 4, 24_000, 3


def _markov(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(2.0 * torch.randn(VOCAB, VOCAB, generator=g), dim=-1)  # [V, V]


def _toy_tree(last: torch.Tensor, table: torch.Tensor) -> DraftTree:
    """A tree over each row's last token: its two likeliest successors, the first with two
    children of its own and a grandchild (shapes vary the accept depth)."""
    top = table[last].topk(2, dim=-1).indices  # [bs, 2]
    a, b = top[:, 0], top[:, 1]
    aa = table[a].topk(2, dim=-1).indices
    aaa = table[aa[:, 0]].argmax(dim=-1)
    tokens = torch.stack((last, a, b, aa[:, 0], aa[:, 1], aaa), dim=1)
    parents = torch.tensor([0, 0, 0, 1, 1, 3]).expand(len(last), 6)
    depths = torch.tensor([0, 1, 1, 2, 2, 3]).expand(len(last), 6)
    return DraftTree(tokens, parents, depths, 3)


def _generate(table: torch.Tensor, rows: SamplingRows, choose) -> tuple[torch.Tensor, float]:
    """TOKENS tokens per row by tree rounds from token 0 at position 5: ([TRIALS, TOKENS],
    the first round's mean committed tokens)."""
    prefix = torch.full((TRIALS,), 5)
    last = torch.zeros(TRIALS, dtype=torch.long)
    done = torch.zeros(TRIALS, dtype=torch.long)
    got = [[] for _ in range(TRIALS)]
    first = None
    while int(done.min()) < TOKENS:
        tree = _toy_tree(last, table)
        logits = table[tree.tokens].log()  # [bs, N, V]: a Markov target, p after the node
        tokens, lens, _ = follow(tree, choose(logits, tree, prefix, rows))
        first = float(lens.double().mean()) if first is None else first
        for b in range(TRIALS):
            got[b].extend(tokens[b, :int(lens[b])].tolist())
        last = tokens.gather(1, (lens - 1)[:, None]).squeeze(1)
        prefix = prefix + lens
        done = done + lens
    return torch.tensor([g[:TOKENS] for g in got]), first


def _expected(table: torch.Tensor, keep: int) -> dict[tuple[int, ...], float]:
    filtered = table.clone()
    if keep < VOCAB:  # top-k
        cut = filtered.topk(keep, dim=-1).values[:, -1:]
        filtered = torch.where(filtered >= cut, filtered, 0.0)
        filtered = filtered / filtered.sum(-1, keepdim=True)
    probs = {}
    for seq in itertools.product(range(VOCAB), repeat=TOKENS):
        p, last = 1.0, 0
        for t in seq:
            p, last = p * float(filtered[last, t]), t
        probs[seq] = p
    return probs


def _p_value(samples: torch.Tensor, expected: dict[tuple[int, ...], float]) -> float:
    cells = [s for s, p in expected.items() if p * TRIALS >= 5]
    counts = {s: 0 for s in cells}
    other = 0
    for row in samples.tolist():
        if tuple(row) in counts:
            counts[tuple(row)] += 1
        else:
            other += 1
    obs = [counts[s] for s in cells] + [other]
    exp = [expected[s] * TRIALS for s in cells]
    exp.append(TRIALS - sum(exp))
    return float(chisquare(obs, exp).pvalue)


def _rows(top_k: int, seed: int) -> SamplingRows:
    g = torch.Generator().manual_seed(seed)
    return SamplingRows(temperature=torch.ones(TRIALS), top_k=torch.full((TRIALS,), top_k),
                        top_p=torch.ones(TRIALS), min_p=torch.zeros(TRIALS),
                        seed=torch.randint(0, 2**62, (TRIALS,), generator=g),
                        need_sort=top_k < VOCAB, need_min_p=False, has_greedy=False,
                        top_k_bounded=top_k < VOCAB, top_k_width=top_k)


def _right(logits, tree, prefix, rows):
    return target_choices(logits, tree.depths, prefix, rows)


def _one_coin(logits, tree, prefix, rows):
    """Planted wrong rule: every node drawn with the uniform of the round's first position."""
    return target_choices(logits, torch.zeros_like(tree.depths), prefix, rows)


@pytest.mark.parametrize("top_k", [VOCAB, 2])
def test_sampled_tree_commits_the_targets_distribution(top_k):
    table = _markov(7)
    samples, per_round = _generate(table, _rows(top_k, 11), _right)
    assert _p_value(samples, _expected(table, top_k)) > 1e-3
    assert per_round > 1.5  # the rounds accepted drafts, at depth 2 and more too


def test_a_wrong_rule_fails_the_same_test():
    table = _markov(7)
    samples, _ = _generate(table, _rows(VOCAB, 11), _one_coin)
    assert _p_value(samples, _expected(table, VOCAB)) < 1e-6
