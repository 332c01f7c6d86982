"""`domino-sglang export-llamacpp`: the backbone in the layout llama.cpp's converter reads as a
DSpark draft model (cli/export_llamacpp.py), checked tensor by tensor on a tiny drafter."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from domino_sglang import cli
from domino_sglang.model.vocab import write_draft_vocab
from tests.harness.drafters import make_random_drafter
from tests.harness.new_target_fixtures import make_qwen3_target


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    target = make_qwen3_target(root / "target", layers=4)
    drafter = make_random_drafter(target, root / "drafter", block_size=8)
    return target, drafter


def test_the_export_is_the_backbone_with_the_draft_vocabulary_as_dspark_reads_it(tiny, tmp_path,
                                                                                capsys):
    target, drafter = tiny
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    ids = sorted({0, 1, 5, 7, vocab - 1, *range(10, 30)})
    draft = tmp_path / "drafter"
    draft.mkdir()
    for f in drafter.iterdir():
        (draft / f.name).write_bytes(f.read_bytes())
    write_draft_vocab(draft, ids, source="test", max_id=None)
    out = tmp_path / "out"
    assert cli.main(["export-llamacpp", str(draft), "--out", str(out),
                     "--target", str(target)]) == 0
    assert "--spec-type draft-dspark --spec-draft-n-max 7" in capsys.readouterr().out

    conf = json.loads((out / "config.json").read_text())
    source = json.loads((draft / "config.json").read_text())
    assert conf["architectures"] == ["DSparkDraftModel"]
    assert conf["draft_vocab_size"] == len(ids)
    dflash = conf["dflash_config"]
    assert dflash["target_layer_ids"] == source["dflash_config"]["target_layer_ids"]
    assert dflash["mask_token_id"] == source["dflash_config"]["mask_token_id"]
    assert dflash["block_size"] == 8
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "intermediate_size", "rms_norm_eps", "rope_theta", "vocab_size"):
        assert conf[key] == source[key], key

    got = load_file(str(out / "model.safetensors"))
    mine = load_file(str(draft / "model.safetensors"))
    backbone = {k for k in mine if not k.startswith(("prefix_gru.", "embed_proj.", "copy_gate."))}
    assert backbone and set(got) == backbone | {"lm_head.weight", "d2t"}
    for name in backbone:  # every backbone weight as it was, in bf16
        assert got[name].dtype == torch.bfloat16
        assert torch.equal(got[name], mine[name].to(torch.bfloat16)), name
    # the draft vocabulary: the target's lm-head rows of its ids, and d2t their offsets
    lm_head = load_file(str(target / "model.safetensors"))["lm_head.weight"]
    assert torch.equal(got["lm_head.weight"], lm_head[ids].to(torch.bfloat16))
    assert (got["d2t"] + torch.arange(len(ids))).tolist() == ids
    assert not list(tmp_path.glob(".out.*"))  # the temporary folder renamed, nothing left


def test_without_a_draft_vocabulary_the_target_lm_head_is_left_to_llamacpp(tiny, tmp_path):
    target, drafter = tiny
    out = tmp_path / "out"
    assert cli.main(["export-llamacpp", str(drafter), "--out", str(out),
                     "--target", str(target)]) == 0
    got = load_file(str(out / "model.safetensors"))
    assert "lm_head.weight" not in got and "d2t" not in got
    assert "draft_vocab_size" not in json.loads((out / "config.json").read_text())


def _fails(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("domino-sglang: error: export-llamacpp: ")
    return err


def test_bad_input_is_one_line_and_writes_nothing(tiny, tmp_path, capsys):
    target, drafter = tiny
    out = tmp_path / "out"
    out.mkdir()
    assert "--out" in _fails(["export-llamacpp", str(drafter), "--out", str(out),
                              "--target", str(target)], capsys)
    assert "--target" in _fails(["export-llamacpp", str(drafter), "--out", str(tmp_path / "a"),
                                 "--target", str(tmp_path)], capsys)
    assert "config.json" in _fails(["export-llamacpp", str(tmp_path), "--out",
                                    str(tmp_path / "b"), "--target", str(target)], capsys)
    flipped = tmp_path / "flipped"
    flipped.mkdir()
    for f in drafter.iterdir():
        (flipped / f.name).write_bytes(f.read_bytes())
    conf = json.loads((flipped / "config.json").read_text())
    conf["dflash_config"]["shift_label"] = False
    (flipped / "config.json").write_text(json.dumps(conf))
    assert "shift_label" in _fails(["export-llamacpp", str(flipped), "--out",
                                    str(tmp_path / "c"), "--target", str(target)], capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flipped", "out"]
