"""The SGLang worker of DOMINO: its lifecycle, prefill feature capture and the batched decode round.

Its parts are assembled once (build.py) and its graphs captured once (capture.py); the target's
side of a round is target.py. Composed from SGLang pieces rather than subclassing its
3,000-line DFlash worker:
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
them and is checked against the installed SGLang by tests/integration/test_sglang_compat.py.
"""

from __future__ import annotations

import torch

from domino_sglang.integration.build import build_round
from domino_sglang.integration.capture import capture_graphs
from domino_sglang.integration.target import (
    block_slots,
    decode_forward,
    reseed_first_tokens,
    target_logits,
    verify_forward,
)
from domino_sglang.sglang_compat import (
    BaseSpecWorker,
    CaptureHiddenMode,
    GenerationBatchResult,
    GrammarTree,
    KVWriteLoc,
    bound_runtime,
    compute_spec_logprobs,
    make_draft_input_v2,
)
from domino_sglang.spec import primitives
from domino_sglang.spec.context import DeferredContext
from domino_sglang.spec.plan import RoundPlan
from domino_sglang.spec.proposers.protocol import DraftSlots, Proposal
from domino_sglang.spec.sampling import RoundUniforms, SamplingRows
from domino_sglang.spec.tree import DraftTree, follow, target_choices
from domino_sglang.spec.verify import Verdict, verify_greedy, verify_mixed


class DominoWorker(BaseSpecWorker):
    """Drafts a block per request in one backbone pass, refines it with the head, verifies."""

    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker, **_):
        super().__init__()
        self.server_args = server_args
        self._target_worker = target_worker
        self.model_runner = target_worker.model_runner
        self.device = target_worker.device
        parts = build_round(server_args, gpu_id, nccl_port, target_worker)  # build.py
        self.block_size, self.conf, self.options = parts.block_size, parts.conf, parts.options
        self._draft_worker = parts.draft_worker
        self.draft_model_runner, self.draft_model = parts.draft_model_runner, parts.draft_model
        self.parts = parts
        # the round's stages besides the worker's own: the plan (L, copies; planner.py), the
        # proposers (the Domino drafter, then prompt lookup over its rows) and what the round
        # teaches the metrics and the policy (observer.py)
        self.metrics, self.policy = parts.metrics, parts.policy
        self.draft_pass, self.drafter, self.proposers = (parts.draft_pass, parts.drafter,
                                                          parts.proposers)
        self.planner, self.observer = parts.planner, parts.observer
        self._block_offsets = torch.arange(self.block_size, device=self.device)
        self._plain_decode: bool | None = None  # see plain_decode_forward
        # the captured target verify runtimes by width (1 and the widths < B; B is the target's
        # own graphs; init_cuda_graphs), and whether the round is GPU-shaped (capture.py)
        self.verify_runtimes: dict[int, tuple] = {}
        self.gpu_shaped = False
        # plain rounds' draft-context writes, batched until a draft pass needs them (context.py)
        self.context = DeferredContext(self.write_draft_context)
        self.sync_log = self.options.sync_log  # counted rounds (measurement, tests)

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
        """After the target's graphs (the scheduler's order): the round's graphs (capture.py)."""
        self.gpu_shaped = capture_graphs(self.parts, self.model_runner, self.device,
                                         self.verify_runtimes)

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

        from domino_sglang.spec.syncs import SyncCounter

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
        flat = torch.arange(sum(batch.extend_lens), device=self.device)  # host lengths: no sync
        positions = torch.repeat_interleave(prefix - first, extend) + flat
        self.write_draft_context(out.logits_output.hidden_states, positions, batch.out_cache_loc)
        out.logits_output.hidden_states = None
        reseed_first_tokens(batch, out)
        out.next_draft_input = make_draft_input_v2(bonus_tokens=out.next_token_ids,
                                                   new_seq_lens=batch.seq_lens)
        return out

    def decode_round(self, batch, on_publish, grammar_barrier=None) -> GenerationBatchResult:
        """One round for every running request (bs of them, block size B):

          1. draft:   z = backbone([x_t, MASK x (W-1)] | context K/V)        one pass, all blocks
                      (W = B; W = L for a drafter trained on short blocks: proposers/domino.py)
                      a request an offering proposer found drafts its offer instead (prompt
                      lookup: what followed its recurring suffix; proposers/); no pass if all do
          2. refine:  d_1 = argmax base_0; d_{i+1} = argmax(base_i + head(z_i, GRU(x_t, d_1..d_i)))
                      (sampled batches: d_{i+1} ~ q_i, the same logits after the request's
                      sampling transform; the GRU consumes the sampled token)
          3. verify:  logits of p(. | prefix, x_t, d_1..d_{B-1}), one target pass, then the
                      request's penalties / logit bias / grammar mask
          4. accept:  greedy: a = longest k with d_1..d_k == y_0..y_{k-1}; commit y_0..y_a
                      sampled: exact rejection sampling (verify.py; offered drafts with a
                      one-hot q); either way a + 1 tokens
          5. commit:  seq_len += a + 1; the target features of the committed tokens enter the
                      draft KV cache, so the next block sees them as context (a plain round's
                      are held and written in one batch before the next draft pass)
        The round verifies only the first L <= B chain tokens; L = 1 is a plain decoding round
        (no draft pass; the target's DECODE forward over [x_t]). L, the offered rows and whether
        the drafter runs are decided once, by the planner (planner.py: seeds, one-token rows,
        the adaptive policy, the offering proposers), and handed on as a RoundPlan; the observer
        (observer.py) then feeds the metrics, the policy's estimates and its cost calibration.
        """
        started, clock = self.observer.start_round()
        plan = self.planner.plan(batch)  # L, the offered rows, draft pass or not (planner.py)
        bs, length, prefix_lens = len(batch.reqs), plan.length, batch.seq_lens  # x_t uncounted
        self.observer.record_fallbacks(bs, length, plan.capped_host)
        self.context.before_round(tuple(r.rid for r in batch.reqs), speculative=length > 1)
        at = self.open_chain(batch, plan, prefix_lens)
        proposal = Proposal()
        for proposer in self.proposers:  # 1-2: the drafter, then the offers over its rows
            proposal = proposer.propose(batch, plan, at, proposal)
        chain, positions = at.chain[:, :length].contiguous(), at.positions[:, :length].reshape(-1)
        slots = at.slots[:, :length].reshape(-1)
        clock.mark()  # drafted
        logits_output, hidden, logits = self.verify(batch, plan, chain, positions, slots,
                                                    grammar_barrier, proposal.tree)  # 3
        verdict = self.accept(plan, chain, logits, proposal, at, prefix_lens)  # 4
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
            speculative_num_draft_tokens=length,
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
        slots = block_slots(self.model_runner, batch, prefix_lens,
                            self.block_size if plan.length > 1 else 1, self.device)
        if not plan.sampled:
            return DraftSlots(chain, positions, slots.view(bs, -1))
        rows = SamplingRows.from_sampling_info(batch.sampling_info, plan.seeds,
                                               plan.top_k_bounded, plan.top_k_width)
        u = RoundUniforms.for_round(rows.seed, prefix_lens, plan.length)
        return DraftSlots(chain, positions, slots.view(bs, -1), rows, u)

    def verify(self, batch, plan: RoundPlan, chain, positions, slots, grammar_barrier,
               tree: DraftTree | None = None):
        """3. The target's forward over the chain [bs, L]: (its output, the drafter's target-layer
        features, the verify logits [bs, L, V] processed as plain decoding's). A plain round runs
        the target's own DECODE forward where it can (plain_decode_forward); a tree round
        verifies its nodes under the tree's mask, eagerly (no graphs are captured for trees)."""
        grammar = GrammarTree.from_linear_chain(chain) if batch.has_grammar else None
        if plan.length == 1 and self.plain_decode_forward:
            logits_output, hidden = decode_forward(self._target_worker, batch, chain, slots)
        elif tree is not None:
            prefix_sum = int((batch.seq_lens_cpu if batch.seq_lens_cpu is not None
                              else batch.seq_lens).sum())
            with bound_runtime(self.model_runner, None):
                logits_output, hidden = verify_forward(
                    self._target_worker, batch, chain, positions, slots,
                    tree.custom_mask(batch.seq_lens, prefix_sum))
        else:  # at a captured width (the planner's), through its runtime where one was captured
            runtime = self.verify_runtimes.get(plan.length)
            # the GPU shape: widths are captured ones
            uncaptured = (self.draft_pass.graph_bs and runtime is None
                          and plan.length < self.block_size)
            if self.gpu_shaped and (plan.length not in self.planner.widths or uncaptured):
                self.metrics.record_eager("verify_width")
            with bound_runtime(self.model_runner, runtime):
                logits_output, hidden = verify_forward(self._target_worker, batch, chain, positions,
                                                       slots)
        logits = target_logits(batch, logits_output, grammar, grammar_barrier)  # [bs, L, V]
        return logits_output, hidden, logits

    def accept(self, plan: RoundPlan, chain, logits, proposal: Proposal, at: DraftSlots,
               prefix_lens) -> Verdict:
        """4. Greedy: the longest matching prefix; sampled: exact rejection sampling against q
        (verify.py). One-token rows then commit their first token only. A tree: the path the
        target's own choices follow (tree.py), greedy or sampled."""
        target_choice, rows, u = None, at.rows, at.u
        if proposal.tree is not None:
            choice = target_choices(logits, proposal.tree.depths, prefix_lens,
                                    rows if plan.sampled else None)  # [bs, L]
            tokens, accept_lens, path = follow(proposal.tree, choice)
            both, accept_lens, judged = self.parts.agree.same_verdict(
                torch.cat((tokens, path), dim=1), accept_lens, accept_lens, plan.sampled)
            return Verdict(both[:, :plan.length], accept_lens, judged, None,
                           both[:, plan.length:])
        if plan.sampled:
            q = (proposal.q if plan.length > 1
                 else logits.new_zeros(logits.shape[0], 0, logits.shape[-1]))
            tokens, accept_lens = verify_mixed(chain, logits, q, rows, u)
        else:
            target_choice = primitives.argmax(logits)  # [bs, L]
            tokens, accept_lens = verify_greedy(chain, target_choice)
        judged = accept_lens  # the verifier's verdict, what the policy learns from
        # rank 0's on every TP rank where SGLang's SGLANG_SPEC_TP_SYNC asks it (tp.py)
        tokens, accept_lens, judged = self.parts.agree.same_verdict(tokens, accept_lens, judged,
                                                                    plan.sampled)
        if plan.capped is not None and plan.length > 1:  # a plain round commits one anyway
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
        if verdict.path is not None:  # a tree: the accepted path to positions prefix .. + a
            hidden, positions, slots = self.settle_tree(batch, prefix_lens, verdict, hidden,
                                                        slots)
        if plan.length == 1:
            self.context.defer(hidden, positions, slots)
        else:
            self.write_draft_context(hidden, positions, slots)
        logits_output.hidden_states = None
        return new_seq_lens

    def settle_tree(self, batch, prefix_lens, verdict: Verdict, hidden, slots):
        """A tree round's nodes sit at the block's slots in node order; the accepted path's
        must be positions prefix .. prefix + a. Their K/V stay where they are: the request's
        req_to_token points positions prefix .. prefix + L - 1 at the block's own slots in a
        new order, the path's nodes first (depth by depth), then the others (their positions
        lie past the new length: overwritten by the next round). Returns the target features,
        positions and slots [bs * L] in that order, for the draft context."""
        path = verdict.path  # [bs, L]
        bs, n = path.shape
        at = torch.arange(n, device=path.device)
        key = (n + at).repeat(bs, 1)  # nodes off the path after it, in node order
        key.scatter_reduce_(1, path, at.expand(bs, n), reduce="amin")  # path node k: key k
        order = key.argsort(dim=1)  # [bs, L] the node at each position
        slots = slots.view(bs, n).gather(1, order)
        positions = prefix_lens.long()[:, None] + at  # [bs, L]
        req_to_token = self.model_runner.req_to_token_pool.req_to_token
        req_to_token[batch.req_pool_indices.long()[:, None], positions] = slots.to(
            req_to_token.dtype)
        hidden = hidden.view(bs, n, -1)
        hidden = hidden.gather(1, order[..., None].expand(-1, -1, hidden.shape[-1]))
        return hidden.reshape(bs * n, -1), positions.reshape(-1), slots.reshape(-1)

    def write_draft_context(self, target_hidden: torch.Tensor, positions: torch.Tensor,
                            slots: torch.Tensor) -> None:
        """Project target features [T, K*H] and write each draft layer's K/V at `slots`."""
        pool = self.draft_model_runner.token_to_kv_pool
        with torch.inference_mode():
            kvs = self.draft_model.drafter.context_kv(target_hidden, positions)
            for attn, (k, v) in zip(self.draft_model.attn, kvs):
                pool.set_kv_buffer(attn, KVWriteLoc(slots, physical=True), k, v)

