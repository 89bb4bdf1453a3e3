"""Which compile-check variants' PTX a change touches, without a GPU.

    python scripts/ptx_diff.py [REF] [--ops indexer] [--arch sm_90a] [--hidden N,M] [--tp N,M]
                               [--expect-identical]

Compiles every ``jobs compile-check`` variant of ``--ops`` for ``--arch``
(at ``--hidden`` and ``--tp`` where given, else compile-check's defaults)
twice, from a detached worktree of ``REF`` (default ``HEAD``) and from this
working tree (uncommitted changes included), with the compile cache off, and
compares each variant's PTX with its ``//`` comment lines (build paths and
versions) left out. A variant is matched by its name and, where a name
repeats, by its order among those of that name. One line a variant:
``identical``, ``differs (N lines)``, ``new`` or ``gone``.

What it shows: a refactor whose variants all print ``identical`` compiles to
the same instructions, so the GPU results recorded for ``REF`` hold for it
(for the variants compile-check builds, at their shapes). A change that
``differs`` needs its GPU run. Exit status: 1 if a variant fails to compile,
or with ``--expect-identical`` if a variant of ``REF`` differs or is gone;
else 0.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: compile-check's dump folders: ``<index>_<op>_<variant>_<arch>``.
_DUMP = re.compile(r"^\d+_(.+)$")


def _compile(tree: Path, dump: Path, ops: str, arch: str, shape: list[str] = ()) -> None:
    env = dict(os.environ, PYTHONPATH=str(tree), LAMPORT_COMPILE_CACHE="off")
    cmd = [sys.executable, "-m", "jobs", "compile-check", "--no-results", "--all",
           "--ops", ops, "--arch", arch, *shape, "--dump-dir", str(dump)]
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"ptx_diff: compile-check failed in {tree} (exit {done.returncode})")


def _ptx(dump: Path) -> dict[str, list[str]]:
    """``name#n`` (the n-th dump folder of that name, in index order) -> the
    PTX lines without ``//`` comments."""
    seen: Counter[str] = Counter()
    out = {}
    for folder in sorted(p for p in dump.iterdir() if p.is_dir()):
        match = _DUMP.match(folder.name)
        files = sorted(folder.glob("*.ptx"))
        if not match or not files:
            continue
        name = match.group(1)
        key = f"{name}#{seen[name]}"
        seen[name] += 1
        out[key] = [ln for f in files for ln in f.read_text().splitlines()
                    if not ln.lstrip().startswith("//")]
    return out


def compare(old: dict[str, list[str]], new: dict[str, list[str]]) -> list[tuple[str, str]]:
    """(variant, status) for every variant of either side, ``REF``'s order
    first."""
    rows = []
    for key in list(old) + [k for k in new if k not in old]:
        if key not in new:
            rows.append((key, "gone"))
        elif key not in old:
            rows.append((key, "new"))
        elif old[key] == new[key]:
            rows.append((key, "identical"))
        else:
            changed = sum(1 for ln in difflib.unified_diff(old[key], new[key], n=0)
                          if ln[:1] in "+-" and not ln.startswith(("+++", "---")))
            rows.append((key, f"differs ({changed} lines)"))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/ptx_diff.py",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("ref", nargs="?", default="HEAD", help="the commit to compare against")
    p.add_argument("--ops", default="indexer", help="compile-check --ops (default indexer)")
    p.add_argument("--arch", default="sm_90a", help="compile-check --arch (default sm_90a)")
    p.add_argument("--hidden", default=None, metavar="N,M",
                   help="compile-check --hidden (default: its own)")
    p.add_argument("--tp", default=None, metavar="N,M", help="compile-check --tp (default: its own)")
    p.add_argument("--expect-identical", action="store_true",
                   help="exit 1 if a variant of REF differs or is gone")
    args = p.parse_args(argv)
    rev = subprocess.run(["git", "rev-parse", "--verify", f"{args.ref}^{{commit}}"], cwd=ROOT,
                         capture_output=True, text=True)
    if rev.returncode:
        p.error(f"REF {args.ref!r} is not a commit of this repository")
    with tempfile.TemporaryDirectory(prefix="ptx_diff_") as tmp:
        tmp = Path(tmp)
        tree = tmp / "ref"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), rev.stdout.strip()],
                       cwd=ROOT, check=True)
        try:
            print(f"ptx_diff: compiling {args.ops} for {args.arch} at {args.ref} "
                  f"({rev.stdout.strip()[:9]}) and in the working tree", flush=True)
            shape = [w for flag in ("hidden", "tp") if getattr(args, flag)
                     for w in (f"--{flag}", getattr(args, flag))]
            _compile(tree, tmp / "old", args.ops, args.arch, shape)
            _compile(ROOT, tmp / "new", args.ops, args.arch, shape)
            rows = compare(_ptx(tmp / "old"), _ptx(tmp / "new"))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                           check=False)
    width = max(len(k) for k, _ in rows)
    for key, status in rows:
        print(f"{key:<{width}}  {status}")
    touched = [k for k, s in rows if s.startswith("differs") or s == "gone"]
    print(f"ptx_diff: {len(rows)} variants, {len(touched)} of {args.ref}'s changed or gone")
    return 1 if args.expect_identical and touched else 0


if __name__ == "__main__":
    sys.exit(main())
