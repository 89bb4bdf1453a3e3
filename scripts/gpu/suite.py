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
that is set. Exit 0 when every part ran and nothing failed or errored. A part
killed at its limit, or whose pytest ended with an exit status other than
0, 1 or 5, is an error even where its JUnit XML is complete (a teardown that
hung after the last test).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKED = re.compile(r"^(\s*@pytest\.mark\.|pytestmark\s*=.*\bpytest\.mark\.)(gpu|multigpu)\b",
                    re.MULTILINE)
"""A decorator line or a module's ``pytestmark`` naming the gpu or multigpu mark."""
PART_TIMEOUT_S = 420
"""One part's limit (its pytest is killed past it; its tests count as errors)."""
MIN_PART_S = 45
"""Under this much of --budget left, no further part is started."""
ALONE = ("tests/gpu/test_timing_gpu.py", "tests/test_jobs_profile.py")
"""Parts that time calls: with ``--lanes`` > 1 they run alone, after every
other part (a neighbour's kernels would time-slice the GPU under them)."""
RAY_PARTS = ("tests/gpu/test_pool_gpu.py", "tests/gpu/test_cluster_ops_gpu.py",
             "tests/gpu/test_cluster_gpu.py")
"""Parts whose Ray clusters form GPU groups against host deadlines and
watchdog budgets (longest first: with ``--lanes`` > 1 they start first).
At most ``--ray-at-once`` of them run at once (each its own local Ray
cluster, on ports of its own), beside the kernel parts in the other lanes.
A neighbour's kernels slow their calls by time slices of milliseconds, far
inside those deadlines (seconds); what bounds them is the worker processes
starting at once (torch and CuTe DSL imports, CUDA contexts) on the host's
cores."""
RAY_AT_ONCE = 1
"""The default ``--ray-at-once``: one Ray part at a time. ``--lanes 4
--ray-at-once 2`` shortens the critical path (the three Ray parts took 218 s
one after another of the 281 s run at deaf606) and is the form the rows of
docs/results/gpu_suite.md are run in since d76a8eb."""


def gpu_files(root: Path = ROOT, marks: tuple[str, ...] = ("gpu", "multigpu")) -> list[str]:
    """Every test file holding a test marked with one of ``marks``
    (repo-relative, sorted): on one GPU a file of multigpu tests only is
    not a part (its pytest would select nothing)."""
    return sorted(str(p.relative_to(root)) for p in (root / "tests").rglob("test_*.py")
                  if any(m.group(2) in marks for m in MARKED.finditer(p.read_text())))


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


#: pytest's exit codes of a run that ended by itself: all passed, some failed,
#: none collected. Any other (a kill, an internal error) makes the part an error
#: even when its JUnit XML was written.
PYTEST_DONE = (0, 1, 5)


def run_part(path: str, state: Path, mark: str, slow: bool, limit_s: float, *,
             cut_by_budget: bool = False) -> dict:
    """One file's pytest under ``timeout -s KILL``; its counts (a part that
    left no JUnit XML, or was killed or ended abnormally after writing it, is
    one error more). A part killed at a limit that was the
    budget's remainder (``cut_by_budget``), not its own timeout, is not
    done (``cut``): no state is kept for it, so ``--resume`` runs it again."""
    name = part_name(path)
    xml, log = state / f"{name}.xml", state / f"{name}.log"
    tmp = state / f"{name}.xml.partial"
    limit_s = max(1, math.ceil(limit_s))  # timeout's 0 would mean no limit
    cmd = ["timeout", "-s", "KILL", str(limit_s), sys.executable, "-m", "pytest", "-m", mark,
           "-p", "no:cacheprovider", "-q", "-rfEs", f"--junitxml={tmp}", *(["--slow"] if slow else []),
           path]
    started = time.monotonic()
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    wall = round(time.monotonic() - started, 1)
    killed = rc in (124, 137, -9)
    if killed and cut_by_budget:
        tmp.unlink(missing_ok=True)
        return {"part": path, "exit": rc, "wall_s": wall, "cut": True, "passed": 0,
                "failed": 0, "skipped": 0, "errors": 0, "slowest": [],
                "why": f"cut at the budget's last {int(limit_s)} s: rerun with --resume"}
    # timeout's kill and any other SIGKILL (the OOM killer) both read 137:
    # only the wall time tells whether the limit was reached.
    killed_how = (f"killed at its {int(limit_s)} s limit" if wall >= 0.95 * limit_s else
                  f"killed (exit {rc}) at {wall:.1f} s, before its {int(limit_s)} s limit")
    if tmp.exists():
        tmp.rename(xml)
        counts = junit_counts(xml)
        top = slowest(xml)
        # A pytest that wrote its whole XML and then hung (a teardown, an
        # atexit, a child it waits on) until the kill is no green part.
        why = (f"{killed_how} after its tests ended" if killed else
               f"exit {rc} after its tests ended" if rc not in PYTEST_DONE else "")
        if why:
            counts["errors"] += 1
            counts["why"] = why
            (state / f"{name}.incomplete").write_text(why + "\n")
    else:
        why = killed_how if killed else f"exit {rc}, no JUnit XML"
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


def run_lanes(queue: list[str], one, lanes: int, ray_at_once: int) -> None:
    """Run ``one(path)`` for every path of ``queue`` on ``lanes`` threads: a
    free lane takes the first path it may start, a RAY_PARTS path only while
    fewer than ``ray_at_once`` of them run (else the next other path; a lane
    with only Ray parts left waits for one to end)."""
    pending, running_ray = list(queue), [0]
    cond = threading.Condition()

    def take() -> str | None:
        with cond:
            while pending:
                path = next((p for p in pending
                             if p not in RAY_PARTS or running_ray[0] < ray_at_once), None)
                if path is not None:
                    pending.remove(path)
                    running_ray[0] += path in RAY_PARTS
                    return path
                cond.wait()
            return None

    def lane() -> None:
        while (path := take()) is not None:
            try:
                one(path)
            finally:
                with cond:
                    running_ray[0] -= path in RAY_PARTS
                    cond.notify_all()

    with ThreadPoolExecutor(max_workers=lanes) as pool:
        for f in [pool.submit(lane) for _ in range(lanes)]:
            f.result()


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
    ap.add_argument("--lanes", type=int, default=1,
                    help="parts run at once (default %(default)s; their kernels then "
                         "time-slice the GPU: correctness only): the RAY_PARTS first, at "
                         "most --ray-at-once of them at a time, the ALONE parts last")
    ap.add_argument("--ray-at-once", type=int, default=RAY_AT_ONCE,
                    help="with --lanes > 1, RAY_PARTS running at once (default %(default)s)")
    args = ap.parse_args(argv)
    if not 1 <= args.lanes <= 16:
        ap.error(f"--lanes must be in 1..16, got {args.lanes}")
    if not 1 <= args.ray_at_once <= 16:
        ap.error(f"--ray-at-once must be in 1..16, got {args.ray_at_once}")
    missing = [f for f in args.files if not (ROOT / f).is_file()]
    if missing:
        ap.error(f"no such test file(s): {missing}")
    names = gpus()
    mark = "gpu or multigpu" if len(names) >= 2 else "gpu"
    files = args.files or gpu_files(marks=tuple(mark.split(" or ")))
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
    lock = threading.Lock()

    def one(path: str) -> None:
        done = state / f"{part_name(path)}.json"
        if args.resume and done.exists():
            c = json.loads(done.read_text())
            with lock:
                results.append(c)
                print("(kept) " + line(c), flush=True)
            return
        limit = args.part_timeout
        if args.budget is not None:
            remaining = args.budget - (time.monotonic() - started)
            if remaining < MIN_PART_S:
                with lock:
                    left.append(path)
                return
            limit = min(limit, remaining)
        c = run_part(path, state, mark, args.slow, limit, cut_by_budget=limit < args.part_timeout)
        with lock:
            print(line(c), flush=True)
            (left if c.get("cut") else results).append(path if c.get("cut") else c)

    alone = [f for f in files if f in ALONE] if args.lanes > 1 else []
    queue = [f for f in files if f not in alone]
    if args.lanes > 1:  # the Ray parts first, longest first; the rest in the order given
        queue.sort(key=lambda f: RAY_PARTS.index(f) if f in RAY_PARTS else len(RAY_PARTS))
    run_lanes(queue, one, args.lanes, args.ray_at_once if args.lanes > 1 else 1)
    for path in alone:
        one(path)
    elapsed = time.monotonic() - started
    total = {k: sum(c[k] for c in results) for k in ("passed", "failed", "skipped", "errors")}
    wall = round(sum(c["wall_s"] for c in results), 1)
    # this invocation's elapsed time, added to what earlier (--resume) ones took
    elapsed_file = state / "elapsed_s"
    elapsed += float(elapsed_file.read_text()) if args.resume and elapsed_file.exists() else 0.0
    elapsed_file.write_text(f"{elapsed:.1f}")
    summary = {"commit": sha, "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "gpus": names, "mark": mark, "slow": args.slow, "parts": len(files),
               "parts_run": len(results), "not_run": left, **total, "wall_s": wall,
               "elapsed_s": round(elapsed, 1), "lanes": args.lanes,
               "command": "bash scripts/gpu/suite.sh" + (" --slow" if args.slow else "")
               + (f" --lanes {args.lanes}" if args.lanes > 1 else "")
               + (f" --ray-at-once {args.ray_at_once}"
                  if args.lanes > 1 and args.ray_at_once != RAY_AT_ONCE else "")}
    (state / "summary.json").write_text(json.dumps({**summary, "results": results}, indent=1))
    machine = f"{len(names)}x {names[0]}" if names else "no GPU"
    row = (f"| {sha[:12]} | {summary['date']} | {machine} | -m \"{mark}\""
           f"{' --slow' if args.slow else ''} | {total['passed']} | {total['failed']} | "
           f"{total['skipped']} | {total['errors']} | {elapsed:.0f} s ({wall:.0f} s of parts) | "
           f"`{summary['command']}` |")
    (state / "row.md").write_text(row + "\n")
    verdict = ("green" if not (total["failed"] or total["errors"] or left) else
               "INCOMPLETE" if left and not (total["failed"] or total["errors"]) else "RED")
    text = (f"suite {verdict}: {total['passed']} passed, {total['failed']} failed, "
            f"{total['skipped']} skipped, {total['errors']} errors in {elapsed:.1f} s "
            f"({wall:.1f} s of parts, {args.lanes} lane(s)) "
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
