"""A job interrupted by Ctrl-C (SIGINT) or SIGTERM (a scheduler's or
``timeout``'s stop, how a nightly part on the GPU machine ends when its time
is up): its groups stop after the case in hand, the section's closing line
and accounting are written (marked interrupted), every row written is a
whole case, the run is compacted and marked ``interrupted``, the command
that resumes it is printed, and that command completes the run with each
case once. The exit is bounded (``jobs.embedded.TERM_GRACE_S``), also when
the signal went to the whole process group (Ctrl-C in a terminal, GNU
``timeout``) and the Ray cluster's own processes died with the driver.
The runs are the smoke suite's AllReduceNorm correctness at tp 1 and 2
(24 cases): a pool of two rank workers to warm, not four."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from jobs import exits
from jobs.embedded import TERM_GRACE_S
from jobs.results import read_results, runs

REPO = Path(__file__).resolve().parents[1]

# Embedded Ray clusters: one at a time, with the other Ray modules (conftest.py).
pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.timeout(600)]


def test_ctrl_c_ends_the_job_with_its_accounting_and_the_printed_resume_completes_it(tmp_path):
    results = tmp_path / "results"
    argv = [sys.executable, "-m", "jobs", "nightly", "--suite", "smoke", "--jobs", "correctness",
            "--ops", "all_reduce_norm", "--tp", "1,2", "--results", str(results), "--run-id",
            "cut", "--no-dashboard"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    job = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in job.stdout:  # the case rows as they end: Ctrl-C after the fifth
        seen.append(line)
        if sum(s.startswith("correctness ") for s in seen) == 5:
            job.send_signal(signal.SIGINT)
            break
    out = "".join(seen) + job.communicate(timeout=120)[0]
    assert job.returncode == exits.INTERRUPTED_SIGINT, out[-3000:]
    assert "case(s) before it was interrupted" in out, out[-3000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    assert "SIGTERM received" not in out  # Ray's stack dump: its handler did not take over
    manifest = runs.read_manifest(results, "cut")
    (entry,) = manifest["accounting"]
    rows = read_results(results).to_pylist()
    assert entry["interrupted"] is True and entry["cases"] == len(rows) >= 5
    assert (manifest["status"], manifest["interrupted_by"]) == ("interrupted", "SIGINT")
    assert manifest["counts"] == {"pass": len(rows)}
    # A nightly compacts its run as it ends, interrupted too: one file per partition.
    (compacted,) = results.rglob("*.parquet")  # one file: the run compacted
    assert re.fullmatch(r"run-cut-[0-9a-f]{12}\.parquet", compacted.name), compacted.name
    resume = out.split("complete it (only the cases it lacks) with:\n  ", 1)[1].splitlines()[0]
    assert shlex.split(resume) == [*argv, "--resume"]

    again = subprocess.run(shlex.split(resume), cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=500)
    assert again.returncode == exits.OK, again.stdout[-3000:] + again.stderr[-3000:]
    rows = read_results(results).to_pylist()
    keys = Counter(json.loads(r["extra"])["case_key"] for r in rows)
    assert max(keys.values()) == 1  # every case once: none cut in half, none twice
    manifest = runs.read_manifest(results, "cut")
    assert manifest["status"] == "finished" and "interrupted_by" not in manifest
    assert sum(a["cases"] for a in manifest["accounting"]) == len(rows)


BLOCKED_CLEANUP = """
import sys, time
from jobs.embedded import terminate_raises
with terminate_raises(grace_s=float(sys.argv[1])):
    try:
        print("ready", flush=True)
        time.sleep(600)
    finally:
        print("cleanup started", flush=True)
        print("closing line, still in the buffer")
        try:
            time.sleep(600)  # a cleanup that never ends: a Ray call to a GCS that is gone
        except BaseException as err:
            print(f"cleanup cut by {err!r}", flush=True)
            raise
"""


def test_a_cleanup_that_blocks_after_sigterm_ends_at_the_grace_with_143(tmp_path):
    grace_s, second_after_s = 4.0, 2.0
    script = tmp_path / "blocked.py"
    script.write_text(BLOCKED_CLEANUP)
    job = subprocess.Popen([sys.executable, str(script), str(grace_s)], cwd=REPO,
                           env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        assert job.stdout.readline() == "ready\n"
        job.send_signal(signal.SIGTERM)
        first = time.monotonic()
        assert job.stdout.readline() == "cleanup started\n"
        time.sleep(max(0.0, first + second_after_s - time.monotonic()))
        job.send_signal(signal.SIGTERM)  # neither cuts the cleanup nor rearms the timer
        job.wait(timeout=grace_s + 30)
        took = time.monotonic() - first
        out, err = job.stdout.read(), job.stderr.read()  # (communicate skips what readline buffered)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == exits.INTERRUPTED_SIGTERM, (out, err)
    assert grace_s <= took < grace_s + second_after_s, took  # rearmed: >= 6 s
    assert "closing line, still in the buffer" in out  # flushed before os._exit
    assert "cleanup cut" not in out
    assert f"SIGTERM: cleanup did not finish within {grace_s:g} s; exiting 143" in err


def _session(sid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.getsid(int(name)) == sid:
                    found.append(int(name))
            except OSError:
                pass
    return found


@pytest.mark.slow
def test_sigterm_to_the_whole_process_group_ends_the_driver_within_the_grace(tmp_path):
    """GNU timeout's SIGTERM reaches the driver and its embedded cluster's
    GCS, raylet and workers at once: the driver still writes its closing
    line, exits 143 within TERM_GRACE_S, and leaves no process behind."""
    argv = [sys.executable, "-m", "jobs", "correctness", "--suite", "smoke", "--backend",
            "emulated", "--ops", "all_reduce_norm", "--tp", "1,2", "--results",
            str(tmp_path / "results")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    job = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        seen = []
        for line in job.stdout:  # the case rows as they end: stop after the third
            seen.append(line)
            if sum(s.startswith("correctness ") for s in seen) == 3:
                break
        os.killpg(job.pid, signal.SIGTERM)
        killed = time.monotonic()
        rest = []
        reader = threading.Thread(target=lambda: rest.append(job.stdout.read()), daemon=True)
        reader.start()
        job.wait(timeout=TERM_GRACE_S + 15)
        took = time.monotonic() - killed
        reader.join(timeout=15)
        out = "".join(seen + rest)
        deadline = time.monotonic() + 10
        while _session(job.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _session(job.pid)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    backstop = "SIGTERM: cleanup did not finish" in out
    print(f"\nfigure: killpg(SIGTERM) of the driver's process group: exit "
          f"{job.returncode} after {took:.1f} s ({'the grace timer' if backstop else 'its cleanup'} "
          f"ended it; TERM_GRACE_S {TERM_GRACE_S:g} s)")
    assert job.returncode == exits.INTERRUPTED_SIGTERM, out[-3000:]
    assert took < TERM_GRACE_S + 10, out[-3000:]
    assert "case(s) before it was interrupted" in out, out[-3000:]
    # The run is marked before Ray's cleanup, which the signal may block.
    (manifest,) = runs.read_manifests(tmp_path / "results").values()
    assert (manifest["status"], manifest["interrupted_by"]) == ("interrupted", "SIGTERM")
    assert f"--run-id {manifest['run_id']} --resume" in out, out[-3000:]
    assert not left, [Path(f"/proc/{p}/cmdline").read_bytes()[:80] for p in left]
