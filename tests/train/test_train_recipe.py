"""Multi-phase recipes (train/recipe.py): phases chain, resume per phase and equal one
uninterrupted run; the shipped SmolLM2 recipe parses into the drafter it documents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from domino_sglang.train.config import TrainConfigError
from domino_sglang.train.loop import train
from domino_sglang.train.recipe import load_recipe, phase_step, plan, run_recipe
from tests.harness.train_fixtures import make_records, make_tiny_target

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = REPO / "domino_sglang" / "train" / "recipes" / "smollm2-135m.toml"
SHIPPED = REPO / "domino_sglang" / "drafters" / "SmolLM2-135M-Instruct-domino"

TINY = """
num_layers = 1
block_size = 4
num_features = 2
gru_hidden_dim = 8
emb_dim = 4
batch_size = 2
anchors = 4
max_seq_len = 64
lr = 3e-3
eval_records = 2
eval_every = 2
log_every = 2
save_every = 2
threads = 1
feature_dtype = "float32"
device = "cpu"

[[phase]]
name = "first"
steps = 4
draft_vocab = 40

[[phase]]
name = "second"
keep_draft_vocab = true
draft_vocab = 40
steps = 3
lr = 1e-3
lambda_decay_frac = 0.0
seed = 1
"""


def _recipe(tmp: Path, out: str) -> tuple[list, Path]:
    (tmp / "tiny.toml").write_text(TINY)
    return load_recipe(tmp / "tiny.toml", {"data": str(tmp / "data.jsonl"), "out": str(tmp / out),
                                           "target": str(tmp / "target")})


def test_phases_chain_resume_and_equal_an_uninterrupted_run(tmp_path, capsys):
    torch.set_num_threads(1)
    make_records(tmp_path / "data.jsonl")
    make_tiny_target(tmp_path / "target")
    phases, root = _recipe(tmp_path, "whole")
    assert [p.name for p in phases] == ["first", "second"]
    assert phases[1].conf.init == str(root / "first" / "drafter")  # from the previous phase
    assert phases[1].conf.lr == 1e-3 and phases[0].conf.lr == 3e-3  # phase > base
    final = run_recipe(phases, root, progress=False)
    first, second = root / "first", root / "second"
    # phase 2 started from phase 1's export, over phase 1's vocabulary and linked features
    assert (second / "init" / "model.safetensors").read_bytes() == \
        (first / "drafter" / "model.safetensors").read_bytes()
    assert (second / "draft_vocab.json").read_text() == (first / "draft_vocab.json").read_text()
    feats = sorted((first / "features").iterdir())
    assert feats and all((second / "features" / f.name).stat().st_ino == f.stat().st_ino
                         for f in feats)
    assert final == root / "drafter"
    assert (final / "model.safetensors").read_bytes() == \
        (second / "drafter" / "model.safetensors").read_bytes()
    assert [phase_step(p) for p in phases] == [4, 3]

    # a finished recipe re-run trains nothing
    stamp = (second / "checkpoint" / "state.pt").stat().st_mtime_ns
    capsys.readouterr()
    run_recipe(phases, root, progress=False)
    assert (second / "checkpoint" / "state.pt").stat().st_mtime_ns == stamp
    assert capsys.readouterr().out.count("done, skipped") == 2

    # interrupted inside phase 1, then re-run: resumes there, then phase 2; the same drafter
    phases2, root2 = _recipe(tmp_path, "cut")
    train(phases2[0].conf, progress=False, stop_at=2)
    assert phase_step(phases2[0]) == 2 and "at step 2" in plan(phases2, root2)
    run_recipe(phases2, root2, progress=False)
    a = torch.load(second / "checkpoint" / "drafter.pt", weights_only=True)
    b = torch.load(root2 / "second" / "checkpoint" / "drafter.pt", weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)
    init = torch.load(first / "checkpoint" / "drafter.pt", weights_only=True)
    assert any(not torch.allclose(init[k], a[k]) for k in a)  # phase 2 trained


@pytest.mark.parametrize("body, message", [
    ('[[phase]]\nsteps = 1\n', "needs a 'name'"),
    ('[[phase]]\nname = "a"\n[[phase]]\nname = "a"\n', "used twice"),
    ('[[phase]]\nname = "a"\nkeep_draft_vocab = true\n', "needs a previous phase"),
    ('[[phase]]\nname = "a"\nout = "x"\n', "'out' is the recipe's"),
    ('[[phase]]\nname = "a"\n[[phase]]\nname = "b"\nstepz = 3\n', "unknown key 'stepz'"),
    ('[[phase]]\nname = "a"\n[[phase]]\nname = "b"\nlr = "fast"\n', "(phase 'b')"),
    ('phase = 3\n', "[[phase]] tables"),
])
def test_bad_phases_name_the_problem(tmp_path, body, message):
    path = tmp_path / "r.toml"
    path.write_text('data = "d.jsonl"\nout = "o"\n' + body)
    with pytest.raises(TrainConfigError) as err:
        load_recipe(path)
    assert message in str(err.value)


def test_smollm2_recipe_resolves_to_the_shipped_drafter(tmp_path, capsys):
    """The one recipe's last phase makes a drafter of the shipped drafter's shape and settings
    (the weights themselves need ~14 h of training: not re-run here)."""
    phases, root = load_recipe(SMOLLM2, {"out": str(tmp_path / "run")})
    names = [p.name for p in phases]
    assert len(phases) == 21 and names[0] == "stage1" and names[-1] == "stage30"
    assert not phases[0].conf.init and all(p.init_from_previous for p in phases[1:])
    shipped = json.loads((SHIPPED / "config.json").read_text())
    head = shipped["dflash_config"]
    first, last = phases[0].conf, phases[-1].conf
    layers = first.num_layers + sum(p.conf.add_layers for p in phases)
    assert layers == shipped["num_hidden_layers"]
    assert (first.block_size, first.gru_hidden_dim, first.emb_dim, first.num_features) == (
        shipped["block_size"], head["gru_hidden_dim"], head["emb_dim"],
        len(head["target_layer_ids"]))
    assert last.copy_gate == head["copy_gate"] and (last.short_blocks > 0) == head["short_draft"]
    # the vocabulary: built by the last phase that does not keep its predecessor's, over its
    # training ids (the 16 highest held out), then kept to the end
    vocab = json.loads((SHIPPED / "draft_vocab.json").read_text())
    builder = max(i for i, p in enumerate(phases) if p.conf.draft_vocab and not p.keep_draft_vocab)
    assert all(p.keep_draft_vocab for p in phases[builder + 1:])
    assert phases[builder].conf.draft_vocab == vocab["size"]
    assert vocab["max_id"] < phases[builder].conf.max_id
    from domino_sglang.cli import main

    assert main(["train", "--config", str(SMOLLM2), "--out", str(tmp_path / "run"),
                 "--plan"]) == 0
    lines = capsys.readouterr().out.splitlines()  # a phase line and its features line each
    assert len(lines) == 43 and lines[-2].startswith("21. stage30:") and "[to run]" in lines[-2]
    assert lines[-1].strip().startswith("features cache:") or "sized when" in lines[-1]
