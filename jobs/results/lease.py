"""One live driver per run: the run manifest's lease.

A manifest whose ``status`` is ``running`` is *leased* to the driver it
names (``driver``: host, pid, process start) for as long as that driver is
alive: on the driver's own host, while a process with that pid and that
start time exists (exact, and true of a driver busy in a long call too);
on another host (a results folder on a shared file system), while its
``heartbeat_at`` is younger than :data:`STALE_S`. The driver refreshes the
heartbeat every :data:`HEARTBEAT_S` from a thread (:class:`Heartbeat`), also
while Ray starts and while a case runs for minutes.

Taking the lease (``jobs.results.runs.begin``) reads the manifest, decides
and writes it while holding :func:`locked`, an exclusive ``flock`` on
``ROOT/_runs/.manifests.lock``: of two drivers starting at once, the second
reads the first's lease and is refused (:class:`LeaseHeld`, exit 2 before
Ray starts, naming the live driver); there is no window in which both own
it. A lease whose driver is gone (stale) is taken over, with one line
naming the driver that left it. Every read-modify-write of a manifest
(heartbeats from their thread, accounting, facts, the end) holds the same
lock, so none loses another's update. The lease is released when the run
ends: the status leaves ``running`` (``finished``, ``interrupted``, or
``incomplete`` when the driver stops any other way).

The kernel drops a ``flock`` when its holder dies, so the lock is never
stale; it is held for the milliseconds of one manifest write.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import os
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from jobs.results.run_files import ManifestError, runs_dir

HEARTBEAT_S = 10.0
"""How often a driver refreshes its run's heartbeat."""
STALE_S = 60.0
"""A driver on another host whose heartbeat is older than this is gone
(six missed heartbeats: a loaded machine's late thread is not a dead driver)."""
LOCK_NAME = ".manifests.lock"


class LeaseHeld(ManifestError):
    """The run is driven by another live driver; the message names it."""


@contextlib.contextmanager
def locked(root: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the manifests' lock (exclusive) for the block. Threads of one
    process exclude each other too (each call opens its own descriptor)."""
    directory = runs_dir(root)
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # drops the lock


def this_driver() -> dict:
    """``{"host", "pid", "create_time"}`` of this process."""
    from cluster.procs import process_start
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "create_time": process_start(os.getpid())}


def is_mine(driver: dict | None) -> bool:
    driver = driver or {}
    return driver.get("host") == socket.gethostname() and driver.get("pid") == os.getpid()


def driver_alive(driver: dict) -> bool | None:
    """True/False for a driver on this host; None when it ran elsewhere."""
    from cluster.procs import process_start
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


def heartbeat_age(data: dict, now: dt.datetime | None = None) -> float | None:
    """Seconds since the manifest's heartbeat (None: none, or unreadable)."""
    try:
        beat = dt.datetime.fromisoformat(data["heartbeat_at"])
    except (KeyError, TypeError, ValueError):
        return None
    return ((now or dt.datetime.now(dt.timezone.utc)) - beat).total_seconds()


def live(data: dict | None, now: dt.datetime | None = None) -> bool:
    """Whether ``data``'s run is ``running`` with its driver alive (the
    lease held; by this process too)."""
    if (data or {}).get("status") != "running":
        return False
    alive = driver_alive(data.get("driver") or {})
    if alive is None:
        age = heartbeat_age(data, now)
        alive = age is not None and age < STALE_S
    return alive


def describe(data: dict, now: dt.datetime | None = None) -> str:
    """``pid 123@host, heartbeat 4 s ago`` of the manifest's driver."""
    driver = data.get("driver") or {}
    age = heartbeat_age(data, now)
    return (f"pid {driver.get('pid')}@{driver.get('host')}, "
            + (f"heartbeat {age:.0f} s ago" if age is not None else "no heartbeat"))


def refuse_if_held(path: Path, run_id: str, data: dict | None) -> None:
    """LeaseHeld when ``data`` (run ``run_id``'s manifest at ``path``) is
    leased to a live driver other than this process."""
    if live(data) and not is_mine(data.get("driver")):
        raise LeaseHeld(f"--run-id {run_id}: the run is being driven by {describe(data)} "
                        f"({path}); one live driver per run: wait for it to end (or stop "
                        f"it), then --resume")


def takeover_line(run_id: str, data: dict | None) -> str | None:
    """The line said when this process takes over a stale lease (None: the
    run was not ``running``, or this process held it)."""
    if (data or {}).get("status") != "running" or is_mine(data.get("driver")):
        return None
    driver = data.get("driver") or {}
    why = ("its process is gone" if driver_alive(driver) is False
           else f"no heartbeat for more than {STALE_S:g} s")
    return f"run {run_id}: taking over its stale lease from {describe(data)} ({why})"


class Heartbeat:
    """Refreshes a run's heartbeat every :data:`HEARTBEAT_S` from a daemon
    thread until :meth:`stop` (idempotent); ``beat()`` returns False once
    the lease is no longer this process's (then the thread ends, saying so
    once on stderr). A failed write (a full disk) is said once and retried."""

    def __init__(self, beat, run_id: str, every_s: float | None = None) -> None:
        self._beat = beat
        self._run_id = run_id
        self._every_s = HEARTBEAT_S if every_s is None else every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{run_id}",
                                        daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def _loop(self) -> None:
        said = False
        while not self._stop.wait(self._every_s):
            try:
                if not self._beat():
                    print(f"run {self._run_id}: this driver no longer holds the run's lease; "
                          f"heartbeat stopped", file=sys.stderr, flush=True)
                    return
                said = False
            except Exception as err:  # noqa: BLE001 - a heartbeat never ends the run
                if not said:
                    print(f"run {self._run_id}: heartbeat not written ({err}); retrying every "
                          f"{self._every_s:g} s", file=sys.stderr, flush=True)
                    said = True

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
