"""A temporary git repository made from this checkout for ``jobs bisect``
(tests/test_jobs_bisect.py, docs/results/bisect_cpu_2026-12-01.md): a base
commit (the project as it is here), then ``COMMITS`` commits, each touching
a notes file; one of them also slows all_reduce_norm down (its emulated
epilogue by ``SLOWDOWN_S`` a call, its GPU rank's publish by a
``GPU_SLEEP_CYCLES`` spin on the GPU, so the same repository serves a
latency bisect on either backend: ``LATENCY_KEY``, ``GPU_LATENCY_KEY``),
another makes embed_norm's emulated epilogue produce one wrong element.

    python -m tests.bisect_repo DEST [COMMITS]   # prints the commits as JSON
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMITS = 10
SLOW_AT = 4
"""1-based: the 4th commit after the base injects the slowdown."""
WRONG_AT = 8
"""1-based: the 8th commit makes embed_norm's element wrong. A bisect of the
ten commits (``jobs bisect``, one probe a step) tries five of them to find
it here, where at the 7th it tried six (each a cold run: a driver and its
ranks' processes, the costliest part of tests/test_jobs_bisect.py)."""
SLOWDOWN_S = 0.1
"""Well above the machine's noise: with the README's test command beside a
one-core busy loop and the test's own, good's 2 ms calls measured 20-33 ms
with a MAD sigma up to 9 ms, and a 20 ms slowdown was judged ok there."""

LATENCY_KEY = ("correctness|all_reduce_norm|watchdog|unicast|emulated|2|1024|3|None|None|"
               "bfloat16|random|None|None|")
GPU_SLEEP_CYCLES = 2_000_000
"""About 1 ms at an H200's 1.98 GHz: several times a tp=1 call's host-timed
publish + consume (0.4 ms)."""
GPU_LATENCY_KEY = ("correctness|all_reduce_norm|watchdog|unicast|process-per-gpu|1|7168|8|None|"
                   "None|bfloat16|random|None|None|mode=one_shot")
"""A case of the nightly suite (its parameters and repeats come from there)."""
WRONG_KEY = ("correctness|embed_norm|watchdog|unicast|emulated|2|1024|5|None|None|bfloat16|"
             "random|None|None|")

_SLOW = ('def epilogue(case, inputs: dict, reduced, rank: int) -> dict:\n'
         '    return norm_epilogue(case, inputs, reduced, rank)\n',
         'def epilogue(case, inputs: dict, reduced, rank: int) -> dict:\n'
         '    import time\n'
         f'    time.sleep({SLOWDOWN_S})  # "prefetch the weights" (the injected slowdown)\n'
         '    return norm_epilogue(case, inputs, reduced, rank)\n')
_SLOW_GPU = ('    def publish(self) -> None:\n'
             '        self.kernel.publish(self.xd)\n',
             '    def publish(self) -> None:\n'
             '        import torch\n'
             f'        torch.cuda._sleep({GPU_SLEEP_CYCLES})  # the injected slowdown, on the GPU\n'
             '        self.kernel.publish(self.xd)\n')
_WRONG = ('    return {"sum": reduced, "embedding": rms_norm(embedding, inputs["enorm"], '
          'case.eps),\n',
          '    embedded = rms_norm(embedding, inputs["enorm"], case.eps).clone()\n'
          '    embedded[0, 0] = embedded[0, 0] * 2 + 1  # the injected wrong element\n'
          '    return {"sum": reduced, "embedding": embedded,\n')


def _git(repo: Path, *argv: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *argv], check=True, capture_output=True,
                          text=True).stdout.strip()


def _edit(path: Path, old_new: tuple[str, str]) -> None:
    text = path.read_text()
    old, new = old_new
    if old not in text:
        raise RuntimeError(f"{path}: the line to change is not there any more: {old!r}")
    path.write_text(text.replace(old, new, 1))


def make_repo(dest: Path, commits: int = COMMITS) -> dict:
    """Build the repository at ``dest`` (new) with ``commits`` commits after
    the base (at least ``SLOW_AT``); returns its commits: ``base``,
    ``commits`` (oldest first), ``slow`` and ``wrong`` (the injecting ones;
    ``wrong`` only when there are ``WRONG_AT`` commits or more)."""
    if not isinstance(commits, int) or commits < SLOW_AT:
        raise ValueError(f"commits must be an int >= {SLOW_AT} (the slow one), got {commits!r}")
    dest = Path(dest)
    dest.mkdir(parents=True)
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], check=True, capture_output=True,
                           text=True).stdout.split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file() and not name.startswith("docs/results/data/"):
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    _git(dest, "init", "-q", "-b", "main")
    for k, v in (("user.name", "bisect test"), ("user.email", "bisect@example.invalid"),
                 ("commit.gpgsign", "false")):
        _git(dest, "config", k, v)
    _git(dest, "add", "-A")
    _git(dest, "commit", "-q", "-m", "base: the project as it is")
    out = {"base": _git(dest, "rev-parse", "HEAD"), "commits": []}
    notes = dest / "NOTES.txt"
    for i in range(1, commits + 1):
        notes.write_text((notes.read_text() if notes.exists() else "") + f"note {i}\n")
        message = f"note {i}"
        if i == SLOW_AT:
            _edit(dest / "cluster/ops/all_reduce_norm.py", _SLOW)
            _edit(dest / "cluster/ops/all_reduce_norm.py", _SLOW_GPU)
            message += ": all_reduce_norm prefetches its weights"
        if i == WRONG_AT:
            _edit(dest / "cluster/ops/embed_norm.py", _WRONG)
            message += ": embed_norm scales its first element"
        _git(dest, "add", "-A")
        _git(dest, "commit", "-q", "-m", message)
        sha = _git(dest, "rev-parse", "HEAD")
        out["commits"].append(sha)
        if i == SLOW_AT:
            out["slow"] = sha
        if i == WRONG_AT:
            out["wrong"] = sha
    return out


if __name__ == "__main__":
    print(json.dumps(make_repo(Path(sys.argv[1]), *map(int, sys.argv[2:3])), indent=1))
