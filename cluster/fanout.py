"""Fan TP groups out over the nodes of a Ray cluster, as many at once as fit.

Capacity is counted in units per node: a node's GPUs on the gpu backend, its
``EMULATED_GPU`` custom resource on the emulated backend (a simulated
multi-node cluster declares fake GPUs that way; CI has no GPU). A group
holds ``units`` on one node while it runs (process per GPU: tp, one-GPU
placements: 1, emulated: tp) and is pinned there (cluster.group.TPGroup
``node_id``), so a TP group never spans nodes. Where no node declares units
(the emulated backend on a plain machine) groups are unpinned and bounded
by ``max_parallel`` only.

Scheduling is greedy in the given order: whenever units free up, the first
waiting group that fits starts on the node with the most free units (so
groups spread over nodes). After each group ends the alive nodes are read
again; a node that left takes its units with it, and a waiting group that
fits on no alive node is handed to its ``unplaceable`` callback with why.
Every group's ``run`` records its own results; an exception escaping one is
re-raised after every other group has finished.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait

EMULATED_GPU = "emulated_gpu"
"""Custom resource a simulated node declares for the emulated backend's units."""

STOP_WAIT_S = 5.0
"""How long an interrupted :meth:`Fanout.run` waits for its running tasks
(each ends after the case in hand; a GPU case takes well under a second)."""


@dataclasses.dataclass
class Task:
    """One TP group's work: ``run(node_id)`` (node_id None: unpinned)."""
    label: str
    units: float
    run: Callable[[str | None], None]
    unplaceable: Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class Span:
    """When a group ran, and where."""
    label: str
    node_id: str | None
    start: float
    end: float


def _on_daemon_thread(fn: Callable, *args, name: str) -> Future:
    """``fn(*args)`` on a daemon thread of its own; its Future. Daemon: a
    task an interrupted run leaves behind (e.g. in a Ray call to a GCS that
    got the driver's SIGTERM too) must not hold the process at exit, which
    a ThreadPoolExecutor's workers do (they are joined at interpreter exit,
    whatever ``shutdown(wait=False)`` says)."""
    future: Future = Future()

    def body() -> None:
        future.set_running_or_notify_cancel()
        try:
            result = fn(*args)
        except BaseException as err:
            future.set_exception(err)
        else:
            future.set_result(result)
    threading.Thread(target=body, name=name, daemon=True).start()
    return future


def node_units(backend: str) -> dict[str, float] | None:
    """Units per alive node (see the module doc), or None where no node declares any."""
    import ray
    name = "GPU" if backend == "gpu" else EMULATED_GPU
    units = {n["NodeID"]: float(n.get("Resources", {}).get(name, 0))
             for n in ray.nodes() if n.get("Alive")}
    return units if any(units.values()) else None


def alive_nodes() -> set[str]:
    import ray
    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


class Fanout:
    """Runs :class:`Task` s at once where capacity allows; ``spans`` and
    ``peak`` (most groups running at once) say what happened."""

    def __init__(self, capacity: dict[str, float] | None, *, max_parallel: int,
                 alive: Callable[[], set[str]] = alive_nodes) -> None:
        if max_parallel < 1:
            raise ValueError(f"max_parallel must be >= 1, got {max_parallel}")
        self.capacity = None if capacity is None else dict(capacity)
        self.free = None if capacity is None else dict(capacity)
        self.max_parallel = max_parallel
        self.spans: list[Span] = []
        self.peak = 0
        self._alive = alive

    @classmethod
    def for_backend(cls, backend: str, *, max_parallel: int | None = None,
                    per_unit: int = 1) -> "Fanout":
        """Capacity from the cluster; ``max_parallel`` defaults to the total
        units times ``per_unit`` (how many groups may share a unit;
        unbounded capacity: 1, the sequential behaviour)."""
        capacity = node_units(backend)
        if max_parallel is None:
            max_parallel = max(1, int(sum(capacity.values()) * per_unit)) if capacity else 1
        return cls(capacity, max_parallel=max_parallel)

    def _fit(self, units: float) -> tuple[str | None | bool, str | None]:
        """(node with room for ``units``, None when unpinned, False when none
        has room now; why none ever will, else None)."""
        if self.free is None:
            return None, None
        if not self.capacity or units > max(self.capacity.values()):
            biggest = max(self.capacity.values(), default=0)
            return False, (f"needs {units:g} units on one node; the largest alive node has "
                           f"{biggest:g} (alive nodes: {len(self.capacity)})")
        fits = [(free, node) for node, free in self.free.items() if free >= units - 1e-9]
        return (max(fits)[1] if fits else False), None

    def _forget_dead(self) -> None:
        if self.capacity is None:
            return
        alive = self._alive()
        for node in list(self.capacity):
            if node not in alive:
                del self.capacity[node]
                del self.free[node]

    def run(self, tasks: Sequence[Task], *, on_interrupt: Callable[[], None] | None = None,
            stop_wait_s: float = STOP_WAIT_S) -> None:
        """Run every task (each on a thread of its own, at most
        ``max_parallel`` at once); the first task's exception is raised once
        all have ended. An exception in the caller's thread (SIGTERM's
        SystemExit, Ctrl-C) starts nothing more: ``on_interrupt()`` (the jobs
        tell their groups to stop after the case in hand:
        ``jobs.recorder.Run.stop``), then at most ``stop_wait_s`` for the
        running tasks to end, and the exception goes on (a task still running
        is left to end on its own: a daemon thread, it does not hold the
        process at exit)."""
        pending = list(tasks)
        running: dict = {}
        failures: list[BaseException] = []
        try:
            while pending or running:
                i = 0
                while i < len(pending) and len(running) < self.max_parallel:
                    task = pending[i]
                    node, never = self._fit(task.units)
                    if never:
                        pending.pop(i)
                        task.unplaceable(never)
                        continue
                    if node is False:
                        i += 1
                        continue
                    if node is not None:
                        self.free[node] -= task.units
                    pending.pop(i)
                    fut = _on_daemon_thread(task.run, node, name=f"tp-group {task.label}")
                    running[fut] = (task, node, time.monotonic())
                    self.peak = max(self.peak, len(running))
                if not running:  # nothing runs and nothing fits: capacity left with a node
                    for task in pending:
                        task.unplaceable(self._fit(task.units)[1] or "no alive node has room")
                    break
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in done:
                    task, node, start = running.pop(fut)
                    self.spans.append(Span(task.label, node, start, time.monotonic()))
                    if node is not None and node in self.free:
                        self.free[node] += task.units
                    if fut.exception() is not None:
                        failures.append(fut.exception())
                self._forget_dead()
        except BaseException:
            if on_interrupt is not None:
                on_interrupt()
            if running:
                wait(running, timeout=stop_wait_s)
            raise
        if failures:
            raise failures[0]


def peak_overlap(spans: Sequence[Span]) -> int:
    """Most spans open at one instant."""
    events = sorted([(s.start, 1) for s in spans] + [(s.end, -1) for s in spans])
    now = best = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best
