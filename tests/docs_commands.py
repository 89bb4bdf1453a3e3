"""The commands the README and docs/ show, found the way a reader finds
them (tests/test_docs_commands.py runs or accounts for each).

A command is every line of a fenced block marked ``bash``, ``sh``,
``shell`` or ``console``, or unmarked (continued lines joined, comment and
empty lines left out), and every inline code span that starts like a
command: ``.venv/bin/...`` with arguments, a script path with arguments,
``timeout``, ``bash``, ``source``,
``rm``, ``export``, ``kubectl``, ``docker``, an ``OUT=``-style assignment
followed by a command; ``python -m`` and ``ray`` spans count only with an
option (``-x``), so that naming a command in prose (`python -m jobs
trace`) is not an example. docs/results/ is left out: dated records of runs
on the GPU machines, each with its date and machine, not examples.

Every command writes only into git-ignored or temporary places
(:func:`left_behind` finds what one left in a scratch directory standing for
the clone; :func:`untracked` what git lists untracked in this checkout).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = ("README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")))
SHELL_BLOCKS = ("bash", "sh", "shell", "console", "")
ALWAYS = re.compile(r"^(\.venv/bin/\S+ |scripts/\S+ |timeout |bash |source |rm |export |"
                    r"kubectl |docker |mkdir |ls |\./)")
WITH_OPTION = re.compile(r"^(python3? -m |ray )")
ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*\s+")


@dataclass(frozen=True)
class DocCommand:
    doc: str
    line: int
    text: str


def is_command(span: str) -> bool:
    """Whether an inline code span is a command shown (see the module doc)."""
    rest = span
    while ASSIGNMENT.match(rest):
        rest = ASSIGNMENT.sub("", rest, count=1)
    if rest is not span and rest:
        return True  # NAME=value command
    if ALWAYS.match(rest):
        return True
    return bool(WITH_OPTION.match(rest)) and any(w.startswith("-") for w in rest.split()[2:])


def commands(doc: str, text: str | None = None) -> list[DocCommand]:
    """The commands of ``doc`` (a path relative to the repo), in order."""
    text = (REPO / doc).read_text() if text is None else text
    found = []
    blocks = list(re.finditer(r"^[ \t]*```([A-Za-z]*)\n(.*?)^[ \t]*```", text, re.S | re.M))
    for block in blocks:
        if block.group(1) not in SHELL_BLOCKS:
            continue
        first = text.count("\n", 0, block.start(2)) + 1
        lines = block.group(2).split("\n")
        i = 0
        while i < len(lines):
            start, line = i, lines[i]
            while line.endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line[:-1].rstrip() + " " + lines[i].strip()
            i += 1
            if line.strip() and not line.lstrip().startswith("#"):
                found.append(DocCommand(doc, first + start, line.strip()))
    prose = text
    for block in reversed(blocks):  # keep line numbers: blank the blocks out
        prose = prose[:block.start()] + "\n" * block.group(0).count("\n") + prose[block.end():]
    for span in re.finditer(r"`([^`\n]+)`", prose):
        if is_command(span.group(1)):
            found.append(DocCommand(doc, prose.count("\n", 0, span.start()) + 1, span.group(1)))
    return found


def all_commands() -> list[DocCommand]:
    return [c for doc in DOCS for c in commands(doc)]


NOT_THE_CLONE = (".venv", "docs", "scripts", "home")
"""Top-level names of a scratch root that are not the clone's own outputs:
the links to this environment and to the checkout's docs/ and scripts/
(written through only into this checkout, which :func:`untracked` watches)
and the HOME the commands get."""


def left_behind(root: Path, skip: tuple[str, ...] = NOT_THE_CLONE) -> list[str]:
    """The files (and links) under ``root``, a scratch directory standing
    for the repo root, that git would list untracked in a clone: not under
    an ignore pattern of this checkout's .gitignore (or tracked paths
    overwritten), as paths relative to ``root``; ``skip``: top-level names
    that are not the clone's."""
    made = []
    for where, dirs, files in os.walk(root):
        rel = Path(where).relative_to(root)
        if rel == Path("."):
            dirs[:] = [d for d in dirs if d not in skip]
            files = [f for f in files if f not in skip]
        made += [(rel / name).as_posix() for name in files]
        made += [(rel / name).as_posix() for name in dirs if (Path(where) / name).is_symlink()]
    if not made:
        return []
    check = subprocess.run(["git", "-C", str(REPO), "check-ignore", "--stdin"],
                           input="\n".join(made) + "\n", capture_output=True, text=True)
    assert check.returncode in (0, 1), check.stderr  # 1: none ignored
    return sorted(set(made) - set(check.stdout.splitlines()))


def untracked(*paths: str) -> set[str]:
    """``git status --porcelain --untracked-files=all`` lines of this
    checkout (limited to ``paths``): compared before and after a command
    that reaches the checkout (through a scratch root's docs/ or scripts/
    links)."""
    return set(subprocess.run(["git", "-C", str(REPO), "status", "--porcelain",
                               "--untracked-files=all", "--", *paths], check=True,
                              capture_output=True, text=True).stdout.splitlines())
