"""The draft step: the Domino head rollout turns the backbone's block states into a causal chain
of draft tokens (head step, a pointer drafter's copy mixing, the pick: greedy or sampled).

Terms and shapes (bs requests, block size B, hidden H, GRU width G, vocabulary V):

    z        [bs, B, H]   backbone output for the block [x_t, MASK x (B-1)]; with shift_label,
                          z[:, i] predicts x_{t+i+1}, so z[:, :B-1] yields the B-1 proposals
    base     [bs, B-1, V] base logits lm_head(z[:, i])
    s_i      [bs, G]      GRU state after consuming embed(x_t), embed(d_1), ..., embed(d_i)
    logits_i = base_i + W2 silu(W1 [z_i ; s_i])     for i >= 1; logits_0 = base_0
    d_1 = pick(logits_0), d_{i+1} = pick(logits_i)

The loop is sequential over the B-1 positions and parallel over requests, with static shapes and
no host synchronisation (CUDA-graph friendly). `pick` is argmax in `greedy_rollout`; in
`sampled_rollout` (lossless sampling) a draw from q_i, the request's sampling transform of the
same logits (sampling.py's primitives; the terms there). A pointer drafter's copy (pointer.py)
is asked one question per position (`PointerCopy.gate_at`) and mixed in here (`pointer_pick`,
`pointer_sample`). Depends on torch, primitives.py, sampling.py and pointer.py; nothing calls back.

Candidate pool (upstream's speed-up): score the head only over K block-shared candidates, the
top-K of max_i base_i; K = 0 means the full vocabulary. Draft-side approximation only:
verification stays exact either way.

Draft vocabulary (the reduced draft vocabulary of EAGLE-3, our own code): with `HeadParams.vocab`
= the Vd most frequent answer tokens, the base logits are computed over those rows of the lm_head
only (V in the shapes above becomes Vd) and every pick maps back to a token id through `vocab`.
The same as the full vocabulary with -inf outside it; a vocabulary of the few thousand most
frequent answer tokens keeps the first draft's accuracy (benchmarks/studies/draft_vocab.py) and
cuts the lm_head, the largest part of the draft pass after the backbone, by V / Vd.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from domino_sglang.spec.pointer import PointerCopy, copy_wins
from domino_sglang.spec.primitives import argmax
from domino_sglang.spec.sampling import (
    SamplingRows,
    SparseQ,
    process_logits,
    sample_from,
    support,
)


def gru_step(gru: nn.GRU, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """One bias-free GRU step (PyTorch's gate order r, z, n). x [bs, H], h [bs, G] -> [bs, G]."""
    gi = F.linear(x, gru.weight_ih_l0)  # [bs, 3G]
    gh = F.linear(h, gru.weight_hh_l0)  # [bs, 3G]
    i_r, i_z, i_n = gi.chunk(3, dim=-1)
    h_r, h_z, h_n = gh.chunk(3, dim=-1)
    r = torch.sigmoid(i_r + h_r)
    u = torch.sigmoid(i_z + h_z)
    n = torch.tanh(i_n + r * h_n)
    return (1 - u) * n + u * h


class NativeRollout(Protocol):
    """A fused greedy rollout (cpu/native.py NativeHead): the chain [bs, n] of z [bs, >= n, H],
    bonus [bs], base [bs, n, C], a host copy path or None, a candidate pool or None; and a draft
    tree's growth over a candidate pool below depth 1 (tree.py grow_tree): tokens, parents,
    depths, branch [bs, N]."""

    def rollout(self, z: torch.Tensor, bonus: torch.Tensor, base: torch.Tensor,
                copy: PointerCopy | None, cand: Candidates | None) -> torch.Tensor: ...

    def grow(self, z: torch.Tensor, bonus: torch.Tensor, cand: Candidates, score1: torch.Tensor,
             tok1: torch.Tensor, depth: int, size: int, branches: tuple[torch.Tensor, ...],
             kept: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]: ...


@dataclass
class HeadParams:
    """What the rollout needs from the drafter and the target (shared, never copied)."""

    embed: nn.Module  # target token embedding, ids -> [.., H]
    lm_head_weight: torch.Tensor  # [V, H], the target's (at TP > 1 this rank's rows: tp.py)
    prefix_gru: nn.GRU
    embed_proj: nn.Sequential  # Linear(H+G -> E), SiLU, Linear(E -> V)
    # the base logits, x [bs, n, H] -> [bs, n, V or Vd], where the runtime computes them other
    # than by F.linear (the CPU's packed oneDNN lm_head; across TP ranks: tp.py), or None.
    # Draft side only: a stale pack after a target weight update could only lower acceptance,
    # never the output.
    base_linear: Callable[[torch.Tensor], torch.Tensor] | None = None
    # draft vocabulary: token ids [Vd] (None: all V), the lm_head rows [Vd, H] and the head's
    # E -> V rows [Vd, E] at those ids (`with_vocab` makes them; copies, 2x Vd rows)
    vocab: torch.Tensor | None = None
    vocab_lm_head: torch.Tensor | None = None
    vocab_out_weight: torch.Tensor | None = None
    full_vocab: int = 0  # V where lm_head_weight holds part of the rows (TP > 1), else 0
    # the greedy positions fused on the CPU runtime's native kernels (cpu/native.py NativeHead:
    # `rollout(z, bonus, base, copy, cand)`), or None; set after with_vocab, which drops it
    native: NativeRollout | None = None

    @classmethod
    def of(cls, drafter: nn.Module, embed: nn.Module, lm_head_weight: torch.Tensor,
           dtype: torch.dtype | None = None, full_vocab: int = 0) -> HeadParams:
        """The rollout's view of a drafter's head (model/drafter.py); `dtype` converts its GRU
        and embed_proj in place (the backbone keeps its own dtype); `full_vocab`: V where
        lm_head_weight holds this tensor-parallel rank's rows only."""
        if dtype is not None:
            drafter.prefix_gru.to(dtype)
            drafter.embed_proj.to(dtype)
        return cls(embed=embed, lm_head_weight=lm_head_weight, prefix_gru=drafter.prefix_gru,
                   embed_proj=drafter.embed_proj, full_vocab=full_vocab)

    def with_vocab(self, vocab: torch.Tensor | None, rows: torch.Tensor | None = None
                   ) -> HeadParams:
        """This head restricted to the draft vocabulary `vocab` (token ids [Vd]); None: all V.
        `rows`: the lm_head's rows at those ids [Vd, H] where lm_head_weight lacks some (TP >
        1: tp.vocab_rows). The base_linear, if any, is dropped (the caller packs
        `vocab_lm_head`)."""
        if vocab is None:
            return replace(self, vocab=None, vocab_lm_head=None, vocab_out_weight=None,
                           native=None)
        vocab = vocab.to(device=self.lm_head_weight.device, dtype=torch.int64)
        rows = self.lm_head_weight[vocab] if rows is None else rows
        return replace(self, vocab=vocab, base_linear=None, native=None,
                       vocab_lm_head=rows.contiguous(),
                       vocab_out_weight=self.embed_proj[2].weight[vocab].detach().contiguous())

    @property
    def vocab_size(self) -> int:
        """V, the size of the distributions the verifier compares (the full vocabulary)."""
        return self.full_vocab or self.lm_head_weight.shape[0]

    def token_ids(self, idx: torch.Tensor) -> torch.Tensor:
        """Indices into the base logits -> token ids (the identity without a draft vocabulary)."""
        return idx if self.vocab is None else self.vocab[idx]


@dataclass
class Candidates:
    """Block-shared candidate pool: ids [bs, K], base [bs, B-1, K], out_weight [bs, K, E]."""

    ids: torch.Tensor
    base: torch.Tensor
    out_weight: torch.Tensor


def make_candidates(base: torch.Tensor, head: HeadParams, k: int) -> Candidates | None:
    """Top-K pool over positions 1.. of the base logits (position 0 never uses the head).
    The pool's `ids` are token ids (mapped through the draft vocabulary, if any), in column
    order: a sampled draft's token for a given coin depends on the pool's order, which topk
    leaves to its input's layout (tensor-parallel ranks build theirs otherwise: tp.py)."""
    if k <= 0 or base.shape[1] < 2:
        return None
    k = min(k, base.shape[-1])
    idx = torch.topk(base[:, 1:].amax(dim=1), k=k, dim=-1, sorted=False).indices  # [bs, K]
    idx = idx.sort(dim=-1).values
    pool_base = torch.gather(base, 2, idx[:, None, :].expand(-1, base.shape[1], -1))
    ids = head.token_ids(idx)
    out_weight = F.embedding(ids, head.embed_proj[2].weight)  # [bs, K, E]
    return Candidates(ids=ids, base=pool_base, out_weight=out_weight)


@dataclass
class HeadInputs:
    """What every rollout of one block shares: the base logits [bs, n, C] and the candidate
    pool (None: all C columns). A tree round's chain and tree read one (tree.py)."""

    base: torch.Tensor
    cand: Candidates | None

    @classmethod
    def of(cls, z: torch.Tensor, head: HeadParams, candidate_pool: int) -> HeadInputs:
        base = base_logits(z, head)
        return cls(base, make_candidates(base, head, candidate_pool))


def head_step(head: HeadParams, z_i: torch.Tensor, s: torch.Tensor, base_i: torch.Tensor,
              cand: Candidates | None, i: int) -> torch.Tensor:
    """Corrected logits of position i (>= 1): base_i + W2 silu(W1 [z_i ; s]).

    Returns [bs, V] over the vocabulary ([bs, Vd] over a draft vocabulary), or [bs, K] over
    the candidate pool. A tree's branches (tree.py): z_i [bs, b, H], s [bs, b, G] and base_i
    [bs, 1, C] give [bs, b, C].
    """
    hidden = head.embed_proj[1](head.embed_proj[0](torch.cat((z_i, s), dim=-1)))  # [bs, E]
    if cand is None and head.vocab is not None:
        return base_i + F.linear(hidden, head.vocab_out_weight.to(hidden.dtype))
    if cand is None:
        return base_i + head.embed_proj[2](hidden)
    if hidden.dim() == 3:  # [bs, b, E] x [bs, E, K]
        return cand.base[:, i, None] + torch.bmm(hidden, cand.out_weight.transpose(1, 2))
    return cand.base[:, i] + torch.bmm(cand.out_weight, hidden.unsqueeze(-1)).squeeze(-1)


def base_logits(z: torch.Tensor, head: HeadParams) -> torch.Tensor:
    """[bs, B, H] -> [bs, B-1, V] base logits of the B-1 proposal positions (fp32); [bs, B-1,
    Vd] over a draft vocabulary."""
    bs, n, h = z.shape[0], z.shape[1] - 1, z.shape[2]
    weight = head.lm_head_weight if head.vocab is None else head.vocab_lm_head
    # 2-D and contiguous: a strided 3-D bf16 input sends torch to a far slower CPU GEMM path.
    zz = z[:, :-1].reshape(bs * n, h).to(weight.dtype)
    if head.base_linear is not None:
        return head.base_linear(zz.view(bs, n, h)).float()
    return F.linear(zz, weight).float().view(bs, n, -1)


def copy_column(c: torch.Tensor, head: HeadParams, pool_ids: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the copy candidates c [bs] sit among a position's logit columns: (column [bs],
    present [bs] bool). The columns are the candidate pool's token ids [bs, K], else the draft
    vocabulary (or all V); a candidate outside them (or none, c < 0) is not present."""
    if pool_ids is not None:
        hit = pool_ids == c[:, None]  # [bs, K]
        return hit.int().argmax(dim=1), hit.any(dim=1)
    if head.vocab is not None:
        hit = head.vocab[None, :] == c[:, None]  # [bs, Vd]
        return hit.int().argmax(dim=1), hit.any(dim=1)
    return c.clamp(min=0), c >= 0


def pointer_pick(copy: PointerCopy, i: int, logits: torch.Tensor,
                 pick: torch.Tensor, head: HeadParams, pool_ids: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """A pointer drafter's greedy draft at one position (pointer.py): the argmax of
    q = (1 - g) softmax(logits) + g onehot(c), i.e. c when (1 - g) p(c) + g > (1 - g) p(pick).
    logits [bs, K] over position i's columns (copy_column), pick [bs] the argmax's token ids.
    Returns the tokens [bs], which also join the copy path's chains."""
    c, log_g, log_1mg = copy.gate_at(i)
    logp = torch.log_softmax(logits.float(), dim=-1)  # [bs, K]
    col, present = copy_column(c, head, pool_ids)
    lp_c = logp.gather(1, col[:, None]).squeeze(1).masked_fill(~present, float("-inf"))
    won = copy_wins(logp.amax(dim=-1), lp_c, c, log_g, log_1mg)
    out = torch.where(won, c, pick)
    copy.append(out, won)
    return out


@torch.no_grad()
def greedy_rollout(z: torch.Tensor, bonus: torch.Tensor, head: HeadParams,
                   candidate_pool: int = 0, use_head: bool = True, return_base_pick: bool = False,
                   copy: PointerCopy | None = None, inputs: HeadInputs | None = None
                   ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Greedy chain d_1..d_{B-1} for every request: [bs, B-1] token ids.

    z [bs, B, H], bonus [bs] (the verified token x_t). use_head=False gives the backbone-only
    (DFlash) chain from the same checkpoint. return_base_pick=True also returns the backbone's
    own argmax at each position, [bs, B-1] (where the head changed it: metrics). copy: a
    pointer drafter's copy path (pointer.py): every position drafts q's argmax (pointer_pick).
    inputs: the block's base logits and pool where the caller has them (HeadInputs.of).
    """
    base = base_logits(z, head) if inputs is None else inputs.base  # [bs, B-1, V]
    n = base.shape[1]
    if copy is not None:
        copy.start(z[:, :n])
    if not use_head and copy is None:
        chain = head.token_ids(argmax(base))
        return (chain, chain) if return_base_pick else chain
    if not use_head:  # backbone only, position by position: the copies depend on the chain
        picks = head.token_ids(argmax(base))  # [bs, B-1]
        chain = torch.stack([pointer_pick(copy, i, base[:, i], picks[:, i], head)
                             for i in range(n)], dim=1)
        return (chain, picks) if return_base_pick else chain
    cand = make_candidates(base, head, candidate_pool) if inputs is None else inputs.cand
    if head.native is not None and (copy is None or copy.on_host):
        chain = head.native.rollout(z, bonus, base, copy, cand)  # the loop below, fused (CPU)
        return (chain, head.token_ids(argmax(base))) if return_base_pick else chain
    first = head.token_ids(argmax(base[:, 0]))  # [bs]
    if copy is not None:
        first = pointer_pick(copy, 0, base[:, 0], first, head)
    proposals = [first]
    g = head.prefix_gru.hidden_size
    s = z.new_zeros(z.shape[0], g, dtype=head.prefix_gru.weight_hh_l0.dtype)
    gdtype = s.dtype
    s = gru_step(head.prefix_gru, head.embed(bonus).to(gdtype), s)
    s = gru_step(head.prefix_gru, head.embed(first).to(gdtype), s)
    zh = z.to(gdtype)
    for i in range(1, n):
        logits = head_step(head, zh[:, i], s, base[:, i].to(gdtype), cand, i)
        pick = argmax(logits)
        nxt = (head.token_ids(pick) if cand is None
               else torch.gather(cand.ids, 1, pick[:, None]).squeeze(1))
        if copy is not None:
            nxt = pointer_pick(copy, i, logits, nxt, head,
                               None if cand is None else cand.ids)
        proposals.append(nxt)
        if i + 1 < n:
            s = gru_step(head.prefix_gru, head.embed(nxt).to(gdtype), s)
    chain = torch.stack(proposals, dim=1)
    return (chain, head.token_ids(argmax(base))) if return_base_pick else chain


def spread(qd: torch.Tensor, head: HeadParams) -> torch.Tensor:
    """A distribution over the draft vocabulary [.., Vd] -> over the vocabulary [.., V], zero
    outside: exactly the full vocabulary's distribution with -inf logits outside the draft
    vocabulary (top-k / top-p rank those last). The identity without a draft vocabulary."""
    if head.vocab is None:
        return qd
    return qd.new_zeros(*qd.shape[:-1], head.vocab_size).index_copy_(-1, head.vocab, qd)


def pointer_sample(copy: PointerCopy, i: int, logits: torch.Tensor,
                   probs: torch.Tensor, rows: SamplingRows, u: torch.Tensor, head: HeadParams,
                   pool_ids: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """A pointer drafter's sampled draft at one position (pointer.py): d ~ q with
    q = (1 - g) probs + g onehot(c), probs [bs, K] the processed distribution over position i's
    columns (copy_column), logits [bs, K] before processing. A greedy row drafts q's
    argmax (g becomes 1 where c wins, else 0), as greedy_rollout. Returns (d [bs], q as
    (ids [bs, K + 1], weights [bs, K + 1]): q(v) = the weights of the entries with id v, the
    copy candidate's last); q is exactly what d was drawn from, so verification stays exact."""
    c, log_g, log_1mg = copy.gate_at(i)
    if rows.has_greedy:
        logp = torch.log_softmax(logits.float(), dim=-1)
        col, present = copy_column(c, head, pool_ids)
        lp_c = logp.gather(1, col[:, None]).squeeze(1).masked_fill(~present, float("-inf"))
        wins = copy_wins(logp.amax(dim=-1), lp_c, c, log_g, log_1mg)
        g = torch.where(rows.greedy, wins.float(), log_g.exp())  # [bs]
    else:
        g = log_g.exp()  # 0 where there is no candidate
    cols = (pool_ids if pool_ids is not None
            else (head.vocab if head.vocab is not None
                  else torch.arange(probs.shape[1], device=probs.device)).expand_as(probs))
    kept = probs * (1.0 - g)[:, None]  # [bs, K]
    ids = torch.cat((cols, c.clamp(min=0)[:, None]), dim=1)  # [bs, K + 1]
    weights = torch.cat((kept, g[:, None]), dim=1)  # [bs, K + 1]
    d = ids.gather(1, sample_from(weights, u)[:, None]).squeeze(1)
    copy.append(d)
    return d, (ids, weights)


@torch.no_grad()
def sampled_rollout(z: torch.Tensor, bonus: torch.Tensor, head: HeadParams, rows: SamplingRows,
                    u_draft: torch.Tensor, candidate_pool: int = 0, use_head: bool = True,
                    logit_bias: torch.Tensor | None = None, temperature_scale: float = 1.0,
                    copy: PointerCopy | None = None, out: torch.Tensor | None = None,
                    sparse: int = 0) -> tuple[torch.Tensor, torch.Tensor | SparseQ]:
    """Sampled chain: drafts [bs, n] and the distributions they were drawn from, q [bs, n, V].

    z [bs, B, H], bonus [bs] (x_t), u_draft [bs, n], logit_bias [bs, V] (the request's, added
    to every draft logit as the target gets it). With a candidate pool, q is zero outside it.
    temperature_scale: q at temperature T * scale (module docstring). copy: a pointer
    drafter's copy path: every q is mixed with the copy candidate (pointer_sample). out: a
    float32 [bs, n, V] buffer q is written into (graphs.RolloutGraphs: one per batch bucket).
    sparse = S > 0: q kept as its support (sampling.SparseQ, [bs, n, S]) instead, for rows
    known to have at most S tokens of positive probability at every position (every row's
    top_k < S: graphs.sparse_width); the same drafts and the same q.
    """
    if out is not None and (out.shape[0] != z.shape[0] or out.shape[1] != z.shape[1] - 1):
        raise ValueError(f"sampled_rollout: out has shape {tuple(out.shape)}, q needs "
                         f"[{z.shape[0]}, {z.shape[1] - 1}, V]")
    rows = rows.tempered(temperature_scale)
    base = base_logits(z, head)  # [bs, n, V] fp32 ([bs, n, Vd] over a draft vocabulary)
    if logit_bias is not None:
        bias = logit_bias if head.vocab is None else logit_bias[:, head.vocab]
        base = base + bias[:, None, :]
    n, vocab = base.shape[1], head.vocab_size
    if copy is not None:
        copy.start(z[:, :n])
    q = QRows(base.shape[0], n, vocab, sparse, out, base)
    if not use_head and copy is None:
        qd = process_logits(base.reshape(-1, base.shape[2]), rows.repeat(n))
        drafts = head.token_ids(sample_from(qd, u_draft.reshape(-1))).view(-1, n)
        return drafts, q.whole(spread(qd, head).view(-1, n, vocab))
    if not use_head:  # backbone only, position by position: the copies depend on the chain
        drafts = []
        for i in range(n):
            d, qi = pointer_sample(copy, i, base[:, i], process_logits(base[:, i], rows), rows,
                                   u_draft[:, i], head)
            drafts.append(d)
            q.put(i, qi)
        return torch.stack(drafts, dim=1), q.done()
    cand = make_candidates(base, head, candidate_pool)
    q0 = process_logits(base[:, 0], rows)
    if copy is not None:
        d0, qi = pointer_sample(copy, 0, base[:, 0], q0, rows, u_draft[:, 0], head)
        q.put(0, qi)
        drafts = [d0]
    else:
        q.put(0, spread(q0, head))
        drafts = [head.token_ids(sample_from(q0, u_draft[:, 0]))]
    gdtype = head.prefix_gru.weight_hh_l0.dtype
    s = z.new_zeros(z.shape[0], head.prefix_gru.hidden_size, dtype=gdtype)
    s = gru_step(head.prefix_gru, head.embed(bonus).to(gdtype), s)
    s = gru_step(head.prefix_gru, head.embed(drafts[0]).to(gdtype), s)
    zh = z.to(gdtype)
    for i in range(1, n):
        logits = head_step(head, zh[:, i], s, base[:, i].to(gdtype), cand, i).float()
        if copy is not None:
            d, qi = pointer_sample(copy, i, logits, process_logits(logits, rows), rows,
                                   u_draft[:, i], head, None if cand is None else cand.ids)
            q.put(i, qi)
        elif cand is None:
            qd = process_logits(logits, rows)
            q.put(i, spread(qd, head))
            d = head.token_ids(sample_from(qd, u_draft[:, i]))
        else:
            # Processed over the pool alone [bs, K]: the same distribution as over the full
            # vocabulary with -inf outside the pool (those tokens get probability 0 and rank
            # last for top-k / top-p), at K / V of the cost; d is drawn from exactly the q kept.
            q_pool = process_logits(logits, rows)
            q.put(i, (cand.ids, q_pool))
            d = cand.ids.gather(1, sample_from(q_pool, u_draft[:, i])[:, None]).squeeze(1)
        drafts.append(d)
        if i + 1 < n:
            s = gru_step(head.prefix_gru, head.embed(d).to(gdtype), s)
    return torch.stack(drafts, dim=1), q.done()


class QRows:
    """The q of a sampled rollout, position by position: dense [bs, n, V] (into `out` where
    given) or, with `sparse` = S > 0, its support [bs, n, S] (sampling.SparseQ). A position
    comes dense [bs, V] or as (ids [bs, m], weights [bs, m]) with sum semantics."""

    def __init__(self, bs: int, n: int, vocab: int, sparse: int, out: torch.Tensor | None,
                 like: torch.Tensor):
        self.vocab, self.sparse = vocab, sparse
        self.ids: list[torch.Tensor] = []
        self.probs: list[torch.Tensor] = []
        self.q = None
        if not sparse:
            self.q = like.new_zeros(bs, n, vocab) if out is None else out.zero_()

    def put(self, i: int, qi: torch.Tensor | tuple[torch.Tensor, torch.Tensor]) -> None:
        if self.sparse:
            if isinstance(qi, tuple) and qi[0].shape[1] > self.sparse:  # a whole vocabulary
                qi = _densify(*qi, self.vocab)
            ids, probs = support(qi, self.sparse)
            self.ids.append(ids)
            self.probs.append(probs)
        elif isinstance(qi, tuple):
            self.q[:, i] = _densify(*qi, self.vocab)
        else:
            self.q[:, i] = qi

    def whole(self, q: torch.Tensor) -> torch.Tensor | SparseQ:
        """Every position at once, dense [bs, n, V]."""
        if not self.sparse:
            return self.q.copy_(q)
        for i in range(q.shape[1]):
            self.put(i, q[:, i])
        return self.done()

    def done(self) -> torch.Tensor | SparseQ:
        if not self.sparse:
            return self.q
        return SparseQ(torch.stack(self.ids, dim=1), torch.stack(self.probs, dim=1), self.vocab)


def _densify(ids: torch.Tensor, weights: torch.Tensor, vocab: int) -> torch.Tensor:
    """(ids [N, m], weights [N, m]) with sum semantics -> dense [N, V]."""
    return weights.new_zeros(ids.shape[0], vocab).scatter_add_(1, ids, weights)
