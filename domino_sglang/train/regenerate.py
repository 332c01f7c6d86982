"""Training data: ShareGPT prompts answered again by the target itself, through our SGLang server.

Drafters learn what the TARGET would say, so responses are regenerated (greedy by default) rather
than taken from the dataset. A prompt is a conversation's first user turn, or (`turn` > 1) the
conversation up to a later user turn with the dataset's answers in between; or (`source_items`)
a code-completion request for a documented standard-library function (prompt_sets.python_functions)
or a templated grade-school word problem (prompt_sets.math_problems), or a templated general-chat
request (prompt_sets.chat_requests).
`dataset_answers` instead keeps ShareGPT's OWN first answers (no server): off-policy text, for
training with the target's distribution as the label (trainer `distill = 1`, `extra_data`).
Prompts are tokenised with the target's chat template exactly as SGLang's OpenAI chat endpoint does
(`apply_chat_template(add_generation_prompt=True)`; `--chat-template FILE` and, for targets
with a thinking switch such as Qwen3, `--thinking on|off` choose the format: ChatFormat) and sent as
`input_ids` to the native `/generate`, which returns the generated ids, so no re-tokenisation can
drift from what the server produced.

Cache: one JSONL file, one record per prompt `{"id", "prompt_ids", "output_ids", "finish"}`,
appended and fsync'ed as each response arrives. On resume the file is first cut back to its last
complete line (a crash mid-write loses nothing else), the ids already present are skipped, and every
remaining prompt is sent exactly once: no prompt is lost or duplicated.

Snapshot: the cache lives on one machine, and answering 8,000 prompts takes hours on 2 CPU cores,
so its records are also kept in git as a gzip'd JSONL sorted by id (`write_snapshot`, ~0.25 KB a
record). `restore_snapshot` appends the snapshot's records a cache lacks; regeneration then goes on
from there (`make data`, `make data-snapshot`).
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import requests


@dataclass(frozen=True)
class RegenConfig:
    max_new_tokens: int = 256
    temperature: float = 0.0
    concurrency: int = 32
    max_prompt_tokens: int = 512
    timeout_s: float = 1800.0


# A later turn's id: (turn - 1) * TURN_ID_STRIDE + the conversation's index, so first turns keep
# their ids (< 17,671 conversations) and a stage's `max_id` below the stride excludes later turns.
TURN_ID_STRIDE = 100_000
# Prompts from other sources than ShareGPT: each source's first id (+ the prompt's index).
SOURCE_ID_BASE = {"python": 1_000_000, "math": 2_000_000, "chat": 3_000_000,
                  "sharegpt-answers": 4_000_000}
PYTHON_ID_BASE = SOURCE_ID_BASE["python"]


class ChatFormat:
    """A tokenizer whose chat template is the one the user chose: `template` (a Jinja template
    file, as SGLang's --chat-template takes; None: the target's own) and `thinking` (True /
    False: the template's `enable_thinking`, Qwen3's switch between reasoning and direct
    answers; None: the template's default). Everything else is the tokenizer's."""

    def __init__(self, tokenizer, template: Path | None = None, thinking: bool | None = None):
        self.tokenizer, self.thinking = tokenizer, thinking
        self.template = template.read_text() if template is not None else None

    def apply_chat_template(self, messages, **kwargs):
        if self.template is not None:
            kwargs["chat_template"] = self.template
        if self.thinking is not None:
            kwargs["enable_thinking"] = self.thinking
        return self.tokenizer.apply_chat_template(messages, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.tokenizer, name)

    def __call__(self, *args, **kwargs):
        return self.tokenizer(*args, **kwargs)


def chat_tokenizer(target: Path, template: Path | None = None,
                   thinking: bool | None = None):
    """The target's tokenizer with the chat format chosen (ChatFormat); the tokenizer itself
    when neither is. A template file that is missing or not Jinja fails here, naming it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(target))
    if template is None and thinking is None:
        return tokenizer
    if template is not None and not template.is_file():
        raise ValueError(f"--chat-template {template}: no such file")
    chat = ChatFormat(tokenizer, template, thinking)
    try:
        chat.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                 add_generation_prompt=True)
    except Exception as exc:  # noqa: BLE001 (jinja's errors: say which file)
        raise ValueError(f"--chat-template {template}: not a usable chat template "
                         f"({type(exc).__name__}: {exc})") from exc
    return chat


def chat_prompt_ids(tokenizer, prompt: str | list[dict]) -> list[int]:
    """The token ids SGLang's chat endpoint would feed the model for one user turn, or for chat
    messages ending with a user turn."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    return _template_ids(tokenizer, messages, add_generation_prompt=True)


def _template_ids(tokenizer, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    """The chat template's token ids of `messages`."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                        tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # BatchEncoding in newer transformers
        ids = ids["input_ids"]
    return list(ids)


def recover(path: Path) -> set[int]:
    """Cut a cache file back to its last complete record; return the prompt ids it holds."""
    if not path.exists():
        return set()
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1  # bytes up to and including the last newline
    if keep != len(data):
        with path.open("r+b") as f:
            f.truncate(keep)
    done = set()
    for line in data[:keep].splitlines():
        if line.strip():
            done.add(int(json.loads(line)["id"]))
    return done


def read_records(path: Path) -> list[dict]:
    recover(path)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_snapshot(cache: Path, snapshot: Path) -> int:
    """Every complete record of `cache`, sorted by id, gzip'd into `snapshot` (written to a
    temporary file, then renamed; the same records give the same bytes). Returns the count."""
    records = sorted(read_records(cache), key=lambda r: int(r["id"]))
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    tmp = snapshot.with_name(snapshot.name + ".tmp")
    with gzip.GzipFile(tmp, "wb", compresslevel=9, mtime=0) as raw, \
            io.TextIOWrapper(raw, encoding="utf-8") as text:
        for rec in records:
            text.write(json.dumps(rec) + "\n")
    tmp.replace(snapshot)
    return len(records)


def restore_snapshot(snapshot: Path, cache: Path) -> int:
    """Append to `cache` the records of `snapshot` whose ids it lacks; returns how many. A
    snapshot that is not gzip'd JSONL records raises ValueError naming the file; then the cache
    is left as it was."""
    try:
        with gzip.open(snapshot, "rt", encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
        for rec in records:  # every record has an integer id
            int(rec["id"])
    except (OSError, EOFError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{snapshot}: not a regenerated-data snapshot ({exc})") from exc
    return append_records(cache, records)


def _generate(url: str, prompt_ids: list[int], conf: RegenConfig) -> dict:
    body = {"input_ids": prompt_ids,
            "sampling_params": {"max_new_tokens": conf.max_new_tokens,
                                "temperature": conf.temperature}}
    resp = requests.post(f"{url}/generate", json=body, timeout=conf.timeout_s)
    resp.raise_for_status()
    out = resp.json()
    finish = out["meta_info"].get("finish_reason") or {}
    return {"output_ids": list(out["output_ids"]), "finish": finish.get("type")}


def regenerate(url: str, items: Iterable[tuple[int, Sequence[int]]], out_path: Path,
               conf: RegenConfig = RegenConfig(), progress: bool = True) -> int:
    """Answer every (id, prompt_ids) not yet in `out_path`; return how many were written now."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    done = recover(out_path)
    todo = [(i, list(ids)) for i, ids in items if i not in done]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(todo), desc="regenerate", unit="prompt")
    pool = ThreadPoolExecutor(max_workers=conf.concurrency)
    try:
        written = _drain(pool, url, todo, out_path, conf, bar)
    finally:  # on Ctrl-C, stop at once: in-flight prompts were not written, so they are redone
        pool.shutdown(wait=False, cancel_futures=True)
        if bar is not None:
            bar.close()
    return written


def _drain(pool: ThreadPoolExecutor, url: str, todo: list, out_path: Path, conf: RegenConfig,
           bar) -> int:
    written = 0
    with out_path.open("a") as out:
        pending: dict = {}
        queue = iter(todo)
        while True:
            while len(pending) < conf.concurrency:
                nxt = next(queue, None)
                if nxt is None:
                    break
                pending[pool.submit(_generate, url, nxt[1], conf)] = nxt
            if not pending:
                break
            # a timeout keeps the main thread responsive to Ctrl-C
            finished, _ = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
            for fut in finished:
                pid, prompt_ids = pending.pop(fut)
                rec = {"id": pid, "prompt_ids": prompt_ids, **fut.result()}
                out.write(json.dumps(rec) + "\n")
                out.flush()
                os.fsync(out.fileno())
                written += 1
                if bar is not None:
                    bar.update(1)
    return written


def sharegpt_items(tokenizer, limit: int | None, max_prompt_tokens: int, first_id: int = 0,
                   turn: int = 1) -> list[tuple[int, list[int]]]:
    """(prompt id, chat prompt ids) of the `turn`-th user turn of each ShareGPT conversation from
    index `first_id` on, at most `limit` of them, skipping prompts over the length cap.

    Turn 1 is the first user message alone, with the conversation's index as its id. A later turn
    is the conversation up to that user message, the dataset's own assistant answers in between
    (the target answers the last turn only), with id (turn - 1) * TURN_ID_STRIDE + index.
    The id is the prompt's stable key in the cache, so a resume with the same data skips it.
    """
    from domino_sglang.train.prompt_sets import sharegpt_conversations

    out = []
    for i, conv in enumerate(sharegpt_conversations()):
        users = [k for k, m in enumerate(conv) if m["role"] == "user"]
        if i < first_id or len(users) < turn:
            continue
        ids = chat_prompt_ids(tokenizer, conv[: users[turn - 1] + 1])
        if len(ids) <= max_prompt_tokens:
            out.append(((turn - 1) * TURN_ID_STRIDE + i, ids))
            if limit is not None and len(out) >= limit:
                break
    return out


def source_items(source: str, tokenizer, limit: int | None, max_prompt_tokens: int,
                 first_id: int = 0) -> list[tuple[int, list[int]]]:
    """(prompt id, chat prompt ids) of a prompt source beside ShareGPT ("python":
    prompt_sets.python_functions, "math": prompt_sets.math_problems, "chat":
    prompt_sets.chat_requests) from index
    `first_id` on, at most
    `limit` of them, skipping prompts over the length cap; id SOURCE_ID_BASE[source] + index,
    so they sort after every ShareGPT turn (and are a stage's held-out records when it trains on
    them)."""
    from domino_sglang.train import prompt_sets

    prompts = {"python": prompt_sets.python_functions, "math": prompt_sets.math_problems,
               "chat": prompt_sets.chat_requests}[source]()
    out = []
    for i, prompt in enumerate(prompts):
        if i < first_id:
            continue
        ids = chat_prompt_ids(tokenizer, prompt)
        if len(ids) <= max_prompt_tokens:
            out.append((SOURCE_ID_BASE[source] + i, ids))
            if limit is not None and len(out) >= limit:
                break
    return out


def dataset_answers(tokenizer, limit: int | None, max_prompt_tokens: int, max_new_tokens: int,
                    first_id: int = 0) -> list[dict]:
    """Records of ShareGPT's own answers to first turns (written by the dataset's assistant, not
    the target): {"id": SOURCE_ID_BASE["sharegpt-answers"] + index, "prompt_ids" (the chat
    prompt, as `sharegpt_items`), "output_ids", "finish"}, from conversation `first_id` on, at
    most `limit` of them.

    output_ids are the answer's tokens as the chat template lays out the two-turn conversation
    (the template's tokens after the prompt, up to and including the turn's closing
    <|im_end|>), cut at `max_new_tokens` (finish "length", else "dataset"); a conversation whose
    templated ids do not start with its prompt's (a merge across the boundary) is skipped.
    Their tokens are not what the target would say, so only the target's own distribution at
    each position is a right label for them (the trainer's `distill = 1`)."""
    from domino_sglang.train.prompt_sets import sharegpt_conversations

    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = []
    for i, conv in enumerate(sharegpt_conversations()):
        if i < first_id or len(conv) < 2:
            continue
        prompt_ids = chat_prompt_ids(tokenizer, conv[:1])
        if len(prompt_ids) > max_prompt_tokens:
            continue
        full = _template_ids(tokenizer, conv[:2], add_generation_prompt=False)
        answer = full[len(prompt_ids):]
        if full[: len(prompt_ids)] != prompt_ids or end not in answer:
            continue
        answer = answer[: answer.index(end) + 1]  # the closing <|im_end|>, not what follows it
        cut = len(answer) > max_new_tokens
        out.append({"id": SOURCE_ID_BASE["sharegpt-answers"] + i, "prompt_ids": prompt_ids,
                    "output_ids": answer[:max_new_tokens], "finish": "length" if cut else
                    "dataset"})
        if limit is not None and len(out) >= limit:
            break
    return out


def append_records(out_path: Path, records: Iterable[dict]) -> int:
    """Append to `out_path` the records whose ids it lacks (fsync'ed); returns how many."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    done = recover(out_path)
    new = [rec for rec in records if int(rec["id"]) not in done]
    with out_path.open("a") as out:
        out.write("".join(json.dumps(rec) + "\n" for rec in new))
        out.flush()
        os.fsync(out.fileno())
    return len(new)


def python_items(tokenizer, limit: int | None, max_prompt_tokens: int, first_id: int = 0
                 ) -> list[tuple[int, list[int]]]:
    """source_items("python", ...): the standard-library code prompts."""
    return source_items("python", tokenizer, limit, max_prompt_tokens, first_id)
