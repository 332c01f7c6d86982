"""The Domino drafter as a proposer (protocol.Proposer): backbone pass, head rollout, pointer copy.

One `propose` per round with a draft pass (plan.draft_pass):
  1. a device copy index's history first (pointer.CopyPaths: its host-to-device copy is queued
     before the draft pass, so the host does not wait for the pass to launch the rest);
  2. the backbone: z = backbone([x_t, MASK x (W-1)] | context K/V), one forward for every
     request's block (`draft_pass`: SGLang's draft model runner, integration/draft_pass.py;
     W = B, or L for a drafter trained on short blocks: a cheaper pass);
  3. the head rollout (rollout.py: head step, copy mixing, the pick, greedy or sampled), either
     over the static buffers of graphs.RolloutGraphs (the GPU shape: a runner built at start-up
     replayed, or run eagerly and counted) or directly.
The drafter's own state lives here: the head (the target's embeddings and lm_head, shared),
the copy indexes and the rollout graphs; the draft pass is handed in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from domino_sglang.spec.graphs import RolloutGraphs
from domino_sglang.spec.pointer import CopyPaths
from domino_sglang.spec.proposers.protocol import DraftSlots, Proposal
from domino_sglang.spec.rollout import HeadInputs, HeadParams, greedy_rollout, sampled_rollout
from domino_sglang.spec.sampling import SparseQ
from domino_sglang.spec.tree import grow_tree

DraftPass = Callable[[object, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class DominoReport:
    """What the drafter reports of a round for the metrics (observer.py), nothing the verifier
    reads.

    base_pick  [bs, L-1] greedy rounds: the backbone's own argmax picks (the head's changes)
    copied     [bs, L-1] bool greedy and tree rounds: the chain's positions the pointer copy
               drafted
    pointer    whether the drafter's pointer copy path ran
    """

    base_pick: torch.Tensor | None = None
    copied: torch.Tensor | None = None
    pointer: bool = False


class DominoProposer:
    """The drafter of a DOMINO worker: `draft_pass(batch, chain [bs, W], positions [bs*W],
    slots [bs*W]) -> z [bs, W, H]` (the backbone over every request's block), `head`
    (rollout.HeadParams), `copy` (a pointer drafter's copy paths, None without a copy gate or
    with the copy off); `options` the server's (options.py); `metrics` counts eager rounds."""

    name = "domino"

    def __init__(self, draft_pass: DraftPass, head: HeadParams, copy: CopyPaths | None,
                 options, block_size: int, metrics):
        self.draft_pass, self.head, self.copy = draft_pass, head, copy
        self.block_size, self.metrics = block_size, metrics
        self.candidate_pool = options.candidate_pool
        self.use_head = options.head  # off: backbone only, the DFlash baseline
        self.short_draft = options.short_draft  # the pass drafts L tokens, not B
        self.temperature_scale = options.draft_temperature_scale  # sampled q at T * scale
        # off: sampled requests draft greedily, verified as one-hot proposals (DFLASH at T > 0)
        self.sampled_drafts = options.sampled_drafts
        # the head rollout's static runners (worker.init_cuda_graphs), or None
        self.rollout_graphs: RolloutGraphs | None = None

    def propose(self, batch, plan, at: DraftSlots, proposal: Proposal) -> Proposal:
        """Fill chain[:, 1:L] of every row by one backbone pass and the head's rollout of L-1
        tokens, greedily or (at.rows given) sampled from q (with sampled drafts off: greedily,
        verified against a one-hot q); a pointer drafter mixes in its copy path. Returns q
        (sampled) and its DominoReport (greedy: the backbone's argmax picks and
        the copied positions)."""
        if not plan.draft_pass:
            return proposal
        if plan.tree_width:  # a tree round: deterministic drafts at any temperature (tree.py)
            return self.propose_tree(batch, plan, at)
        if at.rows is not None and not self.sampled_drafts:  # greedy drafts, one-hot q
            drafted = self.propose(batch, plan, replace(at, rows=None, u=None), proposal)
            q = SparseQ.one_hot(at.chain[:, 1:plan.length], self.head.vocab_size)
            return replace(drafted, q=q, reports={self.name: DominoReport(
                pointer=self.copy is not None)})
        length, chain = plan.length, at.chain
        width = length if self.short_draft else self.block_size  # W, the tokens drafted
        bonus = chain[:, 0]
        history = (self.copy.history(batch.reqs, bonus)
                   if self.copy is not None and self.copy.on_device else None)  # 1
        z = self.draft_pass(batch, chain[:, :width], at.positions[:, :width].reshape(-1),
                             at.slots[:, :width].reshape(-1))  # 2: [bs, W, H]
        z = z[:, :length]  # [bs, L, H]: the head at position i reads z_i only
        if self.rollout_graphs is not None:  # 3
            found = self.static_rollout(batch, z, chain, length, at, history)
            if found is not None:
                return found
        copy = (self.copy.for_round(batch.reqs, bonus, length - 1, history)
                if self.copy is not None else None)
        if at.rows is not None:
            chain[:, 1:length], q = sampled_rollout(
                z, bonus, self.head, at.rows, at.u.draft, self.candidate_pool,
                use_head=self.use_head, logit_bias=batch.sampling_info.logit_bias,
                temperature_scale=self.temperature_scale, copy=copy)
            return Proposal(q=q, reports={self.name: DominoReport(pointer=copy is not None)})
        chain[:, 1:length], base_pick = greedy_rollout(
            z, bonus, self.head, self.candidate_pool, use_head=self.use_head,
            return_base_pick=True, copy=copy)
        report = DominoReport(base_pick, None if copy is None else copy.copied(), copy is not None)
        return Proposal(reports={self.name: report})

    def propose_tree(self, batch, plan, at: DraftSlots) -> Proposal:
        """A tree round: the greedy chain of L - 1 drafts (pointer copy included), then the tree
        of L tokens grown from the same block states beside it and the offered drafts
        (tree.grow_tree: branch 0 the chain, then each offer in the plan's order); its tokens
        and positions over chain[:, :L] and positions[:, :L]. Rolled out eagerly (no static
        runner grows trees yet: counted as `tree` eager rounds)."""
        if self.rollout_graphs is not None:
            self.metrics.record_eager("tree")
        length, chain = plan.length, at.chain
        width = length if self.short_draft else self.block_size
        bonus = chain[:, 0]
        z = self.draft_pass(batch, chain[:, :width], at.positions[:, :width].reshape(-1),
                            at.slots[:, :width].reshape(-1))[:, :length]  # [bs, L, H]
        copy = (self.copy.for_round(batch.reqs, bonus, length - 1, None)
                if self.copy is not None else None)
        inputs = HeadInputs.of(z, self.head, self.candidate_pool)  # shared by chain and tree
        drafted = greedy_rollout(z, bonus, self.head, self.candidate_pool,
                                 use_head=self.use_head, copy=copy, inputs=inputs)  # [bs, L-1]
        offered = tuple(offer.branch(length - 1) for offer in plan.offers.values())
        tree = grow_tree(z, bonus, self.head, length, plan.tree_width,
                         branches=(drafted, *offered), inputs=inputs)
        chain[:, :length] = tree.tokens
        at.positions[:, :length] = tree.positions(at.positions[:, 0])
        report = DominoReport(copied=None if copy is None else copy.copied(),
                              pointer=copy is not None)
        return Proposal(reports={self.name: report}, tree=tree)

    def static_rollout(self, batch, z, chain, length: int, at: DraftSlots, copy_history
                       ) -> Proposal | None:
        """The head rollout through graphs.RolloutGraphs (a runner built at start-up replayed,
        or a later one run eagerly over the same static buffers: counted as `not_captured`),
        or None when the round does not fit them (the reason counted in
        domino_eager_rounds_total). `copy_history`: (history, lens) of a device copy index."""
        bonus, pointer, rows = chain[:, 0], self.copy is not None, at.rows
        graphs, bs, bias = self.rollout_graphs, len(batch.reqs), batch.sampling_info.logit_bias
        history, lens = copy_history if copy_history is not None else (None, None)
        reason = ("host_copy_index" if pointer and copy_history is None else graphs.eager_reason(
            bs, rows is not None, None if history is None else history.shape[1],
            bounded=rows is not None and rows.top_k_bounded))
        if reason is not None:
            self.metrics.record_eager(reason)
            return None
        _key, replayed = graphs.round_shape(bs, length, history, rows, bias is not None)
        if not replayed:
            self.metrics.record_eager("not_captured")
        if rows is not None:
            chain[:, 1:length], q = graphs.sampled(z, bonus, rows, at.u.draft, bias, history, lens)
            return Proposal(q=q, reports={self.name: DominoReport(pointer=pointer)})
        chain[:, 1:length], base_pick, copied = graphs.greedy(z, bonus, history, lens)
        return Proposal(reports={self.name: DominoReport(base_pick, copied, pointer)})
