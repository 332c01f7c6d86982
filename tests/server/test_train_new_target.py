"""End to end on a new target: a tiny random Qwen3 (4 layers, its own tokenizer) -> regenerate
through a real CPU server of it -> `domino-sglang train --target` (defaults sized from the
target's config) -> `serve` the drafter -> lossless, and tau above a random drafter's.

The conversations are ShareGPT-style JSONL written here; `regenerate --data FILE --server URL`
has the running target answer them (on-policy). 4 target layers, not 2: with 2 the only target
layer the spread can read is the last one, whose transformers hidden state is final-normed while
SGLang captures it before the norm, so training and serving would read different features.
The drafter is served with a fixed block and no lookup (--speculative-domino-adaptive off,
--speculative-domino-lookup off), so its verify rounds per prompt must equal `replay_rounds` (the
worker's loop replayed offline);
the random drafter is the run's untrained starting point (out/init: backbone warm-started from
the target's last layer, head at random), replayed the same way (a third server would not fit
the time budget).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from tests.harness.new_target_fixtures import conversations, make_qwen3_target
from tests.harness.servers import start_server

pytestmark = pytest.mark.server
NEW_TOKENS = 48
N_CONV = 16


def _greedy(server, ids: list[int]) -> dict:
    r = requests.post(f"{server.url}/generate", json={
        "input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": NEW_TOKENS},
    }, timeout=600)
    r.raise_for_status()
    return r.json()


def _replay(drafter: Path, target: Path, records: list[dict]) -> list[int]:
    """Verify rounds `drafter` needs per record, the worker's greedy loop replayed offline."""
    import torch

    from domino_sglang.model.config import load_draft_config
    from domino_sglang.model.drafter import DominoDrafter
    from domino_sglang.train.evaluate import replay_rounds
    from domino_sglang.train.features import TargetFeatures
    from domino_sglang.train.module import DrafterTrainModule

    conf = load_draft_config(drafter)
    model = DominoDrafter.from_pretrained(conf, dtype=torch.float32)
    feats = TargetFeatures(target, list(conf.target_layer_ids), torch.float32)
    module = DrafterTrainModule(model, feats.embed_weight, feats.lm_head_weight)
    return [replay_rounds(module, feats, rec) for rec in records]


def test_new_target_regenerate_train_serve(tmp_path):
    from domino_sglang.cli import main

    target = make_qwen3_target(tmp_path / "target", hidden=128, head_dim=64)
    convs = tmp_path / "convs.jsonl"
    convs.write_text("".join(json.dumps(c) + "\n" for c in conversations(N_CONV)))
    plain_args = ["--no-speculation", "--model-path", str(target), "--dtype", "float32",
                  "--max-total-tokens", "4096"]
    with start_server("new-target-plain", plain_args) as plain:
        data = tmp_path / "regen.jsonl"
        assert main(["regenerate", "--data", str(convs), "--server", plain.url,
                     "--model-path", str(target), "--out", str(data),
                     "--max-new-tokens", str(NEW_TOKENS), "--concurrency", "4"]) == 0
        records = [json.loads(line) for line in data.read_text().splitlines()]
        assert len(records) == N_CONV
        run = tmp_path / "run"
        assert main(["train", "--target", str(target), "--data", str(data), "--out", str(run),
                     "--device", "cpu", "--steps", "300", "--set", "lr=3e-3",
                     "--set", "eval_records=0", "--set", "threads=1",
                     "--set", "feature_dtype=float32", "--set", "max_seq_len=128",
                     "--set", "log_every=50", "--set", "save_every=300"]) == 0
        cfg = json.loads((run / "drafter" / "config.json").read_text())
        assert cfg["block_size"] == 16 and cfg["num_hidden_layers"] == 1  # sized from target
        assert cfg["dflash_config"]["target_layer_ids"] == [2]
        log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
        assert log[0]["run"]["data_policy"] == "on-policy"
        assert log[0]["run"]["device"] == "cpu"
        losses = [e["loss"] for e in log if "loss" in e]
        assert losses[-1] < losses[0]
        assert log[-1]["lambda"] < 0.01  # lambda linear 1 -> 0 over the run
        prompts = [r["prompt_ids"] for r in records]
        reference = [_greedy(plain, ids)["output_ids"] for ids in prompts]
        # fixed block, the drafter's own drafts only: what replay_rounds replays
        with start_server("new-target-domino", ["--drafter", str(run / "drafter"),
                                                *plain_args[1:]],
                          ["--speculative-domino-adaptive", "off",
                           "--speculative-domino-lookup", "off"]) as domino:
            outs = [_greedy(domino, ids) for ids in prompts]
    for out, want in zip(outs, reference):
        assert out["output_ids"] == want  # lossless: float32 greedy, token for token
    served = [out["meta_info"]["spec_verify_ct"] for out in outs]
    tau = sum(len(o["output_ids"]) for o in outs) / sum(served)
    recs = [{"id": i, "ids": ids + o["output_ids"], "start": len(ids)}
            for i, (ids, o) in enumerate(zip(prompts, outs))]
    trained = _replay(run / "drafter", target, recs)
    random = _replay(run / "init", target, recs)
    tau_random = sum(len(o["output_ids"]) for o in outs) / sum(random)
    print(f"served tau {tau:.2f} ({sum(served)} rounds; replayed {sum(trained)}), random drafter "
          f"tau {tau_random:.2f} ({sum(random)} rounds)")
    assert served == trained  # serving drafts exactly what the trained drafter computes
    assert tau > tau_random + 0.3, (tau, tau_random)  # training learned
