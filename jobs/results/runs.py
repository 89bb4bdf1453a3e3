"""The run manifest: one small JSON file per run, next to the rows.

``ROOT/_runs/<run_id>.json`` (a name starting with ``_``: Parquet readers
skip the folder, so the dataset stays plain hive-partitioned Parquet) holds
what is true of the whole run once, instead of on every row:

``run_id``, ``trigger``                the run's identity
``status``                             ``running`` (set when the driver starts the
                                       run), ``finished`` (set when it ends) or
                                       ``interrupted`` (stopped by SIGINT or SIGTERM
                                       after the case in hand; ``--resume`` completes
                                       it)
``driver``                             ``{"host", "pid", "create_time"}`` of the
                                       driver process
``started_at``, ``heartbeat_at``,      UTC ISO times; the heartbeat is refreshed as
``finished_at``, ``interrupted_at``    rows are written; ``interrupted_by``: the signal
``counts``, ``accounting``             the run's rows by outcome (all its parts');
                                       per job section, appended as it ends:
                                       wall time, cases, timed work, overhead
``facts``                              the per-run columns (``RUN_FACTS``: commit,
                                       versions, host, GPUs, topology)
``notify``                             the nightly's alert deliveries (jobs.alerts):
                                       headline, per URL delivered or not, attempts

A run's *effective* status (:func:`effective_status`) is ``finished``,
``interrupted``, ``running``, or ``incomplete`` when the manifest still says ``running`` but
its driver is gone: on the driver's own host, no live process with that
pid and creation time; elsewhere, no heartbeat for ``STALE_AFTER_S``. Rows
of a run with no manifest status (written before manifests existed, or by a
bare :class:`ResultsWriter`) are ``unrecorded``. Only ``finished`` and
``unrecorded`` runs count as a clean baseline.

Every write goes to a hidden temporary file and is renamed into place; a
write that changes a run's row of ``_runs/runs.pq`` (its status, times
or facts) rewrites that table too (:mod:`jobs.results.runs_table`).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
from collections import Counter
from pathlib import Path
from typing import Any

from cluster.procs import process_start
from jobs.results.atomic import write_atomically
# where manifests live and how they are read (also this module's public names)
from jobs.results.run_files import (RUN_FACTS, RUNS_DIR, manifest_path, read_manifest,
                                    read_manifests)

STATUSES = ("running", "finished", "interrupted", "incomplete", "unrecorded")
BASELINE_STATUSES = ("finished", "unrecorded")
"""Runs whose rows may serve as regression history."""
STALE_AFTER_S = 2 * 3600.0
"""A driver on another host with no heartbeat for this long is gone."""
HEARTBEAT_EVERY_S = 30.0


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


def _write(root: str | os.PathLike[str], run_id: str, data: dict, *, table: bool = True) -> Path:
    """Write the manifest; ``table``: its run's row of ``runs.pq``
    changed, rewrite that table (heartbeats and accounting do not)."""
    text = json.dumps(data, sort_keys=True, indent=1, default=str).encode()
    path = write_atomically(manifest_path(root, run_id), lambda sink: sink.write(text))
    if table:
        from jobs.results import runs_table
        runs_table.write(root)
    return path


def this_driver() -> dict[str, Any]:
    """``{"host", "pid", "create_time"}`` of this process."""
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "create_time": process_start(os.getpid())}


def check_same_tree(root, run_id: str, commit: str | None) -> None:
    """A run's rows come from one tree: the run facts (``git_commit``
    among them) are stored once, in the manifest, so rows a later part
    wrote from another commit would read back as the first part's (or the
    other way round). ValueError when run ``run_id`` exists under ``root``
    with a commit other than ``commit`` (unknown on either side: no check)."""
    known = ((read_manifest(root, run_id) or {}).get("facts") or {}).get("git_commit")
    if known and commit and known != commit:
        raise ValueError(f"run {run_id!r} holds rows of commit {known[:12]}; this tree is "
                         f"{commit[:12]}: one run's rows come from one tree, so start a new "
                         f"run (another --run-id) for this one")


def begin(root, run_id: str, *, trigger: str, facts: dict | None = None) -> dict:
    """Mark ``run_id`` running, driven by this process. A run joined with
    ``--run-id`` while its driver lives keeps that driver (a job joined to a
    nightly); a finished run, or one whose driver is gone, is taken over:
    one run split over several invocations (``nightly --jobs``, one part per
    call) keeps its start time; each part appends its sections' accounting
    (:func:`add_accounting`) and :func:`finish` stores the counts of all
    the run's rows. Joining a run from another commit
    is a ValueError (:func:`check_same_tree`)."""
    check_same_tree(root, run_id, (facts or {}).get("git_commit"))
    data = read_manifest(root, run_id) or {}
    driver = data.get("driver")
    if data.get("status") == "running" and driver and driver_alive(driver) is not False:
        return data
    now = _now()
    for key in ("finished_at", "interrupted_at", "interrupted_by"):
        data.pop(key, None)  # a finished or interrupted run reopened for one more part
    data.update(run_id=run_id, trigger=trigger, status="running", driver=this_driver(),
                started_at=data.get("started_at") or now, heartbeat_at=now)
    data.setdefault("facts", {})
    data["facts"].update({k: v for k, v in (facts or {}).items() if k in RUN_FACTS})
    _write(root, run_id, data)
    return data


def owns(data: dict | None) -> bool:
    """Whether this process is the driver named in the manifest ``data``."""
    driver = (data or {}).get("driver") or {}
    return driver.get("host") == socket.gethostname() and driver.get("pid") == os.getpid()


def heartbeat(root, run_id: str) -> None:
    data = read_manifest(root, run_id)
    if data and owns(data) and data.get("status") == "running":
        data["heartbeat_at"] = _now()
        _write(root, run_id, data, table=False)


def finish(root, run_id: str, *, counts: dict[str, int] | None = None) -> None:
    """Mark the run finished (only its own driver does); ``counts``: the
    run's rows by outcome, every part's (read back from the rows, so a part
    stopped by a time limit, which never got here, is counted too),
    replacing the manifest's."""
    data = read_manifest(root, run_id)
    if data and owns(data):
        data.update(status="finished", finished_at=_now())
        if counts is not None:
            data["counts"] = dict(counts)
        _write(root, run_id, data)


def interrupt(root, run_id: str, *, by: str, counts: dict[str, int] | None = None) -> None:
    """Mark the run ``interrupted`` by the signal ``by`` (only its own
    driver does): it stopped after the case in hand, every row it wrote is
    a whole case, and ``--run-id RUN --resume`` completes it. ``counts``
    as for :func:`finish`."""
    data = read_manifest(root, run_id)
    if data and owns(data):
        data.update(status="interrupted", interrupted_at=_now(), interrupted_by=by)
        if counts is not None:
            data["counts"] = dict(counts)
        _write(root, run_id, data)


def add_accounting(root, run_id: str, entry: dict) -> None:
    """Append one job section's accounting (wall time, work, cases) to the
    run's manifest as the section ends, so that a part stopped later keeps
    the sections it completed (only the run's driver writes)."""
    data = read_manifest(root, run_id)
    if data and owns(data):
        data["accounting"] = list(data.get("accounting") or []) + [dict(entry)]
        _write(root, run_id, data, table=False)


def record_notify(root, run_id: str, entry: dict) -> None:
    """Append what the run's alert delivery did (``jobs.alerts``: the
    headline and, per URL, delivered or not, attempts, error) to its
    manifest's ``notify`` list (only the run's driver writes)."""
    data = read_manifest(root, run_id)
    if data and owns(data):
        data["notify"] = list(data.get("notify") or []) + [dict(entry)]
        _write(root, run_id, data, table=False)


def record_facts(root, run_id: str, facts: dict[str, Any]) -> None:
    """Store the per-run facts the manifest does not have yet."""
    data = read_manifest(root, run_id) or {"run_id": run_id}
    known = data.setdefault("facts", {})
    new = {k: v for k, v in facts.items() if v is not None and known.get(k) is None}
    if new:
        known.update(new)
        _write(root, run_id, data)


def driver_alive(driver: dict) -> bool | None:
    """True/False for a driver on this host; None when it ran elsewhere."""
    if driver.get("host") != socket.gethostname():
        return None
    try:
        started = process_start(int(driver["pid"]))
    except (KeyError, TypeError, ValueError):
        return False
    if started is None:
        return False
    want = driver.get("create_time")
    return want is None or started == want


def effective_status(data: dict | None, *, now: dt.datetime | None = None) -> str:
    """``finished``, ``running``, ``incomplete`` or ``unrecorded`` (see the
    module doc)."""
    status = (data or {}).get("status")
    if status in ("finished", "interrupted"):
        return status
    if status != "running":
        return "unrecorded"
    alive = driver_alive(data.get("driver") or {})
    if alive is None:
        try:
            beat = dt.datetime.fromisoformat(data["heartbeat_at"])
        except (KeyError, TypeError, ValueError):
            return "incomplete"
        now = now or dt.datetime.now(dt.timezone.utc)
        alive = (now - beat).total_seconds() < STALE_AFTER_S
    return "running" if alive else "incomplete"
