"""Pointer-generator drafters: copy candidates, the mixture's loss and picks, training, refusal."""

from __future__ import annotations

import random

import pytest
import torch

from domino_sglang.model.config import COPY_MAX_MATCH
from domino_sglang.spec.pointer import (
    copy_index_on_device,
    copy_table,
    copy_wins,
    log_gate,
    mixed_log_prob,
)
from domino_sglang.train.curriculum import block_loss, gated_nll
from tests.harness.train_fixtures import tiny_overrides

torch.set_num_threads(1)


def copy_candidate(h: list[int]) -> tuple[int, int]:
    """The rule pointer.copy_table computes for every prefix at once, as a direct backward scan
    (its reference here): (token, match length) after the most recent occurrence of the
    longest suffix (<= COPY_MAX_MATCH) of h ending before h's last token; (-1, 0) when h's last
    token never occurred before."""
    best_n, best_s = 0, -1
    for s in range(len(h) - 2, -1, -1):
        if h[s] != h[-1]:
            continue
        n = 1
        while n < COPY_MAX_MATCH and s - n >= 0 and h[s - n] == h[-1 - n]:
            n += 1
        if n > best_n:
            best_n, best_s = n, s
    return (h[best_s + 1], best_n) if best_s >= 0 else (-1, 0)


def test_copy_candidate_follows_the_longest_most_recent_match():
    # suffix (7, 8): its 2-token match at s = 1 beats the 1-token matches of 8 at s = 4, 6
    assert copy_candidate([7, 8, 9, 5, 8, 4, 8, 3, 7, 8]) == (9, 2)
    # only 1-token matches: the most recent one (8 at s = 4, followed by 6)
    assert copy_candidate([8, 5, 1, 2, 8, 6, 3, 8]) == (6, 1)
    assert copy_candidate([1, 2, 3]) == (-1, 0)  # the last token never occurred
    # the lookup the server runs finds the same continuation on a recurring suffix
    from tests.harness.lookup_reference import lookup_draft
    h = [7, 8, 9, 5, 8, 4, 8, 3, 7, 8]
    assert int(lookup_draft(torch.tensor(h), 1)[0]) == copy_candidate(h)[0]


def test_copy_table_is_the_quadratic_scan_at_every_position():
    """copy_table's row t (dicts of n-grams) equals copy_candidate of ids[:t+1] (a direct
    backward scan), on sequences with long repeats, runs and fresh tokens."""
    rng = random.Random(0)
    for trial in range(30):
        vocab = rng.choice((2, 3, 5, 20))
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))]
        if trial % 3 == 0:  # a long copy: a 15-token span repeated, suffixes > 12 tokens
            ids = ids + ids[:15] + [rng.randrange(vocab)]
        cand, match = copy_table(ids)
        for t in range(len(ids)):
            assert (int(cand[t]), int(match[t])) == copy_candidate(ids[:t + 1]), (ids, t)
    cand, match = copy_table([7, 8, 9, 7, 8])
    assert cand.tolist() == [-1, -1, -1, 8, 9] and match.tolist() == [0, 0, 0, 1, 2]


def test_mixture_log_prob_and_greedy_pick():
    """q = (1 - g) p + g onehot(c): log q(y) by hand, g = 0 without a candidate, and q's argmax
    takes the candidate exactly when (1 - g) p(c) + g > (1 - g) p(pick)."""
    logit = torch.tensor([0.0, 0.0, 2.0])
    cand = torch.tensor([3, -1, 3])
    log_g, log_1mg = log_gate(logit, cand)
    g = torch.sigmoid(logit)
    assert log_g[1] == float("-inf") and log_1mg[1] == 0  # no candidate: q = p
    p_y = torch.tensor([0.2, 0.2, 0.2])
    token = torch.tensor([3, 3, 5])  # the label is the candidate in row 0 only
    got = mixed_log_prob(p_y.log(), token, cand, log_g, log_1mg).exp()
    want = torch.stack(((1 - g[0]) * 0.2 + g[0], torch.tensor(0.2), (1 - g[2]) * 0.2))
    assert torch.allclose(got, want)
    # the pick: p(pick) = 0.6, p(c) = 0.1; g = 0.5 -> 0.55 < 0.3? no: 0.05 + 0.5 = 0.55 > 0.3
    lp_pick, lp_c = torch.tensor([0.6, 0.6]).log(), torch.tensor([0.1, 0.1]).log()
    for gate_logit, want_copy in ((0.0, True), (-3.0, False)):  # g = 0.5 / 0.047
        lg, l1g = log_gate(torch.full((2,), gate_logit), torch.tensor([4, 4]))
        assert copy_wins(lp_pick, lp_c, torch.tensor([4, 4]), lg, l1g).tolist() == [want_copy] * 2


def _loss_inputs(seed: int = 0, n: int = 3, p: int = 4, h: int = 8, v: int = 12):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, p, h, generator=g)
    prev = torch.randn(n, p, h, generator=g)
    labels = torch.randint(0, v, (n, p), generator=g)
    labels[0, 3] = -100
    lm = torch.randn(v, h, generator=g)
    gru = torch.nn.GRU(h, 6, bias=False, batch_first=True)
    proj = torch.nn.Sequential(torch.nn.Linear(h + 6, 5, bias=False), torch.nn.SiLU(),
                               torch.nn.Linear(5, v, bias=False))
    first = (torch.randn(5, h, generator=g), torch.randint(0, v, (5,), generator=g))
    soft = (torch.randint(0, v, (n, p, 4), generator=g), torch.randn(n, p, 4, generator=g),
            torch.randint(0, v, (5, 4), generator=g), torch.randn(5, 4, generator=g))
    return z, prev, labels, lm, gru, proj, first, soft


@pytest.mark.parametrize("distill", [0.0, 0.5])
@pytest.mark.parametrize("vocab", [None, torch.tensor([0, 2, 3, 5, 7, 8, 11])])
def test_a_closed_gate_is_the_plain_loss_and_an_open_one_is_the_mixture(distill, vocab):
    """g = 0 (gate logits -inf) gives block_loss's plain loss and accuracies exactly, with or
    without a draft vocabulary and distillation; an open gate on the right candidates lowers
    the loss and lifts the accuracies (power: the mixture is scored)."""
    z, prev, labels, lm, gru, proj, first, soft = _loss_inputs()
    args = (z, prev, labels, lm, gru, proj, 0.3, 4.0, first, vocab, soft, distill, 1.0)
    plain, st = block_loss(*args)
    cand = torch.randint(0, 12, labels.shape, generator=torch.Generator().manual_seed(1))
    cand0 = torch.randint(0, 12, (5,), generator=torch.Generator().manual_seed(2))
    closed = (cand, torch.full(labels.shape, float("-inf")), cand0, torch.full((5,), float("-inf")))
    same, st_same = block_loss(*args, closed)
    assert torch.allclose(same, plain, atol=1e-6)
    for key in ("valid", "correct_base", "correct_final"):
        assert st_same[key] == st[key], key
    assert st_same["ce_final"] == pytest.approx(st["ce_final"], abs=1e-5)
    right = (labels.clamp_min(0), torch.full(labels.shape, 3.0), first[1], torch.full((5,), 3.0))
    better, st_right = block_loss(*args, right)
    assert better < plain - 0.5
    assert sum(st_right["correct_final"]) == sum(st_right["valid"])  # g = 0.95 wins every pick


def test_a_label_outside_the_draft_vocabulary_counts_when_it_is_the_candidate():
    """With a draft vocabulary the drafter cannot draft token 9, but q puts g on it when it is
    the copy candidate: -log q(9) = -log g there, and the position is scored (ok)."""
    logits = torch.zeros(1, 2, 3)  # over vocab [0, 1, 2]
    vocab = torch.tensor([0, 1, 2])
    labels = torch.tensor([[9, 9]])
    ys = torch.full_like(labels, -100)
    cand = torch.tensor([[9, 1]])
    lg, l1g = log_gate(torch.zeros(1, 2), cand)
    nll, ok, pick = gated_nll(logits, labels, ys, (cand, lg, l1g), vocab, 12)
    assert ok.tolist() == [[True, False]] and float(nll[0, 0]) == pytest.approx(0.6931472)
    assert pick[0, 0] == 9 and pick[0, 1] == 1  # g = 0.5 + 0.5/3 beats 0.5/3 in both rows


def test_a_pointer_drafter_trains_from_a_gateless_init_and_resumes_exactly(tmp_path):
    """copy_gate = true over an init drafter without a gate: the seed drafter gets one (w = 0,
    b = -2) and otherwise the init's weights; training moves the gate; the export says
    copy_gate and loads with its weights; an interrupted run resumes to the same weights."""
    from safetensors.torch import load_file

    from domino_sglang.model.config import load_draft_config, load_draft_weights
    from domino_sglang.train.config import load_train_config
    from domino_sglang.train.loop import train

    (tmp_path / "a").mkdir()
    train(load_train_config(None, tiny_overrides(tmp_path / "a", steps=3)), progress=False)
    init = tmp_path / "a" / "run" / "drafter"
    runs = []
    for name, stop in (("full", None), ("part", 3)):
        conf = load_train_config(None, tiny_overrides(
            tmp_path / "a", init=str(init), copy_gate=True, distill=0.5, distill_topk=8,
            draft_vocab=40, out=str(tmp_path / name)))
        if stop:
            train(conf, progress=False, stop_at=stop)
        train(conf, progress=False)
        runs.append(torch.load(tmp_path / name / "checkpoint" / "drafter.pt", weights_only=True))
    assert [k for k in runs[0] if not torch.equal(runs[0][k], runs[1][k])] == []
    assert all(torch.isfinite(t).all() for t in runs[0].values())
    seed = load_file(str(tmp_path / "full" / "init" / "model.safetensors"))
    src = load_file(str(init / "model.safetensors"))
    assert all(torch.equal(seed[k], src[k].float()) for k in src)
    assert seed["copy_gate.weight"].abs().sum() == 0 and seed["copy_gate.bias"].item() == -2.0
    assert not torch.equal(runs[0]["copy_gate.weight"], seed["copy_gate.weight"])
    conf = load_draft_config(tmp_path / "full" / "drafter")
    assert conf.copy_gate and "copy_gate.bias" in load_draft_weights(conf)
    assert not load_draft_config(init).copy_gate


def test_copy_index_answers_as_copy_table_round_by_round():
    """The served index (history.HistoryIndex: histories indexed incrementally, the round's chain
    scanned) gives every position exactly copy_table's candidate of history + chain, as the
    drafter was trained; a history that no longer extends the index is indexed afresh."""
    from domino_sglang.spec.history import HistoryIndex

    rng = random.Random(1)
    for trial in range(60):
        vocab = rng.choice((2, 3, 5, 20))
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(2, 70))]
        if trial % 3 == 0:
            ids = ids + ids[:20] + [rng.randrange(vocab)]
        cand, match = copy_table(ids)
        prompt, output = ids[:rng.randrange(1, min(len(ids), 8) + 1)], []
        index, k = HistoryIndex(15), len(prompt)  # a request's rounds from its prefill on
        while k <= len(ids):  # rounds committing 1-5 tokens, appended to the request's list
            output.extend(ids[len(prompt) + len(output):k])
            index.sync(prompt, output)
            for i in range(min(16, len(ids) - k + 1)):  # the chain d_1..d_i
                assert index.copy_candidate(ids[k:k + i]) == (
                    int(cand[k - 1 + i]), int(match[k - 1 + i])), (ids, k, i)
            k += rng.randrange(1, 6)
        if len(ids) >= 3:
            index.sync(ids[:1], [])  # restarted
            assert index.copy_candidate(ids[1:3]) == (int(cand[2]), int(match[2]))


def _gate(bias: float, seed: int = 0):
    from tests.spec.test_rollout import H

    torch.manual_seed(seed)
    gate = torch.nn.Linear(H + 13, 1)
    torch.nn.init.normal_(gate.weight, std=1.0)
    torch.nn.init.constant_(gate.bias, bias)
    return gate


def _pointer(gate, histories):
    from domino_sglang.spec.history import HistoryIndex
    from domino_sglang.spec.pointer import PointerCopy

    indexes = []
    for h in histories:
        indexes.append(HistoryIndex(15))
        indexes[-1].sync(h, [])
    return PointerCopy(gate, indexes, torch.device("cpu"))


def _reference_pointer_rollout(z, histories, head, gate, use_head=True, vocab=None):
    """Straight from the definition, one request at a time: the full vocabulary (-inf outside
    the draft vocabulary), the GRU over the whole prefix, c from copy_table of history + chain,
    q = (1 - g) softmax + g onehot(c) built explicitly, the draft its argmax. Returns the drafts
    [bs, B-1] and where they are the copy [bs, B-1] bool."""
    from domino_sglang.spec.pointer import gate_inputs
    from tests.spec.test_rollout import B, V

    mask = torch.zeros(V)
    if vocab is not None:
        mask = torch.full((V,), float("-inf")).index_fill_(0, vocab, 0.0)
    out, won = [], []
    for b, hist in enumerate(histories):
        seq, chain, copies = list(hist), [], []
        base = z[b, :-1] @ head.lm_head_weight.T + mask  # [B-1, V]
        for i in range(B - 1):
            logits = base[i].clone()
            if use_head and i >= 1:
                _, s = head.prefix_gru(head.embed(torch.tensor([hist[-1], *chain]))[None])
                logits = logits + head.embed_proj(torch.cat([z[b, i], s[0, 0]]))
            q = torch.softmax(logits, -1)
            cand, match = copy_table(seq)
            c, n = int(cand[-1]), int(match[-1])
            if c >= 0:
                g = torch.sigmoid(gate(gate_inputs(z[b, i], torch.tensor(n)))[0])
                q = (1 - g) * q
                q[c] += g
            chain.append(int(q.argmax()))
            copies.append(c >= 0 and chain[-1] == c)  # g > 0: c wins over an equal own pick
            seq.append(chain[-1])
        out.append(chain)
        won.append(copies)
    return torch.tensor(out), torch.tensor(won)


@pytest.mark.parametrize("use_head", [True, False])
@pytest.mark.parametrize("vocab", [None, torch.tensor([9, 2, 5, 0, 7])])
@pytest.mark.parametrize("pool", [0, 5])  # 5: the whole draft vocabulary (or 5 of all 11)
def test_pointer_greedy_rollout_drafts_the_argmax_of_q(pool, vocab, use_head):
    """greedy_rollout with a copy path drafts argmax q at every position, q built explicitly;
    copies happen (power: a strong gate copies, tokens outside the draft vocabulary included)
    and a closed gate drafts as without one. The copy path records where the copy was drafted
    (the metrics' copied positions)."""
    from domino_sglang.spec.rollout import greedy_rollout
    from tests.spec.test_rollout import B, H, V, make_head

    if pool and vocab is None:
        pool = V  # a pool of the whole vocabulary: the reference needs no pool
    rng = random.Random(2)
    histories = [[rng.randrange(4) if k % 2 else rng.randrange(V) for k in range(9)]
                 for _ in range(6)]
    head = make_head(0)
    served = head.with_vocab(vocab)
    z = torch.randn(6, B, H)
    bonus = torch.tensor([h[-1] for h in histories])
    copied = 0
    with torch.no_grad():
        for bias in (3.0, -1.0):
            gate = _gate(bias)
            copy = _pointer(gate, histories)
            got = greedy_rollout(z, bonus, served, pool, use_head, copy=copy)
            want, won = _reference_pointer_rollout(z, histories, head, gate, use_head, vocab)
            assert torch.equal(got, want), (bias, got, want)
            assert torch.equal(copy.copied(), won)
            plain = greedy_rollout(z, bonus, served, pool, use_head)
            copied += int((got != plain).sum())
        closed = _gate(-1e4)
        assert torch.equal(greedy_rollout(z, bonus, served, pool, use_head,
                                          copy=_pointer(closed, histories)), plain)
    assert copied > 5
    if vocab is not None:
        assert not torch.isin(greedy_rollout(z, bonus, served, pool, use_head,
                                             copy=_pointer(_gate(3.0), histories)), vocab).all()


def test_pointer_sampled_draft_is_drawn_from_its_q():
    """pointer_sample: d ~ q exactly (20,000 rows of one request: the empirical distribution
    of the first draft is q's, the copy candidate outside the draft vocabulary included), q
    sums to 1, and greedy rows draft what greedy_rollout does."""
    from domino_sglang.spec.rollout import greedy_rollout, sampled_rollout
    from domino_sglang.spec.sampling import RoundUniforms
    from tests.spec.test_rollout import B, V, make_head
    from tests.spec.test_sampling import make_rows

    n = 20_000
    head = make_head(1).with_vocab(torch.tensor([9, 2, 5, 0, 7]))
    history = [3, 4, 1, 3, 4, 6, 3, 4]  # x_t = 4: candidate 6 (after "3 4"), outside the vocab
    z = torch.randn(1, B, head.embed.weight.shape[1],
                    generator=torch.Generator().manual_seed(4)).expand(n, -1, -1)
    rows = make_rows(n, temperature=0.9)
    u = RoundUniforms.for_round(rows.seed, torch.full((n,), 7), B)
    bonus = torch.full((n,), 4)
    with torch.no_grad():
        drafts, q = sampled_rollout(z, bonus, head, rows, u.draft, 0,
                                    copy=_pointer(_gate(0.5), [history] * n))
    torch.testing.assert_close(q.sum(-1), torch.ones(n, B - 1, dtype=q.dtype))
    q0 = q[0, 0]
    assert float(q0[6]) > 0.2 and bool((q0 >= 0).all())  # the copy's mass on token 6
    freq = torch.bincount(drafts[:, 0], minlength=V).double() / n
    assert float((freq - q0.double()).abs().sum()) / 2 < 0.015, (freq, q0)
    assert (q.gather(2, drafts[..., None]) > 0).all()  # every draft had positive q
    greedy = make_rows(8, top_k=1)
    u8 = RoundUniforms.for_round(greedy.seed, torch.full((8,), 7), B)
    with torch.no_grad():
        d8, _ = sampled_rollout(z[:8], bonus[:8], head, greedy, u8.draft,
                                copy=_pointer(_gate(0.5), [history] * 8))
        want = greedy_rollout(z[:8], bonus[:8], head, copy=_pointer(_gate(0.5), [history] * 8))
    assert torch.equal(d8, want)


def test_copy_index_placement():
    """By device (CUDA: device, CPU: host) unless --speculative-domino-debug-copy-index says."""
    assert not copy_index_on_device("cpu") and copy_index_on_device("cuda")
    assert copy_index_on_device("cpu", "device") and not copy_index_on_device("cuda", "host")
    with pytest.raises(ValueError, match="must be 'device' or 'host', got 'gpu'"):
        copy_index_on_device("cpu", "gpu")


def _device_pointer(gate, histories, n):
    """The same histories in DevicePointerCopy's left-aligned [bs, T] buffer (padding junk)."""
    from domino_sglang.spec.pointer import DevicePointerCopy

    t = max(len(h) for h in histories) + 3
    buf = torch.full((len(histories), t), 4, dtype=torch.int64)  # junk after each history
    for b, h in enumerate(histories):
        buf[b, :len(h)] = torch.tensor(h)
    return DevicePointerCopy(gate, buf, torch.tensor([len(h) for h in histories]), n)


def test_device_candidates_are_copy_table_at_every_position():
    """pointer.device_candidates (issue 64: the copy index on the device, no host sync) gives
    copy_table's (c, n) for every prefix of random histories, batched with ragged lengths."""
    from domino_sglang.spec.pointer import device_candidates

    rng = random.Random(3)
    seqs = []
    for trial in range(40):
        vocab = rng.choice((2, 3, 5, 20))
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))]
        if trial % 3 == 0:
            ids = ids + ids[:20] + [rng.randrange(vocab)]
        seqs.append(ids)
    t = max(map(len, seqs))
    buf = torch.tensor([s + [rng.randrange(3)] * (t - len(s)) for s in seqs])
    tables = [copy_table(s) for s in seqs]
    for pos in range(t):
        last = torch.tensor([min(pos, len(s) - 1) for s in seqs])
        c, n = device_candidates(buf, last)
        want_c = torch.stack([cand[int(k)] for (cand, _), k in zip(tables, last)])
        want_n = torch.stack([match[int(k)] for (_, match), k in zip(tables, last)])
        assert torch.equal(c, want_c) and torch.equal(n, want_n), pos


@pytest.mark.parametrize("use_head", [True, False])
@pytest.mark.parametrize("pool", [0, 5])
def test_device_pointer_copy_drafts_as_the_host_index(pool, use_head):
    """Greedy and sampled rollouts with DevicePointerCopy equal those with the host HistoryIndex
    (same drafts, same q, same copied positions)."""
    from domino_sglang.spec.rollout import greedy_rollout, sampled_rollout
    from domino_sglang.spec.sampling import RoundUniforms
    from tests.spec.test_rollout import B, H, make_head
    from tests.spec.test_sampling import make_rows

    rng = random.Random(5)
    histories = [[rng.randrange(4) for _ in range(rng.randrange(3, 15))] for _ in range(5)]
    head = make_head(0).with_vocab(torch.tensor([9, 2, 5, 0, 7]))
    z = torch.randn(5, B, H, generator=torch.Generator().manual_seed(6))
    bonus = torch.tensor([h[-1] for h in histories])
    gate = _gate(1.0)
    with torch.no_grad():
        host, dev = _pointer(gate, histories), _device_pointer(gate, histories, B - 1)
        assert torch.equal(greedy_rollout(z, bonus, head, pool, use_head, copy=host),
                           greedy_rollout(z, bonus, head, pool, use_head, copy=dev))
        assert torch.equal(host.copied(), dev.copied()) and bool(host.copied().any())
        rows = make_rows(5, temperature=0.8)
        u = RoundUniforms.for_round(rows.seed, torch.full((5,), 20), B)
        d1, q1 = sampled_rollout(z, bonus, head, rows, u.draft, pool, use_head,
                                 copy=_pointer(gate, histories))
        d2, q2 = sampled_rollout(z, bonus, head, rows, u.draft, pool, use_head,
                                 copy=_device_pointer(gate, histories, B - 1))
    assert torch.equal(d1, d2) and torch.equal(q1, q2)


def test_device_histories_follow_requests_round_by_round():
    """pointer.DeviceHistories: rows extended by the new tokens only, requests joining,
    leaving, restarting; every round's rows equal prompt + output (one copy per round)."""
    from types import SimpleNamespace

    from domino_sglang.spec.pointer import DeviceHistories

    rng = random.Random(7)
    reqs = {rid: SimpleNamespace(rid=rid, origin_input_ids=[rng.randrange(50) for _ in range(n)],
                                 output_ids=[]) for rid, n in (("a", 5), ("b", 70), ("c", 1))}
    hist = DeviceHistories("cpu")
    batch = [reqs["a"], reqs["b"]]
    for rnd in range(12):
        for r in batch:
            r.output_ids += [rng.randrange(50) for _ in range(rng.randrange(1, 5))]
        if rnd == 4:
            batch = [reqs["b"], reqs["c"], reqs["a"]]  # c joins, order changes
        if rnd == 7:
            batch = [reqs["c"], reqs["a"]]  # b leaves
        if rnd == 9:
            reqs["a"].output_ids = reqs["a"].output_ids[:2]  # a restarts, shorter
        history, lens = hist.update(batch)
        for b, r in enumerate(batch):
            want = r.origin_input_ids + r.output_ids
            assert int(lens[b]) == len(want)
            assert history[b, :len(want)].tolist() == want, (rnd, r.rid)
    assert set(hist.slot) == {"c", "a"}
