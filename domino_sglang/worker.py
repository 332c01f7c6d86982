"""The SGLang worker of DOMINO: prefill feature capture and the batched decode round.

Composed from SGLang pieces rather than subclassing its 3,000-line DFlash worker:
  - `build_draft_tp_worker`: a draft `TpModelWorker` sharing the target's request->token map and
    KV-slot allocator (same slots, separate draft KV buffers), running our drafter class;
  - `DFlashDraftInputV2` (via `make_draft_input_v2`): the per-request state the scheduler carries
    between rounds; its `prepare_for_decode` reserves the verify slots;
  - `DFlashVerifyInput.prepare_for_verify`: the target's TARGET_VERIFY forward batch;
  - `assign_extend_cache_locs_func`: the slots of the verify block.
Private SGLang internals used here (pinned to sglang==0.5.23): the four above, `ForwardBatch`,
`ForwardMode`, `CaptureHiddenMode`, `GenerationBatchResult`, `ModelRegistry.models`,
`BaseSpecWorker`, `runtime_context.get_spec`.
"""

from __future__ import annotations

import logging
import os

import torch
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.mem_cache.memory_pool import KVWriteLoc
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)
from sglang.srt.runtime_context import get_spec
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.draft_worker_common import (
    build_draft_tp_worker,
    make_draft_block_spec_info,
    make_draft_input_v2,
)

from domino_sglang.algorithm import candidate_pool_from_env
from domino_sglang.config import (
    ARCHITECTURE,
    check_against_target,
    load_draft_config,
    load_draft_weights,
)
from domino_sglang.metrics import DominoMetrics, head_change_outcomes
from domino_sglang.model import sglang_draft_model_class
from domino_sglang.rollout import greedy_rollout
from domino_sglang.verify import verify_greedy

logger = logging.getLogger(__name__)


class DominoWorker(BaseSpecWorker):
    """Drafts a block per request in one backbone pass, refines it with the head, verifies."""

    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker, **_):
        super().__init__()
        self.server_args = server_args
        self._target_worker = target_worker
        self.model_runner = target_worker.model_runner
        self.device = target_worker.device
        self.block_size = int(get_spec().speculative_num_draft_tokens)

        # Fail fast, one message naming the field, before any weight reaches SGLang's loader.
        target_cfg = self.model_runner.model_config
        conf = load_draft_config(server_args.speculative_draft_model_path, self.block_size)
        check_against_target(conf, target_cfg.hidden_size, target_cfg.vocab_size,
                             target_cfg.num_hidden_layers)
        load_draft_weights(conf)
        self.conf = conf
        self.candidate_pool = candidate_pool_from_env(conf.candidate_pool)
        # DOMINO_HEAD=0: backbone only, i.e. the DFlash baseline from the same checkpoint.
        self.use_head = os.environ.get("DOMINO_HEAD", "1") != "0"

        # The draft config names SGLang's DFlashDraftModel; in this (scheduler) process, and only
        # when DOMINO was chosen, that architecture resolves to our drafter class.
        from sglang.srt.models.registry import ModelRegistry

        ModelRegistry.models[ARCHITECTURE] = sglang_draft_model_class()
        bundle = build_draft_tp_worker(
            server_args=server_args, gpu_id=gpu_id, nccl_port=nccl_port,
            target_model_config=target_cfg, algo_label="DOMINO",
        )
        self._draft_worker = bundle.draft_worker
        self.draft_model_runner = bundle.draft_model_runner
        self.draft_model = bundle.draft_model  # DominoDraftModel

        target_model = self.model_runner.model
        self.embed = target_model.model.embed_tokens  # the target's, shared
        self.head = self.draft_model.drafter.head(self.embed, target_model.lm_head.weight)
        self._block_offsets = torch.arange(self.block_size, device=self.device)
        self._warned: set[str] = set()
        self.metrics = DominoMetrics.for_scheduler(self.block_size, self.device)
        logger.info("DOMINO worker: block %d, %d draft layers, target layers %s, pool %s, head %s",
                    self.block_size, conf.num_layers, list(conf.target_layer_ids),
                    self.candidate_pool or "full vocabulary", "on" if self.use_head else "OFF")

    # ---- lifecycle hooks called by the scheduler ----
    @property
    def target_worker(self):
        return self._target_worker

    @property
    def draft_worker(self):
        return self._draft_worker

    @property
    def spec_v2_attn_backends(self) -> tuple:
        return (self.model_runner.attn_backend, self.draft_model_runner.attn_backend)

    def alloc_memory_pool(self, memory_pool_config=None, req_to_token_pool=None,
                          token_to_kv_pool_allocator=None):
        self._draft_worker.alloc_memory_pool(
            memory_pool_config=memory_pool_config, req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=token_to_kv_pool_allocator)

    def init_attention_backends(self):
        self._draft_worker.init_attention_backends()

    def init_cuda_graphs(self):
        # The draft runs eagerly (its graph runners are still initialised, as SGLang expects);
        # the rollout has static shapes, so capturing it is future work on GPU.
        self._draft_worker.init_cuda_graphs(capture_decode_cuda_graph=False)

    def clear_cache_pool(self):
        pass  # the draft KV shares the target's allocator: nothing of its own to clear

    # ---- the work ----
    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None,
                                 pp_proxy_tensors=None) -> GenerationBatchResult:
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            return self.prefill(batch, on_publish)
        return self.decode_round(batch, on_publish)

    def prefill(self, batch, on_publish) -> GenerationBatchResult:
        """Target prefill with the drafter's target layers captured; their projected K/V go into
        the draft KV cache at the prompt tokens' slots (no draft forward over the prompt)."""
        out = self._target_worker.forward_batch_generation(
            batch, capture_hidden_mode=CaptureHiddenMode.FULL)
        out.new_seq_lens = batch.seq_lens
        if on_publish is not None:
            on_publish(out.new_seq_lens)
        # positions of the new tokens: prefix_len .. prefix_len + extend_len - 1, per request
        prefix = torch.tensor(batch.prefix_lens, dtype=torch.int64, device=self.device)
        extend = torch.tensor(batch.extend_lens, dtype=torch.int64, device=self.device)
        first = torch.cumsum(extend, 0) - extend  # flat index of each request's first new token
        flat = torch.arange(int(extend.sum()), device=self.device)
        positions = torch.repeat_interleave(prefix - first, extend) + flat
        self.write_draft_context(out.logits_output.hidden_states, positions, batch.out_cache_loc)
        out.logits_output.hidden_states = None
        out.next_draft_input = make_draft_input_v2(bonus_tokens=out.next_token_ids,
                                                   new_seq_lens=batch.seq_lens)
        return out

    def decode_round(self, batch, on_publish) -> GenerationBatchResult:
        """One round for every running request (bs of them, block size B):

          1. draft:   z = backbone([x_t, MASK x (B-1)] | context K/V)        one pass, all blocks
          2. refine:  d_1 = argmax base_0; d_{i+1} = argmax(base_i + head(z_i, GRU(x_t, d_1..d_i)))
          3. verify:  y = argmax p(. | prefix, x_t, d_1..d_{B-1})           one target pass
          4. accept:  a = longest k with d_1..d_k == y_0..y_{k-1}; commit y_0..y_a (a + 1 tokens)
          5. commit:  seq_len += a + 1; the target features of the committed tokens enter the
                      draft KV cache, so the next block sees them as context
        """
        draft_input = batch.spec_info
        bs, block = len(batch.seq_lens), self.block_size
        self._warn_unsupported(batch)
        prefix_lens = batch.seq_lens  # committed tokens (x_t, the bonus, is not among them)
        chain = torch.full((bs, block), self.conf.mask_token_id, dtype=torch.int64,
                           device=self.device)
        chain[:, 0] = draft_input.bonus_tokens
        positions = (prefix_lens[:, None] + self._block_offsets).reshape(-1)  # [bs*B]
        slots = self.block_slots(batch, prefix_lens)  # [bs*B]

        clock = self.metrics.clock()
        z = self.draft_block(batch, chain, positions, slots)  # [bs, B, H]
        chain[:, 1:], base_pick = greedy_rollout(z, chain[:, 0], self.head, self.candidate_pool,
                                                 use_head=self.use_head, return_base_pick=True)
        clock.mark()  # drafted
        logits_output, hidden = self.verify_forward(batch, chain, positions, slots)
        target_choice = logits_output.next_token_logits.argmax(dim=-1).view(bs, block)
        tokens, accept_lens = verify_greedy(chain, target_choice)
        clock.mark()  # verified

        if batch.return_logprob:  # logprobs of chain row b*B + j for committed token (b, j)
            compute_spec_logprobs(batch, logits_output, tokens.reshape(-1), chain_stride=block)
        new_seq_lens = prefix_lens + accept_lens.to(prefix_lens.dtype)
        if on_publish is not None:
            on_publish(new_seq_lens)
        # Features of every chain position are written; only the accepted ones (< new_seq_len)
        # are ever read, the rest are overwritten by the next block at the same slots.
        self.write_draft_context(hidden, positions, slots)
        logits_output.hidden_states = None
        bonus = tokens.gather(1, (accept_lens - 1)[:, None]).squeeze(1)
        if self.metrics.enabled:
            self.metrics.record_round(accept_lens, block, clock, head_change_outcomes(
                chain[:, 1:], base_pick, target_choice, accept_lens))
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=tokens.reshape(-1),
            accept_lens=accept_lens.to(torch.int32),
            can_run_cuda_graph=False,
            next_draft_input=make_draft_input_v2(bonus_tokens=bonus, new_seq_lens=new_seq_lens),
            speculative_num_draft_tokens=block,
            new_seq_lens=new_seq_lens,
        )

    def _warn_unsupported(self, batch) -> None:
        """Sampled and grammar-constrained verification are not implemented yet: say so once."""
        info = batch.sampling_info
        if not info.is_all_greedy and "sampling" not in self._warned:
            self._warned.add("sampling")
            logger.warning("DOMINO verifies greedily: requests with temperature > 0 get the "
                           "greedy continuation (exact speculative sampling is not implemented)")
        if batch.has_grammar and "grammar" not in self._warned:
            self._warned.add("grammar")
            logger.warning("DOMINO does not apply grammar masks during verification yet")

    # ---- steps of the round ----
    def block_slots(self, batch, prefix_lens: torch.Tensor) -> torch.Tensor:
        """KV slots of positions prefix .. prefix + B - 1 (reserved by prepare_for_decode)."""
        from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func

        return assign_extend_cache_locs_func(
            req_pool_indices=batch.req_pool_indices,
            req_to_token=self.model_runner.req_to_token_pool.req_to_token,
            start_offset=prefix_lens, end_offset=prefix_lens + self.block_size,
            batch_size=len(prefix_lens), draft_token_num=self.block_size, device=self.device,
        )

    def draft_block(self, batch, chain, positions, slots) -> torch.Tensor:
        """One backbone forward over every request's block, non-causal inside the block."""
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
        )
        with torch.inference_mode():
            out = self.draft_model_runner.forward(fb)
        return out.logits_output.hidden_states.view(bs, block, -1)

    def verify_forward(self, batch, chain, positions, slots):
        """Target TARGET_VERIFY forward over [x_t, d_1..d_{B-1}]: logits of every position and
        the drafter's target-layer features."""
        from sglang.srt.speculative.dflash_info import DFlashVerifyInput

        verify_input = DFlashVerifyInput(
            draft_token=chain.reshape(-1), positions=positions, draft_token_num=self.block_size,
            custom_mask=None, capture_hidden_mode=CaptureHiddenMode.FULL,
        )
        batch.out_cache_loc = slots
        saved = batch.seq_lens_cpu, batch.seq_lens_sum
        if batch.seq_lens_cpu is not None:  # host bound = committed prefix + one block
            batch.seq_lens_cpu = batch.seq_lens_cpu + self.block_size
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        forward_batch, _ = verify_input.prepare_for_verify(batch, self._target_worker)
        batch.seq_lens_cpu, batch.seq_lens_sum = saved
        out = self._target_worker.forward_batch_generation(
            batch=None, forward_batch=forward_batch, is_verify=True, skip_attn_backend_init=True)
        return out.logits_output, out.logits_output.hidden_states

    def write_draft_context(self, target_hidden: torch.Tensor, positions: torch.Tensor,
                            slots: torch.Tensor) -> None:
        """Project target features [T, K*H] and write each draft layer's K/V at `slots`."""
        pool = self.draft_model_runner.token_to_kv_pool
        with torch.inference_mode():
            kvs = self.draft_model.drafter.context_kv(target_hidden, positions)
            for attn, (k, v) in zip(self.draft_model.attn, kvs):
                pool.set_kv_buffer(attn, KVWriteLoc(slots, physical=True), k, v)
