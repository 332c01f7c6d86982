"""Chain verification: which drafted tokens the target keeps, and the bonus token.

Terms (per request; block size B, so the verified chain is [x_t, d_1, ..., d_{B-1}]):

    target choice  y_k = argmax p_k, the target's token after chain position k (k = 0..B-1)
    accepted       d_1..d_a where d_{k+1} == y_k for every k < a (the longest matching prefix)
    bonus          y_a: the target's own token after the accepted prefix (always committed)
    accept_len     a + 1, the tokens committed this round (tau counts the bonus)

Greedy verification is exact: the committed tokens are precisely what plain greedy decoding
would produce.

Sampled verification (T > 0) is exact chain rejection sampling (Leviathan et al. 2023; gpt-fast
`speculative_decode`). With p_k the target's processed distribution after chain position k and
q_k the draft distribution d_{k+1} was drawn from (sampling.py):

    accepted  d_{k+1} with probability min(1, p_k(d_{k+1}) / q_k(d_{k+1})), in order, until
              the first rejection; a = number accepted
    recovered at the first rejection (a < B-1): y_a ~ normalize(max(p_a - q_a, 0))
    bonus     if every draft is accepted (a = B-1): y_{B-1} ~ p_{B-1}

Every committed token is then distributed exactly as the target's own sample at that position
(for any q), so DOMINO sampling has the target's output distribution. Tokens p forbids (top-k /
top-p / grammar: p = 0) are always rejected and never recovered.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from domino_sglang.spec.primitives import argmax
from domino_sglang.spec.sampling import (
    RoundUniforms,
    SamplingRows,
    SparseQ,
    process_logits,
    sample_from,
    top_k_support,
)


@dataclass(frozen=True)
class Verdict:
    """The verifier's outcome: tokens [bs, L] (committed prefix of each row: its first
    accept_lens), accept_lens [bs] (a + 1, one-token rows capped at 1), judged [bs] (a + 1
    before capping: what the policy learns from), target_choice [bs, L] (greedy chains: the
    target's argmax; else None), path [bs, L] (tree rounds: the accepted path's nodes, depth by
    depth, tree.follow; else None)."""

    tokens: torch.Tensor
    accept_lens: torch.Tensor
    judged: torch.Tensor
    target_choice: torch.Tensor | None
    path: torch.Tensor | None = None


def verify_greedy(chain: torch.Tensor, target_choice: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """chain [bs, B] (x_t, d_1..d_{B-1}), target_choice [bs, B] (y_0..y_{B-1}).

    Returns (tokens [bs, B], accept_len [bs]): tokens[:, :accept_len] are the committed tokens
    (d_1..d_a followed by the bonus y_a); the rest of each row is padding (the target's choices).
    """
    if chain.shape[1] == 1:  # a plain round: nothing drafted, the target's token committed
        return target_choice, torch.ones_like(target_choice[:, 0])
    # match[k] = (d_{k+1} == y_k) for k < B-1; the accepted count a is the length of the all-true
    # prefix, computed without host sync as the sum of the running product.
    match = (chain[:, 1:] == target_choice[:, :-1]).to(torch.int32)  # [bs, B-1]
    accepted = torch.cumprod(match, dim=1).sum(dim=1)  # [bs] = a
    # Committed tokens: y_0..y_a. For k < a, y_k == d_{k+1}, so the row of target choices already
    # holds the accepted drafts followed by the bonus.
    return target_choice, accepted + 1


def verify_sampled(chain: torch.Tensor, q: torch.Tensor | SparseQ, p: torch.Tensor,
                   u_accept: torch.Tensor, u_resample: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact rejection sampling of a drafted chain.

    chain [bs, B] (x_t, d_1..d_{B-1}); q [bs, B-1, V] draft distributions (q_k drew d_{k+1}),
    dense or kept as their support (sampling.SparseQ: only q_k(d_{k+1}) and one row are read);
    p [bs, B, V] target distributions (p_k: after x_t, d_1..d_k); u_accept [bs, B-1] and
    u_resample [bs, B] uniforms in (0, 1) (the coins, and the draw of the token at index a).
    Returns (tokens [bs, B], accept_len [bs]) as verify_greedy: tokens[:, :accept_len] =
    d_1..d_a then the recovered / bonus token; the rest of each row is padding.
    """
    bs, block, vocab = p.shape
    assert chain.shape == (bs, block) and tuple(q.shape) == (bs, block - 1, vocab), (
        chain.shape, q.shape)
    sparse = isinstance(q, SparseQ)
    drafts = chain[:, 1:]  # [bs, B-1]
    q_d = (q.at(drafts) if sparse
           else q.gather(2, drafts[..., None]).squeeze(-1))  # [bs, B-1] q_k(d_{k+1})
    p_d = p[:, :-1].gather(2, drafts[..., None]).squeeze(-1)  # [bs, B-1] p_k(d_{k+1})
    # u < p/q accepts with probability min(1, p/q): always when p >= q (the draft is no more
    # likely under q than under p), with probability p/q when q > p (q over-proposes it).
    # Written as u * q < p: no division, and q(d) = 0 (never drawn) cannot divide by zero.
    accept = (u_accept * q_d < p_d).to(torch.int32)  # [bs, B-1]
    accepted = torch.cumprod(accept, dim=1).sum(dim=1)  # [bs] = a, without host sync
    # Row a of the residual: max(p_a - q_a, 0), with q_{B-1} := 0 so that a = B-1 (all
    # accepted) gives the bonus distribution p_{B-1} itself.
    at = accepted[:, None, None].expand(-1, 1, vocab).long()
    p_a = p.gather(1, at).squeeze(1)  # [bs, V]
    if block > 1:
        q_a = (q.row(accepted.clamp(max=block - 2)) if sparse
               else q.gather(1, at.clamp(max=block - 2)).squeeze(1))  # [bs, V]
        q_a.masked_fill_((accepted == block - 1)[:, None], 0.0)  # all accepted: q_{B-1} = 0
        residual = (p_a - q_a).clamp_(min=0)
    else:  # plain round: nothing drafted, the bonus is drawn from p_0
        residual = p_a
    # Rejection implies p_a(d) < q_a(d), so some other token has p > q and the residual has
    # mass; only rounding can empty it, and then p_a is the right fallback.
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_a)
    y_a = sample_from(residual, u_resample.gather(1, accepted[:, None].long()).squeeze(1))
    y_a = y_a[:, None].to(drafts.dtype)
    tokens = torch.cat((drafts, y_a), dim=1)  # [bs, B]; B = 1 is a plain decoding round
    tokens.scatter_(1, accepted[:, None].long(), y_a)
    return tokens, accepted + 1


def verify_mixed(chain: torch.Tensor, logits: torch.Tensor, q: torch.Tensor | SparseQ,
                 rows: SamplingRows, u: RoundUniforms) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch mixing greedy and sampled requests: logits [bs, B, V] are the target's verify
    logits after the request's logit adjustments (penalties, bias, grammar mask); q and u from
    the sampled rollout. Greedy rows (top_k <= 1) take verify_greedy's exact argmax path.
    A plain round (B = 1) whose rows are all top-k bounded draws its token from the support of
    p_0 alone (sampling.top_k_support: K columns, not V), the same distribution."""
    bs, block, vocab = logits.shape
    if block == 1 and rows.top_k_bounded:
        probs, ids = top_k_support(logits[:, 0], rows)  # [bs, K]
        drawn = ids.gather(1, sample_from(probs, u.resample[:, 0])[:, None])  # [bs, 1]
        return drawn.to(chain.dtype), torch.ones_like(chain[:, 0])
    p = process_logits(logits.reshape(-1, vocab), rows.repeat(block)).view(bs, block, vocab)
    tokens, accept_len = verify_sampled(chain, q, p, u.accept, u.resample)
    if not rows.has_greedy:
        return tokens, accept_len
    g_tokens, g_len = verify_greedy(chain, argmax(logits))
    greedy = rows.greedy
    return (torch.where(greedy[:, None], g_tokens, tokens),
            torch.where(greedy, g_len, accept_len))
