"""Training: the curriculum schedule and its gradients, learning, exact resume, DDP sync, config."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from domino_sglang.train.config import TrainConfigError, load_train_config
from domino_sglang.train.curriculum import block_loss, lambda_at, position_weights, tau_sim
from domino_sglang.train.loop import train
from domino_sglang.train.records import (
    epoch_pool,
    sample_anchors,
    sample_block_anchors,
    sample_draft_lengths,
    step_records,
)
from tests.harness.train_fixtures import tiny_overrides

torch.set_num_threads(1)


def test_lambda_schedule_values():
    # decays linearly from 1 to 0 over the first half, then stays at 0
    assert lambda_at(0, 100, 0.5) == 1.0
    assert lambda_at(25, 100, 0.5) == pytest.approx(0.5)
    assert lambda_at(40, 100, 0.5) == pytest.approx(0.2)
    assert lambda_at(50, 100, 0.5) == 0.0
    assert lambda_at(99, 100, 0.5) == 0.0
    assert lambda_at(50, 100, 1.0) == pytest.approx(0.5)
    assert lambda_at(0, 100, 0.0) == 0.0  # no curriculum: final loss only
    assert position_weights(3, 7.0).tolist() == pytest.approx([1.0, 0.8669, 0.7515], rel=1e-3)
    assert tau_sim([1.0, 1.0]) == 3.0 and tau_sim([0.5, 0.5]) == 1.75 and tau_sim([0.0]) == 1.0


def _head_and_inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    n, p, h, v, gdim, e = 3, 4, 8, 11, 6, 5
    gru = torch.nn.GRU(h, gdim, bias=False, batch_first=True)
    proj = torch.nn.Sequential(torch.nn.Linear(h + gdim, e, bias=False), torch.nn.SiLU(),
                               torch.nn.Linear(e, v, bias=False))
    z = torch.randn(n, p, h, generator=g, requires_grad=True)
    prev = torch.randn(n, p, h, generator=g)
    labels = torch.randint(0, v, (n, p), generator=g)
    lm = torch.randn(v, h, generator=g)
    return z, prev, labels, lm, gru, proj


def test_head_gets_gradient_only_when_lambda_below_one():
    z, prev, labels, lm, gru, proj = _head_and_inputs()
    loss, _ = block_loss(z, prev, labels, lm, gru, proj, lam=1.0, gamma=7.0)
    loss.backward()
    assert z.grad is not None and z.grad.abs().sum() > 0  # the backbone learns
    assert all(p.grad is None for p in [*gru.parameters(), *proj.parameters()])

    z, prev, labels, lm, gru, proj = _head_and_inputs()
    loss, _ = block_loss(z, prev, labels, lm, gru, proj, lam=0.3, gamma=7.0)
    loss.backward()
    for p in [*gru.parameters(), *proj.parameters()]:
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_curriculum_mixes_the_two_losses():
    z, prev, labels, lm, gru, proj = _head_and_inputs()
    _, st = block_loss(z, prev, labels, lm, gru, proj, lam=0.0, gamma=7.0)
    loss, _ = block_loss(z, prev, labels, lm, gru, proj, lam=0.25, gamma=7.0)
    expected = 0.75 * st["ce_final"] + 0.25 * st["ce_base"]
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("keep", [None, [0, 2, 3, 5, 7, 8]])
def test_draft_vocab_loss_is_the_masked_full_loss(keep):
    """Over a draft vocabulary the loss, its gradient and the accuracies are the full-vocabulary
    ones with the logits outside it at -inf and the labels outside it left out of the CE (but
    counted as misses); the whole vocabulary as draft vocabulary changes nothing."""
    import torch.nn.functional as F

    from domino_sglang.train.curriculum import IGNORE, weighted_ce

    z, prev, labels, lm, gru, proj = _head_and_inputs(seed=3)
    v = lm.shape[0]
    vocab = torch.arange(v) if keep is None else torch.tensor(keep)
    labels[0, 1] = IGNORE
    g = torch.Generator().manual_seed(4)
    z0, y0 = torch.randn(5, z.shape[-1], generator=g), torch.tensor([0, 1, 4, 8, 10])
    lam, gamma = 0.4, 7.0
    loss, st = block_loss(z, prev, labels, lm, gru, proj, lam, gamma, (z0, y0), vocab)
    loss.backward()
    grad, proj_grad = z.grad.clone(), proj[2].weight.grad.clone()

    z.grad = None
    proj.zero_grad()
    outside = torch.ones(v, dtype=torch.bool).index_fill_(0, vocab, False)  # [V]

    def ce_labels(y):  # IGNORE outside the vocabulary
        return torch.where(outside[y.clamp_min(0)], IGNORE, y)

    base = F.linear(z, lm).masked_fill(outside, float("-inf"))  # [N, P, V]
    s, _ = gru(prev)
    corr = proj(torch.cat((z[:, 1:], s[:, 1:]), dim=-1))
    final = torch.cat((base[:, :1], base[:, 1:] + corr), dim=1)
    first = F.linear(z0, lm).masked_fill(outside, float("-inf"))  # [M, V]
    y0_ce = ce_labels(y0)
    extra = (F.cross_entropy(first, y0_ce, ignore_index=IGNORE, reduction="sum"),
             (y0_ce != IGNORE).sum())
    w = position_weights(z.shape[1], gamma)
    ref = ((1 - lam) * weighted_ce(final, ce_labels(labels), w, extra)
           + lam * weighted_ce(base, ce_labels(labels), w, extra))
    ref.backward()
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-5)
    assert torch.allclose(grad, z.grad, atol=1e-6)
    assert torch.allclose(proj_grad, proj[2].weight.grad, atol=1e-6)
    assert proj_grad[outside].abs().sum() == 0  # rows outside the vocabulary are not trained
    valid = labels != IGNORE
    assert st["valid"] == [int(x) + (5 if k == 0 else 0) for k, x in enumerate(valid.sum(0))]
    hit0 = int((first.argmax(-1) == y0).sum())
    assert st["correct_base"] == [int(x) + (hit0 if k == 0 else 0) for k, x in
                                  enumerate(((base.argmax(-1) == labels) & valid).sum(0))]
    assert st["correct_final"] == [int(x) + (hit0 if k == 0 else 0) for k, x in
                                   enumerate(((final.argmax(-1) == labels) & valid).sum(0))]
    if keep is not None:  # the reduced case is not the full one in disguise
        assert bool(outside[labels.clamp_min(0)].any()) and bool(outside[y0].any())


def test_soft_ce_is_the_cross_entropy_to_the_renormalised_top_k():
    """The distillation term: -sum_v p(v) log q(v), p = softmax(top-k logits / tau) over the
    top-k tokens inside the draft vocabulary; a row with none inside contributes nothing."""
    from domino_sglang.train.curriculum import soft_ce

    g = torch.Generator().manual_seed(5)
    v, vocab = 12, torch.tensor([0, 2, 3, 5, 7, 8, 11])
    logits = torch.randn(3, len(vocab), generator=g)  # the drafter's, over the vocabulary
    ids = torch.tensor([[2, 4, 7], [11, 0, 1], [1, 4, 6]])  # row 2: nothing inside
    top = torch.tensor([[3.0, 2.0, 1.0], [1.5, 1.0, 0.5], [2.0, 1.0, 0.0]])
    ce, ok = soft_ce(logits, ids, top, tau=0.5, vocab=vocab, vocab_size=v)
    assert ok.tolist() == [True, True, False]
    logq = torch.log_softmax(logits, -1)
    p0 = torch.softmax(torch.tensor([3.0, 1.0]) / 0.5, -1)  # 2 and 7 (4 is outside)
    assert float(ce[0]) == pytest.approx(float(-(p0[0] * logq[0, 1] + p0[1] * logq[0, 4])))
    p1 = torch.softmax(torch.tensor([1.5, 1.0]) / 0.5, -1)  # 11 and 0
    assert float(ce[1]) == pytest.approx(float(-(p1[0] * logq[1, 6] + p1[1] * logq[1, 0])))
    assert float(ce[2]) == 0.0


def test_distilling_a_one_hot_teacher_is_the_hard_loss():
    """With the teacher's top-k all on the label (its other logits far below), the mixed loss is
    the greedy-label loss whatever beta, first-draft blocks included; a flatter teacher is not."""
    z, prev, labels, lm, gru, proj = _head_and_inputs(seed=6)
    v, k = lm.shape[0], 3
    g = torch.Generator().manual_seed(7)
    z0, y0 = torch.randn(4, z.shape[-1], generator=g), torch.tensor([0, 3, 5, 9])

    def teacher(y: torch.Tensor, gap: float):  # label first, then other tokens gap below
        others = torch.stack([(y + j) % v for j in range(1, k)], -1)
        ids = torch.cat((y[..., None], others), -1)
        logits = torch.zeros(ids.shape)
        logits[..., 1:] = -gap
        return ids, logits

    hard, _ = block_loss(z, prev, labels, lm, gru, proj, 0.3, 7.0, (z0, y0))
    for gap, same in ((1e4, True), (1.0, False)):
        soft = (*teacher(labels, gap), *teacher(y0, gap))
        mixed, _ = block_loss(z, prev, labels, lm, gru, proj, 0.3, 7.0, (z0, y0), None, soft,
                              distill=0.6, tau=1.0)
        assert (float(mixed.detach()) == pytest.approx(float(hard.detach()), rel=1e-5)) == same


def test_loss_decreases_on_a_tiny_run(tmp_path):
    conf = load_train_config(None, tiny_overrides(tmp_path, steps=30, log_every=5, lr=1e-2,
                                                  eval_every=30, save_every=30))
    train(conf, progress=False)
    import json

    logs = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    losses = [x["loss"] for x in logs if "loss" in x]
    assert len(losses) == 6
    evals = [x for x in logs if "eval" in x]
    assert [x["step"] for x in evals] == [0, 30]  # the starting point, then every eval_every
    assert losses[-1] < 0.8 * losses[0], losses  # measured: 6.19 -> 4.70
    assert (tmp_path / "run" / "drafter" / "model.safetensors").is_file()
    from domino_sglang.model.config import load_draft_config, load_draft_weights

    weights = load_draft_weights(load_draft_config(tmp_path / "run" / "drafter"))
    assert all(t.dtype == torch.bfloat16 for t in weights.values())


@pytest.mark.parametrize("draft_vocab, short_blocks, distill",
                         [(0, 0.0, 0.0), (40, 0.0, 0.0), (0, 0.5, 0.0), (40, 0.0, 0.5)])
def test_resume_equals_uninterrupted(tmp_path, draft_vocab, short_blocks, distill):
    extra = {"draft_vocab": draft_vocab, "short_blocks": short_blocks, "distill": distill,
             "distill_topk": 8}
    (tmp_path / "a").mkdir()
    full = load_train_config(None, tiny_overrides(tmp_path / "a", **extra))
    train(full, progress=False)

    (tmp_path / "b").mkdir()
    part = load_train_config(None, tiny_overrides(tmp_path / "b", **extra))
    train(part, progress=False, stop_at=3)  # "interrupted" right after the step-3 checkpoint
    state = torch.load(tmp_path / "b" / "run" / "checkpoint" / "state.pt", weights_only=True)
    assert state["step"] == 3
    train(part, progress=False)  # resumes from step 3

    a = torch.load(tmp_path / "a" / "run" / "checkpoint" / "drafter.pt", weights_only=True)
    b = torch.load(tmp_path / "b" / "run" / "checkpoint" / "drafter.pt", weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # and training did move the weights (the equality above is not trivial)
    from safetensors.torch import load_file

    start = load_file(str(tmp_path / "a" / "run" / "init" / "model.safetensors"))
    assert any(not torch.equal(a[k], start[k].to(a[k].dtype)) for k in a)
    from domino_sglang.model.vocab import build_draft_vocab, load_draft_vocab

    exported = load_draft_vocab(tmp_path / "b" / "run" / "drafter", vocab_size=64)
    if draft_vocab:  # the 40 commonest answer tokens of the 10 training records (ids 0..9)
        always = [1, 2]  # the tiny target's BOS and EOS (its config; it has no tokenizer)
        assert exported.tolist() == build_draft_vocab(full.data, 40, max_id=9, always=always)
        assert len(exported) == 40 < len(build_draft_vocab(full.data, 64, max_id=9,
                                                           always=always))
    else:
        assert exported is None
    # a drafter trained on short blocks is served drafting short blocks (domino.py propose)
    from domino_sglang.model.config import load_draft_config

    assert load_draft_config(tmp_path / "b" / "run" / "drafter").short_draft == (short_blocks > 0)
    # distillation caches the target's top-k beside the features (read again on resume)
    tops = sorted((tmp_path / "b" / "run" / "features").glob("*.top8.safetensors"))
    assert bool(tops) == (distill > 0)
    if tops:
        top = load_file(str(tops[0]))
        ids, logits = top["ids"], top["logits"]
        assert ids.shape == logits.shape and ids.shape[1] == 8
        assert bool((logits[:, :-1] >= logits[:, 1:]).all())  # the k largest, in order


def test_data_order_is_a_pure_function_of_step_and_rank():
    a = step_records(10, 1, 2, rank=0, world=2, seed=3)
    assert a == step_records(10, 1, 2, rank=0, world=2, seed=3)
    b = step_records(10, 1, 2, rank=1, world=2, seed=3)
    assert set(a).isdisjoint(b)  # ranks read different records of the same step
    epoch = [i for s in range(5) for r in range(2) for i in step_records(10, s, 1, r, 2, 0)]
    assert sorted(epoch) == list(range(10))  # one epoch covers every record once
    recs = [{"id": i} for i in (3, 7, 1_000_000, 1_000_004)]
    assert epoch_pool(recs, []) == [0, 1, 2, 3]  # no oversampling: every record once
    pool = epoch_pool(recs, [1_000_000, 1_999_999, 3])  # a new domain three times an epoch
    assert sorted(pool) == [0, 1, 2, 2, 2, 3, 3, 3]
    g = torch.Generator().manual_seed(0)
    anchors = sample_anchors(5, 20, 30, g)
    assert anchors == sorted(set(anchors)) and min(anchors) >= 5 and max(anchors) <= 18


PROBE = """
import sys, torch
from domino_sglang.train.config import load_train_config
from domino_sglang.train.loop import train
from tests.harness.train_fixtures import tiny_overrides
from pathlib import Path
torch.set_num_threads(1)
tmp = Path(sys.argv[1])
conf = load_train_config(None, tiny_overrides(tmp, steps=3, data=str(tmp / "data.jsonl"),
                         target=str(tmp / "target")))
rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
def on_step(step, drafter):
    torch.save({k: v.clone() for k, v in drafter.state_dict().items()},
               tmp / f"rank{torch.distributed.get_rank()}-step{step}.pt")
train(conf, progress=False, on_step=on_step)
"""


def _torchrun(nproc: int, script: Path, args: list[str], cwd: Path, env: dict, log: Path,
              timeout: float = 1200.0) -> int:
    """`torchrun --standalone` of `script`, output to `log`; returns the exit status.
    --standalone lets the rendezvous bind a port the OS picks (no port chosen here and taken by
    someone else before use), with generous rendezvous and store timeouts
    (a busy 2-core machine can take minutes to start two torch processes). `timeout` only
    guards against a hang. Whatever the outcome, what is left of the run (agent and workers) is
    killed; output goes to a file, not a pipe a leftover worker could hold open."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node", str(nproc), "--rdzv-conf", "join_timeout=900,read_timeout=600",
           str(script), *args]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"torchrun still running after {timeout:.0f} s:\n"
                        + log.read_text()[-3000:])
        finally:
            _kill_tree(proc)


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 30 s, to `proc` and every process under it (torchrun starts
    its workers in sessions of their own, so its process group does not hold them)."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid)]
        tree += tree[0].children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=30)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=30)
    proc.poll()


def test_ddp_two_cpu_processes_stay_in_sync(tmp_path):
    from tests.harness.train_fixtures import make_records, make_tiny_target

    make_records(tmp_path / "data.jsonl")
    make_tiny_target(tmp_path / "target")
    (tmp_path / "probe.py").write_text(PROBE)
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)}
    log = tmp_path / "torchrun.log"
    rc = _torchrun(2, tmp_path / "probe.py", [str(tmp_path)], repo, env, log)
    assert rc == 0, log.read_text()[-3000:]
    for step in (1, 3):
        r0 = torch.load(tmp_path / f"rank0-step{step}.pt", weights_only=True)
        r1 = torch.load(tmp_path / f"rank1-step{step}.pt", weights_only=True)
        for k in r0:
            assert torch.equal(r0[k], r1[k]), (step, k)
    start = torch.load(tmp_path / "rank0-step1.pt", weights_only=True)
    end = torch.load(tmp_path / "rank0-step3.pt", weights_only=True)
    assert any(not torch.equal(start[k], end[k]) for k in start)


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(TrainConfigError, match="unknown key 'bogus'"):
        load_train_config(None, {"data": "d", "out": "o", "bogus": 1})
    with pytest.raises(TrainConfigError, match="'steps' must be int"):
        load_train_config(None, {"data": "d", "out": "o", "steps": "many"})
    with pytest.raises(TrainConfigError, match="'lambda_decay_frac' must be in"):
        load_train_config(None, {"data": "d", "out": "o", "lambda_decay_frac": 2.0})
    with pytest.raises(TrainConfigError, match="'data' is required"):
        load_train_config(None, {"out": "o"})
    with pytest.raises(TrainConfigError, match="'short_blocks' must be in"):
        load_train_config(None, {"data": "d", "out": "o", "short_blocks": 1.5})
    with pytest.raises(TrainConfigError, match="'first_anchors' must be >= 0"):
        load_train_config(None, {"data": "d", "out": "o", "first_anchors": -1})
    with pytest.raises(TrainConfigError, match="'compute_dtype' must be auto, bfloat16 or float32"):
        load_train_config(None, {"data": "d", "out": "o", "compute_dtype": "float16"})
    with pytest.raises(TrainConfigError, match="'distill' must be in"):
        load_train_config(None, {"data": "d", "out": "o", "distill": 1.5})
    with pytest.raises(TrainConfigError, match="'distill_temperature' must be positive"):
        load_train_config(None, {"data": "d", "out": "o", "distill_temperature": 0.0})
    bad = tmp_path / "recipe.toml"
    bad.write_text("steps = [")
    with pytest.raises(TrainConfigError, match="cannot read config"):
        load_train_config(bad)


def test_max_id_fixes_a_stage_data_as_the_file_grows(tmp_path):
    """A stage's records (and so its held-out set: the last eval_records of them) are the ids up
    to max_id, whatever the regenerated file gained since."""
    from domino_sglang.train.records import load_records
    from tests.harness.train_fixtures import make_records

    make_records(tmp_path / "data.jsonl", n=12)
    assert [r["id"] for r in load_records(tmp_path / "data.jsonl", 64)] == list(range(12))
    assert [r["id"] for r in load_records(tmp_path / "data.jsonl", 64, max_id=7)] == \
        list(range(8))
    with pytest.raises(TrainConfigError, match="'draft_vocab' must be >= 0"):
        load_train_config(None, {"data": "d", "out": "o", "draft_vocab": -1})
    with pytest.raises(TrainConfigError, match="'max_id' must be -1"):
        load_train_config(None, {"data": "d", "out": "o", "max_id": -2})


def test_skip_ids_leaves_out_a_gap_filled_after_the_stage_ran(tmp_path):
    """skip_ids [first, last] drops those ids too, so a stage trained while a gap in the file
    was still being filled keeps its data once the gap is complete."""
    from domino_sglang.train.records import load_records
    from tests.harness.train_fixtures import make_records

    make_records(tmp_path / "data.jsonl", n=12)
    assert [r["id"] for r in load_records(tmp_path / "data.jsonl", 64, max_id=10,
                                          skip_ids=[3, 6])] == [0, 1, 2, 7, 8, 9, 10]
    conf = load_train_config(None, {"data": "d", "out": "o", "skip_ids": [3, 6]})
    assert conf.skip_ids == [3, 6]
    for bad in ([6, 3], [3], [-1, 2], [1.0, 2]):
        with pytest.raises(TrainConfigError, match="'skip_ids' must be"):
            load_train_config(None, {"data": "d", "out": "o", "skip_ids": bad})


def test_oversample_is_validated_with_the_key_named():
    conf = load_train_config(None, {"data": "d", "out": "o", "oversample": [10, 20, 4]})
    assert conf.oversample == [10, 20, 4]
    for bad in ([20, 10, 2], [10, 20], [10, 20, 0], [10, 20, 1.5]):
        with pytest.raises(TrainConfigError, match="'oversample' must be"):
            load_train_config(None, {"data": "d", "out": "o", "oversample": bad})


@pytest.mark.parametrize("recipe", sorted(
    (Path(__file__).resolve().parents[2] / "domino_sglang" / "train" / "recipes").glob("*.toml")))
def test_shipped_recipes_parse(recipe):
    """Every shipped recipe, each of its phases, is a valid TrainConfig (typos fail here, not at
    hour two of a run)."""
    from domino_sglang.train.recipe import load_recipe

    phases, _ = load_recipe(recipe)
    for phase in phases:
        conf = phase.conf
        assert conf.data.endswith(".jsonl") and conf.out and conf.steps > 0


def test_rollout_tau_of_a_zero_head_equals_the_backbone(tmp_path):
    """With the head's output projection zeroed the served rollout is the backbone's argmax
    chain, so both taus agree; each is 1 + a matched prefix, within [1, B]."""
    from domino_sglang.model.config import load_draft_config
    from domino_sglang.model.drafter import DominoDrafter
    from domino_sglang.train.evaluate import rollout_tau
    from domino_sglang.train.features import TargetFeatures
    from domino_sglang.train.module import DrafterTrainModule
    from domino_sglang.train.records import load_records, sample_anchors

    conf = load_train_config(None, tiny_overrides(tmp_path, steps=40, lr=1e-2, save_every=40,
                                                  eval_every=40))
    train(conf, progress=False)
    dconf = load_draft_config(tmp_path / "run" / "drafter")
    drafter = DominoDrafter.from_pretrained(dconf)
    feats = TargetFeatures(conf.target, list(dconf.target_layer_ids), torch.float32)
    module = DrafterTrainModule(drafter, feats.embed_weight, feats.lm_head_weight)
    records = load_records(conf.data, conf.max_seq_len)[:6]  # trained on: some drafts match
    got = rollout_tau(module, feats, records, conf)
    # reference for the backbone chain: per block, 1 + longest prefix of argmax(base_k) == label
    ref = []
    for rec in records:
        ids = torch.tensor(rec["ids"])
        g = torch.Generator().manual_seed(10_000_019 * (rec["id"] + 1))
        anchors = sample_anchors(rec["start"], len(rec["ids"]), conf.anchors, g)
        with torch.no_grad():
            z, _, labels = module._blocks(ids, feats(rec), anchors, conf.block_size)
        picks = (z @ feats.lm_head_weight.T).argmax(dim=-1)  # [n, B-1]
        for p_row, l_row in zip(picks.tolist(), labels.tolist()):
            k = 0
            while k < len(p_row) and p_row[k] == l_row[k]:
                k += 1
            ref.append(1 + k)
    assert sum(ref) > len(ref)  # some drafts match (measured 1.08), so the comparison has teeth
    assert got["tau_rollout_base"] == pytest.approx(sum(ref) / len(ref))
    assert 1.0 <= got["tau_rollout_base"] <= conf.block_size
    with torch.no_grad():
        drafter.embed_proj[2].weight.zero_()
    zero = rollout_tau(module, feats, records, conf)
    assert zero["tau_rollout_final"] == zero["tau_rollout_base"] == got["tau_rollout_base"]


def test_first_draft_anchors_equal_blocks_with_later_labels_ignored(tmp_path):
    """A first-draft-only anchor is exactly a full block whose labels after position 0 are
    ignored: same loss (both curriculum terms), same gradient, one more position-0 sample."""
    from domino_sglang.model.config import load_draft_config
    from domino_sglang.model.drafter import DominoDrafter
    from domino_sglang.train.curriculum import IGNORE
    from domino_sglang.train.features import TargetFeatures
    from domino_sglang.train.module import DrafterTrainModule
    from domino_sglang.train.records import load_records

    conf = load_train_config(None, tiny_overrides(tmp_path, steps=1))
    train(conf, progress=False)
    dconf = load_draft_config(tmp_path / "run" / "drafter")
    feats = TargetFeatures(conf.target, list(dconf.target_layer_ids), torch.float32)
    rec = load_records(conf.data, conf.max_seq_len)[0]
    ids = torch.tensor(rec["ids"])
    full, first = sample_block_anchors(rec["start"], len(rec["ids"]), 3, 5,
                                          torch.Generator().manual_seed(1))
    assert len(full) == 3 and len(first) == 5 and not set(full) & set(first)
    for lam in (1.0, 0.4):
        grads = []
        for variant in ("first", "masked"):
            drafter = DominoDrafter.from_pretrained(dconf)
            module = DrafterTrainModule(drafter, feats.embed_weight, feats.lm_head_weight)
            if variant == "first":
                loss, st = module([(ids, feats(rec), full, first)], lam, conf.gamma)
            else:
                z, prev, lab = module._blocks(ids, feats(rec), full + first, conf.block_size)
                lab[len(full):, 1:] = IGNORE
                loss, st = block_loss(z, prev, lab, feats.lm_head_weight, drafter.prefix_gru,
                                      drafter.embed_proj, lam, conf.gamma)
            loss.backward()
            grads.append(torch.cat([p.grad.flatten() for p in drafter.parameters()
                                    if p.grad is not None]))
            if variant == "first":
                ref_loss, ref_valid = float(loss.detach()), st["valid"]
        assert float(loss.detach()) == pytest.approx(ref_loss, rel=1e-5)
        assert st["valid"] == ref_valid and st["valid"][0] == 8
        assert grads[0].shape == grads[1].shape
        err = (grads[0] - grads[1]).abs().max() / grads[1].abs().max()
        assert err < 1e-5, (lam, float(err))


def test_short_block_equals_a_block_of_that_length_alone(tmp_path):
    """A block drafted at length L inside a full-width pass (short_blocks) is the block
    [x_a, MASK x (L-1)] drafted on its own: the same z at its L-1 positions, the same labels
    there and IGNORE after, whatever the other blocks' lengths."""
    from domino_sglang.model.config import load_draft_config
    from domino_sglang.model.drafter import DominoDrafter
    from domino_sglang.train.curriculum import IGNORE
    from domino_sglang.train.features import TargetFeatures
    from domino_sglang.train.module import DrafterTrainModule
    from domino_sglang.train.records import load_records

    conf = load_train_config(None, tiny_overrides(tmp_path, steps=1))
    train(conf, progress=False)
    dconf = load_draft_config(tmp_path / "run" / "drafter")
    feats = TargetFeatures(conf.target, list(dconf.target_layer_ids), torch.float32)
    module = DrafterTrainModule(DominoDrafter.from_pretrained(dconf), feats.embed_weight,
                                   feats.lm_head_weight)
    rec = load_records(conf.data, conf.max_seq_len)[0]
    ids, f, B = torch.tensor(rec["ids"]), feats(rec), conf.block_size
    anchors = sample_anchors(rec["start"], len(rec["ids"]), 4, torch.Generator().manual_seed(3))
    lengths = torch.tensor([2, B, 3, B - 1])[: len(anchors)]
    with torch.no_grad():
        z, _, lab = module._blocks(ids, f, anchors, B, lengths)  # [n, B-1, H], [n, B-1]
        z_full, _, _ = module._blocks(ids, f, anchors, B)
        for j, (a, n) in enumerate(zip(anchors, lengths.tolist())):
            alone, _, lab_alone = module._blocks(ids, f, [a], n)  # [1, n-1, H]
            torch.testing.assert_close(z[j, : n - 1], alone[0], atol=1e-5, rtol=1e-4)
            assert lab[j, : n - 1].tolist() == lab_alone[0].tolist()
            assert (lab[j, n - 1:] == IGNORE).all()
            if n < B:  # the masked-out positions did matter: the full block drafts otherwise
                assert not torch.allclose(z[j, 0], z_full[j, 0], atol=1e-5)


def test_draft_lengths_sample():
    g = torch.Generator().manual_seed(0)
    assert sample_draft_lengths(50, 16, 0.0, g).tolist() == [16] * 50
    lengths = sample_draft_lengths(4000, 16, 0.5, g)
    assert int(lengths.min()) == 2 and int(lengths.max()) == 16
    short = lengths < 16
    assert 0.45 < float(short.float().mean()) < 0.55
    assert set(lengths[short].tolist()) == set(range(2, 16))


def test_first_draft_anchors_without_extra_are_the_plain_sample():
    for seed in range(5):
        a = sample_anchors(3, 40, 6, torch.Generator().manual_seed(seed))
        full, first = sample_block_anchors(3, 40, 6, 0, torch.Generator().manual_seed(seed))
        assert full == a and first == []


def _draft_blocks(conf, folder: Path, tweak=None):
    """(drafter, z [n, B-1, H], GRU inputs [n, B-1, H]) of the drafter in `folder` (after
    `tweak(drafter)`) on 4 fixed blocks of the first tiny record (block size 4)."""
    from domino_sglang.model.config import load_draft_config
    from domino_sglang.model.drafter import DominoDrafter
    from domino_sglang.train.features import TargetFeatures
    from domino_sglang.train.module import DrafterTrainModule
    from domino_sglang.train.records import load_records, sample_anchors

    drafter = DominoDrafter.from_pretrained(load_draft_config(folder), dtype=torch.float32)
    if tweak:
        tweak(drafter)
    feats = TargetFeatures(conf.target, list(drafter.conf.target_layer_ids), torch.float32)
    rec = load_records(conf.data, conf.max_seq_len)[0]
    anchors = sample_anchors(rec["start"], len(rec["ids"]), 4, torch.Generator().manual_seed(1))
    module = DrafterTrainModule(drafter, feats.embed_weight, feats.lm_head_weight)
    with torch.no_grad():
        z, prev, _ = module._blocks(torch.tensor(rec["ids"]), feats(rec), anchors, 4)
    return drafter, z, prev


def test_grown_drafter_starts_as_the_init_drafter_and_learns(tmp_path):
    """add_layers inserts identity layers below the init drafter's (zero o_proj / down_proj,
    the rest from the target's layers just below): the grown drafter drafts exactly what its
    init did, and training moves the new layers' output projections off zero."""
    from safetensors.torch import load_file

    from domino_sglang.model.config import load_draft_config

    small = load_train_config(None, tiny_overrides(tmp_path, steps=6))
    train(small, progress=False)
    src = tmp_path / "run" / "drafter"
    big = load_train_config(None, tiny_overrides(tmp_path, steps=3, init=str(src), add_layers=2,
                                                 out=str(tmp_path / "grown")))
    train(big, progress=False)
    seed = tmp_path / "grown" / "init"
    assert load_draft_config(seed).num_layers == 3

    def blocks(folder, tweak=None):
        return _draft_blocks(small, folder, tweak)[1:]

    z_src, prev_src = blocks(src)
    z_big, prev_big = blocks(seed)
    assert torch.equal(z_big, z_src) and torch.equal(prev_big, prev_src)
    # power: a new layer with a live output projection changes the drafts
    z_live, _ = blocks(seed, lambda d: torch.nn.init.normal_(d.layers[0].self_attn.o_proj.weight))
    assert not torch.allclose(z_live, z_src)

    target = load_file(str(next(Path(small.target).glob("*.safetensors"))))
    grown = load_file(str(seed / "model.safetensors"))
    srcw = load_file(str(src / "model.safetensors"))
    for i in range(2):  # src warm-started from target layer 3; the new ones are layers 1, 2
        assert torch.equal(grown[f"layers.{i}.self_attn.q_proj.weight"],
                           target[f"model.layers.{1 + i}.self_attn.q_proj.weight"].float())
    assert torch.equal(grown["layers.2.mlp.up_proj.weight"],
                       srcw["layers.0.mlp.up_proj.weight"].float())
    trained = torch.load(tmp_path / "grown" / "checkpoint" / "drafter.pt", weights_only=True)
    assert trained["layers.0.self_attn.o_proj.weight"].abs().sum() > 0
    with pytest.raises(TrainConfigError, match="'add_layers' grows an 'init' drafter"):
        load_train_config(None, {"data": "d", "out": "o", "add_layers": 2})


def test_grown_head_starts_as_the_init_head_and_learns(tmp_path):
    """grow_gru / grow_emb widen the GRU and the low-rank correction with zeros wherever the new
    weights would reach the old outputs: the grown head corrects exactly as its init did, a live
    new rank changes the correction, and training moves the new ranks off zero."""
    from safetensors.torch import load_file

    from domino_sglang.model.config import load_draft_config
    from domino_sglang.train.curriculum import head_correction

    small = load_train_config(None, tiny_overrides(tmp_path, steps=6))
    train(small, progress=False)
    src = tmp_path / "run" / "drafter"
    big = load_train_config(None, tiny_overrides(tmp_path, steps=3, init=str(src), grow_gru=5,
                                                 grow_emb=3, lambda_decay_frac=0.0,
                                                 out=str(tmp_path / "grown")))
    train(big, progress=False)
    seed = tmp_path / "grown" / "init"
    conf = load_draft_config(seed)
    assert (conf.gru_hidden_dim, conf.emb_dim) == (8 + 5, 4 + 3)

    def correction(folder, tweak=None):
        drafter, z, prev = _draft_blocks(small, folder, tweak)
        with torch.no_grad():
            return head_correction(drafter.prefix_gru, drafter.embed_proj, z, prev)

    c_src = correction(src)
    assert c_src.abs().sum() > 0  # the init head corrects at all
    torch.testing.assert_close(correction(seed), c_src, rtol=1e-5, atol=1e-6)
    # power: a new rank with a live output column changes the correction
    live = correction(seed, lambda d: torch.nn.init.normal_(d.embed_proj[2].weight[:, 4:]))
    assert not torch.allclose(live, c_src, atol=1e-4)

    grown = load_file(str(seed / "model.safetensors"))
    assert grown["embed_proj.2.weight"][:, 4:].abs().sum() == 0
    trained = torch.load(tmp_path / "grown" / "checkpoint" / "drafter.pt", weights_only=True)
    assert trained["embed_proj.2.weight"][:, 4:].abs().sum() > 0
    with pytest.raises(TrainConfigError, match="'grow_gru' grows an 'init' drafter"):
        load_train_config(None, {"data": "d", "out": "o", "grow_gru": 8})


def test_extra_data_is_trained_on_whole_and_checked(tmp_path, monkeypatch):
    """extra_data records join the training pool (never held out, no max_id), ids must be new,
    and the dataset's own answers (ids >= 4000000) are refused unless distill = 1."""
    import json

    from domino_sglang.train.records import load_extra_records, load_records
    from tests.harness.train_fixtures import make_records

    extra = tmp_path / "extra.jsonl"
    make_records(extra, n=4)
    lines = extra.read_text().splitlines()
    moved = [json.dumps({**json.loads(line), "id": 4_000_000 + k}) for k, line in
             enumerate(lines)]
    answers = tmp_path / "answers.jsonl"
    answers.write_text("\n".join(moved) + "\n")
    main = load_records(make_records(tmp_path / "data.jsonl", n=6), 64)
    taken = {r["id"] for r in main}
    got = load_extra_records([str(answers)], 64, 1.0, set(taken))
    assert [r["id"] for r in got] == [4_000_000 + k for k in range(4)]
    with pytest.raises(TrainConfigError, match="need 'distill' = 1, got 0.5"):
        load_extra_records([str(answers)], 64, 0.5, set(taken))
    with pytest.raises(TrainConfigError, match="record id 0 is already in the training data"):
        load_extra_records([str(extra)], 64, 1.0, set(taken))
    with pytest.raises(TrainConfigError, match="extra_data .*missing.jsonl not found"):
        load_extra_records([str(tmp_path / "missing.jsonl")], 64, 1.0, set(taken))
    with pytest.raises(TrainConfigError, match="'extra_data' must be a list of file paths"):
        load_train_config(None, {"data": "d", "out": "o", "extra_data": [""]})
    # a run reads them: 6 steps of 2 over the 4 + 4 training records cover an epoch of 8
    from domino_sglang.train.features import TargetFeatures

    visited: set[int] = set()
    real = TargetFeatures.many  # a training step's features

    def spy(self, recs, **kwargs):
        visited.update(rec["id"] for rec in recs)
        return real(self, recs, **kwargs)

    monkeypatch.setattr(TargetFeatures, "many", spy)
    conf = load_train_config(None, tiny_overrides(tmp_path, data=str(tmp_path / "data.jsonl"),
                                                  extra_data=[str(answers)], distill=1.0,
                                                  distill_topk=8))
    train(conf, progress=False)
    assert {i for i in visited if i >= 4_000_000} == {4_000_000 + k for k in range(4)}


def test_the_logged_replay_tau_is_tokens_over_replayed_rounds(tmp_path):
    """The held-out evaluation logs tau as a server would measure it (replay_tau: committed
    tokens / replay_rounds; tests/model/test_shipped_drafter.py ties the rounds to a served run),
    head on and off, in log.jsonl; a zeroed head drafts the backbone's chain, so both agree."""
    import json

    from domino_sglang.model.config import load_draft_config
    from domino_sglang.model.drafter import DominoDrafter
    from domino_sglang.train.evaluate import replay_rounds, replay_tau
    from domino_sglang.train.features import TargetFeatures
    from domino_sglang.train.module import DrafterTrainModule
    from domino_sglang.train.records import load_records

    conf = load_train_config(None, tiny_overrides(tmp_path, steps=20, lr=1e-2, save_every=20,
                                                  eval_every=20))
    train(conf, progress=False)
    logs = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    logged = [x["eval"] for x in logs if "eval" in x][-1]
    dconf = load_draft_config(tmp_path / "run" / "drafter")
    drafter = DominoDrafter.from_pretrained(dconf, dtype=torch.float32)
    drafter.load_state_dict(torch.load(tmp_path / "run" / "checkpoint" / "drafter.pt",
                                       weights_only=True))  # the weights evaluated at step 20
    feats = TargetFeatures(conf.target, list(dconf.target_layer_ids), torch.float32)
    module = DrafterTrainModule(drafter, feats.embed_weight, feats.lm_head_weight)
    held = load_records(conf.data, conf.max_seq_len)[-conf.eval_records:]
    rounds = [replay_rounds(module, feats, rec) for rec in held]
    tokens = sum(len(rec["ids"]) - rec["start"] for rec in held)
    assert sum(rounds) < tokens  # some drafts accepted: the ratio has teeth
    assert replay_tau(module, feats, held) == pytest.approx(tokens / sum(rounds))
    assert logged["tau_replay_final"] == pytest.approx(tokens / sum(rounds))
    assert 1.0 <= logged["tau_replay_base"] <= conf.block_size
    with torch.no_grad():
        drafter.embed_proj[2].weight.zero_()
    assert replay_tau(module, feats, held) == replay_tau(module, feats, held,
                                                               use_head=False)
