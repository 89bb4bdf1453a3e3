"""The ``virtual-ranks`` placement for the jobs: a correctness group run in
one process on one GPU (every collective op of :mod:`cluster.ops` through its
``VirtualKernel``: :class:`kernels.lamport.all_reduce_norm.VirtualRanks` for
all_reduce_norm, finalize_publish and embed_norm,
:class:`kernels.lamport.all_reduce_mhc.MHCVirtualRanks` for all_reduce_mhc:
tp ranks, each with its own mailbox, stage state and stream; every peer
store lands in the same GPU's memory, so no timing from here is a
collective's speed). The indexer is no collective and has no virtual-ranks
form (``OpSpec.virtual_ranks``).

:func:`run_group` is what a Ray task holding one GPU runs (``jobs
correctness`` with ``placement = "virtual-ranks"``). The group's cases run in
order on one set of mailboxes (an M sequence), each case ``len(seeds)``
calls, each with new data:

- call 0 is eager, with a zero residual where the op has one: residual_out
  is then BF16(sum) bit for bit, so the reduced sum itself is checked;
- the later calls replay one CUDA graph captured for that M over static
  input buffers, new inputs copied in before each replay (graph replay with
  new data must give what an eager call gives).

Outputs are poisoned before every call. After each call every rank's
outputs are checked with :func:`cluster.cases.check_outputs` (the op's
reference and bounds, NaN never passes), the mailboxes must be all
sentinel, and the watchdog's error buffers empty; a non-empty one makes the
call a ``hang`` with the group diagnosis' summary. After the first bad
call (hang, wrong output or a dirty mailbox) the mailboxes are recovered
and the case stops there; the next case starts clean.

Result (plain data, it crosses Ray)::

    {"device": name, "entered_unix": s, "setup_s": {"imports": s, "prepare": s},
     "cases": [{"tokens": M, "calls": [
        {"graph": bool, "checks": [check_outputs dict per rank],
         "mailbox_clean": bool, "diagnosis": str | None,
         "missing_ranks": [...], "host_ns": {phase: ns}}]}]}

(``host_ns``: the call's host time by phase, :mod:`cluster.phases`; the
tp ranks' work is one process's, so no slowest rank is taken.
``entered_unix``: the task's wall clock (``time.time()``) as it began,
so the driver can tell the task's start (scheduling, a worker process)
from its work; ``setup_s``: seconds importing torch and the ops, and
building the group's kernels (the CUDA context, compiling or loading from
the compile cache, the mailboxes).)
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from cluster.ahead import Ahead, side_stream

SPEC_FIELDS = ("tp", "hidden", "capacity", "eps", "budget_ns", "cases")
CASE_FIELDS = ("tokens", "inputs", "seeds")


def validate_spec(spec: Mapping) -> None:
    """ValueError naming what is missing or out of range, before any CUDA work.
    Optional: ``op`` (default all_reduce_norm) and ``fields`` (its case fields)."""
    from cluster import ops

    missing = [f for f in SPEC_FIELDS if f not in spec]
    if missing:
        raise ValueError(f"virtual-ranks spec lacks {missing}")
    op = ops.get(spec.get("op", "all_reduce_norm"))
    if not op.virtual_ranks:
        raise ValueError(f"op {op.name} has no virtual-ranks form (it is not a collective)")
    fields = dict(spec.get("fields", {}))
    _check_fields(op, fields, "spec")
    if spec["tp"] not in (1, 2, 4, 8):
        raise ValueError(f"tp must be one of 1, 2, 4, 8, got {spec['tp']}")
    if spec["budget_ns"] < 0:
        raise ValueError(f"budget_ns must be >= 0, got {spec['budget_ns']}")
    for c in spec["cases"]:
        lacking = [f for f in CASE_FIELDS if f not in c]
        if lacking:
            raise ValueError(f"virtual-ranks case {dict(c)} lacks {lacking}")
        if not 1 <= c["tokens"] <= spec["capacity"]:
            raise ValueError(f"tokens must be in 1..capacity={spec['capacity']}, "
                             f"got {c['tokens']}")
        if not c["seeds"]:
            raise ValueError("a case needs at least one seed (one call)")
        if c.get("fields"):
            _check_fields(op, {**fields, **c["fields"]}, f"case {dict(c)}")


def _check_fields(op, fields: Mapping, what: str) -> None:
    unknown = sorted(set(fields) - set(op.fields))
    if unknown:
        raise ValueError(f"virtual-ranks {what}: op {op.name} has no fields {unknown}; "
                         f"its fields: {sorted(op.fields)}")
    op.case_fields(dict(fields))


def run_group(spec: Mapping) -> dict:
    """See the module docstring. ``spec``: ``tp``, ``hidden``, ``capacity``,
    ``eps``, ``budget_ns`` (0: the plain consumer), ``op`` and ``fields``
    (optional), ``cases``: a list of ``{"tokens", "inputs", "seeds": [one
    per call]}`` and optionally the case's own ``fields`` (the op's
    kernel-only fields, e.g. all_reduce_norm's mode: one kernel, with its
    own mailboxes, per distinct set, built on first use)."""
    entered_unix, started = time.time(), time.monotonic()

    import torch

    from cluster import ops
    from cluster.cases import make_case

    setup_s = {"imports": time.monotonic() - started, "prepare": 0.0}
    validate_spec(spec)
    tp, hidden, capacity = int(spec["tp"]), int(spec["hidden"]), int(spec["capacity"])
    op = ops.get(spec.get("op", "all_reduce_norm"))
    group_fields = {"op": op.name, "eps": float(spec["eps"]), **dict(spec.get("fields", {}))}
    kernels: dict[tuple, object] = {}  # one VirtualKernel (own mailboxes) per kernel-only fields
    work = []  # (kernel key, kernel fields, the case's calls: cluster.cases.Case)
    for c in spec["cases"]:
        fields = {**group_fields, **dict(c.get("fields", {}))}
        work.append((tuple(sorted(fields.items())), fields,
                     [make_case(capacity=capacity, tokens=int(c["tokens"]), inputs=c["inputs"],
                                seed=int(seed), **fields,
                                **({"residual": "zeros" if i == 0 else "random"}
                                   if "residual" in op.fields else {}))
                      for i, seed in enumerate(c["seeds"])]))
    ahead = Ahead()
    results = []
    try:
        for n, (key, fields, cases) in enumerate(work):
            if key not in kernels:
                building = time.monotonic()
                kernels[key] = op.module().VirtualKernel(
                    tp=tp, hidden=hidden, capacity=capacity, budget_ns=int(spec["budget_ns"]),
                    case=make_case(capacity=capacity, tokens=1, **fields))
                setup_s["prepare"] += time.monotonic() - building
            kernel = kernels[key]
            # the next case's first call is made ahead where its kernel is built already
            after = (work[n + 1][2][0], kernels[work[n + 1][0]]) if n + 1 < len(work) \
                and work[n + 1][0] in kernels else None
            calls = []
            for call in _calls(kernel, cases, tp=tp, hidden=hidden, ahead=ahead, after=after):
                calls.append(call)
                if call["diagnosis"] is not None or not call["mailbox_clean"] \
                        or not all(c["ok"] for c in call["checks"]):
                    kernel.group.recover()  # the next case starts from clean mailboxes
                    break
            results.append({"tokens": cases[0].tokens, "calls": calls})
    finally:
        ahead.close()
    return {"device": torch.cuda.get_device_name(), "entered_unix": entered_unix,
            "setup_s": setup_s, "cases": results}


def host_work(kernel, case, *, tp: int, hidden: int) -> tuple[dict, list[dict]]:
    """``case``'s inputs and every rank's reference (cluster.cases), its GPU
    work on the kernel's device (a side stream off the caller's thread:
    cluster.ahead)."""
    from cluster.cases import case_inputs, reference

    dev = kernel.group.device
    inputs = case_inputs(case, tp=tp, hidden=hidden, reference_device=dev)
    return inputs, [reference(case, tp=tp, hidden=hidden, inputs=inputs, facts=kernel.facts(),
                              rank=r) for r in range(tp)]


def _ahead_work(kernel, *, tp: int, hidden: int):
    def make(case):
        with side_stream(kernel.group.device):
            return host_work(kernel, case, tp=tp, hidden=hidden)
    return make


def _calls(kernel, cases: Sequence, *, tp: int, hidden: int, ahead: Ahead,
           after: tuple | None = None):
    """Yield one result per case (a :class:`cluster.cases.Case`; the first eager, then graph replays).
    Each call's inputs and references are made on ``ahead``'s helper thread
    during the call before (the first while nothing runs); ``after``: (case,
    its kernel) of the next case's first call, planned during the last. No
    call is planned while the graph is captured: another thread's device
    calls would break the capture."""
    import torch

    from cluster.cases import check_outputs
    from cluster.phases import PhaseClock

    m = cases[0].tokens
    dev = kernel.group.device
    make = _ahead_work(kernel, tp=tp, hidden=hidden)
    graph = None
    ahead.plan(cases[0], make)
    for i, case in enumerate(cases):
        clock = PhaseClock()
        inputs, expected = ahead.take(case) or host_work(kernel, case, tp=tp, hidden=hidden)
        clock.mark("inputs")
        following = (cases[i + 1], make) if i + 1 < len(cases) else \
            None if after is None else (after[0], _ahead_work(after[1], tp=tp, hidden=hidden))
        capture = i > 0 and graph is None
        if following is not None and not capture:
            ahead.plan(*following)
        kernel.load(case, inputs, m)
        torch.cuda.synchronize(dev)
        clock.mark("load")
        if i == 0:
            kernel()
        else:
            if capture:
                ahead.idle()
                torch.cuda.synchronize(dev)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    kernel()
                if following is not None:
                    ahead.plan(*following)
            graph.replay()
        torch.cuda.synchronize(dev)
        clock.mark("call")
        diagnosis = kernel.group.diagnose()
        outputs = [kernel.outputs(r) for r in range(tp)]
        clean = kernel.group.is_all_sentinel()
        clock.mark("readback")
        checks = [check_outputs(case, tp=tp, hidden=hidden, outputs=outputs[r], rank=r,
                                inputs=inputs, expected=expected[r]) for r in range(tp)]
        clock.mark("check")
        yield {"graph": i > 0, "checks": checks, "mailbox_clean": clean,
               "diagnosis": None if diagnosis.ok else diagnosis.summary(),
               "missing_ranks": sorted(diagnosis.missing_ranks), "host_ns": clock.ns}
