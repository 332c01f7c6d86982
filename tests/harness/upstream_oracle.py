"""SGLang 0.5.23's own Domino drafter (`DFlashDraftModel` + `domino_greedy_rollout`) run on CPU,
as the oracle of tests/model/test_upstream_equivalence.py, plus the attention both sides share.

Run as a subprocess (`python -m tests.harness.upstream_oracle CASE.pt OUT.pt`): building SGLang's
model publishes a process-wide runtime context and a torch.distributed group (gloo, world size 1),
which must not leak into the pytest process. CASE.pt holds the drafter folder, the inputs and
the candidate pools (tensors and plain values only: loaded with weights_only=True).

Upstream's CPU paths are pinned to their torch-native forms (`forward_native` of RMSNorm and
RoPE, what a CPU without AMX runs), so nothing of this project's CPU kernels enters the oracle.
Attention is the one thing swapped: each `RadixAttention` is replaced by `reference_attention`
over [context K/V of the layer ; the block's own K/V], the same function our side calls.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Non-causal attention of q [T, Hq, D] over k, v [S, Hkv, D] (GQA), scale D^-0.5, in
    float64 so that both sides get the same output from the same inputs -> [T, Hq, D]."""
    rep = q.shape[1] // k.shape[1]
    kk = k.double().repeat_interleave(rep, dim=1)  # [S, Hq, D]
    vv = v.double().repeat_interleave(rep, dim=1)
    scores = torch.einsum("thd,shd->hts", q.double(), kk) * q.shape[-1] ** -0.5  # [Hq, T, S]
    return torch.einsum("hts,shd->thd", scores.softmax(-1), vv).to(q.dtype)


def _publish(target_path: str) -> None:
    from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    publish(ServerArgs(model_path=target_path, device="cpu"), role="test",
            ranks=SpawnRanks(world_rank=0))
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")
    initialize_model_parallel()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(case: dict) -> dict:
    import sglang.srt.layers.layernorm as layernorm
    import sglang.srt.layers.rotary_embedding.base as rope_base
    from safetensors.torch import load_file
    from sglang.srt.models.dflash import DFlashDraftModel
    from sglang.srt.speculative.domino_utils import domino_greedy_rollout
    from transformers import PretrainedConfig

    layernorm._is_cpu_amx_available = False  # torch-native RMSNorm
    rope_base._is_cpu_amx_available = False  # torch-native RoPE
    folder = Path(case["drafter"])
    cfg = PretrainedConfig(**json.loads((folder / "config.json").read_text()))
    model = DFlashDraftModel(cfg).float().eval()
    model.load_weights(iter(load_file(str(folder / "model.safetensors")).items()))
    model.float()

    # context: projection, then per layer K/V exactly as dflash_worker_v2 materialises them
    ctx_pos = case["ctx_positions"]
    with torch.no_grad():
        ctx = model.project_target_hidden(case["features"])  # [T, H]
        ctx_kv = []
        for layer in model.layers:
            attn = layer.self_attn
            k, v = attn.kv_proj_only(ctx)
            k = attn.apply_k_rope(ctx_pos, attn.apply_k_norm(k))
            ctx_kv.append((k.view(len(ctx_pos), -1, attn.head_dim),
                           v.view(len(ctx_pos), -1, attn.head_dim)))

    class Swapped(torch.nn.Module):
        def __init__(self, layer_id: int, heads: int, head_dim: int):
            super().__init__()
            self.layer_id, self.heads, self.head_dim = layer_id, heads, head_dim

        def forward(self, q, k, v, forward_batch=None, **kwargs):
            t = q.shape[0]
            ck, cv = ctx_kv[self.layer_id]
            kk = torch.cat([ck, k.reshape(t, -1, self.head_dim)])
            vv = torch.cat([cv, v.reshape(t, -1, self.head_dim)])
            out = reference_attention(q.reshape(t, self.heads, self.head_dim), kk, vv)
            return out.reshape(t, -1)

    for i, layer in enumerate(model.layers):
        a = layer.self_attn
        a.attn = Swapped(i, a.num_heads, a.head_dim)
    with torch.no_grad():
        z = model(input_ids=None, positions=case["block_positions"], forward_batch=None,
                  input_embeds=case["block_embeds"]).hidden_states  # [B, H]

    embed = torch.nn.Embedding.from_pretrained(case["embed"], freeze=True)
    chains = {}
    for pool in case["pools"]:
        chains[pool] = domino_greedy_rollout(
            draft_hidden=case["rollout_z"], bonus_tokens=case["bonus"], target_embedding=embed,
            lm_head_weight=case["lm_head"], prefix_gru=model.prefix_gru,
            embed_proj=model.embed_proj, vocab_size=case["lm_head"].shape[0],
            shift_label=bool(model.shift_label), candidate_pool_size=pool, in_cuda_graph=False)
    return {"ctx": ctx, "ctx_kv": ctx_kv, "z": z, "chains": chains,
            "block_size": int(model.block_size), "num_context_features":
            int(model.num_context_features)}


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    case = torch.load(argv[0], weights_only=True)
    _publish(case["target_path"])
    torch.save(run(case), argv[1])
    return 0


if __name__ == "__main__":
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    raise SystemExit(main(sys.argv[1:]))
