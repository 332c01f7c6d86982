"""Packed oneDNN linears (domino_sglang/cpu/linear.py): numerics, row-invariance, SGLang wiring."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from domino_sglang.cpu import linear

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                reason="torch built without oneDNN")


def test_packed_linear_matches_dense_fp32():
    torch.manual_seed(0)
    w, b = torch.randn(3072, 576), torch.randn(3072)
    packed = linear.pack(w)
    for shape in [(1, 576), (2, 576), (16, 576), (300, 576), (2, 8, 576)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(linear.packed_linear(x, packed), F.linear(x, w),
                                   rtol=1e-5, atol=2e-4)
        torch.testing.assert_close(linear.packed_linear(x, packed, b), F.linear(x, w, b),
                                   rtol=1e-5, atol=2e-4)
    x = torch.randn(4, 2 * 576)[:, :576]  # a strided view, as SGLang's split q/k/v can be
    torch.testing.assert_close(linear.packed_linear(x, packed), F.linear(x, w),
                               rtol=1e-5, atol=2e-4)


def test_packed_rows_do_not_depend_on_the_other_rows():
    """A verify pass computes row i of a [16, K] batch; plain decoding computes it alone. With
    the packed weights the two are bit-identical, so the target's projections cannot make a
    speculative step's numbers differ from a plain one."""
    torch.manual_seed(1)
    w = torch.randn(49152 // 8, 576)
    packed = linear.pack(w)
    x = torch.randn(16, 576)
    whole = linear.packed_linear(x, packed)
    alone = torch.cat([linear.packed_linear(x[i:i + 1], packed) for i in range(16)])
    assert torch.equal(whole, alone)


def test_two_bf16_rows_run_as_four(monkeypatch):
    """A bf16 input of 2 rows (oneDNN's slow row count) runs as 4 rows, its rows twice, the
    copies dropped: same shape and values as F.linear's (bf16 tolerance), 2-D and 3-D, with a
    bias; other row counts and fp32 run as they are."""
    if linear.onednn_pack(torch.randn(8, 8, dtype=torch.bfloat16)) is None:
        pytest.skip("no oneDNN bf16 here")
    torch.manual_seed(2)
    w, b = torch.randn(1536, 576, dtype=torch.bfloat16) * 0.05, torch.randn(1536).bfloat16()
    packed = linear.onednn_pack(w)
    seen = []
    real = linear._onednn_linear
    monkeypatch.setattr(linear, "_onednn_linear",
                        lambda x, p, bias: seen.append(x.shape[0]) or real(x, p, bias))
    for shape in [(2, 576), (1, 2, 576), (2, 1, 576)]:
        x = torch.randn(*shape, dtype=torch.bfloat16)
        out = linear.packed_linear(x, packed, b)
        assert out.shape == (*shape[:-1], 1536)
        torch.testing.assert_close(out.float(), F.linear(x.float(), w.float(), b.float()),
                                   rtol=2e-2, atol=2e-2)
    assert seen == [4, 4, 4]
    seen.clear()
    for shape, dtype in [((1, 576), torch.bfloat16), ((3, 576), torch.bfloat16),
                         ((2, 576), torch.float32)]:
        weight = w.to(dtype)
        linear.packed_linear(torch.randn(*shape, dtype=dtype), linear.onednn_pack(weight))
    assert seen == [1, 3, 2]


def test_pack_declines_what_it_cannot_serve():
    assert linear.pack(torch.randn(8, 4, 2)) is None  # not a matrix
    assert linear.pack(torch.randn(8, 4).to(torch.float16)) is None
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(8, 4), requires_grad=False)
    linear.refresh(layer)
    assert linear.packed_for(layer, torch.randn(2, 4)) is not None
    assert linear.packed_for(layer, torch.randn(2, 4, dtype=torch.float64)) is None  # dtype


@pytest.fixture
def installed(monkeypatch):
    """install() in this process, undone after the test (it patches SGLang classes)."""
    from sglang.srt.layers.logits_processor import LogitsProcessor
    from sglang.srt.layers.quantization.unquant import (
        UnquantizedEmbeddingMethod,
        UnquantizedLinearMethod,
    )

    for cls, name in [(UnquantizedLinearMethod, "apply"),
                      (UnquantizedLinearMethod, "process_weights_after_loading"),
                      (UnquantizedEmbeddingMethod, "process_weights_after_loading"),
                      (LogitsProcessor, "_compute_lm_head")]:
        monkeypatch.setattr(cls, name, getattr(cls, name))
    monkeypatch.setattr(linear, "_installed", False)
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    monkeypatch.delenv(linear.DISABLE_ENV, raising=False)
    assert linear.install()
    return UnquantizedLinearMethod, UnquantizedEmbeddingMethod, LogitsProcessor


def test_install_routes_sglang_linears_and_follows_weight_updates(installed):
    method_cls, embedding_cls, logits_cls = installed
    method = method_cls()
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(64, 32), requires_grad=False)
    method.process_weights_after_loading(layer)  # what SGLang's loader calls after loading
    assert getattr(layer, linear.PACKED_ATTR) is not None
    x = torch.randn(3, 32)
    torch.testing.assert_close(method.apply(layer, x), F.linear(x, layer.weight),
                               rtol=1e-5, atol=1e-4)
    # a weight update (update_weights_from_disk copies in place, then post-processes again)
    layer.weight.data.copy_(torch.randn(64, 32))
    method.process_weights_after_loading(layer)
    torch.testing.assert_close(method.apply(layer, x), F.linear(x, layer.weight),
                               rtol=1e-5, atol=1e-4)
    # a layer without a pack (never post-processed) takes SGLang's own path
    unpacked = torch.nn.Module()
    unpacked.weight = torch.nn.Parameter(torch.randn(64, 32), requires_grad=False)
    assert torch.equal(method.apply(unpacked, x), F.linear(x, unpacked.weight))

    # the lm_head (a tied embedding): packed on first use, dropped by a weight update
    head = torch.nn.Module()
    head.weight = torch.nn.Parameter(torch.randn(100, 32), requires_grad=False)
    proc = logits_cls.__new__(logits_cls)
    proc.use_fp32_lm_head, proc.rl_on_policy_target = False, None
    torch.testing.assert_close(proc._compute_lm_head(x, head), x @ head.weight.T,
                               rtol=1e-5, atol=1e-4)
    assert getattr(head, linear.PACKED_ATTR) is not None
    head.weight.data.copy_(torch.randn(100, 32))
    embedding_cls().process_weights_after_loading(head)
    assert linear.PACKED_ATTR not in head.__dict__
    torch.testing.assert_close(proc._compute_lm_head(x, head), x @ head.weight.T,
                               rtol=1e-5, atol=1e-4)


def test_disabled_by_env_or_off_the_cpu_engine(monkeypatch):
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    monkeypatch.setenv(linear.DISABLE_ENV, "1")
    assert not linear.should_install()
    monkeypatch.delenv(linear.DISABLE_ENV)
    assert linear.should_install()
    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE")
    assert not linear.should_install()


def test_draft_base_logits_with_the_packed_lm_head():
    """The rollout's base logits (15 positions x the vocabulary) through the pack equal the
    dense ones up to float rounding (draft side: only acceptance could change)."""
    from dataclasses import replace
    from functools import partial

    from domino_sglang.spec.rollout import HeadParams, base_logits

    torch.manual_seed(2)
    w = torch.randn(1000, 64)
    head = HeadParams(embed=torch.nn.Embedding(1000, 64), lm_head_weight=w,
                      prefix_gru=torch.nn.GRU(64, 8, bias=False),
                      embed_proj=torch.nn.Sequential())
    z = torch.randn(3, 16, 64)
    packed = partial(linear.packed_linear, packed=linear.pack(w))
    torch.testing.assert_close(base_logits(z, replace(head, base_linear=packed)),
                               base_logits(z, head), rtol=1e-5, atol=1e-4)


def test_pack_linears_packs_the_drafter_backbone_in_place():
    from domino_sglang.model.config import parse_draft_config
    from domino_sglang.model.drafter import DominoDrafter
    from tests.model.test_drafter_loading import UPSTREAM_LIKE

    torch.manual_seed(0)
    drafter = DominoDrafter(parse_draft_config(UPSTREAM_LIKE, "/tmp/d")).eval()
    state = {k: v.clone() for k, v in drafter.state_dict().items()}
    feats = torch.randn(5, drafter.fc.in_features)
    positions = torch.arange(5)
    dense = drafter.context_kv(feats, positions)
    n_linears = 1 + 7 * len(drafter.layers)  # fc; q, k, v, o, gate, up, down per layer
    assert linear.pack_linears(drafter.fc) + linear.pack_linears(drafter.layers) == n_linears
    assert all(type(m) is linear.PackedLinear for m in drafter.layers[0].mlp.children())
    assert drafter.state_dict().keys() == state.keys()
    assert all(torch.equal(v, state[k]) for k, v in drafter.state_dict().items())
    for (k0, v0), (k1, v1) in zip(dense, drafter.context_kv(feats, positions)):
        torch.testing.assert_close(k1, k0, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v1, v0, rtol=1e-5, atol=1e-5)
    # the packed path really runs: a pack of other weights changes the output
    fc = drafter.fc
    setattr(fc, linear.PACKED_ATTR, linear.pack(torch.zeros_like(fc.weight)))
    assert float(fc(feats).abs().max()) == 0.0
