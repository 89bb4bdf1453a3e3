"""Time one case on one rank: the fused op and its baselines
(:func:`time_case`), on a lone GPU without Ray (:func:`measure_tp1`, the
benchmarks) or on every rank of a process-per-GPU TP group at once, a group
of one included (``GpuRank.time_case``, the profile job).

Per implementation, on every rank together:

1. barrier; build it (compile, load, NCCL / symmetric-memory / workspace
   set-up), the ranks agree that every one of them built it, then run it
   once on set 0; both timed apart as ``compile_s`` inside an NVTX
   ``... compile`` range (the agreement keeps a peer's compile time out of
   the first call's watchdog budget);
2. the fused op's outputs checked against the reference (the workload's
   ``check``); the ranks then agree (an all-reduce of a flag) so that all
   of them stop, or go on, together: a rank timing on alone would wait at
   the next barrier for peers that have already raised;
3. barrier; one CUDA graph of max(``calls``, sets) calls over the rotating
   sets (more where ``min_replay_ms`` asks a replay to last that long:
   :func:`cluster.measure.graph.fit_calls`, the ranks agreeing on the
   length), replayed ``replays`` times (fewer for a longer graph where
   ``min_replays`` is set: :func:`cluster.measure.graph.scaled_replays`)
   with a barrier (NCCL barrier + device synchronize) before each replay,
   inside an NVTX range.

Returns ``{"rank", "impls": {name: {"times_us": [...], "compile_s": s,
"check_s": s, "graph_s": s (capture, warm-up, barriers, replays), "extra":
{...}, "calls": calls in its graph} | {"skipped": why} | {"failed": why}},
"sets", "set_bytes", "calls" (without a floor), "bytes_moved", "bus_factor",
"collective", "before", "after", "device", "inputs_s" (the workload's
build: its rotation sets)}``
(``before`` / ``after``: :func:`cluster.measure.clocks.gpu_state`). The
fused op failing its check raises AssertionError on every rank (the row is
``fail``; the ranks where it passed raise :class:`PeerFailed`); a baseline
that cannot run is ``skipped`` with why, one whose
outputs are beyond its tolerance ``failed``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from cluster import ops
from cluster.measure.clocks import gpu_state
from cluster.measure.graph import fit_calls, graph_calls, rotating, scaled_replays, time_graph
from cluster.measure.nvtx import nvtx_range, range_name
from cluster.measure.workload import Call, RankContext, Spec, Unavailable, Workload
from cluster.ops.spec import resolve


class PeerFailed(AssertionError):
    """This rank's fused op ran, another rank's failed: the case fails on
    every rank, and the other rank's own error is the one to report
    (:meth:`cluster.group.TPGroup.time` prefers it)."""


def _attempt(name: str, step: Callable[[], None]) -> tuple[dict | None, BaseException | None]:
    """Run one step of an implementation: ``(None, None)``, or its outcome
    and the exception: ``skipped`` (unavailable here: a baseline this stack
    lacks), ``failed`` (an AssertionError: a wrong answer or a watchdog)."""
    try:
        step()
        return None, None
    except Unavailable as err:
        return {"skipped": str(err)}, err
    except AssertionError as err:
        return {"failed": f"{name}: {err}"[:500]}, err
    except Exception as err:  # noqa: BLE001 - a baseline this stack lacks is a skip
        return {"skipped": f"{name} unavailable: {type(err).__name__}: {err}"[:300]}, err


def baseline_impls(requested: str, work: Workload) -> list[str]:
    """The workload's implementations of a requested baseline: the name
    itself or its modes (``flashinfer`` -> ``flashinfer_oneshot``, ...)."""
    return [name for name in work.baselines
            if name == requested or name.startswith(requested + "_")]


def time_case(ctx: RankContext, spec: Mapping, workload: str | None = None) -> dict:
    """See the module docstring. ``spec``: :data:`cluster.measure.workload.SPEC_KEYS`;
    ``workload``: the builder's dotted name (default: the op's declared one,
    ``OpSpec.workload``)."""
    import torch

    s = Spec.of(spec)
    t0 = time.perf_counter()
    build = (resolve(workload, f"timing workload of op {s.op!r}") if workload
             else ops.get(s.op).workload_builder())
    work = build(ctx, s)  # the rotation sets made here
    inputs_s = time.perf_counter() - t0
    calls = graph_calls(s.calls, work.sets)
    before = gpu_state()
    impls = {"fused": _timed(ctx, s, work, "fused", work.fused, calls, fused=True)}
    for requested in s.baselines:
        names = baseline_impls(requested, work)
        if not names:
            impls[requested] = {"skipped": f"{s.op} has no {requested} baseline; its baselines: "
                                           f"{sorted(work.baselines)}"}
        for name in names:
            impls[name] = _timed(ctx, s, work, name, work.baselines[name], calls)
    return {"rank": ctx.rank, "impls": impls, "sets": work.sets, "set_bytes": work.set_bytes,
            "calls": calls,
            "bytes_moved": work.bytes_moved, "bus_factor": work.bus_factor,
            "collective": work.collective, "before": before, "after": gpu_state(),
            "device": torch.cuda.get_device_name(ctx.device), "inputs_s": inputs_s}


def _timed(ctx: RankContext, s: Spec, work: Workload, name: str, make: Callable[[], Call],
           calls: int, *, fused: bool = False) -> dict:
    import torch

    names = dict(tp=ctx.tp, hidden=s.hidden, tokens=s.tokens)
    ctx.barrier()
    call = None

    def build() -> None:
        nonlocal call
        call = make()

    def first_call() -> None:
        call.fn(0)
        torch.cuda.synchronize(ctx.device)

    with nvtx_range(range_name(s.op, name, compile=True, **names), s.tokens):
        t0 = time.perf_counter()
        failure, raised = _attempt(name, build)
        # Every rank has built (compiled, loaded) its call before any rank
        # makes the first one: a peer's compile time must not count against
        # the first call's watchdog budget.
        others = ctx.failed_elsewhere(failure is not None) - (failure is not None)
        if failure is None and not others:
            failure, raised = _attempt(name, first_call)
        compile_s = time.perf_counter() - t0
    others = ctx.failed_elsewhere(failure is not None) - (failure is not None)
    check_s = 0.0
    if fused and failure is None and not others:
        t0 = time.perf_counter()
        try:
            work.check()
        except AssertionError as err:
            failure, raised = {"failed": str(err)}, err
        check_s = time.perf_counter() - t0
        others = ctx.failed_elsewhere(failure is not None) - (failure is not None)
    if fused and raised is not None:
        raise raised  # the fused op's own error or wrong answer: the case's outcome
    if fused and others:
        raise PeerFailed(f"rank {ctx.rank}: the fused op failed on {others} other "
                         f"rank(s) of the group")
    if failure is not None:
        return failure
    if others:
        return {"skipped": f"{name} could not run on {others} other rank(s) of the group"}
    t0 = time.perf_counter()
    ctx.barrier()
    if s.min_replay_ms > 0:
        calls = fit_calls(rotating(call.fn, work.sets), calls, work.sets, s.min_replay_ms * 1e3,
                          before_replay=ctx.barrier, agree=ctx.max_over_ranks)
    replays = scaled_replays(s.replays, s.calls, calls, s.min_replays)
    with nvtx_range(range_name(s.op, name, **names), s.tokens):
        times = time_graph(rotating(call.fn, work.sets), calls, replays,
                           before_replay=ctx.barrier)
    return {"times_us": times, "compile_s": compile_s, "extra": call.extra, "calls": calls,
            "check_s": check_s, "graph_s": time.perf_counter() - t0}


def measure_tp1(spec: Mapping) -> dict:
    """:func:`time_case` on this process's GPU alone (the benchmarks, a GPU
    test): the fused kernel on its own tp=1 mailbox,
    the all-reduces the identity (``symm_mem`` over a world-size-1 group)."""
    import torch

    device = torch.device("cuda", torch.cuda.current_device())
    ctx = RankContext(rank=0, tp=1, device=device, capacity=int(spec["tokens"]), dist=False)
    return time_case(ctx, spec)
