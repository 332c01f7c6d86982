"""Every request of the suite whose output is compared with plain decoding, declared as data.

The no-speculation references are computed once, in parallel, before the DOMINO server is
needed (`references` in conftest.py), so the suite's two servers never compete for the CPU.
A job is a dict: kind `generate` (native, token ids), `chat` or `stream` (OpenAI chat).
"""

from __future__ import annotations

from tests.conftest import PROMPTS
from tests.reliability.client import POOL, chat, generate

BLOCK = 4  # block size of the shared server's repeat drafter
CAT = "Repeat the word cat ten times: cat cat cat cat"
# Chat prompts whose greedy answer ends with EOS well before the limit; the first repeats " no"
# (blocks accepted a round or two before EOS). The repeat drafter only proposes a token already
# emitted, so it can never put EOS itself inside an accepted block.
RUNS = ["Write 'no no no no no' and nothing else.",
        "Type the word cat 6 times separated by spaces.", "Repeat after me: cat cat cat cat cat"]
TAIL_OUTPUT = 100  # output tokens left to the request that grows to the pool's size


def load_jobs(tokenizer) -> list[dict]:
    """64 requests, 8 kinds x 8: chat and /generate, streamed and not, 1 to 64 tokens, stop
    strings, max_tokens cuts and stop strings inside accepted blocks, EOS."""
    cat_ids = tokenizer(CAT).input_ids
    jobs = []
    for i in range(64):
        p, kind, j = PROMPTS[i % len(PROMPTS)], i % 8, i // 8
        if kind == 0:
            jobs.append({"kind": "chat", "prompt": p, "max_tokens": 48})
        elif kind == 1:
            jobs.append({"kind": "stream", "prompt": p, "max_tokens": 32})
        elif kind == 2:  # a stop string: the text before the first period or newline
            jobs.append({"kind": "chat", "prompt": p, "max_tokens": 64, "stop": [".", "\n"]})
        elif kind == 3:  # 1-token and short outputs
            jobs.append({"kind": "generate", "ids": tokenizer(p).input_ids,
                         "max_tokens": [1, 2, 5, 9][j % 4]})
        elif kind == 4:  # max_tokens inside an accepted block (rounds commit up to 4)
            jobs.append({"kind": "generate", "ids": cat_ids, "max_tokens": 5 + j})
        elif kind == 5:  # a stop string completed inside an accepted block
            jobs.append({"kind": "generate", "ids": cat_ids, "max_tokens": 40,
                         "stop": [" cat cat cat" + " cat" * (j % 3)]})
        elif kind == 6:  # EOS
            jobs.append({"kind": "chat", "prompt": RUNS[j % len(RUNS)], "max_tokens": 40})
        else:
            jobs.append({"kind": "stream", "prompt": RUNS[j % len(RUNS)], "max_tokens": 40})
    return jobs


def burst_jobs(tokenizer, n: int = 12) -> list[dict]:
    """n distinct ~150-token prompts (the prompt set rotated, so radix sharing stays small),
    64 tokens each (ignore_eos): ~1.3x the shared server's pool at once."""
    jobs = []
    for i in range(n):
        text = " ".join(PROMPTS[(i + k) % len(PROMPTS)] for k in range(len(PROMPTS)))
        jobs.append({"kind": "generate", "ids": tokenizer(f"Request {i}. {text}").input_ids,
                     "max_tokens": 64, "ignore_eos": True})
    return jobs


def tail_job(tokenizer) -> dict:
    """A prompt so long that only TAIL_OUTPUT tokens fit after it in the pool with DOMINO's
    reservation (SGLang's room is pool - 2); asks for 8 more than that."""
    ids = tokenizer("Repeat the word cat: " + "cat " * 2000).input_ids
    return {"kind": "generate", "ids": ids[: POOL - 2 - 2 * BLOCK - TAIL_OUTPUT],
            "max_tokens": TAIL_OUTPUT + 8, "ignore_eos": True}


def other_jobs(tokenizer) -> dict[str, dict]:
    """Single requests the fault and bad-input tests compare after their abuse."""
    jobs = {f"one/{i}": {"kind": "chat", "prompt": p, "max_tokens": 1}
            for i, p in enumerate(PROMPTS[:4])}
    jobs.update({
        "one/generate": {"kind": "generate", "ids": tokenizer(PROMPTS[5]).input_ids,
                         "max_tokens": 1},
        "empty-message": {"kind": "chat", "prompt": "", "max_tokens": 12},
        "zero": {"kind": "chat", "prompt": PROMPTS[1], "max_tokens": 0},
        "after-disconnect": {"kind": "chat", "prompt": PROMPTS[0], "max_tokens": 24},
        "after-abort": {"kind": "generate", "ids": tokenizer(PROMPTS[2]).input_ids,
                        "max_tokens": 16},
        "after-500": {"kind": "chat", "prompt": PROMPTS[3], "max_tokens": 16},
        "after-crash": {"kind": "chat", "prompt": PROMPTS[4], "max_tokens": 16},
        "after-weights": {"kind": "generate", "ids": tokenizer(PROMPTS[1]).input_ids,
                          "max_tokens": 24},
        "after-bad": {"kind": "generate", "ids": tokenizer(PROMPTS[0]).input_ids,
                      "max_tokens": 24},
        "unknown-fields": {"kind": "chat", "prompt": PROMPTS[6], "max_tokens": 12,
                           "fields": {"foo_bar": 1, "nested": {"x": [1]}}},
        "unknown-model": {"kind": "chat", "prompt": PROMPTS[6], "max_tokens": 12,
                          "fields": {"model": "gpt-17"}},
    })
    return jobs


def all_jobs(tokenizer) -> dict[str, dict]:
    jobs = {f"load/{i}": j for i, j in enumerate(load_jobs(tokenizer))}
    jobs.update({f"burst/{i}": j for i, j in enumerate(burst_jobs(tokenizer))})
    jobs["tail"] = tail_job(tokenizer)
    jobs.update(other_jobs(tokenizer))
    return jobs


def run(url: str, job: dict, headers: dict | None = None) -> dict:
    """The job's result, normalised: /generate -> ids, text, finish (+ meta);
    chat -> content, finish_reason, completion_tokens (+ chunks when streamed)."""
    if job["kind"] == "generate":
        params = {k: job[k] for k in ("stop", "ignore_eos") if k in job}
        out = generate(url, job["ids"], job["max_tokens"], headers, **params)
        return {"ids": out["output_ids"], "text": out["text"],
                "finish": out["meta_info"]["finish_reason"]["type"], "meta": out["meta_info"]}
    fields = dict(job.get("fields", {}))
    if "stop" in job:
        fields["stop"] = job["stop"]
    return chat(url, job["prompt"], job["max_tokens"], headers, stream=job["kind"] == "stream",
                **fields)


def comparable(result: dict) -> dict:
    """What must equal the reference: everything but per-server statistics."""
    return {k: v for k, v in result.items() if k not in ("meta", "chunks")}
