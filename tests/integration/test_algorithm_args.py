"""DOMINO server-argument resolution (no server): defaults, flags, refusals, the GPU path."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from domino_sglang import cli
from domino_sglang.cli import serve
from domino_sglang.integration.algorithm import DominoArgsError, resolve_server_args
from domino_sglang.spec.options import resolve
from tests.harness.drafters import make_random_drafter


@pytest.fixture(scope="module")
def drafter(target_path, tmp_path_factory):
    return make_random_drafter(target_path, tmp_path_factory.mktemp("d") / "rand16", 16)


def args(drafter, **kw):
    base = dict(speculative_draft_model_path=str(drafter), pp_size=1, speculative_eagle_topk=None,
                speculative_num_draft_tokens=None, speculative_num_steps=None,
                max_running_requests=None, device="cpu", attention_backend="domino_cpu",
                speculative_draft_attention_backend=None, disable_overlap_schedule=False,
                cuda_graph_max_bs=None)
    base.update(kw)
    return SimpleNamespace(**base)


def test_cpu_defaults(drafter, caplog):
    a = args(drafter)
    with caplog.at_level("INFO", logger="domino_sglang.integration.algorithm"):
        resolve_server_args(a)
    assert (a.speculative_num_steps, a.speculative_eagle_topk) == (1, 1)
    assert a.speculative_num_draft_tokens == 16  # from the draft config
    assert a.max_running_requests == 48
    assert a.speculative_draft_attention_backend == "domino_cpu"
    assert a.disable_overlap_schedule is True
    logged = caplog.text
    for field in ("speculative_num_draft_tokens=16", "max_running_requests=48",
                  "speculative_draft_attention_backend='domino_cpu'"):
        assert field in logged  # every default we change is logged


def test_flag_block_size_wins_and_user_values_stay(drafter):
    a = args(drafter, speculative_num_draft_tokens=4, max_running_requests=8)
    resolve_server_args(a)
    assert a.speculative_num_draft_tokens == 4 and a.max_running_requests == 8


def test_gpu_path_uses_flashinfer_and_keeps_cuda_graphs(drafter, monkeypatch, target_path):
    a = args(drafter, device="cuda", attention_backend="flashinfer")
    resolve_server_args(a)
    assert a.speculative_draft_attention_backend == "flashinfer"
    assert a.cuda_graph_max_bs is None  # nothing here turns CUDA graphs off
    monkeypatch.setattr(serve, "_cuda_available", lambda: True)
    ns = cli.make_parser().parse_args(["serve", "--model-path", str(target_path)])
    cmd, env = serve.build_serve_command(ns, [])
    assert cmd[cmd.index("--attention-backend") + 1] == "flashinfer"
    assert "SGLANG_USE_CPU_ENGINE" not in env and "--disable-cuda-graph" not in cmd


@pytest.mark.parametrize("kw,message", [
    ({"speculative_num_draft_tokens": 1}, "block size must be in [2, 64], got 1"),
    ({"speculative_num_draft_tokens": 65}, "block size must be in [2, 64], got 65"),
    ({"speculative_eagle_topk": 4}, "--speculative-eagle-topk must be 1, got 4"),
    ({"pp_size": 2}, "does not support pipeline parallelism"),
    ({"speculative_draft_model_path": None}, "needs --speculative-draft-model-path"),
    ({"enable_deterministic_inference": True},
     "does not support --enable-deterministic-inference"),
    ({"tp_size": 2}, "--tp-size 2 does not divide the drafter's num_heads (9)"),
    ({"enable_watermark": True}, "drop --enable-watermark"),
    ({"enable_dp_attention": True}, "does not support --enable-dp-attention"),
    ({"enable_mixed_chunk": True}, "drop --enable-mixed-chunk"),
])
def test_invalid_combinations(drafter, kw, message):
    with pytest.raises(DominoArgsError) as exc:
        resolve_server_args(args(drafter, **kw))
    assert message in str(exc.value)


def test_tensor_parallel_splits_the_drafter_as_the_target(drafter):
    # the SmolLM2 drafter's 9 heads, 3 KV heads and 1536 MLP rows split over 3 ranks
    a = args(drafter, tp_size=3)
    resolve_server_args(a)
    assert a.tp_size == 3


@pytest.mark.parametrize("cores,ranks,expected", [
    ([0, 1], 2, "0|1"), ([0, 1, 2, 3], 2, "0-1|2-3"), ([0, 1, 2], 2, "0|1"),
    ([0], 3, "0|0|0"), ([0, 2, 4, 6], 2, "0,2|4,6")])
def test_serve_splits_the_cores_over_cpu_ranks(cores, ranks, expected):
    assert serve.cpu_binding(ranks, cores) == expected


def test_serve_passes_tp_size_and_shares_the_threads(monkeypatch, target_path):
    monkeypatch.setattr(serve, "_cuda_available", lambda: False)
    ns = cli.make_parser().parse_args(["serve", "--model-path", str(target_path),
                                       "--tp-size", "2", "--threads", "4"])
    cmd, env = serve.build_serve_command(ns, [])
    assert cmd[cmd.index("--tp-size") + 1] == "2"
    assert env["OMP_NUM_THREADS"] == "2" and env["SGLANG_CPU_OMP_THREADS_BIND"].count("|") == 1
    with pytest.raises(SystemExit):  # given twice: refused, not silently doubled
        serve.build_serve_command(ns, ["--tp-size", "2"])
    ns.cpu_binding = "1|0"  # the user's binding, as given
    assert serve.build_serve_command(ns, [])[1]["SGLANG_CPU_OMP_THREADS_BIND"] == "1|0"


def test_serve_backs_a_cpu_server_with_huge_pages_unless_told(monkeypatch, target_path):
    """glibc.malloc.hugetlb=1 joins the user's GLIBC_TUNABLES (theirs kept, their own hugetlb
    setting wins); --cpu-hugepages off leaves the environment alone; a GPU server is untouched."""
    monkeypatch.setattr(serve, "_cuda_available", lambda: False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    argv = ["serve", "--model-path", str(target_path)]
    env = serve.build_serve_command(cli.make_parser().parse_args(argv), [])[1]
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    env = serve.build_serve_command(cli.make_parser().parse_args(argv), [])[1]
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0")
    env = serve.build_serve_command(cli.make_parser().parse_args(argv), [])[1]
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=0"
    off = cli.make_parser().parse_args([*argv, "--cpu-hugepages", "off"])
    assert "GLIBC_TUNABLES" not in serve.build_serve_command(off, [])[1]
    gpu = cli.make_parser().parse_args([*argv, "--device", "cuda"])
    assert "GLIBC_TUNABLES" not in serve.build_serve_command(gpu, [])[1]


def test_not_a_domino_drafter(target_path):
    with pytest.raises(DominoArgsError, match="field 'architectures'"):
        resolve_server_args(args(target_path))  # the target itself is no drafter


@pytest.mark.parametrize("native,expected", [(True, "bfloat16"), (False, "float32")])
def test_cpu_default_dtype_follows_native_bf16(native, expected, monkeypatch, target_path):
    """Without native bf16 matmuls (AVX2-only CPUs) the CPU server defaults to float32; an explicit
    --dtype always wins."""
    from domino_sglang.cpu import dtype as cpu_dtype

    monkeypatch.setattr(serve, "_cuda_available", lambda: False)
    monkeypatch.setattr(cpu_dtype, "native_bf16", lambda: native)
    ns = cli.make_parser().parse_args(["serve", "--model-path", str(target_path)])
    cmd, _ = serve.build_serve_command(ns, [])
    assert cmd[cmd.index("--dtype") + 1] == expected
    ns = cli.make_parser().parse_args(["serve", "--model-path", str(target_path),
                                       "--dtype", "bfloat16"])
    cmd, _ = serve.build_serve_command(ns, [])
    assert cmd[cmd.index("--dtype") + 1] == "bfloat16"



@pytest.mark.parametrize("flag,trained,expected", [
    (None, False, False), (None, True, True), ("on", False, True), ("0", True, False)])
def test_short_draft_follows_the_drafter_unless_forced(flag, trained, expected):
    drafter = SimpleNamespace(candidate_pool=0, short_draft=trained, draft_temperature_scale=1.0)
    flags = {} if flag is None else {"short_draft": flag}
    assert resolve(drafter, 16, flags).short_draft is expected


@pytest.mark.parametrize("flag,expected", [(None, 0.7), ("1", 1.0), ("0.5", 0.5)])
def test_draft_temperature_scale_follows_the_drafter_unless_set(flag, expected):
    drafter = SimpleNamespace(candidate_pool=0, short_draft=False, draft_temperature_scale=0.7)
    flags = {} if flag is None else {"draft_temperature_scale": flag}
    assert resolve(drafter, 16, flags).draft_temperature_scale == expected


def test_gpu_attention_backend_reads_the_rounds_width(drafter):
    """On CUDA the target verifies on a backend whose verify reads the round's width: flashinfer
    when none is named; fa3 / trtllm_mha (which build every verify for the full block B) are
    refused by name, since DOMINO verifies 1..B tokens per round."""
    a = args(drafter, device="cuda", attention_backend=None)
    resolve_server_args(a)
    assert a.attention_backend == "flashinfer" == a.speculative_draft_attention_backend
    a = args(drafter, device="cuda", attention_backend="triton")
    resolve_server_args(a)
    assert a.attention_backend == "triton" == a.speculative_draft_attention_backend
    for backend in ("fa3", "trtllm_mha"):
        with pytest.raises(DominoArgsError, match=f"--attention-backend {backend} builds every "
                                                  "verify for the full block"):
            resolve_server_args(args(drafter, device="cuda", attention_backend=backend))


# SGLang's default attention backend per platform (arg_groups/model_override_base.py), the
# platform faked through its own scoped probes (runtime_context.override_platform)
PLATFORMS = {
    "hopper": dict(is_cuda=True, is_sm90=True, is_hopper_with_cuda_12_3=True, has_flashinfer=True),
    "blackwell": dict(is_cuda=True, is_sm100=True, is_sm100_or_sm110=True, is_blackwell=True,
                      has_flashinfer=True),
}


def launcher_resolution(platform: str, argv: list[str]):
    """A real ServerArgs resolved by SGLang's own pipeline, as `python -m sglang.launch_server`
    resolves it on `platform` (the plugin registered first, as SGLang's plugin loader does)."""
    from sglang.srt.arg_groups.overrides import resolved_view
    from sglang.srt.runtime_context import override_platform
    from sglang.srt.server_args import prepare_server_args

    from domino_sglang.integration import plugin

    plugin.register()
    with override_platform(**PLATFORMS[platform]):
        server_args = prepare_server_args(["--device", "cuda", *argv])
        server_args.resolve_once()
        return resolved_view(server_args)


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_the_launcher_gives_domino_a_verify_backend_on_hopper_and_blackwell(
        platform, drafter, target_path):
    """SGLang fills its platform default (fa3 on Hopper, trtllm_mha on SM100) before the
    speculative hook runs; a DOMINO server that names no backend still ends on flashinfer, and
    starts. A plain server on the same platform keeps SGLang's default; a backend the user
    names is refused by its flag."""
    base = ["--model-path", str(target_path)]
    domino = base + ["--speculative-algorithm", "DOMINO",
                     "--speculative-draft-model-path", str(drafter)]
    view = launcher_resolution(platform, domino)
    assert (view.attention_backend, view.speculative_draft_attention_backend) == (
        "flashinfer", "flashinfer")
    default = {"hopper": "fa3", "blackwell": "trtllm_mha"}[platform]
    assert launcher_resolution(platform, base).attention_backend == default
    with pytest.raises(DominoArgsError, match=f"--attention-backend {default} builds every"):
        launcher_resolution(platform, domino + ["--attention-backend", default])
