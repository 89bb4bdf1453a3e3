"""``--resume``: a run cut short (or a nightly part stopped by its time
limit) completed by running only the cases it does not hold yet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from jobs.results import read_results, runs

REPO = Path(__file__).resolve().parents[1]

# Embedded Ray clusters: one at a time, with the other Ray modules (conftest.py).
pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.timeout(300)]


def jobs_cli(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-m", "jobs", *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=280)


def test_resume_runs_only_what_the_run_lacks(tmp_path):
    results = str(tmp_path / "results")
    common = ["nightly", "--suite", "smoke", "--jobs", "selfcheck,correctness", "--ops",
              "embed_norm", "--run-id", "cut-short", "--results", results, "--no-dashboard"]
    first = jobs_cli(*common, "--inputs", "random")  # the run "cut short" after one case
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    again = jobs_cli(*common, "--resume")
    out = again.stdout
    assert again.returncode == 0, out[-3000:] + again.stderr[-3000:]
    assert "resume: run cut-short holds 12 of these 14 planned case(s) already (selfcheck " \
           "11 of 11, correctness 1 of 3); running the other 2" in out, out[-3000:]
    assert "== reference self-check" not in out
    rows = read_results(results).to_pylist()
    jobs = Counter(r["job"] for r in rows)
    assert jobs == {"selfcheck": 11, "correctness": 3}
    keys = [json.loads(r["extra"])["case_key"] for r in rows if r["job"] == "correctness"]
    assert len(set(keys)) == 3  # every case once
    assert sorted(json.loads(r["extra"])["inputs"] for r in rows if r["job"] == "correctness") \
        == ["random", "sentinel_pattern", "shard_edges"]
    manifest = runs.read_manifest(results, "cut-short")
    assert manifest["status"] == "finished"
    assert [a["cases"] for a in manifest["accounting"]] == [1, 2]
    # where a case's host time went, per row and per job (cluster.phases)
    for r in rows:
        if r["job"] == "correctness":
            assert set(json.loads(r["extra"])["phases_s"]) == {"inputs", "call", "readback",
                                                               "check"}
    assert all(set(a["phases_s"]) == {"inputs", "call", "readback", "check"}
               for a in manifest["accounting"])
    assert "host time in cases, slowest rank: inputs " in out
    assert manifest["counts"] == dict(Counter(r["outcome"] for r in rows))  # both parts' rows


def test_resume_needs_a_run_that_exists(tmp_path):
    results = str(tmp_path / "results")
    done = jobs_cli("correctness", "--resume", "--results", results)
    assert done.returncode == 2 and "--resume needs --run-id" in done.stderr
    done = jobs_cli("correctness", "--resume", "--run-id", "nosuch", "--results", results)
    assert done.returncode == 2 and "--resume: no run 'nosuch' in --results" in done.stderr
    assert not Path(results).exists()


def test_a_run_is_not_joined_from_another_commit(tmp_path, monkeypatch):
    """The run facts (git_commit among them) live once in the manifest: rows a
    second part wrote from another tree would read back under the first
    part's commit (seen on two H200s: a resumed nightly's rows all read as the
    last part's commit). Joining is refused before anything runs."""
    results = tmp_path / "results"
    runs.begin(results, "one-tree", trigger="manual", facts={"git_commit": "a" * 40})
    with pytest.raises(ValueError, match="holds rows of commit aaaaaaaaaaaa; this tree is "
                                         "bbbbbbbbbbbb"):
        runs.begin(results, "one-tree", trigger="manual", facts={"git_commit": "b" * 40})
    runs.begin(results, "one-tree", trigger="manual", facts={"git_commit": "a" * 40})
    monkeypatch.setenv("LAMPORT_GIT_COMMIT", "b" * 40)
    done = jobs_cli("correctness", "--suite", "smoke", "--resume", "--run-id", "one-tree",
                    "--results", str(results))
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "--run-id: run 'one-tree' holds rows of commit aaaaaaaaaaaa" in done.stderr
