"""Bring-your-own conversations: ShareGPT-style JSON/JSONL and OpenAI chat JSONL, as chat messages.

Accepted, one conversation per JSONL line or as a JSON list of them:
  ShareGPT: {"conversations": [{"from": "human"|"gpt"|"system", "value": "..."}, ...]}
  OpenAI:   {"messages": [{"role": "user"|"assistant"|"system", "content": "..."}, ...]}
A conversation may carry an integer "id" (kept as the record / prompt id), else its position.

Two uses: `prompt_items` gives the prompt of each conversation (the messages up to its last user
turn) for `domino-sglang regenerate --data FILE --server URL` (the target answers: on-policy);
`written_records` keeps each conversation's last assistant answer as written (off-policy: not the
target's own tokens), tokenised with the target's chat template as SGLang's chat endpoint would.
"""

from __future__ import annotations

import json
from pathlib import Path

from domino_sglang.train.regenerate import _template_ids, chat_prompt_ids

_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
          "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "system": "system"}


class ConversationError(ValueError):
    """A conversations file that cannot be read; the message names the file and line."""


def is_records_file(path: Path) -> bool:
    """True for a regenerated JSONL (its first record has prompt_ids and output_ids)."""
    with Path(path).open() as f:
        for line in f:
            if line.strip():
                try:
                    first = json.loads(line)
                except json.JSONDecodeError:
                    return False  # a JSON list spread over lines: conversations
                return isinstance(first, dict) and "prompt_ids" in first and "output_ids" in first
    return False


def _messages(obj: object, where: str) -> list[dict]:
    if not isinstance(obj, dict):
        raise ConversationError(f"{where}: expected an object with 'conversations' or "
                                f"'messages', got {type(obj).__name__}")
    if "messages" in obj:
        turns, role_key, text_key = obj["messages"], "role", "content"
    elif "conversations" in obj:
        turns, role_key, text_key = obj["conversations"], "from", "value"
    else:
        raise ConversationError(f"{where}: no 'conversations' (ShareGPT) or 'messages' "
                                f"(OpenAI chat) key")
    if not isinstance(turns, list):
        raise ConversationError(f"{where}: the turns must be a list")
    out = []
    for k, turn in enumerate(turns):
        role = _ROLES.get(str(turn.get(role_key, "")).lower()) if isinstance(turn, dict) else None
        text = turn.get(text_key) if isinstance(turn, dict) else None
        if role is None or not isinstance(text, str):
            raise ConversationError(f"{where}: turn {k} needs '{role_key}' (a known role) and "
                                    f"'{text_key}' (text)")
        out.append({"role": role, "content": text})
    return out


def read_conversations(path: Path) -> list[tuple[int, list[dict]]]:
    """(id, chat messages) of every conversation of a .json list or a JSONL file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConversationError(f"{path}: {exc}") from exc
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            objs = [(f"{path} item {i}", o) for i, o in enumerate(json.loads(stripped))]
        except json.JSONDecodeError as exc:
            raise ConversationError(f"{path}: not valid JSON ({exc})") from exc
    else:
        objs = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    objs.append((f"{path}:{n}", json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise ConversationError(f"{path}:{n}: not valid JSON ({exc})") from exc
    out = []
    for i, (where, obj) in enumerate(objs):
        messages = _messages(obj, where)
        cid = obj.get("id", i)
        out.append((cid if isinstance(cid, int) and cid >= 0 else i, messages))
    if len({cid for cid, _ in out}) != len(out):
        raise ConversationError(f"{path}: conversation ids are not unique")
    return out


def prompt_items(conversations: list[tuple[int, list[dict]]], tokenizer,
                 max_prompt_tokens: int) -> list[tuple[int, list[int]]]:
    """(id, chat prompt ids) of each conversation up to its last user turn (the target answers
    it); conversations without a user turn or over the length cap are skipped."""
    out = []
    for cid, messages in conversations:
        users = [k for k, m in enumerate(messages) if m["role"] == "user"]
        if users:
            ids = chat_prompt_ids(tokenizer, messages[: users[-1] + 1])
            if len(ids) <= max_prompt_tokens:
                out.append((cid, ids))
    return out


def written_records(conversations: list[tuple[int, list[dict]]], tokenizer, max_seq_len: int
                    ) -> list[dict]:
    """Regenerated-format records {"id", "prompt_ids", "output_ids", "finish": "written"} of
    each conversation's last assistant answer as written (the template's tokens after the
    generation prompt), the messages before it as the prompt."""
    out = []
    for cid, messages in conversations:
        last = max((k for k, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
        if last < 1 or messages[last - 1]["role"] == "assistant":
            continue
        prompt = chat_prompt_ids(tokenizer, messages[:last])
        full = _template_ids(tokenizer, messages[: last + 1], add_generation_prompt=False)
        if full[: len(prompt)] == prompt:
            answer = full[len(prompt):]
        else:  # a template that rewrites earlier turns (e.g. drops past reasoning)
            answer = list(tokenizer(messages[last]["content"], add_special_tokens=False)
                          ["input_ids"])
            if tokenizer.eos_token_id is not None:
                answer.append(tokenizer.eos_token_id)
        if len(prompt) < max_seq_len - 2 and len(answer) >= 2:
            out.append({"id": cid, "prompt_ids": prompt, "output_ids": answer,
                        "finish": "written"})
    return out
