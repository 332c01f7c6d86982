"""The Domino drafter as a proposer (proposer.Proposer): backbone pass, head rollout, pointer copy.

One `propose` per round with a draft pass (plan.draft_pass):
  1. a device copy index's history first (pointer.CopyPaths: its host-to-device copy is queued
     before the draft pass, so the host does not wait for the pass to launch the rest);
  2. the backbone: z = backbone([x_t, MASK x (W-1)] | context K/V), one forward for every
     request's block through SGLang's draft model runner (W = B, or L for a drafter trained on
     short blocks: a cheaper pass);
  3. the head rollout (rollout.py: head step, copy mixing, the pick, greedy or sampled), either
     over the static buffers of graphs.RolloutGraphs (the GPU shape: a runner built at start-up
     replayed, or run eagerly and counted) or directly.
The drafter's own state lives here: the head (the target's embeddings and lm_head, shared),
the copy indexes, the rollout graphs and the draft pass's captured runtimes by width. Private
SGLang internals (`ForwardBatch`, `ForwardMode`, `CaptureHiddenMode`, the draft block's spec
info, `bound_runtime`) come through sglang_compat.py.
"""

from __future__ import annotations

import torch

from domino_sglang.graphs import RolloutGraphs
from domino_sglang.pointer import CopyPaths
from domino_sglang.proposer import DraftSlots, Proposal
from domino_sglang.rollout import HeadParams, greedy_rollout, sampled_rollout
from domino_sglang.sglang_compat import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
    bound_runtime,
    make_draft_block_spec_info,
)


class DominoDrafter:
    """The drafter of a DOMINO worker: `head` (rollout.HeadParams), `copy` (a pointer drafter's
    copy paths, None without a copy gate or with the copy off), the draft model runner and the
    target's embedding; `options` the server's (options.py); `metrics` counts eager rounds."""

    def __init__(self, model_runner, embed, head: HeadParams, copy: CopyPaths | None,
                 options, block_size: int, device, metrics):
        self.model_runner, self.embed, self.head, self.copy = model_runner, embed, head, copy
        self.block_size, self.device, self.metrics = block_size, device, metrics
        self.candidate_pool = options.candidate_pool
        self.use_head = options.head  # off: backbone only, the DFlash baseline
        self.short_draft = options.short_draft  # the pass drafts L tokens, not B
        self.temperature_scale = options.draft_temperature_scale  # sampled q at T * scale
        # CUDA graphs (worker.init_cuda_graphs): the batch sizes SGLang captured, the head
        # rollout's static runners, the draft pass's runtimes by width (B: SGLang's own runner)
        self.graph_bs: tuple[int, ...] = ()
        self.rollout_graphs: RolloutGraphs | None = None
        self.runtimes: dict[int, tuple] = {}

    def propose(self, batch, plan, at: DraftSlots, proposal: Proposal) -> Proposal:
        """Fill chain[:, 1:L] of every row by one backbone pass and the head's rollout of L-1
        tokens, greedily or (at.rows given) sampled from q; a pointer drafter mixes in its copy
        path. Returns q (sampled) or the backbone's argmax picks and the copied positions
        (greedy, metrics)."""
        if not plan.draft_pass:
            return proposal
        block, chain = plan.length, at.chain
        width = block if self.short_draft else self.block_size  # W, the tokens drafted
        bonus = chain[:, 0]
        history = (self.copy.history(batch.reqs, bonus)
                   if self.copy is not None and self.copy.on_device else None)  # 1
        z = self.draft_block(batch, chain[:, :width], at.positions[:, :width].reshape(-1),
                             at.slots[:, :width].reshape(-1))  # 2: [bs, W, H]
        z = z[:, :block]  # [bs, L, H]: the head at position i reads z_i only
        if self.rollout_graphs is not None:  # 3
            found = self.static_rollout(batch, z, chain, block, at, history)
            if found is not None:
                return found
        copy = (self.copy.for_round(batch.reqs, bonus, block - 1, history)
                if self.copy is not None else None)
        if at.rows is not None:
            chain[:, 1:block], q = sampled_rollout(
                z, bonus, self.head, at.rows, at.u.draft, self.candidate_pool,
                use_head=self.use_head, logit_bias=batch.sampling_info.logit_bias,
                temperature_scale=self.temperature_scale, copy=copy)
            return Proposal(q=q, pointer=copy is not None)
        chain[:, 1:block], base_pick = greedy_rollout(
            z, bonus, self.head, self.candidate_pool, use_head=self.use_head,
            return_base_pick=True, copy=copy)
        return Proposal(base_pick=base_pick, copied=None if copy is None else copy.copied(),
                        pointer=copy is not None)

    def static_rollout(self, batch, z, chain, block: int, at: DraftSlots, copy_history
                       ) -> Proposal | None:
        """The head rollout through graphs.RolloutGraphs (a runner built at start-up replayed,
        or a later one run eagerly over the same static buffers: counted as `not_captured`),
        or None when the round does not fit them (the reason counted in
        domino_eager_rounds_total). `copy_history`: (history, lens) of a device copy index."""
        bonus, pointer, rows = chain[:, 0], self.copy is not None, at.rows
        graphs, bs, bias = self.rollout_graphs, len(batch.reqs), batch.sampling_info.logit_bias
        history, lens = copy_history if copy_history is not None else (None, None)
        reason = ("host_copy_index" if pointer and copy_history is None else graphs.eager_reason(
            bs, rows is not None, None if history is None else history.shape[1]))
        if reason is not None:
            self.metrics.record_eager(reason)
            return None
        _key, replayed = graphs.round_shape(bs, block, history, rows, bias is not None)
        if not replayed:
            self.metrics.record_eager("not_captured")
        if rows is not None:
            chain[:, 1:block], q = graphs.sampled(z, bonus, rows, at.u.draft, bias, history, lens)
            return Proposal(q=q, pointer=pointer)
        chain[:, 1:block], base_pick, copied = graphs.greedy(z, bonus, history, lens)
        return Proposal(base_pick=base_pick, copied=copied, pointer=pointer)

    def draft_block(self, batch, chain, positions, slots) -> torch.Tensor:
        """One backbone forward over every request's block chain [bs, W], non-causal inside the
        block: z [bs, W, H]."""
        bs, block = chain.shape
        seq_lens_cpu = (batch.seq_lens_cpu if batch.seq_lens_cpu is not None
                        else batch.seq_lens.cpu())
        fb = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY,
            batch_size=bs,
            input_ids=chain.reshape(-1),
            req_pool_indices=batch.req_pool_indices,
            seq_lens=batch.seq_lens,
            out_cache_loc=slots,
            seq_lens_sum=int(seq_lens_cpu.sum()) + bs * block,
            seq_lens_cpu=seq_lens_cpu + block,
            positions=positions,
            input_embeds=self.embed(chain.reshape(-1)),
            spec_algorithm=self.model_runner.spec_algorithm,
            spec_info=make_draft_block_spec_info(draft_token_num=block, device=self.device),
            capture_hidden_mode=CaptureHiddenMode.NULL,
            global_num_token_non_padded_cpu=bs * block,
        )
        with torch.inference_mode(), bound_runtime(self.model_runner, self.runtimes.get(block)):
            out = self.model_runner.forward(fb)
        if self.graph_bs and not out.can_run_graph:  # e.g. a short draft, a batch over the sizes
            self.metrics.record_eager("draft_pass")
        return out.logits_output.hidden_states.view(bs, block, -1)
