"""A simulated drafter served by the adaptive policy: what benchmarks/policy_sim.py and the policy
tests replay instead of a server (acceptance drawn position by position, rounds priced by a cost
model)."""

from __future__ import annotations

import random
from collections.abc import Callable

from domino_sglang.spec.policy import CostModel, SpeculationPolicy


def serve(policy: SpeculationPolicy, truth: Callable[[int], float], bs: int, rounds: int,
          cost: CostModel, rng: random.Random) -> tuple[float, float]:
    """`rounds` rounds of bs requests whose draft at position i is kept with probability
    truth(i) given the ones before it were; (committed tokens per request, plain steps' time)."""
    tokens = seconds = 0.0
    for _ in range(rounds):
        draft_len = policy.draft_len(bs)
        accept_lens = []
        for _ in range(bs):
            a = 0
            while a < draft_len - 1 and rng.random() < truth(a + 1):
                a += 1
            accept_lens.append(a + 1)
        policy.observe(accept_lens, draft_len)
        tokens += sum(accept_lens) / bs
        seconds += cost(bs, draft_len)
    return tokens, seconds
