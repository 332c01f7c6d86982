"""The shipped drafter: loads in the server by default, stays lossless, keeps its acceptance, and
the worker drafts exactly what the drafter computes.

A regression guard, not a timing: tau on 5 fixed prompts (greedy, float32 so the output must equal
plain decoding token for token, fixed block: --speculative-domino-adaptive off, the drafter's
own drafts only: --speculative-domino-lookup off) must stay above TAU_FLOOR.
Measured with the fixed block: tau 1.294 (264 tokens / 204 rounds) for the stage-7 drafter
(2026-11-26), 1.275 (207 rounds) for stage 5 (2026-11-25); 1.222 (216 rounds) for stage 3, 1.234
for stage 2, 1.179 for stage 1 (2026-11-23: on these 5 chat prompts the stages are within a few
rounds); a random drafter gives 1.03.
Then the same tokens are replayed through the drafter in plain PyTorch (`evaluate.replay_rounds`):
the verify rounds must be equal per prompt. Checked to have power (stage-1 drafter): with the
decode-round context features written one position late (worker.py, `positions + 1`), output
stays lossless but one prompt needs one more round and the test fails.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from domino_sglang.paths import shipped_drafter_dir
from tests.harness.servers import start_server

pytestmark = pytest.mark.server
NEW_TOKENS = 64
TAU_MEASURED = 1.748  # stage 30 (151 rounds; stage 26: 1.600, 165; stage 22: 1.590, 166)
TAU_FLOOR = 1.683  # measured - 0.065 (~6 rounds); a broken draft context or drafter falls further


def _generate(url: str, ids: list[int], temperature: float = 0.0) -> dict:
    r = requests.post(f"{url}/generate", json={
        "input_ids": ids, "sampling_params": {"temperature": temperature,
                                              "max_new_tokens": NEW_TOKENS,
                                              "ignore_eos": temperature > 0}},
        timeout=900)
    r.raise_for_status()
    return r.json()


@pytest.fixture(scope="module")
def reference(ar_server_fp32, chat_ids) -> list[list[int]]:
    with ThreadPoolExecutor(5) as pool:  # batched: float32 output does not depend on the batch
        return [r["output_ids"] for r in pool.map(
            lambda ids: _generate(ar_server_fp32.url, ids), chat_ids[:5])]


def test_shipped_drafter_is_lossless_and_keeps_its_tau(reference, chat_ids):
    assert (shipped_drafter_dir() / "model.safetensors").is_file()
    prompts = chat_ids[:5]
    # no --drafter: `domino-sglang serve` picks the shipped one
    with start_server("shipped", ["--dtype", "float32", "--max-total-tokens", "16384"],
                      ["--speculative-domino-adaptive", "off",
                       "--speculative-domino-lookup", "off"]) as server:
        assert "--speculative-algorithm DOMINO" in " ".join(server.args) or \
            "DOMINO" in server.log()
        with ThreadPoolExecutor(5) as pool:
            outs = list(pool.map(lambda ids: _generate(server.url, ids), prompts))
    tokens = rounds = 0
    for ref, out in zip(reference, outs):
        assert out["output_ids"] == ref
        tokens += out["meta_info"]["completion_tokens"]
        rounds += out["meta_info"]["spec_verify_ct"]
    tau = tokens / rounds
    print(f"shipped drafter tau on 5 prompts: {tau:.3f} ({tokens} tokens / {rounds} rounds)")
    assert tau >= TAU_FLOOR, f"tau {tau:.3f} fell below the floor {TAU_FLOOR}"

    # The worker drafts what the drafter computes: replaying the same tokens through the drafter
    # in plain PyTorch (transformers features, float32 like the server) needs the same rounds.
    # Losslessness cannot see a broken draft context (wrong K/V slots, positions or mask only
    # cost acceptance); this can.
    replayed = _replay([{"id": i, "ids": ids + out["output_ids"], "start": len(ids)}
                        for i, (ids, out) in enumerate(zip(prompts, outs))])
    served = [out["meta_info"]["spec_verify_ct"] for out in outs]
    print(f"verify rounds per prompt: served {served}, replayed {replayed}")
    assert served == replayed
    # so the tau a training run logs for held-out records (evaluate.replay_tau) is the served one
    records = [{"id": i, "ids": ids + out["output_ids"], "start": len(ids)}
               for i, (ids, out) in enumerate(zip(prompts, outs))]
    estimate = _replay(records, tau=True)
    print(f"in-training estimate {estimate:.3f}, served {tau:.3f}")
    assert estimate == pytest.approx(tau, abs=1e-9)


# --speculative-domino-debug-draft-len 16,1: a full block at even committed lengths, else plain
PATTERN = (16, 1)


def test_plain_rounds_feed_the_draft_context(reference, chat_ids):
    """Plain rounds (L = 1) run the target's DECODE forward, not a verify; the features they
    capture must enter the draft KV exactly as a verify round's do. A pinned pattern mixes plain
    and full-block rounds deterministically (by committed length; one request at a time, so the
    batch's first request is the request), and the replay follows the same pattern. Checked to
    have power: not writing the draft context after plain rounds (worker.py) keeps the output
    lossless but changes the rounds, and this test fails."""
    prompts = chat_ids[:3]
    with start_server("shipped-plain", ["--dtype", "float32", "--max-total-tokens", "16384"],
                      ["--speculative-domino-debug-draft-len", ",".join(map(str, PATTERN)),
                       "--speculative-domino-lookup", "off"]) as server:  # the replay's drafts
        outs = [_generate(server.url, ids) for ids in prompts]
    assert [out["output_ids"] for out in outs] == reference[:3]
    served = [out["meta_info"]["spec_verify_ct"] for out in outs]
    replayed = _replay([{"id": i, "ids": ids + out["output_ids"], "start": len(ids)}
                        for i, (ids, out) in enumerate(zip(prompts, outs))], PATTERN)
    fixed = _replay([{"id": i, "ids": ids + out["output_ids"], "start": len(ids)}
                     for i, (ids, out) in enumerate(zip(prompts, outs))])
    print(f"pattern {PATTERN}: rounds served {served}, replayed {replayed} (fixed block {fixed})")
    assert served == replayed


SHORT_PATTERN = (4, 1, 2, 3)  # rounds of L = 4, 1, 2, 3 by committed length: short drafts


def test_short_draft_passes_draft_what_the_drafter_computes(reference, chat_ids):
    """With short drafting (--speculative-domino-debug-short-draft on: a round verifying L < B
    tokens drafts [x_t, MASK x (L-1)] only; the shipped drafter, trained on short blocks, asks for
    it, and the
    flag makes sure) the output stays lossless and the served rounds equal the replay
    drafting the same short blocks. The replay with whole-block drafts must differ from it
    (stage 11: short [7, 42, 53] vs whole [6, 41, 53]; stage 12: [7, 43, 52] vs [6, 44, 54];
    stage 30: [5, 41, 48] vs [5, 40, 48]), which is what gives the equality its power: if a new
    drafter drafts the same either way, pick a pattern where it does not (patterns of one L, as
    (3, 3, 3, 3), often give equal rounds on stage 30). Unseeded sampled requests in the
    same server run the sampled short-draft path (their exactness does not depend on the drafts:
    test_sampling.py)."""
    prompts = chat_ids[:3]
    with start_server("shipped-short", ["--dtype", "float32", "--max-total-tokens", "16384"],
                      ["--speculative-domino-debug-draft-len", ",".join(map(str, SHORT_PATTERN)),
                       "--speculative-domino-debug-short-draft", "on",
                       "--speculative-domino-lookup", "off"]) as server:
        assert "draft pass L tokens" in server.log()
        outs = [_generate(server.url, ids) for ids in prompts]
        sampled = [_generate(server.url, ids, temperature=0.8) for ids in prompts[:2]]
    assert [out["output_ids"] for out in outs] == reference[:3]
    assert [len(out["output_ids"]) for out in sampled] == [NEW_TOKENS] * 2
    records = [{"id": i, "ids": ids + out["output_ids"], "start": len(ids)}
               for i, (ids, out) in enumerate(zip(prompts, outs))]
    served = [out["meta_info"]["spec_verify_ct"] for out in outs]
    replayed = _replay(records, SHORT_PATTERN, short_draft=True)
    whole = _replay(records, SHORT_PATTERN)
    print(f"pattern {SHORT_PATTERN}, short drafts: rounds served {served}, replayed {replayed} "
          f"(whole-block drafts {whole})")
    assert served == replayed
    assert whole != replayed, f"pattern {SHORT_PATTERN} no longer tells short drafts apart"


def _replay(records: list[dict], draft_lens: tuple[int, ...] | None = None,
            short_draft: bool = False, tau: bool = False) -> list[int] | float:
    import torch

    from domino_sglang.model.config import load_draft_config
    from domino_sglang.model.drafter import DominoDrafter
    from domino_sglang.model.vocab import load_draft_vocab
    from domino_sglang.paths import target_dir
    from domino_sglang.train.evaluate import replay_rounds, replay_tau
    from domino_sglang.train.features import TargetFeatures
    from domino_sglang.train.module import DrafterTrainModule

    dconf = load_draft_config(shipped_drafter_dir())
    feats = TargetFeatures(target_dir(), list(dconf.target_layer_ids), torch.float32)
    drafter = DominoDrafter.from_pretrained(dconf, dtype=torch.float32).eval()
    module = DrafterTrainModule(drafter, feats.embed_weight, feats.lm_head_weight,
                                load_draft_vocab(dconf.path, dconf.vocab_size))  # as served
    if tau:  # what a training run logs for these records
        return replay_tau(module, feats, records)
    return [replay_rounds(module, feats, rec, draft_lens=draft_lens, short_draft=short_draft)
            for rec in records]
