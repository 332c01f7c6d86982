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

import functools
import logging

import torch
import torch.nn.functional as F

from domino_sglang import kernels, options
from domino_sglang.config import (
    ARCHITECTURE,
    check_against_target,
    load_draft_config,
    load_draft_weights,
)
from domino_sglang.context import DeferredContext
from domino_sglang.cpu import argmax as cpu_argmax
from domino_sglang.cpu import linear as cpu_linear
from domino_sglang.cpu import native as cpu_native
from domino_sglang.drafter import DominoDrafter
from domino_sglang.graphs import RolloutGraphs, verify_widths
from domino_sglang.lookup import PromptLookup
from domino_sglang.metrics import DominoMetrics
from domino_sglang.model import sglang_draft_model_class
from domino_sglang.observer import RoundObserver
from domino_sglang.planner import RoundPlan, RoundPlanner
from domino_sglang.pointer import CopyPaths, copy_index_on_device
from domino_sglang.policy import SpeculationPolicy, cost_model
from domino_sglang.proposer import DraftSlots, Proposal, Proposer
from domino_sglang.sampling import (
    RESAMPLE,
    RoundUniforms,
    SamplingRows,
    process_logits,
    sample_from,
    seeded_uniform,
)
from domino_sglang.sglang_compat import (
    BaseSpecWorker,
    CaptureHiddenMode,
    DFlashVerifyInput,
    ForwardMode,
    GenerationBatchResult,
    GrammarTree,
    KVWriteLoc,
    apply_custom_logit_processor,
    apply_scaling_penalties,
    assign_extend_cache_locs_func,
    batch_round_state,
    bound_runtime,
    build_draft_tp_worker,
    build_grammar_vocab_mask,
    compute_spec_logprobs,
    decode_graph_batch_sizes,
    free_device_memory,
    get_bool_env_var,
    get_spec,
    graph_batch_sizes,
    host_lens_grown,
    make_draft_input_v2,
    register_draft_architecture,
    sanitize_nan_logits,
    tp_all_gather,
    tp_broadcast,
    tp_shard,
    verify_graph_runtime,
)
from domino_sglang.tp import (
    RankAgreement,
    gathered_logits,
    pooled_logits,
    vocab_range,
    vocab_rows,
)
from domino_sglang.verify import Verdict, verify_greedy, verify_mixed
from domino_sglang.vocab import load_draft_vocab, load_draft_vocab_file

logger = logging.getLogger(__name__)
# Free device memory a per-width graph capture needs to start (SGLang's DFLASH asks the same
# before capturing its draft graphs)
RUNTIME_MIN_FREE = 1 << 30
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
        # the serving options (options.py), from this server's flags and the drafter's config
        self.options = opts = options.for_server(server_args, conf, self.block_size)

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
        embed = target_model.model.embed_tokens  # the target's, shared
        # On the CPU the head's small sequential GEMVs run faster in fp32 than in bf16
        # (docs/studies/head_cost.py); a few MB of weights.
        head_dtype = torch.float32 if torch.device(self.device).type == "cpu" else None
        # tensor parallel (tp.py): this rank's rows of the lm_head, ids [start, end); else all
        # of them but SGLang's padding (rows to a multiple of 64): the real vocabulary only
        self.shard = shard = tp_shard()  # None at TP size 1
        vocab_size = target_cfg.vocab_size
        if shard is None:
            lm_head = target_model.lm_head.weight[:vocab_size]  # [V, H]
        else:
            start, end = vocab_range(target_model.lm_head)
            lm_head = target_model.lm_head.weight  # [V_padded / N, H]
        head = self.draft_model.drafter.head(embed, lm_head, head_dtype,
                                             full_vocab=0 if shard is None else vocab_size)
        # the draft vocabulary (vocab.py): base logits over its Vd rows of the lm_head only
        vocab = (None if not opts.draft_vocab
                 else load_draft_vocab_file(opts.token_map, conf.vocab_size) if opts.token_map
                 else load_draft_vocab(conf.path, conf.vocab_size))
        head = head.with_vocab(vocab, None if shard is None or vocab is None else vocab_rows(
            lm_head, start, end, vocab.to(lm_head.device), shard.all_reduce))
        if torch.device(self.device).type == "cpu":  # the CPU runtime's exact, faster argmax
            kernels.install(argmax=cpu_argmax.argmax)
        if cpu_linear.is_active():  # the base logits of B-1 positions, packed (cpu/linear.py)
            rows = lm_head if head.vocab is None else head.vocab_lm_head
            head.base_linear = functools.partial(cpu_linear.packed_linear,
                                                 packed=cpu_linear.pack(rows))
            # the backbone's and context projection's linears, as the target's are
            drafter = self.draft_model.drafter
            cpu_linear.pack_linears(drafter.fc)
            cpu_linear.pack_linears(drafter.layers)
            cpu_native.fuse_drafter(drafter)  # bf16: its norms and rotary too
            head.native = cpu_native.native_head(head)  # bf16 target: greedy positions fused
        base_layout = "over replicated draft rows"  # what a TP round gathers (tp.py)
        if shard is not None and head.vocab is None:  # this rank's logits, gathered
            local = head.base_linear or functools.partial(F.linear, weight=lm_head)
            if opts.candidate_pool and opts.head:
                head.base_linear = pooled_logits(local, end - start, vocab_size,
                                                 opts.candidate_pool, tp_all_gather)
                base_layout = "gathered as the pool reads them"
            else:
                head.base_linear = gathered_logits(local, vocab_size, tp_all_gather)
                base_layout = "gathered whole"
        # a pointer-generator drafter (pointer.py): its copy gate, in the head's dtype, and each
        # running request's copy index, on the device (pointer.copy_index_on_device: CUDA by
        # default) or the host; copy off drafts from p alone (the gate unused)
        gate = self.draft_model.drafter.copy_gate if opts.copy else None
        gate = gate.to(head_dtype) if gate is not None and head_dtype else gate
        copy = None if gate is None else CopyPaths(
            gate, self.device,
            on_device=copy_index_on_device(self.device, opts.copy_index) or bool(opts.gpu_shape))
        if head.vocab is not None:
            logger.info("DOMINO draft vocabulary: %d of %d tokens (%s)",
                        len(head.vocab), conf.vocab_size, conf.path)
        self._block_offsets = torch.arange(self.block_size, device=self.device)
        self.metrics = DominoMetrics.for_scheduler(self.block_size, self.device)
        profile, cost = cost_model(torch.device(self.device).type,
                                   str(self.model_runner.dtype), override=opts.cost,
                                   short_draft=opts.short_draft)
        self.policy = SpeculationPolicy.from_config(opts, cost)  # adaptive off: fixed block
        self._plain_decode: bool | None = None  # see plain_decode_forward
        # the captured target verify runtimes by width (1 and the widths < B; B is the target's
        # own graphs; init_cuda_graphs), and whether the round is GPU-shaped (graphs.py)
        self.verify_runtimes: dict[int, tuple] = {}
        self.gpu_shaped = False
        # the round's stages besides the worker's own: the plan (L, copies; planner.py), the
        # proposers (proposer.py: the Domino drafter, then prompt lookup over its rows) and what
        # the round teaches the metrics and the policy (observer.py)
        self.drafter = DominoDrafter(self.draft_model_runner, embed, head, copy, opts,
                                     self.block_size, self.device, self.metrics)
        lookup = (PromptLookup(self.block_size, conf.mask_token_id, self.device, head.vocab_size)
                  if opts.lookup else None)  # off: Domino drafts only
        self.proposers: tuple[Proposer, ...] = (self.drafter,) + ((lookup,) if lookup else ())
        self.planner = RoundPlanner(self.policy, self.block_size, self.device, lookup)
        # (the planner's widths: every L until init_cuda_graphs knows the captured ones)
        # (every rank's policy learns from rank 0's round times: tp.py)
        self.observer = RoundObserver(self.metrics, self.policy, RankAgreement(tp_broadcast()))
        # plain rounds' draft-context writes, batched until a draft pass needs them (context.py)
        self.context = DeferredContext(self.write_draft_context)
        self.sync_log = opts.sync_log  # counted rounds (measurement, tests)
        logger.info("DOMINO worker: block %d, %d draft layers, target layers %s, pool %s, head %s, "
                    "copy %s, draft pass %s, prompt lookup %s, policy %s (cost profile %s: %s), "
                    "%s", self.block_size,
                    conf.num_layers, list(conf.target_layer_ids),
                    opts.candidate_pool or "full vocabulary", "on" if opts.head else "OFF",
                    "on" if copy is not None else "off",
                    "L tokens" if opts.short_draft else "whole block",
                    "on" if lookup else "off",
                    "adaptive" if self.policy.enabled else "fixed block", profile, cost,
                    "one rank" if shard is None else
                    f"tensor parallel rank {shard.rank} of {shard.size} (draft layers "
                    f"{conf.num_heads // shard.size} heads each, base logits "
                    f"{base_layout})")

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
        """After the target's graphs (the scheduler's order), where SGLang captured decode
        graphs (CUDA, no --disable-cuda-graph), at the batch sizes it captured: the draft pass
        by SGLang's own draft graph runner (TARGET_VERIFY at width B, as its DFLASH worker
        does) and per smaller draft width, the head rollout's start-up runners (graphs.py),
        and a target verify runtime per captured width below B (graphs.verify_widths: plain
        rounds at width 1). Rounds then verify only at those widths (the planner rounds L up).
        `--speculative-domino-debug-gpu-shape on` takes every one of these decisions where no
        graphs run (the CPU): the same buckets, widths and start-up runners, run eagerly.
        UNVERIFIED on a GPU: no session that wrote it had one (README, GPU)."""
        captured = decode_graph_batch_sizes(self.device)
        gpu_shape = bool(captured) if self.options.gpu_shape is None else self.options.gpu_shape
        drafter, opts = self.drafter, self.options
        drafter.graph_bs = captured
        self._draft_worker.init_cuda_graphs(capture_decode_cuda_graph=bool(captured))
        if not gpu_shape:
            return
        self.gpu_shaped = True
        buckets = graph_batch_sizes(self.model_runner, captured)
        widths = verify_widths(self.block_size)
        self.planner.widths = self.policy.widths = widths
        copy = drafter.copy
        graphs = drafter.rollout_graphs = RolloutGraphs(
            drafter.head, self.block_size, self.conf.hidden_size, self.draft_model_runner.dtype,
            self.device, candidate_pool=opts.candidate_pool, use_head=opts.head,
            temperature_scale=opts.draft_temperature_scale,
            copy_gate=copy.gate if copy is not None and copy.on_device else None,
            history_cap=self.model_runner.model_config.context_len,
            capture=bool(captured), buckets=buckets)
        need = graphs.buffer_bytes()
        free = free_device_memory(self.device)
        logger.info("DOMINO: CUDA-graph shapes: batch buckets %s, verify widths %s; %.1f MB of "
                    "static rollout buffers outside SGLang's reservation (%s free)",
                    list(buckets), list(widths), need / 2**20,
                    "n/a" if free is None else f"{free / 2**20:.0f} MB")
        if free is not None and need > free:
            raise RuntimeError(
                f"DOMINO: the head rollout's static buffers need {need / 2**20:.0f} MB but "
                f"{free / 2**20:.0f} MB of device memory is free: lower --mem-fraction-static "
                f"(or --max-running-requests, or --disable-cuda-graph)")
        built = graphs.capture_startup()
        logger.info("DOMINO: %d head-rollout runners built at start-up (%s)", built,
                    "CUDA graphs" if captured else "run eagerly: no CUDA graphs here")
        if not captured:
            return
        for width in widths:
            if width < self.block_size:
                self.capture_runtime(self.verify_runtimes, self.model_runner, width, "verify")
                if opts.short_draft and width > 1:
                    self.capture_runtime(drafter.runtimes, self.draft_model_runner, width,
                                         "draft pass")
        logger.info("DOMINO: target verify CUDA graphs captured at widths %s, draft pass at %s",
                    sorted(self.verify_runtimes) + [self.block_size],
                    sorted(drafter.runtimes) + [self.block_size])

    def capture_runtime(self, runtimes: dict, model_runner, width: int, what: str) -> None:
        """Capture `model_runner`'s graphs at `width` into runtimes[width], logging the device
        memory they took (outside SGLang's reservation; known only once captured). A width
        whose capture fails, or that would start with less than RUNTIME_MIN_FREE free, is
        served eagerly (exact, slower; counted in domino_eager_rounds_total) and said, rather
        than refusing to start: these graphs are an optimisation."""
        before = free_device_memory(self.device)
        if before is not None and before < RUNTIME_MIN_FREE:
            logger.warning("DOMINO: %.0f MB free: the %s CUDA graphs at width %d are not "
                           "captured (rounds at that width run eagerly); lower "
                           "--mem-fraction-static to leave room", before / 2**20, what, width)
            return
        try:
            runtimes[width] = verify_graph_runtime(model_runner, width)
        except Exception:  # noqa: BLE001 (any capture failure: the eager path stays correct)
            logger.exception("DOMINO: could not capture the %s CUDA graphs at width %d; rounds "
                             "at that width run eagerly", what, width)
            return
        after = free_device_memory(self.device)
        if before is not None and after is not None:
            logger.info("DOMINO: %s CUDA graphs at width %d took %.1f MB", what, width,
                        (before - after) / 2**20)

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
        tell a DECODE batch apart, so L = 1 verifies one token through the width-1 runtime there
        (and under --speculative-domino-debug-gpu-shape on, eagerly).
        --speculative-domino-debug-plain-decode off forces the verify path
        (benchmarks/round_cost.py --plain-verify)."""
        if self._plain_decode is None:
            graphs = getattr(self.model_runner, "decode_cuda_graph_runner", None)
            self._plain_decode = (graphs is None and not self.options.gpu_shape
                                  and self.options.plain_decode)
        return self._plain_decode

    # ---- the work ----
    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None,
                                 pp_proxy_tensors=None) -> GenerationBatchResult:
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            return self.prefill(batch, on_publish)
        if self.sync_log is not None:  # --speculative-domino-debug-sync-log (test_sync_budget)
            return self.counted_decode_round(batch, on_publish, grammar_barrier)
        return self.decode_round(batch, on_publish, grammar_barrier)

    def counted_decode_round(self, batch, on_publish, grammar_barrier) -> GenerationBatchResult:
        """decode_round under a host-sync counter (syncs.py); one JSON line per round to the file
        of --speculative-domino-debug-sync-log: the round's kind, batch size, L, whether it
        sampled / used the pointer copy path, and the synchronisations by origin and kind
        (domino sites included)."""
        import json

        from domino_sglang.syncs import SyncCounter

        sampled = not bool((batch.sampling_info.top_ks <= 1).all())  # outside the count
        with SyncCounter() as counter:
            counter.host(batch.seq_lens_cpu)  # SGLang's host copy of the lengths
            out = self.decode_round(batch, on_publish, grammar_barrier)
        bs, block, kind = self.observer.last_round
        line = {"kind": kind, "bs": bs, "L": block, "sampled": sampled,
                "pointer": self.observer.last_pointer,
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
        self.observer.skip_timing()  # the decode round before this prefill is not timed
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
                      (W = B; W = L for a drafter trained on short blocks: drafter.py)
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
        The round verifies only the first L <= B chain tokens; L = 1 is a plain decoding round
        (no draft pass; the target's DECODE forward over [x_t]). L, the copied rows and whether
        the drafter runs are decided once, by the planner (planner.py: seeds, one-token rows,
        the adaptive policy, prompt lookup), and handed on as a RoundPlan; the observer
        (observer.py) then feeds the metrics, the policy's estimates and its cost calibration.
        """
        started, clock = self.observer.start_round()
        plan = self.planner.plan(batch)  # L, the copied rows, draft pass or not (planner.py)
        bs, block, prefix_lens = len(batch.reqs), plan.length, batch.seq_lens  # x_t not counted
        self.observer.record_fallbacks(bs, block, plan.capped_host)
        self.context.before_round(tuple(r.rid for r in batch.reqs), speculative=block > 1)
        at = self.open_chain(batch, plan, prefix_lens)
        proposal = Proposal()
        for proposer in self.proposers:  # 1-2: the drafter, then prompt lookup over its rows
            proposal = proposer.propose(batch, plan, at, proposal)
        chain, positions = at.chain[:, :block].contiguous(), at.positions[:, :block].reshape(-1)
        slots = at.slots[:, :block].reshape(-1)
        clock.mark()  # drafted
        logits_output, hidden, logits = self.verify(batch, plan, chain, positions, slots,
                                                    grammar_barrier)  # 3
        verdict = self.accept(plan, chain, logits, proposal, at.rows, at.u)  # 4
        clock.mark()  # verified
        new_seq_lens = self.commit(batch, plan, prefix_lens, verdict, logits_output, hidden,
                                   positions, slots, on_publish)  # 5
        self.observer.record(batch, plan, proposal, chain, verdict, started, clock)
        tokens, accept_lens = verdict.tokens, verdict.accept_lens
        bonus = tokens.gather(1, (accept_lens - 1)[:, None]).squeeze(1)
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=tokens.reshape(-1),
            accept_lens=accept_lens.to(torch.int32),
            can_run_cuda_graph=False,
            next_draft_input=make_draft_input_v2(bonus_tokens=bonus, new_seq_lens=new_seq_lens),
            speculative_num_draft_tokens=block,
            new_seq_lens=new_seq_lens,
        )

    # ---- the stages of the round ----
    def open_chain(self, batch, plan: RoundPlan, prefix_lens: torch.Tensor) -> DraftSlots:
        """The round's chain [bs, B] = [x_t, MASK x (B-1)], its positions [bs, B] and KV slots
        [bs, B] ([bs, 1] in a plain round: x_t's only); in a sampled round each request's
        sampling transform and the round's coins."""
        bs = len(batch.reqs)
        chain = torch.full((bs, self.block_size), self.conf.mask_token_id, dtype=torch.int64,
                           device=self.device)
        chain[:, 0] = batch.spec_info.bonus_tokens
        positions = prefix_lens[:, None] + self._block_offsets  # [bs, B]
        slots = self.block_slots(batch, prefix_lens, self.block_size if plan.length > 1 else 1)
        if not plan.sampled:
            return DraftSlots(chain, positions, slots.view(bs, -1))
        rows = SamplingRows.from_sampling_info(batch.sampling_info, plan.seeds)
        u = RoundUniforms.for_round(rows.seed, prefix_lens, plan.length)
        return DraftSlots(chain, positions, slots.view(bs, -1), rows, u)

    def verify(self, batch, plan: RoundPlan, chain, positions, slots, grammar_barrier):
        """3. The target's forward over the chain [bs, L]: (its output, the drafter's target-layer
        features, the verify logits [bs, L, V] processed as plain decoding's). A plain round runs
        the target's own DECODE forward where it can (plain_decode_forward)."""
        grammar = GrammarTree.from_linear_chain(chain) if batch.has_grammar else None
        if plan.length == 1 and self.plain_decode_forward:
            logits_output, hidden = self.decode_forward(batch, chain, slots)
        else:  # at a captured width (the planner's), through its runtime where one was captured
            runtime = self.verify_runtimes.get(plan.length)
            # the GPU shape: widths are captured ones
            if self.gpu_shaped and (plan.length not in self.planner.widths or (
                    self.drafter.graph_bs and runtime is None and plan.length < self.block_size)):
                self.metrics.record_eager("verify_width")
            with bound_runtime(self.model_runner, runtime):
                logits_output, hidden = self.verify_forward(batch, chain, positions, slots)
        logits = self.target_logits(batch, logits_output, grammar, grammar_barrier)  # [bs,L,V]
        return logits_output, hidden, logits

    def accept(self, plan: RoundPlan, chain, logits, proposal: Proposal, rows, u) -> Verdict:
        """4. Greedy: the longest matching prefix; sampled: exact rejection sampling against q
        (verify.py). One-token rows then commit their first token only."""
        target_choice = None
        if plan.sampled:
            q = (proposal.q if plan.length > 1
                 else logits.new_zeros(logits.shape[0], 0, logits.shape[-1]))
            tokens, accept_lens = verify_mixed(chain, logits, q, rows, u)
        else:
            target_choice = kernels.argmax(logits)  # [bs, L]
            tokens, accept_lens = verify_greedy(chain, target_choice)
        judged = accept_lens  # the verifier's verdict, what the policy learns from
        if plan.capped is not None:
            accept_lens = torch.where(plan.capped, torch.ones_like(accept_lens), accept_lens)
        return Verdict(tokens, accept_lens, judged, target_choice)

    def commit(self, batch, plan: RoundPlan, prefix_lens, verdict: Verdict, logits_output,
               hidden, positions, slots, on_publish) -> torch.Tensor:
        """5. The new lengths [bs] (published), the committed tokens' logprobs and the chain's
        target features into the draft KV cache. Features of every chain position are written;
        only the accepted ones (< new_seq_len) are ever read, the rest are overwritten by the
        next block at the same slots. A plain round's wait for the next draft pass (context.py)."""
        if batch.return_logprob:  # logprobs of chain row b*L + j for committed token (b, j)
            compute_spec_logprobs(batch, logits_output, verdict.tokens.reshape(-1),
                                  chain_stride=plan.length)
        new_seq_lens = prefix_lens + verdict.accept_lens.to(prefix_lens.dtype)
        if on_publish is not None:
            on_publish(new_seq_lens)
        if plan.length == 1:
            self.context.defer(hidden, positions, slots)
        else:
            self.write_draft_context(hidden, positions, slots)
        logits_output.hidden_states = None
        return new_seq_lens

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
