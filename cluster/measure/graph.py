"""Rotation over input sets and CUDA-graph timing (torch imported on call).

A side is timed as one CUDA graph of ``calls`` back-to-back calls replayed
``replays`` times, each replay bracketed by CUDA events; per-call time =
replay time / calls. Call k of a graph reads input set k % sets, the sets
together spanning at least ``rotate_mb`` (more than the L2), so nothing is
timed on L2-resident inputs. A floor on a replay's duration
(:func:`fit_calls`) lengthens the graph where its calls are few and short.
"""

from __future__ import annotations

import math
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


def scaled_replays(replays: int, calls: int, graph_calls: int, min_replays: int) -> int:
    """Replays of a graph of ``graph_calls`` calls that time about as many
    calls as ``replays`` replays of ``calls`` calls would: a graph lengthened
    (by the rotation over more than the L2 at small M, or by a replay floor)
    is replayed proportionally fewer times, each replay already a mean over
    its calls; never fewer than ``min_replays``, never more than
    ``replays``. ``min_replays`` 0: ``replays`` as it is. Every rank of a
    group gets the same count from the same arguments."""
    if min_replays < 0:
        raise ValueError(f"min_replays must be >= 0, got {min_replays}")
    if min_replays == 0:
        return int(replays)
    return max(min(int(min_replays), int(replays)),
               min(int(replays), math.ceil(replays * calls / max(int(graph_calls), 1))))


MAX_FLOOR_FACTOR = 100
"""A replay floor lengthens a graph at most this many times."""


def floor_calls(calls: int, sets: int, replay_us: float, min_replay_us: float,
                most: int | None = None) -> int:
    """Calls one graph holds so that a replay lasts at least ``min_replay_us``
    microseconds, given that a replay of ``calls`` calls took ``replay_us``:
    ``calls`` scaled up, then rounded up to whole rotations over the ``sets``
    input sets (every set read equally often); never fewer than ``calls``,
    never more than ``most`` (default :data:`MAX_FLOOR_FACTOR` times
    ``calls``) before rounding. ``min_replay_us`` 0: ``calls`` as it is."""
    if min_replay_us < 0 or replay_us < 0:
        raise ValueError(f"min_replay_us and replay_us must be >= 0, got {min_replay_us}, "
                         f"{replay_us}")
    if min_replay_us == 0 or replay_us >= min_replay_us:
        return int(calls)
    most = calls * MAX_FLOOR_FACTOR if most is None else most
    want = min(math.ceil(calls * min_replay_us / max(replay_us, 1e-3)), most)
    return max(int(calls), math.ceil(want / sets) * sets)


FIT_ROUNDS = 3
"""Measurements :func:`refine_calls` makes at most."""


def refine_calls(calls: int, sets: int, min_replay_us: float,
                 replay_us_of: Callable[[int], float], rounds: int = FIT_ROUNDS) -> int:
    """:func:`floor_calls` iterated: ``replay_us_of(n)`` measures a replay of
    a graph of ``n`` calls; the count is rescaled from each measurement until
    a replay reaches the floor, the count stops growing, or ``rounds``
    measurements were made (at most :data:`MAX_FLOOR_FACTOR` times ``calls``
    in all). Why more than one: a replay's fixed cost (the graph launch,
    ~10-20 us) is most of a short graph's time, so the first rescaling
    falls short (8 calls of 0.85 us on an H200: 800 calls, 680 us, for a
    2 ms floor)."""
    if min_replay_us == 0:
        return int(calls)
    most, n = calls * MAX_FLOOR_FACTOR, int(calls)
    for _ in range(rounds):
        more = floor_calls(n, sets, replay_us_of(n), min_replay_us, most=most)
        if more == n:
            break
        n = more
    return n


def fit_calls(fn: Callable[[], object], calls: int, sets: int, min_replay_us: float,
              before_replay: Callable[[], object] | None = None,
              agree: Callable[[float], float] | None = None) -> int:
    """:func:`refine_calls` with measured replays: a graph of ``n`` calls of
    ``fn`` is captured, replayed once untimed and once timed
    (``before_replay`` before each); ``agree`` turns this rank's replay time
    into the one every rank of a group uses (the max over ranks), so that
    they all capture graphs of the same length. Why a floor: the ranks start
    a replay after a host barrier, and the first to start carries the start
    skew in its time, spread over the graph's calls (tens of us over 50
    calls measured on two H200s: docs/results/service_h200x2_2026-11-30.md
    section 10)."""
    def replay_us_of(n: int) -> float:
        graph, events = _capture(fn, n), _events()
        for _ in range(2):  # a warm replay, then the one whose time counts
            replay_us = _replay_us(graph, events, before_replay)
        del graph
        return agree(replay_us) if agree is not None else replay_us
    return refine_calls(calls, sets, min_replay_us, replay_us_of)


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
    graph = _capture(fn, calls)
    for _ in range(warmup):
        if before_replay is not None:
            before_replay()
        graph.replay()
    torch.cuda.synchronize()
    events = _events()
    times = [_replay_us(graph, events, before_replay) / calls for _ in range(replays)]
    del graph
    return times


def _capture(fn: Callable[[], object], calls: int):
    """One CUDA graph of ``calls`` calls of ``fn``."""
    import torch
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


def _events():
    import torch
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def _replay_us(graph, events, before_replay: Callable[[], object] | None) -> float:
    """Microseconds of one replay of ``graph`` between two CUDA events
    (``before_replay`` first, untimed)."""
    start, end = events
    if before_replay is not None:
        before_replay()
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0
