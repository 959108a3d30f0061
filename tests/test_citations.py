"""Every repository path cited in ``src/``, ``docs/``, ``README.md`` and ``benchmarks/`` notes exists.

What counts as a citation (found by :func:`citations`):

* a path starting at a repository root folder: ``benchmarks/...``, ``docs/...``, ``src/...``, ``tests/...``,
  ``.ci/...``; ``results/...`` is relative to ``benchmarks/`` (how the notes and a few docs cite result files);
* in ``benchmarks/notes/*.md`` also a result path relative to ``benchmarks/results/`` (``h100/reduce.json``,
  ``{h100,h200}/rope.json``: the notes say so in their header);
* a Markdown link target ``[text](target)`` of a ``.md`` file, relative to that file (web links left out).

A ``.md`` path followed by ``#anchor`` must have a heading of that anchor (GitHub's: lower case, punctuation dropped,
spaces as hyphens). Patterns: ``{a,b}`` expands to both paths, each of which must exist; ``*`` and a placeholder such
as ``<gpu>``, ``<op>`` or ``<path>`` match any name, and at least one path must match. A path written ``./x`` is a
location under the user's working directory (where a command writes), not a citation. A path that is not in the tree
passes when the same paragraph names a commit (``at 61b067d``, ``git show 61b067d:...``) at which it exists:
evidence that left the tree and stays readable in git history. Each dangling citation is reported as
``file:line: path``.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: roots a citation may start at, and the folder each is relative to
ROOTS = {"benchmarks": "", "docs": "", "src": "", "tests": "", ".ci": "", "results": "benchmarks"}
#: in the notes, result paths relative to ``benchmarks/results``
NOTE_RESULT_ROOTS = ("h100", "h200", "h100x2", "h200x2", "synth", "cpu")
PATH_CHARS = r"(?:<[^<>\n]*>|[\w.*{},/-])"
_PATH = re.compile(rf"(?<![\w./<>-])(\./)?((?:{'|'.join(map(re.escape, ROOTS))})/{PATH_CHARS}*)(?:#([\w-]+))?")
_NOTE_PATH = re.compile(rf"(?<![\w./<>-])((?:{'|'.join(NOTE_RESULT_ROOTS)}|\{{[\w,]+\}})/{PATH_CHARS}+)")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_COMMIT = re.compile(r"(?<![\w/.-])([0-9a-f]{7,40})(?![\w/-])")


@dataclass(frozen=True)
class Citation:
    file: Path
    line: int
    path: str  # relative to the repository root, possibly with {a,b}, * and <placeholder>
    commits: tuple[str, ...]  # commits named in the same paragraph
    anchor: str = ""  # "#section" of a .md path

    def where(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}: {self.path}{'#' + self.anchor if self.anchor else ''}"


def sources() -> list[Path]:
    """The files whose citations are checked."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "benchmarks").glob("*.md")),
             *sorted((ROOT / "benchmarks" / "notes").rglob("*.md"))]
    for suffix in ("*.py", "*.cu", "*.cpp", "*.h", "*.json"):
        files += sorted((ROOT / "src").rglob(suffix))
    archive = ROOT / "benchmarks" / "ARCHIVE.md"  # the index of what left the tree: every path in it is gone
    return [f for f in files if f.is_file() and f != archive]


def _clean(path: str) -> str:
    path = path.rstrip(".,;:")
    while path.endswith(("}", ")")) and path.count("{") < path.count("}"):
        path = path[:-1]
    return path.rstrip(".,;:")


def _paragraphs(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each paragraph: blocks between blank lines, a list item or a table row each."""
    out: list[list] = []  # [first line number, lines]
    fresh = True
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            fresh = True
            continue
        if fresh or stripped.startswith(("- ", "* ", "| ", "#")) or re.match(r"\d+\. ", stripped):
            out.append([number, []])
            fresh = False
        out[-1][1].append(line)
    return [(n, "\n".join(lines)) for n, lines in out]


def citations(file: Path, text: str | None = None) -> list[Citation]:
    """Every citation in ``file`` (``text``: its contents, read when None)."""
    text = file.read_text(encoding="utf-8", errors="replace") if text is None else text
    note = file.parent.name == "notes" and file.suffix == ".md"
    found = []
    for first, block in _paragraphs(text):
        commits = tuple(dict.fromkeys(_COMMIT.findall(block)))
        for offset, line in enumerate(block.splitlines()):
            number = first + offset
            for m in _PATH.finditer(line):
                if m.group(1):  # ./x: where a command writes, under the user's working directory
                    continue
                path = _clean(m.group(2))
                root = path.split("/", 1)[0]
                path = f"{ROOTS[root]}/{path}" if ROOTS[root] else path
                anchor = m.group(3) or "" if path.endswith(".md") else ""
                found.append(Citation(file, number, path.rstrip("/"), commits, anchor))
            if note:
                for m in _NOTE_PATH.finditer(line):
                    found.append(Citation(file, number, "benchmarks/results/" + _clean(m.group(1)).rstrip("/"),
                                          commits))
            if file.suffix == ".md":  # links outside inline code (`kernel[grid](*args)` is code, not a link)
                for m in _LINK.finditer(re.sub(r"`[^`]*`", "", line)):
                    target, _, anchor = m.group(1).partition("#")
                    if re.match(r"[a-z]+:", target):
                        continue
                    resolved = (file.parent / target).resolve() if target else file
                    if resolved.is_relative_to(ROOT):
                        found.append(Citation(file, number, str(resolved.relative_to(ROOT)), commits, anchor))
    return found


def expand(path: str) -> list[str]:
    """``{a,b}`` alternatives expanded (nested and repeated), placeholders ``<x>`` turned into ``*``."""
    path = re.sub(r"<[^<>]*>", "*", path)
    m = re.search(r"\{([^{}]*)\}", path)
    if m is None:
        return [path]
    return [q for alt in m.group(1).split(",") for q in expand(path[: m.start()] + alt + path[m.end():])]


def _glob_tree(pattern: str, names: list[str]) -> bool:
    """Whether ``pattern`` (``*`` allowed) names a file or a folder among ``names`` (the files of a tree)."""
    return any(fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, pattern + "/*") for name in names)


@cache
def tree_files() -> tuple[str, ...]:
    """Every file under the repository root, relative, with ``/`` (virtual environments and caches left out)."""
    skip = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", "node_modules"}
    out = []
    for p in ROOT.rglob("*"):
        rel = p.relative_to(ROOT)
        if skip.intersection(rel.parts) or not p.is_file():
            continue
        out.append(rel.as_posix())
    return tuple(out)


def exists_in_tree(path: str) -> bool:
    alternatives = expand(path)
    for alt in alternatives:
        if "*" in alt:
            if not _glob_tree(alt, list(tree_files())):
                return False
        elif not (ROOT / alt).exists():
            return False
    return True


@cache
def commit_files(commit: str) -> tuple[str, ...] | None:
    """The files of ``commit`` (None when git or the commit is not available)."""
    if shutil.which("git") is None:
        return None
    done = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", commit], capture_output=True,
                          text=True)
    return tuple(done.stdout.splitlines()) if done.returncode == 0 else None


def exists_at(path: str, commit: str) -> bool:
    files = commit_files(commit)
    return files is not None and all(_glob_tree(alt, list(files)) for alt in expand(path))


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def anchors(path: str) -> frozenset[str]:
    """The heading anchors of the Markdown file ``path`` (relative to the root)."""
    text = (ROOT / path).read_text(encoding="utf-8")
    return frozenset(slug(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line))


def dangling(files: list[Path], texts: dict[Path, str] | None = None) -> list[str]:
    """``file:line: path`` of each citation in ``files`` found neither in the tree nor at a commit it names
    (``texts``: contents to use instead of reading a file)."""
    out = []
    for file in files:
        for c in citations(file, (texts or {}).get(file)):
            if exists_in_tree(c.path):
                if not c.anchor or "*" in expand(c.path)[0] or c.anchor in anchors(c.path):
                    continue
                out.append(c.where() + " (no such section)")
                continue
            if any(exists_at(c.path, commit) for commit in c.commits):
                continue
            out.append(c.where() + (f" (not at {', '.join(c.commits)} either)" if c.commits else ""))
    return out


def test_every_cited_path_exists():
    missing = dangling(sources())
    assert not missing, f"{len(missing)} dangling citation(s):\n" + "\n".join(missing)


# -- the checker itself --------------------------------------------------------------------------------------------
def _paths(text: str, name: str = "x.md", folder: Path = ROOT / "docs") -> list[str]:
    return [c.path for c in citations(folder / name, text)]


def test_finds_paths_links_and_results_relative_to_benchmarks():
    text = ("See `benchmarks/notes/lab.md` and results/h100/rope.json, [the lab](lab.md), `f[x](not/a/link)`,\n"
            "written to `./benchmarks/results/cpu` (a user's folder), `src/fuselab/ops/<op>/`.\n")
    assert _paths(text) == ["benchmarks/notes/lab.md", "benchmarks/results/h100/rope.json", "docs/lab.md",
                            "src/fuselab/ops/<op>"]


def test_note_result_paths_and_commits_of_the_paragraph():
    text = "- old (`h100/probes/x.txt`, `{h100,h200}/rope.json` at 61b067d).\n\nnext `h200/y.json`\n"
    found = citations(ROOT / "benchmarks" / "notes" / "n.md", text)
    assert [(c.path, c.commits) for c in found] == [
        ("benchmarks/results/h100/probes/x.txt", ("61b067d",)),
        ("benchmarks/results/{h100,h200}/rope.json", ("61b067d",)),
        ("benchmarks/results/h200/y.json", ())]


def test_patterns_expand_and_must_match():
    assert expand("a/{b,c}/d_{e,f}.md") == ["a/b/d_e.md", "a/b/d_f.md", "a/c/d_e.md", "a/c/d_f.md"]
    assert exists_in_tree("docs/{lab,rope}.md") and exists_in_tree("src/fuselab/ops/<op>/kernels.py")
    assert not exists_in_tree("docs/{lab,no_such_doc}.md")
    assert not exists_in_tree("benchmarks/results/<gpu>/no_such_result_*.json")


def test_a_dangling_citation_is_reported_with_its_line():
    doc = ROOT / "docs" / "probe.md"
    text = "ok `docs/lab.md`\n\ngone `docs/no_such.md`\n\nold `benchmarks/no_such.txt` at 61b067d\n"
    assert dangling([doc], {doc: text}) == ["docs/probe.md:3: docs/no_such.md",
                                            "docs/probe.md:5: benchmarks/no_such.txt (not at 61b067d either)"]


def test_section_anchors_must_name_a_heading():
    doc = ROOT / "docs" / "probe.md"
    text = "`benchmarks/notes/lab.md#what-moves-a-measurement` and [x](lab.md#no-such-section)\n"
    assert slug("The stream bound (`fuselab.bench.stream`)") == "the-stream-bound-fuselabbenchstream"
    assert dangling([doc], {doc: text}) == ["docs/probe.md:1: docs/lab.md#no-such-section (no such section)"]


def test_history_vouches_only_for_a_path_at_the_named_commit():
    if commit_files("61b067d") is None:
        pytest.skip("git or commit 61b067d not available")
    assert exists_at("benchmarks/sweeps/rope_tiles.py", "61b067d")
    assert not exists_at("benchmarks/results/h100/no_such_probe.txt", "61b067d")
