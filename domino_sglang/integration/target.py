"""The target's side of a DOMINO round, over SGLang's schedule batch: the verify and plain
decode forwards, the KV slots of a block, the verify logits processed as plain decoding's, and
the seeded redraw of a prefill's first token.

Private SGLang internals (sglang_compat.py): `DFlashVerifyInput.prepare_for_verify`,
`assign_extend_cache_locs_func`, `TpModelWorker.forward_batch_generation`, `ForwardMode`,
`CaptureHiddenMode`, the schedule batch's round state, the sampler's logit processing
(penalties, grammar mask, custom processors, NaN clean-up), SGLANG_RETURN_ORIGINAL_LOGPROB.
"""

from __future__ import annotations

import torch

from domino_sglang.sglang_compat import (
    CaptureHiddenMode,
    DFlashVerifyInput,
    ForwardMode,
    apply_custom_logit_processor,
    apply_scaling_penalties,
    assign_extend_cache_locs_func,
    batch_round_state,
    build_grammar_vocab_mask,
    get_bool_env_var,
    host_lens_grown,
    sanitize_nan_logits,
)
from domino_sglang.spec.sampling import (
    RESAMPLE,
    SamplingRows,
    process_logits,
    sample_from,
    seeded_uniform,
)

# SGLang's sampler reads this once at import (sampler.py): logprobs before temperature
_RETURN_ORIGINAL_LOGPROB = get_bool_env_var("SGLANG_RETURN_ORIGINAL_LOGPROB")


def target_logits(batch, logits_output, grammar, grammar_barrier) -> torch.Tensor:
    """The verify logits [bs, B, V], processed in place in plain decoding's order
    (`ModelRunner._preprocess_logits`, then `Sampler._preprocess_logits`): penalties, grammar
    mask, logit bias, custom logit processors, NaN clean-up (temperature / top-k / top-p /
    min-p follow in verify_mixed). The grammar mask of chain position k is the grammar state
    after x_t, d_1..d_k (SGLang's `build_grammar_vocab_mask` over the chain, as DFLASH):
    a draft the grammar forbids has p = 0 and is never accepted nor recovered. The drafts
    themselves are not masked (that would need the host grammar per token); exactness does
    not need it. `grammar_barrier` advances the previous round's FSMs first.
    Penalties and history-reading processors are exact at chain index 0 only, which is all
    their requests commit (planner.one_token_flags)."""
    info, flat = batch.sampling_info, logits_output.next_token_logits  # [bs*L, V]
    block = flat.shape[0] // len(batch.seq_lens)  # L
    mask = None
    if grammar is not None:  # also clears the extend stage's stale info.grammar_mask
        mask = build_grammar_vocab_mask(reqs=batch.reqs, tree=grammar, sampling_info=info,
                                        device=flat.device, barrier=grammar_barrier)
    logits = flat.view(len(batch.seq_lens), block, -1)
    # Penalties: the scheduler hands the worker a forward-only copy of the sampling info with
    # the penalizers' state (fed x_t by algorithm.cumulate_penalties) pre-accumulated per
    # request, [bs, V].
    if info.acc_additive_penalties is not None:
        logits.add_(info.acc_additive_penalties[:, None, :].to(logits.dtype))
    if info.acc_scaling_penalties is not None:
        apply_scaling_penalties(flat, info.acc_scaling_penalties.repeat_interleave(block, 0))
    if mask is not None:
        mask.apply(flat)
    if info.logit_bias is not None:
        logits.add_(info.logit_bias[:, None, :].to(logits.dtype))
    if info.has_custom_logit_processor:  # every row of a request gets its custom_params
        apply_custom_logit_processor(flat, info, num_tokens_in_batch=block)
    sanitize_nan_logits(flat, "DOMINO: verify logits")
    return logits


def request_seeds(batch) -> list[int | None]:
    """Each request's `sampling_seed` (None: a fresh random seed every round)."""
    return [r.sampling_params.sampling_seed for r in batch.reqs]


def reseed_first_tokens(batch, out) -> None:
    """Redraw the prefill token of requests with a `sampling_seed` from their seed.

    SGLang's CPU/pytorch sampler ignores `sampling_seed` unless deterministic inference is
    on (whose seeded sampler is a Triton kernel), so without this the first token would not
    be reproducible. In the non-greedy path the sampler leaves softmax(processed logits / T)
    in `next_token_logits` (in place); top-k / top-p / min-p are applied here as it does.
    A redrawn row's returned logprob becomes log p(drawn), as the sampler computes it (its
    top / token-id logprobs do not depend on the draw). Under SGLANG_RETURN_ORIGINAL_LOGPROB
    (logprobs before temperature) batches with logprobs keep SGLang's draw."""
    info, seeds = batch.sampling_info, request_seeds(batch)
    if info.is_all_greedy or all(s is None for s in seeds):
        return
    logprobs = out.logits_output.next_token_logprobs  # [bs] or None
    if logprobs is not None and _RETURN_ORIGINAL_LOGPROB:
        return
    probs = out.logits_output.next_token_logits  # [bs, V]
    if probs is None or not torch.allclose(probs.sum(-1), probs.new_ones(probs.shape[0]),
                                           atol=1e-3):
        return
    rows = SamplingRows.from_sampling_info(info, seeds)
    rows.temperature = torch.ones_like(rows.temperature)  # already divided by T
    weights = process_logits(probs.log(), rows)  # log 0 = -inf: masked tokens stay at 0
    # the first output token sits at position seq_len (decode rounds draw at > seq_len)
    u = seeded_uniform(rows.seed, batch.seq_lens.long()[:, None], RESAMPLE)[:, 0]
    redraw = torch.tensor([s is not None for s in seeds], device=probs.device) & ~rows.greedy
    drawn = torch.where(redraw, sample_from(weights, u).to(out.next_token_ids.dtype),
                        out.next_token_ids)
    out.next_token_ids = drawn
    if logprobs is not None:  # SGLang's: log(probs) clamped to the dtype's minimum
        own = probs.gather(1, drawn.long()[:, None]).squeeze(1).log()
        own = own.clamp(min=torch.finfo(own.dtype).min).to(logprobs.dtype)
        out.logits_output.next_token_logprobs = torch.where(redraw, own, logprobs)


def block_slots(model_runner, batch, prefix_lens: torch.Tensor, width: int, device
                ) -> torch.Tensor:
    """KV slots of positions prefix .. prefix + width - 1 (reserved by prepare_for_decode),
    flat [bs * width] int64; a plain round (width 1) needs x_t's slot only: one gather."""
    req_to_token = model_runner.req_to_token_pool.req_to_token  # [R, pool_len] int32
    if width == 1:
        return req_to_token[batch.req_pool_indices, prefix_lens].to(torch.int64)
    return assign_extend_cache_locs_func(
        req_pool_indices=batch.req_pool_indices, req_to_token=req_to_token,
        start_offset=prefix_lens, end_offset=prefix_lens + width,
        batch_size=len(prefix_lens), draft_token_num=width, device=device,
    )


def verify_forward(target_worker, batch, chain, positions, slots, custom_mask=None):
    """Target TARGET_VERIFY forward over [x_t, d_1..d_{B-1}]: logits of every position and
    the drafter's target-layer features. custom_mask: a draft tree's (tree.DraftTree.
    custom_mask, SGLang's FULL_MASK layout) in place of the chain's causal rule."""
    verify_input = DFlashVerifyInput(
        draft_token=chain.reshape(-1), positions=positions, draft_token_num=chain.shape[1],
        custom_mask=custom_mask, capture_hidden_mode=CaptureHiddenMode.FULL,
    )
    batch.out_cache_loc = slots
    with host_lens_grown(batch, chain.shape[1]):  # host bound = committed prefix + one block
        forward_batch, _ = verify_input.prepare_for_verify(batch, target_worker)
    out = target_worker.forward_batch_generation(
        batch=None, forward_batch=forward_batch, is_verify=True, skip_attn_backend_init=True)
    return out.logits_output, out.logits_output.hidden_states


def decode_forward(target_worker, batch, chain, slots):
    """Plain round: the target's DECODE forward over x_t alone (chain [bs, 1] at `slots`),
    built by SGLang from the schedule batch exactly as plain decoding builds it (seq_lens
    count x_t, positions = seq_lens - 1), with the drafter's target-layer features captured.
    The batch's round state is restored afterwards."""
    with batch_round_state(batch):
        batch.forward_mode, batch.input_ids, batch.out_cache_loc = (
            ForwardMode.DECODE, chain.reshape(-1), slots)
        batch.spec_info = None
        batch.seq_lens = batch.seq_lens + 1
        if batch.seq_lens_cpu is not None:
            batch.seq_lens_cpu = batch.seq_lens_cpu + 1
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        else:
            batch.seq_lens_sum = int(batch.seq_lens.sum())
        out = target_worker.forward_batch_generation(
            batch, is_verify=True, capture_hidden_mode=CaptureHiddenMode.FULL)
    return out.logits_output, out.logits_output.hidden_states
