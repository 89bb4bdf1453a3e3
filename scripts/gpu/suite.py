"""The whole GPU test suite on the GPU machine, one pytest process per test
file (a part), each under its own ``timeout -s KILL`` with a JUnit XML and
a log: a part that crashes, hangs or leaves a GPU context broken takes only
itself down. Run through ``scripts/gpu/suite.sh`` (which sources the staged
wheels); from the repo root:

    bash scripts/gpu/suite.sh                  # every part: -m gpu on one GPU,
                                               # -m "gpu or multigpu" on two or more
    bash scripts/gpu/suite.sh --slow           # with the tests marked slow
    BUDGET_S=540 bash scripts/gpu/suite.sh     # stop starting parts past the budget,
    bash scripts/gpu/suite.sh --resume         # ... and go on in the next device call

State lives in ``/tmp/gpu-suite/<commit>`` (``SUITE_DIR``): a part with a
JUnit XML there is done and ``--resume`` does not rerun it; the parts share
one compile cache (``LAMPORT_COMPILE_CACHE``, set by suite.sh). Prints one
line per part as it ends and a total; writes ``summary.json`` and the row
for docs/results/gpu_suite.md (``row.md``) beside the parts, and copies the
whole folder as ``gpu-suite.tgz`` (plus ``summary.txt``) into ``$OUT`` when
that is set. Exit 0 when every part ran and nothing failed or errored.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKED = re.compile(r"^(\s*@pytest\.mark\.|pytestmark\s*=.*\bpytest\.mark\.)(gpu|multigpu)\b",
                    re.MULTILINE)
"""A decorator line or a module's ``pytestmark`` naming the gpu or multigpu mark."""
PART_TIMEOUT_S = 420
"""One part's limit (its pytest is killed past it; its tests count as errors)."""
MIN_PART_S = 45
"""Under this much of --budget left, no further part is started."""


def gpu_files(root: Path = ROOT) -> list[str]:
    """Every test file holding a gpu- or multigpu-marked test, repo-relative, sorted."""
    return sorted(str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py")
                  if MARKED.search(p.read_text()))


def gpus() -> list[str]:
    """The GPUs nvidia-smi lists (names), [] where there is none."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def commit() -> str:
    env = os.environ.get("LAMPORT_GIT_COMMIT")
    if env:
        return env
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def part_name(path: str) -> str:
    return path.replace("/", "_").removesuffix(".py")


def junit_counts(xml: Path) -> dict:
    """passed / failed / skipped / errors / tests / time of one JUnit XML."""
    root = ET.parse(xml).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    return {"passed": n["tests"] - n["failures"] - n["errors"] - n["skipped"],
            "failed": n["failures"], "skipped": n["skipped"], "errors": n["errors"],
            "tests": n["tests"], "time_s": round(sum(float(s.get("time", 0)) for s in suites), 1)}


def slowest(xml: Path, k: int = 3) -> list[tuple[str, float]]:
    cases = [(c.get("name"), float(c.get("time", 0))) for c in ET.parse(xml).getroot().iter("testcase")]
    return sorted(cases, key=lambda c: -c[1])[:k]


def run_part(path: str, state: Path, mark: str, slow: bool, limit_s: float) -> dict:
    """One file's pytest under ``timeout -s KILL``; its counts (a part that
    left no JUnit XML is one error)."""
    name = part_name(path)
    xml, log = state / f"{name}.xml", state / f"{name}.log"
    tmp = state / f"{name}.xml.partial"
    cmd = ["timeout", "-s", "KILL", str(int(limit_s)), sys.executable, "-m", "pytest", "-m", mark,
           "-p", "no:cacheprovider", "-q", "-rfEs", f"--junitxml={tmp}", *(["--slow"] if slow else []),
           path]
    started = time.monotonic()
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    wall = round(time.monotonic() - started, 1)
    if tmp.exists():
        tmp.rename(xml)
        counts = junit_counts(xml)
        top = slowest(xml)
    else:
        why = f"killed at its {int(limit_s)} s limit" if rc in (124, 137, -9) else f"exit {rc}, no JUnit XML"
        counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 1, "tests": 0, "time_s": wall,
                  "why": why}
        top = []
        (state / f"{name}.incomplete").write_text(why + "\n")
    counts.update(part=path, exit=rc, wall_s=wall, slowest=top)
    (state / f"{name}.json").write_text(json.dumps(counts))
    return counts


def line(c: dict) -> str:
    head = (f"{c['part']:<44} {c['passed']:4d} passed {c['failed']:3d} failed "
            f"{c['skipped']:3d} skipped {c['errors']:3d} errors {c['wall_s']:7.1f} s (exit {c['exit']})")
    if c.get("why"):
        head += f": {c['why']}"
    elif c["slowest"]:
        head += "; slowest " + ", ".join(f"{n} {t:.0f}s" for n, t in c["slowest"][:2])
    return head


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="test files (default: every file with a gpu or "
                                             "multigpu test)")
    ap.add_argument("--slow", action="store_true", help="also the tests marked slow")
    ap.add_argument("--resume", action="store_true", help="keep the parts already done in SUITE_DIR")
    ap.add_argument("--budget", type=float, default=float(os.environ.get("BUDGET_S", 0)) or None,
                    help="seconds this invocation may take (env BUDGET_S); parts that would "
                         "start with less than %d s left are left for --resume" % MIN_PART_S)
    ap.add_argument("--part-timeout", type=float, default=PART_TIMEOUT_S,
                    help="seconds one part may run (default %(default)s)")
    args = ap.parse_args(argv)
    files = args.files or gpu_files()
    missing = [f for f in files if not (ROOT / f).is_file()]
    if missing:
        ap.error(f"no such test file(s): {missing}")
    names = gpus()
    mark = "gpu or multigpu" if len(names) >= 2 else "gpu"
    sha = commit()
    state = Path(os.environ.get("SUITE_DIR") or f"/tmp/gpu-suite/{sha[:12]}")
    if not args.resume and state.exists():
        shutil.rmtree(state)
    state.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(f"GPU suite at {sha[:12]} on {len(names)}x {names[0] if names else 'no GPU'}: "
          f"-m {mark!r}{' --slow' if args.slow else ''}, {len(files)} part(s), state {state}",
          flush=True)
    results, left = [], []
    for path in files:
        done = state / f"{part_name(path)}.json"
        if args.resume and done.exists():
            c = json.loads(done.read_text())
            results.append(c)
            print("(kept) " + line(c), flush=True)
            continue
        limit = args.part_timeout
        if args.budget is not None:
            remaining = args.budget - (time.monotonic() - started)
            if remaining < MIN_PART_S:
                left.append(path)
                continue
            limit = min(limit, remaining)
        c = run_part(path, state, mark, args.slow, limit)
        results.append(c)
        print(line(c), flush=True)
    total = {k: sum(c[k] for c in results) for k in ("passed", "failed", "skipped", "errors")}
    wall = round(sum(c["wall_s"] for c in results), 1)
    summary = {"commit": sha, "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "gpus": names, "mark": mark, "slow": args.slow, "parts": len(files),
               "parts_run": len(results), "not_run": left, **total, "wall_s": wall,
               "command": "bash scripts/gpu/suite.sh" + (" --slow" if args.slow else "")}
    (state / "summary.json").write_text(json.dumps({**summary, "results": results}, indent=1))
    machine = f"{len(names)}x {names[0]}" if names else "no GPU"
    row = (f"| {sha[:12]} | {summary['date']} | {machine} | -m \"{mark}\""
           f"{' --slow' if args.slow else ''} | {total['passed']} | {total['failed']} | "
           f"{total['skipped']} | {total['errors']} | {wall:.0f} s | `{summary['command']}` |")
    (state / "row.md").write_text(row + "\n")
    verdict = ("green" if not (total["failed"] or total["errors"] or left) else
               "INCOMPLETE" if left and not (total["failed"] or total["errors"]) else "RED")
    text = (f"suite {verdict}: {total['passed']} passed, {total['failed']} failed, "
            f"{total['skipped']} skipped, {total['errors']} errors in {wall:.1f} s of parts "
            f"({len(results)}/{len(files)} parts run"
            + (f"; not started: {', '.join(left)}: rerun with --resume" if left else "") + ")")
    print(text)
    print(row)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        with tarfile.open(Path(out) / "gpu-suite.tgz", "w:gz") as tar:
            tar.add(state, arcname=state.name)
        (Path(out) / "summary.txt").write_text(text + "\n" + row + "\n"
                                              + "\n".join(line(c) for c in results) + "\n")
    return 0 if verdict == "green" else 1


if __name__ == "__main__":
    sys.exit(main())
