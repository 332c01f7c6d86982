"""DOMINO's accepted blocks and sampling inside the real SGLang server on CPU (one float32
server for the module, fixed block, the drafter's own drafts only: prompt lookup, which copies
the repetitive prompt's " cat" too, has its own module, test_lookup_server.py).

Drafter: the constructed repeat drafter (tests/harness/drafters.py), block 4. It is accepted on a
repetitive prompt and wrong almost everywhere else, so one server exercises both the rejection /
recovery path and multi-token commits, greedy (max_tokens, stop strings, logprobs and counters
inside an accepted block) and at temperature > 0.
References: the session's plain-decoding server (`ar_server_fp32`, synchronous scheduler) and,
for the mixed batch, transformers' fp32 greedy decoding, which equals SGLang's own plain fp32
decoding token for token (tests/server/test_parity_transformers.py).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch

from tests.harness.drafters import make_repeat_drafter
from tests.harness.servers import start_server
from tests.server.test_parity_transformers import NEW_TOKENS, _strip_eos, hf_greedy

pytestmark = pytest.mark.server
SAMPLED = {"temperature": 0.8, "top_p": 0.95, "top_k": 50}
REPEAT_PROMPT = "Repeat the word cat ten times: cat cat cat cat"


@pytest.fixture(scope="module")
def server(target_path, tmp_path_factory):
    drafter = make_repeat_drafter(target_path, tmp_path_factory.mktemp("d") / "repeat4", 4)
    with start_server("domino-sampling", ["--dtype", "float32", "--max-total-tokens", "16384"],
                      ["--speculative-algorithm", "DOMINO", "--speculative-draft-model-path",
                       str(drafter), "--enable-custom-logit-processor",
                       # fixed block: the tests here are about sampling, not the policy, whose
                       # batch-level estimate other tests' traffic would otherwise drive down
                       "--speculative-domino-adaptive", "off",
                       "--speculative-domino-lookup", "off"]) as srv:
        yield srv


def generate(server, ids, params, **fields):
    r = requests.post(f"{server.url}/generate", json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": NEW_TOKENS, **params}, **fields,
    }, timeout=600)
    r.raise_for_status()
    return r.json()


def verify_calls(server) -> float:
    """sglang:spec_verify_calls_total from /metrics, summed over its label sets."""
    total = 0.0
    for line in requests.get(f"{server.url}/metrics", timeout=30).text.splitlines():
        if line.startswith("sglang:spec_verify_calls_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def greedy(srv, ids, max_new_tokens):
    return generate(srv, ids, {"temperature": 0, "max_new_tokens": max_new_tokens})


def test_constructed_drafter_is_accepted_and_counted(server, ar_server_fp32, tokenizer):
    """Greedy rounds that commit whole blocks: max_tokens, a stop string and logprobs inside an
    accepted block, and SGLang's own speculative counters (the server's fixed block: this test is
    about what such a round does; whether the adaptive policy would speculate on this drafter is
    test_policy's business)."""
    ids = tokenizer(REPEAT_PROMPT).input_ids
    ref = greedy(ar_server_fp32, ids, 40)["output_ids"]
    cat = tokenizer(" cat").input_ids[0]
    assert ref[:20] == [cat] * 20  # the target itself repeats " cat"
    rounds_before = verify_calls(server)
    out = greedy(server, ids, 40)
    # max_tokens inside an accepted block: exactly 10 tokens, though rounds commit 4 at a time
    cut = greedy(server, ids, 10)
    # a stop string inside an accepted block: nothing after it is returned
    stopped = requests.post(f"{server.url}/generate", json={"input_ids": ids,
                            "sampling_params": {"temperature": 0, "max_new_tokens": 40,
                                                "stop": [" cat cat cat"]}}, timeout=600).json()
    lp_body = {"input_ids": ids, "return_logprob": True, "top_logprobs_num": 3,
               "sampling_params": {"temperature": 0, "max_new_tokens": 12}}
    logprobs = requests.post(f"{server.url}/generate", json=lp_body, timeout=600).json()
    lp_ref = requests.post(f"{ar_server_fp32.url}/generate", json=lp_body,
                           timeout=600).json()["meta_info"]
    other = greedy(server, tokenizer("Explain photosynthesis briefly.").input_ids, 24)
    other_ref = greedy(ar_server_fp32, tokenizer("Explain photosynthesis briefly.").input_ids, 24)
    rounds = verify_calls(server) - rounds_before
    # SGLang's own speculative series counts DOMINO's rounds exactly (per-request sum).
    sent = [out, cut, stopped, logprobs, other]
    assert rounds == sum(r["meta_info"]["spec_verify_ct"] for r in sent) > 0
    assert out["output_ids"] == ref
    assert cut["output_ids"] == ref[:10] and cut["meta_info"]["finish_reason"]["type"] == "length"
    # The stop string completes inside the first accepted 4-token block; nothing from it or
    # after it comes back, and generation ends there.
    assert stopped["text"] == "" and stopped["meta_info"]["finish_reason"]["type"] == "stop"
    assert stopped["meta_info"]["completion_tokens"] <= 4
    # logprobs of tokens committed inside accepted blocks (chain rows of the verify pass) are
    # plain decoding's: the token's and the top-3, ids equal and values within float noise
    lp = logprobs["meta_info"]["output_token_logprobs"]
    assert [t for _, t, _ in lp] == ref[:12] and all(v <= 0 for v, _, _ in lp)
    assert [v for v, _, _ in lp] == pytest.approx(
        [v for v, _, _ in lp_ref["output_token_logprobs"]], abs=1e-3)
    top, top_ref = logprobs["meta_info"]["output_top_logprobs"], lp_ref["output_top_logprobs"]
    # (the best id exactly; the 2nd / 3rd may swap places on a near-tie between fp32 kernels)
    assert [row[0][1] for row in top] == [row[0][1] for row in top_ref] == ref[:12]
    assert [sorted(v for v, _, _ in row) for row in top] == [
        pytest.approx(sorted(v for v, _, _ in row), abs=1e-3) for row in top_ref]
    assert other["output_ids"] == other_ref["output_ids"]
    meta = out["meta_info"]
    tau = meta["completion_tokens"] / meta["spec_verify_ct"]
    print(f"\nrepeat drafter: tau {tau:.2f} on the repetitive prompt "
          f"({meta['completion_tokens']} tokens in {meta['spec_verify_ct']} rounds)")
    assert tau > 1.5
    # A 4-token block commits at most 4 tokens per round.
    assert meta["spec_verify_ct"] >= meta["completion_tokens"] / 4


def test_mixed_batch_greedy_exact_and_seeds(server, target_path, chat_ids, tokenizer):
    greedy_ids = chat_ids[:4]
    expected = hf_greedy(target_path, chat_ids[:5], torch.float32)
    jobs = [(ids, {"temperature": 0}) for ids in greedy_ids]
    jobs += [(ids, {**SAMPLED, "sampling_seed": 1000 + i}) for i, ids in enumerate(chat_ids[4:])]
    jobs += [(chat_ids[4], {**SAMPLED, "sampling_seed": 1000})]  # repeats job 4 in the batch
    with ThreadPoolExecutor(len(jobs)) as pool:
        out = list(pool.map(lambda job: generate(server, *job), jobs))
    # greedy requests sharing rounds with sampled ones: exactly their AR tokens
    assert [_strip_eos(o["output_ids"]) for o in out[:4]] == [_strip_eos(e)
                                                             for e in expected[:4]]
    sampled = [o["output_ids"] for o in out[4:]]
    # same seed: the same output, alone or next to other requests; a different seed differs
    alone = generate(server, chat_ids[4], {**SAMPLED, "sampling_seed": 1000})["output_ids"]
    other = generate(server, chat_ids[4], {**SAMPLED, "sampling_seed": 1001})["output_ids"]
    assert sampled[0] == sampled[-1] == alone
    assert other != alone
    # sampled requests really sample (not the greedy continuation)
    greedy_4 = generate(server, chat_ids[4], {"temperature": 0})["output_ids"]
    assert _strip_eos(greedy_4) == _strip_eos(expected[4])  # an all-greedy batch: exact too
    assert alone != greedy_4 or other != greedy_4
    print("\nseeded sample:", tokenizer.decode(alone)[:120].replace("\n", " "))


def test_seeded_request_reproducible_beside_logprob_requests(server, tokenizer):
    """A seeded request's output does not depend on whether a request in its prefill batch (or
    itself) asks for logprobs, and the first token's returned logprob is log p of that token
    under the request's sampling transform (SGLang's own value, asked for by token id).
    Power: the first token used to keep SGLang's unseeded draw whenever the prefill batch
    returned logprobs; at T = 1.5 on an open prompt that draw varies from run to run."""
    ids = tokenizer("Write a short story about a dragon.").input_ids
    seeded = {"temperature": 1.5, "top_k": 50, "max_new_tokens": 8, "ignore_eos": True,
              "sampling_seed": 7}
    other = {"temperature": 1.0, "max_new_tokens": 8}
    alone = generate(server, ids, seeded)["output_ids"]
    for logprob in ([False, True], [True, False], [True, True]):
        r = requests.post(f"{server.url}/generate", json={
            "input_ids": [ids, ids], "sampling_params": [seeded, other],
            "return_logprob": logprob}, timeout=600)
        r.raise_for_status()
        out = r.json()[0]
        assert out["output_ids"] == alone, logprob
        if logprob[0]:
            first_logprob, first_token, _ = out["meta_info"]["output_token_logprobs"][0]
            assert first_token == alone[0]
    check = requests.post(f"{server.url}/generate", json={
        "input_ids": ids, "sampling_params": {**seeded, "max_new_tokens": 1},
        "return_logprob": True, "token_ids_logprob": [alone[0]]}, timeout=600).json()
    expected = check["meta_info"]["output_token_ids_logprobs"][0][0][0]
    assert abs(first_logprob - expected) < 1e-4, (first_logprob, expected)
    assert len(alone) == 8


def test_sampled_drafts_are_accepted(server, tokenizer):
    """At temperature 0.5 the target keeps repeating " cat"; the repeat drafter's sampled drafts
    are accepted and multi-token rounds are committed (tau > 1.5), and unseeded requests
    still differ from one another on an open-ended prompt."""
    ids = tokenizer(REPEAT_PROMPT).input_ids
    # seeded, so the full block is verified whatever the adaptive policy's batch-level
    # acceptance estimate (driven down by the other tests' prompts, where this drafter fails)
    out = generate(server, ids, {"temperature": 0.5, "max_new_tokens": 40, "sampling_seed": 1})
    meta = out["meta_info"]
    tau = meta["completion_tokens"] / meta["spec_verify_ct"]
    print(f"\nrepeat drafter at T=0.5: tau {tau:.2f} ({meta['completion_tokens']} tokens in "
          f"{meta['spec_verify_ct']} rounds): {out['text'][:60]!r}")
    assert tau > 1.5
    assert meta["spec_verify_ct"] >= meta["completion_tokens"] / 4  # at most B per round
    # ignore_eos: on this raw prompt the target ends at once with p(<|im_end|>) = 0.58, so two
    # samples would both be [EOS] a third of the time; 16 sampled tokens at T=1 never coincide
    story = tokenizer("Write a short story about a dragon.").input_ids
    params = {"temperature": 1.0, "max_new_tokens": 16, "ignore_eos": True}
    a, b = (generate(server, story, params)["output_ids"] for _ in range(2))
    assert a != b


def test_json_schema_requests_follow_the_grammar(server, tokenizer, target_path):
    """xgrammar-constrained requests, greedy and sampled: the verify logits of every chain
    position carry the grammar mask, so every committed token is one the grammar allows.
    Checked token by token with xgrammar's own matcher on the same schema (SGLang's settings:
    any whitespace, the model's EOS as stop token): a finished output is accepted to its end,
    parses and fits the schema; one cut by max_new_tokens is a valid prefix. A sampled
    request may run out of tokens legitimately (the schema allows any integer and any
    whitespace: CI once drew a 45-digit age at T = 1), so only the greedy one must finish."""
    import xgrammar
    from transformers import AutoConfig

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    info = xgrammar.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=AutoConfig.from_pretrained(target_path).vocab_size,
        stop_token_ids=[tokenizer.eos_token_id])
    compiled = xgrammar.GrammarCompiler(info).compile_json_schema(json.dumps(schema),
                                                                  any_whitespace=True)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Give a JSON object with a person's name and age."}],
        tokenize=True, add_generation_prompt=True, return_dict=False)
    for params in ({"temperature": 0}, {"temperature": 0.9, "sampling_seed": 5},
                   {"temperature": 1.0}):
        out = generate(server, ids, {**params, "json_schema": json.dumps(schema),
                                     "max_new_tokens": 64})
        finish = out["meta_info"]["finish_reason"]["type"]
        matcher = xgrammar.GrammarMatcher(compiled)
        for i, tok in enumerate(out["output_ids"]):
            assert matcher.accept_token(tok), (params, i, tokenizer.decode(tok), out["text"])
        if finish == "length":
            assert params["temperature"] > 0, f"greedy JSON did not finish: {out['text']!r}"
            continue
        assert matcher.is_terminated() or matcher.accept_token(tokenizer.eos_token_id), out
        obj = json.loads(out["text"])
        assert set(obj) == {"name", "age"} and isinstance(obj["age"], int), out["text"]
    # power: the same request without the schema is not JSON the matcher would accept
    free = generate(server, ids, {"temperature": 0, "max_new_tokens": 16})["output_ids"]
    matcher = xgrammar.GrammarMatcher(compiled)
    assert not all(matcher.accept_token(tok) for tok in free), tokenizer.decode(free)


def test_history_dependent_requests_equal_plain_decoding(server, ar_server_fp32, chat_ids,
                                                          tokenizer):
    """Requests whose logits depend on their own output so far (frequency / presence /
    repetition penalties, min_new_tokens, a custom logit processor reading the request's
    output_ids) and a value-reading custom processor beside a logit bias, greedy, in one batch
    with an unpenalized request: each output equals SGLang's plain decoding token for token.
    Reference: plain decoding with the synchronous scheduler (`ar_server_fp32`). SGLang's default
    overlap scheduler
    feeds the penalizers `output_ids[-1]` before the previous step's token is appended (one
    token late, the first token twice: its own relaxation), so its penalized outputs differ
    from exact plain decoding (on the repeat prompt from the 5th token). The penalizers see only
    what the scheduler feeds them (algorithm.cumulate_penalties) through the worker's
    forward-only sampling info. Power: the code before the penalty fix read the penalties from
    that copy's orchestrator, which is always None, so DOMINO's outputs were the unpenalized
    ones, which the last assertions check differ from the reference. Before the processor fix,
    ForceAfter (force " dog" from the 6th output token on) saw the history as of the round's
    start at every chain row, so on the repeat prompt, where the drafter's " cat" blocks are
    accepted, DOMINO still committed " cat" at index 6; and BanArgmax ran before the +100
    logit bias, so the biased token won every step where plain decoding bans it."""
    from tests.harness.processors import BanArgmax, ForceAfter

    short = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Answer with one word: is the sky blue?"}],
        tokenize=True, add_generation_prompt=True, return_dict=False)
    repeat = tokenizer(REPEAT_PROMPT).input_ids
    dog, banana = (tokenizer(w).input_ids[0] for w in (" dog", " banana"))
    force = {"custom_logit_processor": ForceAfter.to_str()}
    ban = {"custom_logit_processor": BanArgmax.to_str()}
    jobs = [(repeat, {"frequency_penalty": 0.8}, {}),
            (chat_ids[0], {"presence_penalty": 1.0}, {}),
            (chat_ids[1], {"repetition_penalty": 1.3}, {}), (short, {"min_new_tokens": 24}, {}),
            (repeat, {"custom_params": {"after": 6, "token": dog}}, force),
            (chat_ids[3], {"logit_bias": {str(banana): 100.0}}, ban),
            (chat_ids[2], {}, {})]
    jobs = [(ids, {"temperature": 0, "max_new_tokens": 32, **p}, f) for ids, p, f in jobs]

    def run(srv):
        with ThreadPoolExecutor(len(jobs)) as pool:
            return list(pool.map(lambda job: generate(srv, job[0], job[1], **job[2]), jobs))

    domino = run(server)
    plain = {"temperature": 0, "max_new_tokens": 32}
    ar = run(ar_server_fp32)
    unpenalized = [generate(ar_server_fp32, ids, plain)["output_ids"] for ids in (repeat, short)]
    assert [o["output_ids"] for o in domino] == [o["output_ids"] for o in ar]
    # the penalties and processors matter on these prompts (else the comparison proves nothing)
    assert unpenalized[0] != ar[0]["output_ids"]
    assert len(unpenalized[1]) < 24 <= len(ar[3]["output_ids"])
    forced = ar[4]["output_ids"]
    assert forced[6:] == [dog] * (len(forced) - 6) and dog not in forced[:6]
    assert forced[:6] == unpenalized[0][:6]  # the " cat" run the drafter's blocks accept
    assert len(ar[5]["output_ids"]) > 8 and banana not in ar[5]["output_ids"]
    print("\nfrequency-penalised repeat:", tokenizer.decode(ar[0]["output_ids"])[:80])
