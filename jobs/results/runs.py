"""The run manifest: one small JSON file per run, next to the rows.

``ROOT/_runs/<run_id>.json`` (a name starting with ``_``: Parquet readers
skip the folder, so the dataset stays plain hive-partitioned Parquet) holds
what is true of the whole run once, instead of on every row:

``run_id``, ``trigger``                the run's identity
``status``                             ``running`` (set when the driver starts the
                                       run), ``finished`` (it ended with a row for
                                       every case it planned, of every job),
                                       ``interrupted`` (stopped by SIGINT or SIGTERM
                                       after the case in hand; ``--resume`` completes
                                       it) or ``incomplete`` (it ended another way, or
                                       with ``missing`` planned cases lacking a row;
                                       ``--resume`` completes it)
``driver``, ``heartbeat_at``           the lease (:mod:`jobs.results.lease`): the
                                       driver process's ``{"host", "pid",
                                       "create_time"}`` and its heartbeat, refreshed
                                       every ``lease.HEARTBEAT_S`` while it runs
``started_at``, ``finished_at``,       UTC ISO times; ``interrupted_by``: the signal
``interrupted_at``
``counts``, ``missing``, ``accounting`` the run's rows by outcome (all its parts',
                                       read back from the rows as the run ends), the
                                       planned cases without a row (only when not
                                       ``finished``), and per job section, appended as
                                       it ends: wall time, cases, timed work, overhead
``facts``                              the per-run columns (``RUN_FACTS``: commit,
                                       versions, host, GPUs, topology)
``notify``                             the nightly's alert deliveries (jobs.alerts):
                                       headline, per URL delivered or not, attempts

One live driver per run: a ``running`` manifest is leased to its driver
while that driver lives, and :func:`begin` refuses a second one
(:class:`jobs.results.lease.LeaseHeld`) and takes over a stale lease
(:mod:`jobs.results.lease` states the rule and the lock).

A run's *effective* status (:func:`effective_status`) is ``finished``,
``interrupted``, ``incomplete``, ``running``, or ``incomplete`` too when the
manifest still says ``running`` but its driver is gone (its lease stale).
Rows of a run with no manifest status (written before manifests existed,
or by a bare :class:`ResultsWriter`), or whose manifest is damaged (a
``ManifestWarning`` names it), are ``unrecorded``. Only ``finished`` and
``unrecorded`` runs count as a clean baseline.

Every write goes to a hidden temporary file and is renamed into place; a
write that changes a run's row of ``_runs/runs.pq`` (its status, times
or facts) rewrites that table too (:mod:`jobs.results.runs_table`). A write
that fails (a full disk) is ``jobs.exits.InfraError`` naming the file; the
rows written so far stay.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from jobs.results import lease
from jobs.results.atomic import write_atomically
from jobs.results.lease import LeaseHeld, driver_alive, this_driver
# where manifests live and how they are read (also this module's public names)
from jobs.results.run_files import (RUN_FACTS, RUNS_DIR, ManifestError, ManifestWarning,
                                    manifest_path, read_manifest, read_manifests, runs_dir)

STATUSES = ("running", "finished", "interrupted", "incomplete", "unrecorded")
BASELINE_STATUSES = ("finished", "unrecorded")
"""Runs whose rows may serve as regression history."""

_HEARTBEATS: dict[tuple[str, str], lease.Heartbeat] = {}
"""The heartbeat threads of the runs this process drives (:func:`begin`
with ``keep_alive``), stopped when the run ends."""


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


def _write(root: str | os.PathLike[str], run_id: str, data: dict, *, table: bool = True) -> Path:
    """Write the manifest; ``table``: its run's row of ``runs.pq``
    changed, rewrite that table (heartbeats and accounting do not).
    InfraError when the disk refuses (full, read-only)."""
    from jobs.exits import InfraError
    text = json.dumps(data, sort_keys=True, indent=1, default=str).encode()
    path = manifest_path(root, run_id)
    try:
        write_atomically(path, lambda sink: sink.write(text))
        if table:
            from jobs.results import runs_table
            runs_table.write(root)
    except OSError as err:
        raise InfraError(f"{err.filename or path}: the run manifest of {run_id!r} could not be "
                         f"written ({err.strerror or err}); the rows written so far are "
                         f"kept") from None
    return path


def owns(data: dict | None) -> bool:
    """Whether this process is the driver named in the manifest ``data``."""
    return lease.is_mine((data or {}).get("driver"))


def drives(root, run_id: str) -> bool:
    """Whether this process holds run ``run_id``'s lease (it is ``running``,
    driven by this process)."""
    data = read_manifest(root, run_id)
    return lease.live(data) and owns(data)


def check_same_tree(root, run_id: str, commit: str | None) -> None:
    """A run's rows come from one tree: the run facts (``git_commit``
    among them) are stored once, in the manifest, so rows a later part
    wrote from another commit would read back as the first part's (or the
    other way round). ValueError when run ``run_id`` exists under ``root``
    with a commit other than ``commit`` (unknown on either side: no check);
    ManifestError when its manifest is damaged."""
    known = ((read_manifest(root, run_id) or {}).get("facts") or {}).get("git_commit")
    if known and commit and known != commit:
        raise ValueError(f"run {run_id!r} holds rows of commit {known[:12]}; this tree is "
                         f"{commit[:12]}: one run's rows come from one tree, so start a new "
                         f"run (another --run-id) for this one")


def begin(root, run_id: str, *, trigger: str, facts: dict | None = None,
          keep_alive: bool = False) -> dict:
    """Take run ``run_id``'s lease and mark it running, driven by this
    process (:mod:`jobs.results.lease`): LeaseHeld when another live driver
    holds it; a stale lease (its driver gone) is taken over, saying so in
    one line. One run split over several invocations (``nightly --jobs``,
    one part per call) keeps its start time; each part appends its
    sections' accounting (:func:`add_accounting`) and :func:`finish`
    stores the counts of all the run's rows. Called again by the process
    that holds the lease, it only adds the facts it did not have.
    ``keep_alive``: refresh the heartbeat from a thread until the run ends
    (:func:`finish`, :func:`interrupt`, :func:`release`). Joining a run
    from another commit is a ValueError (:func:`check_same_tree`); a
    damaged manifest a ManifestError."""
    check_same_tree(root, run_id, (facts or {}).get("git_commit"))
    with lease.locked(root):
        data = read_manifest(root, run_id) or {}
        lease.refuse_if_held(manifest_path(root, run_id), run_id, data)
        data.setdefault("facts", {})
        new = {k: v for k, v in (facts or {}).items()
               if k in RUN_FACTS and data["facts"].get(k) != v}
        if lease.live(data) and owns(data):
            if new:
                data["facts"].update(new)
                _write(root, run_id, data)
        else:
            said = lease.takeover_line(run_id, data)
            if said:
                print(said, flush=True)
            now = _now()
            for key in ("finished_at", "interrupted_at", "interrupted_by", "missing"):
                data.pop(key, None)  # a finished or interrupted run reopened for one more part
            data.update(run_id=run_id, trigger=trigger, status="running", driver=this_driver(),
                        started_at=data.get("started_at") or now, heartbeat_at=now)
            data["facts"].update(new)
            _write(root, run_id, data)
    if keep_alive and (str(root), run_id) not in _HEARTBEATS:
        _HEARTBEATS[(str(root), run_id)] = lease.Heartbeat(
            lambda: heartbeat(root, run_id), run_id).start()
    return data


def _update(root, run_id: str, change, *, table: bool) -> bool:
    """Apply ``change(data)`` to the run's manifest under the lock, if this
    process drives the run and ``change`` does not return False; returns
    whether it wrote."""
    with lease.locked(root):
        data = read_manifest(root, run_id)
        if not data or not owns(data) or change(data) is False:
            return False
        _write(root, run_id, data, table=table)
        return True


def _end(root, run_id: str) -> None:
    beat = _HEARTBEATS.pop((str(root), run_id), None)
    if beat is not None:
        beat.stop()


def heartbeat(root, run_id: str) -> bool:
    """Refresh the run's heartbeat; False when this process no longer
    drives it (the run ended, or another driver took a stale lease over)."""
    with lease.locked(root):
        data = read_manifest(root, run_id)
        if not (data and owns(data) and data.get("status") == "running"):
            return False
        data["heartbeat_at"] = _now()
        _write(root, run_id, data, table=False)
        return True


def finish(root, run_id: str, *, counts: dict[str, int] | None = None, missing: int = 0) -> None:
    """End the run and release its lease (only its own driver does):
    ``finished`` when every case it planned has its row (``missing`` 0),
    else ``incomplete`` with ``missing`` (``--resume`` completes it).
    ``counts``: the run's rows by outcome, every part's (read back from the
    rows, so a part stopped by a time limit, which never got here, is
    counted too), replacing the manifest's."""
    _end(root, run_id)

    def change(data):
        data.update(status="incomplete" if missing else "finished", finished_at=_now())
        if missing:
            data["missing"] = missing
        if counts is not None:
            data["counts"] = dict(counts)
    _update(root, run_id, change, table=True)


def interrupt(root, run_id: str, *, by: str, counts: dict[str, int] | None = None) -> None:
    """Mark the run ``interrupted`` by the signal ``by`` and release its
    lease (only its own driver does): it stopped after the case in hand,
    every row it wrote is a whole case, and ``--run-id RUN --resume``
    completes it. ``counts`` as for :func:`finish`."""
    _end(root, run_id)

    def change(data):
        data.update(status="interrupted", interrupted_at=_now(), interrupted_by=by)
        if counts is not None:
            data["counts"] = dict(counts)
    _update(root, run_id, change, table=True)


def release(root, run_id: str) -> None:
    """The driver stops without :func:`finish` or :func:`interrupt` (an
    error, Ray not reached): a run this process still holds as ``running``
    becomes ``incomplete`` and its lease is released; otherwise nothing."""
    _end(root, run_id)

    def change(data):
        if data.get("status") != "running":
            return False
        data.update(status="incomplete", finished_at=_now())
    _update(root, run_id, change, table=True)


def add_accounting(root, run_id: str, entry: dict) -> None:
    """Append one job section's accounting (wall time, work, cases) to the
    run's manifest as the section ends, so that a part stopped later keeps
    the sections it completed (only the run's driver writes)."""
    _update(root, run_id, lambda data: data.update(
        accounting=list(data.get("accounting") or []) + [dict(entry)]), table=False)


def record_notify(root, run_id: str, entry: dict) -> None:
    """Append what the run's alert delivery did (``jobs.alerts``: the
    headline and, per URL, delivered or not, attempts, error) to its
    manifest's ``notify`` list (only the run's driver writes)."""
    _update(root, run_id, lambda data: data.update(
        notify=list(data.get("notify") or []) + [dict(entry)]), table=False)


def record_facts(root, run_id: str, facts: dict[str, Any]) -> None:
    """Store the per-run facts the manifest does not have yet."""
    with lease.locked(root):
        data = read_manifest(root, run_id) or {"run_id": run_id}
        known = data.setdefault("facts", {})
        new = {k: v for k, v in facts.items() if v is not None and known.get(k) is None}
        if new:
            known.update(new)
            _write(root, run_id, data)


def effective_status(data: dict | None, *, now: dt.datetime | None = None) -> str:
    """``finished``, ``interrupted``, ``incomplete``, ``running`` or
    ``unrecorded`` (see the module doc)."""
    status = (data or {}).get("status")
    if status in ("finished", "interrupted", "incomplete"):
        return status
    if status != "running":
        return "unrecorded"
    return "running" if lease.live(data, now) else "incomplete"
