"""The SGLang worker of DOMINO: prefill feature capture and the batched decode round.

Composed from SGLang pieces rather than subclassing its 3,000-line DFlash worker:
  - `build_draft_tp_worker`: a draft `TpModelWorker` sharing the target's request->token map and
    KV-slot allocator (same slots, separate draft KV buffers), running our drafter class;
  - `DFlashDraftInputV2` (via `make_draft_input_v2`): the per-request state the scheduler carries
    between rounds; its `prepare_for_decode` reserves the verify slots;
  - `DFlashVerifyInput.prepare_for_verify`: the target's TARGET_VERIFY forward batch;
  - `assign_extend_cache_locs_func`: the slots of the verify block;
  - `TpModelWorker.forward_batch_generation(batch, is_verify=True, capture_hidden_mode=FULL)`
    on the schedule batch switched to DECODE: plain rounds (L = 1), as plain decoding runs them.
Private SGLang internals used here (pinned to sglang==0.5.23): the four above, `ForwardBatch`,
`ForwardMode`, `CaptureHiddenMode`, `GenerationBatchResult`, `ModelRegistry.models`,
`BaseSpecWorker`, `runtime_context.get_spec`; all reached through sglang_compat.py, which lists
them and is checked against the installed SGLang by tests/test_sglang_compat.py.
"""

from __future__ import annotations

import logging
import os
import time

import torch

from domino_sglang.algorithm import candidate_pool_from_env, draft_temperature_scale_from_env
from domino_sglang.config import (
    ARCHITECTURE,
    check_against_target,
    load_draft_config,
    load_draft_weights,
)
from domino_sglang.context import DeferredContext
from domino_sglang.cpu import linear as cpu_linear
from domino_sglang.cpu.argmax import argmax
from domino_sglang.lookup import has_recurring_suffix, lookup_batch, lookup_from_env
from domino_sglang.metrics import (
    DominoMetrics,
    RoundClock,
    draft_outcomes,
    head_change_outcomes,
)
from domino_sglang.model import sglang_draft_model_class
from domino_sglang.pointer import (
    CopyIndex,
    DeviceHistories,
    DevicePointerCopy,
    PointerCopy,
    copy_from_env,
    copy_index_on_device,
)
from domino_sglang.policy import SpeculationPolicy, cost_model
from domino_sglang.rollout import greedy_rollout
from domino_sglang.sampling import (
    RESAMPLE,
    RoundUniforms,
    SamplingRows,
    process_logits,
    sample_from,
    sampled_rollout,
    seeded_uniform,
)
from domino_sglang.sglang_compat import (
    BaseSpecWorker,
    CaptureHiddenMode,
    DFlashVerifyInput,
    ForwardBatch,
    ForwardMode,
    GenerationBatchResult,
    GrammarTree,
    KVWriteLoc,
    apply_custom_logit_processor,
    apply_scaling_penalties,
    assign_extend_cache_locs_func,
    batch_round_state,
    build_draft_tp_worker,
    build_grammar_vocab_mask,
    compute_spec_logprobs,
    get_bool_env_var,
    get_spec,
    host_lens_grown,
    make_draft_block_spec_info,
    make_draft_input_v2,
    register_draft_architecture,
    sanitize_nan_logits,
    supports_sampling_mask,
)
from domino_sglang.verify import one_hot_proposal, verify_greedy, verify_mixed
from domino_sglang.vocab import load_draft_vocab

logger = logging.getLogger(__name__)
# SGLang's sampler reads this once at import (sampler.py): logprobs before temperature
_RETURN_ORIGINAL_LOGPROB = get_bool_env_var("SGLANG_RETURN_ORIGINAL_LOGPROB")


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
        self.short_draft = short_draft_from_env(conf.short_draft)  # see propose
        self.lookup = lookup_from_env()  # DOMINO_LOOKUP=0: Domino drafts only (lookup.py)
        # sampled requests draft at temperature T * scale (sampling.py)
        self.draft_temperature_scale = draft_temperature_scale_from_env(
            conf.draft_temperature_scale)

        # The draft config names SGLang's DFlashDraftModel; in this (scheduler) process, and only
        # when DOMINO was chosen, that architecture resolves to our drafter class.
        register_draft_architecture(ARCHITECTURE, sglang_draft_model_class())
        bundle = build_draft_tp_worker(
            server_args=server_args, gpu_id=gpu_id, nccl_port=nccl_port,
            target_model_config=target_cfg, algo_label="DOMINO",
        )
        self._draft_worker = bundle.draft_worker
        self.draft_model_runner = bundle.draft_model_runner
        self.draft_model = bundle.draft_model  # DominoDraftModel

        target_model = self.model_runner.model
        self.embed = target_model.model.embed_tokens  # the target's, shared
        # On the CPU the head's small sequential GEMVs run faster in fp32 than in bf16 (16-block
        # rollout, bs 1: 22 vs 31 ms, benchmarks/head_cost.py); 4 MB of weights.
        head_dtype = torch.float32 if torch.device(self.device).type == "cpu" else None
        # SGLang pads lm_head rows to a multiple of 64: the head scores the real vocabulary only
        lm_head = target_model.lm_head.weight[:target_cfg.vocab_size]  # [V, H]
        head = self.draft_model.drafter.head(self.embed, lm_head, head_dtype)
        # the draft vocabulary (vocab.py): base logits over its Vd rows of the lm_head only
        self.head = head.with_vocab(load_draft_vocab(conf.path, conf.vocab_size))
        if cpu_linear.is_active():  # the base logits of 15 positions: 3x faster packed (fp32)
            rows = lm_head if self.head.vocab is None else self.head.vocab_lm_head
            self.head.lm_head_packed = cpu_linear.pack(rows)
            # the backbone's and context projection's linears, as the target's are
            drafter = self.draft_model.drafter
            cpu_linear.pack_linears(drafter.fc)
            cpu_linear.pack_linears(drafter.layers)
        # a pointer-generator drafter (pointer.py): its copy gate, in the head's dtype, and each
        # running request's copy index, extended round by round (request id -> CopyIndex);
        # DOMINO_COPY=0 drafts from p alone (the gate unused)
        gate = self.draft_model.drafter.copy_gate if copy_from_env() else None
        self.copy_gate = gate.to(head_dtype) if gate is not None and head_dtype else gate
        self.copy_indexes: dict[str, CopyIndex] = {}
        # or on the device (pointer.copy_index_on_device: CUDA by default)
        self.device_histories = (DeviceHistories(self.device)
                                 if gate is not None and copy_index_on_device(self.device)
                                 else None)
        self.round_copied: torch.Tensor | None = None  # set by propose (metrics)
        if self.head.vocab is not None:
            logger.info("DOMINO draft vocabulary: %d of %d tokens (%s)",
                        len(self.head.vocab), conf.vocab_size, conf.path)
        self._block_offsets = torch.arange(self.block_size, device=self.device)
        self._warned: set[str] = set()
        self.metrics = DominoMetrics.for_scheduler(self.block_size, self.device)
        profile, cost = cost_model(torch.device(self.device).type,
                                   str(self.model_runner.dtype), short_draft=self.short_draft)
        self.policy = SpeculationPolicy.from_env(self.block_size, cost)  # DOMINO_ADAPTIVE=0: fixed
        self._plain_decode: bool | None = None  # see plain_decode_forward
        # (bs, L, start) of the last decode round, timed at the next one's start (calibration)
        # + kind, mean committed length and its clock (draft / verify marks), logged (debug)
        # by time_last_round
        self._last_round: tuple[int, int, float, str, int, object] | None = None
        self._logged_scale = (1.0, 0.0)  # (k, time) last logged
        # plain rounds' draft-context writes, batched until a draft pass needs them (context.py)
        self.context = DeferredContext(self.write_draft_context)
        self.sync_log = os.environ.get("DOMINO_SYNC_LOG")  # counted rounds (measurement, tests)
        self.round_pointer = False  # whether this round's draft used the pointer copy path
        logger.info("DOMINO worker: block %d, %d draft layers, target layers %s, pool %s, head %s, "
                    "copy %s, draft pass %s, prompt lookup %s, policy %s (cost profile %s: %s)",
                    self.block_size,
                    conf.num_layers, list(conf.target_layer_ids),
                    self.candidate_pool or "full vocabulary", "on" if self.use_head else "OFF",
                    "on" if self.copy_gate is not None else "off",
                    "L tokens" if self.short_draft else "whole block",
                    "on" if self.lookup else "off",
                    "adaptive" if self.policy.enabled else "fixed block", profile, cost)

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
        # the draft KV shares the target's allocator; only held context rows are ours
        self.context.clear()

    def weight_update_runners(self) -> list:
        """(role, runner) pairs SGLang's weight updates (`/update_weights_from_*`) apply to
        besides the target: none. The drafter keeps its weights (it is trained for a target and
        shares the target's embeddings in place); verification is the target's, so output stays
        exact after a target update, only acceptance may drop. SGLang's base class would ask
        `draft_worker.draft_runners`, which a TpModelWorker lacks: the scheduler died."""
        return []

    @property
    def plain_decode_forward(self) -> bool:
        """Whether plain rounds (L = 1) run the target's own DECODE forward, as plain decoding
        does. Not when the target replays captured graphs (known only after the scheduler has
        captured them): those are captured for TARGET_VERIFY at width B and their runner does not
        tell a DECODE batch apart, so L = 1 stays an eager one-token verify there.
        DOMINO_PLAIN_DECODE=0 forces the verify path (benchmarks/round_cost.py --plain-verify)."""
        if self._plain_decode is None:
            graphs = getattr(self.model_runner, "decode_cuda_graph_runner", None)
            self._plain_decode = (graphs is None
                                  and os.environ.get("DOMINO_PLAIN_DECODE", "1") != "0")
        return self._plain_decode

    # ---- the work ----
    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None,
                                 pp_proxy_tensors=None) -> GenerationBatchResult:
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            return self.prefill(batch, on_publish)
        if self.sync_log is not None:  # DOMINO_SYNC_LOG (tests/test_sync_budget.py)
            return self.counted_decode_round(batch, on_publish, grammar_barrier)
        return self.decode_round(batch, on_publish, grammar_barrier)

    def counted_decode_round(self, batch, on_publish, grammar_barrier) -> GenerationBatchResult:
        """decode_round under a host-sync counter (syncs.py); one JSON line per round to the file
        DOMINO_SYNC_LOG: the round's kind, batch size, L, whether it sampled / used the pointer
        copy path, and the synchronisations by origin and kind (domino sites included)."""
        import json

        from domino_sglang.syncs import SyncCounter

        sampled = not bool((batch.sampling_info.top_ks <= 1).all())  # outside the count
        self.round_pointer = False
        with SyncCounter() as counter:
            counter.host(batch.seq_lens_cpu)  # SGLang's host copy of the lengths
            out = self.decode_round(batch, on_publish, grammar_barrier)
        bs, block, _, kind, _, _ = self._last_round
        line = {"kind": kind, "bs": bs, "L": block, "sampled": sampled,
                "pointer": self.round_pointer,
                "domino": counter.total("domino"), "sglang": counter.total("sglang"),
                "by_kind": counter.by_kind("domino"),
                "sites": {f"{k}@{site}": n for (o, k, site), n in counter.sites.items()
                          if o == "domino"}}
        with open(self.sync_log, "a") as f:
            f.write(json.dumps(line) + "\n")
        return out

    def prefill(self, batch, on_publish) -> GenerationBatchResult:
        """Target prefill with the drafter's target layers captured; their projected K/V go into
        the draft KV cache at the prompt tokens' slots (no draft forward over the prompt)."""
        self._last_round = None  # the decode round before this prefill is not timed
        self.context.flush()  # before any freed slot is reused or a cached prefix is read
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
        self.reseed_first_tokens(batch, out)
        out.next_draft_input = make_draft_input_v2(bonus_tokens=out.next_token_ids,
                                                   new_seq_lens=batch.seq_lens)
        return out

    def decode_round(self, batch, on_publish, grammar_barrier=None) -> GenerationBatchResult:
        """One round for every running request (bs of them, block size B):

          1. draft:   z = backbone([x_t, MASK x (W-1)] | context K/V)        one pass, all blocks
                      (W = B; W = L for a drafter trained on short blocks, see propose)
                      a request whose last n >= 2 tokens recur in its own history drafts
                      d_1.. = what followed them there instead (lookup.py); no pass if all do
          2. refine:  d_1 = argmax base_0; d_{i+1} = argmax(base_i + head(z_i, GRU(x_t, d_1..d_i)))
                      (sampled batches: d_{i+1} ~ q_i, the same logits after the request's
                      sampling transform; the GRU consumes the sampled token)
          3. verify:  logits of p(. | prefix, x_t, d_1..d_{B-1}), one target pass, then the
                      request's penalties / logit bias / grammar mask
          4. accept:  greedy: a = longest k with d_1..d_k == y_0..y_{k-1}; commit y_0..y_a
                      sampled: exact rejection sampling (verify.py; copied drafts with a
                      one-hot q); either way a + 1 tokens
          5. commit:  seq_len += a + 1; the target features of the committed tokens enter the
                      draft KV cache, so the next block sees them as context (a plain round's
                      are held and written in one batch before the next draft pass)
        The adaptive policy (policy.py) verifies only the first L <= B chain tokens; L = 1 is a
        plain decoding round (no draft pass; the target's DECODE forward over [x_t]).
        """
        draft_input = batch.spec_info
        bs, seeds = len(batch.seq_lens), self.seeds(batch)
        started = self.time_last_round()
        # per row, not SamplingBatchInfo.is_all_greedy: filter_batch never recomputes that flag;
        # SGLang's own greedy test (top_k <= 1, what `top_ks` holds), read on the host
        greedy_host = [r.sampling_params.top_k <= 1 for r in batch.reqs]
        sampled = not all(greedy_host)
        capped_host = self.one_token_flags(batch)  # [bs] bool: commit one token this round
        capped = (None if capped_host is None  # the one host-to-device copy, only if any
                  else torch.tensor(capped_host, device=self.device))
        all_capped = capped_host is not None and all(capped_host)
        # L, the chain length verified this round. A seeded sampled request's realised tokens
        # depend on L (coins vs. plain draws), so batches holding one verify the full block.
        # Speculation only costs a batch whose every request is capped: the adaptive policy
        # runs it as plain rounds.
        pinned = any(s is not None and not g for s, g in zip(seeds, greedy_host))
        committed = 0
        if self.policy.cycles:  # a test pattern: needs the first request's length on the host
            if batch.seq_lens_cpu is not None:  # SGLang's host copy: no synchronisation
                committed = int(batch.seq_lens_cpu[0])
            else:  # committed = prompt + output without x_t (not yet in the KV cache)
                req = batch.reqs[0]
                committed = len(req.origin_input_ids) + len(req.output_ids) - 1
        if pinned:
            block = self.block_size
        elif self.policy.enabled and all_capped:
            block = 1
        else:
            block = self.policy.draft_len(bs, committed)
        clock = self.metrics.clock()
        # Prompt lookup (lookup.py): rows whose last tokens recur in their own history draft by
        # copying. A round where every row copies (or is capped) runs no draft pass, and the
        # policy sizes it for copies (policy.lookup_len; a seeded batch keeps the full block);
        # one that mixes copies with the drafter's rows drafts at the drafter's L, if any.
        looked = None  # [bs] bool: rows drafted by copying (looked_host: the same on the host)
        tried = self.lookup and not all_capped and (
            block > 1 or (self.policy.may_copy_instead()
                          and self.plain_round_may_copy(batch, capped_host)))
        if tried:
            looked_host, looked, copies, longest = self.lookup_drafts(
                batch, draft_input.bonus_tokens, capped_host)
        copy_only = looked is not None and all(
            lk or cp for lk, cp in zip(looked_host, capped_host or [False] * bs))
        if copy_only and not pinned and self.policy.pinned is None:
            copy_len = self.policy.lookup_len(bs, longest)
            if copy_len > 1:
                block = copy_len
            else:  # copies do not pay: the round the policy chose (the drafter's, or plain)
                looked, copy_only = None, False
        if looked is not None and block == 1:  # plain decoding after all
            looked, copy_only = None, False
        draft_pass = not copy_only
        self.record_fallbacks(bs, block, capped_host)
        self.context.before_round(tuple(r.rid for r in batch.reqs), speculative=block > 1)
        prefix_lens = batch.seq_lens  # committed tokens (x_t, the bonus, is not among them)
        chain = torch.full((bs, self.block_size), self.conf.mask_token_id, dtype=torch.int64,
                           device=self.device)
        chain[:, 0] = draft_input.bonus_tokens
        positions = prefix_lens[:, None] + self._block_offsets  # [bs, B]
        slots = self.block_slots(batch, prefix_lens, self.block_size if block > 1 else 1)
        slots = slots.view(bs, -1)  # [bs, B] ([bs, 1] in a plain round)

        rows = u = None
        if sampled:
            rows = SamplingRows.from_sampling_info(batch.sampling_info, seeds)
            u = RoundUniforms.for_round(rows.seed, prefix_lens, block)
        # q [bs, L-1, V] (sampled: the distributions the drafts were drawn from), or the
        # backbone's own argmax picks (greedy: head metrics); None for L = 1 or no draft pass
        drafted = (self.propose(batch, chain, positions, slots, block, rows, u) if draft_pass
                   else None)
        if looked is not None:  # copied rows: [x_t, copy, MASK..]; sampled: q = one-hot
            chain[:, 1:] = torch.where(looked[:, None], copies, chain[:, 1:])
            if sampled:
                drafted = one_hot_proposal(chain[:, 1:block], looked, drafted,
                                           self.head.vocab_size)
        chain, positions = chain[:, :block].contiguous(), positions[:, :block].reshape(-1)
        slots = slots[:, :block].reshape(-1)
        clock.mark()  # drafted
        grammar = GrammarTree.from_linear_chain(chain) if batch.has_grammar else None
        if block == 1 and self.plain_decode_forward:
            logits_output, hidden = self.decode_forward(batch, chain, slots)
        else:
            logits_output, hidden = self.verify_forward(batch, chain, positions, slots)
        logits = self.target_logits(batch, logits_output, grammar, grammar_barrier)  # [bs,L,V]
        if sampled:
            q = drafted if block > 1 else logits.new_zeros(bs, 0, logits.shape[-1])
            tokens, accept_lens = verify_mixed(chain, logits, q, rows, u)
        else:
            target_choice = argmax(logits)  # [bs, L] (cpu/argmax.py: torch.argmax, faster)
            tokens, accept_lens = verify_greedy(chain, target_choice)
        uncapped = accept_lens  # the verifier's verdict, what the policy learns from
        if capped is not None:
            accept_lens = torch.where(capped, torch.ones_like(accept_lens), accept_lens)
        clock.mark()  # verified

        if batch.return_logprob:  # logprobs of chain row b*B + j for committed token (b, j)
            compute_spec_logprobs(batch, logits_output, tokens.reshape(-1), chain_stride=block)
        new_seq_lens = prefix_lens + accept_lens.to(prefix_lens.dtype)
        if on_publish is not None:
            on_publish(new_seq_lens)
        # Features of every chain position are written; only the accepted ones (< new_seq_len)
        # are ever read, the rest are overwritten by the next block at the same slots. A plain
        # round's wait for the next draft pass (context.py).
        if block == 1:
            self.context.defer(hidden, positions, slots)
        else:
            self.write_draft_context(hidden, positions, slots)
        logits_output.hidden_states = None
        bonus = tokens.gather(1, (accept_lens - 1)[:, None]).squeeze(1)
        # The round's one read-back (device to host): the policy's accept lengths and the
        # metrics' counts, in one vector; none in a plain round without policy statistics.
        observe = self.policy.enabled and block > 1  # the policy learns from drafted rounds
        readback = [uncapped.to(torch.int64)] if observe else []  # [bs]
        outcomes = copies = None
        if self.metrics.enabled:  # the head's changes and copies, on the rows it drafted
            if not sampled and drafted is not None:
                d = None if looked is None else ~looked
                outcomes = head_change_outcomes(chain[:, 1:], drafted, target_choice,
                                                accept_lens, self.round_copied, d)
                if self.round_copied is not None:
                    copies = draft_outcomes(self.round_copied, chain[:, 1:], target_choice,
                                            accept_lens, d)
            if block > 1 or looked is not None:
                readback.append(self.metrics.round_stats(accept_lens, block, outcomes, copies,
                                                         looked))
        host = torch.cat(readback).tolist() if readback else []  # the one sync
        if self.metrics.enabled:  # plain round: no stats (nothing drafted), none read
            stats = host[bs:] if observe else host
            self.metrics.record_round(accept_lens, block, clock, outcomes, copies, looked,
                                      stats=stats if block > 1 or looked is not None else None)
        if observe:  # capped rows gain nothing from L: they do not vote
            lens_host = host[:bs]
            voters = [not c for c in capped_host] if capped_host is not None else [True] * bs
            if looked is not None:  # copies and drafts have an alpha each
                self.policy.observe_lookup(
                    [a for a, lk in zip(lens_host, looked_host) if lk], block)
                voters = [v and not lk for v, lk in zip(voters, looked_host)]
            if draft_pass:
                self.policy.observe([a for a, v in zip(lens_host, voters) if v], block)
        # the cost profile prices rounds with a draft pass (or plain ones): copy-only rounds are
        # logged (debug) but not timed
        kind = ("copy" if not draft_pass else "plain" if block == 1
                else "draft" if looked is None else "mixed")
        self.metrics.record_kind(kind)
        kind += "+lookup" if tried else ""
        context = (int(batch.seq_lens_cpu.sum()) // bs if batch.seq_lens_cpu is not None
                   else -1)  # mean committed length (debug log), from the host copy only
        self._last_round = (bs, block, started, kind, context, clock)
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=tokens.reshape(-1),
            accept_lens=accept_lens.to(torch.int32),
            can_run_cuda_graph=False,
            next_draft_input=make_draft_input_v2(bonus_tokens=bonus, new_seq_lens=new_seq_lens),
            speculative_num_draft_tokens=block,
            new_seq_lens=new_seq_lens,
        )

    def propose(self, batch, chain, positions, slots, block: int, rows, u):
        """Fill chain[:, 1:L] with drafts: one backbone pass over the block, then the head rolls
        out L-1 tokens, greedily or (rows given) sampled from q. Returns q [bs, L-1, V]
        (sampled), the backbone's argmax picks [bs, L-1] (greedy), None (L = 1).
        The pass drafts the whole [bs, B] block, or with `short_draft` (a drafter trained on
        short blocks) only the L tokens verified: [x_t, MASK x (L-1)], a cheaper pass."""
        self.round_copied = None  # [bs, L-1] bool: greedy positions the copy drafted (metrics)
        self.round_pointer = False
        if block == 1:  # plain decoding round: no draft pass
            return None
        width = block if self.short_draft else self.block_size  # W, the tokens drafted
        z = self.draft_block(batch, chain[:, :width], positions[:, :width].reshape(-1),
                             slots[:, :width].reshape(-1))  # [bs, W, H]
        z = z[:, :block]  # [bs, L, H]: the head at position i reads z_i only
        copy = (self.pointer_copy(batch, chain[:, 0], block - 1) if self.copy_gate is not None
                else None)
        self.round_pointer = copy is not None
        if rows is not None:
            chain[:, 1:block], q = sampled_rollout(
                z, chain[:, 0], self.head, rows, u.draft, self.candidate_pool,
                use_head=self.use_head, logit_bias=batch.sampling_info.logit_bias,
                temperature_scale=self.draft_temperature_scale, copy=copy)
            return q
        chain[:, 1:block], base_pick = greedy_rollout(
            z, chain[:, 0], self.head, self.candidate_pool, use_head=self.use_head,
            return_base_pick=True, copy=copy)
        if copy is not None:
            self.round_copied = copy.copied()
        return base_pick

    def pointer_copy(self, batch, bonus: torch.Tensor, n: int) -> PointerCopy:
        """A pointer drafter's copy path for this round (pointer.py) over n positions: each
        request's copy index brought up to its prompt + output (x_t last; only the new tokens
        are indexed), the indexes of requests that left the batch dropped. A request whose
        recorded output does not end in x_t (it would: rounds run synchronously) copies from
        x_t and its chain only. On the device (copy_index_on_device): DeviceHistories and
        DevicePointerCopy, one host-to-device copy and no synchronisation; on the host:
        CopyIndex, a read of x_t and host lookups per position."""
        if self.device_histories is not None:
            history, lens = self.device_histories.update(batch.reqs)  # [bs, T], [bs]
            last = history.gather(1, (lens - 1).clamp(min=0)[:, None]).squeeze(1)
            ok = (lens > 0) & (last == bonus)  # else: [x_t] alone, as CopyIndex does
            history = history.clone()
            history[:, 0] = torch.where(ok, history[:, 0], bonus.to(history.dtype))
            lens = torch.where(ok, lens, torch.ones_like(lens))
            return DevicePointerCopy(self.copy_gate, history, lens, n)
        indexes = []
        for req, x_t in zip(batch.reqs, bonus.tolist()):
            history = req.origin_input_ids + req.output_ids
            index = self.copy_indexes.get(req.rid) or CopyIndex()
            index.sync(history if history and history[-1] == x_t else [x_t])
            indexes.append(index)
        self.copy_indexes = {r.rid: ix for r, ix in zip(batch.reqs, indexes)}
        return PointerCopy(self.copy_gate, indexes, bonus.device)

    def lookup_drafts(self, batch, bonus: torch.Tensor, capped: list[bool] | None
                      ) -> tuple[list[bool] | None, torch.Tensor | None, torch.Tensor | None,
                                 int]:
        """Prompt-lookup drafts (lookup.py) from each request's prompt + output so far: (rows
        [bs] that have one, on the host and on the device; drafts [bs, B-1] padded with the mask
        token; the longest draft's length), or (None, None, None, 0) when no request has one.
        Capped requests take none. The lookup runs on the host lists; its result reaches the
        device in one copy. A request whose recorded output does not end in its bonus token
        x_t (it would: the scheduler runs rounds synchronously) takes none either: checked on
        the device, where x_t is (its row drafts the mask token then, still exact)."""
        n, mask = self.block_size - 1, self.conf.mask_token_id
        skip = capped or [False] * len(batch.reqs)
        rows, histories = [], []
        for i, req in enumerate(batch.reqs):
            history = req.origin_input_ids + req.output_ids
            if not skip[i] and history:
                rows.append(i)
                histories.append(torch.tensor(history, dtype=torch.int64))
        if not rows:
            return None, None, None, 0
        copies, lens = lookup_batch(histories, n)  # [m, B-1] (-1 padded), [m]
        if not bool((lens > 0).any()):
            return None, None, None, 0
        # [bs, B + 1]: drafts, found, the history's last token (host, then one copy)
        packed = torch.full((len(batch.reqs), n + 2), mask, dtype=torch.int64)
        index = torch.tensor(rows)
        packed[index, :n] = torch.where(copies >= 0, copies, mask)
        packed[:, n] = 0
        packed[index, n] = (lens > 0).long()
        packed[index, n + 1] = torch.stack([h[-1] for h in histories])
        found_host = (packed[:, n] > 0).tolist()
        dev = packed.to(self.device)
        found = (dev[:, n] > 0) & (dev[:, n + 1] == bonus)
        return found_host, found, dev[:, :n], int(lens.max())

    def plain_round_may_copy(self, batch, capped: list[bool] | None) -> bool:
        """Whether a round the policy made plain could verify copies instead: only as a
        copy-only round (every uncapped request has a copy) whose copies pay at this batch size
        even at their longest (policy.lookup_len). Both are asked on the host first, request by
        request until one has no recurring suffix (lookup.has_recurring_suffix), so a plain
        round under load does not pay for a batched lookup (1.4 ms at bs 32 on the CPU, ~0.7 %
        of the round) whose copies it could not use. Exact for the tokens and the policy's
        statistics (the rounds are the same); the plain rounds' measured times shrink by the
        lookup they skip. Assumes lookup_drafts matches with lookup.py's default MIN_MATCH."""
        if self.policy.lookup_len(len(batch.reqs), self.block_size - 1) <= 1:
            return False
        skip = [False] * len(batch.reqs) if capped is None else capped
        return all(s or has_recurring_suffix(r.origin_input_ids + r.output_ids)
                   for s, r in zip(skip, batch.reqs))

    def time_last_round(self) -> float:
        """Now; and the previous decode round's cost, start to start, to the policy's cost
        calibration (policy.py). The scheduler runs rounds synchronously (no overlap), so
        on any device this wall time is what the round cost, its output processing included."""
        now = time.perf_counter()
        if self._last_round is not None:
            bs, block, started, kind, context, clock = self._last_round
            if logger.isEnabledFor(logging.DEBUG):  # `-- --log-level debug`
                calibration = self.policy.calibration
                # draft: lookup + draft pass + head; verify: target forward + acceptance
                # (CUDA events the device has not reached yet read as 0: never synchronised on)
                spans = (clock.spans() if isinstance(clock, RoundClock) else None) or [0.0, 0.0]
                logger.debug("DOMINO round %s bs %d L %d context %d %.2f ms (draft %.2f verify "
                             "%.2f) k %.2f alpha %.2f", kind, bs, block, context,
                             1e3 * (now - started), 1e3 * spans[0], 1e3 * spans[1],
                             calibration.scale(bs) if calibration else 1.0, self.policy.stats.alpha)
            if not kind.startswith("copy"):
                self.policy.observe_time(bs, block, now - started)
                self.report_cost_scale(bs, now)
        return now

    def report_cost_scale(self, bs: int, now: float) -> None:
        """Export the calibrated k at the batch size of the round just timed; log it when it
        moved by 10 % (at most once a minute)."""
        calibration = self.policy.calibration
        if calibration is None or not self.policy.enabled:
            return
        k = calibration.scale(bs)
        self.metrics.record_cost_scale(k)
        logged, at = self._logged_scale
        if abs(k - logged) > 0.1 * logged and now - at > 60.0:
            self._logged_scale = (k, now)
            logger.info("DOMINO cost calibration: this machine pays %.2fx the profile's "
                        "speculative overhead at bs %d (%d rounds timed)", k, bs,
                        calibration.rounds)

    def record_fallbacks(self, bs: int, block: int, capped: list[bool] | None) -> None:
        """Request-rounds decoded without speculation, by reason: `one_token_requests` (capped
        rows [bs] on the host, whatever L), `adaptive_policy` (the others, when the policy chose
        L = 1)."""
        if not self.metrics.enabled:
            return
        n_capped = 0 if capped is None else sum(map(bool, capped))
        self.metrics.record_fallback("one_token_requests", n_capped)
        if block == 1 and self.policy.enabled:
            self.metrics.record_fallback("adaptive_policy", bs - n_capped)

    # ---- sampling-time logit processing (what SGLang's sampler applies for plain decoding) ----
    def target_logits(self, batch, logits_output, grammar, grammar_barrier) -> torch.Tensor:
        """The verify logits [bs, B, V], processed in place in plain decoding's order
        (`ModelRunner._preprocess_logits`, then `Sampler._preprocess_logits`): penalties, grammar
        mask, logit bias, custom logit processors, NaN clean-up (temperature / top-k / top-p /
        min-p follow in verify_mixed). The grammar mask of chain position k is the grammar state
        after x_t, d_1..d_k (SGLang's `build_grammar_vocab_mask` over the chain, as DFLASH):
        a draft the grammar forbids has p = 0 and is never accepted nor recovered. The drafts
        themselves are not masked (that would need the host grammar per token); exactness does
        not need it. `grammar_barrier` advances the previous round's FSMs first.
        Penalties and history-reading processors are exact at chain index 0 only, which is all
        their requests commit (one_token_rows)."""
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

    def one_token_rows(self, batch) -> torch.Tensor | None:
        """one_token_flags as a [bs] bool device tensor (None when there are none)."""
        flags = self.one_token_flags(batch)
        return None if flags is None else torch.tensor(flags, device=self.device)

    def one_token_flags(self, batch) -> list[bool] | None:
        """[bs] bool on the host: requests that commit one token per round (the accepted draft
        or recovered token at chain index 0), or None when there are none. These are the
        requests whose logits depend on their own output so far: frequency / presence /
        repetition penalties, min_new_tokens, and custom logit processors (they read the
        request's output_ids through `custom_params["__req__"]`) other than SGLang's
        history-free disallowed-tokens one.

        Their state is per request, not per chain position: chain index k > 0 would need it
        after d_1..d_k. Committing exactly one token per round, fed back at the next round's
        start (algorithm.cumulate_penalties for the penalizers, as plain decoding's
        prepare_for_decode does; the request's own output_ids for the processors), keeps these
        requests exact; any accepted token is a valid sample of its position, so truncating
        the accepted prefix is lossless."""
        processors = batch.sampling_info.has_custom_logit_processor
        flags = [_has_penalty(r.sampling_params)
                 or (processors and _reads_history(r.custom_logit_processor))
                 for r in batch.reqs]
        if not any(flags):
            return None
        if "capped" not in self._warned:
            self._warned.add("capped")
            logger.info("DOMINO: requests with penalties, min_new_tokens or a history-reading "
                        "custom logit processor commit one token per round (exact, no "
                        "speculative speed-up)")
        return flags

    @staticmethod
    def seeds(batch) -> list[int | None]:
        """Each request's `sampling_seed` (None: a fresh random seed every round)."""
        return [r.sampling_params.sampling_seed for r in batch.reqs]

    def reseed_first_tokens(self, batch, out) -> None:
        """Redraw the prefill token of requests with a `sampling_seed` from their seed.

        SGLang's CPU/pytorch sampler ignores `sampling_seed` unless deterministic inference is
        on (whose seeded sampler is a Triton kernel), so without this the first token would not
        be reproducible. In the non-greedy path the sampler leaves softmax(processed logits / T)
        in `next_token_logits` (in place); top-k / top-p / min-p are applied here as it does.
        A redrawn row's returned logprob becomes log p(drawn), as the sampler computes it (its
        top / token-id logprobs do not depend on the draw). Under SGLANG_RETURN_ORIGINAL_LOGPROB
        (logprobs before temperature) batches with logprobs keep SGLang's draw."""
        info, seeds = batch.sampling_info, self.seeds(batch)
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

    # ---- steps of the round ----
    def block_slots(self, batch, prefix_lens: torch.Tensor, width: int) -> torch.Tensor:
        """KV slots of positions prefix .. prefix + width - 1 (reserved by prepare_for_decode),
        flat [bs * width] int64; a plain round (width 1) needs x_t's slot only: one gather."""
        req_to_token = self.model_runner.req_to_token_pool.req_to_token  # [R, pool_len] int32
        if width == 1:
            return req_to_token[batch.req_pool_indices, prefix_lens].to(torch.int64)
        return assign_extend_cache_locs_func(
            req_pool_indices=batch.req_pool_indices, req_to_token=req_to_token,
            start_offset=prefix_lens, end_offset=prefix_lens + width,
            batch_size=len(prefix_lens), draft_token_num=width, device=self.device,
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
        verify_input = DFlashVerifyInput(
            draft_token=chain.reshape(-1), positions=positions, draft_token_num=chain.shape[1],
            custom_mask=None, capture_hidden_mode=CaptureHiddenMode.FULL,
        )
        batch.out_cache_loc = slots
        with host_lens_grown(batch, chain.shape[1]):  # host bound = committed prefix + one block
            forward_batch, _ = verify_input.prepare_for_verify(batch, self._target_worker)
        out = self._target_worker.forward_batch_generation(
            batch=None, forward_batch=forward_batch, is_verify=True, skip_attn_backend_init=True)
        return out.logits_output, out.logits_output.hidden_states

    def decode_forward(self, batch, chain, slots):
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
            out = self._target_worker.forward_batch_generation(
                batch, is_verify=True, capture_hidden_mode=CaptureHiddenMode.FULL)
        return out.logits_output, out.logits_output.hidden_states

    def write_draft_context(self, target_hidden: torch.Tensor, positions: torch.Tensor,
                            slots: torch.Tensor) -> None:
        """Project target features [T, K*H] and write each draft layer's K/V at `slots`."""
        pool = self.draft_model_runner.token_to_kv_pool
        with torch.inference_mode():
            kvs = self.draft_model.drafter.context_kv(target_hidden, positions)
            for attn, (k, v) in zip(self.draft_model.attn, kvs):
                pool.set_kv_buffer(attn, KVWriteLoc(slots, physical=True), k, v)


def short_draft_from_env(trained: bool) -> bool:
    """Whether rounds verifying L < B tokens draft only those L (`propose`): by default as the
    drafter was trained (config `short_draft`); env DOMINO_SHORT_DRAFT=1 / 0 forces it on / off
    (measurement: benchmarks/round_cost.py --short-draft)."""
    value = os.environ.get("DOMINO_SHORT_DRAFT")
    if value is None:
        return trained
    if value not in ("0", "1"):
        raise ValueError(f"DOMINO_SHORT_DRAFT must be 0 or 1, got {value!r}")
    return value == "1"


def _reads_history(processor: str | None) -> bool:
    """Whether a request's serialized custom logit processor may read its output so far:
    any but SGLang's DisallowedTokensLogitsProcessor (`supports_sampling_mask`: a fixed ban)."""
    return bool(processor) and not supports_sampling_mask(processor)


def _has_penalty(params) -> bool:
    """A request whose logits depend on its own output so far (SGLang's penalizers)."""
    return (params.frequency_penalty != 0 or params.presence_penalty != 0
            or params.repetition_penalty != 1 or params.min_new_tokens > 0)
