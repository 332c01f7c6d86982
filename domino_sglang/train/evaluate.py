"""Held-out evaluation of a drafter under training: teacher-forced accuracy, rollout, replay.

`replay_rounds` replays a record's answer round by round as the worker's greedy loop serves it,
so `replay_tau` is the tau a server would measure (tests/model/test_shipped_drafter.py checks it).
Depends on module.py, features.py, records.py and spec.rollout / spec.pointer.
"""

from __future__ import annotations

import torch
from torch import nn

from domino_sglang.spec.history import HistoryIndex
from domino_sglang.spec.pointer import PointerCopy
from domino_sglang.train.config import TrainConfig
from domino_sglang.train.curriculum import accuracies, tau_sim
from domino_sglang.train.features import TargetFeatures
from domino_sglang.train.module import DrafterTrainModule
from domino_sglang.train.records import sample_anchors


def evaluate(module: DrafterTrainModule, feats: TargetFeatures, records: list[dict],
             conf: TrainConfig) -> dict:
    """Per-position teacher-forced accuracy (base and final) and tau_sim on held-out records."""
    valid = correct_b = correct_f = None
    with torch.no_grad():
        for rec in records:
            g = torch.Generator().manual_seed(10_000_019 * (rec["id"] + 1))
            anchors = sample_anchors(rec["start"], len(rec["ids"]), conf.anchors, g)
            ids = torch.tensor(rec["ids"], device=module.embed_weight.device)
            _, st = module([(ids, feats(rec), anchors)], 0.0, conf.gamma)
            if valid is None:
                valid, correct_b, correct_f = st["valid"], st["correct_base"], st["correct_final"]
            else:
                valid = [x + y for x, y in zip(valid, st["valid"])]
                correct_b = [x + y for x, y in zip(correct_b, st["correct_base"])]
                correct_f = [x + y for x, y in zip(correct_f, st["correct_final"])]
    acc_b, acc_f = accuracies(valid, correct_b), accuracies(valid, correct_f)
    return {"acc_base": acc_b, "acc_final": acc_f,
            "tau_sim_base": tau_sim(acc_b), "tau_sim_final": tau_sim(acc_f),
            **rollout_tau(module, feats, records, conf),
            "tau_replay_final": replay_tau(module, feats, records),
            "tau_replay_base": replay_tau(module, feats, records, use_head=False)}


def replay_tau(module: DrafterTrainModule, feats: TargetFeatures, records: list[dict],
               use_head: bool = True) -> float:
    """The tau a server measures (fixed block, no prompt lookup) when it generates these
    records' responses: committed tokens / verify rounds of `replay_rounds` over each record,
    which equal the served rounds exactly when the responses are the target's greedy output
    (regenerated data; tests/model/test_shipped_drafter.py checks it against a served run). The
    estimate a run logs while training (held-out records, head on and off); on data used as
    written (off-policy) it is the tau of replaying those answers instead."""
    rounds = [replay_rounds(module, feats, rec, use_head=use_head) for rec in records]
    tokens = sum(len(rec["ids"]) - rec["start"] for rec in records)
    return tokens / max(sum(rounds), 1)


def rollout_tau(module: DrafterTrainModule, feats: TargetFeatures, records: list[dict],
                conf: TrainConfig) -> dict:
    """tau as serving would measure it on held-out records, without a server.

    Unlike tau_sim (teacher-forced accuracies), the head rolls out over its OWN drafts, exactly
    as `greedy_rollout` does in the worker (candidate pool included); the record's next tokens
    are the greedy target's choices, so a block commits 1 + the longest prefix of drafts equal
    to them. Returns tau_rollout_{final,base} (head on / backbone only).
    """
    from domino_sglang.model.config import DEFAULT_CANDIDATE_POOL
    from domino_sglang.spec.rollout import greedy_rollout

    head, B = head_params(module), module.drafter.conf.block_size
    committed = {"final": [], "base": []}
    with torch.no_grad():
        for rec in records:
            g = torch.Generator().manual_seed(10_000_019 * (rec["id"] + 1))
            ids = torch.tensor(rec["ids"], device=module.embed_weight.device)
            anchors = sample_anchors(rec["start"], len(rec["ids"]), conf.anchors, g)
            z, _, labels = module._blocks(ids, feats(rec), anchors, B)  # [n, B-1, H], [n, B-1]
            z = torch.cat((z, z[:, -1:]), dim=1)  # [n, B, H]: rollout reads z[:, :B-1] only
            bonus = ids[torch.tensor(anchors)]
            for name, use_head in (("final", True), ("base", False)):
                copy = _pointer(module, [rec["ids"][:a + 1] for a in anchors])
                chain = greedy_rollout(z, bonus, head, DEFAULT_CANDIDATE_POOL, use_head=use_head,
                                       copy=copy)
                match = (chain == labels).int().cumprod(dim=1)  # IGNORE labels never match
                committed[name] += (1 + match.sum(dim=1)).tolist()
    return {f"tau_rollout_{k}": sum(v) / len(v) for k, v in committed.items()}


@torch.no_grad()
def replay_rounds(module: DrafterTrainModule, feats: TargetFeatures, rec: dict,
                  use_head: bool = True, draft_lens: tuple[int, ...] | None = None,
                  short_draft: bool = False, lookup: bool = False) -> int:
    """Verify rounds the worker's greedy loop needs to commit rec's generated tokens.

    rec = {"id", "ids": prompt + generated, "start": prompt length}, generated greedily by the
    target. Round by round, as `DominoWorker.decode_round` with a fixed block:
        a = start (x_a, the prefill's token, is the first bonus); repeat while a < T - 1:
        draft [x_a, MASK x (B-1)] from the features of positions < a, k = longest prefix of
        drafts equal to x_{a+1..}, a += k + 1
    draft_lens: the worker's pinned pattern (--speculative-domino-debug-draft-len L0,L1,..): a
    round at committed length a verifies L = draft_lens[a mod len] chain tokens (L - 1 drafts;
    L = 1: plain, a += 1).
    short_draft: a round of L < B drafts [x_a, MASK x (L-1)] alone (the worker's short draft).
    lookup: a round where prompt lookup finds a draft (lookup.py's rule over the history so far)
    verifies it, up to L - 1 tokens, instead of the drafter's (a row with an offer).
    Equal to the served spec_verify_ct when serving computes what the drafter computes.
    """
    from domino_sglang.model.config import DEFAULT_CANDIDATE_POOL
    from domino_sglang.spec.rollout import greedy_rollout

    ids = torch.tensor(rec["ids"], device=module.embed_weight.device)  # [T]
    f = feats(rec)  # [T, K*H]
    T, B, head = len(ids), module.drafter.conf.block_size, head_params(module)
    a, rounds = rec["start"], 0
    index = HistoryIndex(B - 1)  # a pointer drafter's, extended round by round as the worker's
    while a < T - 1:
        rounds += 1
        n = (draft_lens[a % len(draft_lens)] if draft_lens else B) - 1  # drafts verified
        if n == 0:
            a += 1
            continue
        offer = lookup_draft(rec, a, n) if lookup else []
        if offer:  # the offered row: its copied drafts, no draft pass
            got = ids.new_tensor(offer)
            want = ids[a + 1:a + 1 + len(offer)]
            a += 1 + int((got[:len(want)] == want).int().cumprod(dim=0).sum())
            continue
        short = torch.tensor([n + 1]) if short_draft and n + 1 < B else None
        z, _, labels = module._blocks(ids, f, [a], B, short)  # [1, B-1, H], [1, B-1]
        # [1, L, H], as the worker rolls out: its candidate pool is shared by these L positions
        z = torch.cat((z, z[:, -1:]), dim=1)[:, :n + 1]
        copy = None
        if module.drafter.copy_gate is not None:
            index.sync(rec["ids"][:rec["start"]], rec["ids"][rec["start"]:a + 1])
            copy = PointerCopy(module.drafter.copy_gate, [index], ids.device)
        chain = greedy_rollout(z, ids[a:a + 1], head, DEFAULT_CANDIDATE_POOL, use_head=use_head,
                               copy=copy)
        a += 1 + int((chain == labels[:, :n]).int().cumprod(dim=1).sum())  # chain [1, L-1]
    return rounds


@torch.no_grad()
def lookup_draft(rec: dict, a: int, n: int) -> list[int]:
    """Prompt lookup's draft (at most n tokens) after the history rec["ids"][:a + 1] (x_a
    last), by the served rule (history.HistoryIndex); [] where no suffix recurs."""
    index = HistoryIndex(n)
    index.sync(rec["ids"][:rec["start"]], rec["ids"][rec["start"]:a + 1])
    s, m = index.find()
    return index.tokens(s + 1, s + 1 + m) if m > 0 else []


def replay_tree_rounds(module: DrafterTrainModule, feats: TargetFeatures, rec: dict, size: int,
                       width: int, short_draft: bool = False, lookup: bool = False) -> int:
    """Verify rounds a tree round of `size` tokens (spec/tree.py, width K) needs to commit rec's
    generated tokens, as replay_rounds counts a chain's: each round grows the tree from the
    block's states with the chain the drafter drafts (pointer copy included) as a branch,
    and commits the path of drafts equal to the record's next tokens, then one token. A node off
    that path never matters: its children are never followed, so the record's tokens stand for
    the target's choices. short_draft: a tree shallower than the block drafts from
    [x_a, MASK x (size - 1)] alone (the worker's short draft). lookup: prompt lookup's draft,
    where it finds one, is a second kept branch."""
    from domino_sglang.model.config import DEFAULT_CANDIDATE_POOL
    from domino_sglang.spec.rollout import HeadInputs, greedy_rollout
    from domino_sglang.spec.tree import follow, grow_tree

    ids = torch.tensor(rec["ids"], device=module.embed_weight.device)  # [T]
    f = feats(rec)  # [T, K*H]
    T, B, head = len(ids), module.drafter.conf.block_size, head_params(module)
    depth = min(size, B) - 1
    a, rounds = rec["start"], 0
    index = HistoryIndex(B - 1)
    while a < T - 1:
        rounds += 1
        short = torch.tensor([depth + 1]) if short_draft and depth + 1 < B else None
        z, _, _ = module._blocks(ids, f, [a], B, short)  # [1, B-1, H]
        z = torch.cat((z, z[:, -1:]), dim=1)[:, :depth + 1]  # [1, D+1, H]
        copy = None
        if module.drafter.copy_gate is not None:
            index.sync(rec["ids"][:rec["start"]], rec["ids"][rec["start"]:a + 1])
            copy = PointerCopy(module.drafter.copy_gate, [index], ids.device)
        bonus = ids[a:a + 1]
        inputs = HeadInputs.of(z, head, DEFAULT_CANDIDATE_POOL)
        chain = greedy_rollout(z, bonus, head, copy=copy, inputs=inputs)  # [1, D]
        offer = lookup_draft(rec, a, depth) if lookup else []
        branches = (chain, ids.new_tensor([offer])) if offer else (chain,)
        tree = grow_tree(z, bonus, head, size, width, branches=branches, inputs=inputs)
        at = a + tree.depths + 1  # [1, N] where the token after each node sits in the record
        choice = torch.where(at < T, ids[at.clamp(max=T - 1)], -1)
        _, accept_len, _ = follow(tree, choice)
        a += int(accept_len)
    return rounds


def _pointer(module: DrafterTrainModule, histories: list[list[int]]) -> PointerCopy | None:
    """A pointer drafter's copy path for blocks whose histories (x_t last) are given; None for
    a drafter without a copy gate."""
    if module.drafter.copy_gate is None:
        return None
    indexes = [HistoryIndex(1) for _ in histories]
    for index, history in zip(indexes, histories):
        index.sync(history, [])
    return PointerCopy(module.drafter.copy_gate, indexes, module.embed_weight.device)


def head_params(module: DrafterTrainModule):
    """The rollout's view of the drafter under training (shared tensors, fp32), over the
    module's draft vocabulary if it has one (as the worker serves it)."""
    from domino_sglang.spec.rollout import HeadParams

    d = module.drafter
    return HeadParams(embed=nn.Embedding.from_pretrained(module.embed_weight),
                      lm_head_weight=module.lm_head_weight, prefix_gru=d.prefix_gru,
                      embed_proj=d.embed_proj).with_vocab(module.draft_vocab)
