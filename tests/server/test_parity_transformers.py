"""SGLang serving SmolLM2 through our CPU runtime gives transformers' greedy tokens.

float32: token-for-token equality, one request at a time and 6 in flight together.
bfloat16: SGLang's batched kernels and transformers' differ in rounding, so near-tied argmaxes can
flip; we measure and print the agreement rate and require a floor, not equality.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch

NEW_TOKENS = 32
pytestmark = pytest.mark.server


def hf_greedy(target_path, prompts_ids, dtype):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_path, dtype=dtype).eval()
    outs = []
    with torch.inference_mode():
        for ids in prompts_ids:
            x = torch.tensor([ids])
            y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS,
                               do_sample=False, eos_token_id=2, pad_token_id=2)
            outs.append(y[0, len(ids):].tolist())
    return outs


def sglang_greedy(server, ids):
    r = requests.post(f"{server.url}/generate", json={
        "input_ids": ids,
        "sampling_params": {"temperature": 0, "max_new_tokens": NEW_TOKENS},
    }, timeout=120)
    r.raise_for_status()
    return r.json()["output_ids"]


def _strip_eos(tokens):
    return tokens[: tokens.index(2) + 1] if 2 in tokens else tokens


@pytest.fixture(scope="module")
def hf_fp32(target_path, chat_ids):
    return hf_greedy(target_path, chat_ids[:6], torch.float32)


def test_fp32_parity_sequential(ar_server_fp32, chat_ids, hf_fp32):
    for ids, expected in zip(chat_ids[:6], hf_fp32):
        got = sglang_greedy(ar_server_fp32, ids)
        assert _strip_eos(got) == _strip_eos(expected)
    assert sum(len(e) for e in hf_fp32) >= 6 * 16  # the prompts really generate


def test_fp32_parity_six_in_flight(ar_server_fp32, chat_ids, hf_fp32):
    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda ids: sglang_greedy(ar_server_fp32, ids), chat_ids[:6]))
    assert [_strip_eos(g) for g in got] == [_strip_eos(e) for e in hf_fp32]


def test_bf16_agreement_rate(ar_server_bf16, target_path, chat_ids):
    expected = hf_greedy(target_path, chat_ids[:6], torch.bfloat16)
    # one at a time: bf16 rounding depends on the batch, and six requests in flight are batched
    # differently from run to run (1 + 5, 4 + 2, 3 + 3 in the logs), so the rate would move
    # between runs of the same machine; sequential, it is fixed per machine
    got = [sglang_greedy(ar_server_bf16, ids) for ids in chat_ids[:6]]
    # Agreement = tokens of the common prefix before the first divergence / tokens generated.
    agree = total = exact = 0
    for g, e in zip(got, expected):
        n = 0
        while n < min(len(g), len(e)) and g[n] == e[n]:
            n += 1
        agree, total, exact = agree + n, total + len(e), exact + (g == e)
    rate = agree / total
    print(f"\nbf16 SGLang vs transformers: prefix agreement {rate:.3f} ({agree}/{total} tokens), "
          f"{exact}/6 identical sequences")
    # Measured: Intel Xeon with native bf16 >= 0.5 and >= 3/6; AMD EPYC Zen 3 (bf16 emulated by
    # oneDNN, rounding differs more) 0.49 and 2/6 (2026-11-23). A broken runtime diverges within a
    # token or two (rate ~0), so the floor keeps its power with margin for the emulated machines.
    assert rate >= 0.35 and exact >= 1
