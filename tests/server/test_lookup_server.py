"""Prompt-lookup drafting (lookup.py) inside the real SGLang server on CPU: lossless and counted.

One float32 server, fixed block 16, a randomly initialised drafter: its own drafts are almost
never accepted, so multi-token commits come from copied drafts, and batches mix copied rows
with Domino rows (and rounds without a draft pass with rounds with one). References: the
session's plain-decoding server (`ar_server_fp32`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.harness.drafters import make_random_drafter
from tests.harness.servers import start_server

pytestmark = pytest.mark.server
REPEAT_PROMPT = "Repeat the word cat ten times: cat cat cat cat"
# a prompt whose answer restates it: plain greedy decoding copies the list back
LIST_PROMPT = ("Sort these words alphabetically and print them one per line: pear, apple, fig, "
               "banana, cherry, grape, kiwi, lemon, mango, orange, plum.")
SAMPLED = {"temperature": 0.7, "top_p": 0.95}


@pytest.fixture(scope="module")
def server(target_path, tmp_path_factory):
    drafter = make_random_drafter(target_path, tmp_path_factory.mktemp("lk") / "rand16", 16)
    with start_server("domino-lookup", ["--dtype", "float32", "--max-total-tokens", "16384"],
                      ["--speculative-algorithm", "DOMINO", "--speculative-draft-model-path",
                       str(drafter), "--speculative-domino-adaptive", "off"]) as srv:
        yield srv


def generate(server, ids, params, max_new_tokens=48):
    r = requests.post(f"{server.url}/generate", json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": max_new_tokens, **params},
    }, timeout=600)
    r.raise_for_status()
    return r.json()


def lookup_counters(server) -> tuple[float, float]:
    """(domino_lookup_rounds_total, domino_lookup_tokens_accepted_total) from /metrics."""
    values = {"domino_lookup_rounds_total": 0.0, "domino_lookup_tokens_accepted_total": 0.0}
    for line in requests.get(f"{server.url}/metrics", timeout=30).text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in values:
            values[name] += float(line.rsplit(" ", 1)[1])
    return values["domino_lookup_rounds_total"], values["domino_lookup_tokens_accepted_total"]


@pytest.fixture(scope="module")
def prompts(tokenizer, chat_ids):
    chat = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=True,
                                          add_generation_prompt=True, return_dict=False)
            for p in (LIST_PROMPT,)]
    return [tokenizer(REPEAT_PROMPT).input_ids, *chat, *chat_ids[:6]]


def test_lookup_greedy_equals_plain_decoding(server, ar_server_fp32, prompts):
    """Greedy outputs equal plain decoding token for token, one at a time and 8 together
    (copied rows beside Domino rows in one round); copied drafts were verified and kept."""
    greedy = {"temperature": 0}
    with ThreadPoolExecutor(8) as pool:
        ref = [r["output_ids"] for r in pool.map(
            lambda ids: generate(ar_server_fp32, ids, greedy), prompts)]
    rounds0, kept0 = lookup_counters(server)
    sequential = [generate(server, ids, greedy) for ids in prompts]
    rounds1, kept1 = lookup_counters(server)
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda ids: generate(server, ids, greedy), prompts))
    rounds2, kept2 = lookup_counters(server)
    assert [r["output_ids"] for r in sequential] == ref
    assert [r["output_ids"] for r in together] == ref
    meta = sequential[0]["meta_info"]  # the repeat prompt
    tau = meta["completion_tokens"] / meta["spec_verify_ct"]
    print(f"\nlookup, random drafter: tau {tau:.2f} on the repeat prompt; copied rows "
          f"{rounds1 - rounds0:.0f} / {rounds2 - rounds1:.0f} kept {kept1 - kept0:.0f} / "
          f"{kept2 - kept1:.0f} tokens (sequential / together)")
    assert tau > 3.0  # a random drafter alone stays near 1 (test_domino_server)
    assert rounds1 > rounds0 and kept1 > kept0 and rounds2 > rounds1 and kept2 > kept1
    # rounds are counted for every request, copied or not (SGLang's per-request statistics)
    assert all(r["meta_info"]["spec_verify_ct"] > 0 for r in sequential)


def test_lookup_sampling_seeded_and_accepted(server, prompts):
    """At T = 0.5 copied drafts are accepted (tau > 1.5 on the repeat prompt); a seeded request
    gives the same output alone and in a batch of copied and Domino rows (a row's drafts depend
    on its own history only), and greedy rows in that batch stay exact."""
    seeded = {"temperature": 0.5, "sampling_seed": 1, "ignore_eos": True}
    alone = generate(server, prompts[0], seeded)
    jobs = [(prompts[0], seeded), (prompts[1], {"temperature": 0}),
            (prompts[2], SAMPLED), (prompts[3], {**SAMPLED, "sampling_seed": 3})]
    with ThreadPoolExecutor(len(jobs)) as pool:
        out = list(pool.map(lambda job: generate(server, *job), jobs))
    greedy_alone = generate(server, prompts[1], {"temperature": 0})
    assert out[0]["output_ids"] == alone["output_ids"]
    assert out[1]["output_ids"] == greedy_alone["output_ids"]
    meta = alone["meta_info"]
    tau = meta["completion_tokens"] / meta["spec_verify_ct"]
    print(f"\nlookup at T = 0.5: tau {tau:.2f} on the repeat prompt: {alone['text'][:60]!r}")
    assert tau > 1.5
