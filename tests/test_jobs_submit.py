"""``python -m jobs head`` / ``submit``: the README's Ray section run as
written against a real local head (its own free ports, its own directory,
stopped at the end whatever happens), and submit's checks before anything is
sent: the job command, the head's address, Ray's token authentication."""

import http.server
import re
import threading

import pytest

from jobs import exits
from jobs.__main__ import main
from jobs.config import ConfigError, load_suite, suite_path
from jobs.head import job_server_auth
from jobs.results import read_results

# A head of its own (free ports, its own directories): it may run beside the
# "ray" group's embedded clusters, on the other worker. The README's Ray
# section (its smoke nightly: about 3 minutes on a loaded 2-core machine)
# runs once for this module and test_jobs_nightly.py (tests/readme_ray.py).
pytestmark = [pytest.mark.xdist_group("ray-head"), pytest.mark.timeout(1200)]


def test_readme_ray_section_runs_as_written(readme_ray_run):
    done, root, commit, out = readme_ray_run.done, readme_ray_run.root, readme_ray_run.commit, \
        readme_ray_run.out
    assert done.returncode == 0, out[-8000:]
    token = root / ".ray-head" / "auth_token"
    assert token.stat().st_mode & 0o777 == 0o600
    assert "auth: token authentication (the head's token file" in out, out[-8000:]
    assert token.read_text().strip() not in out
    assert "ray: joined the Ray cluster at" in out, out[-8000:]
    assert f"commit: {commit}" in out, out[-8000:]
    # The entrypoint is the submitting side's interpreter: the project's environment.
    assert re.search(rf"Running entrypoint for job \S+: {re.escape(str(root))}/\.venv/bin/python "
                     rf"-m jobs nightly", out), out[-8000:]
    rows = read_results(root / "ray-results").to_pylist()
    skipped = sum(r["outcome"] == "skipped" for r in rows)  # profile and virtual ranks: GPU only
    assert skipped >= 4 and f" pass, 0 fail, 0 hang, 0 error, {skipped} skipped" in out, out[-8000:]
    assert {r["git_commit"] for r in rows} == {commit}
    assert {r["outcome"] for r in rows} <= {"pass", "skipped"}
    assert {r["backend"] for r in rows} == {"cpu-reference", "compile", "emulated"}
    faults = load_suite(suite_path("smoke")).of("faults")
    assert sum(r["fault_kind"] is not None for r in rows) == len(faults)
    assert (root / "ray-site" / "index.html").is_file()
    # The job's own exit status, and the job followed by its id without Ray's auth variables.
    assert "submit: job smoke-1 ended SUCCEEDED, exit status 0" in out, out[-8000:]
    assert out.count("Job 'smoke-1' succeeded") == 2, out[-8000:]  # submit's end, then status
    assert "submit: job cut-1 taken" in out, out[-8000:]
    assert "job cut-1: stop requested (SIGTERM: it ends after the case in hand)" in out, \
        out[-8000:]
    # Stopped once its cases had begun (stop --wait running): the job's closing line, its
    # run marked interrupted and the command that completes it, at the end of its log.
    assert re.search(r"^job cut-1: running, first case: correctness \S+ ", out, re.M), out[-8000:]
    assert re.search(r"^   \(\d+\.\d s, \d+ case\(s\) before it was interrupted, ", out, re.M), \
        out[-8000:]
    assert re.search(r"^SIGTERM: run \S+ interrupted after the case in hand; complete it \(only "
                     r"the cases it lacks\) with:\n  \S+/python -m jobs correctness --suite "
                     rf"smoke --results {re.escape(str(root))}/ray-results-cut --run-id \S+ "
                     r"--resume$", out, re.M), out[-8000:]
    assert "stopped the head" in out
    assert not (root / ".ray-head" / "head.json").exists()


def _free_port() -> int:
    from jobs.head import free_port
    return free_port()


@pytest.mark.parametrize("command", [["submit", "--", "correctness", "--results", "/tmp/r"],
                                     ["status", "some-job"], ["logs", "some-job"],
                                     ["stop", "some-job"]])
def test_no_head_answering_is_one_line_and_exit_3_no_head_recorded_exit_2(command, capsys,
                                                                          monkeypatch, tmp_path):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    url = f"http://127.0.0.1:{_free_port()}"
    verb, rest = command[0], command[1:]
    assert main([verb, "--address", url, *rest]) == exits.INFRA
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"no Ray job server answers at {url}" in err, err
    assert main([verb, "--dir", str(tmp_path / "none"), *rest]) == exits.USAGE
    assert f"no head to talk to: none recorded in {tmp_path / 'none'}" in capsys.readouterr().err


@pytest.mark.parametrize("info, status", [
    (None, exits.INFRA),                                           # never taken
    ({"status": "SUCCEEDED", "driver_exit_code": 0}, exits.OK),
    ({"status": "FAILED", "driver_exit_code": 2}, exits.USAGE),    # the job's own, not ray's 1
    ({"status": "FAILED", "driver_exit_code": 1}, exits.FAILED),
    ({"status": "STOPPED", "driver_exit_code": 143}, exits.INTERRUPTED_SIGTERM),
    ({"status": "STOPPED", "driver_exit_code": -15}, exits.INTERRUPTED_SIGTERM),  # killed
    ({"status": "STOPPED", "driver_exit_code": None}, exits.INTERRUPTED_SIGTERM),
    ({"status": "FAILED", "driver_exit_code": None}, exits.INFRA),  # its runtime env failed
])
def test_a_submitted_jobs_exit_status_is_its_entrypoints(info, status):
    from jobs.__main__ import job_exit_status
    assert job_exit_status(info) == status


def test_head_stop_never_signals_a_process_that_reused_the_heads_pid(tmp_path):
    """A recorded head that is gone, its pid now leading another process
    group: ``head stop`` leaves that group alone and forgets the head."""
    import json
    import signal
    import subprocess
    import sys

    from cluster import procs
    from jobs import head
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             start_new_session=True)
    try:
        (tmp_path / head.STATE_FILE).write_text(json.dumps({
            "pid": other.pid, "start": procs.process_start(other.pid) - 1,
            "dashboard": "http://127.0.0.1:1", "temp_dir": str(tmp_path / "gone")}))
        assert "now names another process" in head.stop(tmp_path, grace_s=0.5)
        assert other.poll() is None and not (tmp_path / head.STATE_FILE).exists()
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait()


@pytest.mark.parametrize("job, says", [
    (["correctness", "--tp", "2,,4"], "--tp: expected a comma-separated list without empty items"),
    (["correctness", "--ops", "nope", "--results", "/tmp/x"], "unknown value(s) ['nope']"),
    (["correctness", "--results", "relative"], "--results relative: give an absolute path"),
    (["nightly", "--results", "/tmp/x", "--site", "site"], "--site site: give an absolute path"),
    (["compile-check", "--arch", "sm_80"], "allowed: sm_90a, sm_100a"),
    ([], "give the job command after '--'"),
])
def test_submit_checks_the_job_command_before_reaching_the_head(job, says, capsys):
    # The address answers nothing: a command checked first never gets there.
    assert main(["submit", "--address", "http://127.0.0.1:9", "--", *job]) == 2
    assert says in capsys.readouterr().err


class _JobServer(http.server.BaseHTTPRequestHandler):
    token: str | None = None

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path == "/api/version" or self.token is None:
            status = 200
        else:
            header = self.headers.get("Authorization")
            status = 401 if header is None else 200 if header == f"Bearer {self.token}" else 403
        self.send_response(status)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def job_server():
    servers = []

    def serve(token):
        handler = type("Handler", (_JobServer,), {"token": token})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"
    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


def test_auth_is_settled_from_the_token_the_head_accepts(job_server, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token of the machine's
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    assert job_server_auth(job_server(None)).env == {"RAY_AUTH_MODE": "disabled"}
    url = job_server("s3cret")
    with pytest.raises(ConfigError, match="requires a token and none was found"):
        job_server_auth(url)
    monkeypatch.setenv("RAY_AUTH_TOKEN", "wrong")
    with pytest.raises(ConfigError, match=r"refused every one this side has \(RAY_AUTH_TOKEN\)"):
        job_server_auth(url)
    head = tmp_path / "head"
    head.mkdir()
    (head / "auth_token").write_text("s3cret\n")
    auth = job_server_auth(url, head)
    assert auth.env == {"RAY_AUTH_MODE": "token",
                        "RAY_AUTH_TOKEN_PATH": str((head / "auth_token").resolve())}
    monkeypatch.setenv("RAY_AUTH_TOKEN", "s3cret")
    assert job_server_auth(url).env == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "s3cret"}
