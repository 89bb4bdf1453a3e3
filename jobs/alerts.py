"""Alerts: what a nightly run has to say, posted to webhooks and written as
Markdown (``nightly --notify URL`` and ``--summary-md FILE``; docs/alerts.md).

A run has something to say when it regressed (the regression rule of
:mod:`jobs.regression` on its timed cases), has failing rows (``fail``,
``error``), hangs, or did not end ``finished`` (interrupted, incomplete).
Then one message per run goes to every webhook (``--notify URL``, or kept
out of the command line: ``--notify-env VAR``, ``--notify-file PATH``;
:func:`webhooks`): one JSON object (:func:`message`), the generic webhook
form that chat tools and CI systems take (``text``: a Markdown summary
that Slack, Mattermost, Rocket.Chat and Teams' incoming webhooks show as
is; the rest, the same facts as fields for a program). ``--summary-md``
appends the same as Markdown to a file, for a CI system's job summary,
whatever the run had to say.

A webhook URL is a secret: it is checked whole before Ray starts and only
ever shown redacted (:mod:`jobs.urls`): in every line printed, in the
manifest, in the command that resumes the run.

A delivery is retried with backoff (:data:`ATTEMPTS` attempts,
:data:`BACKOFF_S` doubling), each attempt bounded by :data:`ATTEMPT_TIMEOUT_S`
and all deliveries of a run together (posted at once) by :data:`BUDGET_S`; what happened to
each URL is logged and recorded in the run's manifest (``notify``). A
delivery never fails the nightly (an exception of any type is a delivery
not made) and never touches a row.
"""

from __future__ import annotations

import datetime as dt
import http.client
import json
import os
import re
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

FORMAT = "lamport-lab.alert/1"
ATTEMPTS = 3
BACKOFF_S = 1.0
ATTEMPT_TIMEOUT_S = 5.0
BUDGET_S = 30.0
"""Bound on the time all of a run's deliveries take together."""
WORST = 5
"""Cases the message lists, worst first."""
FAILING = ("hang", "fail", "error")
_SEVERITY = {"hang": 0, "fail": 1, "error": 2, "regressed": 3}


def check_url(text: str) -> str:
    """``--notify``: a webhook :func:`jobs.urls.check_webhook` takes
    (argparse type: else one line naming it redacted, exit 2 before
    anything runs)."""
    import argparse

    from jobs.urls import check_webhook
    try:
        return check_webhook(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def check_site_url(text: str) -> str:
    """``--site-url``: http(s)://host... or a relative path
    (:func:`jobs.urls.check_site_url`; argparse type)."""
    import argparse

    from jobs.urls import check_site_url as check
    try:
        return check(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DEFAULT_ENV = "LAMPORT_NOTIFY_URL"
"""The variable the docs, the deploy files and a resume command name for
``--notify-env``."""


def env_name(text: str) -> str:
    """``--notify-env``: an environment variable's name (argparse type)."""
    import argparse
    if not ENV_NAME.match(text):
        raise argparse.ArgumentTypeError(f"expected an environment variable's name "
                                         f"(letters, digits, _), got {text!r}")
    return text


def webhooks(args) -> list[str]:
    """Every webhook the run posts to: ``--notify`` URLs, then the value of
    each ``--notify-env`` variable, then the first line of each
    ``--notify-file``, each checked whole (:func:`jobs.urls.check_webhook`).
    Read by the driver before Ray starts (a submitted job reads the
    variables and files of the cluster it runs on); ConfigError (exit 2)
    naming the option, the variable or file, and the URL redacted."""
    from jobs.config import ConfigError
    from jobs.urls import MAX_LENGTH, check_webhook
    urls = list(getattr(args, "notify", None) or ())
    for name in getattr(args, "notify_env", None) or ():
        value = os.environ.get(name, "")
        if not value.strip():
            raise ConfigError(f"--notify-env {name}: the variable is "
                              f"{'empty' if name in os.environ else 'not set'}; set it to the "
                              f"webhook URL")
        try:
            urls.append(check_webhook(value.strip()))
        except ValueError as err:
            raise ConfigError(f"--notify-env {name}: {err}") from None
    for path in getattr(args, "notify_file", None) or ():
        try:
            with open(path, "rb") as f:
                line = f.readline(MAX_LENGTH + 2).decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"--notify-file {path}: its first line is not UTF-8 text") \
                from None
        except OSError as err:
            raise ConfigError(f"--notify-file {path}: cannot read it "
                              f"({err.strerror or type(err).__name__})") from None
        if not line.strip():
            raise ConfigError(f"--notify-file {path}: its first line is empty; write the "
                              f"webhook URL there")
        try:
            urls.append(check_webhook(line.strip()))
        except ValueError as err:
            raise ConfigError(f"--notify-file {path}: {err}") from None
    return urls


def secret_free(argv: list[str]) -> tuple[list[str], list[str]]:
    """``argv`` with each ``--notify URL`` (a secret) replaced by
    ``--notify-env VAR`` (:data:`DEFAULT_ENV`, then ``DEFAULT_ENV_2``...),
    and the variables so named, in order: the command may be printed,
    logged and run again once they are exported."""
    out, names, i = [], [], 0
    while i < len(argv):
        word = argv[i]
        if word == "--notify" or word.startswith("--notify="):
            names.append(DEFAULT_ENV + (f"_{len(names) + 1}" if names else ""))
            out += ["--notify-env", names[-1]]
            i += 1 if word.startswith("--notify=") else 2
            continue
        out.append(word)
        i += 1
    return out, names


def _case(row: dict) -> str:
    label = f"{row.get('job') or '-'} {row['op']} tp={row['tp']} hidden={row['hidden']} " \
            f"M={row['tokens']}"
    extra = json.loads(row.get("extra") or "{}") if isinstance(row.get("extra"), str) else {}
    what = extra.get("inputs") or row.get("fault_kind")
    return label + (f" {row['placement']}" if row.get("placement") else "") + \
        (f" {what}" if what else "")


def _site_links(site: Path | None, site_url: str | None, run_id: str) -> dict[str, str]:
    if site is None:
        return {}
    base = site_url.rstrip("/") + "/" if site_url else Path(site).resolve().as_uri() + "/"
    return {"overview": base + "index.html",
            "run": base + f"environment.html#run-{run_id}",
            "correctness": base + "correctness.html",
            "faults": base + "faults.html",
            "trends": base + "trends.html",
            "latency": base + "latency.html"}


def message(results: Path, run_id: str, *, rule=None, site: Path | None = None,
            site_url: str | None = None, exit_status: int | None = None) -> dict[str, Any]:
    """The run's alert: counts, regressions, the worst cases with their
    repro commands, the links to its pages, and ``text``: all of it as
    Markdown (:func:`markdown`). ``has_news``: whether it has something to
    say (regressions, failures, hangs, a run not finished)."""
    from jobs import regression
    from jobs.results import read_results
    from jobs.results.runs import effective_status, read_manifest
    table = read_results(results, filters={"run_id": run_id})
    rows = table.to_pylist()
    counts = Counter(r["outcome"] for r in rows)
    manifest = read_manifest(results, run_id) or {}
    status = effective_status(manifest)
    verdicts = regression.detect(results, run_id, rule or regression.Rule())
    regressed = sorted((v for v in verdicts if v.status == "regressed" and not v.is_baseline),
                       key=lambda v: -(v.change or 0))
    worst = []
    for r in sorted((r for r in rows if r["outcome"] in FAILING),
                    key=lambda r: (_SEVERITY[r["outcome"]], -(r.get("mismatches") or 0))):
        worst.append({"kind": r["outcome"], "case": _case(r), "suite": r["suite"],
                      "reason": r.get("reason"), "repro_command": r.get("repro_command")})
    for v in regressed:
        c = v.case
        worst.append({"kind": "regressed", "suite": c["suite"],
                      "case": f"profile {c['op']} tp={c['tp']} hidden={c['hidden']} "
                              f"M={c['tokens']} {c['variant']}",
                      "reason": v.describe(), "repro_command": regression.repro(v)})
    commits = sorted({r.get("git_commit") for r in rows if r.get("git_commit")})
    news = []
    if regressed:
        news.append(f"{len(regressed)} regressed")
    news += [f"{counts[o]} {o}" for o in FAILING if counts[o]]
    if status != "finished":
        news.append(f"run {status}")
    msg = {
        "format": FORMAT,
        "run_id": run_id,
        "status": "red" if news else "green",
        "run_status": status,
        "exit_status": exit_status,
        "trigger": manifest.get("trigger") or (rows[0]["trigger"] if rows else None),
        "suites": sorted({r["suite"] for r in rows}),
        "git_commit": commits[0] if len(commits) == 1 else (commits or None),
        "counts": {o: counts[o] for o in ("pass", "fail", "hang", "error", "skipped")},
        "regressions": len(regressed),
        "has_news": bool(news),
        "headline": (f"lamport-lab nightly {run_id}: " + (", ".join(news) if news else
                                                          "green")),
        "worst": worst[:WORST],
        "more": max(0, len(worst) - WORST),
        "links": _site_links(site, site_url, run_id),
    }
    msg["text"] = markdown(msg)
    return msg


def markdown(msg: dict[str, Any]) -> str:
    """The message as Markdown (the ``text`` field and ``--summary-md``)."""
    c = msg["counts"]
    lines = [f"### {msg['headline']}", "",
             f"run `{msg['run_id']}` ({msg['run_status']}, trigger {msg['trigger']}, "
             f"suite(s) {', '.join(msg['suites']) or '-'}, commit "
             f"`{msg['git_commit'] or 'unknown'}`)", "",
             "| pass | fail | hang | error | skipped | regressed |",
             "| --- | --- | --- | --- | --- | --- |",
             f"| {c['pass']} | {c['fail']} | {c['hang']} | {c['error']} | {c['skipped']} "
             f"| {msg['regressions']} |"]
    if msg["worst"]:
        lines += ["", "Worst cases:", ""]
        for w in msg["worst"]:
            lines.append(f"- **{w['kind']}** {w['case']}: {w['reason'] or ''}".rstrip(": "))
            if w["repro_command"]:
                lines.append(f"  `{w['repro_command']}`")
        if msg["more"]:
            lines.append(f"- and {msg['more']} more (the run's pages)")
    if msg["links"]:
        lines += ["", " · ".join(f"[{k}]({v})" for k, v in msg["links"].items())]
    return "\n".join(lines) + "\n"


RETRIED = (urllib.error.URLError, OSError, http.client.HTTPException)
"""Failures a later attempt may not meet (no answer, a refused or reset
connection, a timeout, an error status, a garbled answer); any other
exception (``http.client.InvalidURL``, e.g. from a redirect, a ValueError,
anything) ends the delivery at once."""


def _failure(err: BaseException, url: str) -> str:
    """``Type: message`` of a failed attempt, scrubbed of ``url``."""
    from jobs.urls import scrub
    why = getattr(err, "reason", None) if isinstance(err, urllib.error.URLError) else None
    return scrub(f"{type(err).__name__}: {why or err}", url)


def post(url: str, payload: dict, *, attempts: int = ATTEMPTS, backoff_s: float = BACKOFF_S,
         timeout_s: float = ATTEMPT_TIMEOUT_S, deadline: float | None = None) -> dict:
    """POST ``payload`` as JSON to ``url``, retrying a failure (no answer,
    an error status) after ``backoff_s``, doubling, within ``attempts`` and
    ``deadline`` (time.monotonic); returns what happened: url (redacted),
    ok, attempts, status, error (its type and message, scrubbed of the
    URL), seconds. Never raises (an exception of any type is a failed
    delivery)."""
    from jobs.urls import redact, scrub
    t0 = time.monotonic()
    out = {"url": redact(url), "ok": False, "attempts": 0, "status": None, "error": None}
    try:
        body = json.dumps(payload).encode()
        deadline = t0 + BUDGET_S if deadline is None else deadline
        wait = backoff_s
        for attempt in range(attempts):
            left = deadline - time.monotonic()
            if left <= 0.05:
                out["error"] = f"{out['error'] or 'not sent'} (time budget spent)"
                break
            out["attempts"] = attempt + 1
            try:
                req = urllib.request.Request(url, data=body, method="POST",
                                             headers={"Content-Type": "application/json",
                                                      "User-Agent": "lamport-lab-nightly"})
                with urllib.request.urlopen(req, timeout=min(timeout_s, left)) as resp:
                    out["status"] = resp.status
                    if 200 <= resp.status < 300:
                        out.update(ok=True, error=None)
                        break
                    out["error"] = f"HTTP {resp.status}"
            except urllib.error.HTTPError as err:
                out.update(status=err.code, error=scrub(f"HTTP {err.code} {err.reason}", url))
            except http.client.InvalidURL as err:  # (an HTTPException) no attempt mends it
                out["error"] = _failure(err, url)
                break
            except RETRIED as err:
                out["error"] = _failure(err, url)
            if attempt + 1 < attempts:
                time.sleep(max(0.0, min(wait, deadline - time.monotonic())))
                wait *= 2
    except Exception as err:  # noqa: BLE001 - a delivery never fails the nightly
        out["error"] = _failure(err, url)
    out["seconds"] = round(time.monotonic() - t0, 3)
    return out


def deliver(urls, payload: dict, *, budget_s: float = BUDGET_S, **kwargs) -> list[dict]:
    """Post ``payload`` to every URL at once (one thread each, so a URL
    that never answers does not starve the others), all within
    ``budget_s``; the deliveries (:func:`post`) in the order of ``urls``.
    Never raises: what fails is a delivery marked not ok."""
    from concurrent.futures import ThreadPoolExecutor
    urls = list(urls)
    if not urls:
        return []
    deadline = time.monotonic() + budget_s

    def one(url: str) -> dict:
        try:
            return post(url, payload, deadline=deadline, **kwargs)
        except Exception as err:  # noqa: BLE001 - e.g. a bad keyword: still one line each
            from jobs.urls import redact
            return {"url": redact(url), "ok": False, "attempts": 0, "status": None,
                    "error": _failure(err, url), "seconds": 0.0}
    with ThreadPoolExecutor(max_workers=min(len(urls), 8)) as pool:
        return list(pool.map(one, urls))


def append_summary(path: Path, text: str) -> None:
    """Append ``text`` to ``path`` (made when missing, never truncated), a
    blank line first when the file already holds something: one
    ``write`` on an ``O_APPEND`` descriptor, so the block lands whole after
    what other steps wrote (a CI job summary, ``$GITHUB_STEP_SUMMARY``);
    OSError when it cannot, or when the write was cut short."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        data = (("\n" if os.fstat(fd).st_size else "") + text).encode("utf-8")
        wrote = os.write(fd, data)
        if wrote != len(data):
            raise OSError(f"only {wrote} of {len(data)} bytes written")
    finally:
        os.close(fd)


def notify(args, run_id: str, *, rule=None, exit_status: int | None = None,
           budget_s: float = BUDGET_S) -> None:
    """The nightly's alert part: the message appended to ``--summary-md``,
    and posted to each webhook (:func:`webhooks`, resolved before Ray
    started into ``args.notify``) when it has something to say; each
    delivery logged and recorded in the run's manifest, the URL redacted.
    Never raises: an alert is no part of the run's result."""
    urls = list(getattr(args, "notify", None) or ())
    summary = getattr(args, "summary_md", None)
    if not urls and summary is None:
        return
    try:
        site = None if args.no_dashboard else Path(args.site)
        msg = message(args.results, run_id, rule=rule, site=site,
                      site_url=getattr(args, "site_url", None), exit_status=exit_status)
    except Exception as err:  # noqa: BLE001 - an alert never fails the nightly
        print(f"alerts: could not build the run's message ({type(err).__name__}: {err}); "
              f"nothing sent", flush=True)
        return
    if summary is not None:
        try:
            append_summary(Path(summary), msg["text"])
            print(f"alerts: summary appended to {summary}", flush=True)
        except OSError as err:
            print(f"alerts: could not append to --summary-md {summary}: "
                  f"{err.strerror or err}", flush=True)
    if not urls:
        return
    if not msg["has_news"] and getattr(args, "notify_on", "news") != "always":
        print(f"alerts: run {run_id} is green, nothing to say; no message posted to "
              f"{len(urls)} URL(s) (--notify-on always posts a green run's too)", flush=True)
        return
    from jobs.urls import redact
    try:
        deliveries = deliver(urls, msg, budget_s=budget_s)
    except Exception as err:  # noqa: BLE001 - deliver does not raise; this is the last guard
        deliveries = [{"url": redact(u), "ok": False, "attempts": 0, "status": None,
                       "error": _failure(err, u), "seconds": 0.0} for u in urls]
    for d in deliveries:
        print(f"alerts: {d['url']}: " + ("delivered" if d["ok"] else
                                         f"NOT delivered ({d['error']})")
              + f" after {d['attempts']} attempt(s), {d['seconds']:.1f} s", flush=True)
    try:
        from jobs.results import runs
        runs.record_notify(args.results, run_id,
                           {"at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                            "headline": msg["headline"], "deliveries": deliveries})
    except Exception as err:  # noqa: BLE001
        print(f"alerts: could not record the deliveries in the manifest: {err}", flush=True)
