"""`strategy = "fsdp"` (FSDP2 fully_shard) under torchrun on the CPU (gloo): the sharded target and
drafter train the single-process drafter, through a cut and a resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from domino_sglang.train.config import TrainConfigError, load_train_config
from domino_sglang.train.loop import train
from tests.harness.train_fixtures import make_records, make_tiny_target, tiny_overrides

FSDP_RUN = """
import sys, torch
from pathlib import Path
from domino_sglang.train.config import load_train_config
from domino_sglang.train.loop import train
from domino_sglang.train.parallel import init_dist
from tests.harness.train_fixtures import tiny_overrides
torch.set_num_threads(1)
tmp = Path(sys.argv[1])
conf = load_train_config(None, tiny_overrides(tmp, steps=4, batch_size=1, save_every=2,
                         out=str(tmp / "fsdp"), data=str(tmp / "data.jsonl"),
                         target=str(tmp / "target"), device="cpu", strategy="fsdp",
                         distill=0.5, distill_topk=8))
init_dist()  # one group for both calls
train(conf, progress=False, stop_at=2)  # cut after step 2's checkpoint...
train(conf, progress=False)  # ...and resumed (model and optimizer state from the full dicts)
torch.distributed.destroy_process_group()
"""


def test_torchrun_fsdp_two_cpu_processes_train_the_single_process_drafter(tmp_path):
    """FSDP2 (gloo, 2 ranks x 1 sequence; the target's layers and the drafter sharded, the
    target's features computed in lockstep) and one process (2 sequences) see the same global
    batch and average the same gradients: the same drafter to float rounding, here after a
    cut at step 2 and a resume."""
    from domino_sglang.cli.local_server import free_port

    make_records(tmp_path / "data.jsonl")
    make_tiny_target(tmp_path / "target")
    (tmp_path / "run.py").write_text(FSDP_RUN)
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_port", str(free_port()), str(tmp_path / "run.py"), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=400, cwd=repo)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(x) for x in (tmp_path / "fsdp" / "log.jsonl").read_text().splitlines()]
    assert lines[0]["run"]["world"] == 2 and lines[0]["run"]["backend"] == "gloo"
    assert [x["step"] for x in lines if "loss" in x] == [3, 4]  # resumed at 2, not restarted
    state = torch.load(tmp_path / "fsdp" / "checkpoint" / "state.pt", weights_only=True)
    assert state["strategy"] == "fsdp" and state["step"] == 4
    torch.set_num_threads(1)
    single = load_train_config(None, tiny_overrides(
        tmp_path, steps=4, batch_size=2, out=str(tmp_path / "single"),
        data=str(tmp_path / "data.jsonl"), target=str(tmp_path / "target"), device="cpu",
        distill=0.5, distill_topk=8))
    train(single, progress=False)
    a = torch.load(tmp_path / "fsdp" / "checkpoint" / "drafter.pt", weights_only=True)
    b = torch.load(tmp_path / "single" / "checkpoint" / "drafter.pt", weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
    from safetensors.torch import load_file  # the runs moved the weights: not two inits

    init = load_file(str(tmp_path / "single" / "init" / "model.safetensors"))
    assert any(not torch.allclose(init[k].float(), b[k], atol=1e-4) for k in b if k in init)
    # a checkpoint is resumed only by the strategy that wrote it (the optimizer layouts differ)
    with pytest.raises(TrainConfigError, match="written by strategy fsdp"):
        train(load_train_config(None, tiny_overrides(
            tmp_path, steps=5, out=str(tmp_path / "fsdp"), data=str(tmp_path / "data.jsonl"),
            target=str(tmp_path / "target"), device="cpu")), progress=False)


def test_strategy_is_validated(tmp_path):
    with pytest.raises(TrainConfigError, match="'strategy' must be ddp or fsdp"):
        load_train_config(None, {"data": "d", "out": "o", "strategy": "zero3"})
    with pytest.raises(TrainConfigError, match="needs features = cache"):
        load_train_config(None, {"data": "d", "out": "o", "strategy": "fsdp",
                                 "features": "online"})
    from domino_sglang.cli import main

    with pytest.raises(SystemExit):  # argparse: the choices
        main(["train", "--data", "d", "--out", "o", "--strategy", "zero3"])
