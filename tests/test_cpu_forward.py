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
from tests.servers import start_server

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


def test_only_sglangs_own_llama_stack_is_taken():
    """A model whose layers are not exactly SGLang's Llama classes (a subclass may override a
    forward), or that runs over pipeline stages, keeps SGLang's forward."""
    pytest.importorskip("sglang")
    other = types.SimpleNamespace(self_attn=object(), mlp=object())
    model = types.SimpleNamespace(pp_group=types.SimpleNamespace(world_size=1),
                                  layers=[other], start_layer=0, end_layer=1)
    assert forward._lean_stack(model) is None
    model.pp_group.world_size = 2
    assert forward._lean_stack(model) is None
    model.pp_group.world_size, model.layers, model.end_layer = 1, [], 0
    assert forward._lean_stack(model) is None
