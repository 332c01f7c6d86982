"""Every path to a result file and every relative markdown link in the docs points at a file in
the repository (in-process, reads tracked text files only)."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A result path as the docs, docstrings and comments write it; it ends at a space, ), `, ', " or
# a markdown bracket.
RESULT_PATH = re.compile(r"(?:benchmarks|docs)/results/[^ )`'\"\[\]]+")
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target)
TEXT = {".md", ".py", ".txt", ".toml", ".cfg", ".yaml", ".yml", ".sh", ".ini"}


def tracked() -> list[Path]:
    """Tracked text files outside the result folders themselves (their outputs quote commands)."""
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    return [ROOT / n for n in names
            if (Path(n).suffix in TEXT or Path(n).name == "Makefile")
            and not n.startswith(("benchmarks/results/", "docs/results/"))
            and (ROOT / n).is_file()]


def expand(path: str) -> list[str]:
    """A path with one {a,b} group as its alternatives, else the path itself."""
    m = re.search(r"\{([^}]*)\}", path)
    if not m:
        return [path]
    return [path[:m.start()] + alt + path[m.end():] for alt in m.group(1).split(",")]


def exists(path: Path) -> bool:
    """The path; for an output template (`<out>.json`) its folder; for a glob at least one
    file it matches."""
    if "<" in str(path):
        return path.parent.is_dir()
    if "*" in str(path):
        return any(ROOT.glob(str(path.relative_to(ROOT))))
    return path.exists()


def test_result_paths_exist() -> None:
    missing = []
    for f in tracked():
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            for m in RESULT_PATH.finditer(line):
                raw = m.group(0).rstrip(".,;:")
                if any(not exists(ROOT / p) for p in expand(raw)):
                    missing.append(f"{f.relative_to(ROOT)}:{n}: {raw}")
    assert not missing, "result paths naming no file:\n" + "\n".join(missing)


def test_markdown_links_resolve() -> None:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    docs += sorted((ROOT / "domino_sglang" / "drafters").rglob("README.md"))
    broken = []
    for f in docs:
        if f.is_relative_to(ROOT / "docs" / "results") and f.name != "README.md":
            continue  # recorded outputs, not narratives
        for n, line in enumerate(f.read_text().splitlines(), 1):
            for m in LINK.finditer(line):
                target = m.group(1).split("#")[0]
                if not target or re.match(r"[a-z]+:", target):  # anchors, http:, mailto:
                    continue
                if not (f.parent / target).exists():
                    broken.append(f"{f.relative_to(ROOT)}:{n}: {m.group(1)}")
    assert not broken, "markdown links to no file:\n" + "\n".join(broken)
