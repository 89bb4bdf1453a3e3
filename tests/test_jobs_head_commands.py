"""``python -m jobs status|logs|stop JOB_ID`` against a job server that is a
stand-in (a small HTTP server answering as Ray's does: 404 for a job it does
not know, 500 when it fails, a job's record and log as JSON), and
``head start --dir FILE``: every bad input is one line naming it and its
exit status (2: a malformed id, before any request; an id the server does
not know; a file for --dir. 3: a server that errs), never a traceback;
``status --wait running`` waits for the job's first case line, bounded by
``--timeout``. In-process and without Ray."""

from __future__ import annotations

import http.server
import json
import sys
import threading
from urllib.parse import unquote

import pytest

from jobs import exits
from jobs import head as hd
from jobs.__main__ import main

pytestmark = pytest.mark.timeout(120)

LOG = """\
ray: joined the Ray cluster at 127.0.0.1:6379

== correctness: 12 case(s) ==
job          op               tp  hidden     M  placement
-------------------------------------------------------------------
   >> rank 1 is killed on purpose
correctness  all_reduce_norm   2    1024     1  spread           pass
correctness  all_reduce_norm   4    1024     1  spread           pass
"""
CASE = "correctness  all_reduce_norm   2    1024     1  spread           pass"


class _Jobs(http.server.BaseHTTPRequestHandler):
    """Ray's job REST API as `status|logs|stop` read it: ``jobs`` maps an id
    to a list of (record, log) it answers in turn (the last one for ever);
    ``boom`` answers 500, ``junk`` a body that is not JSON."""

    jobs: dict = {}
    seen: list

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.seen.append(self.path)
        path = unquote(self.path)
        if path in ("/api/version", "/api/jobs/"):
            return self._answer(200, {"ray_version": "2.60.0"} if path == "/api/version" else [])
        job_id, _, rest = path.removeprefix("/api/jobs/").partition("/")
        if job_id == "boom":
            return self._answer(500, None, b"Traceback (most recent call last): ...")
        if job_id == "junk":
            return self._answer(200, None, b"<html>not json</html>")
        if job_id not in self.jobs:
            return self._answer(404, None, f"Job {job_id} does not exist".encode())
        answers = self.jobs[job_id]
        record, log = answers.pop(0) if len(answers) > 1 else answers[0]
        self._answer(200, {"logs": log} if rest == "logs" else record)

    def do_POST(self):  # noqa: N802
        path = unquote(self.path)
        if not path.endswith("/stop"):
            return self.do_GET()
        self.seen.append(f"POST {self.path}")
        job_id = path.removeprefix("/api/jobs/").partition("/")[0]
        if job_id not in self.jobs:
            return self._answer(404, None, f"Job {job_id} does not exist".encode())
        self._answer(200, {"stopped": True})

    def _answer(self, status, obj, body=None):
        body = json.dumps(obj).encode() if body is None else body
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server(monkeypatch):
    """(URL, the paths it was asked for, its jobs) of a stand-in job server
    taking requests without a token; the ``ray job`` command replaced by a
    recorder (its argv; exit 0)."""
    seen: list[str] = []
    jobs: dict = {}
    handler = type("Handler", (_Jobs,), {"jobs": jobs, "seen": seen})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    ran: list[list[str]] = []
    monkeypatch.setattr("jobs.__main__._ray_job", lambda argv, auth, what: ran.append(argv) or 0)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield url, seen, jobs, ran
    finally:
        httpd.shutdown()
        httpd.server_close()


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


MALFORMED = ["a/b", "../x", "..", ".", "", "x y", "_x", "x\n", "x" * 129, "job?id=1", "j%2Fk",
             "é", "x\x00"]


@pytest.mark.parametrize("job_id", MALFORMED)
@pytest.mark.parametrize("verb", ["status", "logs", "stop"])
def test_a_malformed_job_id_is_exit_2_before_any_request(server, capsys, verb, job_id):
    url, seen, _, ran = server
    assert main([verb, job_id, "--address", url]) == exits.USAGE
    err = _one_line(capsys)
    assert f"JOB_ID {job_id!r}: not a job id" in err
    assert seen == [] and ran == []


def test_submit_refuses_a_malformed_submission_id_before_any_request(server, capsys):
    url, seen, _, ran = server
    assert main(["submit", "--address", url, "--submission-id", "a/b", "--",
                 "correctness", "--results", "/tmp/x"]) == exits.USAGE
    assert "--submission-id 'a/b': not a job id" in _one_line(capsys)
    assert seen == [] and ran == []


@pytest.mark.parametrize("verb", ["status", "logs", "stop"])
def test_an_id_the_server_does_not_know_is_one_line_and_exit_2(server, capsys, verb):
    url, _, _, ran = server
    assert main([verb, "nope-1", "--address", url]) == exits.USAGE
    assert f"JOB_ID 'nope-1': no such job at {url}" in _one_line(capsys)
    assert ran == []


@pytest.mark.parametrize("job_id, says", [("boom", "answered 500 for job 'boom'"),
                                          ("junk", "did not answer for job 'junk'")])
@pytest.mark.parametrize("verb", ["status", "logs", "stop"])
def test_a_server_that_errs_is_one_line_and_exit_3(server, capsys, verb, job_id, says):
    url, _, _, ran = server
    assert main([verb, job_id, "--address", url]) == exits.INFRA
    assert says in _one_line(capsys)
    assert ran == []


@pytest.mark.parametrize("verb", ["status", "logs", "stop"])
def test_a_known_job_goes_to_the_ray_command(server, verb):
    url, _, jobs, ran = server
    jobs["lamport-1"] = [({"status": "RUNNING"}, LOG)]
    assert main([verb, "lamport-1", "--address", url]) == exits.OK
    assert [argv[1:] for argv in ran] == [["job", verb, "--address", url, "lamport-1"]]


def test_a_ray_command_that_fails_with_a_traceback_is_one_line_and_exit_3(capsys):
    from jobs.__main__ import _ray_job
    argv = [sys.executable, "-c", "import sys; print('Job status: x'); "
            "raise RuntimeError('Request failed with status code 500: boom')"]
    with pytest.raises(hd.InfraError, match=r"ray job stop x failed: RuntimeError: Request "
                                            r"failed with status code 500: boom"):
        _ray_job(argv, hd.Auth({}, "none"), "ray job stop x")
    argv = [sys.executable, "-c", "import sys; sys.stderr.write('a warning\\n'); sys.exit(4)"]
    assert _ray_job(argv, hd.Auth({}, "none"), "ray job stop x") == 4
    assert capsys.readouterr().err == "a warning\n"  # passed on as it was


def test_status_wait_running_waits_for_the_first_case_line(server, capsys):
    url, seen, jobs, ran = server
    jobs["cut-1"] = [({"status": "PENDING"}, ""), ({"status": "RUNNING"}, "ray: joining\n"),
                     ({"status": "RUNNING"}, "ray: joining\n"), ({"status": "RUNNING"}, LOG)]
    assert main(["status", "cut-1", "--address", url, "--wait", "running"]) == exits.OK
    out = capsys.readouterr().out
    assert f"job cut-1: running, first case: {' '.join(CASE.split())}\n" == out
    assert sum(p.endswith("/logs") for p in seen) >= 2  # it looked, then looked again
    assert len(ran) == 1 and ran[0][1:3] == ["job", "status"]


def test_stop_wait_running_stops_at_once_from_this_process(server, capsys):
    """The README's interrupt example: the stop lands as soon as the first
    case's line shows, with no process (the ray CLI) started in between;
    a job that ended first is not stopped."""
    url, seen, jobs, ran = server
    jobs["cut-1"] = [({"status": "PENDING"}, ""), ({"status": "RUNNING"}, LOG)]
    assert main(["stop", "cut-1", "--address", url, "--wait", "running"]) == exits.OK
    assert capsys.readouterr().out == (
        f"job cut-1: running, first case: {' '.join(CASE.split())}\n"
        "job cut-1: stop requested (SIGTERM: it ends after the case in hand)\n")
    assert seen[-1] == "POST /api/jobs/cut-1/stop" and ran == []
    jobs["quick-1"] = [({"status": "SUCCEEDED", "driver_exit_code": 0}, LOG)]
    assert main(["stop", "quick-1", "--address", url, "--wait", "running"]) == exits.OK
    assert capsys.readouterr().out == ("job quick-1: ended SUCCEEDED before a case line\n"
                                       "job quick-1: not running, nothing to stop\n")
    assert not any(p.startswith("POST") and "quick-1" in p for p in seen) and ran == []


def test_status_wait_running_times_out_in_one_line_exit_3(server, capsys):
    url, _, jobs, ran = server
    jobs["slow-1"] = [({"status": "PENDING"}, "")]
    assert main(["status", "slow-1", "--address", url, "--wait", "running",
                 "--timeout", "1"]) == exits.INFRA
    err = _one_line(capsys)
    assert "job slow-1" in err and "no case started within 1 s (status PENDING)" in err, err
    assert ran == []


def test_status_wait_running_reports_a_job_that_ended_first(server, capsys):
    url, _, jobs, ran = server
    jobs["quick-1"] = [({"status": "SUCCEEDED", "driver_exit_code": 0}, LOG)]
    assert main(["status", "quick-1", "--address", url, "--wait", "running"]) == exits.OK
    assert capsys.readouterr().out == "job quick-1: ended SUCCEEDED before a case line\n"
    jobs["bad-1"] = [({"status": "FAILED", "driver_exit_code": 1}, LOG)]
    assert main(["status", "bad-1", "--address", url, "--wait", "running"]) == exits.FAILED


@pytest.mark.parametrize("log, line", [
    (LOG, CASE),
    ("ray: joined\n== correctness ==\njob  op\n----\n   >> rank 1 killed\n", None),
    ("correctness all_reduce_norm before any table\n", None),  # not under a table's rule
    ("", None),
])
def test_first_case_line(log, line):
    assert hd.first_case_line(log) == line


def test_head_start_dir_that_is_a_file_is_one_line_and_exit_2(tmp_path, capsys):
    file = tmp_path / "notes.txt"
    file.write_text("mine\n")
    for where in (file, file / "sub"):
        assert main(["head", "start", "--dir", str(where)]) == exits.USAGE
        assert f"--dir {where}: " in _one_line(capsys)
    assert file.read_text() == "mine\n" and list(tmp_path.iterdir()) == [file]
