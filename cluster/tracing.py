"""One timeline for a TP group: each rank's torch.profiler trace merged into
one Chrome / Perfetto trace JSON, every rank its own process track.

A rank records its trace with :class:`RankTracer` (torch.profiler: CPU
activities, plus CUDA where the rank has a GPU, so kernels show per rank;
each collective call inside a ``lamport.call`` range, which
torch.profiler records and, on a GPU, NVTX too). Right after the profiler
starts, the rank opens ``CLOCK_SAMPLES`` empty ``lamport.trace.clock``
ranges, reading the wall clock just before and just after each: the pair
of the tightest bracket (that range's start in profiler time, the wall
clock in us read just before it) is the rank's clock offset, wrong by at
most that bracket (a process descheduled between the reading and the
range widens its bracket, and that sample loses). :func:`merge` moves every rank onto rank 0's profiler
time through those offsets (exact for ranks of one host; across hosts as
good as their wall clocks agree), renumbers processes (rank r is pid r,
named ``rank r (host, GPU g)``) and threads (per rank, in order of first
appearance, names kept), and keeps flow arrows (CPU launch -> GPU kernel)
within their rank. Pure functions on dicts: tests feed it synthetic traces.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

CLOCK_EVENT = "lamport.trace.clock"
CLOCK_SAMPLES = 5
"""Clock marks a rank takes; one 200 ms deschedule between a single
reading and its mark was seen on a loaded 2-core host."""
CALL_EVENT = "lamport.call"
KERNEL_CATEGORY = "kernel"
"""torch.profiler's (Kineto's) category of a GPU kernel event."""
GPU_ANNOTATION_CATEGORY = "gpu_user_annotation"
"""Kineto's copy of a ``record_function`` range on the GPU timeline (same
name: the span of the GPU work launched inside it); a call's host range is
counted once, this copy separately."""
_FLOW_ID_STRIDE = 1 << 40
_PROCESS_METADATA = ("process_name", "process_labels", "process_sort_index")


class RankTracer:
    """torch.profiler around a rank's calls: ``start()``, ``call(seq)`` as
    a context manager per collective call, ``stop()`` -> the rank's trace
    (Chrome JSON as a dict, with ``lamport_clock``: the wall clock in us as
    its best ``lamport.trace.clock`` event opened, and
    ``lamport_clock_mark``: which of those events, in time order, that is;
    ``lamport_clock_bracket_us``: how far the reading can be off)."""

    def __init__(self, cuda: bool) -> None:
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        self.cuda = cuda
        self._profile = profile(activities=activities)
        self._clock: dict[str, float] = {}

    def start(self) -> None:
        from torch.profiler import record_function
        self._profile.start()
        # The wall clock is read right before each mark's range opens and
        # paired with its start: the range itself can last milliseconds on a
        # loaded host, so its middle would misalign ranks by that much.
        readings = []  # (ns before the range opened, ns after it closed)
        for _ in range(CLOCK_SAMPLES):
            before = time.time_ns()
            with record_function(CLOCK_EVENT):
                pass
            readings.append((before, time.time_ns()))
        best = min(range(CLOCK_SAMPLES), key=lambda i: readings[i][1] - readings[i][0])
        before, after = readings[best]
        self._clock = {"lamport_clock": before / 1e3, "lamport_clock_mark": best,
                       "lamport_clock_bracket_us": (after - before) / 1e3}

    def call(self, seq: int):
        """The range around one collective call (and an NVTX range on GPUs)."""
        import contextlib

        from torch.profiler import record_function
        stack = contextlib.ExitStack()
        stack.enter_context(record_function(f"{CALL_EVENT} {seq}"))
        if self.cuda:
            import torch
            stack.enter_context(torch.cuda.nvtx.range(f"{CALL_EVENT} {seq}"))
        return stack

    def stop(self) -> dict:
        self._profile.stop()
        fd, path = tempfile.mkstemp(suffix=".json", prefix="rank-trace-")
        os.close(fd)
        try:
            self._profile.export_chrome_trace(path)
            with open(path) as f:
                trace = json.load(f)
        finally:
            os.unlink(path)
        trace.update(self._clock)
        return trace


def _events(trace: Mapping) -> list[dict]:
    return list(trace.get("traceEvents", []))


def clock_offset_us(trace: Mapping) -> float:
    """Wall clock minus profiler time (us) of one rank's trace, through its
    clock mark number ``lamport_clock_mark`` (default 0) in time order;
    ValueError when it has no such clock event or no ``lamport_clock``."""
    wall = trace.get("lamport_clock")
    marks = sorted(float(e["ts"]) for e in _events(trace)
                   if e.get("name") == CLOCK_EVENT and "ts" in e)
    index = int(trace.get("lamport_clock_mark", 0))
    if wall is None or not 0 <= index < len(marks):
        raise ValueError(f"a rank trace without its clock mark ({CLOCK_EVENT!r} event number "
                         f"{index} of {len(marks)}, and lamport_clock): cannot align it")
    return float(wall) - marks[index]  # the wall clock was read as it opened


def merge(traces: Sequence[Mapping], labels: Sequence[str]) -> dict:
    """One Chrome trace of ``traces`` (rank order), rank r the process pid
    r named ``labels[r]``, every timestamp on rank 0's clock."""
    if len(traces) != len(labels) or not traces:
        raise ValueError(f"{len(traces)} trace(s) for {len(labels)} label(s)")
    offsets = [clock_offset_us(t) for t in traces]
    out: list[dict] = []
    for rank, (trace, label) in enumerate(zip(traces, labels)):
        shift = offsets[rank] - offsets[0]
        tids: dict[tuple, int] = {}
        out.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                    "args": {"name": label}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                    "args": {"sort_index": rank}})
        for event in _events(trace):
            if event.get("ph") == "M" and event.get("name") in _PROCESS_METADATA:
                continue
            e = dict(event)
            key = (e.get("pid"), e.get("tid"))
            e["tid"] = tids.setdefault(key, len(tids) + 1)
            e["pid"] = rank
            if "ts" in e and e.get("ph") != "M":
                e["ts"] = float(e["ts"]) + shift
            if e.get("ph") in ("s", "t", "f") and isinstance(e.get("id"), int):
                e["id"] = rank * _FLOW_ID_STRIDE + e["id"]
            if e.get("ph") == "M" and e.get("name") == "thread_name":
                e["args"] = {"name": f"{(event.get('args') or {}).get('name', '')}".strip()
                             or f"thread {key[1]}"}
            out.append(e)
    return {"traceEvents": out, "displayTimeUnit": "ns",
            "otherData": {"lamport": {"ranks": list(labels),
                                      "clock_shift_us": [o - offsets[0] for o in offsets],
                                      "clock_bracket_us": [t.get("lamport_clock_bracket_us")
                                                           for t in traces]}}}


def summary(trace: Mapping) -> dict[str, Any]:
    """What a merged trace holds: its rank tracks (pid -> name) and per
    rank the events, the ``lamport.call`` host ranges (``calls``), their
    GPU-timeline copies (``gpu_calls``, CUDA only) and the GPU kernels."""
    names = {e["pid"]: e["args"]["name"] for e in _events(trace)
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    per = {pid: {"events": 0, "calls": 0, "gpu_calls": 0, "kernels": 0} for pid in names}
    for e in _events(trace):
        if e.get("ph") == "M" or e.get("pid") not in per:
            continue
        c = per[e["pid"]]
        c["events"] += 1
        call = str(e.get("name", "")).startswith(CALL_EVENT + " ") and e.get("ph") == "X"
        on_gpu = e.get("cat") == GPU_ANNOTATION_CATEGORY
        c["calls"] += call and not on_gpu
        c["gpu_calls"] += call and on_gpu
        c["kernels"] += e.get("cat") == KERNEL_CATEGORY
    return {"tracks": [names[p] for p in sorted(names)],
            "per_rank": {names[p]: per[p] for p in sorted(names)}}
