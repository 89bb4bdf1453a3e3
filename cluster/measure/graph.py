"""Rotation over input sets and CUDA-graph timing (torch imported on call).

A side is timed as one CUDA graph of ``calls`` back-to-back calls replayed
``replays`` times, each replay bracketed by CUDA events; per-call time =
replay time / calls. Call k of a graph reads input set k % sets, the sets
together spanning at least ``rotate_mb`` (more than the L2), so nothing is
timed on L2-resident inputs.
"""

from __future__ import annotations

from collections.abc import Callable

MAX_SETS = 4096
"""Caps the input sets (and so the calls of one graph) a side rotates over."""


def rotation_sets(rotate_mb: float, set_bytes: int) -> int:
    """How many input sets of ``set_bytes`` span at least ``rotate_mb`` MB
    (at least 2, at most :data:`MAX_SETS`)."""
    if not rotate_mb > 0:
        raise ValueError(f"rotate_mb must be > 0, got {rotate_mb}")
    if not set_bytes > 0:
        raise ValueError(f"set_bytes must be > 0, got {set_bytes}")
    return max(2, min(MAX_SETS, -(-int(rotate_mb * 2**20) // int(set_bytes))))


def graph_calls(calls: int, sets: int) -> int:
    """Calls one graph holds: at least ``calls``, and every set read once."""
    return max(int(calls), int(sets))


def rotating(call: Callable[[int], object], sets: int) -> Callable[[], None]:
    """A no-argument fn for :func:`time_graph`: each call runs ``call(i)`` with
    the next set's index (0, 1, ..., sets - 1, 0, ...), so the k-th call
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
    untimed replays). ``before_replay`` runs, untimed, before every replay
    (the ranks of a group meet there so that their replays start together)."""
    import torch

    if calls < 1 or replays < 1:
        raise ValueError(f"calls and replays must be >= 1, got calls={calls} replays={replays}")
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
    del graph
    return times
