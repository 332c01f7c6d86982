"""The copy-gate study's exact replay and copy candidate (benchmarks/copy_gate.py)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import copy_gate  # noqa: E402


def test_copy_candidate_follows_the_longest_most_recent_match():
    # suffix (7, 8): its 2-token match at s = 1 beats the 1-token matches of 8 at s = 4, 6
    assert copy_gate.copy_candidate([7, 8, 9, 5, 8, 4, 8, 3, 7, 8]) == (9, 2)
    # only 1-token matches: the most recent one (8 at s = 4, followed by 6)
    assert copy_gate.copy_candidate([8, 5, 1, 2, 8, 6, 3, 8]) == (6, 1)
    assert copy_gate.copy_candidate([1, 2, 3]) == (-1, 0)  # the last token never occurred
    # the lookup the server runs finds the same continuation on a recurring suffix
    from domino_sglang.lookup import lookup_draft
    h = [7, 8, 9, 5, 8, 4, 8, 3, 7, 8]
    assert int(lookup_draft(torch.tensor(h), 1)[0]) == copy_gate.copy_candidate(h)[0]


def test_replay_commits_one_plus_the_leading_right_positions():
    # 8 anchors, 3 positions; the target's token at anchor a, position i is 10 * a + i
    labels = torch.tensor([[10 * a + i for i in range(3)] for a in range(8)])
    pick = labels.clone()
    pick[0, 1] = -5  # anchor 0: the drafter is right at position 0 only
    pick[2] = -5  # anchor 2: wrong at once ...
    copy = torch.full_like(labels, -1)
    copy[2] = labels[2]  # ... where a copy is right at every position
    tab = {"labels": labels, "pick": pick, "copy": copy}
    none = torch.zeros_like(labels, dtype=torch.bool)
    # drafter alone: anchors 0 (+2), 2 (+1), 3 (+4), 7 (+1): 4 rounds for 8 tokens
    assert copy_gate.replay(tab, none) == (8, 4)
    # copying where a copy exists: anchors 0 (+2), 2 (+4), 6 (+2 to the end)
    assert copy_gate.replay(tab, torch.ones_like(none)) == (8, 3)
    use = none.clone()
    use[0] = True  # a copy chosen where there is none keeps the drafter's pick
    assert copy_gate.replay(tab, use) == (8, 4)
    copy[2, 1] = -7  # a wrong copy at position 1 stops the round there: 0, 2 (+2), 4 (+4)
    assert copy_gate.replay(tab, torch.ones_like(none)) == (8, 3)
    copy[2, 0] = -7  # wrong at once: as the drafter alone
    assert copy_gate.replay(tab, torch.ones_like(none)) == (8, 4)
