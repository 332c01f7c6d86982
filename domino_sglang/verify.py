"""Chain verification: which drafted tokens the target keeps, and the bonus token.

Terms (per request; block size B, so the verified chain is [x_t, d_1, ..., d_{B-1}]):

    target choice  y_k = argmax p_k, the target's token after chain position k (k = 0..B-1)
    accepted       d_1..d_a where d_{k+1} == y_k for every k < a (the longest matching prefix)
    bonus          y_a: the target's own token after the accepted prefix (always committed)
    accept_len     a + 1, the tokens committed this round (tau counts the bonus)

Greedy verification is exact: the committed tokens are precisely what plain greedy decoding
would produce. The sampled (T > 0) rule lives in sampling.py.
"""

from __future__ import annotations

import torch


def verify_greedy(chain: torch.Tensor, target_choice: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """chain [bs, B] (x_t, d_1..d_{B-1}), target_choice [bs, B] (y_0..y_{B-1}).

    Returns (tokens [bs, B], accept_len [bs]): tokens[:, :accept_len] are the committed tokens
    (d_1..d_a followed by the bonus y_a); the rest of each row is padding (the target's choices).
    """
    # match[k] = (d_{k+1} == y_k) for k < B-1; the accepted count a is the length of the all-true
    # prefix, computed without host sync as the sum of the running product.
    match = (chain[:, 1:] == target_choice[:, :-1]).to(torch.int32)  # [bs, B-1]
    accepted = torch.cumprod(match, dim=1).sum(dim=1)  # [bs] = a
    # Committed tokens: y_0..y_a. For k < a, y_k == d_{k+1}, so the row of target choices already
    # holds the accepted drafts followed by the bonus.
    return target_choice, accepted + 1
