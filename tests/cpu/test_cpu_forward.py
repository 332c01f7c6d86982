"""The lean CPU forward (cpu/forward.py) gives SGLang's own forward's numbers, bit for bit.

Served, float32: the plain-decoding reference server (lean forward, the CPU default) and one with
DOMINO_SGLANG_NO_LEAN_FORWARD=1 (SGLang's LlamaModel.forward) return the same tokens and the same
log-probabilities, as floats, for every prompt token (the prefill's EXTEND forward) and every
generated one (DECODE), with their top 5 alternatives. DOMINO's verify forward runs the same
code (its losslessness tests compare it with this reference).
"""

from __future__ import annotations

import types

import pytest
import requests

from domino_sglang.cpu import forward
from tests.harness.servers import start_server

NEW_TOKENS = 12


def _generate(server, ids: list[int]) -> dict:
    r = requests.post(f"{server.url}/generate", json={
        "input_ids": ids,
        "sampling_params": {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True},
        "return_logprob": True, "top_logprobs_num": 5, "logprob_start_len": 0,
    }, timeout=120)
    r.raise_for_status()
    out = r.json()
    meta = out["meta_info"]
    return {"output_ids": out["output_ids"],
            **{k: meta[k] for k in ("input_token_logprobs", "output_token_logprobs",
                                    "input_top_logprobs", "output_top_logprobs")}}


@pytest.mark.server
def test_lean_forward_equals_sglangs_forward(ar_server_fp32, chat_ids):
    prompts = chat_ids[:3]
    lean = [_generate(ar_server_fp32, ids) for ids in prompts]
    assert "LlamaModel forward: lean" in ar_server_fp32.log()
    with start_server("ar-fp32-sglang-forward",
                      ["--no-speculation", "--dtype", "float32", "--max-total-tokens", "16384"],
                      ["--disable-overlap-schedule"],
                      env={forward.DISABLE_ENV: "1"}) as stock:
        sglang = [_generate(stock, ids) for ids in prompts]
        assert "LlamaModel forward: lean" not in stock.log()
    for got, expected in zip(lean, sglang):
        assert got == expected
    assert all(len(o["output_ids"]) == NEW_TOKENS for o in lean)  # really decoded


def test_only_sglangs_own_llama_stack_is_taken(monkeypatch):
    """A model whose layers are not exactly SGLang's Llama classes (a subclass may override a
    forward), that runs over pipeline stages or over tensor-parallel ranks (its layer boundaries
    all-reduce), keeps SGLang's forward."""
    pytest.importorskip("sglang")
    from domino_sglang import sglang_compat

    monkeypatch.setattr(sglang_compat, "tp_shard", lambda: None)
    other = types.SimpleNamespace(self_attn=object(), mlp=object())
    model = types.SimpleNamespace(pp_group=types.SimpleNamespace(world_size=1),
                                  layers=[other], start_layer=0, end_layer=1)
    assert forward._lean_stack(model) is None
    model.pp_group.world_size = 2
    assert forward._lean_stack(model) is None
    model.pp_group.world_size, model.layers, model.end_layer = 1, [], 0
    assert forward._lean_stack(model) is None
    monkeypatch.setattr(sglang_compat, "tp_shard", lambda: "rank 0 of 2")
    assert forward._lean_stack(_one_layer_llama()) is None


def _one_layer_llama():
    """A model _lean_stack takes at one rank: SGLang's own Llama classes, unquantised."""
    from domino_sglang.sglang_compat import (
        LlamaAttention,
        LlamaDecoderLayer,
        LlamaMLP,
        UnquantizedLinearMethod,
    )

    def bare(cls, **fields):
        obj = object.__new__(cls)
        obj.__dict__.update(fields)
        return obj

    def linear():
        return types.SimpleNamespace(quant_method=object.__new__(UnquantizedLinearMethod))

    attn = bare(LlamaAttention, qkv_proj=linear(), o_proj=linear(), rotary_emb=object(),
                head_dim=64)
    mlp = bare(LlamaMLP, gate_up_proj=linear(), down_proj=linear(),
               dual_gemm=types.SimpleNamespace(mode=None),
               activation_quant=types.SimpleNamespace(enabled=False))
    layer = bare(LlamaDecoderLayer, self_attn=attn, mlp=mlp, input_layernorm="in",
                 post_attention_layernorm="post")
    return types.SimpleNamespace(pp_group=types.SimpleNamespace(world_size=1), layers=[layer],
                                 start_layer=0, end_layer=1)


def test_a_one_rank_llama_stack_is_taken(monkeypatch):
    """The positive case of the test above (the served test's server takes it too)."""
    pytest.importorskip("sglang")
    from domino_sglang import sglang_compat

    monkeypatch.setattr(sglang_compat, "tp_shard", lambda: None)
    stack = forward._lean_stack(_one_layer_llama())
    assert stack is not None and len(stack.layers) == 1 and stack.rope is None
