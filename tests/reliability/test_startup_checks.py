"""Start-up refusals, no server needed: the KV pool against DOMINO's reservations, the output
clip that keeps the last request of a full pool alive, and malformed drafters through
`domino-sglang serve` end to end (one line on stderr, exit 2, before SGLang starts).

Covered elsewhere, not repeated: every malformed config field and weight file at the loader
(tests/model/test_drafter_loading.py), and a drafter that proposes garbage never changes the output
(tests/server/test_domino_server.py::test_lossless_greedy with a random drafter; the shared server
of this suite proposes garbage on every non-repetitive prompt).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from domino_sglang.integration.algorithm import (
    DominoArgsError,
    check_pool_fits,
    clip_max_new_tokens,
    max_output_tokens,
    resolve_server_args,
)
from tests.harness.drafters import make_random_drafter


@pytest.fixture(scope="module")
def drafter(target_path, tmp_path_factory):
    return make_random_drafter(target_path, tmp_path_factory.mktemp("d") / "rand16", 16)


def server_args(drafter, **kw):
    base = dict(speculative_draft_model_path=str(drafter), pp_size=1, speculative_eagle_topk=None,
                speculative_num_draft_tokens=None, speculative_num_steps=None,
                max_running_requests=None, device="cpu", attention_backend="domino_cpu",
                speculative_draft_attention_backend=None, disable_overlap_schedule=False,
                max_total_tokens=None)
    base.update(kw)
    return SimpleNamespace(**base)


def test_pool_too_small_for_the_running_requests_is_refused(drafter):
    # block 16: 2 x 16 + 1 = 33 slots per running request; 8 x 33 = 264 > 256
    a = server_args(drafter, max_total_tokens=256, max_running_requests=8)
    with pytest.raises(DominoArgsError) as exc:
        resolve_server_args(a)
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg == ("DOMINO: --max-total-tokens 256 cannot hold the verify reservations of "
                   "--max-running-requests 8 (33 KV slots each: 2 x block size 16 + 1 token); "
                   "raise --max-total-tokens to >= 264 or lower --max-running-requests to 7")
    resolve_server_args(server_args(drafter, max_total_tokens=264, max_running_requests=8))
    with pytest.raises(DominoArgsError, match="lower --speculative-num-draft-tokens"):
        check_pool_fits(20, 1, 16)
    check_pool_fits(None, 48, 16)  # pool sized from memory: SGLang's own checks apply


def test_default_running_requests_shrink_to_the_pool(drafter, caplog):
    a = server_args(drafter, max_total_tokens=256)
    with caplog.at_level("INFO", logger="domino_sglang.integration.algorithm"):
        resolve_server_args(a)
    assert a.max_running_requests == 256 // 33 == 7
    assert "max_running_requests=7 (was 48)" in caplog.text  # a changed default is logged
    b = server_args(drafter, max_total_tokens=65536)
    resolve_server_args(b)
    assert b.max_running_requests == 48


def test_output_is_clipped_to_leave_room_for_the_reservations(monkeypatch):
    from domino_sglang import sglang_compat  # where the hook reads SGLang's published spec

    # SGLang alone would allow 256 - 1 - 1 - 100 = 154 output tokens; DOMINO reserves 2 x 4 more
    assert max_output_tokens(100, 4, pool_tokens=256, page_size=1, row_tokens=8200) == 146
    assert max_output_tokens(8000, 16, 65536, 1, row_tokens=8192 + 4 + 16) == 180  # the row
    assert max_output_tokens(250, 4, 256, 1, 8200) == 0

    scheduler = SimpleNamespace(max_total_num_tokens=256, page_size=1,
                                req_to_token_pool=SimpleNamespace(max_context_len=8200))

    def req(n_input, max_new, min_new=0):
        return SimpleNamespace(origin_input_ids=[0] * n_input, sampling_params=SimpleNamespace(
            max_new_tokens=max_new, min_new_tokens=min_new))

    spec = SimpleNamespace(speculative_algorithm="DOMINO", speculative_num_draft_tokens=4)
    monkeypatch.setattr(sglang_compat, "get_spec", lambda: spec)
    long, short = req(100, 500, min_new=400), req(100, 20)
    clip_max_new_tokens(None, scheduler, long)
    clip_max_new_tokens(None, scheduler, short)
    assert (long.sampling_params.max_new_tokens, long.sampling_params.min_new_tokens) == (146, 146)
    assert short.sampling_params.max_new_tokens == 20  # fits: untouched
    spec.speculative_algorithm = "EAGLE"
    other = req(100, 500)
    clip_max_new_tokens(None, scheduler, other)
    assert other.sampling_params.max_new_tokens == 500  # not ours


def _serve_dry_run(drafter, target_path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "domino_sglang.cli", "serve", "--dry-run", "--port", "0",
         "--model-path", str(target_path), "--drafter", str(drafter)],
        capture_output=True, text=True, timeout=300, env={**os.environ},
        stdin=subprocess.DEVNULL)


def _copy(src, dst, config=None, weights=None):
    dst.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, **(config or {})}))
    w = load_file(str(src / "model.safetensors"))
    if weights is not None:
        w = weights(w)
        if w is None:
            return dst
    save_file(w, str(dst / "model.safetensors"))
    return dst


def _nan(w):
    w["fc.weight"] = torch.full_like(w["fc.weight"], float("nan"))
    return w


def _pickle_instead(w):
    return None


@pytest.mark.parametrize("name,config,weights,message", [
    ("nan", None, _nan, "weight 'fc.weight' has NaN/inf values"),
    ("vocab", {"vocab_size": 32000}, None,
     "field 'vocab_size' is 32000 but the target's is 49152"),
    ("pickle", None, _pickle_instead, "pickle weights are refused"),
])
def test_serve_refuses_a_malformed_drafter_in_one_line(drafter, target_path, tmp_path, name,
                                                       config, weights, message):
    bad = _copy(drafter, tmp_path / name, config, weights)
    if name == "pickle":
        torch.save({"fc.weight": torch.zeros(1)}, bad / "pytorch_model.bin")
    proc = _serve_dry_run(bad, target_path)
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert "\n" not in err and err.startswith("domino-sglang: error: serve: "), err
    assert message in err
    assert "launch_server" not in proc.stdout  # refused before the SGLang command


def test_serve_accepts_a_good_drafter(drafter, target_path):
    proc = _serve_dry_run(drafter, target_path)
    assert proc.returncode == 0, proc.stderr
    assert "--speculative-algorithm DOMINO" in proc.stdout


def test_serve_accepts_remote_code_metadata(drafter, target_path, tmp_path):
    """`auto_map` (every released Domino / DFlash drafter has one) is metadata: nothing is ever
    imported from a checkpoint, so it is accepted, as SGLang's own loader accepts it (issue 63)."""
    meta = _copy(drafter, tmp_path / "remote", {"auto_map": {"AutoModel": "evil.Model"}})
    proc = _serve_dry_run(meta, target_path)
    assert proc.returncode == 0, proc.stderr
