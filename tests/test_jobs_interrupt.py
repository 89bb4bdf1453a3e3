"""A job interrupted by SIGTERM (a scheduler's or ``timeout``'s stop, how a
nightly part on the GPU machine ends when its time is up): its groups stop
after the case in hand, the section's closing line and accounting are
written (marked interrupted), every row written is a whole case, and
``--resume`` completes the run with each case once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from jobs.results import read_results, runs

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(600)


def test_sigterm_ends_the_job_with_its_accounting_and_resume_completes_it(tmp_path):
    results = tmp_path / "results"
    argv = [sys.executable, "-m", "jobs", "nightly", "--suite", "smoke", "--jobs", "correctness",
            "--ops", "all_reduce_norm", "--results", str(results), "--run-id", "cut",
            "--no-dashboard"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    job = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in job.stdout:  # the case rows as they end: stop after the fifth
        seen.append(line)
        if sum(s.startswith("correctness ") for s in seen) == 5:
            job.send_signal(signal.SIGTERM)
            break
    out = "".join(seen) + job.communicate(timeout=120)[0]
    assert job.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert "case(s) before it was interrupted" in out, out[-3000:]
    assert "SIGTERM received" not in out  # Ray's stack dump: its handler did not take over
    (entry,) = runs.read_manifest(results, "cut")["accounting"]
    rows = read_results(results).to_pylist()
    assert entry["interrupted"] is True and entry["cases"] == len(rows) >= 5

    again = subprocess.run([*argv, "--resume"], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=500)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    rows = read_results(results).to_pylist()
    keys = Counter(json.loads(r["extra"])["case_key"] for r in rows)
    assert max(keys.values()) == 1  # every case once: none cut in half, none twice
    manifest = runs.read_manifest(results, "cut")
    assert manifest["status"] == "finished"
    assert sum(a["cases"] for a in manifest["accounting"]) == len(rows)
