"""Real targets' formatting: a chat template file and a thinking switch (Qwen3's
enable_thinking) choose how regenerate and training tokenise prompts and conversations."""

from __future__ import annotations

import json

import pytest

from domino_sglang.train.config import TrainConfigError, load_train_config
from domino_sglang.train.records import prepare_data
from domino_sglang.train.regenerate import chat_prompt_ids, chat_tokenizer
from tests.harness.new_target_fixtures import conversations, make_tokenizer

# Qwen3's switch, reduced to its effect: thinking off pre-fills an empty reasoning block
THINKING = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
            "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant "
            "{% if enable_thinking is defined and not enable_thinking %}system system "
            "{% endif %}{% endif %}")
OTHER = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
         "{% if add_generation_prompt %}assistant {% endif %}")


@pytest.fixture()
def target(tmp_path):
    path = tmp_path / "target"
    tok = make_tokenizer(path)
    tok.chat_template = THINKING
    tok.save_pretrained(path)
    return path


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_thinking_off_and_a_template_file_change_the_prompt(target, tmp_path):
    plain = chat_prompt_ids(chat_tokenizer(target), "w1 w2")
    base = chat_tokenizer(target)
    assert plain == ids(base, "<|im_start|> user w1 w2 <|im_end|> <|im_start|> assistant")
    assert chat_prompt_ids(chat_tokenizer(target, thinking=True), "w1 w2") == plain
    off = chat_prompt_ids(chat_tokenizer(target, thinking=False), "w1 w2")
    assert off == plain + ids(base, "system system")
    template = tmp_path / "other.jinja"
    template.write_text(OTHER)
    assert chat_prompt_ids(chat_tokenizer(target, template), "w1 w2") == ids(
        base, "user w1 w2 assistant")


def test_a_bad_template_file_is_named(target, tmp_path):
    with pytest.raises(ValueError, match="--chat-template .*missing.jinja: no such file"):
        chat_tokenizer(target, tmp_path / "missing.jinja")
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}")
    with pytest.raises(ValueError, match="bad.jinja: not a usable chat template"):
        chat_tokenizer(target, bad)


def test_training_tokenises_conversations_with_the_chosen_template(target, tmp_path):
    data = tmp_path / "c.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in conversations(3)))
    template = tmp_path / "other.jinja"
    template.write_text(OTHER)
    out = tmp_path / "run"
    out.mkdir()
    written, off_policy = prepare_data(data, target, out, 256, chat_template=str(template))
    first = json.loads(written.read_text().splitlines()[0])
    tok = chat_tokenizer(target)
    assert off_policy and tok.convert_ids_to_tokens(first["prompt_ids"][:1]) == ["user"]
    with pytest.raises(TrainConfigError, match="no such file"):
        prepare_data(data, target, tmp_path / "run2", 256, chat_template=str(tmp_path / "x"))
    conf = load_train_config(None, {"data": str(data), "out": str(out),
                                    "chat_template": str(template)})
    assert conf.chat_template == str(template)


def test_cli_flags_reach_the_config(tmp_path, capsys):
    from domino_sglang.cli import make_parser

    args = make_parser().parse_args(["train", "--max-length", "1024", "--chat-template",
                                      "t.jinja", "--features", "online"])
    assert (args.max_length, str(args.chat_template), args.features) == (1024, "t.jinja",
                                                                         "online")
    args = make_parser().parse_args(["regenerate", "--out", "o.jsonl", "--thinking", "off"])
    assert args.thinking == "off"
