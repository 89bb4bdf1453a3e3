"""Timing helpers shared by the benchmark commands and the profile job.

A side is timed as one CUDA graph of back-to-back calls replayed many times,
each replay bracketed by CUDA events; per-call time = replay time / calls.
Inputs rotate across enough sets that no side is timed on L2-resident data.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

MAX_SETS = 4096
"""Caps the input sets (and so the calls in one graph) a side rotates over."""


def int_list(text: str) -> list[int]:
    """``"1,8,16"`` -> ``[1, 8, 16]`` (argparse type)."""
    return [int(t) for t in text.split(",") if t]


def rotation_sets(rotate_mb: float, set_bytes: int) -> int:
    """How many input sets of ``set_bytes`` span at least ``rotate_mb`` MB
    (at least 2, at most :data:`MAX_SETS`)."""
    return max(2, min(MAX_SETS, -(-int(rotate_mb * 2**20) // set_bytes)))


def rotating(call: Callable[[int], object], sets: int) -> Callable[[], None]:
    """A no-argument fn for :func:`time_graph`: each call runs ``call(i)`` with
    the next input set's index (0, 1, ..., sets - 1, 0, ...), so the k-th call
    captured in a graph reads set k % sets."""
    state = {"i": 0}

    def step() -> None:
        i = state["i"] % sets
        state["i"] += 1
        call(i)
    return step


def time_graph(fn: Callable[[], object], calls: int, replays: int, warmup: int = 3,
               before_replay: Callable[[], object] | None = None) -> list[float]:
    """Microseconds per call of ``fn`` for each of ``replays`` replays of one
    CUDA graph holding ``calls`` calls (after one eager call and ``warmup``
    untimed replays). ``before_replay``, when given, runs (untimed) before
    every replay: the ranks of a group meet there so that their replays
    start together (cluster.gpu.timing)."""
    fn()  # load modules, allocate
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    for _ in range(warmup):
        if before_replay is not None:
            before_replay()
        graph.replay()
    torch.cuda.synchronize()
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(replays):
        if before_replay is not None:
            before_replay()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    return times


def median_p10_p90(times: list[float]) -> tuple[float, float, float]:
    """``(median, p10, p90)`` of per-call times."""
    q = statistics.quantiles(times, n=10)
    return statistics.median(times), q[0], q[-1]
