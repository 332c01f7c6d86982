"""DominoConfig (options.py): precedence, the one boolean rule, errors naming the flag, the logged
line, the flags on SGLang's parser and their way to the scheduler process."""

from __future__ import annotations

import argparse
import logging
import os
import pickle
import subprocess
import sys
from types import SimpleNamespace

import pytest

from domino_sglang.spec import options
from domino_sglang.spec.options import DominoConfig, DominoOptionError, parse_bool, resolve
from domino_sglang.spec.policy import SpeculationPolicy, cost_model

B = 16
DRAFTER = SimpleNamespace(candidate_pool=0, short_draft=False, draft_temperature_scale=0.7)


def test_defaults_come_from_the_drafter():
    config = resolve(DRAFTER, B)
    assert config == DominoConfig(block_size=B, candidate_pool=0, draft_temperature_scale=0.7,
                                  short_draft=False)
    assert config.adaptive and config.lookup and config.head and config.copy
    assert config.draft_len is None and config.cost is None and config.sync_log is None
    trained_short = SimpleNamespace(candidate_pool=256, short_draft=True,
                                    draft_temperature_scale=1.0)
    assert resolve(trained_short, B).short_draft and resolve(trained_short, B).candidate_pool == 256


def test_precedence_drafter_then_sglang_flags_then_domino_flags():
    # SGLang's candidate-pool flag counts when other than its default (2048)
    assert resolve(DRAFTER, B, pool_flag=2048).candidate_pool == 0
    assert resolve(DRAFTER, B, pool_flag=256).candidate_pool == 256
    # a --speculative-domino-* flag beats the drafter's config
    config = resolve(DRAFTER, B, {"short_draft": "on", "draft_temperature_scale": "0.5",
                                  "adaptive": "off", "draft_len": "16,1"})
    assert config.short_draft and config.draft_temperature_scale == 0.5
    assert not config.adaptive and config.draft_len == (16, 1)
    # --speculative-adaptive (SGLang's, store_true) agrees with DOMINO's default: still adaptive
    assert resolve(DRAFTER, B, {"speculative_adaptive": True}).adaptive
    assert resolve(DRAFTER, B, token_map="/x/vocab.json").token_map == "/x/vocab.json"


@pytest.mark.parametrize("text,value", [("on", True), ("OFF", False), ("true", True),
                                        ("False", False), ("1", True), ("0", False)])
def test_one_boolean_rule(text, value):
    assert parse_bool(text, "--speculative-domino-lookup") is value
    assert resolve(DRAFTER, B, {"lookup": text}).lookup is value


@pytest.mark.parametrize("field,raw,message", [
    ("adaptive", "yes", "--speculative-domino-adaptive must be on/off (or true/false, 1/0), "
                        "got 'yes'"),
    ("draft_temperature_scale", "0", "--speculative-domino-draft-temperature-scale must be a "
                                     "finite number > 0, got '0'"),
    ("draft_temperature_scale", "nan", "must be a finite number > 0, got 'nan'"),
    ("draft_len", "17", "--speculative-domino-debug-draft-len must be integers in 1..16 (the "
                        "block size), got 17"),
    ("draft_len", "4,x", "--speculative-domino-debug-draft-len must be an integer L >= 1"),
    ("cost", "0.5,0.1", "--speculative-domino-debug-cost must be three non-negative numbers"),
    ("copy_index", "gpu", "--speculative-domino-debug-copy-index must be 'device' or 'host', "
                          "got 'gpu'"),
])
def test_a_bad_value_names_the_flag(field, raw, message):
    with pytest.raises(DominoOptionError) as err:
        resolve(DRAFTER, B, {field: raw})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_other_refusals_name_the_flag():
    with pytest.raises(DominoOptionError, match="--speculative-domino-candidate-pool-size must "
                                                "be an integer >= 0"):
        resolve(DRAFTER, B, pool_flag=-1)
    with pytest.raises(DominoOptionError, match="--speculative-adaptive-config a.json: DOMINO's "
                                                "adaptive policy takes no config file"):
        resolve(DRAFTER, B, {"speculative_adaptive_config": "a.json"})
    with pytest.raises(DominoOptionError, match="unknown DOMINO option"):
        resolve(DRAFTER, B, {"adaptve": "off"})


def test_the_parser_refuses_a_bad_value_naming_the_flag(capsys):
    parser = argparse.ArgumentParser()
    options.add_flags(parser)
    options.add_flags(parser)  # idempotent
    ns = parser.parse_args(["--speculative-domino-adaptive", "off",
                            "--speculative-domino-debug-cost", "0.5,0.1,0.01"])
    assert options.flags_from_namespace(ns) == {"adaptive": False, "cost": (0.5, 0.1, 0.01)}
    with pytest.raises(SystemExit):
        parser.parse_args(["--speculative-domino-lookup", "maybe"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith("argument --speculative-domino-lookup: must be on/off (or true/false, "
                        "1/0), got 'maybe'")


def test_the_config_is_one_log_line():
    line = resolve(DRAFTER, B, {"adaptive": "off", "draft_len": "16,1"}).line()
    assert "\n" not in line and line.startswith("DOMINO config: block_size=16 candidate_pool=0")
    assert "adaptive=off" in line and "draft_len=16,1" in line and "cost=default" in line


def test_the_launcher_logs_the_config_once(caplog, tmp_path):
    """algorithm.resolve_server_args (the launcher's resolution) builds the config, refuses a bad
    one naming the flag, and logs it as one line."""
    from domino_sglang.integration import algorithm
    from tests.model.test_drafter_loading import UPSTREAM_LIKE, write

    path = write(tmp_path / "d", UPSTREAM_LIKE)
    args = SimpleNamespace(
        speculative_draft_model_path=str(path), pp_size=1, tp_size=1, enable_mixed_chunk=False,
        enable_watermark=False, enable_deterministic_inference=False,
        speculative_eagle_topk=None, speculative_domino_candidate_pool_size=2048,
        speculative_num_draft_tokens=None, tokenizer_path=None, model_path=None,
        max_running_requests=None, max_total_tokens=None, disable_overlap_schedule=True,
        device="cpu", speculative_draft_attention_backend=None, attention_backend=None,
        speculative_token_map=None, _domino_flags={"lookup": False})
    with caplog.at_level(logging.INFO, logger="domino_sglang.integration.algorithm"):
        algorithm.resolve_server_args(args)
    lines = [r.getMessage() for r in caplog.records if "DOMINO config:" in r.getMessage()]
    assert len(lines) == 1 and "adaptive=on lookup=off" in lines[0]
    args._domino_flags = {"draft_len": (99,)}
    with pytest.raises(algorithm.DominoArgsError, match="--speculative-domino-debug-draft-len "
                                                        "must be integers in 1.."):
        algorithm.resolve_server_args(args)
    args._domino_flags, args.speculative_token_map = {}, str(tmp_path / "missing.json")
    with pytest.raises(algorithm.DominoArgsError, match="missing.json: not a regular file"):
        algorithm.resolve_server_args(args)  # --speculative-token-map is read at start-up


def test_policy_and_cost_follow_the_config():
    config = resolve(DRAFTER, B, {"adaptive": "off", "calibrate": "off", "draft_len": "3",
                                  "cost": "0.5,0.1,0.01"})
    policy = SpeculationPolicy.from_config(config)
    assert not policy.enabled and policy.calibration is None and policy.draft_len(32) == 3
    name, cost = cost_model("cpu", "torch.float32", override=config.cost)
    assert name == "debug-cost" and (cost.draft, cost.slope_0, cost.slope_per_req) == (
        0.5, 0.1, 0.01)
    assert SpeculationPolicy.from_config(resolve(DRAFTER, B)).calibration is not None


def test_flags_reach_the_scheduler_on_the_pickled_server_args(monkeypatch):
    """The from_cli_args hook keeps the flags on the ServerArgs record, which SGLang pickles to
    its scheduler processes (`ServerArgs.__reduce__` carries bookkeeping attributes)."""
    monkeypatch.setattr(options, "_launcher_flags", None)  # this parse's, undone afterwards
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", "m", "--speculative-domino-adaptive", "off",
                            "--speculative-domino-debug-draft-len", "16,1",
                            "--speculative-domino-candidate-pool-size", "64"])
    server_args = pickle.loads(pickle.dumps(ServerArgs.from_cli_args(ns)))
    assert options.given_flags(server_args) == {"adaptive": False, "draft_len": (16, 1)}
    config = options.for_server(server_args, DRAFTER, B)
    assert not config.adaptive and config.draft_len == (16, 1) and config.candidate_pool == 64


def test_launch_server_help_lists_the_flags():
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--help"],
                          capture_output=True, text=True, env=env, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for flag in [*(f.name for f in options.FLAGS), "--domino-request-guards"]:
        assert flag in proc.stdout, flag


def test_serve_pre_parses_the_plugin_flags_among_sglangs():
    """server_flags.check_flags: what `domino-sglang serve` checks before launching SGLang."""
    from domino_sglang.integration.server_flags import check_flags

    argv = ["--max-total-tokens", "4096", "--speculative-domino-adaptive", "off",
            "--speculative-domino-debug-draft-len=4,1", "--domino-allowed-hosts", "a,b",
            "--mem-fraction-static", "-0.5", "--speculative-num-draft-tokens", "8"]
    assert check_flags(argv) == {"adaptive": False, "draft_len": (4, 1)}
    assert check_flags([]) == {}
    # exact names only: an abbreviation is SGLang's to resolve (and refuse)
    assert check_flags(["--speculative-domino-adapt", "maybe"]) == {}
    with pytest.raises(DominoOptionError, match=r"^--speculative-domino-debug-cost must be three"):
        check_flags(["--speculative-domino-debug-cost", "1,2"])
    with pytest.raises(DominoOptionError, match=r"^--domino-request-guards must be on/off"):
        check_flags(["--domino-request-guards", "sometimes"])
