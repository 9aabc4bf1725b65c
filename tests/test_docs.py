"""The docs point at things that exist: every relative link in README.md, docs/*.md and tests/README.md
resolves to a file of the repository (and its #anchor to a heading of that file), and every repository
path or `tandem.*` module the docs name in backticks is there. Pure Python over the files: no processes.

What counts as a repository path (precise enough to have no false positives, strict enough to catch a
moved file):
- a backticked word whose first segment is one of the repository's top-level directories (`bench/chaos.py`,
  `helm/tandem/`, `tests/e2e`): it must exist from the root;
- a section whose heading names a directory in backticks (docs/architecture.md's "### Operator —
  `operator/tandem/operator/`") holds paths relative to that directory: a backticked word there is looked
  up under it first, and one ending in a source extension (`plan.py`, `loop/driver.py`) must exist under
  it or, when it starts with a top-level directory, from the root;
- a dotted `tandem.x.y` name must be a module or package of one of the four roots (operator, sidecars,
  spec, checkpoint_engine), or an attribute defined in one (`tandem.sidecars.toy.build_toy`).
Words under a directory .gitignore names (runs/, examples/toy/) are outputs, not repository files."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_ROOTS = ("operator", "sidecars", "spec", "checkpoint_engine")
SOURCE_EXTENSIONS = (".py", ".sh", ".md", ".yaml", ".yml", ".toml", ".txt", ".json", ".png", ".cfg")

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
DOTTED = re.compile(r"^tandem(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def doc_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "tests" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [f for f in files if f.exists()]


def ignored_prefixes() -> tuple[list[str], set[str]]:
    """.gitignore's directory entries: rooted prefixes (`examples/toy/`) and names ignored at any depth."""
    rooted: list[str] = []
    anywhere: set[str] = set()
    gitignore = ROOT / ".gitignore"
    for line in gitignore.read_text().splitlines() if gitignore.exists() else []:
        entry = line.strip()
        if not entry or entry.startswith("#") or not entry.endswith("/"):
            continue
        name = entry.strip("/")
        if "/" in name:
            rooted.append(name + "/")
        else:
            anywhere.add(name)
    return rooted, anywhere


ROOTED_IGNORED, IGNORED_NAMES = ignored_prefixes()
TOP_DIRS = {
    p.name
    for p in ROOT.iterdir()
    if p.is_dir() and p.name not in IGNORED_NAMES and (not p.name.startswith(".") or p.name == ".ci")
}


@dataclass(frozen=True)
class Line:
    number: int
    text: str
    section_root: Path | None  # the directory the enclosing heading names (docs/architecture.md's tables)


def prose_lines(path: Path) -> Iterator[Line]:
    """The file's lines outside fenced code blocks, each with the directory its section's heading names."""
    in_fence = False
    section_root: Path | None = None
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(text):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        heading = HEADING.match(text)
        if heading:
            section_root = None
            for code in INLINE_CODE.findall(heading.group(2)):
                candidate = code[1].strip()
                if candidate.endswith("/") and (ROOT / candidate).is_dir():
                    section_root = ROOT / candidate
        yield Line(number, text, section_root)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").strip().lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    result: set[str] = set()
    for line in prose_lines(path):
        heading = HEADING.match(line.text)
        if not heading:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    result.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", path.read_text(encoding="utf-8")))
    return result


def relative_links(path: Path) -> Iterator[tuple[int, str]]:
    for line in prose_lines(path):
        text = INLINE_CODE.sub("", line.text)
        for target in LINK.findall(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            yield line.number, target


def link_problem(doc: Path, target: str) -> str | None:
    file_part, _, anchor = target.partition("#")
    resolved = (doc.parent / file_part).resolve() if file_part else doc
    if not resolved.exists():
        return f"{target}: no such file ({resolved.relative_to(ROOT) if resolved.is_relative_to(ROOT) else resolved})"
    if not resolved.is_relative_to(ROOT):
        return f"{target}: outside the repository"
    if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
        return f"{target}: no heading #{anchor} in {resolved.relative_to(ROOT)}"
    return None


def is_ignored(relative: str) -> bool:
    parts = relative.split("/")
    return any(relative.startswith(prefix) for prefix in ROOTED_IGNORED) or any(p in IGNORED_NAMES for p in parts)


def module_path(dotted: str) -> Path | None:
    """`tandem.a.b` as a module or package of one of the roots, or `tandem.a.b.attr` as an attribute of one."""
    parts = dotted.split(".")
    for root in PACKAGE_ROOTS:
        base = ROOT / root
        target = base.joinpath(*parts)
        if target.with_suffix(".py").is_file():
            return target.with_suffix(".py")
        if target.is_dir():
            return target
        parent = base.joinpath(*parts[:-1])
        for module in (parent.with_suffix(".py"), parent / "__init__.py"):
            if module.is_file() and re.search(
                rf"^\s*(?:async\s+def|def|class)\s+{re.escape(parts[-1])}\b|^{re.escape(parts[-1])}\s*[:=]",
                module.read_text(encoding="utf-8"),
                re.MULTILINE,
            ):
                return module
    return None


def resolve(word: str, section_root: Path | None) -> tuple[Path | None, str | None]:
    """What a backticked word names: (the existing path, None), (None, the problem), or (None, None) when
    it is no repository path at all."""
    word = word.strip(".,;:()'\"")
    if not word or word.startswith(("/", "~", "$", "-")) or "<" in word or "*" in word or "://" in word:
        return None, None
    if DOTTED.match(word):
        found = module_path(word)
        return (found, None) if found else (None, f"`{word}`: no such module")
    if section_root is not None and re.fullmatch(r"[\w./-]+", word) and (section_root / word).exists():
        return section_root / word, None
    first = word.split("/", 1)[0]
    if "/" in word and first in TOP_DIRS:
        if is_ignored(word):
            return None, None
        return ((ROOT / word), None) if (ROOT / word).exists() else (None, f"`{word}`: no such path")
    if section_root is not None and word.endswith(SOURCE_EXTENSIONS) and re.fullmatch(r"[\w./-]+", word):
        return None, f"`{word}`: not under {section_root.relative_to(ROOT)}/"
    return None, None


def word_problem(word: str, section_root: Path | None) -> str | None:
    return resolve(word, section_root)[1]


def named_paths(path: Path) -> Iterator[tuple[int, str, Path | None]]:
    for line in prose_lines(path):
        for code in INLINE_CODE.findall(line.text):
            for word in code[1].split():
                yield line.number, word, line.section_root


DOCS = doc_files()


def test_the_docs_exist() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in DOCS}
    assert {"README.md", "tests/README.md", "docs/architecture.md"} <= names


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(doc: Path) -> None:
    problems = [f"{doc.relative_to(ROOT)}:{n}: {p}" for n, t in relative_links(doc) if (p := link_problem(doc, t))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_named_paths_exist(doc: Path) -> None:
    problems = [f"{doc.relative_to(ROOT)}:{n}: {p}" for n, w, r in named_paths(doc) if (p := word_problem(w, r))]
    assert not problems, "\n".join(problems)


def test_the_map_names_every_package() -> None:
    """docs/architecture.md names every package of the four roots (itself, or a module in it)."""
    named = {
        found.resolve()
        for _, word, root in named_paths(ROOT / "docs" / "architecture.md")
        if (found := resolve(word, root)[0]) is not None
    }
    packages = sorted(
        init.parent
        for root in PACKAGE_ROOTS
        for init in (ROOT / root / "tandem").rglob("__init__.py")
        if "__pycache__" not in init.parts
    )
    missing = [
        p.relative_to(ROOT).as_posix()
        for p in packages
        if not any(n == p.resolve() or n.is_relative_to(p.resolve()) for n in named)
    ]
    assert not missing, f"packages docs/architecture.md does not name: {missing}"


def test_every_guide_is_linked_from_the_readme() -> None:
    readme = ROOT / "README.md"
    linked = {(readme.parent / t.partition("#")[0]).resolve() for _, t in relative_links(readme)}
    unlinked = [p.relative_to(ROOT).as_posix() for p in DOCS if p != readme and p.resolve() not in linked]
    assert not unlinked, f"guides the README does not link: {unlinked}"


def test_the_checker_catches_what_it_should() -> None:
    """The detection itself: stale paths and modules are caught, prose and other URIs' paths are not."""
    assert word_problem("bench/chaos.py", None) is None
    assert word_problem("bench/no_such_bench.py", None)
    assert word_problem("tandem.spec.no_such_module", None)
    assert word_problem("tandem.spec", None) is None
    assert word_problem("runs/smollm2-grpo/metrics.jsonl", None) is None  # an output (.gitignore)
    assert word_problem("nvidia.com/gpu", None) is None
    assert word_problem("/dev/shm/tandem-default-job", None) is None
    assert word_problem("no_such.py", ROOT / "bench")
    assert word_problem("chaos.py", ROOT / "bench") is None
    assert slug("Sidecars — `sidecars/tandem/sidecars/`") == "sidecars--sidecarstandemsidecars"
    assert slug("What survives what") == "what-survives-what"
