"""Processes on this host, read from ``/proc`` (Linux): when one started, who
descends from whom, how long one waited for a CPU, stopping a set of them for
good, and a lock they take turns on (:func:`one_at_a_time`).

A process is named by ``(pid, start)``: ``start`` (clock ticks since boot,
field 22 of ``/proc/<pid>/stat``) tells a reused pid from the process it
once named.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import tempfile
import time
from collections.abc import Iterator


def _stat(pid: int) -> list[bytes] | None:
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            stat = f.read()
    except (OSError, ValueError):
        return None
    # the command name (field 2) may hold spaces and parentheses: split after its ')'
    return stat[stat.rindex(b")") + 2:].split()


def process_memory(pid: int) -> int | None:
    """Resident memory of ``pid`` in bytes (``/proc/<pid>/statm``), None
    when there is no such process."""
    try:
        with open(f"/proc/{int(pid)}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def cpu_wait_s(pid: int) -> float | None:
    """Seconds the main thread of ``pid`` has spent runnable but waiting for
    a CPU since it started (the run-queue wait, field 2 of
    ``/proc/<pid>/schedstat``); None when that is unreadable (no such
    process, a kernel without sched_info). A Ray actor runs its methods on
    its main thread, so for a rank this is how long a starved host held its
    calls back; a rank asleep or stuck in a wait accrues none."""
    try:
        with open(f"/proc/{int(pid)}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def open_files(pid: int | str = "self") -> dict[str, int]:
    """This (or ``pid``'s) open file descriptors: ``fds`` in all and by
    kind, ``fds_socket``, ``fds_pipe``, ``fds_shm`` (under /dev/shm),
    ``fds_other`` (files, devices, anonymous inodes)."""
    out = {"fds": 0, "fds_socket": 0, "fds_pipe": 0, "fds_shm": 0, "fds_other": 0}
    base = f"/proc/{pid}/fd"
    for fd in os.listdir(base):
        try:
            target = os.readlink(f"{base}/{fd}")
        except OSError:  # closed while listing (the listing's own fd, for one)
            continue
        out["fds"] += 1
        kind = ("socket" if target.startswith("socket:") else "pipe" if target.startswith("pipe:")
                else "shm" if target.startswith("/dev/shm/") else "other")
        out[f"fds_{kind}"] += 1
    return out


def settle_heap() -> int:
    """Collect this process's cyclic garbage, then freeze what survives
    (``gc.freeze``: later collections skip it); returns how many objects
    are frozen. A long-lived worker holds the imports of torch, Ray and the
    kernel DSL and its loaded kernels, hundreds of thousands of objects that
    every full collection would otherwise walk again (0.18 s a collection
    with torch, Ray and pyarrow imported on the CPU box, and a worker
    collects after every group). Only what is live is frozen; a frozen
    object whose reference count falls to zero is still freed at once, and
    only a reference cycle among frozen objects that becomes garbage later
    is never collected."""
    import gc
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


@contextlib.contextmanager
def one_at_a_time(name: str, *, timeout_s: float, poll_s: float = 0.01) -> Iterator[float]:
    """Hold the host-wide lock ``name`` (an advisory ``flock`` on a file in
    the temp folder, freed by the kernel when its holder dies) for the
    block; yields the seconds spent waiting for it. Past ``timeout_s`` of
    waiting the block runs without it (a stuck holder slows the others, it
    never blocks them)."""
    path = os.path.join(tempfile.gettempdir(), f"lamport-{name}.lock")
    started = time.monotonic()
    with open(path, "a") as f:
        held = False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                if time.monotonic() - started > timeout_s:
                    break
                time.sleep(poll_s)
        try:
            yield time.monotonic() - started
        finally:
            if held:
                fcntl.flock(f, fcntl.LOCK_UN)


def process_start(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), None when there is no
    such process (or only a zombie of it)."""
    fields = _stat(pid)
    if fields is None or fields[0] == b"Z":
        return None
    return int(fields[19])


def started_at(pid: int) -> float | None:
    """When ``pid`` started, in seconds since the epoch; None when gone."""
    ticks = process_start(pid)
    if ticks is None:
        return None
    try:
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime"))
    except (OSError, StopIteration, ValueError):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def alive(pid: int, start: int | None) -> bool:
    """Whether the process ``(pid, start)`` still runs."""
    now = process_start(pid)
    return now is not None and (start is None or now == start)


def descendants(pid: int) -> dict[int, int]:
    """Every living descendant of ``pid``: ``{pid: start}``."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat(int(name))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(name))
    out, todo = {}, [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            start = process_start(child)
            if start is not None and child not in out:
                out[child] = start
                todo.append(child)
    return out


def stop(processes: dict[int, int], *, grace_s: float) -> dict[int, int]:
    """SIGTERM every process of ``processes`` (``{pid: start}``) still alive,
    SIGKILL those still there after ``grace_s`` (Ray's agents ignore
    SIGTERM), wait for them; returns the ones that outlived both (none, but
    for a process in uninterruptible sleep)."""
    def living() -> dict[int, int]:
        return {p: s for p, s in processes.items() if alive(p, s)}

    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in living():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait_s
        while living() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not living():
            return {}
    return living()
