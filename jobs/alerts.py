"""Alerts: what a nightly run has to say, posted to webhooks and written as
Markdown (``nightly --notify URL`` and ``--summary-md FILE``; docs/alerts.md).

A run has something to say when it regressed (the regression rule of
:mod:`jobs.regression` on its timed cases), has failing rows (``fail``,
``error``), hangs, or did not end ``finished`` (interrupted, incomplete).
Then one message per run goes to every ``--notify`` URL: one JSON object
(:func:`message`), the generic webhook form that chat tools and CI systems
take (``text``: a Markdown summary that Slack, Mattermost, Rocket.Chat and
Teams' incoming webhooks show as is; the rest, the same facts as fields for
a program). ``--summary-md`` writes the same as Markdown, for a CI
system's job summary, whatever the run had to say.

A delivery is retried with backoff (:data:`ATTEMPTS` attempts,
:data:`BACKOFF_S` doubling), each attempt bounded by :data:`ATTEMPT_TIMEOUT_S`
and all deliveries of a run together (posted at once) by :data:`BUDGET_S`; what happened to
each URL is logged and recorded in the run's manifest (``notify``). A
delivery never fails the nightly and never touches a row.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import urllib.error
import urllib.parse
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
    """An ``http(s)://host...`` URL (argparse type: else a clear error
    naming the value, exit 2 before anything runs)."""
    import argparse
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL with a host")
    try:
        parts.port
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: {err}") from None
    return text


def check_summary_path(flag: str, path: Path) -> Path:
    """``path`` is a new file, or an existing empty one (the job summary
    file a CI system makes for the job, e.g. ``$GITHUB_STEP_SUMMARY``)."""
    from jobs.outputs import check_dir, check_new_file
    if path.is_file() and not path.is_symlink() and path.stat().st_size == 0:
        check_dir(f"{flag} {path}: its folder", path.parent)
        return path
    return check_new_file(flag, path)


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


def post(url: str, payload: dict, *, attempts: int = ATTEMPTS, backoff_s: float = BACKOFF_S,
         timeout_s: float = ATTEMPT_TIMEOUT_S, deadline: float | None = None) -> dict:
    """POST ``payload`` as JSON to ``url``, retrying a failure (no answer,
    an error status) after ``backoff_s``, doubling, within ``attempts`` and
    ``deadline`` (time.monotonic); returns what happened: url, ok,
    attempts, status, error, seconds."""
    body = json.dumps(payload).encode()
    t0 = time.monotonic()
    deadline = t0 + BUDGET_S if deadline is None else deadline
    out = {"url": url, "ok": False, "attempts": 0, "status": None, "error": None}
    wait = backoff_s
    for attempt in range(attempts):
        left = deadline - time.monotonic()
        if left <= 0.05:
            out["error"] = f"{out['error'] or 'not sent'} (time budget spent)"
            break
        out["attempts"] = attempt + 1
        req = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              "User-Agent": "lamport-lab-nightly"})
        try:
            with urllib.request.urlopen(req, timeout=min(timeout_s, left)) as resp:
                out["status"] = resp.status
                if 200 <= resp.status < 300:
                    out.update(ok=True, error=None)
                    break
                out["error"] = f"HTTP {resp.status}"
        except urllib.error.HTTPError as err:
            out.update(status=err.code, error=f"HTTP {err.code} {err.reason}")
        except (urllib.error.URLError, OSError, ValueError) as err:
            why = getattr(err, "reason", None) or err
            out["error"] = f"{type(err).__name__}: {why}"
        if attempt + 1 < attempts:
            time.sleep(max(0.0, min(wait, deadline - time.monotonic())))
            wait *= 2
    out["seconds"] = round(time.monotonic() - t0, 3)
    return out


def deliver(urls, payload: dict, *, budget_s: float = BUDGET_S, **kwargs) -> list[dict]:
    """Post ``payload`` to every URL at once (one thread each, so a URL
    that never answers does not starve the others), all within
    ``budget_s``; the deliveries in the order of ``urls``."""
    from concurrent.futures import ThreadPoolExecutor
    urls = list(urls)
    if not urls:
        return []
    deadline = time.monotonic() + budget_s
    with ThreadPoolExecutor(max_workers=min(len(urls), 8)) as pool:
        return list(pool.map(lambda url: post(url, payload, deadline=deadline, **kwargs), urls))


def notify(args, run_id: str, *, rule=None, exit_status: int | None = None,
           budget_s: float = BUDGET_S) -> None:
    """The nightly's alert part: the message written to ``--summary-md``,
    and posted to each ``--notify`` URL when it has something to say; each
    delivery logged and recorded in the run's manifest. Never raises: an
    alert is no part of the run's result."""
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
            Path(summary).write_text(msg["text"], encoding="utf-8")
            print(f"alerts: summary written to {summary}", flush=True)
        except OSError as err:
            print(f"alerts: could not write --summary-md {summary}: {err}", flush=True)
    if not urls:
        return
    if not msg["has_news"] and getattr(args, "notify_on", "news") != "always":
        print(f"alerts: run {run_id} is green, nothing to say; no message posted to "
              f"{len(urls)} URL(s)", flush=True)
        return
    deliveries = deliver(urls, msg, budget_s=budget_s)
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
