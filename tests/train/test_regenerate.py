"""Regeneration cache: an interrupted run (server failure + a half-written line) resumes with no
prompt lost or duplicated. The HTTP side is a local stand-in for SGLang's /generate (the cache
logic is what is under test; the real server path is exercised by the training recipe)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from domino_sglang.train.regenerate import (
    PYTHON_ID_BASE,
    SOURCE_ID_BASE,
    TURN_ID_STRIDE,
    RegenConfig,
    python_items,
    read_records,
    recover,
    regenerate,
    restore_snapshot,
    sharegpt_items,
    source_items,
    write_snapshot,
)


def _answer(ids: list[int]) -> list[int]:
    return [sum(ids) % 97, len(ids), ids[0]]


class _Stub(BaseHTTPRequestHandler):
    fail_on: set[int] = set()
    calls: list[int] = []

    def do_POST(self):  # noqa: N802 (http.server API)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ids = body["input_ids"]
        _Stub.calls.append(ids[0])
        if ids[0] in _Stub.fail_on:
            self.send_response(500)
            self.end_headers()
            return
        out = json.dumps({"output_ids": _answer(ids),
                          "meta_info": {"finish_reason": {"type": "length"}}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


@pytest.fixture()
def stub_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_interrupted_regeneration_resumes_without_loss_or_duplicates(tmp_path, stub_url):
    items = [(i, [1000 + i, i % 7, 3]) for i in range(40)]
    out = tmp_path / "cache.jsonl"
    conf = RegenConfig(concurrency=4)
    _Stub.fail_on = {1025}  # the server dies on prompt 25
    with pytest.raises(requests.HTTPError):
        regenerate(stub_url, items, out, conf, progress=False)
    first = read_records(out)
    assert 0 < len(first) < 40
    with out.open("a") as f:  # a crash in the middle of writing a record
        f.write('{"id": 39, "prompt_ids": [10')
    assert recover(out) == {r["id"] for r in first}  # the torn line is cut off, nothing else

    _Stub.fail_on, _Stub.calls = set(), []
    written = regenerate(stub_url, items, out, conf, progress=False)
    records = read_records(out)
    ids = [r["id"] for r in records]
    assert sorted(ids) == list(range(40))  # nothing lost, nothing duplicated
    assert written == 40 - len(first)
    done_first = {1000 + r["id"] for r in first}
    assert done_first.isdisjoint(_Stub.calls)  # finished prompts are never asked again
    by_id = {r["id"]: r for r in records}
    for i, prompt in items:
        assert by_id[i]["prompt_ids"] == prompt and by_id[i]["output_ids"] == _answer(prompt)
    assert regenerate(stub_url, items, out, conf, progress=False) == 0  # complete: no-op


def test_snapshot_carries_the_cache_to_a_new_machine(tmp_path, stub_url):
    items = [(i, [1000 + i, i % 5, 2]) for i in range(30)]
    cache = tmp_path / "old" / "cache.jsonl"
    regenerate(stub_url, items[:20], cache, RegenConfig(concurrency=4), progress=False)
    with cache.open("a") as f:  # a torn last line is not part of the snapshot
        f.write('{"id": 25, "prompt_ids": [1')
    snap = tmp_path / "repo" / "data.jsonl.gz"
    assert write_snapshot(cache, snap) == 20
    first = snap.read_bytes()
    assert write_snapshot(cache, snap) == 20 and snap.read_bytes() == first  # reproducible

    # a new machine holds one record already: only the others are appended, none twice
    fresh = tmp_path / "new" / "cache.jsonl"
    fresh.parent.mkdir()
    fresh.write_text(json.dumps(read_records(cache)[0]) + "\n")
    assert restore_snapshot(snap, fresh) == 19
    assert sorted(r["id"] for r in read_records(fresh)) == list(range(20))
    assert restore_snapshot(snap, fresh) == 0
    # regeneration goes on from the restored records: only the 10 missing prompts are asked
    _Stub.fail_on, _Stub.calls = set(), []
    assert regenerate(stub_url, items, fresh, RegenConfig(concurrency=4), progress=False) == 10
    assert sorted(_Stub.calls) == [1000 + i for i in range(20, 30)]


def test_bad_snapshot_is_named_and_the_cache_untouched(tmp_path):
    cache = tmp_path / "cache.jsonl"
    cache.write_text('{"id": 1, "prompt_ids": [1], "output_ids": [2], "finish": "length"}\n')
    before = cache.read_bytes()
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_text("not gzip")
    with pytest.raises(ValueError, match="bad.jsonl.gz: not a regenerated-data snapshot"):
        restore_snapshot(bad, cache)
    assert cache.read_bytes() == before


class _CharTokenizer:
    """A stand-in chat template: a role marker, then one id per character, for each message."""

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        return [i for m in messages
                for i in [1 if m["role"] == "user" else 2] + [ord(c) % 1000 for c in m["content"]]]


def test_first_id_starts_the_prompts_at_that_sharegpt_index():
    """`regenerate --first-id N` (new data past a regenerated range): ids start at N, keep
    ShareGPT's indices (the cache key), and --limit counts from there."""
    tok = _CharTokenizer()
    head = sharegpt_items(tok, 80, 512)
    later = sharegpt_items(tok, 5, 512, first_id=30)
    # the same prompts under the same ids (and token ids) as a run from index 0 gives them
    assert later == [item for item in head if item[0] >= 30][:5]
    assert len(later) == 5 and later[0][0] >= 30 and head[0][0] < 30


def test_a_later_turn_is_the_conversation_up_to_it_under_its_own_id():
    """`regenerate --turn 2`: the prompt is the first user turn, the dataset's answer to it and
    the second user turn, in the chat template; ids are STRIDE + the conversation's index (the
    same index as its first turn), so first-turn ids and a stage's max_id stay as they were."""
    from domino_sglang.train.prompt_sets import sharegpt_conversations

    tok = _CharTokenizer()
    convs = sharegpt_conversations()[:60]
    first = dict(sharegpt_items(tok, 60, 10**6))
    second = dict(sharegpt_items(tok, None, 10**6, first_id=0, turn=2)[:20])
    assert second and all(TURN_ID_STRIDE <= i < TURN_ID_STRIDE + 60 for i in list(second)[:5])
    for pid, ids in list(second.items())[:5]:
        conv = convs[pid - TURN_ID_STRIDE]
        assert [m["role"] for m in conv[:3]] == ["user", "assistant", "user"]
        assert ids == tok.apply_chat_template(conv[:3], True, True)
        assert ids[: len(first[pid - TURN_ID_STRIDE])] == first[pid - TURN_ID_STRIDE]
    # only conversations with a second user turn, and the length cap counts the whole context
    assert all(len([m for m in convs[i - TURN_ID_STRIDE] if m["role"] == "user"]) >= 2
               for i in list(second)[:5])
    cap = 2 * len(first[0])
    assert all(len(ids) <= cap for _, ids in sharegpt_items(tok, 10, cap, turn=2))


def test_python_prompts_ask_for_a_documented_stdlib_function_and_skip_humaneval(tmp_path):
    """`regenerate --source python`: one prompt per public, undecorated, documented top-level
    function (header + docstring, no body), in sorted file order, test folders skipped; none is
    a HumanEval problem; ids PYTHON_ID_BASE + index, above every ShareGPT turn's."""
    from domino_sglang.train.prompt_sets import humaneval, python_functions

    pkg = tmp_path / "lib"
    (pkg / "test").mkdir(parents=True)
    (pkg / "b.py").write_text(
        'def combine(a, b):\n    """Return the sum of a and b, for any two numbers at all."""\n'
        '    return a + b\n\n'
        'def _hidden(x):\n    """A private helper that no prompt should be built from."""\n\n'
        'def short(x):\n    """Too short."""\n\n'
        '@staticmethod\ndef wrapped(x):\n    """Decorated: its header is not the whole story."""\n')
    (pkg / "c.py").write_text('def median(data):\n    """Shares its name with a HumanEval '
                              'problem, so it is left out (decontamination)."""\n')
    (pkg / "a.py").write_text('def first(s: str) -> str:\n    """Return s upper-cased, '
                              'keeping every character that has no case."""\n    return s\n')
    (pkg / "test" / "t.py").write_text('def in_tests():\n    """A test helper, left out like '
                                       'the whole test package."""\n')
    (pkg / "broken.py").write_text("def (:\n")
    prompts = python_functions(pkg)
    assert len(prompts) == 2
    assert prompts[0].startswith("Complete the following Python function.\n\n```python\n"
                                 "def first(s: str) -> str:\n")
    assert "return s" not in prompts[0] and prompts[0].endswith('has no case."""\n```')
    assert "def combine(a, b):" in prompts[1] and "return a + b" not in prompts[1]
    assert prompts[0].split("\n")[0] != prompts[1].split("\n")[0]  # the wordings rotate

    real = python_functions()
    assert len(real) > 500 and all("```python\ndef " in p for p in real)
    names = {p.split("```python\ndef ", 1)[1].split("(", 1)[0] for p in real}
    humaneval_names = {p.split("\ndef ")[-1].split("(", 1)[0] for p in humaneval()}
    assert not names & humaneval_names
    tok = _CharTokenizer()
    items = python_items(tok, 5, 10**6, first_id=3)
    assert [i for i, _ in items] == [PYTHON_ID_BASE + k for k in range(3, 8)]
    assert items[0][1] == tok.apply_chat_template([{"role": "user", "content": real[3]}],
                                                  True, True)
    assert all(len(ids) <= 300 for _, ids in python_items(tok, 10, 300))


def test_math_prompts_are_distinct_filled_templates_reproducible_and_not_gsm8k():
    """`regenerate --source math`: `n` distinct word problems, the same list for the same seed
    (a prompt's index is its id), every placeholder filled, a pronoun that agrees with the
    name, none of them a GSM8K test question; ids SOURCE_ID_BASE["math"] + index, above the
    code prompts'."""
    from domino_sglang.train.prompt_sets import _MATH_TEMPLATES, gsm8k, math_problems

    prompts = math_problems(300)
    assert len(set(prompts)) == 300 and prompts == math_problems(300)
    assert math_problems(300, seed=1) != prompts
    assert math_problems(50) == prompts[:50]  # a longer list extends a shorter one
    assert not any("{" in p or "}" in p for p in prompts)
    assert len({p.split(" ")[0] for p in prompts[: len(_MATH_TEMPLATES)]}) > 10  # templates rotate
    for p in prompts:
        if p.startswith(("Maria ", "Aisha ", "Emma ")):
            assert " he " not in p and " his " not in p and " him" not in p, p
        if p.startswith(("James ", "Tom ", "Owen ")):
            assert " she " not in p and " her " not in p, p
    assert not set(prompts) & set(gsm8k())
    tok = _CharTokenizer()
    items = source_items("math", tok, 4, 10**6, first_id=2)
    assert [i for i, _ in items] == [SOURCE_ID_BASE["math"] + k for k in range(2, 6)]
    assert SOURCE_ID_BASE["math"] > PYTHON_ID_BASE + len(python_items(tok, None, 10**6))
    assert items[0][1] == tok.apply_chat_template(
        [{"role": "user", "content": math_problems()[2]}], True, True)


def test_chat_requests_are_distinct_filled_templates_reproducible_and_not_mtbench():
    """`regenerate --source chat`: `n` distinct general-chat requests, the same list for the same
    seed (a request's index is its id), every placeholder filled, every template used, no
    MT-Bench question among or inside them, extraction passages taken from the standard
    library; a template set too small for `n` is a one-line error; ids
    SOURCE_ID_BASE["chat"] + index, above the math problems'."""
    from domino_sglang.train.prompt_sets import (
        _CHAT_TEMPLATES,
        DataError,
        _stdlib_passages,
        chat_requests,
        math_problems,
        mtbench,
    )

    prompts = chat_requests(600)
    assert len(set(prompts)) == 600 and prompts == chat_requests(600)
    assert chat_requests(600, seed=1) != prompts
    assert chat_requests(50) == prompts[:50]  # a longer list extends a shorter one
    asks = [p.split("\n\n", 1)[0] for p in prompts]  # a passage may hold braces of its own
    assert not any("{" in a or "}" in a for a in asks)
    heads = {t.split("{", 1)[0] for t in _CHAT_TEMPLATES}
    assert all(any(p.startswith(h) for p in prompts) for h in heads)
    questions = mtbench()
    assert not any(q[:60] in p for q in questions for p in prompts)
    passages = set(_stdlib_passages())
    with_passage = [p for p in prompts if "\n\n" in p]
    assert 0.1 < len(with_passage) / len(prompts) < 0.35
    assert all(p.split("\n\n", 1)[1] in passages for p in with_passage)
    with pytest.raises(DataError, match="only .* distinct requests, fewer than n=100000"):
        chat_requests(100_000)
    tok = _CharTokenizer()
    items = source_items("chat", tok, 3, 10**6, first_id=4)
    assert [i for i, _ in items] == [SOURCE_ID_BASE["chat"] + k for k in range(4, 7)]
    assert SOURCE_ID_BASE["chat"] > SOURCE_ID_BASE["math"] + len(math_problems())
    assert items[0][1] == tok.apply_chat_template(
        [{"role": "user", "content": chat_requests()[4]}], True, True)


def test_eval_answers_in_git_are_replayed_without_a_server_and_checked(tmp_path):
    # evaluation answers come from the snapshots kept in git first (compare_drafters passes
    # benchmarks/data), so every machine replays the same ones (a batched bf16 server's greedy
    # answers differ between machines); no server is needed for the prompts the snapshot holds
    # (the url is a closed port), and an answer cached for another prompt is refused with the
    # file named. The snapshots here are made for the sets' real prompts and chat template.
    from transformers import AutoTokenizer

    from domino_sglang.paths import target_dir
    from domino_sglang.train import prompt_sets
    from domino_sglang.train.evalset import eval_records
    from domino_sglang.train.regenerate import chat_prompt_ids, write_snapshot

    tok = AutoTokenizer.from_pretrained(str(target_dir()))
    snapshots, cache = tmp_path / "snapshots", tmp_path / "cache"
    for name in ("mtbench", "humaneval", "gsm8k"):
        kept = [{"id": i, "prompt_ids": chat_prompt_ids(tok, p), "output_ids": [100 + i] * 8,
                 "finish": "length"} for i, p in enumerate(prompt_sets.load(name, 4))]
        made = tmp_path / f"eval-{name}-greedy8.jsonl"
        made.write_text("".join(json.dumps(r) + "\n" for r in kept))
        assert write_snapshot(made, snapshots / f"{made.name}.gz") == 4
        records = eval_records(name, 3, 8, "http://127.0.0.1:9", 1024, cache, snapshots)
        assert [r["id"] for r in records] == [0, 1, 2]
        for rec, snap in zip(records, kept):  # ids = prompt + answer (load_records' layout)
            assert rec["ids"] == snap["prompt_ids"] + snap["output_ids"]
            assert rec["start"] == len(snap["prompt_ids"])
    cached = cache / "eval-gsm8k-greedy8.jsonl"
    lines = cached.read_text().splitlines()
    stale = json.loads(lines[2])
    stale["prompt_ids"] = stale["prompt_ids"][:-1]
    cached.write_text("\n".join(lines[:2] + [json.dumps(stale)] + lines[3:]) + "\n")
    with pytest.raises(ValueError, match="eval-gsm8k-greedy8.jsonl: answer 2 was generated"):
        eval_records("gsm8k", 3, 8, "http://127.0.0.1:9", 1024, cache, snapshots)


class _TemplateTokenizer(_CharTokenizer):
    """_CharTokenizer with ChatML's closing token: each message ends with <|im_end|> (id 2000),
    the generation prompt is the assistant's role marker."""

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        ids = [i for m in messages for i in [1 if m["role"] == "user" else 2]
               + [ord(c) % 1000 for c in m["content"]] + [2000]]
        return ids + [2] if add_generation_prompt else ids

    def convert_tokens_to_ids(self, token):
        assert token == "<|im_end|>"
        return 2000


def test_dataset_answers_are_the_template_tokens_after_the_prompt(tmp_path):
    """`regenerate --source sharegpt-answers`: each record's prompt is the first user turn as
    sharegpt_items gives it, its output the dataset's answer exactly as the template lays out the
    two turns, closed by <|im_end|> or cut at max_new_tokens; ids 4000000 + the conversation's
    index. Appending the same records again writes nothing."""
    from domino_sglang.train.prompt_sets import sharegpt_conversations
    from domino_sglang.train.regenerate import append_records, dataset_answers

    tok = _TemplateTokenizer()
    convs = sharegpt_conversations()[:40]
    recs = dataset_answers(tok, 12, 10**6, 10**6)
    prompts = dict(sharegpt_items(tok, 40, 10**6))
    assert len(recs) == 12
    for rec in recs:
        idx = rec["id"] - SOURCE_ID_BASE["sharegpt-answers"]
        assert 0 <= idx < 40 and rec["prompt_ids"] == prompts[idx]
        answer = convs[idx][1]["content"]
        assert rec["output_ids"] == [ord(c) % 1000 for c in answer] + [2000]
        assert rec["finish"] == "dataset"
    cut = dataset_answers(tok, 12, 10**6, 50)
    assert [r["id"] for r in cut] == [r["id"] for r in recs]
    for short, full in zip(cut, recs):
        assert short["output_ids"] == full["output_ids"][:50]
        assert short["finish"] == ("length" if len(full["output_ids"]) > 50 else "dataset")
    assert any(r["finish"] == "length" for r in cut)
    out = tmp_path / "answers.jsonl"
    assert append_records(out, recs[:5]) == 5
    assert append_records(out, recs) == 7  # a resumed run adds only what is missing
    assert [r["id"] for r in read_records(out)] == [r["id"] for r in recs]
