"""The copy rule both copying proposers use: the next token(s) after the longest recurring suffix.

For a sequence h (a request's prompt + output, x_t last; at serve time the chain drafted so far
appended) and an end position e before h's last token,

    match(e) = the longest n <= max_match with h[e-n+1 .. e] == h[T-n .. T-1]

(the longest common suffix of h[:e+1] and h). The longest match is the context most like now,
and what followed it is a draft that costs no model pass. The two proposers differ only in
which occurrence of the longest match they copy from and how much:
  - the pointer-generator drafter (pointer.py) takes one token, after the MOST RECENT occurrence
    (n >= 1), as it was trained (`pointer.copy_table`; served from `history.HistoryIndex` on
    the host, incremental, or `pointer.device_candidates` on the device, from
    `suffix_matches`);
  - prompt lookup (lookup.py) takes up to B-1 tokens, after the last occurrence followed by that
    many known tokens, else the first (n >= 2; `history.HistoryIndex`, the same index;
    tests/harness/lookup_reference.py's `lookup_batch`, from `suffix_matches`, the batched
    statement it is tested against).
`suffix_matches` is the one batched implementation of match(e); `copy_candidate` the direct
scan that is the reference of the pointer's rule in the tests (and benchmarks/copy_gate.py).
Depends on torch only.
"""

from __future__ import annotations

import torch

NO_COPY = -1


def suffix_matches(seq: torch.Tensor, last: torch.Tensor, max_match: int) -> torch.Tensor:
    """match [n, T] int64: match[b, e] = the longest common suffix (<= max_match tokens) of
    seq[b, :e+1] and seq[b, :last[b]+1] for e < last[b], 0 for e >= last[b].

    seq [n, T] int64: left-aligned sequences, anything after last[b]; last [n] int64 >= 0 (the
    sequence's last position). max_match compares over [n, T], static shapes and no host
    synchronisation (CUDA-graph safe). Host tensors in, host tensors out: no factory here names
    a device for them (syncs.py tells host from device tensors by provenance)."""
    n, t_cap = seq.shape
    device = None if seq.device.type == "cpu" else seq.device
    ends = torch.arange(t_cap, device=device)  # e
    run = ends[None, :] < last[:, None]  # [n, T] e <= last - 1
    match = torch.zeros(n, t_cap, dtype=torch.int64, device=device)
    for j in range(max_match):
        # seq[b, e - j] == seq[b, last - j], both indices >= 0
        back = ends - j  # [T]
        left = seq[:, back.clamp(min=0)]  # [n, T]
        right = seq.gather(1, (last - j).clamp(min=0)[:, None])  # [n, 1]
        run = run & (back >= 0)[None, :] & (last - j >= 0)[:, None] & (left == right)
        match += run
    return match


def copy_candidate(h: list[int], max_match: int = 12) -> tuple[int, int]:
    """(token, match length) after the most recent occurrence of the longest suffix
    (<= max_match) of h ending before h's last token; (NO_COPY, 0) when h's last token never
    occurred before. A direct scan: the pointer rule's reference (pointer.copy_table computes it
    for every prefix at once)."""
    best_n, best_s = 0, -1
    for s in range(len(h) - 2, -1, -1):
        if h[s] != h[-1]:
            continue
        n = 1
        while n < max_match and s - n >= 0 and h[s - n] == h[-1 - n]:
            n += 1
        if n > best_n:
            best_n, best_s = n, s
    return (h[best_s + 1], best_n) if best_s >= 0 else (NO_COPY, 0)
