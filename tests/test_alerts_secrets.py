"""Webhook URLs are secrets (jobs/urls.py, jobs/alerts.py; issue 64 item 5
and 8, issue 66's appending summary): the validator against generated URLs
(Hypothesis: control characters, spaces, credentials, schemes, ports,
lengths), each refusal one line with the URL redacted; the URL read from
an environment variable or a file; ``--site-url`` and ``--summary-md``
checked before Ray starts; deliveries failing with exceptions of many
types, none escaping and none showing the secret; the resume command and
``submit`` keeping it out; the summary appended whole. No Ray here (the
nightly that greps everything it wrote is in tests/test_jobs_alerts.py)."""

from __future__ import annotations

import datetime as dt
import http.client
import multiprocessing
import socket
import urllib.error
import urllib.parse
import urllib.request
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs import __main__ as cli
from jobs import alerts, outputs, urls
from jobs.config import ConfigError
from jobs.results import ResultsWriter, make_row
from jobs.results import runs as runs_mod

SECRET = "T0SECRET/B1SECRET/xyzSECRETtoken"
HOOK = f"https://hooks.example.com/services/{SECRET}"
MARK = "SECRET"
"""In every generated path: no output may hold it."""

FUZZ = settings(max_examples=400, deadline=None, derandomize=True, database=None)

# ------------------------------------------------------------ the validator
SAFE = st.characters(min_codepoint=0x21, max_codepoint=0x7e)   # printable ASCII, no space
BAD = [" ", "\t", "\r", "\n", "\r\nX-Injected: 1", "\x00", "\x1b", "\x7f", "\x85",
       "\u2028", "é", "\u00a0", "\x0b"]


@st.composite
def webhook_urls(draw):
    """A URL built from parts, about a quarter of them good, with what the
    validator must decide: ``(url, [why it must be refused])``."""
    scheme = draw(st.sampled_from(["https"] * 8 + ["http"] * 6 +
                                  ["HTTPS", "ftp", "javascript", "file", ""]))
    user = draw(st.sampled_from([""] * 15 + ["user:pass@", "tok@", ":@"]))
    host = draw(st.sampled_from(["hooks.example.com", "127.0.0.1", "[::1]", "h"] * 2 + [""]))
    port = draw(st.sampled_from([""] * 12 + [":443", ":8080", ":0", ":65536", ":x", ":"]))
    safe = draw(st.text(SAFE, max_size=40))
    bad = draw(st.sampled_from([""] * 20 + BAD))
    at = draw(st.integers(0, len(safe)))
    path = "/" + MARK + safe[:at] + bad + safe[at:]
    pad = draw(st.sampled_from([0] * 15 + [2100]))
    url = f"{scheme}://{user}{host}{port}{path}{'a' * pad}"
    refused = []
    if scheme.lower() not in ("http", "https") or not host:
        refused.append("scheme or host")
    if user:
        refused.append("credentials")
    if port in (":0", ":65536", ":x"):
        refused.append("port")
    if any(c.isspace() or not c.isprintable() or not c.isascii() for c in url):
        refused.append("character")
    if len(url) > urls.MAX_LENGTH:
        refused.append("length")
    return url, refused


def _request_line_ok(url: str) -> None:
    """What urllib would send: http.client's own checks of the host and
    the request line (nothing is connected)."""
    req = urllib.request.Request(url, data=b"{}", method="POST")
    conn = http.client.HTTPConnection(req.host)
    conn.putrequest("POST", req.selector)


@FUZZ
@given(webhook_urls())
def test_the_webhook_validator_against_generated_urls(case):
    url, refused = case
    shown = urls.redact(url)
    assert MARK not in shown and "pass" not in shown and "tok@" not in shown
    try:
        assert urls.check_webhook(url) == url
    except ValueError as err:
        said = str(err)
        assert refused, (url, said)           # refused only for a reason
        assert MARK not in said and "\n" not in said and "\r" not in said, said
        assert "pass@" not in said and "tok@" not in said
        return
    assert not refused, (url, refused)        # accepted only when nothing is wrong
    _request_line_ok(url)                     # and then http.client takes it


@FUZZ
@given(st.text(max_size=60), st.sampled_from(["", "https://h.example/", "javascript:", "//x/"]))
def test_the_site_url_check_against_generated_text(tail, head):
    text = head + tail
    try:
        urls.check_site_url(text)
    except ValueError as err:
        assert "\n" not in str(err)
        return
    assert text and all(c.isascii() and c.isprintable() and not c.isspace() for c in text)
    assert not set(text) & set('<>"`\\')
    parts = urllib.parse.urlsplit(text)
    assert (parts.scheme in ("http", "https") and parts.hostname) or \
        not (parts.scheme or parts.netloc or ":" in text.split("/")[0])


@pytest.mark.parametrize("text", ["javascript:alert(1)", "JavaScript:alert(1)",
                                  "https://ci.example/lab\n[x](javascript:y)", "data:text/html,x",
                                  "//evil.example/x", "https://ci.example/a b", "vbscript:x",
                                  "https://ci.example/\x7f"])
def test_site_urls_refused(text):
    with pytest.raises(ValueError):
        urls.check_site_url(text)


@pytest.mark.parametrize("text", ["https://ci.example/lab/", "http://127.0.0.1:8765",
                                  "../site/", "/lamport/", "site", "lab/?x=1#top"])
def test_site_urls_taken(text):
    assert urls.check_site_url(text) == text


def test_redact_and_scrub():
    assert urls.redact(HOOK) == "https://hooks.example.com/…redacted"
    assert urls.redact("http://u:p@127.0.0.1:9/x?k=v") == "http://127.0.0.1:9/…redacted"
    assert urls.redact("no url at all " + SECRET) == "<redacted URL>"
    bad = "http://h.example/a b/" + SECRET
    said = "URL can't contain control characters. '/a b/%s' (found at least ' ')" % SECRET
    assert MARK not in urls.scrub(said, bad)
    assert MARK not in urls.scrub(repr(bad + "\r\n"), bad + "\r\n")
    assert urls.scrub("connection refused", HOOK) == "connection refused"


# ------------------------------------------------------------ the command line
def _nightly(tmp_path, *extra):
    return ["nightly", "--suite", "smoke", "--results", str(tmp_path / "r"), "--site",
            str(tmp_path / "s"), *extra]


def _refused(capsys, argv, *, named):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if "error" in x]
    assert len(lines) == 1, err
    assert named in lines[0], err
    assert MARK not in err and "pass@" not in err, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("url", [HOOK + " x", HOOK + "\r\nX-Injected: 1", HOOK + "\t",
                                 "https://user:pass@hooks.example.com/" + SECRET,
                                 "ftp://hooks.example.com/" + SECRET, HOOK + "\x7f",
                                 "https://hooks.example.com:99999/" + SECRET,
                                 "https://hooks.example.com/" + SECRET + "a" * 3000])
def test_a_bad_notify_url_is_one_line_redacted(tmp_path, capsys, url):
    line = _refused(capsys, _nightly(tmp_path, "--notify", url), named="argument --notify")
    assert "hooks.example.com" in line
    assert not (tmp_path / "r").exists() and not (tmp_path / "s").exists()


def test_the_url_from_an_environment_variable_or_a_file(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("LAMPORT_NOTIFY_URL", raising=False)
    _refused(capsys, _nightly(tmp_path, "--notify-env", "LAMPORT_NOTIFY_URL"),
             named="--notify-env LAMPORT_NOTIFY_URL: the variable is not set")
    monkeypatch.setenv("LAMPORT_NOTIFY_URL", "")
    _refused(capsys, _nightly(tmp_path, "--notify-env", "LAMPORT_NOTIFY_URL"),
             named="--notify-env LAMPORT_NOTIFY_URL: the variable is empty")
    monkeypatch.setenv("LAMPORT_NOTIFY_URL", HOOK + "\r\nX: y")
    _refused(capsys, _nightly(tmp_path, "--notify-env", "LAMPORT_NOTIFY_URL"),
             named="--notify-env LAMPORT_NOTIFY_URL: https://hooks.example.com/…redacted")
    _refused(capsys, _nightly(tmp_path, "--notify-env", "NOT-A-NAME"),
             named="argument --notify-env: expected an environment variable's name")
    missing = tmp_path / "nohook"
    _refused(capsys, _nightly(tmp_path, "--notify-file", str(missing)),
             named=f"--notify-file {missing}: cannot read it")
    empty = tmp_path / "empty"
    empty.write_text("\n" + HOOK + "\n")
    _refused(capsys, _nightly(tmp_path, "--notify-file", str(empty)),
             named=f"--notify-file {empty}: its first line is empty")
    creds = tmp_path / "creds"
    creds.write_text("https://me:pw@hooks.example.com/" + SECRET + "\n")
    _refused(capsys, _nightly(tmp_path, "--notify-file", str(creds)), named="credentials")
    assert not (tmp_path / "r").exists()
    # taken: the variable's value and the file's first line (stripped), in order
    monkeypatch.setenv("HOOK_A", HOOK + "/a\n")
    good = tmp_path / "hook"
    good.write_text(HOOK + "/b  \nignored second line\n")
    args = SimpleNamespace(notify=[HOOK], notify_env=["HOOK_A"], notify_file=[good])
    assert alerts.webhooks(args) == [HOOK, HOOK + "/a", HOOK + "/b"]


def test_summary_and_site_url_checked_before_ray(tmp_path, capsys):
    into = tmp_path / "no" / "such" / "folder" / "summary.md"
    _refused(capsys, _nightly(tmp_path, "--summary-md", str(into)),
             named=f"--summary-md {into}: its folder {into.parent} does not exist")
    _refused(capsys, _nightly(tmp_path, "--summary-md", str(tmp_path)),
             named="is not a regular file")
    for bad in ("javascript:alert(1)", "https://ci.example/\n# injected"):
        _refused(capsys, _nightly(tmp_path, "--site-url", bad), named="argument --site-url")
    assert not (tmp_path / "r").exists() and not into.parent.exists()


def test_submit_refuses_a_url_on_the_command_line(capsys):
    _refused(capsys, ["submit", "--", "nightly", "--suite", "smoke", "--results", "/tmp/x",
                      "--notify", HOOK], named="--notify URL: Ray keeps a submitted job's")


def test_the_resume_command_holds_no_secret():
    argv = ["nightly", "--suite", "smoke", "--notify", HOOK, f"--notify={HOOK}/2",
            "--notify-env", "MINE", "--summary-md", "s.md"]
    line = cli.resume_command(argv, "r1")
    assert MARK not in line
    assert ("--notify-env LAMPORT_NOTIFY_URL --notify-env LAMPORT_NOTIFY_URL_2 "
            "--notify-env MINE --summary-md s.md --run-id r1 --resume") in line
    assert alerts.secret_free(["smoke", "--notify-on", "always"]) == \
        (["smoke", "--notify-on", "always"], [])


# ------------------------------------------------------------ delivery
RAISED = [http.client.InvalidURL(f"URL can't contain control characters. '/services/{SECRET}'"),
          ValueError(f"unknown url type: {HOOK!r}"),
          OSError(101, "Network is unreachable"),
          TimeoutError("timed out"),
          socket.gaierror(-2, "Name or service not known"),
          urllib.error.URLError(ConnectionRefusedError(111, "Connection refused")),
          http.client.BadStatusLine("HTTP/9 garbage"),
          http.client.RemoteDisconnected("Remote end closed connection"),
          UnicodeEncodeError("latin-1", "é", 0, 1, "ordinal not in range"),
          RuntimeError(f"something else about {HOOK}"),
          KeyError(SECRET),
          MemoryError()]


@pytest.mark.parametrize("exc", RAISED, ids=lambda e: type(e).__name__)
def test_a_delivery_failing_with_any_exception_is_one_redacted_line(exc, monkeypatch):
    calls = []

    def urlopen(*a, **k):
        calls.append(1)
        raise exc
    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    (d,) = alerts.deliver([HOOK], {"text": "x"}, budget_s=2.0, backoff_s=0.01)
    assert d["ok"] is False and d["url"] == "https://hooks.example.com/…redacted"
    assert d["error"].startswith(type(exc).__name__), d
    assert MARK not in str(d), d
    assert 1 <= len(calls) <= alerts.ATTEMPTS


def _green_store(root):
    w = ResultsWriter(root, suite="smoke", trigger="nightly")
    now = dt.datetime.now(dt.timezone.utc)
    w.append(make_row(started_at=now, outcome="pass", tokens=1, op="all_reduce_norm",
                      variant="watchdog", transport="unicast", placement="emulated",
                      backend="emulated", tp=2, hidden=1024, dtype="bfloat16",
                      job="correctness"))
    runs_mod.begin(root, w.run_id, trigger="nightly")
    runs_mod.finish(root, w.run_id)
    return w.run_id


@pytest.mark.parametrize("where", ["urlopen", "deliver", "threads"])
def test_notify_never_raises_and_never_shows_the_secret(tmp_path, monkeypatch, capsys, where):
    """Whatever fails inside the alert part (the delivery, deliver itself,
    the thread pool), notify returns and prints one redacted line per URL:
    the nightly's exit status, computed before it, is what it returns."""
    run_id = _green_store(tmp_path / "results")
    boom = http.client.InvalidURL(f"bad '{SECRET}'")
    if where == "urlopen":
        monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: (_ for _ in ()).throw(boom))
    elif where == "deliver":
        def deliver(*a, **k):
            raise boom
        monkeypatch.setattr(alerts, "deliver", deliver)
    else:
        import concurrent.futures

        def no_threads(*a, **k):
            raise RuntimeError(f"can't start new thread for {HOOK}")
        monkeypatch.setattr(concurrent.futures, "ThreadPoolExecutor", no_threads)
    args = SimpleNamespace(notify=[HOOK, HOOK + "/2"], summary_md=None, no_dashboard=True,
                           site=None, results=tmp_path / "results", notify_on="always")
    assert alerts.notify(args, run_id, exit_status=0, budget_s=2.0) is None
    out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if x.startswith("alerts: https://")]
    assert len(lines) == 2 and all("NOT delivered" in x for x in lines), out
    assert MARK not in out
    manifest = runs_mod.read_manifest(tmp_path / "results", run_id)
    assert MARK not in str(manifest)
    assert [d["url"] for d in manifest["notify"][0]["deliveries"]] == \
        ["https://hooks.example.com/…redacted"] * 2


def test_a_green_run_posts_nothing_unless_always(tmp_path, monkeypatch, capsys):
    run_id = _green_store(tmp_path / "results")
    posted = []
    monkeypatch.setattr(alerts, "deliver", lambda urls, msg, **k: posted.append(urls) or [])
    args = SimpleNamespace(notify=[HOOK], summary_md=tmp_path / "s.md", no_dashboard=True,
                           site=None, results=tmp_path / "results", notify_on="news")
    alerts.notify(args, run_id, exit_status=0)
    out = capsys.readouterr().out
    assert posted == [] and "is green, nothing to say; no message posted to 1 URL(s)" in out
    assert (tmp_path / "s.md").read_text().startswith(f"### lamport-lab nightly {run_id}: green")
    args.notify_on = "always"
    alerts.notify(args, run_id, exit_status=0)
    assert posted == [[HOOK]]


# ------------------------------------------------------------ the summary appends
def test_the_summary_is_appended_never_truncated(tmp_path):
    path = tmp_path / "step_summary.md"
    path.write_text("## an earlier step\n")
    alerts.append_summary(path, "### first\n")
    alerts.append_summary(path, "### second\n")
    assert path.read_text() == "## an earlier step\n\n### first\n\n### second\n"
    new = tmp_path / "new.md"
    alerts.append_summary(new, "### only\n")
    assert new.read_text() == "### only\n"
    assert outputs.check_append_file("--summary-md", path) == path
    assert outputs.check_append_file("--summary-md", tmp_path / "fresh.md") == \
        tmp_path / "fresh.md"
    with pytest.raises(ConfigError, match="does not exist"):
        outputs.check_append_file("--summary-md", tmp_path / "gone" / "x.md")
    (tmp_path / "link.md").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="broken symbolic link"):
        outputs.check_append_file("--summary-md", tmp_path / "link.md")


def _append_many(path: str, tag: int, n: int, size: int) -> None:
    for i in range(n):
        alerts.append_summary(path, f"<<{tag}:{i}:{chr(ord('a') + tag) * size}>>\n")


def test_blocks_appended_at_once_land_whole(tmp_path):
    """Four processes append 25 blocks of 20 kB each to one file: every
    block is there, whole, on a line of its own (none cut by another)."""
    path = tmp_path / "summary.md"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(str(path), t, 25, 20_000)) for t in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    blocks = [line for line in path.read_text().splitlines() if line]
    assert len(blocks) == 100
    seen = set()
    for b in blocks:
        assert b.startswith("<<") and b.endswith(">>"), b[:40]
        tag, i, body = b[2:-2].split(":")
        assert body == chr(ord("a") + int(tag)) * 20_000
        seen.add((int(tag), int(i)))
    assert len(seen) == 100
