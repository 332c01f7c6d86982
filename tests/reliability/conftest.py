"""The reliability suite's server: ONE DOMINO server shared by every test in tests/reliability/.

Configured as an operator would run it, and small enough to be under pressure:
  - float32 target, so its greedy output must equal the no-speculation server's token for token
    (`ar_server_fp32`, tests/conftest.py);
  - the constructed repeat drafter (tests/harness/drafters.py) at block size 4: on ordinary prompts
    its drafts are garbage (rejected almost always, like the random drafter of
    test_domino_server.py), on prompts whose answer repeats a word whole blocks are accepted, so
    one server exercises both rejected and accepted rounds;
  - a KV pool of POOL tokens, far below what 48 running requests need, so loads queue and retract;
  - the API key from a file (`serve --api-key-file`) and `--admin-api-key` on SGLang's command
    line: every request here carries AUTH, admin routes ADMIN_AUTH;
  - --speculative-domino-adaptive off: every round verifies a full block, even at batch sizes
    where the adaptive policy would decode plainly, so the speculative path is what gets the load;
  - --speculative-domino-debug-gpu-shape on: the round takes the decisions a GPU server takes
    (batch buckets from SGLang's capture list, the head rollout over static buffers built at
    start-up, padding rows as batches shrink and grow), so the load, fault and crash tests run
    in the GPU's control flow; the CPU's own default path is served by test_domino_server.py
    and the other server modules.
SGLang's own idle check (SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE, on by default) raises in the
scheduler if a KV slot or request slot leaks, so a leak also shows as a dead server.

`references` computes every no-speculation output the suite compares with (workload.py) in one
parallel pass. DOMINO_REL_REFERENCES=file.json caches them (written if absent), so a developer
can compute them with the AR server alone, then run the suite with only the DOMINO server up.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.harness.drafters import make_repeat_drafter
from tests.harness.servers import SharedServer
from tests.reliability.client import ADMIN_KEY, API_KEY, POOL
from tests.reliability.workload import all_jobs, comparable, run


@pytest.fixture(scope="session")
def rel_drafter(target_path, tmp_path_factory):
    return make_repeat_drafter(target_path, tmp_path_factory.mktemp("rel") / "repeat4", 4)


@pytest.fixture(scope="session")
def rel_server(rel_drafter, references, tmp_path_factory):  # references first: AR work done
    key_file = tmp_path_factory.mktemp("keys") / "api-key"  # before DOMINO starts
    key_file.write_text(API_KEY + "\n")
    server = SharedServer(
        "reliability",
        ["--dtype", "float32", "--max-total-tokens", str(POOL), "--api-key-file", str(key_file)],
        ["--speculative-algorithm", "DOMINO", "--speculative-draft-model-path", str(rel_drafter),
         "--admin-api-key", ADMIN_KEY, "--speculative-domino-adaptive", "off",
         "--speculative-domino-debug-gpu-shape", "on"])
    yield server
    server.stop()


@pytest.fixture(scope="session")
def references(request, tokenizer) -> dict[str, dict]:
    jobs = all_jobs(tokenizer)
    cache = os.environ.get("DOMINO_REL_REFERENCES")
    if cache and Path(cache).is_file():
        saved = json.loads(Path(cache).read_text())
        if sorted(saved) == sorted(jobs):
            return saved
    ar = request.getfixturevalue("ar_server_fp32")
    with ThreadPoolExecutor(16) as pool:
        results = dict(zip(jobs, pool.map(lambda j: comparable(run(ar.url, j)), jobs.values())))
    if cache:
        Path(cache).write_text(json.dumps(results))
    return results
