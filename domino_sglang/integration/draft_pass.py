"""The draft pass: the drafter's backbone over every request's block, through SGLang's draft
model runner (non-causal inside the block, attending to the draft context's K/V).

Private SGLang internals (sglang_compat.py): `ForwardBatch`, `ForwardMode`, `CaptureHiddenMode`,
the draft block's spec info, `bound_runtime`.
"""

from __future__ import annotations

import torch

from domino_sglang.sglang_compat import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
    bound_runtime,
    make_draft_block_spec_info,
)


class DraftPass:
    """`draft_pass(batch, chain, positions, slots) -> z`, the Domino proposer's backbone pass.
    `graph_bs`: the batch sizes SGLang captured graphs for; `runtimes`: the pass's captured
    runtimes by width below B (B: SGLang's own runner), both set by worker.init_cuda_graphs;
    `metrics` counts the passes that ran eagerly where graphs were captured."""

    def __init__(self, model_runner, embed, device, metrics):
        self.model_runner, self.embed, self.device, self.metrics = (model_runner, embed, device,
                                                                    metrics)
        self.graph_bs: tuple[int, ...] = ()
        self.runtimes: dict[int, tuple] = {}

    def __call__(self, batch, chain: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor
                 ) -> torch.Tensor:
        """One backbone forward over every request's block chain [bs, W] at positions and KV
        slots [bs * W]: z [bs, W, H]."""
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
