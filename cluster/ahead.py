"""The next planned call's host work, made while the current call runs.

A rank runs its calls as a batch known in advance (``RankActor.run_cases``;
the virtual-rank task's case list, :mod:`cluster.gpu.virtual`). A call's
inputs (:func:`cluster.cases.case_inputs`) and its reference outputs
(:func:`cluster.cases.reference`) depend only on the case's fields, never
on what the kernel wrote, so a helper thread makes them for call i + 1
while call i loads, runs, reads back and is compared: the case's host time
shrinks by the smaller of the two. The helper makes exactly what the call
would have made (the inputs are deterministic in the seed, the reference
in the inputs), so rows do not change, only the ``inputs`` and ``check``
phases (:mod:`cluster.phases`), which then count the wait for the helper
and the comparison.

torch's CPU operators release the GIL, so the two threads overlap; a helper
that computes on a GPU (a reference device, :func:`cluster.cases.case_inputs`)
does it on a stream of its own (:func:`side_stream`), never the legacy
default stream, which would order it against a spinning consumer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class Ahead:
    """Host work of planned calls, one helper thread, in plan order.

    ``make(case)`` is the work (it runs on the helper thread); :meth:`plan`
    queues it for a case (a frozen :class:`cluster.cases.Case`, held as
    given), :meth:`take` returns its result for an equal case (waiting for it), or None where that case was not planned, so
    the caller makes it itself. An exception raised by ``make`` is raised
    by :meth:`take`. Planned cases a :meth:`take` skips over are dropped."""

    def __init__(self, make: Callable[[Any], Any] | None = None) -> None:
        self._make = make
        self._pool: ThreadPoolExecutor | None = None
        self._planned: list[tuple[Any, Future]] = []

    def plan(self, case: Any, make: Callable[[Any], Any] | None = None) -> None:
        """Queue ``make(case)`` (default: the constructor's ``make``), once
        per equal case."""
        if any(c == case for c, _ in self._planned):
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ahead")
        self._planned.append((case, self._pool.submit(make or self._make, case)))

    def take(self, case: Any) -> Any | None:
        """``make(case)``'s result if ``case`` was planned, else None."""
        for i, (planned, future) in enumerate(self._planned):
            if planned == case:
                del self._planned[:i + 1]
                return future.result()
        return None

    def idle(self) -> None:
        """Wait until the helper has finished everything queued (before a
        CUDA graph capture, which another thread's device calls would break)."""
        for _, future in self._planned:
            future.exception()

    def close(self) -> None:
        """Drop what is planned and end the helper thread (idempotent)."""
        self._planned = []
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def side_stream(device):
    """A context running the helper's work on ``device`` (a torch device or
    None: the CPU, nothing to enter) on a stream of its own: one non-blocking
    stream a device per process (:func:`_helper_stream`), so none of the
    caller's streams is ordered against it."""
    import contextlib

    if device is None or getattr(device, "type", "cpu") != "cuda":
        return contextlib.nullcontext()
    import torch

    return torch.cuda.stream(_helper_stream(torch.device(device).index))


@functools.cache
def _helper_stream(index: int):
    """The helper's stream on GPU ``index``, from torch's high-priority pool
    (the virtual ranks' streams come from the default-priority one), kept for
    the process so the caching allocator's blocks of the helper's tensors
    stay with one stream."""
    import torch

    return torch.cuda.Stream(torch.device("cuda", index), priority=-1)
