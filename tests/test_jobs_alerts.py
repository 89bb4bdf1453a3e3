"""``nightly --notify URL`` / ``--summary-md FILE`` (jobs/alerts.py): the
message built from a results store, checked field by field; delivery to a
local HTTP server that records what it receives, one that fails twice then
accepts, one that never answers; and a real (tiny) nightly that ends green
and on time with a webhook that never answers."""

import datetime as dt
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from jobs import __main__ as cli
from jobs import alerts
from jobs.results import ResultsWriter, make_row, read_results
from jobs.results import runs as runs_mod

REPO = Path(__file__).resolve().parents[1]

PROFILE = dict(op="all_reduce_norm", variant="watchdog", transport="unicast",
               placement="process-per-gpu", backend="gpu", tp=1, hidden=7168, tokens=1,
               dtype="bfloat16", gpu_model="NVIDIA H200", job="profile")
CORR = dict(op="all_reduce_norm", variant="watchdog", transport="unicast", placement="emulated",
            backend="emulated", tp=2, hidden=1024, dtype="bfloat16", job="correctness")


class Recorder:
    """A local webhook: records every JSON body; ``fail_first`` answers
    500 to that many requests first."""

    def __init__(self, fail_first: int = 0):
        self.bodies, self.failed, self.fail_first = [], 0, fail_first
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if outer.failed < outer.fail_first:
                    outer.failed += 1
                    self.send_response(500)
                    self.end_headers()
                    return
                outer.bodies.append((self.headers["Content-Type"], json.loads(body)))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder():
    made = []

    def make(**kw):
        made.append(Recorder(**kw))
        return made[-1]
    yield make
    for r in made:
        r.close()


@pytest.fixture
def silent_url():
    """A server that takes the connection and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield f"http://127.0.0.1:{s.getsockname()[1]}/never"
    s.close()


def _store(root: Path) -> str:
    """Five nightly runs of a profile case at 10 us, then a run at 15 us
    with a wrong element, a hang and a pass; returns the last run's id."""
    start = dt.datetime(2026, 11, 20, 2, 0, tzinfo=dt.timezone.utc)
    for i in range(6):
        w = ResultsWriter(root, suite="nightly", trigger="nightly")
        when = start + dt.timedelta(days=i)
        w.append(make_row(started_at=when, finished_at=when, outcome="pass", t_n=100,
                          t_median_us=15.0 if i == 5 else 10.0 + 0.01 * i, **PROFILE))
        if i < 5:
            continue
        w.append([
            make_row(started_at=when, outcome="pass", tokens=1, extra={"inputs": "random"},
                     **CORR),
            make_row(started_at=when, outcome="fail", tokens=3, mismatches=7, reason="7 wrong",
                     repro_command="python -m jobs correctness --suite nightly --tp 2",
                     extra={"inputs": "random"}, **CORR),
            make_row(started_at=when, outcome="hang", tokens=8, reason="rank 1 never published",
                     repro_command="python -m jobs correctness --suite nightly --tp 2 --tokens 8",
                     extra={"inputs": "sentinel_pattern"}, **CORR)])
        runs_mod.begin(root, w.run_id, trigger="nightly", facts={"git_commit": "abc123"})
        runs_mod.finish(root, w.run_id)
        return w.run_id


def test_the_message_field_by_field(tmp_path):
    run_id = _store(tmp_path / "results")
    msg = alerts.message(tmp_path / "results", run_id, site=tmp_path / "site", exit_status=1)
    assert msg["format"] == "lamport-lab.alert/1"
    assert msg["run_id"] == run_id
    assert msg["status"] == "red" and msg["has_news"] is True
    assert msg["run_status"] == "finished" and msg["exit_status"] == 1
    assert msg["trigger"] == "nightly" and msg["suites"] == ["nightly"]
    assert msg["git_commit"] == "abc123"
    assert msg["counts"] == {"pass": 2, "fail": 1, "hang": 1, "error": 0, "skipped": 0}
    assert msg["regressions"] == 1
    assert msg["headline"] == f"lamport-lab nightly {run_id}: 1 regressed, 1 hang, 1 fail"
    kinds = [w["kind"] for w in msg["worst"]]
    assert kinds == ["hang", "fail", "regressed"]   # worst first
    hang, fail, reg = msg["worst"]
    assert hang["case"] == ("correctness all_reduce_norm tp=2 hidden=1024 M=8 emulated "
                            "sentinel_pattern")
    assert hang["repro_command"] == "python -m jobs correctness --suite nightly --tp 2 --tokens 8"
    assert hang["reason"] == "rank 1 never published"
    assert fail["repro_command"] == "python -m jobs correctness --suite nightly --tp 2"
    assert reg["repro_command"].startswith("python -m jobs profile --suite nightly --backend gpu "
                                           "--ops all_reduce_norm --tp 1 --hidden 7168")
    assert "+49." in reg["reason"] or "+50." in reg["reason"]
    assert msg["more"] == 0
    base = (tmp_path / "site").resolve().as_uri()
    assert msg["links"]["overview"] == f"{base}/index.html"
    assert msg["links"]["run"] == f"{base}/environment.html#run-{run_id}"
    text = msg["text"]
    assert text.startswith(f"### {msg['headline']}\n")
    assert "| 2 | 1 | 1 | 0 | 0 | 1 |" in text
    assert "`python -m jobs correctness --suite nightly --tp 2 --tokens 8`" in text
    assert f"[overview]({base}/index.html)" in text
    with_url = alerts.message(tmp_path / "results", run_id, site=tmp_path / "site",
                              site_url="https://ci.example/lab/")
    assert with_url["links"]["faults"] == "https://ci.example/lab/faults.html"


def test_a_green_run_has_nothing_to_say(tmp_path):
    w = ResultsWriter(tmp_path, suite="smoke", trigger="nightly")
    now = dt.datetime.now(dt.timezone.utc)
    w.append(make_row(started_at=now, outcome="pass", tokens=1, **CORR))
    runs_mod.begin(tmp_path, w.run_id, trigger="nightly")
    runs_mod.finish(tmp_path, w.run_id)
    msg = alerts.message(tmp_path, w.run_id)
    assert (msg["status"], msg["has_news"], msg["worst"], msg["links"]) == \
        ("green", False, [], {})
    runs_mod.begin(tmp_path, "r-cut", trigger="nightly")
    runs_mod.interrupt(tmp_path, "r-cut", by="SIGTERM")
    assert alerts.message(tmp_path, "r-cut")["headline"].endswith("run interrupted")


def test_delivery_records_the_payload(recorder):
    r = recorder()
    out = alerts.post(r.url, {"text": "hi", "n": 1}, backoff_s=0.05)
    assert out["ok"] and out["attempts"] == 1 and out["status"] == 200
    assert r.bodies == [("application/json", {"text": "hi", "n": 1})]


def test_a_server_failing_twice_then_accepting(recorder):
    r = recorder(fail_first=2)
    t0 = time.monotonic()
    out = alerts.post(r.url, {"text": "x"}, backoff_s=0.2)
    assert out["ok"] and out["attempts"] == 3 and r.failed == 2 and len(r.bodies) == 1
    assert time.monotonic() - t0 >= 0.2 + 0.4   # backoff doubled


def test_a_server_that_never_answers_is_bounded(silent_url, recorder):
    r = recorder(fail_first=99)
    t0 = time.monotonic()
    out = alerts.deliver([silent_url, r.url], {"text": "x"}, budget_s=3.0,
                         timeout_s=1.0, backoff_s=0.1)
    took = time.monotonic() - t0
    assert took < 4.0, took
    assert [d["ok"] for d in out] == [False, False]
    assert "timed out" in out[0]["error"] or "Timeout" in out[0]["error"], out[0]
    assert out[1]["error"].startswith("HTTP 500")


def test_bad_usage_is_refused_before_anything_runs(tmp_path, capsys):
    assert cli.main(["nightly", "--notify", "ftp://x/y", "--results", str(tmp_path / "r")]) == 2
    assert ("argument --notify: ftp://x/…redacted is not an http:// or https:// URL with a host"
            in capsys.readouterr().err)
    assert cli.main(["nightly", "--notify", "http://127.0.0.1:9/", "--no-results"]) == 2
    assert "drop --no-results" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


TINY = """
format = 1
name = "tiny"
version = 1
description = "one tp=2 group, two cases"

[[correctness]]
op = "all_reduce_norm"
tp = [2]
hidden = [256]
tokens = [1, 3]
inputs = ["random"]
repeats = 1
"""


SECRET_PATH = "/services/T0SECRET/B1SECRET/xyzSECRETtoken"
"""A webhook's path: its secret. Nothing the nightly writes may hold it."""


def _answering(reply: bytes):
    """A server that answers every connection with ``reply`` and closes it;
    its base URL."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)

    def serve():
        while True:
            try:
                conn, _ = s.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.recv(65536)
                    conn.sendall(reply)
                except OSError:
                    pass
    threading.Thread(target=serve, daemon=True).start()
    return s, f"http://127.0.0.1:{s.getsockname()[1]}"


def _redacted(url: str) -> str:
    return url.split("/", 3)[0] + "//" + url.split("/", 3)[2] + "/…redacted"


@pytest.mark.xdist_group("ray")
@pytest.mark.timeout(600)
def test_a_nightly_stays_green_and_on_time_with_a_silent_webhook(tmp_path, silent_url,
                                                                   recorder):
    """Five webhooks, each with a secret path, given three ways (--notify,
    --notify-env, --notify-file): one never answers, one redirects to a URL
    http.client refuses (InvalidURL), one answers garbage (BadStatusLine),
    one records. The nightly is green and exits 0; the summary is appended
    to what an earlier step wrote; the secret path is in nothing it wrote
    (stdout, stderr, every file under results/ and site/, the summary)."""
    suite = tmp_path / "tiny.toml"
    suite.write_text(TINY)
    r = recorder()
    garbage_sock, garbage = _answering(b"garbage\r\n\r\n")
    redirect_sock, redirect = _answering(b"HTTP/1.1 302 Found\r\nLocation: "
                                         b"http://127.0.0.1:notaport/x\r\n"
                                         b"Content-Length: 0\r\n\r\n")
    silent, redirect, recording, garbage = (silent_url + SECRET_PATH, redirect + SECRET_PATH,
                                            r.url + SECRET_PATH, garbage + SECRET_PATH)
    hook_file = tmp_path / "hook.txt"
    hook_file.write_text(garbage + "\n")
    summary = tmp_path / "summary.md"
    summary.write_text("## an earlier step\n")  # a CI job summary: appended to
    argv = [sys.executable, "-m", "jobs", "nightly", "--config", str(suite), "--jobs",
            "correctness", "--results", str(tmp_path / "results"), "--site",
            str(tmp_path / "site"), "--notify", silent, "--notify", redirect,
            "--notify-env", "HOOK_OK", "--notify-file", str(hook_file),
            "--notify-on", "always", "--summary-md", str(summary)]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["HOOK_OK"] = recording
    t0 = time.monotonic()
    try:
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=500,
                              env=env)
    finally:
        garbage_sock.close()
        redirect_sock.close()
    took = time.monotonic() - t0
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    # the silent hook cost its budget at most (alerts.BUDGET_S), and the
    # recording one still got the message within what was left
    line = next(x for x in out.splitlines() if x.startswith(f"alerts: {_redacted(silent)}"))
    assert "NOT delivered" in line, line
    spent = float(line.rsplit(", ", 1)[1].split(" s")[0])
    assert spent <= alerts.BUDGET_S + 1
    assert f"alerts: {_redacted(recording)}: delivered after 1 attempt(s)" in out
    assert f"alerts: {_redacted(redirect)}: NOT delivered (InvalidURL: " in out, out[-3000:]
    assert f"alerts: {_redacted(garbage)}: NOT delivered (BadStatusLine: " in out, out[-3000:]
    assert len(r.bodies) == 1
    ctype, body = r.bodies[0]
    assert ctype == "application/json"
    assert body["status"] == "green" and body["run_status"] == "finished"
    assert body["counts"] == {"pass": 2, "fail": 0, "hang": 0, "error": 0, "skipped": 0}
    assert body["suites"] == ["tiny"] and body["exit_status"] == 0
    assert body["links"]["overview"] == (tmp_path / "site").resolve().as_uri() + "/index.html"
    assert summary.read_text() == "## an earlier step\n\n" + body["text"]
    manifest = runs_mod.read_manifest(tmp_path / "results", body["run_id"])
    (entry,) = manifest["notify"]
    assert [d["ok"] for d in entry["deliveries"]] == [False, False, True, False]
    assert [d["url"] for d in entry["deliveries"]] == \
        [_redacted(u) for u in (silent, redirect, recording, garbage)]
    assert took < 300, took
    # the secret is in nothing the run wrote
    written = [p for top in ("results", "site") for p in (tmp_path / top).rglob("*")
               if p.is_file()] + [summary]
    assert len(written) > 10
    assert "SECRET" not in out
    leaks = [str(p) for p in written if b"SECRET" in p.read_bytes()]
    assert not leaks, leaks
    # the run's own rows carry the straggler columns, and its site their section
    rows = read_results(tmp_path / "results").to_pylist()
    ranked = [r for r in rows if r["job"] == "correctness"]
    assert len(ranked) == 2 and all(r["publish_skew_us"] is not None and
                                    len(r["publish_offsets_us"]) == 2 and
                                    r["last_rank"] in (0, 1) for r in ranked)
    page = (tmp_path / "site" / "stragglers.html").read_text()
    assert "all_reduce_norm tp=2 hidden=256 emulated" in page and "2 case(s), 2 call(s)" in page
