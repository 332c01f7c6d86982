"""Training for any target, fast parts: conversations as data (ShareGPT / OpenAI chat), target-sized
defaults, device and distributed-backend choice, the train / regenerate CLI edges."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from domino_sglang.train.config import TrainConfigError, load_train_config, target_defaults
from domino_sglang.train.conversations import (
    ConversationError,
    is_records_file,
    prompt_items,
    read_conversations,
    written_records,
)
from domino_sglang.train.loop import train
from domino_sglang.train.parallel import dist_backend, resolve_device
from tests.harness.new_target_fixtures import conversations, make_qwen3_target, make_tokenizer


def test_sharegpt_json_and_openai_jsonl_read_the_same(tmp_path):
    share = tmp_path / "share.json"
    share.write_text(json.dumps(conversations(3)))
    openai = tmp_path / "chat.jsonl"
    openai.write_text("".join(json.dumps({"messages": [
        {"role": "user" if t["from"] == "human" else "assistant", "content": t["value"]}
        for t in c["conversations"]]}) + "\n" for c in conversations(3)))
    assert read_conversations(share) == read_conversations(openai)
    assert not is_records_file(share) and not is_records_file(openai)


def test_bad_conversations_name_the_place(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": []}) + "\n{oops\n")
    with pytest.raises(ConversationError, match=r"bad.jsonl:2: not valid JSON"):
        read_conversations(bad)
    bad.write_text(json.dumps({"text": "hi"}) + "\n")
    with pytest.raises(ConversationError, match=r"bad.jsonl:1: no 'conversations'"):
        read_conversations(bad)
    bad.write_text(json.dumps({"messages": [{"role": "robot", "content": "x"}]}) + "\n")
    with pytest.raises(ConversationError, match=r"turn 0 needs 'role'"):
        read_conversations(bad)


def test_written_records_split_prompt_and_answer_by_the_chat_template(tmp_path):
    tok = make_tokenizer(tmp_path / "tok")
    convs = read_conversations(_write(tmp_path / "c.jsonl", conversations(4)))
    recs = written_records(convs, tok, 256)
    assert [r["id"] for r in recs] == [0, 1, 2, 3]
    for rec, (_, msgs) in zip(recs, convs):
        answer = tok(msgs[-1]["content"], add_special_tokens=False)["input_ids"]
        assert rec["output_ids"][: len(answer)] == answer  # the written answer, then <|im_end|>
        assert rec["output_ids"][len(answer)] == tok.eos_token_id
        assert rec["prompt_ids"] == prompt_items([(0, msgs)], tok, 256)[0][1]
        assert rec["finish"] == "written"


def test_target_defaults_follow_upstream_spread_and_scale():
    from domino_sglang.model.config import spread_layer_ids

    big = target_defaults({"num_hidden_layers": 36, "hidden_size": 4096})
    assert big == {"block_size": 16, "lambda_decay_frac": 1.0, "num_layers": 5,
                   "num_features": 5, "gru_hidden_dim": 1024, "emb_dim": 256}
    # SGLang 0.5.23 dflash_utils.build_target_layer_ids(36, 5), written out
    assert spread_layer_ids(36, big["num_features"]) == [1, 9, 17, 25, 33]
    small = target_defaults({"num_hidden_layers": 30, "hidden_size": 576})  # SmolLM2-135M
    assert (small["num_layers"], small["gru_hidden_dim"], small["emb_dim"]) == (4, 256, 64)
    with pytest.raises(TrainConfigError, match="lacks 'hidden_size'"):
        target_defaults({"num_hidden_layers": 4})


def test_defaults_are_the_lowest_config_layer(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('data = "d.jsonl"\nout = "o"\nnum_layers = 3\n')
    conf = load_train_config(recipe, {"emb_dim": 8}, {"num_layers": 5, "emb_dim": 32,
                                                     "gru_hidden_dim": 64})
    assert (conf.num_layers, conf.emb_dim, conf.gru_hidden_dim) == (3, 8, 64)


def test_device_and_backend():
    assert resolve_device("cpu") == torch.device("cpu")
    assert dist_backend(torch.device("cpu")) == "gloo"  # even on a GPU host
    assert dist_backend(torch.device("cuda", 0)) == "nccl"
    if not torch.cuda.is_available():
        assert resolve_device("auto") == torch.device("cpu")
        with pytest.raises(TrainConfigError, match="'device' is cuda but torch sees no CUDA"):
            load_train_config(None, {"data": "d", "out": "o", "device": "cuda"})
    with pytest.raises(TrainConfigError, match="'device' must be auto, cpu or cuda"):
        load_train_config(None, {"data": "d", "out": "o", "device": "tpu"})


def test_training_on_written_conversations_is_labelled_off_policy(tmp_path):
    target = make_qwen3_target(tmp_path / "target")
    data = _write(tmp_path / "c.jsonl", conversations(6))
    conf = load_train_config(None, {
        "data": str(data), "out": str(tmp_path / "run"), "target": str(target), "steps": 4,
        "num_layers": 1, "num_features": 1, "block_size": 4, "gru_hidden_dim": 8, "emb_dim": 4,
        "anchors": 2, "eval_records": 2, "eval_every": 4, "log_every": 2, "save_every": 4,
        "threads": 1, "feature_dtype": "float32", "device": "cpu",
        "report_to": "tensorboard"})
    out = train(conf, progress=False)
    assert (out / "model.safetensors").is_file()
    first = json.loads((tmp_path / "run" / "log.jsonl").read_text().splitlines()[0])
    assert first["run"]["data_policy"] == "off-policy" and first["run"]["device"] == "cpu"
    recs = (tmp_path / "run" / "data-as-written.jsonl").read_text().splitlines()
    assert len(recs) == 6 and is_records_file(tmp_path / "run" / "data-as-written.jsonl")
    if importlib.util.find_spec("tensorboard") is None:  # optional dependency, not in the venv
        return
    assert any((tmp_path / "run" / "tensorboard").iterdir())


def test_cli_train_target_errors(tmp_path, capsys):
    from domino_sglang.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--target", str(tmp_path / "nowhere"), "--data", "d", "--out", "o"])
    assert "--target" in capsys.readouterr().err
    target = make_qwen3_target(tmp_path / "target")
    with pytest.raises(SystemExit):
        main(["train", "--target", str(target), "--data", str(tmp_path / "d.jsonl"),
              "--out", str(tmp_path / "o"), "--resume"])
    assert "not found" in capsys.readouterr().err
    data = _write(tmp_path / "c.jsonl", conversations(2))
    with pytest.raises(SystemExit):
        main(["train", "--target", str(target), "--data", str(data),
              "--out", str(tmp_path / "o"), "--resume"])
    assert "has no checkpoint" in capsys.readouterr().err


def _write(path, convs):
    path.write_text("".join(json.dumps(c) + "\n" for c in convs))
    return path


DDP_RUN = """
import sys, torch
from pathlib import Path
from domino_sglang.train.config import load_train_config
from domino_sglang.train.loop import train
from tests.harness.train_fixtures import tiny_overrides
torch.set_num_threads(1)
tmp = Path(sys.argv[1])
conf = load_train_config(None, tiny_overrides(tmp, steps=4, batch_size=1, out=str(tmp / "ddp"),
                         data=str(tmp / "data.jsonl"), target=str(tmp / "target"),
                         device="cpu"))
train(conf, progress=False)
"""


def test_torchrun_two_cpu_processes_train_the_single_process_drafter(tmp_path):
    """DDP (gloo, 2 ranks x 1 sequence) and one process (2 sequences) see the same global batch
    each step (step_records), and DDP averages equal-sized per-rank means: the same drafter to
    float rounding (all-reduce order)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from domino_sglang.cli.local_server import free_port
    from tests.harness.train_fixtures import make_records, make_tiny_target, tiny_overrides

    make_records(tmp_path / "data.jsonl")
    make_tiny_target(tmp_path / "target")
    (tmp_path / "run.py").write_text(DDP_RUN)
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_port", str(free_port()), str(tmp_path / "run.py"), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=300, cwd=repo)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((tmp_path / "ddp" / "log.jsonl").read_text().splitlines()[0])["run"]
    assert run["world"] == 2 and run["backend"] == "gloo"
    torch.set_num_threads(1)
    single = load_train_config(None, tiny_overrides(
        tmp_path, steps=4, batch_size=2, out=str(tmp_path / "single"),
        data=str(tmp_path / "data.jsonl"), target=str(tmp_path / "target"), device="cpu"))
    train(single, progress=False)
    a = torch.load(tmp_path / "ddp" / "checkpoint" / "drafter.pt", weights_only=True)
    b = torch.load(tmp_path / "single" / "checkpoint" / "drafter.pt", weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
    from safetensors.torch import load_file  # the runs moved the weights: not two inits

    init = load_file(str(tmp_path / "single" / "init" / "model.safetensors"))
    assert any(not torch.allclose(init[k].float(), b[k], atol=1e-4) for k in b if k in init)
