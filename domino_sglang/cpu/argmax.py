"""torch.argmax over the vocabulary, exactly, faster on the CPU: the greedy pick of every
verified position, head step and greedy row.

torch's CPU argmax reduces a row one element at a time, while its amax is vectorised. So
reduce in two levels (a blocked reduction):

    m_j   = max of block j (BLOCK consecutive logits)          amax over [rows, V / BLOCK, BLOCK]
    j*    = argmax_j m_j                                       the first block holding the max
    i*    = argmax of block j*'s BLOCK logits                  the first max within it
    pick  = j* * BLOCK + i*

It is the first maximal index, as torch.argmax's: no block before j* holds the maximum (j* is
the first block whose max equals it) and no index before i* in block j* does. NaN is a maximum
to both (amax propagates it, argmax returns the first NaN), so a row with NaN gives its first
NaN either way. Plain decoding (SGLang's sampler) keeps torch.argmax; the tokens are the same.
Other devices, and widths BLOCK does not divide, use torch.argmax. What it saves, and what
torch's argmax costs a round: docs/cpu-runtime.md, `argmax.py`.
"""

from __future__ import annotations

import torch

BLOCK = 256  # 128-512 measure alike (docs/cpu-runtime.md); narrower leaves argmax more maxima


def argmax(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, dim=-1) for x [..., V]: int64 [...]."""
    width = x.shape[-1]
    if x.device.type != "cpu" or width % BLOCK or width <= BLOCK or x.numel() == 0:
        return x.argmax(dim=-1)
    blocks = x.reshape(-1, width // BLOCK, BLOCK)  # [N, V / BLOCK, BLOCK]
    first = blocks.amax(dim=-1).argmax(dim=-1)  # [N] j*
    rows = torch.arange(blocks.shape[0], device=x.device)
    within = blocks[rows, first].argmax(dim=-1)  # [N] i*
    return (first * BLOCK + within).view(x.shape[:-1])
