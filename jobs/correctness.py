"""``python -m jobs correctness``: the numerical contract through the cluster.

Cases with the same (op, tp, hidden, placement, ...) run on one TP group of
rank actors, in suite order, so a group sees an M sequence (e.g. 1, 3, 8, 2
tokens) on one mailbox. The ``virtual-ranks`` placement runs the group in
one Ray task holding one GPU instead (:mod:`cluster.gpu.virtual`: every
rank in one process; its later repeats replay one CUDA graph with new data).
Each case makes ``repeats`` calls, each with new data (a new seed), with
its inputs kind (the op's declaration in :mod:`cluster.ops`: ``random``
normals, ``order_sensitive`` (2^24, +1, -2^24 across ranks: any reduction
order but 0..tp-1 changes the bits), ``sentinel_pattern`` (-0.0 and
negative subnormals 0x8001..0x807F, which sanitize must turn into
arrivals), and the op's own edge cases). Every rank's outputs must meet the
op's reference (bit for bit or within the op's ULP bound:
``cluster.cases.check_outputs``); the mailbox must be all sentinel after
each call. ``#wrong`` counts the elements of the outputs that broke their
bound, over ranks and repeats. An op that is not a collective (the indexer)
runs on each rank actor's GPU on its own; its rows say ``collective=false``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence

from cluster.errors import error_text
from cluster.placement import Placement
from jobs.config import Case, Suite
from jobs.cluster_view import ClusterView, PlacementOffer
from jobs.recorder import Run, case_seed, now
from jobs.session import gpu_task


def run(run: Run, suite: Suite, cases: Sequence[Case], *, view: ClusterView,
        timeout_s: float | None = None) -> None:
    groups: OrderedDict[tuple, list[Case]] = OrderedDict()
    for case in cases:
        groups.setdefault(case.group_key, []).append(case)
    with run.section(f"correctness: suite {suite.name} v{suite.version}, {len(cases)} case(s) "
                     f"on {len(groups)} group(s), backend {run.backend}", len(cases)):
        fan_out(run, suite, groups.values(),
                lambda members, node: _run_group(run, suite, members, view, timeout_s, node),
                view=view)


def group_units(case: Case, view: ClusterView) -> float:
    """What a group of ``case`` holds on its node while it runs
    (cluster.fanout, ``PlacementOffer.units``): tp GPUs process per GPU (and tp
    emulated units), ``1 / groups_per_gpu`` of a GPU for the one-GPU
    placements; 1 where the case has no placement (its group records why)."""
    where = view.resolve(case)
    return where.units(case.tp) if isinstance(where, PlacementOffer) else 1.0


def fan_out(run: Run, suite: Suite, groups, body, case_fields=lambda case: {}, *,
            view: ClusterView) -> None:
    """Run ``body(members, node_id)`` for every group of cases, as many
    groups at once as the cluster holds (cluster.fanout; up to
    ``view.groups_per_gpu`` one-GPU groups a GPU), each pinned to its
    node; a group no alive node can hold records its cases as errors with
    why. The fan-out's peak goes to the job's closing line (``run.note_fanout``)."""
    from cluster.fanout import Fanout, Task

    def unplaceable(members):
        def record(why: str) -> None:
            for case in members:
                run.record(case, suite, outcome="error", started_at=now(),
                           reason=f"no node can hold the group: {why}", extra=row_extra(case),
                           **case_fields(case))
        return record

    fan = Fanout.for_backend(run.backend, per_unit=view.groups_per_gpu)
    fan.run([Task(label=f"{m[0].op} tp={m[0].tp} hidden={m[0].hidden} {m[0].placement}",
                  units=group_units(m[0], view), run=lambda node, m=m: body(m, node),
                  unplaceable=unplaceable(m)) for m in groups], on_interrupt=run.stop)
    run.note_fanout(fan)


def group_options(backend: str, case: Case) -> dict:
    """TPGroup keyword arguments beyond the common ones: the gpu backend
    takes the transport."""
    return {"backend_options": {"transport": case.transport}} if backend == "gpu" else {}


def skip_reason(case: Case, backend: str, placement: str | None = None) -> str | None:
    from cluster import ops
    spec = ops.get(case.op)
    if spec.needs_gpu and backend == "emulated":
        return f"op {case.op}: {spec.needs_gpu}"
    lacking = ops.contract.lacking(spec, backend, placement)
    if lacking:
        return lacking
    if placement == Placement.VIRTUAL_RANKS and not spec.virtual_ranks:
        return (f"op {case.op} is not a collective: virtual ranks add nothing to it; it runs "
                f"on each rank actor's GPU (process-per-gpu, shared-gpu)")
    if case.transport == "multicast" and backend == "emulated":
        return "multicast needs NVLS on GPUs (explicit opt-in); the emulated mailbox is unicast"
    if case.variant == "plain" and backend == "emulated":
        return "the emulated consumer always has its watchdog; variant plain is GPU-only"
    return None


def _run_group(run: Run, suite: Suite, members: list[Case], view: ClusterView,
               timeout_s: float | None, node_id: str | None = None) -> None:
    where = group_placement(run, suite, members, view)
    if where is None:
        return
    timeout = timeout_s or members[0].param("timeout_s")
    if where.name == Placement.VIRTUAL_RANKS:
        _run_virtual(run, suite, members, where, timeout, node_id=node_id, pool=view.pool)
        return
    group = open_group(run, suite, members, where, timeout, node_id=node_id, pool=view.pool)
    if group is None:
        return
    from cluster.group import BatchedGroup
    planned = [group.case(**fields) for case in members for fields in case_calls(run, case)]
    with BatchedGroup(group, planned) as group, run.tagged(**group_tags(group)):
        if not group.start_diagnosis.ok:
            print(f"   group start: {group.start_diagnosis.summary()}")
        try:
            for case in members:
                if run.stopping.is_set():
                    break
                run_case(run, suite, group, case, where)
        finally:
            run.add_group(group, work_kind(run.backend))


def group_tags(group) -> dict:
    """Row extras naming where a group ran: the group, the node it was
    pinned to (cluster.fanout; None: unpinned), its ranks' nodes, the
    wall time of its build so far (``TPGroup.build_s``: placing it and
    starting and setting up its rank actors; ``group_lease_s`` of it, with
    a pool: the wait for its workers), whether its ranks came from
    a worker pool (cluster.pool) and which of them were started for it
    (``cold_ranks``: every rank without a pool)."""
    return {"group_id": group.group_id, "node_id": group.node_id,
            "rank_nodes": sorted({m["node_id"] for m in group.metadata}),
            "group_build_s": round(group.build_s, 3),
            "group_lease_s": round(group.lease_s, 3),
            "pooled": group.pooled, "cold_ranks": group.cold_ranks}


def work_kind(backend: str) -> str:
    """What a TP group's ``work_s`` measures on ``backend``."""
    return ("summed case compute time (emulated: publish + consume in numpy, slowest rank)"
            if backend == "emulated" else
            "summed kernel call time (publish + consume + sync, slowest rank)")


def group_placement(run: Run, suite: Suite, members: Sequence[Case], view: ClusterView,
                    case_fields=lambda case: {}) -> PlacementOffer | None:
    """Where a group's cases run, or None once each is recorded as skipped
    with why (an op or transport the backend does not run, no placement).
    ``case_fields(case)``: extra columns of each row."""
    first = members[0]
    where = view.resolve(first)
    reason = skip_reason(first, run.backend, first.placement) or (
        where if isinstance(where, str) else None)
    if reason:
        for case in members:
            run.record(case, suite, outcome="skipped", started_at=now(), reason=reason,
                       extra=row_extra(case), **case_fields(case))
        return None
    assert isinstance(where, PlacementOffer)
    return where


def open_group(run: Run, suite: Suite, members: Sequence[Case], where: PlacementOffer,
               timeout_s: float, case_fields=lambda case: {}, node_id: str | None = None,
               pool=None):
    """A TPGroup for the cases (capacity: their largest M; pinned to
    ``node_id`` when given; its ranks from ``pool``, a cluster.pool.WorkerPool,
    when given), or None once each is recorded as an error with the setup
    failure's root cause."""
    import ray

    from cluster.group import NodeLost, TPGroup
    first = members[0]
    started = now()
    try:
        return TPGroup(tp=first.tp, hidden=first.hidden,
                       capacity=max(c.tokens for c in members), backend=run.backend,
                       gpus_per_rank=where.gpus_per_rank, call_timeout_s=timeout_s,
                       setup_timeout_s=SETUP_TIMEOUT_S, node_id=node_id, pool=pool,
                       **group_options(run.backend, first))
    except (TimeoutError, ValueError, NodeLost, ray.exceptions.RayError) as err:
        for case in members:
            run.record(case, suite, outcome="error", started_at=started, placement=where.name,
                       reason=f"TP group setup failed: {error_text(err)}", extra=row_extra(case),
                       **case_fields(case))
        return None


def op_case_fields(case: Case) -> dict:
    """The cluster case dict's op and op fields for ``case`` (cluster.cases.make_case)."""
    return {"op": case.op, **case.op_fields()}


def row_extra(case: Case) -> dict:
    """Row extras every op row carries: whether the op is a collective, its
    other fields (finalize, heads, path, ...)."""
    from cluster import ops
    return {"collective": ops.get(case.op).collective, **dict(case.op_args)}


def case_calls(run: Run, case: Case) -> list[dict]:
    """The group-call fields of each of ``case``'s repeats (a new seed each)."""
    from cluster import ops
    budget_ns = case.param("budget_ns")
    calls = []
    for repeat in range(case.repeats):
        fields = dict(tokens=case.tokens, inputs=case.inputs, seed=case_seed(case, repeat),
                      budget_ns=budget_ns, **op_case_fields(case))
        if repeat == 0 and run.backend == "gpu" and "residual" in ops.get(case.op).fields:
            fields["residual"] = "zeros"  # the gpu consumer's sum is observable only so
        calls.append(fields)
    return calls


SETUP_TIMEOUT_S = 180.0
"""Bound on placing and setting up one TP group (actor start, rendezvous).
Each rank actor imports torch (seconds of CPU): a tp=4 group on a loaded
2-core machine was seen to need more than 60 s."""


def run_case(run: Run, suite: Suite, group, case: Case, where: PlacementOffer,
             extra: dict | None = None) -> dict:
    from cluster.phases import rounded, since
    started = now()
    budget_ns = case.param("budget_ns")
    tally = Tally(case)
    outcome, reason, call = "pass", None, None
    phases_before = dict(group.phases_s)
    calls_s = []  # per call, the slowest rank's call phase (jobs.bisect's latency samples)
    offsets = []  # per call, each rank's publish start after the first's (cluster.stragglers)
    for repeat, fields in enumerate(case_calls(run, case)):
        try:
            call = group.run(group.case(**fields))
        except Exception as err:  # a broken case is a result, not a crash
            outcome, reason = "error", f"{type(err).__name__}: {err}"
            break
        tally.add(call.checks)
        calls_s.append(round(call.phases_s.get("call", 0.0), 6))
        offsets.append(call.publish_offsets_us)
        if call.outcome != "pass":
            outcome = call.outcome
            reason = _reason(call, repeat)
            break
    fields = {}
    if call is not None and outcome != "pass" and outcome != "error":
        d = call.diagnosis
        fields.update(diagnosis=d.summary(), missing_ranks=sorted(d.missing_ranks) or None)
        if d.first_record is not None:
            fields.update(fault_token=d.first_record.token, fault_fragment=d.first_record.fragment,
                          fault_stage=d.first_record.stage)
    from cluster.stragglers import summarize
    fields.update(summarize(offsets))
    by_call = [list(o) for o in offsets if o is not None]
    return run.record(
        case, suite, outcome=outcome, started_at=started, reason=reason, placement=where.name,
        **tally.fields(), **fields,
        extra={"inputs": case.inputs, "repeats": case.repeats, "budget_ns": budget_ns,
               **row_extra(case), "collective_speed": where.collective_speed,
               "recovered": bool(call and call.recovery is not None),
               "rebuilt": bool(call and call.rebuilt),
               # ranks that ran on another worker after a kill or a failed setup (pooled groups)
               "replaced_ranks": sorted(group.replaced_ranks) or None,
               # host time by phase, slowest rank, summed over the repeats
               "phases_s": rounded(since(phases_before, group.phases_s)) or None,
               # the same, call by call: the call phase of each repeat, s
               "calls_s": calls_s or None,
               "publish_offsets_us_by_call": by_call or None,
               **(extra or {})})


class Tally:
    """``#wrong`` (elements outside their bound), elements checked and the
    largest ULP distance over every rank and repeat of one case."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.mismatches = self.elements = 0
        self.max_ulp = 0.0

    def add(self, checks) -> None:
        """One call's ``check_outputs`` dicts, one per rank (None: not
        checked); every output the op checks counts, whatever its name."""
        for check in checks:
            if check is None:
                continue
            for name, c in check.items():
                if name == "ok" or not c.get("observed", True):
                    continue
                self.max_ulp = max(self.max_ulp, float(c["max_ulp"]))
                self.elements += int(c["elements"])
                if not c["ok"]:
                    self.mismatches += max(int(c["mismatches"]), 1)

    def fields(self) -> dict:
        return {"mismatches": self.mismatches, "elements": self.elements,
                "max_ulp": self.max_ulp}


def virtual_spec(members: Sequence[Case]) -> dict:
    """The :func:`cluster.gpu.virtual.run_group` spec of one group's cases:
    the group's op fields, and each case's kernel-only ones (``Field.
    kernel_only``: cases differing in them share the group) with the case."""
    from cluster import ops
    from cluster.cases import DEFAULTS
    first = members[0]
    declared = ops.get(first.op).fields

    def own(case: Case) -> dict:
        return {k: v for k, v in case.op_fields().items() if declared[k].kernel_only}

    budget_ns = first.param("budget_ns") if first.variant == "watchdog" else 0
    shared = {k: v for k, v in first.op_fields().items() if k not in own(first)}
    return {"op": first.op, "fields": shared, "tp": first.tp, "hidden": first.hidden,
            "capacity": max(c.tokens for c in members), "eps": DEFAULTS["eps"],
            "budget_ns": budget_ns,
            "cases": [{"tokens": c.tokens, "inputs": c.inputs,
                       "seeds": [case_seed(c, r) for r in range(c.repeats)],
                       **({"fields": own(c)} if own(c) else {})} for c in members]}


def _run_virtual(run: Run, suite: Suite, members: list[Case], where: PlacementOffer,
                 timeout_s: float, *, node_id: str | None = None, pool=None) -> None:
    """The group as one Ray task on one GPU (with a pool: in one pooled
    worker of a slot of ``node_id``); a task past ``timeout_s`` (the
    per-call deadline times the calls) is killed and every case not yet
    reported is a hang."""
    from cluster.gpu import virtual
    started = now()
    submitted_unix = time.time()
    spec = virtual_spec(members)
    calls = sum(len(c["seeds"]) for c in spec["cases"])
    deadline = timeout_s * calls + VIRTUAL_COMPILE_S
    out, failed = gpu_task(virtual.run_group, spec, deadline, gpus=where.gpus_per_rank,
                           pool=pool, node_id=node_id)
    if failed:
        kind, why = failed
        for case in members:
            run.record(case, suite, outcome=kind, started_at=started, placement=where.name,
                       reason=f"virtual-ranks group ({calls} calls, deadline {deadline:.0f} s): "
                              f"{why}")
        return
    record_virtual(run, suite, members, where, spec, out, started, submitted_unix)


def record_virtual(run: Run, suite: Suite, members: Sequence[Case], where: PlacementOffer,
                   spec: dict, out: dict, started, submitted_unix: float | None = None) -> None:
    """One row per case from :func:`cluster.gpu.virtual.run_group`'s result:
    a call with a watchdog diagnosis is a hang, outputs outside the contract
    or a mailbox not all sentinel a fail; the first bad call decides. The
    task's set-up goes to the job's accounting and the first row's extras:
    its start (``task_start_s``: submitted, at ``submitted_unix`` on the
    driver's clock, to running; the nodes' clocks are assumed to agree) and
    its imports are the group's build, its kernels' build the preparation."""
    from cluster.phases import add, rounded, slowest
    setup = dict(out.get("setup_s") or {})
    first_extra = {f"{k}_s": round(v, 3) for k, v in setup.items()}
    if submitted_unix is not None and "entered_unix" in out:
        first_extra["task_start_s"] = round(max(out["entered_unix"] - submitted_unix, 0.0), 3)
    run.add_build(first_extra.get("task_start_s", 0.0) + setup.get("imports", 0.0))
    run.add_prepare(setup.get("prepare", 0.0))
    for case, result in zip(members, out["cases"]):
        tally, outcome, reason, fields = Tally(case), "pass", None, {}
        phases_s: dict[str, float] = {}
        for repeat, call in enumerate(result["calls"]):
            add(phases_s, slowest([call.get("host_ns")]))
            tally.add(call["checks"])
            problems = []
            if call["diagnosis"] is not None:
                problems.append(call["diagnosis"])
                fields.update(diagnosis=call["diagnosis"],
                              missing_ranks=call["missing_ranks"] or None)
            bad = [r for r, c in enumerate(call["checks"]) if not c["ok"]]
            if bad:
                problems.append(f"outputs outside the contract on ranks {bad}")
            if not call["mailbox_clean"]:
                problems.append("mailbox not all sentinel after the call")
            if problems:
                outcome = "hang" if call["diagnosis"] is not None else "fail"
                how = "graph replay" if call["graph"] else "eager"
                reason = f"repeat {repeat} ({how}): {outcome}; " + "; ".join(problems)
                break
        run.record(case, suite, outcome=outcome, started_at=started, reason=reason,
                   placement=where.name, **tally.fields(), **fields,
                   extra={"inputs": case.inputs, "repeats": case.repeats,
                          "calls_made": len(result["calls"]),
                          "graph_replays": sum(c["graph"] for c in result["calls"]),
                          "phases_s": rounded(phases_s) or None,
                          "budget_ns": spec["budget_ns"], "collective_speed": False,
                          **row_extra(case),
                          "device": out["device"], **first_extra})
        run.add_phases(phases_s)
        started, first_extra = now(), {}


VIRTUAL_COMPILE_S = 120.0
"""Added to a virtual-ranks group's deadline: the task compiles the publish
and norm kernels for its (hidden, tp) first."""


def _reason(call, repeat: int) -> str:
    parts = [f"repeat {repeat}: {call.outcome}"]
    if not call.diagnosis.ok:
        parts.append(call.diagnosis.summary())
    bad = [r for r, c in enumerate(call.checks) if c is not None and not c["ok"]]
    if bad:
        parts.append(f"outputs outside the contract on ranks {bad}")
    dirty = [x for x in call.results if x is not None and not x["mailbox_clean"]]
    if dirty:
        where = "; ".join(f"rank {x['rank']}: {x['mailbox_dirt']}" for x in dirty
                          if x.get("mailbox_dirt"))
        parts.append(f"mailbox not all sentinel after the call (seq {dirty[0]['seq']})"
                     + (f": {where}" if where else ""))
    if call.errors:
        parts.append(f"errors {dict(call.errors)}")
    return "; ".join(parts)
