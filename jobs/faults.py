"""``python -m jobs faults``: the fault table (docs/design.md, The fault table) as a campaign.

Each case injects one fault kind (``cluster.faults.FAULT_KINDS``) into one
rank of a TP group for one call, then makes one clean call on the same group
(``cluster.faults.run_fault``); the row records the expected outcome and
what was seen (``fault_expected`` / ``fault_seen``), the group diagnosis
(missing ranks, token, fragment, stage) and passes when the expectation is
met. An injected hang that was expected is a pass; one that was not met is
a failure like any other.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from jobs.config import Case, Suite
from jobs import correctness
from jobs.correctness import (fan_out, group_placement, group_tags, op_case_fields, row_extra,
                              work_kind)
from jobs.cluster_view import ClusterView, PlacementOffer
from jobs.recorder import Run, case_seed, now

MIN_TP: dict[str, int] = {}
"""Smallest tp at which a kind's expected outcome is decidable, where above
the default 2 (every kind needs a peer). A token-count mismatch is named by
the count the driver asked for (kernels.lamport.diagnosis ``expected``), so tp=2
decides it too (seen on the H200: tests/gpu/test_cluster_gpu.py)."""


def tp_reason(case: Case) -> str | None:
    need = MIN_TP.get(case.fault, 2)
    if case.tp < need:
        return (f"fault {case.fault} needs tp >= {need} for its expected outcome to be "
                f"decidable" + (" (it needs a peer)" if need == 2 else ""))
    return None


def op_reason(case: Case) -> str | None:
    """Why ``case.fault`` does not apply to ``case.op`` (its declaration's
    ``faults``), or None."""
    from cluster import ops
    spec = ops.get(case.op)
    if case.fault in spec.faults:
        return None
    if not spec.collective:
        return f"fault {case.fault}: op {case.op} is not a collective (no Lamport exchange to fault)"
    return f"fault {case.fault} does not apply to op {case.op} (it declares {list(spec.faults)})"


def backend_reason(case: Case, backend: str) -> str | None:
    """Why ``backend`` cannot show ``case.fault``'s expected outcome, or None."""
    from cluster.backend import unsupported_faults
    why = unsupported_faults(backend).get(case.fault)
    return f"fault {case.fault} on the {backend} backend: {why}" if why else None


def run(run: Run, suite: Suite, cases: Sequence[Case], *, view: ClusterView,
        timeout_s: float | None = None) -> None:
    groups: OrderedDict[tuple, list[Case]] = OrderedDict()
    for case in cases:
        groups.setdefault(case.group_key, []).append(case)
    with run.section(f"faults: suite {suite.name} v{suite.version}, {len(cases)} case(s) "
                     f"on {len(groups)} group(s), backend {run.backend}", len(cases)):
        fan_out(run, suite, groups.values(),
                lambda members, node: _run_group(run, suite, members, view, timeout_s, node),
                lambda case: {"fault_kind": case.fault}, view=view)


def _run_group(run: Run, suite: Suite, members: list[Case], view: ClusterView,
               timeout_s: float | None, node_id: str | None = None) -> None:
    def fields(case):
        return {"fault_kind": case.fault}

    where = group_placement(run, suite, members, view, fields)
    if where is None:
        return
    # through the module: a test that wraps correctness.open_group wraps it here
    # too, and only while it does
    group = correctness.open_group(run, suite, members, where,
                                   timeout_s or members[0].param("timeout_s"), fields,
                                   node_id=node_id, pool=view.pool)
    if group is None:
        return
    with group, run.tagged(**group_tags(group)):
        try:
            for case in members:
                if run.stopping.is_set():
                    break
                reason = op_reason(case) or tp_reason(case) or backend_reason(case, run.backend)
                if reason:
                    run.record(case, suite, outcome="skipped", started_at=now(), reason=reason,
                               placement=where.name, fault_kind=case.fault)
                    continue
                run_case(run, suite, group, case, where)
        finally:
            run.add_group(group, work_kind(run.backend))


KILLS = {"die_after_publish": "exits after its publish, on purpose",
         "hang": "hangs on purpose and is killed past the host deadline"}
"""Injections that end the faulty rank's process: Ray then reports a dead
worker (a raylet line about "worker died"), which the campaign announces
first."""


def kill_notice(case: Case, budget_ns: int) -> str | None:
    """The line that announces a deliberate rank kill, or None."""
    from cluster.faults import FAULT_KINDS
    how = KILLS.get((FAULT_KINDS[case.fault].injection(budget_ns) or {}).get("kind"))
    if how is None:
        return None
    return (f"{case.fault}: rank {case.rank} of tp={case.tp} {how}; Ray reports its worker as "
            f"died or killed next; that is expected")


def run_case(run: Run, suite: Suite, group, case: Case, where: PlacementOffer) -> dict:
    from cluster.faults import FAULT_KINDS, run_fault
    from cluster.phases import rounded, since
    started = now()
    budget_ns = case.param("budget_ns")
    expected = FAULT_KINDS[case.fault].expected
    notice = kill_notice(case, budget_ns)
    if notice:
        run.announce(notice)
    verdicts = []
    prepared_before, phases_before = group.prepare_s, dict(group.phases_s)
    try:
        for repeat in range(case.repeats):
            group.recover()  # every case starts from a recovered group
            verdicts.append(run_fault(group, case.fault, rank=case.rank, tokens=case.tokens,
                                      seed=case_seed(case, repeat), budget_ns=budget_ns,
                                      fields=op_case_fields(case)))
            if not verdicts[-1].met:
                break
    except Exception as err:  # a broken case is a result, not a crash
        return run.record(case, suite, outcome="error", started_at=started,
                          placement=where.name, fault_kind=case.fault, fault_expected=expected,
                          reason=f"{type(err).__name__}: {err}",
                          extra={"faulty_rank": case.rank, "budget_ns": budget_ns,
                                 **row_extra(case)})
    v = verdicts[-1]
    d = v.diagnosis
    fields = {}
    if d.first_record is not None:
        fields.update(fault_token=d.first_record.token, fault_fragment=d.first_record.fragment,
                      fault_stage=d.first_record.stage)
    met = all(x.met for x in verdicts)
    return run.record(
        case, suite, outcome="pass" if met else "fail", started_at=started,
        placement=where.name, fault_kind=case.fault, fault_expected=v.expected, fault_seen=v.seen,
        missing_ranks=sorted(d.missing_ranks), diagnosis=d.summary(), **fields,
        reason=None if met else f"expected: {v.expected}; seen: {v.seen}",
        note=f"rank {case.rank}: {v.outcome}, {d.kind}" if met else None,
        extra={"faulty_rank": case.rank, "call_outcome": v.outcome, "diagnosis_kind": d.kind,
               "budget_ns": budget_ns, "repeats": len(verdicts),
               "rebuilt": any(x.rebuilt for x in verdicts),
               # ranks now on another worker after a kill or a failed setup (pooled groups)
               "replaced_ranks": sorted(group.replaced_ranks) or None,
               # the group's kernels this case was the first to need (compiled or loaded)
               "prepare_s": round(group.prepare_s - prepared_before, 3) or None,
               "phases_s": rounded(since(phases_before, group.phases_s)) or None,
               **row_extra(case)})
