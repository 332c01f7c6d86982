"""Lossless speculative sampling on tiny dimensions (pure torch, seconds).

The central test runs DOMINO sampling (sampled head rollout + exact chain verification) for
N = 20,000 independent requests (one seed each) on a tiny random target and head, and checks
that the first three generated tokens follow the target's exact joint distribution (computed by
enumeration over V^3 = 125 sequences) with a chi-square test at alpha = 1e-4 per case: with the
4 cases below, a correct implementation fails with probability < 4e-4 over the choice of seeds
(the seeds are fixed, so the test is deterministic). The same test must reject deliberately
broken verifiers (power):
  - recovering from p instead of normalize(max(p - q, 0)) at the first rejection,
  - accepting every draft (committing the drafter's samples).
Note that "accept d_{k+1} iff it equals a fresh sample y_k ~ p_k, commit y_a" is NOT broken: the
committed token is y_k in both branches, so it is exact (with a lower acceptance rate); the test
checks that it passes, which documents why it cannot serve as the power check.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2
from torch import nn

from domino_sglang.spec.history import HistoryIndex
from domino_sglang.spec.pointer import PointerCopy
from domino_sglang.spec.proposers.protocol import one_hot_proposal
from domino_sglang.spec.rollout import HeadParams, greedy_rollout, sampled_rollout
from domino_sglang.spec.sampling import (
    RoundUniforms,
    SamplingRows,
    process_logits,
    sample_from,
    seeded_uniform,
)
from domino_sglang.spec.verify import verify_mixed, verify_sampled
from tests.harness.lookup_reference import lookup_batch

H, G, E, V, B = 8, 6, 5, 5, 4
N = 20_000
ALPHA = 1e-4
PROMPT = (3, 1)


def make_head(seed: int = 0, vocab: int = V) -> HeadParams:
    torch.manual_seed(seed)
    embed = nn.Embedding(vocab, H)
    gru = nn.GRU(H, G, bias=False, batch_first=True)
    proj = nn.Sequential(nn.Linear(H + G, E, bias=False), nn.SiLU(),
                         nn.Linear(E, vocab, bias=False))
    for p in [*gru.parameters(), *proj.parameters()]:
        nn.init.normal_(p, std=1.5)  # a strong head: q differs clearly from p
    return HeadParams(embed=embed, lm_head_weight=torch.randn(vocab, H), prefix_gru=gru,
                      embed_proj=proj)


def make_rows(n: int, temperature=1.0, top_k=1 << 30, top_p=1.0, min_p=0.0, seed0=0
              ) -> SamplingRows:
    """n requests alike, with the host flags SGLang would set for them (so the temperature
    case runs the served fast path: no sort, no min-p, no greedy pass)."""
    full = lambda v, dt: torch.full((n,), v, dtype=dt)  # noqa: E731
    return SamplingRows(temperature=full(temperature, torch.float32),
                        top_k=full(top_k, torch.int64), top_p=full(top_p, torch.float32),
                        min_p=full(min_p, torch.float32),
                        seed=torch.arange(seed0, seed0 + n, dtype=torch.int64),
                        need_sort=top_k != 1 << 30 or top_p < 1.0, need_min_p=min_p > 0,
                        has_greedy=top_k != 1 << 30)


class TinyTarget:
    """p(next | ..., a, b) = softmax(W1[b] + W2[a]): a bigram-of-two target."""

    def __init__(self, seed: int = 7):
        g = torch.Generator().manual_seed(seed)
        self.w1 = 1.5 * torch.randn(V, V, generator=g)
        self.w2 = 1.5 * torch.randn(V, V, generator=g)

    def logits(self, prev2: torch.Tensor, prev1: torch.Tensor) -> torch.Tensor:
        return self.w1[prev1] + self.w2[prev2]

    def joint3(self, rows: SamplingRows) -> torch.Tensor:
        """Exact P(y1, y2, y3) [V, V, V] of plain sampling after PROMPT."""
        one = SamplingRows(*(t[:1] for t in (rows.temperature, rows.top_k, rows.top_p,
                                              rows.min_p, rows.seed)), rows.need_sort)

        def dist(a, b):
            return process_logits(self.logits(torch.tensor([a]), torch.tensor([b])), one)[0]

        p1 = dist(*PROMPT)
        joint = torch.zeros(V, V, V, dtype=torch.float64)
        for y1 in range(V):
            p2 = dist(PROMPT[1], y1)
            for y2 in range(V):
                joint[y1, y2] = p1[y1] * p2[y2] * dist(y1, y2).double()
        return joint


def run_domino(target: TinyTarget, head: HeadParams, rows: SamplingRows, verify,
               tokens: int = 3, pool: int = 0, lookup: str | None = None, scale: float = 1.0,
               gate: nn.Linear | None = None, gate_q: str = "mixed",
               one_hot: bool = False) -> torch.Tensor:
    """Rounds of draft -> verify -> commit for every row until `tokens` are generated.

    scale: the draft temperature scale (q at temperature T * scale).
    lookup: rows whose history has a prompt-lookup draft (lookup_batch, here from one matching
    token, so that most rounds have one) verify the copy, as the worker does: "one-hot" with
    q = one-hot (the worker's), "drafter-q" with the drafter's q left in place (BROKEN).
    gate: a pointer drafter's copy gate (pointer.py): each row's copy index of its history,
    drafts from the mixture q; gate_q "drafter" verifies them against the drafter's own q
    without the copy (BROKEN).
    one_hot: greedy drafts verified as one-hot proposals (--speculative-domino-debug-sampled-
    drafts off, SGLang's DFLASH at T > 0), their q kept as a one-token support.
    Returns the first `tokens` generated ids per row [n, tokens].
    """
    n = rows.seed.shape[0]
    hist = torch.zeros(n, len(PROMPT) + B * tokens, dtype=torch.int64)
    hist[:, :2] = torch.tensor(PROMPT)
    length = torch.full((n,), len(PROMPT))
    ar = torch.arange(n)
    z = torch.randn(1, B, H, generator=torch.Generator().manual_seed(3)).expand(n, -1, -1)
    indexes = [HistoryIndex(B - 1) for _ in range(n)] if gate is not None else []
    while int(length.min()) < len(PROMPT) + tokens:
        x_t, prev = hist[ar, length - 1], hist[ar, length - 2]
        u = RoundUniforms.for_round(rows.seed, length - 1, B)  # x_t at position length - 1
        copy = None
        if gate is not None:
            for i, index in enumerate(indexes):
                index.sync(PROMPT, hist[i, len(PROMPT):int(length[i])].tolist())
            copy = PointerCopy(gate, indexes, torch.device("cpu"))
        drafts, q = sampled_rollout(z, x_t, head, rows, u.draft, candidate_pool=pool,
                                    temperature_scale=scale, copy=copy)
        if one_hot:
            drafts = greedy_rollout(z, x_t, head, pool)
            q = one_hot_proposal(drafts, torch.ones(n, dtype=torch.bool), None, V)
        if gate is not None:
            run_domino.outside += int((~torch.isin(drafts, head.vocab)).sum()
                                      if head.vocab is not None else 0)
            if gate_q == "drafter":
                q = sampled_rollout(z, x_t, head, rows, u.draft, candidate_pool=pool,
                                    temperature_scale=scale)[1]
        chain = torch.cat((x_t[:, None], drafts), dim=1)  # [n, B]
        if lookup is not None:  # every row's lookup draft at once, as the worker asks
            copies, lengths = lookup_batch([hist[i, :n_i] for i, n_i in enumerate(length.tolist())],
                                           B - 1, min_match=1)  # [n, B-1] padded -1, [n]
            looked = lengths > 0
            chain[:, 1:] = torch.where(looked[:, None], copies.clamp(min=0), chain[:, 1:])
            if lookup == "one-hot":
                q = one_hot_proposal(chain[:, 1:], looked, q, V)
            run_domino.looked += int(looked.sum())
        logits = target.logits(torch.cat((prev[:, None], chain[:, :-1]), 1), chain)  # [n,B,V]
        out, acc = verify(chain, logits, q, rows, u)
        for j in range(B):
            keep = j < acc
            hist[ar[keep], length[keep] + j] = out[keep, j]
        length = length + acc
    return hist[:, len(PROMPT):len(PROMPT) + tokens]


run_domino.looked = 0  # rows drafted by lookup so far (the lookup tests' power check)
run_domino.outside = 0  # pointer drafts outside the draft vocabulary (copies only)


def chi_square(samples: torch.Tensor, joint: torch.Tensor) -> tuple[float, float, int]:
    """(statistic, critical value at ALPHA, samples in zero-probability cells)."""
    flat = samples[:, 0] * V * V + samples[:, 1] * V + samples[:, 2]
    counts = torch.bincount(flat, minlength=V**3).double()
    expected = joint.reshape(-1) * samples.shape[0]
    forbidden = int(counts[expected == 0].sum())
    small = (expected > 0) & (expected < 5)  # pool sparse cells into one bucket
    obs = torch.cat((counts[expected >= 5], counts[small].sum()[None]))
    exp = torch.cat((expected[expected >= 5], expected[small].sum()[None]))
    obs, exp = obs[exp > 0], exp[exp > 0]
    stat = float(((obs - exp) ** 2 / exp).sum())
    return stat, float(chi2.ppf(1 - ALPHA, len(exp) - 1)), forbidden


# ---- deliberately broken and alternative verifiers (same signature as verify_mixed) ----
def _p(logits, rows):
    n, b, v = logits.shape
    return process_logits(logits.reshape(-1, v), rows.repeat(b)).view(n, b, v)


def recover_from_p(chain, logits, q, rows, u):
    """BROKEN: correct coins, but the first rejection resamples from p_a, not the residual."""
    p = _p(logits, rows)
    bs = p.shape[0]
    d = chain[:, 1:]
    q_d, p_d = q.gather(2, d[..., None])[..., 0], p[:, :-1].gather(2, d[..., None])[..., 0]
    accept = u.accept * q_d < p_d
    a = torch.cumprod(accept.int(), 1).sum(1)
    y = sample_from(p[torch.arange(bs), a], u.resample[torch.arange(bs), a])
    out = torch.cat((d, d[:, -1:]), 1).clone()
    out[torch.arange(bs), a] = y
    return out, a + 1


def accept_all(chain, logits, q, rows, u):
    """BROKEN: every draft accepted (the drafter's samples are committed)."""
    bonus = sample_from(_p(logits, rows)[:, -1], u.resample[:, -1])
    return torch.cat((chain[:, 1:], bonus[:, None]), 1), torch.full((chain.shape[0],), B)


def equality_with_p_sample(chain, logits, q, rows, u):
    """Exact (not broken): y_k ~ p_k; accept d_{k+1} iff d_{k+1} == y_k; commit y_a."""
    p = _p(logits, rows)
    bs, b, v = p.shape
    y = sample_from(p.reshape(-1, v), u.resample.reshape(-1)).view(bs, b)
    a = torch.cumprod((chain[:, 1:] == y[:, :-1]).int(), 1).sum(1)
    return y, a + 1


CASES = {
    "temperature": dict(temperature=0.8),
    "top_k": dict(temperature=1.0, top_k=3),
    "top_p": dict(temperature=1.0, top_p=0.85),
    "top_k_top_p_min_p": dict(temperature=1.3, top_k=4, top_p=0.9, min_p=0.1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_domino_sampling_matches_target_distribution(case):
    target, head = TinyTarget(), make_head(0)
    rows = make_rows(N, **CASES[case])
    joint = target.joint3(rows)
    samples = run_domino(target, head, rows, verify_mixed)
    stat, crit, forbidden = chi_square(samples, joint)
    print(f"\n{case}: chi2 {stat:.1f} (critical {crit:.1f} at alpha {ALPHA})")
    assert forbidden == 0  # never a sequence plain sampling cannot produce (top-k/top-p/min-p)
    assert stat < crit


@pytest.mark.parametrize("case", ["temperature", "top_k_top_p_min_p"])
def test_lookup_drafts_keep_sampling_exact(case):
    """Copied drafts (prompt lookup) beside the head's, per row: with q = one-hot on the copy
    the committed tokens still follow the target's joint distribution; verified against the
    drafter's q instead (a plausible slip: the copy replaces the draft, q stays), they do not.
    Power: about a third of the rows copy in some round."""
    target, head = TinyTarget(), make_head(0)
    rows = make_rows(N, **CASES[case])
    joint = target.joint3(rows)
    run_domino.looked = 0
    stat, crit, forbidden = chi_square(run_domino(target, head, rows, verify_mixed,
                                                  lookup="one-hot"), joint)
    print(f"\n{case}: chi2 {stat:.1f} (critical {crit:.1f}), {run_domino.looked} copied rows")
    assert forbidden == 0 and stat < crit
    assert run_domino.looked > N // 5
    stat, crit, forbidden = chi_square(run_domino(target, head, rows, verify_mixed,
                                                  lookup="drafter-q"), joint)
    print(f"{case} drafter-q: chi2 {stat:.1f} (critical {crit:.1f})")
    assert stat > crit or forbidden > 0


@pytest.mark.parametrize("scale", [0.5, 2.0])
@pytest.mark.parametrize("case", ["temperature", "top_k_top_p_min_p"])
def test_draft_temperature_scale_keeps_sampling_exact(case, scale):
    """Drafts drawn at temperature T * scale (the served drafter's `draft_temperature_scale`)
    are still verified against the target at T: the committed tokens follow its distribution."""
    target, head = TinyTarget(), make_head(0)
    rows = make_rows(N, **CASES[case])
    samples = run_domino(target, head, rows, verify_mixed, scale=scale)
    stat, crit, forbidden = chi_square(samples, target.joint3(rows))
    print(f"\n{case} scale {scale}: chi2 {stat:.1f} (critical {crit:.1f})")
    assert forbidden == 0 and stat < crit


def test_draft_temperature_scale_sharpens_q_only():
    """scale < 1 sharpens the draft distributions (a larger top probability at every position),
    greedy rows stay one-hot at the same tokens, and the rows given are not changed."""
    head = make_head(0)
    rows = make_rows(6, temperature=1.0)
    rows.top_k[:2] = 1  # two greedy rows, flagged as SGLang flags them
    rows.has_greedy = rows.need_sort = True
    temperature = rows.temperature.clone()
    z = torch.randn(6, B, H, generator=torch.Generator().manual_seed(5))
    bonus = torch.full((6,), PROMPT[1])
    u = RoundUniforms.for_round(rows.seed, torch.ones(6, dtype=torch.int64), B)
    d1, q1 = sampled_rollout(z, bonus, head, rows, u.draft)
    d2, q2 = sampled_rollout(z, bonus, head, rows, u.draft, temperature_scale=0.5)
    assert torch.equal(rows.temperature, temperature)
    assert torch.equal(d1[:2], d2[:2]) and torch.equal(q1[:2], q2[:2])
    assert bool((q2[2:, 0].amax(-1) > q1[2:, 0].amax(-1)).all())


def test_candidate_pool_keeps_sampling_exact():
    """The head scored over a 2-token pool: q is 0 outside it (the served default is a pool)."""
    target, head = TinyTarget(), make_head(0)
    rows = make_rows(N, **CASES["temperature"])
    samples = run_domino(target, head, rows, verify_mixed, pool=2)
    stat, crit, forbidden = chi_square(samples, target.joint3(rows))
    assert forbidden == 0 and stat < crit


@pytest.mark.parametrize("pool", [0, 2])
@pytest.mark.parametrize("case", ["temperature", "top_k_top_p_min_p"])
def test_draft_vocabulary_keeps_sampling_exact(case, pool):
    """Drafts from a 3-token draft vocabulary (q is 0 at the other 2): still the target's
    distribution, every token reachable through the residual."""
    target, head = TinyTarget(), make_head(0).with_vocab(torch.tensor([4, 0, 2]))
    rows = make_rows(N, **CASES[case])
    samples = run_domino(target, head, rows, verify_mixed, pool=pool)
    stat, crit, forbidden = chi_square(samples, target.joint3(rows))
    assert forbidden == 0 and stat < crit
    assert set(samples.unique().tolist()) - {4, 0, 2}  # tokens outside it are still produced


@pytest.mark.parametrize("case, pool", [("temperature", 0), ("top_k_top_p_min_p", 2)])
def test_pointer_drafts_keep_sampling_exact(case, pool):
    """A pointer drafter (pointer.py) drafts from q = (1 - g) p + g onehot(c), c copied from
    the row's own history, over a 3-token draft vocabulary: verified against that q the
    committed tokens follow the target's distribution; against the drafter's q without the
    copy (a plausible slip) they do not (at temperature alone: with top-k / top-p / min-p the
    target filters out most copies, p(c) = 0, and the slip goes unseen in 3 tokens). Power:
    copies outside the draft vocabulary (only the copy path drafts those) are verified."""
    target, head = TinyTarget(), make_head(0).with_vocab(torch.tensor([4, 0, 2]))
    rows = make_rows(N, **CASES[case])
    torch.manual_seed(11)
    gate = nn.Linear(H + 13, 1)
    nn.init.constant_(gate.bias, 1.0)  # g ~ 0.7: copies are drafted often
    run_domino.outside = 0
    samples = run_domino(target, head, rows, verify_mixed, pool=pool, gate=gate)
    stat, crit, forbidden = chi_square(samples, target.joint3(rows))
    print(f"\n{case}: chi2 {stat:.1f} (critical {crit:.1f}), {run_domino.outside} copies "
          f"outside the draft vocabulary")
    assert forbidden == 0 and stat < crit
    assert run_domino.outside > N // 10
    if case != "temperature":
        return
    broken = run_domino(target, head, rows, verify_mixed, pool=pool, gate=gate,
                        gate_q="drafter")
    stat, crit, forbidden = chi_square(broken, target.joint3(rows))
    assert stat > crit or forbidden > 0


def test_draft_vocabulary_q_is_the_masked_full_q():
    """q over a draft vocabulary = q over the full vocabulary with -inf logits outside it, and
    every draft lies inside it (no head: the masked base logits are the whole story)."""
    head, vocab = make_head(5, vocab=11), torch.tensor([7, 1, 3, 10])
    z, bonus = torch.randn(6, B, H), torch.randint(0, 11, (6,))
    rows = make_rows(6, temperature=0.9, top_k=3, top_p=0.95)
    u = RoundUniforms.for_round(rows.seed, torch.full((6,), 4), B)
    drafts, q = sampled_rollout(z, bonus, head.with_vocab(vocab), rows, u.draft, use_head=False)
    masked = torch.full((11,), float("-inf")).index_fill_(0, vocab, 0.0)
    logits = z[:, :-1] @ head.lm_head_weight.T + masked  # [6, B-1, 11]
    expected = process_logits(logits.reshape(-1, 11), rows.repeat(B - 1)).view(6, B - 1, 11)
    torch.testing.assert_close(q, expected)
    assert torch.isin(drafts, vocab).all()


@pytest.mark.parametrize("case", list(CASES))
def test_broken_verifiers_fail_the_same_test(case):
    target, head = TinyTarget(), make_head(0)
    rows = make_rows(N, **CASES[case])
    joint = target.joint3(rows)
    for broken in (recover_from_p, accept_all):
        stat, crit, forbidden = chi_square(run_domino(target, head, rows, broken), joint)
        print(f"\n{case} {broken.__name__}: chi2 {stat:.1f} (critical {crit:.1f})")
        assert stat > crit or forbidden > 0, broken.__name__
    # the equality rule is exact, so it passes
    stat, crit, forbidden = chi_square(run_domino(target, head, rows, equality_with_p_sample),
                                       joint)
    assert stat < crit and forbidden == 0


def test_domino_sampling_accepts_drafts():
    """The test above is not vacuous: many drafts are accepted (a rollout that is always
    rejected would pass it trivially)."""
    target, head = TinyTarget(), make_head(0)
    rows = make_rows(4000, temperature=1.0)
    n = rows.seed.shape[0]
    x_t = torch.full((n,), PROMPT[1])
    z = torch.randn(1, B, H, generator=torch.Generator().manual_seed(3)).expand(n, -1, -1)
    u = RoundUniforms.for_round(rows.seed, torch.ones(n, dtype=torch.int64), B)
    drafts, q = sampled_rollout(z, x_t, head, rows, u.draft)
    chain = torch.cat((x_t[:, None], drafts), 1)
    logits = target.logits(torch.cat((torch.full((n, 1), PROMPT[0]), chain[:, :-1]), 1), chain)
    _, acc = verify_mixed(chain, logits, q, rows, u)
    tau, lengths = float(acc.double().mean()), torch.bincount(acc, minlength=B + 1)[1:]
    print(f"\ntau {tau:.2f}, accept lengths 1..{B}: {lengths.tolist()}")
    assert tau > 1.15 and bool((lengths > 0).all())  # every accept length occurs


def test_seeds_reproduce_and_differ():
    target, head = TinyTarget(), make_head(1)
    a = run_domino(target, head, make_rows(64, temperature=1.0, seed0=100), verify_mixed, 6)
    b = run_domino(target, head, make_rows(64, temperature=1.0, seed0=100), verify_mixed, 6)
    c = run_domino(target, head, make_rows(64, temperature=1.0, seed0=500), verify_mixed, 6)
    assert torch.equal(a, b)
    assert (a != c).any(dim=1).float().mean() > 0.5  # most requests differ with another seed
    # a request's output depends on its seed only, not on its batch neighbours
    one = run_domino(target, head, make_rows(1, temperature=1.0, seed0=100), verify_mixed, 6)
    assert torch.equal(one[0], a[0])


def test_mixed_batch_greedy_rows_are_exact():
    """Greedy rows (top_k = 1, as SGLang encodes temperature 0) in a batch with sampled rows
    produce the target's greedy continuation token for token."""
    target, head = TinyTarget(), make_head(2)
    rows = make_rows(16, temperature=0.9)
    rows.top_k[::2] = 1
    rows.temperature[::2] = 1.0
    rows.need_sort = rows.has_greedy = True  # as SGLang flags a batch with greedy rows
    out = run_domino(target, head, rows, verify_mixed, 6)
    seq = list(PROMPT)
    for _ in range(6):
        seq.append(int(target.logits(torch.tensor(seq[-2]), torch.tensor(seq[-1])).argmax()))
    greedy = torch.tensor(seq[2:])
    assert all(torch.equal(out[i], greedy) for i in range(0, 16, 2))
    assert not all(torch.equal(out[i], greedy) for i in range(1, 16, 2))


def test_all_greedy_rows_roll_out_like_greedy_rollout():
    head = make_head(3, vocab=11)
    z, bonus = torch.randn(5, 6, H), torch.randint(0, 11, (5,))
    rows = make_rows(5, top_k=1)
    u = RoundUniforms.for_round(rows.seed, torch.zeros(5, dtype=torch.int64), 6)
    drafts, q = sampled_rollout(z, bonus, head, rows, u.draft)
    assert torch.equal(drafts, greedy_rollout(z, bonus, head))
    assert torch.equal(q.argmax(-1), drafts) and torch.all(q.amax(-1) == 1)


def test_gru_consumes_the_sampled_tokens():
    """q_i equals processed(base_i + head(z_i, nn.GRU over [x_t, d_1..d_i])) recomputed
    one request at a time from the SAMPLED drafts."""
    head = make_head(4, vocab=11)
    z, bonus = torch.randn(3, 6, H), torch.randint(0, 11, (3,))
    rows = make_rows(3, temperature=1.2, top_p=0.95)
    u = RoundUniforms.for_round(rows.seed, torch.zeros(3, dtype=torch.int64), 6)
    drafts, q = sampled_rollout(z, bonus, head, rows, u.draft)
    with torch.no_grad():
        for b in range(3):
            base = z[b, :-1] @ head.lm_head_weight.T
            one = make_rows(1, temperature=1.2, top_p=0.95)
            for i in range(1, 5):
                prefix = torch.tensor([int(bonus[b]), *drafts[b, :i].tolist()])
                _, s = head.prefix_gru(head.embed(prefix)[None])
                logits = base[i] + head.embed_proj(torch.cat([z[b, i], s[0, 0]]))
                torch.testing.assert_close(q[b, i], process_logits(logits[None], one)[0])


def test_verify_sampled_edge_cases():
    p = torch.softmax(torch.randn(4, B, V), -1)
    chain = torch.cat((torch.zeros(4, 1, dtype=torch.int64),
                       sample_from(p[:, :-1].reshape(-1, V), torch.rand(4 * (B - 1))).view(4, -1)),
                      1)
    u_acc, u_res = torch.rand(4, B - 1) * 0.999, torch.rand(4, B)
    # q == p: every draft accepted, the bonus drawn from p_{B-1}
    tokens, acc = verify_sampled(chain, p[:, :-1], p, u_acc, u_res)
    assert torch.equal(acc, torch.full((4,), B)) and torch.equal(tokens[:, :-1], chain[:, 1:])
    # p forbids the first draft: rejected at once; the recovered token has p > 0
    p2 = p.clone()
    p2[torch.arange(4), 0, chain[:, 1]] = 0
    p2 = p2 / p2.sum(-1, keepdim=True)
    tokens, acc = verify_sampled(chain, p[:, :-1], p2, u_acc, u_res)
    assert torch.equal(acc, torch.ones(4, dtype=acc.dtype))
    assert torch.all(p2[torch.arange(4), 0, tokens[:, 0]] > 0)


def test_single_token_round_is_plain_sampling():
    """L = 1 (the adaptive policy's plain decoding round): no drafts, the token is ~ p_0."""
    logits = torch.randn(N, 1, V)
    rows = make_rows(N, temperature=1.0)
    u = RoundUniforms.for_round(rows.seed, torch.zeros(N, dtype=torch.int64), 1)
    chain = torch.zeros(N, 1, dtype=torch.int64)
    tokens, acc = verify_mixed(chain, logits, torch.zeros(N, 0, V), rows, u)
    assert tokens.shape == (N, 1) and torch.all(acc == 1)
    p = torch.softmax(logits[:, 0], -1).mean(0)  # rows differ: compare the mixture
    freq = torch.bincount(tokens[:, 0], minlength=V).double() / N
    assert float((freq - p.double()).abs().sum()) / 2 < 0.02  # TV; sd ~ 0.004 at N = 20000


def test_bounded_single_token_round_draws_from_the_support():
    """A plain round whose rows are all top-k bounded (Qwen3's defaults) draws from p_0's
    support alone (top_k_support, K columns): that support is process_logits' distribution
    (greedy rows one-hot at the argmax, min-p, top-p), and the drawn tokens follow it."""
    from domino_sglang.spec.sampling import top_k_support

    g = torch.Generator().manual_seed(4)
    vocab = 40
    logits = 2 * torch.randn(N, 1, vocab, generator=g)
    pattern = lambda *v: torch.tensor(v * (N // len(v)))  # noqa: E731
    rows = SamplingRows(temperature=pattern(0.6, 1.0, 0.8, 1.0).float(),
                        top_k=pattern(20, 5, 1, 12), top_p=pattern(0.95, 1.0, 1.0, 0.7).float(),
                        min_p=pattern(0.0, 0.05, 0.0, 0.0).float(),
                        seed=torch.arange(N), top_k_bounded=True, top_k_width=20)
    p = process_logits(logits[:, 0], rows)  # [N, V]
    probs, ids = top_k_support(logits[:, 0], rows)
    assert ids.shape == (N, 20)
    dense = torch.zeros(N, vocab).scatter_add_(1, ids, probs)
    torch.testing.assert_close(dense, p, rtol=0, atol=1e-6)
    u = RoundUniforms.for_round(rows.seed, torch.zeros(N, dtype=torch.int64), 1)
    tokens, acc = verify_mixed(torch.zeros(N, 1, dtype=torch.int64), logits,
                               torch.zeros(N, 0, vocab), rows, u)
    assert tokens.shape == (N, 1) and torch.all(acc == 1)
    greedy = rows.top_k == 1
    assert torch.equal(tokens[greedy, 0], logits[greedy, 0].argmax(-1))
    from scipy.stats import chisquare

    for r in range(4):  # each row kind against its own processed distribution (a mixture)
        picked = torch.arange(N) % 4 == r
        counts = torch.bincount(tokens[picked, 0], minlength=vocab).double()
        expected = p[picked].double().sum(0)  # sums to the rows picked
        kept = expected > 0
        assert float(counts[~kept].sum()) == 0, r  # never a token the filters removed
        if int(kept.sum()) > 1:
            stat = chisquare(counts[kept].numpy(), expected[kept].numpy())
            assert stat.pvalue > ALPHA, (r, stat)


def test_seeded_uniform_is_uniform_and_pure():
    seed = torch.arange(2000, dtype=torch.int64) * 7919 - 10**12
    pos = torch.arange(50)[None].expand(2000, -1)
    u = seeded_uniform(seed, pos, 1)
    assert torch.equal(u, seeded_uniform(seed, pos, 1))
    assert not torch.equal(u, seeded_uniform(seed, pos, 2))
    assert float(u.min()) > 0 and float(u.max()) < 1
    counts = torch.histc(u.float(), bins=20, min=0, max=1).double()
    exp = u.numel() / 20
    assert float(((counts - exp) ** 2 / exp).sum()) < chi2.ppf(1 - ALPHA, 19)


def test_process_logits_equals_sglang_cpu_sampler_filter():
    """Same support and renormalised weights as SGLang's pytorch-backend sampler."""
    from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch

    torch.manual_seed(0)
    n, vocab = 6, 50
    logits = 3 * torch.randn(n, vocab)
    rows = SamplingRows(temperature=torch.tensor([0.5, 1.0, 1.5, 0.8, 1.0, 1.0]),
                        top_k=torch.tensor([1 << 30, 5, 20, 1 << 30, 3, 1]),
                        top_p=torch.tensor([0.9, 1.0, 0.7, 0.5, 0.95, 1.0]),
                        min_p=torch.tensor([0.0, 0.0, 0.05, 0.2, 0.0, 0.0]),
                        seed=torch.zeros(n, dtype=torch.int64))
    probs = torch.softmax(logits / rows.temperature[:, None], -1)
    _, filtered, idx, _ = top_k_top_p_min_p_sampling_from_probs_torch(
        probs.clone(), rows.top_k.int(), rows.top_p, rows.min_p, True, None,
        torch.zeros(n, dtype=torch.int64), return_filtered_probs=True)
    expected = torch.zeros_like(probs).scatter_(-1, idx.long(), filtered)
    expected = expected / expected.sum(-1, keepdim=True)
    torch.testing.assert_close(process_logits(logits, rows), expected)


def test_host_flags_only_skip_work():
    """process_logits with the flags SGLang sets for a batch equals the all-passes path, and
    the greedy pass writes an exact one-hot; a pool-processed q equals the full-vocabulary one."""
    torch.manual_seed(1)
    logits = 4 * torch.randn(8, 300)
    for kw in (dict(temperature=0.7), dict(temperature=1.2, min_p=0.05),
               dict(temperature=0.9, top_p=0.8), dict(top_k=1)):
        exact = make_rows(8, **kw)
        conservative = SamplingRows(exact.temperature, exact.top_k, exact.top_p, exact.min_p,
                                    exact.seed)  # every flag True: every pass runs
        fast = process_logits(logits, exact)
        torch.testing.assert_close(fast, process_logits(logits, conservative))
        if kw.get("top_k") == 1:
            assert torch.equal(fast, torch.nn.functional.one_hot(logits.argmax(-1), 300).float())
    # over a pool: identical to the full vocabulary with -inf outside it
    rows = make_rows(8, temperature=0.8, top_p=0.9)
    ids = torch.randperm(300)[:40].repeat(8, 1)  # [8, 40]
    pool = logits.gather(1, ids)
    full = torch.full_like(logits, float("-inf")).scatter_(1, ids, pool)
    on_pool = torch.zeros_like(logits).scatter_(1, ids, process_logits(pool, rows))
    torch.testing.assert_close(on_pool, process_logits(full, rows))


def test_bounded_top_k_filters_as_the_whole_sort_without_sorting():
    """Every row's top_k <= TOP_K_BOUND (Qwen3's top-k 20 / top-p 0.95, greedy rows, min-p):
    top-k / top-p over the TOP_K_BOUND most likely tokens keep exactly what the whole
    vocabulary's sort keeps, and no sort runs (a partial top-k instead)."""
    from torch.profiler import ProfilerActivity, profile

    from domino_sglang.spec.sampling import TOP_K_BOUND

    torch.manual_seed(2)
    vocab = 3 * TOP_K_BOUND
    n = 12
    logits = 4 * torch.randn(n, vocab)
    logits[3] = 0.01 * torch.randn(vocab)  # nearly flat: top-p keeps far more than top_k
    kw = dict(temperature=torch.tensor([0.6, 1.0, 0.7, 1.0, 1.3, 0.6] * 2),
              top_k=torch.tensor([20, 1, 5, TOP_K_BOUND, 20, 40] * 2),
              top_p=torch.tensor([0.95, 1.0, 0.5, 0.999, 0.8, 1.0] * 2),
              min_p=torch.tensor([0.0, 0.0, 0.0, 0.0, 0.05, 0.02] * 2),
              seed=torch.zeros(n, dtype=torch.int64))
    whole = process_logits(logits, SamplingRows(**kw))
    bounded_rows = SamplingRows(**kw, top_k_bounded=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        bounded = process_logits(logits, bounded_rows)
    ops = {e.key for e in prof.key_averages()}
    assert "aten::sort" not in ops and "aten::topk" in ops, sorted(ops)
    torch.testing.assert_close(bounded, whole, rtol=0, atol=1e-7)
    assert int((bounded[3] > 0).sum()) == TOP_K_BOUND  # the flat row: top-k decided it
    assert (bounded[1] > 0).sum() == 1  # the greedy row
    # ranking only the batch's largest top_k (the planner's width on the host) keeps the same
    narrow = {k: v[[0, 1, 2, 4, 5]] for k, v in kw.items()}  # rows with top_k <= 40
    rows = [0, 1, 2, 4, 5]
    for width in (40, 41, TOP_K_BOUND):
        got = process_logits(logits[rows], SamplingRows(**narrow, top_k_bounded=True,
                                                        top_k_width=width))
        torch.testing.assert_close(got, whole[rows], rtol=0, atol=1e-7)


def _pointer_copy(gate: nn.Linear, histories: list[list[int]]) -> PointerCopy:
    indexes = []
    for history in histories:
        index = HistoryIndex(B - 1)
        index.sync(history, [])
        indexes.append(index)
    return PointerCopy(gate, indexes, torch.device("cpu"))


@pytest.mark.parametrize("pool,pointer,vocab", [(0, False, None), (3, False, None),
                                                (3, True, None), (0, True, None),
                                                (0, False, [7, 1, 3, 10, 2]),
                                                (0, True, [7, 1, 3, 10, 2])])
def test_sparse_q_is_the_dense_q_and_verifies_alike(pool, pointer, vocab):
    """Rows whose top_k bounds their support keep q as it (sampled_rollout(sparse=S), what the
    rollout graphs replay at every bucket): S = 4 entries of an 11-token vocabulary (top-k 3,
    a pool of 3, a pointer drafter's copy candidate), the same drafts, q densified equal to the
    dense q bit for bit, and verification over it the same tokens and accepted lengths, with a
    greedy row in the batch and every accepted length met."""
    from domino_sglang.spec.sampling import SparseQ

    n, vocab_size = 256, 11
    head = make_head(5, vocab=vocab_size)
    if vocab is not None:
        head = head.with_vocab(torch.tensor(vocab))
    rows = make_rows(n, temperature=0.9, top_k=3, top_p=0.95)
    rows.top_k[0] = 1  # a greedy row among sampled ones
    g = torch.Generator().manual_seed(pool + 2 * pointer)
    z = torch.randn(n, B, H, generator=g)
    histories = [torch.randint(0, 4, (12,), generator=g).tolist() for _ in range(n)]
    bonus = torch.tensor([h[-1] for h in histories])
    u = RoundUniforms.for_round(rows.seed, torch.randint(5, 50, (n,), generator=g), B)
    torch.manual_seed(3)
    gate = nn.Linear(H + 13, 1) if pointer else None

    def rollout(**kw):
        copy = _pointer_copy(gate, histories) if pointer else None
        return sampled_rollout(z, bonus, head, rows, u.draft, candidate_pool=pool, copy=copy,
                               **kw)

    dense_d, dense_q = rollout()
    sparse_d, sparse_q = rollout(sparse=4)
    assert torch.equal(sparse_d, dense_d)
    assert isinstance(sparse_q, SparseQ) and sparse_q.ids.shape == (n, B - 1, 4)
    assert torch.equal(sparse_q.dense(), dense_q)
    assert int((dense_q > 0).sum(-1).max()) > 1  # rows with real support: truncation matters
    chain = torch.cat((bonus[:, None], dense_d), dim=1)
    # a target close to the drafter (every accepted length occurs), rejecting some of its drafts
    logits = torch.cat((dense_q.clamp(min=1e-3).log(), torch.zeros(n, 1, vocab_size)), 1)
    logits = logits + 0.7 * torch.randn(n, B, vocab_size, generator=g)
    tokens, accepted = verify_mixed(chain, logits, dense_q, rows, u)
    s_tokens, s_accepted = verify_mixed(chain, logits, sparse_q, rows, u)
    assert torch.equal(s_accepted, accepted) and torch.equal(s_tokens, tokens)
    assert set(accepted.tolist()) == set(range(1, B + 1))


def test_offers_verify_alike_as_one_token_supports():
    """An offer's one-hot q kept as a one-token support (one_hot_proposal without a drafter's
    q: every row offered) and offered rows replaced inside a sparse q verify as their dense
    one-hot: the same tokens and accepted lengths."""
    from domino_sglang.spec.sampling import SparseQ

    n, vocab_size = 512, 11
    g = torch.Generator().manual_seed(9)
    rows = make_rows(n, temperature=1.1, top_k=4)
    drafts = torch.randint(0, vocab_size, (n, B - 1), generator=g)
    chain = torch.cat((torch.randint(0, vocab_size, (n, 1), generator=g), drafts), dim=1)
    logits = torch.randn(n, B, vocab_size, generator=g)
    logits[:, :-1].scatter_(2, drafts[..., None], 3.0)  # the offers are likely: runs accepted
    u = RoundUniforms.for_round(rows.seed, torch.randint(5, 50, (n,), generator=g), B)
    every = torch.ones(n, dtype=torch.bool)
    sparse = one_hot_proposal(drafts, every, None, vocab_size)
    dense = one_hot_proposal(drafts, every, torch.zeros(n, B - 1, vocab_size), vocab_size)
    assert isinstance(sparse, SparseQ) and torch.equal(sparse.dense(), dense)
    want = verify_mixed(chain, logits, dense, rows, u)
    got = verify_mixed(chain, logits, sparse, rows, u)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert len(set(want[1].tolist())) == B
    # some rows offered inside a drafter's sparse q: those rows one-hot, the others kept
    q = torch.softmax(torch.randn(n, B - 1, vocab_size, generator=g), -1)
    probs, ids = q.topk(vocab_size, dim=-1)
    drafter = SparseQ(ids, probs, vocab_size)
    offered = torch.rand(n, generator=g) < 0.5
    mixed = one_hot_proposal(drafts, offered, drafter, vocab_size)
    assert isinstance(mixed, SparseQ)
    assert torch.equal(mixed.dense(), one_hot_proposal(drafts, offered, drafter.dense(),
                                                       vocab_size))
    want = verify_mixed(chain, logits, one_hot_proposal(drafts, offered, drafter.dense(),
                                                         vocab_size), rows, u)
    got = verify_mixed(chain, logits, mixed, rows, u)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_greedy_drafts_verified_one_hot_keep_sampling_exact():
    """Greedy drafts verified as one-hot proposals (how SGLang's DFLASH serves T > 0, and
    DOMINO under --speculative-domino-debug-sampled-drafts off): the committed tokens follow
    the target's distribution, as with sampled drafts."""
    target, head = TinyTarget(), make_head(0)
    rows = make_rows(N, **CASES["top_k_top_p_min_p"])
    samples = run_domino(target, head, rows, verify_mixed, one_hot=True)
    stat, crit, forbidden = chi_square(samples, target.joint3(rows))
    assert forbidden == 0 and stat < crit
