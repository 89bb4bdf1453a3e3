"""The smoke suite through ``ray job submit --working-dir .`` on a local Ray
head started for this module (dashboard / job server on 127.0.0.1) and
stopped after: the job joins the head's cluster, its status is SUCCEEDED,
its rows are in the results with the commit passed from the submitting side.

The head runs with its own ``--temp-dir`` (so no other Ray on this machine
sees it as "the latest cluster") and ``RAY_AUTH_MODE=disabled`` (a
throwaway cluster on the loopback interface); it is stopped by its process
group: SIGTERM, then SIGKILL (never ``ray stop``, which would stop every
Ray on the machine).
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from jobs.results import read_results

REPO = Path(__file__).resolve().parents[1]
RAY = Path(sys.executable).with_name("ray")
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def head():
    temp_dir = tempfile.mkdtemp(prefix="rayh", dir="/tmp")
    gcs, dash = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_AUTH_MODE="disabled", PATH=f"{RAY.parent}{os.pathsep}{env.get('PATH', '')}")
    log = open(Path(temp_dir) / "head.log", "w")
    proc = subprocess.Popen(
        [str(RAY), "start", "--head", "--block", "--port", str(gcs), "--dashboard-host",
         "127.0.0.1", "--dashboard-port", str(dash), "--include-dashboard", "true",
         "--num-cpus", "2", "--disable-usage-stats", "--temp-dir", temp_dir],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/version", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"ray head did not start: {(Path(temp_dir) / 'head.log').read_text()[-3000:]}")
                time.sleep(0.5)
        yield url, env
    finally:
        _stop(proc)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _stop(proc: subprocess.Popen) -> None:
    # `ray start --block` does not act on SIGTERM / SIGINT promptly: a short
    # grace, then SIGKILL for the whole group (gcs, raylet, dashboard, workers).
    for sig, wait_s in ((signal.SIGTERM, 3), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        # The group may outlive its leader for a moment.
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def test_smoke_suite_submitted_as_a_ray_job(head, tmp_path):
    url, env = head
    results = tmp_path / "results"
    argv = [str(RAY), "job", "submit", "--address", url, "--working-dir", ".",
            "--submission-id", f"smoke-{tmp_path.name}",
            "--runtime-env-json", f'{{"env_vars": {{"LAMPORT_GIT_COMMIT": "{COMMIT}"}}}}',
            "--", "python", "-m", "jobs", "nightly", "--suite", "smoke", "--backend", "emulated",
            "--results", str(results), "--trigger", "ci", "--no-dashboard"]
    for _ in range(30):  # the job agent comes up a little after the dashboard answers
        submit = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                                timeout=480)
        if "No available agent to submit job" not in submit.stderr + submit.stdout:
            break
        time.sleep(2)
    logs = submit.stdout[-6000:] + submit.stderr[-3000:]
    assert submit.returncode == 0, logs
    assert "ray: joined the Ray cluster at" in submit.stdout, logs
    assert f"commit: {COMMIT}" in submit.stdout, logs
    from ray.job_submission import JobStatus, JobSubmissionClient
    client = JobSubmissionClient(url)
    assert client.get_job_status(f"smoke-{tmp_path.name}") == JobStatus.SUCCEEDED
    logs = client.get_job_logs(f"smoke-{tmp_path.name}")
    rows = read_results(results).to_pylist()
    skipped = sum(r["outcome"] == "skipped" for r in rows)  # profile and virtual ranks: GPU only
    assert skipped >= 4 and f" pass, 0 fail, 0 hang, 0 error, {skipped} skipped" in logs, logs
    assert rows and {r["git_commit"] for r in rows} == {COMMIT}
    assert {r["outcome"] for r in rows} <= {"pass", "skipped"}
    assert {r["backend"] for r in rows} == {"cpu-reference", "compile", "emulated"}
    assert sum(r["fault_kind"] is not None for r in rows) == 10
