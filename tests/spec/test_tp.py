"""Tensor parallelism's pieces over two real ranks (torch.distributed, gloo, two processes):
the sharded drafter equals the whole one, the gathered base logits and draft-vocabulary rows
equal the unsharded ones, a head over a candidate pool drafts from the ranks' gathered top-K
exactly as from the whole logits, and the ranks' adaptive policies choose the same lengths because
they learn from rank 0's round times (tp.py), while a planted rank-dependent round time makes
them diverge without that agreement (the check can fail).

The served path (SGLang's TP group, the target sharded too) is tests/server/test_tp_server.py.
"""

from __future__ import annotations

import random
import socket
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from domino_sglang.model.config import load_draft_config, make_draft_config
from domino_sglang.model.drafter import DominoDrafter, init_drafter_weights, save_drafter
from domino_sglang.model.shard import Shard
from domino_sglang.spec.policy import SpeculationPolicy
from domino_sglang.spec.rollout import HeadParams, greedy_rollout, sampled_rollout
from domino_sglang.spec.sampling import SamplingRows
from domino_sglang.spec.tp import (
    RankAgreement,
    gathered_logits,
    group_first,
    pooled_logits,
    vocab_rows,
)

WORLD = 2
TARGET = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 4, "vocab_size": 250,
          "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 1024}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(fn, *args) -> list:
    """fn(rank, *args) on WORLD gloo ranks; returns each rank's result, in rank order."""
    results = mp.get_context("spawn").Manager().dict()
    mp.spawn(_entry, args=(fn, _port(), results, args), nprocs=WORLD, join=True)
    return [results[r] for r in range(WORLD)]


def _entry(rank: int, fn, port: int, results, args) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    try:
        results[rank] = fn(rank, *args)
    finally:
        dist.destroy_process_group()


def _all_reduce(x: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(x)
    return x


def _all_gather_last(x: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(WORLD)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)


def _attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Non-causal attention over the block itself, KV heads shared by their query groups."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1))
    return out.transpose(0, 1)


def _backbone(rank: int, folder: str, sharded: bool) -> dict:
    conf = load_draft_config(folder)
    model = DominoDrafter.from_pretrained(conf)
    if sharded:
        model.shard(Shard(rank, WORLD, _all_reduce))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, conf.hidden_size, generator=g)
    positions = torch.arange(12)
    feats = torch.randn(5, conf.num_context_features * conf.hidden_size, generator=g)
    with torch.no_grad():
        z = model.backbone(x, positions, _attend)
        k, v = model.context_kv(feats, torch.arange(5))[0]
    return {"z": z, "k": k, "v": v, "q_rows": model.layers[0].self_attn.q_proj.weight.shape[0]}


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp") / "drafter"
    out.mkdir()
    conf = make_draft_config(TARGET, num_layers=2, block_size=4)
    import json
    (out / "config.json").write_text(json.dumps(conf))
    save_drafter(out, conf, init_drafter_weights(load_draft_config(out), seed=1, std=0.2))
    return str(out)


def test_the_sharded_backbone_equals_the_whole_one(drafter):
    whole = _backbone(0, drafter, sharded=False)
    ranks = _run(_backbone, drafter, True)
    assert [r["q_rows"] for r in ranks] == [2 * 16] * WORLD  # 2 of 4 heads per rank
    assert torch.equal(ranks[0]["z"], ranks[1]["z"])  # the same z on every rank, bit for bit
    torch.testing.assert_close(ranks[0]["z"], whole["z"], rtol=1e-5, atol=1e-5)
    # each rank writes its own KV heads of the context: together, the whole drafter's
    torch.testing.assert_close(torch.cat([r["k"] for r in ranks], 1), whole["k"])
    torch.testing.assert_close(torch.cat([r["v"] for r in ranks], 1), whole["v"])


def _logits(rank: int, weight: torch.Tensor, vocab: int, ids: torch.Tensor,
            x: torch.Tensor) -> dict:
    per = weight.shape[0] // WORLD  # SGLang's padded layout: equal rows per rank
    start, end = rank * per, min((rank + 1) * per, vocab)
    local = weight[start:start + per]
    linear = gathered_logits(lambda h: F.linear(h, local), vocab, _all_gather_last)
    return {"logits": linear(x), "rows": vocab_rows(local, start, end, ids, _all_reduce)}


def test_gathered_logits_and_draft_rows_equal_the_whole_lm_head():
    g = torch.Generator().manual_seed(0)
    vocab, padded = 250, 256
    weight = torch.randn(padded, 64, generator=g)
    weight[vocab:] = 0  # SGLang's padding rows
    ids = torch.tensor([3, 200, 127, 128, 0, 249])  # both ranks' rows, the boundary, the ends
    x = torch.randn(7, 64, generator=g)
    ranks = _run(_logits, weight, vocab, ids, x)
    for r in ranks:
        assert r["logits"].shape == (7, vocab)
        torch.testing.assert_close(r["logits"], F.linear(x, weight[:vocab]))
        assert torch.equal(r["rows"], weight[ids])  # gathered once, exactly


def _head(weight: torch.Tensor) -> HeadParams:
    """A strong random head over the vocabulary of `weight` [V, H] (the same on every rank)."""
    torch.manual_seed(3)
    vocab, hidden = weight.shape
    proj = nn.Sequential(nn.Linear(hidden + 6, 5, bias=False), nn.SiLU(),
                         nn.Linear(5, vocab, bias=False))
    gru = nn.GRU(hidden, 6, bias=False, batch_first=True)
    for p in [*gru.parameters(), *proj.parameters()]:
        nn.init.normal_(p, std=1.5)
    return HeadParams(embed=nn.Embedding(vocab, hidden), lm_head_weight=weight, prefix_gru=gru,
                      embed_proj=proj)


def _rows() -> SamplingRows:
    """Six requests: two greedy, the others at T > 0 with and without top-k / top-p / min-p."""
    return SamplingRows(temperature=torch.tensor([1.0, 0.7, 1.0, 1.3, 1.0, 0.9]),
                        top_k=torch.tensor([1, 1 << 30, 1, 12, 1 << 30, 40]),
                        top_p=torch.tensor([1.0, 0.9, 1.0, 1.0, 1.0, 0.8]),
                        min_p=torch.tensor([0.0, 0.0, 0.0, 0.0, 0.05, 0.0]),
                        seed=torch.arange(6))


def _rollouts(rank: int | None, weight: torch.Tensor, vocab: int, pool: int, z: torch.Tensor,
              bonus: torch.Tensor, u: torch.Tensor) -> dict:
    """Greedy and sampled rollouts with the head over a pool of `pool`: on one rank from the
    whole lm_head (rank None), else from this rank's rows through pooled_logits."""
    head = _head(weight[:vocab])
    sent = []
    if rank is not None:
        per = weight.shape[0] // WORLD
        start, end = rank * per, min((rank + 1) * per, vocab)
        local = weight[start:start + per]

        def gather(x: torch.Tensor) -> torch.Tensor:
            sent.append(x.numel())
            return _all_gather_last(x)
        head = replace(head, lm_head_weight=local, full_vocab=vocab, base_linear=pooled_logits(
            lambda h: F.linear(h, local), end - start, vocab, pool, gather))
    chain, pick = greedy_rollout(z, bonus, head, candidate_pool=pool, return_base_pick=True)
    drafts, q = sampled_rollout(z, bonus, head, _rows(), u, candidate_pool=pool)
    return {"chain": chain, "pick": pick, "drafts": drafts, "q": q, "sent": sent}


@pytest.mark.parametrize("n", [7, 1])  # 1: a one-token draft, position 0 alone
def test_a_pool_from_the_ranks_top_k_drafts_as_the_whole_logits(n):
    g = torch.Generator().manual_seed(1)
    vocab, padded, pool = 250, 256, 20
    weight = torch.randn(padded, 16, generator=g)
    weight[vocab:] = 0  # SGLang's padding rows
    z, bonus = torch.randn(6, n + 1, 16, generator=g), torch.randint(0, vocab, (6,), generator=g)
    u = torch.rand(6, n, generator=g, dtype=torch.float64)
    whole = _rollouts(None, weight, vocab, pool, z, bonus, u)
    ranks = _run(_rollouts, weight, vocab, pool, z, bonus, u)
    for r in ranks:
        for key in ("chain", "pick", "drafts"):
            assert torch.equal(r[key], whole[key]), key
        torch.testing.assert_close(r["q"], whole["q"], rtol=0, atol=1e-6)
        assert len(r["sent"]) == 2  # one message a rollout
        if n > 1:  # smaller than the rank's whole logits [6, n, 128]
            assert max(r["sent"]) < 6 * n * (padded // WORLD) / 2
    if n > 1:  # the pool matters: with the whole vocabulary the head drafts otherwise
        unpooled = _rollouts(None, weight, vocab, 0, z, bonus, u)
        assert not torch.equal(unpooled["chain"], whole["chain"])


def _policy_lengths(rank: int, agreed: bool, planted: float) -> list[int]:
    """A served policy's loop on one rank: 400 rounds at bs 1, a drafter accepting each draft
    with probability 0.6 (the same coins on every rank: acceptance is computed from identical
    logits), round times measured locally. `planted`: how much slower rank 1 measures its
    speculative rounds (a rank-dependent input)."""
    agree = RankAgreement(group_first() if agreed else None)
    policy = SpeculationPolicy(block=8)
    coins = random.Random(0)
    lengths = []
    for _ in range(400):
        draft_len = policy.draft_len(1)
        accepted = 0
        while accepted < draft_len - 1 and coins.random() < 0.6:
            accepted += 1
        seconds = 0.04 * (1.0 + (0.3 + 0.05 * (draft_len - 1)) * (draft_len > 1))
        if rank == 1 and draft_len > 1:
            seconds *= planted
        policy.observe_time(1, draft_len, agree.seconds(seconds))
        policy.observe([accepted + 1], draft_len)
        lengths.append(draft_len)
    return lengths


def test_ranks_choose_the_same_lengths_from_rank_0s_round_times():
    agreed = _run(_policy_lengths, True, 3.0)
    assert agreed[0] == agreed[1]
    assert max(agreed[0]) > 1 and 1 in agreed[0]  # it speculated and calibrated: not trivial
    # the planted difference matters without the agreement: rank 1 finds speculation too
    # dear and decodes plainly where rank 0 drafts (ranks verifying different lengths would
    # deadlock in the target's collectives)
    apart = _run(_policy_lengths, False, 3.0)
    assert apart[0] != apart[1]
    assert apart[0] == agreed[0]  # rank 0's own choices are the agreed ones
