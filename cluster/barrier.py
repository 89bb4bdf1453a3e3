"""Lockstep for the calls of a batch (cluster.actors.RankActor.run_cases).

A batch runs its calls back to back on every rank without the driver in
between, but a rank may not publish call k+1 before every rank has checked
its mailbox after call k (a peer's early publish into the next stage would
make that check see non-sentinel slots). So between two calls every rank
waits at :meth:`CallBarrier.arrive` until all ``parties`` ranks of the group
have arrived -- or one has aborted (its call k was not clean on it), and
then every rank stops its batch after call k, as the driver's diagnosis of
call k expects.

One barrier actor serves every group of a driver (``call_barrier()``: a named
async actor, num_cpus=0, on the driver's node); a wait is one Ray call from
the rank to it, never through the driver.
"""

from __future__ import annotations

import asyncio
import threading

import ray

NAME = "lamport-call-barrier"


@ray.remote(num_cpus=0, max_restarts=0)
class CallBarrier:
    def __init__(self) -> None:
        self._slots: dict[str, dict] = {}

    def _slot(self, key: str) -> dict:
        return self._slots.setdefault(key, {"arrived": 0, "left": 0, "ok": True,
                                            "event": asyncio.Event()})

    async def arrive(self, key: str, parties: int) -> bool:
        """Wait until ``parties`` ranks arrived at ``key`` (True) or one
        aborted it (False)."""
        slot = self._slot(key)
        slot["arrived"] += 1
        if slot["arrived"] >= parties:
            slot["event"].set()
        await slot["event"].wait()
        slot["left"] += 1
        if slot["left"] >= parties:
            self._slots.pop(key, None)
        return slot["ok"]

    async def abort(self, key: str) -> None:
        """Release every waiter of ``key`` with False."""
        slot = self._slot(key)
        slot["ok"] = False
        slot["event"].set()


_handles: dict[tuple[str, str], object] = {}
_lock = threading.Lock()


def call_barrier(timeout_s: float = 60.0):
    """This driver's barrier actor, started on first use and returned only
    once it serves calls (at most ``timeout_s``; TimeoutError past it). Its
    start is a worker process's (over 10 s on a starved 2-core host) and
    belongs to a group's build: started inside a batch, it held both ranks
    of the batch's second call past a 10 s host deadline, a false hang.
    On the driver's node and only there: soft affinity let Ray put it on a
    worker node, and losing that node then failed the groups of every other
    node. The handle is kept for the Ray job's lifetime: an actor whose last
    handle goes away is destroyed, even a named one, and a group's ranks
    would then meet a dead barrier."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    ctx = ray.get_runtime_context()
    job = (ctx.get_job_id(), ctx.get_node_id())  # a new Ray session reuses job ids
    with _lock:
        if job not in _handles:
            handle = CallBarrier.options(
                name=NAME, get_if_exists=True,
                scheduling_strategy=NodeAffinitySchedulingStrategy(
                    ray.get_runtime_context().get_node_id(), soft=False)).remote()
            try:
                ray.get(handle.__ray_ready__.remote(), timeout=timeout_s)
            except ray.exceptions.GetTimeoutError:
                raise TimeoutError(f"the call barrier actor {NAME!r} did not start within "
                                   f"{timeout_s} s") from None
            _handles[job] = handle
        return _handles[job]
