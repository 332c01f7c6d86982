"""Our drafter equals SGLang 0.5.23's own Domino path number for number (float32, CPU).

One random-weight checkpoint of the released Qwen3-8B Domino layout
(tests/harness/released_drafters.py: verbatim config, sizes scaled down, `model.`-prefixed weights)
is loaded twice: by our loader (model/config.py, model/drafter.py) and by SGLang's
`DFlashDraftModel` (upstream_oracle.py, in a subprocess). Attention on both sides is the same
`reference_attention`; everything else is each side's own code. These tests pin what upstream does:
when SGLang changes its drafter, the first one that fails says where.

Each test's docstring names the one-line change to our code it was shown to catch (run by hand,
then reverted). Float32 only: upstream's bf16 path (fused table_qk_norm_rope, Triton) is not
compared here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from domino_sglang.model.config import load_draft_config
from domino_sglang.model.drafter import DominoDrafter
from domino_sglang.spec.rollout import HeadParams, greedy_rollout
from tests.harness.released_drafters import released, scaled, write_released_drafter
from tests.harness.upstream_oracle import reference_attention

ROOT = Path(__file__).resolve().parents[2]
# vocab 1024 > pool 256, so the candidate pool really prunes; 8 target layers -> ids [1, 5]
SIZES = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=96, layers=2,
             vocab=1024, gru=32, emb=16, target_layers=8, mask_token_id=0)
POOLS = (0, 256)
T_CTX, BLOCK, BS = 7, 16, 4


@pytest.fixture(scope="module")
def pair(tmp_path_factory, target_path):
    """(ours, upstream's outputs, inputs) for one checkpoint; upstream runs once."""
    tmp = tmp_path_factory.mktemp("upstream")
    folder = tmp / "drafter"
    write_released_drafter(folder, scaled(released("qwen3-8b-domino.json"), **SIZES), seed=3)
    # make the head matter (random init leaves it ~0): a correction as large as the base
    # logits, and a GRU state that moves it (so that a wrong feed changes the chain)
    w = load_file(str(folder / "model.safetensors"))
    for name, scale in (("prefix_gru.weight_ih_l0", 20.0), ("prefix_gru.weight_hh_l0", 20.0),
                        ("embed_proj.0.weight", 10.0), ("embed_proj.2.weight", 20.0)):
        w["model." + name] *= scale
    save_file(w, str(folder / "model.safetensors"))
    g = torch.Generator().manual_seed(5)
    h, v = SIZES["hidden"], SIZES["vocab"]
    case = {
        "drafter": str(folder), "target_path": str(target_path), "pools": list(POOLS),
        "features": torch.randn(T_CTX, 2 * h, generator=g),
        "ctx_positions": torch.arange(T_CTX),
        "block_embeds": torch.randn(BLOCK, h, generator=g),
        "block_positions": torch.arange(T_CTX, T_CTX + BLOCK),
        "embed": torch.randn(v, h, generator=g),
        "lm_head": torch.randn(v, h, generator=g) * 0.2,
        "rollout_z": torch.randn(BS, BLOCK, h, generator=g),
        "bonus": torch.randint(0, v, (BS,), generator=g),
    }
    torch.save(case, tmp / "case.pt")
    env = {"PYTHONPATH": f"{ROOT}", "OMP_NUM_THREADS": "1", "SGLANG_USE_CPU_ENGINE": "1",
           "PATH": "/usr/bin:/bin"}
    oracle = [sys.executable, "-m", "tests.harness.upstream_oracle"]
    proc = subprocess.run([*oracle, str(tmp / "case.pt"), str(tmp / "out.pt")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    up = torch.load(tmp / "out.pt", weights_only=True)
    conf = load_draft_config(folder)
    ours = DominoDrafter.from_pretrained(conf, dtype=torch.float32)
    return ours, up, case


def _attend(ctx_kv):
    def attend(i, q, k, v):
        ck, cv = ctx_kv[i]
        return reference_attention(q, torch.cat([ck, k]), torch.cat([cv, v]))
    return attend


def test_same_resolved_shape(pair):
    """Block size and context width as upstream resolves them from the released layout."""
    ours, up, _ = pair
    assert ours.conf.block_size == up["block_size"] == 16
    assert ours.conf.num_context_features == up["num_context_features"] == 2


def test_context_projection_equal(pair):
    """c = RMSNorm(fc(f)), bit for bit. Caught: `project_context` without `hidden_norm`."""
    ours, up, case = pair
    with torch.no_grad():
        assert torch.equal(ours.project_context(case["features"]), up["ctx"])


def test_context_kv_equal(pair):
    """Per draft layer, the context K (k_norm, then RoPE) and V, bit for bit.
    Caught: `DraftAttention.kv` without `k_norm`; rope_theta fixed at 10000 (config.py)."""
    ours, up, case = pair
    with torch.no_grad():
        kv = ours.context_kv(case["features"], case["ctx_positions"])
    assert len(kv) == len(up["ctx_kv"]) == 2
    for (k, v), (uk, uv) in zip(kv, up["ctx_kv"]):
        assert torch.equal(k, uk) and torch.equal(v, uv)


def test_block_outputs_equal(pair):
    """z of a block after both draft layers and the final norm, bit for bit (same attention).
    Caught: q not rotated (`DraftAttention.forward` without `apply_rope(q, ...)`)."""
    ours, up, case = pair
    with torch.no_grad():
        kv = ours.context_kv(case["features"], case["ctx_positions"])
        z = ours.backbone(case["block_embeds"], case["block_positions"], _attend(kv))
    assert torch.equal(z, up["z"])


@pytest.mark.parametrize("pool", POOLS)
def test_greedy_rollout_equal(pair, pool):
    """Our greedy head rollout equals upstream's `domino_greedy_rollout` token for token.
    Caught (pool 0 and 256): the GRU not fed the bonus token first (rollout.py); caught
    (pool 256 only): the pool's top-K over all positions' base logits, position 0 included
    (rollout.py `make_candidates`)."""
    ours, up, case = pair
    embed = torch.nn.Embedding.from_pretrained(case["embed"], freeze=True)
    with torch.no_grad():
        head = HeadParams.of(ours, embed, case["lm_head"])
        chain = greedy_rollout(case["rollout_z"], case["bonus"], head, candidate_pool=pool)
        base_only = greedy_rollout(case["rollout_z"], case["bonus"], head, candidate_pool=pool,
                                   use_head=False)
    assert torch.equal(chain, up["chains"][pool])
    assert not torch.equal(chain, base_only)  # the head changed picks: the test has teeth
