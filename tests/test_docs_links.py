"""Every repo path the README and docs/ cite exists, and none of them
points outside the repo (a clone has nothing else).

Read: README.md and every ``.md`` under docs/ except docs/results/data/
(result datasets, not prose). A *repo path* is found three ways:

- a markdown link's target (``[text](target)``), relative to the citing
  file, its ``#anchor`` cut off (an anchor into a repo ``.md``, or into the
  citing file itself, must name one of its headings, as GitHub spells
  them); web links are left alone;
- anywhere in the text, code spans and blocks included, a path that starts
  with a top-level entry the repo tracks (``jobs/suites/smoke.toml``,
  ``scripts/gpu/suite.sh``, ``pyproject.toml``), resolved from the repo
  root; a trailing ``:line`` is cut off, ``*`` globs, ``<placeholder>``
  parts and ``{a,b}`` alternatives must match at least one path;
- nothing else: names of files the project writes (``results/``,
  ``site/``) and paths on other machines (``/tmp/...``) are not repo paths.

Outside the repo: a link or path that climbs out of it (``../`` landing
outside), or any mention of the design notes that used to live outside it
(``DESIGN.md``; docs/design.md is the design now) or of the GPU machine's
own tools (``gpu-machine/``).

docs/results/ holds dated records of runs, each true of its commit: a
record's staging line may name the GPU machine's wheel staging
(``STAGING_OUTSIDE``), and a record may cite a path as it was then
(``HISTORICAL``, each with why it is not in the tree); nothing else is let
through.
"""

from __future__ import annotations

import glob
import itertools
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RECORDS = "docs/results/"
SKIP = "docs/results/data/"
OUTSIDE = re.compile(r"DESIGN\.md|gpu-machine/")
"""Text that names something outside the repo, wherever it appears: the design
notes that used to live outside it (docs/design.md is the design now) and the
GPU machine's own tools."""
CLIMB = re.compile(r"(?<![\w./])(?:\.\./)+[^\s`'\"()\[\]|,;]*")
"""A relative path that climbs (``../``), read from the citing file's folder:
outside the repo, or a repo path that must exist."""
STAGING_OUTSIDE = re.compile(r"(?:/work/shared/|\.\./shared/|(?<![\w/]))gpu-machine/stage-wheels")
"""The GPU machine's wheel staging, named by the dated run records of docs/results/
(what was run, then); cut out of a record's text before the outside check."""
HISTORICAL = {
    ("docs/results/service_h200x2_2026-11-30.md", "cluster/measure/workloads/indexer.py"):
        "the module whose name the fix this record describes changed (aae9e07: now "
        "cluster/measure/workloads/projection.py)",
    ("docs/results/service_h200x2_2026-12-01.md", "scripts/gpu/consume_ab.sh"):
        "the A/B script of branch wip/early-consume (905410f), which the record measures; "
        "never on main",
}
"""Paths a dated record of docs/results/ cites as they were then, with why they
are not in the tree (a record says what ran; it is not rewritten)."""
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
TRAIL = ".,;:)`'\""


def doc_files(root: Path = REPO) -> list[str]:
    """README.md and the docs/ markdown files the check reads, repo-relative."""
    docs = sorted(str(p.relative_to(root)) for p in (root / "docs").rglob("*.md"))
    return ["README.md", *(d for d in docs if not d.startswith(SKIP))]


def top_entries(root: Path = REPO) -> set[str]:
    """Top-level names the repo tracks (git), else those on disk but dot names."""
    try:
        out = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True,
                             check=True).stdout
        tops = {line.split("/")[0] for line in out.splitlines() if line}
    except (OSError, subprocess.CalledProcessError):
        tops = set()
    return tops or {p.name for p in root.iterdir() if not p.name.startswith(".")}


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", path.read_text(), re.M)}


def expand(pattern: str) -> list[str]:
    """``{a,b}`` alternatives of a cited path, ``<x>`` parts as ``*``."""
    pattern = re.sub(r"<[^>]*>", "*", pattern)
    parts = re.split(r"\{([^{}]*)\}", pattern)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def exists(path: Path) -> bool:
    text = str(path)
    if any(ch in text for ch in "*?["):
        return bool(glob.glob(text))
    return path.exists()


def defines(path: Path, symbol: str) -> bool:
    """Whether the Python file ``path`` defines ``symbol``'s last part (a
    ``def``, a ``class`` or an assignment: ``Class.method`` is read as
    ``method``)."""
    if not re.fullmatch(r"[A-Za-z_][\w.]*", symbol) or path.suffix != ".py" or not path.is_file():
        return True  # not a symbol citation (e.g. a port, a URL's tail)
    name = re.escape(symbol.rsplit(".", 1)[-1])
    return re.search(rf"^\s*(?:(?:async\s+)?def|class)\s+{name}\b|^\s*{name}\s*[:=]",
                     path.read_text(), re.M) is not None


def broken(root: Path = REPO, docs: list[str] | None = None) -> list[str]:
    """``doc:line: what`` for every cited repo path that is not there and every
    reference outside the repo, in the order the docs cite them."""
    tops = top_entries(root)
    names = "|".join(re.escape(t) for t in sorted(tops, key=len, reverse=True))
    repo_path = re.compile(rf"(?<![\w./$~-])(?:{names})"
                           rf"(?:/(?:\{{[^}}\s]*\}}|[^\s`'\"()\[\]|,;{{])*)?(?![\w-])")
    bad = []
    for doc in docs if docs is not None else doc_files(root):
        text = (root / doc).read_text()
        here = (root / doc).parent
        for number, line in enumerate(text.splitlines(), 1):
            where = f"{doc}:{number}"
            checked = STAGING_OUTSIDE.sub("", line) if doc.startswith(RECORDS) else line
            for m in OUTSIDE.finditer(checked):
                bad.append(f"{where}: cites something outside the repo ({m.group(0)!r}): "
                           f"{line.strip()[:120]}")
            links = [m.span(1) for m in LINK.finditer(checked)]
            for m in CLIMB.finditer(checked):
                if any(a <= m.start() < b for a, b in links):
                    continue  # checked as a link below
                cited = m.group(0).rstrip(TRAIL)
                if not (here / cited).resolve().is_relative_to(root.resolve()):
                    bad.append(f"{where}: cites a path outside the repo: {cited}")
                elif not any(exists(here / p) for p in expand(cited)):
                    bad.append(f"{where}: cites a missing repo path: {cited}")
            for m in LINK.finditer(checked):
                target = m.group(1)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue  # a web link
                if target.startswith("#"):
                    if target[1:] not in anchors(root / doc):
                        bad.append(f"{where}: link to a missing heading: {target}")
                    continue
                file, _, anchor = target.partition("#")
                resolved = (here / file).resolve()
                if not resolved.is_relative_to(root.resolve()):
                    bad.append(f"{where}: link outside the repo: {target}")
                elif not resolved.exists():
                    bad.append(f"{where}: link to a missing path: {target}")
                elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                    bad.append(f"{where}: link to a missing heading: {target}")
            for m in repo_path.finditer(checked):
                if any(a <= m.start() < b for a, b in links):
                    continue  # checked as a link
                cited = re.sub(r"::.*$|:\d.*$", "", m.group(0).rstrip(TRAIL)).rstrip(TRAIL)
                cited, _, symbol = cited.partition(":")  # `file.py:Class.method`: both checked
                if (cited in tops or "/" in cited) and (doc, cited) not in HISTORICAL:
                    if not any(exists(root / p) for p in expand(cited)):
                        bad.append(f"{where}: cites a missing repo path: {cited}")
                    elif symbol and not defines(root / cited, symbol):
                        bad.append(f"{where}: cites {symbol}, which {cited} does not define")
    return bad


def test_every_cited_repo_path_exists_and_none_is_outside():
    found = broken()
    assert not found, ("README.md / docs/ cite paths that are not in the repo (fix the path, "
                       "or the doc):\n  " + "\n  ".join(found))


def test_the_check_finds_broken_links_and_outside_references(tmp_path):
    """The check itself, on a planted repo: a missing link target, missing
    headings (here and in another file), a missing backticked path and one in a code block, a path out
    of the repo, DESIGN.md, a link out of the repo and, from docs/, a ``../``
    path that stays inside but is missing are each reported, in order; the
    good ones (links to a heading here and in another file, a path, a glob,
    a ``{a,b}`` alternative, a pytest node id, a ``../`` that stays inside)
    are not."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "jobs" / "suites").mkdir(parents=True)
    (tmp_path / "jobs" / "suites" / "smoke.toml").write_text("")
    (tmp_path / "docs" / "design.md").write_text("# Design\n\n## Numerical contract\n"
                                                 "[readme](../README.md) ../shared/DESIGN\n")
    (tmp_path / "README.md").write_text(
        "# Top\n[ok](docs/design.md#numerical-contract) `jobs/suites/smoke.toml` [up](#top)\n"
        "`jobs/{suites,tables}/smoke.toml` `jobs/suites/smoke.toml::test_x` `jobs/suites/*.toml`\n"
        "[gone](docs/gone.md) [down](#bottom) [no heading](docs/design.md#nowhere) "
        "`jobs/suites/nightly.toml`\n"
        "```bash\nbash jobs/run.sh --x\n```\n"
        "`../shared/notes.md` see DESIGN.md\n[out](../shared/design.md)\n"
        "`jobs/cli.py:main` `jobs/cli.py:Gone.nowhere`\n")
    (tmp_path / "jobs" / "cli.py").write_text("def main():\n    pass\n")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "."], cwd=tmp_path, check=True)
    found = broken(tmp_path, ["README.md", "docs/design.md"])
    assert [f.split(": ", 1)[1] for f in found] == [
        "link to a missing path: docs/gone.md",
        "link to a missing heading: #bottom",
        "link to a missing heading: docs/design.md#nowhere",
        "cites a missing repo path: jobs/suites/nightly.toml",
        "cites a missing repo path: jobs/run.sh",
        "cites something outside the repo ('DESIGN.md'): `../shared/notes.md` see DESIGN.md",
        "cites a path outside the repo: ../shared/notes.md",
        "link outside the repo: ../shared/design.md",
        "cites Gone.nowhere, which jobs/cli.py does not define",
        "cites a missing repo path: ../shared/DESIGN"], found
    assert [f.split(": ", 1)[0] for f in found] == [
        *["README.md:4"] * 4, "README.md:6", "README.md:8", "README.md:8", "README.md:9",
        "README.md:10", "docs/design.md:4"], found


@pytest.mark.parametrize("heading, anchor", [("Numerical contract", "numerical-contract"),
                                             ("The `kernels/` layer", "the-kernels-layer"),
                                             ("Hang detection (layers)", "hang-detection-layers")])
def test_slug_spells_anchors_as_github_does(heading, anchor):
    assert slug(heading) == anchor
