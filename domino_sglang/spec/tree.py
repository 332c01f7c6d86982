"""Draft trees: a round's drafts as a token tree grown from one backbone pass (the head's
alternatives best-first by their path's draft probability, beside given branches such as the
chain the pointer copy drafted), verified in one target pass under a tree mask, and accepted
exactly at any temperature.

Terms and shapes (bs requests, N tree tokens with x_t, depth D <= B-1, K children per node):

    tokens   [bs, N] int64  node 0 is x_t (the root); the others are drafts
    parents  [bs, N] int64  the parent of node j sits before it (parents[:, 0] = 0, the root)
    depths   [bs, N] int64  the root's 0; node j's position is prefix + depths[j]
    mask     [bs, N, N]     node j sees node i iff i is j or one of j's ancestors
    branch   [bs, N] int64  the given branch (grow_tree's `branches`, by index) node j's path
                            follows, -1 none (a head alternative); the root -1
    choice   [bs, N] int64  y_j, the target's own token after node j's path: argmax p_j for a
                            greedy row, a draw from p_j (the request's processed distribution)
                            for a sampled one, by a uniform of position prefix + depth_j + 1

Growing (the dynamic tree of EAGLE-2, Li et al. 2024, the idea; our code over the Domino head):
depth 1 takes the K likeliest tokens of base_0; at each depth the K best nodes so far (score: the
log-probability of the node's path under the draft, sum of log q along it) are expanded through
the head, each with its own GRU state (the GRU consumes its own branch's tokens), into their K
likeliest children; the N - 1 best nodes over every depth form the tree. A child scores below its
parent, so the best nodes hold their ancestors. Branches given beside the head (the chain drafted
with the pointer copy, an offer) are kept to half the budget's depth, rounded up; a node is its
whole path (a hash), so a branch the head grew too is one node, and siblings are distinct tokens.

Acceptance (`follow`): from the root, go to the child whose token is y of the current node while
there is one; commit the y's along the way: the drafts on the path, then y at its end (the
bonus). Every committed token is the target's own choice after the committed prefix, so the
output is plain decoding's: greedy, token for token; sampled, in distribution (the token at depth
k is y of the path's node at depth k - 1, drawn from p of exactly that prefix with the uniform of
its own position). This is the target-only traversal SGLang applies to its EAGLE trees, and
recursive rejection sampling with deterministic drafts: offered siblings c_1, c_2, .. in turn,
each accepted with the residual's probability of it (p(c_1), then p with c_1 removed,
renormalised, ...), the fall-back drawn from p without the offered ones; one draw y ~ p decides
the same outcome with the same probabilities. Drafts are deterministic (the head's likeliest
tokens), not sampled from q: a node is then followed with the target's whole mass on its
children, against sum_v min(p, q) for one sampled draft (the one-hot chain already accepts more
than the sampled chain under Qwen3's sampling defaults: benchmarks/results/
throughput_sampled_vs_onehot.md), and a best-first tree selects its nodes by their scores, which
for sampled siblings would select on the draws themselves and bias rejection sampling.

Depends on torch, primitives.py, sampling.py and rollout.py (head steps); no SGLang import.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from domino_sglang.spec.primitives import argmax
from domino_sglang.spec.rollout import HeadInputs, HeadParams, gru_step, head_step
from domino_sglang.spec.sampling import (
    RESAMPLE,
    SamplingRows,
    process_logits,
    sample_from,
    seeded_uniform,
    top_k_support,
)

# the smallest tree a round verifies: below it a tree is the chain and one or two alternatives,
# which commit no more than the chain (benchmarks/tree_acceptance.py) at a growth's cost
MIN_SIZE = 6
_ROOT_HASH = 0x5DEECE66D  # the empty path
_HASH_MUL = 0x100000001B3  # FNV-1's prime: hash(path + t) = hash(path) * MUL + t + 1, wrapping
# a given branch's node at depth d scores _KEPT - 16 d - (the branch's index): above every
# grown node (log-probabilities are <= 0), shallower first, then the earlier branch; integers
# exact in float32, so a child never ties its parent and the cut never takes a child alone
_KEPT = 1e5
_DEPTH_TIE = 1e-4  # subtracted per depth: a child never ties its parent (log q may round to 0)


@dataclass(frozen=True)
class DraftTree:
    """A batch of draft trees, N nodes each (module docstring); `depth` is the deepest a node
    may be (a host int, so that walking the tree needs no synchronisation)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    depth: int
    branch: torch.Tensor | None = None

    @property
    def size(self) -> int:
        """N, the tokens verified per request (x_t included)."""
        return self.tokens.shape[1]

    @staticmethod
    def chain(chain: torch.Tensor) -> DraftTree:
        """The chain [bs, L] = [x_t, d_1 .. d_{L-1}] as a tree with one branch."""
        bs, n = chain.shape
        at = torch.arange(n, device=chain.device)
        return DraftTree(chain, (at - 1).clamp(min=0).expand(bs, n), at.expand(bs, n), n - 1)

    def mask(self) -> torch.Tensor:
        """[bs, N, N] bool: node j sees node i iff i is j or an ancestor of j."""
        bs, n = self.tokens.shape
        seen = torch.eye(n, dtype=torch.bool, device=self.tokens.device).repeat(bs, 1, 1)
        up = self.parents
        for _ in range(self.depth):
            seen.scatter_(2, up[..., None], True)
            up = self.parents.gather(1, up)
        return seen

    def custom_mask(self, prefix_lens: torch.Tensor, prefix_sum: int) -> torch.Tensor:
        """The mask in SGLang's verify layout (FULL_MASK, as DFLASH's verify input hands it to
        the attention backend): per request its [N, prefix + N] rows, the prefix all visible,
        concatenated flat; prefix_sum = sum(prefix_lens), read on the host."""
        bs, n = self.tokens.shape
        prefix = prefix_lens.long()
        row = prefix + n  # [bs] keys of one query row
        start = torch.cumsum(n * row, 0) - n * row  # [bs] where each request's rows begin
        at = torch.arange(n, device=prefix.device)
        index = (start[:, None, None] + at[None, :, None] * row[:, None, None]
                 + prefix[:, None, None] + at[None, None, :])  # [bs, N, N] the tree's entries
        out = torch.ones(prefix_sum * n + bs * n * n, dtype=torch.bool, device=prefix.device)
        out[index.reshape(-1)] = self.mask().reshape(-1)
        return out

    def positions(self, prefix_lens: torch.Tensor) -> torch.Tensor:
        """[bs, N] absolute positions (x_t at prefix_lens)."""
        return prefix_lens.long()[:, None] + self.depths


def follow(tree: DraftTree, choice: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                          torch.Tensor]:
    """The accepted path of every tree, given the target's choices y [bs, N].

    Returns (tokens [bs, D+1], accept_lens [bs], path [bs, D+1]): tokens[:, :accept_len] are the
    committed tokens (the drafts on the path, then the bonus y at its end); path[:, k] the node
    at depth k of the path for k < accept_len (its end node after: padding). No host sync."""
    want = choice.gather(1, tree.parents)  # [bs, N] y of each node's parent
    hit = tree.tokens == want
    on = torch.zeros_like(hit)
    on[:, 0] = True
    for d in range(1, tree.depth + 1):  # a node is on the path iff its parent is and y matched
        on |= (tree.depths == d) & hit & on.gather(1, tree.parents)
    end = (on * (tree.depths + 1)).argmax(dim=1)  # [bs] the deepest node followed
    accepted = tree.depths.gather(1, end[:, None]).squeeze(1)  # [bs] a, the drafts accepted
    ups = [end]  # ups[i]: the end node's ancestor i levels up (the root, once reached)
    for _ in range(tree.depth):
        ups.append(tree.parents.gather(1, ups[-1][:, None]).squeeze(1))
    ups = torch.stack(ups, dim=1)  # [bs, D+1]
    levels = torch.arange(tree.depth + 1, device=end.device)
    path = ups.gather(1, (accepted[:, None] - levels).clamp(min=0))  # [bs, D+1]
    return choice.gather(1, path), accepted + 1, path


def winning_branch(tree: DraftTree, path: torch.Tensor, accept_lens: torch.Tensor
                   ) -> torch.Tensor:
    """[bs] int64: the given branch (DraftTree.branch) the accepted path of follow() ran along,
    -1 where it took a head alternative, -2 where no draft was accepted. No host sync."""
    end = path.gather(1, (accept_lens.long() - 1)[:, None])  # [bs, 1] the path's last node
    on = (tree.branch if tree.branch is not None
          else torch.full_like(tree.tokens, -1)).gather(1, end).squeeze(1)
    return torch.where(accept_lens > 1, on, torch.full_like(on, -2))


def target_choices(logits: torch.Tensor, depths: torch.Tensor, prefix_lens: torch.Tensor,
                   rows: SamplingRows | None) -> torch.Tensor:
    """y [bs, N] of the verify logits [bs, N, V] (after the request's logit adjustments):
    argmax where greedy (rows None, or a greedy row), else a draw from the processed p_j with
    the uniform of position prefix + depth_j + 1 (stream RESAMPLE, as the chain's bonus)."""
    if rows is None:
        return argmax(logits)
    bs, n, vocab = logits.shape
    u = seeded_uniform(rows.seed, prefix_lens.long()[:, None] + depths + 1, RESAMPLE)  # [bs, N]
    flat, many = logits.reshape(-1, vocab), rows.repeat(n)
    if rows.top_k_bounded:  # from the support: K columns, not V (greedy rows at column 0)
        probs, ids = top_k_support(flat, many)
        drawn = ids.gather(1, sample_from(probs, u.reshape(-1))[:, None]).squeeze(1)
    else:
        drawn = sample_from(process_logits(flat, many), u.reshape(-1))
    return drawn.view(bs, n)


def _extend(h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The hash of each path h extended by its token (int64 arithmetic wraps)."""
    return h * _HASH_MUL + tokens + 1


def branch_capacity(width: int, depth: int) -> int:
    """The nodes growing offers: K at depth 1, then K children of K nodes at each depth."""
    return width + max(depth - 1, 0) * width * width


@torch.no_grad()
def grow_tree(z: torch.Tensor, bonus: torch.Tensor, head: HeadParams, size: int, width: int,
              depth: int | None = None, branches: tuple[torch.Tensor, ...] = (),
              candidate_pool: int = 0, kept_depth: int | None = None,
              inputs: HeadInputs | None = None) -> DraftTree:
    """Every request's draft tree of `size` tokens (x_t included; module docstring).

    z [bs, B, H] the backbone's block states, bonus [bs] x_t; width K children per expanded
    node and K nodes expanded per depth, down to `depth` (default: as deep as the block, at
    most size - 1); branches: token paths [bs, m] (d_1 .. d_m) whose first `kept_depth` tokens
    are kept whatever their score (default half the budget, rounded up: the rest to the head's
    alternatives; the chain drafted with the pointer copy kept whole would fill the tree); a
    row's branch may end early, its tokens -1 from there on.
    inputs: the block's base logits and pool where the caller has them (the chain's)."""
    bs = z.shape[0]
    inputs = HeadInputs.of(z, head, candidate_pool) if inputs is None else inputs
    base, cand = inputs.base, inputs.cand  # [bs, n, C]
    n = base.shape[1]
    depth = min(depth or n, n, size - 1)
    if width < 1 or branch_capacity(width, depth) < size - 1:  # grown nodes are distinct paths
        raise ValueError(f"grow_tree: width {width} to depth {depth} offers "
                         f"{branch_capacity(width, depth)} nodes, the tree needs {size - 1}")
    gru, gdtype = head.prefix_gru, head.prefix_gru.weight_hh_l0.dtype
    g = gru.hidden_size
    kept_depth = min((size + 1) // 2 if kept_depth is None else kept_depth, depth)
    # depth 1: the K likeliest tokens of base_0 (position 0 has no head term)
    score, col = torch.log_softmax(base[:, 0].float(), dim=-1).topk(width, dim=-1)  # [bs, K]
    tok = head.token_ids(col)
    if head.native is not None and cand is not None and gdtype == torch.float32:
        # the CPU's native head (fp32, over a candidate pool): the steps below in one kernel
        # call; its log-probabilities may differ in the last bits (drafts only)
        tokens, parents, depths, on = head.native.grow(z, bonus, cand, score, tok, depth, size,
                                                       branches, kept_depth)
        return DraftTree(tokens, parents, depths, depth, branch=on)
    root_state = gru_step(gru, head.embed(bonus).to(gdtype), z.new_zeros(bs, g, dtype=gdtype))
    scores, tokens, hashes, parent_hashes, depths = [], [], [], [], []

    def offer(score, token, h, parent_h, d):  # [bs, m] each
        scores.append(score - _DEPTH_TIE * d)
        tokens.append(token)
        hashes.append(h)
        parent_hashes.append(parent_h)
        depths.append(torch.full_like(token, d))

    h = _extend(torch.full_like(tok, _ROOT_HASH), tok)
    offer(score, tok, h, torch.full_like(tok, _ROOT_HASH), 1)
    state = gru_step(gru, head.embed(tok).to(gdtype).flatten(0, 1),
                     root_state.repeat_interleave(width, dim=0)).view(bs, width, g)
    zh = z.to(gdtype)
    for i in range(1, depth):  # expand the K best nodes of depth i into depth i + 1
        logits = head_step(head, zh[:, i, None].expand(-1, width, -1), state,
                           base[:, i, None].to(gdtype), cand, i)  # [bs, K, C]
        child_score, col = torch.log_softmax(logits.float(), dim=-1).topk(width, dim=-1)
        child = (head.token_ids(col) if cand is None
                 else cand.ids.gather(1, col.flatten(1)).view(bs, width, width))  # [bs, K, K]
        total = (score[..., None] + child_score).flatten(1)  # [bs, K*K]
        child_h = _extend(h[..., None], child).flatten(1)
        offer(total, child.flatten(1), child_h, h[..., None].expand(-1, -1, width).flatten(1),
              i + 1)
        if i + 1 < depth:
            score, best = total.topk(width, dim=-1)  # [bs, K] the next depth's frontier
            tok, h = child.flatten(1).gather(1, best), child_h.gather(1, best)
            parent_state = state.gather(1, (best // width)[..., None].expand(-1, -1, g))
            state = gru_step(gru, head.embed(tok).to(gdtype).flatten(0, 1),
                             parent_state.flatten(0, 1)).view(bs, width, g)
    paths = []  # [bs, m] per branch: the hashes of its paths d_1, d_1 d_2, ..
    for b, branch in enumerate(branches):  # kept whatever their score, in path order
        h = torch.full_like(branch[:, 0], _ROOT_HASH)
        path = []
        for k in range(branch.shape[1]):
            token = branch[:, k].clamp(min=0)  # a -1: the row's branch ended (offered nowhere)
            nxt = _extend(h, token)
            if k < kept_depth:
                score = torch.where(branch[:, k] >= 0, _KEPT - 16.0 * (k + 1) - b,
                                    float("-inf"))
                offer(score[:, None], token[:, None], nxt[:, None], h[:, None], k + 1)
            path.append(torch.where(branch[:, k] >= 0, nxt, _ROOT_HASH))
            h = nxt
        paths.append(torch.stack(path, dim=1))
    tree, node_hashes = _select(torch.cat(scores, 1), torch.cat(tokens, 1), torch.cat(hashes, 1),
                                torch.cat(parent_hashes, 1), torch.cat(depths, 1), bonus, size,
                                depth)
    on = torch.full_like(tree.tokens, -1)  # [bs, N] the first branch each node's path follows
    for b in reversed(range(len(paths))):
        hit = (node_hashes[:, :, None] == paths[b][:, None, :]).any(dim=2)
        on = torch.where(hit, torch.full_like(on, b), on)
    on[:, 0] = -1
    return replace(tree, branch=on)


def _select(score: torch.Tensor, token: torch.Tensor, h: torch.Tensor, parent_h: torch.Tensor,
            depth_of: torch.Tensor, bonus: torch.Tensor, size: int, depth: int
            ) -> tuple[DraftTree, torch.Tensor]:
    """The best size - 1 distinct nodes of the offered ones ([bs, M] each), as a tree ordered
    by depth (parents first), and its nodes' path hashes [bs, N]."""
    m = score.shape[1]
    at = torch.arange(m, device=score.device)
    same = h[:, :, None] == h[:, None, :]  # [bs, M, M] the same path offered twice
    better = (score[:, None, :] > score[:, :, None]) | (
        (score[:, None, :] == score[:, :, None]) & (at[None, None, :] < at[None, :, None]))
    score = score.masked_fill((same & better).any(dim=2), float("-inf"))  # one copy each
    chosen = score.topk(size - 1, dim=1).indices  # [bs, N-1]
    chosen = chosen.gather(1, (depth_of.gather(1, chosen) * m + chosen).argsort(dim=1))
    tokens = torch.cat((bonus.long()[:, None], token.gather(1, chosen)), dim=1)  # [bs, N]
    depths = torch.cat((torch.zeros_like(chosen[:, :1]), depth_of.gather(1, chosen)), dim=1)
    hashes = torch.cat((torch.full_like(chosen[:, :1], _ROOT_HASH), h.gather(1, chosen)), dim=1)
    wanted = parent_h.gather(1, chosen)  # [bs, N-1]
    parents = (wanted[:, :, None] == hashes[:, None, :]).int().argmax(dim=2)  # [bs, N-1]
    parents = torch.cat((torch.zeros_like(parents[:, :1]), parents), dim=1)
    return DraftTree(tokens, parents.long(), depths, depth), hashes
