"""Every kept result file is cited: docs/results/ and benchmarks/results/ hold the outputs the
documentation stands on, not a lab notebook (in-process, stdlib only, reads `git ls-files`).

The rule. A result file (any tracked file under docs/results/ or benchmarks/results/) is kept
when
  - a tracked text file outside the result folders cites it: names its repository path (as
    tests/project/test_doc_links.RESULT_PATH finds it; a `{a,b}` group and a `*` glob expand, an
    output template such as `benchmarks/results/<out>.json` cites nothing) or links to it in
    markdown (relative to the linking file); a path or link to a result folder cites that folder's
    README.md; or
  - it is a companion of a kept markdown result in the same folder: that .md names it (its file
    name, a markdown link or image, or a `*` pattern of file names such as `cpu_60s_*`). A .json
    or .png beside a kept .md with the same stem is not kept for that alone.
The folder indexes (a README.md directly under either result folder) need no citation and keep
nothing: they list what is kept. That every cited result path exists is
tests/project/test_doc_links.py's test_result_paths_exist.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
import subprocess
from pathlib import Path

import pytest

from tests.project.test_doc_links import LINK, RESULT_PATH, TEXT, expand

ROOT = Path(__file__).resolve().parents[2]
RESULT_DIRS = ("docs/results/", "benchmarks/results/")
INDEXES = {d + "README.md" for d in RESULT_DIRS}
PATTERN = re.compile(r"[\w.-]*\*[\w.*-]*")  # a file-name pattern in a result's text: cpu_60s_*


def _cited_paths(source: str, text: str, folders: set[str]) -> set[str]:
    """The result paths (or `*` patterns of them) one source file cites."""
    refs = set()
    for line in text.splitlines():
        for m in RESULT_PATH.finditer(line):
            refs.update(p for p in expand(m.group(0).rstrip(".,;:")) if "<" not in p)
    if source.endswith(".md"):
        for m in LINK.finditer(text):
            target = m.group(1).split("#")[0]
            if target and not re.match(r"[a-z]+:", target):
                refs.add(posixpath.normpath(posixpath.join(posixpath.dirname(source), target)))
    # a folder cites its README.md
    return {f"{r.rstrip('/')}/README.md" if r.rstrip("/") in folders else r for r in refs}


def _names(text: str, siblings: list[str]) -> set[str]:
    """The sibling file names a result's text names: whole, or through a `*` pattern."""
    patterns = PATTERN.findall(text)
    return {s for s in siblings
            if re.search(rf"(?<![\w.-]){re.escape(s)}(?![\w-]|\.\w)", text)
            or any(fnmatch.fnmatchcase(s, p) for p in patterns)}


def uncited(root: Path, names: list[str]) -> list[str]:
    """The tracked result files that the rule above does not keep, sorted. `names` are the
    tracked paths relative to `root` (as `git ls-files` prints them)."""
    files = [n for n in names if (root / n).is_file()]
    results = {n for n in files if n.startswith(RESULT_DIRS) and n not in INDEXES}
    folders = {posixpath.dirname(n) for n in results} | {d.rstrip("/") for d in RESULT_DIRS}
    kept = set()
    for n in files:
        if n.startswith(RESULT_DIRS) or not (Path(n).suffix in TEXT or Path(n).name == "Makefile"):
            continue
        for ref in _cited_paths(n, (root / n).read_text(errors="replace"), folders):
            kept |= {r for r in results if r == ref or ("*" in ref and fnmatch.fnmatchcase(r, ref))}
    todo = [k for k in kept if k.endswith(".md")]
    while todo:  # companions, named by a kept .md of their folder (which may name further .md)
        md = todo.pop()
        folder = posixpath.dirname(md)
        siblings = {posixpath.basename(r): r for r in results
                    if posixpath.dirname(r) == folder and r not in kept}
        for name in _names((root / md).read_text(errors="replace"), list(siblings)):
            kept.add(siblings[name])
            if name.endswith(".md"):
                todo.append(siblings[name])
    return sorted(results - kept)


def tracked(root: Path) -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return out.splitlines()


def test_every_result_file_is_cited() -> None:
    left = uncited(ROOT, tracked(ROOT))
    assert not left, ("result files no doc cites (cite them where they are used, or git rm "
                      "them; git keeps them):\n" + "\n".join(left))


def test_the_check_reports_a_planted_uncited_result(tmp_path: Path) -> None:
    # DOCRES / BENCHRES stand for the two result folders, so that this file cites no result
    tree = {
        "README.md": "Load test: [runs](BENCHRES/run/).\n",
        "docs/guide.md": "See [table](results/kept.md) and `BENCHRES/{a,b}.md`.\n",
        "DOCRES/README.md": "- x.md\n- kept.md\n",  # an index keeps nothing
        "DOCRES/kept.md": "![plot](kept.png)\n",
        "DOCRES/kept.png": "png",
        "DOCRES/kept.json": "{}",  # same stem as a kept .md, named by nothing
        "DOCRES/x.md": "nobody cites this; it cites `DOCRES/y.md`\n",
        "DOCRES/y.md": "cited only from inside the result folder\n",
        "BENCHRES/a.md": "", "BENCHRES/b.md": "",
        "BENCHRES/run/README.md": "summaries `run_1_*`, then `run_2.log`.\n",
        "BENCHRES/run/run_1_stats.csv": "", "BENCHRES/run/run_2.log": "",
        "BENCHRES/run/run_3.log": "",
        "benchmarks/tool.py": '"""Writes BENCHRES/<out>.json."""\n',
    }

    def real(text: str) -> str:
        return text.replace("DOCRES", RESULT_DIRS[0][:-1]).replace("BENCHRES", RESULT_DIRS[1][:-1])

    for name, text in tree.items():
        (tmp_path / real(name)).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / real(name)).write_text(real(text))
    assert uncited(tmp_path, [real(n) for n in tree]) == [real(n) for n in [
        "BENCHRES/run/run_3.log", "DOCRES/kept.json", "DOCRES/x.md", "DOCRES/y.md"]]
