"""The decode round's host-sync budget (issue 64, item 2), counted on the real worker in a CPU
server: --speculative-domino-debug-sync-log makes the worker run every decode round under
syncs.SyncCounter and log the host-device synchronisations and copies that its own code
(domino_sglang, the CPU attention backend excluded: SGLang's GPU backends replace it) would make on
a GPU, by round kind.

Budget per round: greedy drafted <= 2, sampled <= 2, plain <= 1, rounds with prompt-lookup or
pointer copies <= 3, whatever the block length L and the number of requests. The shipped drafter
is a pointer (copy-gate) drafter, so every drafted round here has pointer copies; the copy index
is on the device (--speculative-domino-debug-copy-index device, the CUDA default). Requests
carry no sampling_seed and no penalties (each would add one host-to-device copy of its per-request
flags)."""

from __future__ import annotations

import collections
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.harness.servers import start_server

BUDGET = {"plain": 1, "greedy": 2, "sampled": 2, "copies": 3}


def _generate(url: str, ids: list[int], temperature: float) -> list[int]:
    r = requests.post(f"{url}/generate", json={
        "input_ids": ids, "sampling_params": {"temperature": temperature,
                                              "max_new_tokens": 40}}, timeout=900)
    r.raise_for_status()
    return r.json()["output_ids"]


def _category(row: dict) -> str:
    kind = row["kind"].split("+")[0]
    if kind == "plain":
        return "plain"
    if kind in ("copy", "mixed"):  # prompt-lookup copies
        return "copies"
    return "sampled" if row["sampled"] else "greedy"


def test_the_counter_counts_what_would_synchronise_on_a_gpu():
    """syncs.SyncCounter on the CPU: device reads, data-shaped ops and transfers count; the same
    on tensors that live on the host (made without a device, or declared) do not."""
    import torch

    from domino_sglang.spec.syncs import SyncCounter

    dev = torch.arange(10)  # made outside: a device tensor
    declared = torch.arange(4)
    with SyncCounter() as c:
        c.host(declared)
        dev.sum().item()
        bool((dev > 3).any())
        dev.tolist()
        dev[dev > 4]
        torch.tensor([1, 2], device="cpu")  # h2d
        host = torch.tensor([1, 2, 3])
        int(((host + 1)[host > 1]).sum())  # all on the host: free
        host.to("cpu")  # h2d
        int(declared.sum()) + int(torch.where(declared > 1, declared, 0).max())  # free
    assert c.by_kind("other") == {"h2d": 2, "item": 2, "nonzero": 1, "tolist": 1}


@pytest.mark.server
def test_decode_rounds_keep_the_host_sync_budget(tmp_path, ar_server_fp32, chat_ids):
    """... and the device copy index drafts losslessly: greedy outputs equal plain decoding."""
    log = tmp_path / "syncs.jsonl"
    flags = ["--speculative-domino-debug-sync-log", str(log),
             "--speculative-domino-debug-copy-index", "device",
             "--speculative-domino-adaptive", "off",
             "--speculative-domino-debug-draft-len", "16,5,1,3"]  # several L, plain rounds too
    with start_server("sync-budget", ["--dtype", "float32", "--max-total-tokens", "16384"],
                      flags) as server:
        greedy = [_generate(server.url, chat_ids[0], 0.0)]
        _generate(server.url, chat_ids[1], 0.8)
        with ThreadPoolExecutor(4) as pool:  # batched rounds, greedy and sampled rows
            greedy += list(pool.map(lambda a: _generate(server.url, *a),
                                    [(chat_ids[1], 0.0), (chat_ids[2], 0.0), (chat_ids[3], 0.0),
                                     (chat_ids[4], 0.7)]))[:3]
    with ThreadPoolExecutor(4) as pool:
        plain = list(pool.map(lambda ids: _generate(ar_server_fp32.url, ids, 0.0), chat_ids[:4]))
    assert greedy == plain
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    table = collections.defaultdict(list)
    for row in rows:
        table[(_category(row), row["pointer"], row["bs"], row["L"])].append(row["domino"])
    print("\nhost syncs per decode round (domino code): category, pointer, bs, L -> max "
          "(rounds)")
    for key, counts in sorted(table.items()):
        print(f"  {key}: {max(counts)} ({len(counts)} rounds)")
    sites = collections.Counter()
    for row in rows:
        sites.update(row["sites"])
    print("  by site:", dict(sites))
    print("  SGLang's own (not budgeted), max per round:", max(r["sglang"] for r in rows))
    seen = {c for c, *_ in table}
    assert seen >= {"plain", "greedy", "sampled"}, seen  # every budgeted kind was counted
    assert any(pointer for _, pointer, *_ in table)  # pointer rounds among them
    assert len({bs for _, _, bs, _ in table}) > 1 and len({L for *_, L in table}) > 2
    assert max(r["domino"] for r in rows) > 0  # the counter counts (the round's read-back)
    over = {k: max(v) for k, v in table.items() if max(v) > BUDGET[k[0]]
            and not (k[1] and max(v) <= BUDGET["copies"])}  # pointer rounds: <= 3
    assert not over, (over, dict(sites))
