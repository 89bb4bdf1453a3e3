"""The fault table of docs/design.md as data, and the run that checks each expected outcome.

Each fault kind names the injection one rank gets (cluster.injection), the
case overrides of the faulty call, its expected outcome, and the
predicate that decides whether the observed calls meet it. :func:`run_fault`
makes the faulty call and then one clean call on the same group (the
"next call bit-exact" half of most expectations) and returns a
:class:`FaultVerdict`: expected vs seen, with the group diagnosis; the jobs
layer turns verdicts into result rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from cluster import ops
from kernels.lamport.diagnosis import GroupDiagnosis, ranks_str

if TYPE_CHECKING:  # annotations only: the CLI lists FAULT_KINDS without importing Ray or torch
    from cluster.group import GroupCall, TPGroup


@dataclasses.dataclass(frozen=True)
class FaultKind:
    name: str
    expected: str
    injection: Callable[[int], dict | None]
    """Watchdog budget (ns) -> the faulty rank's injection (None: none)."""
    case: dict
    """Overrides of the faulty call's case fields."""
    met: Callable[[GroupCall, GroupCall, int], bool]
    """(faulty call, next call, faulty rank) -> the expectation holds."""


@dataclasses.dataclass(frozen=True)
class FaultVerdict:
    kind: str
    rank: int
    expected: str
    seen: str
    met: bool
    diagnosis: GroupDiagnosis
    outcome: str
    """The faulty call's outcome (pass, fail, hang, error)."""
    rebuilt: bool = False
    """Whether the group was rebuilt (a rank process killed and restarted)
    by the faulty call or the next one."""


def _recovered_next_exact(c: GroupCall, n: GroupCall) -> bool:
    return (c.recovery is not None or c.rebuilt) and n.outcome == "pass"


def _scrubbed(c: GroupCall, ranks: Iterable[int]) -> int:
    return sum(m.non_sentinel for m in c.recovery or () if m.rank in set(ranks))


def _others(c: GroupCall, k: int) -> list[int]:
    return [r for r in range(len(c.results)) if r != k]


FAULT_KINDS: dict[str, FaultKind] = {f.name: f for f in (
    FaultKind("skip_publish",
              "watchdog timeout; missing ranks = {rank}; group recovered; next call bit-exact",
              lambda budget: {"kind": "skip_publish"}, {},
              lambda c, n, k: (c.outcome == "hang" and c.diagnosis.missing_ranks == {k}
                               and _recovered_next_exact(c, n))),
    FaultKind("late_within_budget", "correct result, no timeout",
              lambda budget: {"kind": "delay_publish", "delay_ns": budget // 4}, {},
              lambda c, n, k: c.outcome == "pass" and not c.diagnosis.timed_out_ranks),
    FaultKind("late_beyond_budget",
              "timeout naming it (late ranks = {rank}); its late writes scrubbed by recovery",
              lambda budget: {"kind": "delay_publish", "delay_ns": 2 * budget}, {},
              lambda c, n, k: (c.outcome == "hang" and c.diagnosis.late_ranks == {k}
                               and _scrubbed(c, _others(c, k)) > 0
                               and _recovered_next_exact(c, n))),
    FaultKind("token_count_differs",
              "detected and named (token-count mismatch, ranks = {rank}), never a silent wrong answer",
              lambda budget: {"kind": "tokens_delta", "delta": -1}, {},
              lambda c, n, k: (c.diagnosis.token_mismatch_ranks == {k} and c.outcome != "pass"
                               and not any(x and x["ok"] for x in c.checks)
                               and _recovered_next_exact(c, n))),
    FaultKind("stage_out_of_bounds",
              "detected (bounds check: stage_state corrupt on {rank}), no wild store",
              lambda budget: {"kind": "set_next_stage", "value": 7}, {},
              lambda c, n, k: (c.diagnosis.bad_stage_ranks == {k}
                               and c.results[k]["published_stage"] is None
                               and _scrubbed(c, _others(c, k)) == 0
                               and _recovered_next_exact(c, n))),
    FaultKind("stage_stale",
              "detected (stale stage named on {rank}), no wild store",
              lambda budget: {"kind": "shift_next_stage", "by": 2}, {},
              lambda c, n, k: (c.diagnosis.kind == "stale_stage" and c.diagnosis.stale_ranks == {k}
                               and _recovered_next_exact(c, n))),
    FaultKind("negative_zero_payload",
              "correct result (sanitize; bitwise sentinel test)",
              lambda budget: None, {"inputs": "sentinel_pattern"},
              lambda c, n, k: c.outcome == "pass"),
    FaultKind("unsanitized_lane",
              "reported as unsanitized payload from {rank}, distinct from a missing rank",
              lambda budget: {"kind": "unsanitized_lane", "token": 0, "column": 3}, {},
              lambda c, n, k: (c.diagnosis.kind == "unsanitized_payload"
                               and c.diagnosis.unsanitized_ranks == {k}
                               and not c.diagnosis.missing_ranks and _recovered_next_exact(c, n))),
    FaultKind("dirty_mailbox",
              "mailbox left dirty by a killed process ({rank}): detected at group start and scrubbed",
              lambda budget: {"kind": "die_after_publish"}, {},
              lambda c, n, k: (c.rebuilt and c.start_diagnosis is not None
                               and k in c.start_diagnosis.dirty_ranks and n.outcome == "pass")),
    FaultKind("stuck_rank",
              "host deadline; rank {rank} killed and the group rebuilt; next call bit-exact",
              lambda budget: {"kind": "hang"}, {},
              lambda c, n, k: (c.outcome == "hang" and c.rebuilt
                               and k in c.diagnosis.unresponsive_ranks and n.outcome == "pass")),
)}


def describe(c: GroupCall, n: GroupCall) -> str:
    """One line: what the faulty call and the next call did."""
    parts = [f"{c.outcome}: {c.diagnosis.summary()}"]
    if c.recovery is not None:
        dirty = {m.rank: m.non_sentinel for m in c.recovery if m.non_sentinel}
        parts.append(f"recovered (scrubbed non-sentinel lanes by rank {dirty})" if dirty
                     else "recovered (nothing to scrub)")
    if c.rebuilt:
        parts.append(f"group rebuilt, start check: {c.start_diagnosis.summary()}")
    parts.append(f"next call {n.outcome}")
    return "; ".join(parts)


def run_fault(group: TPGroup, kind: str, *, rank: int, tokens: int = 4, seed: int = 0,
              budget_ns: int = 200_000_000, fields: Mapping | None = None) -> FaultVerdict:
    """Inject fault ``kind`` into rank ``rank`` for one call, then make one
    clean call; the verdict compares the kind's expected outcome with what
    happened. The clean call checks recovery, not the deadline: its watchdog
    budget is at least half the group's host deadline (a loaded host must not
    turn a recovered group into a timeout; on a GPU that is one more compiled
    variant per op). ``fields``: the op and its case fields (cluster.cases; default
    all_reduce_norm); a kind the op does not declare (``OpSpec.faults``) is
    a ValueError."""
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault kind {kind!r}; known: {sorted(FAULT_KINDS)}")
    if not 0 <= rank < group.tp:
        raise ValueError(f"rank must be in 0..{group.tp - 1}, got {rank}")
    fields = dict(fields or {})
    spec = ops.get(fields.get("op", "all_reduce_norm"))
    if kind not in spec.faults:
        raise ValueError(f"fault kind {kind!r} does not apply to op {spec.name}; "
                         f"it declares {list(spec.faults)}")
    fault = FAULT_KINDS[kind]
    injection = fault.injection(budget_ns)
    case = group.case(tokens=tokens, seed=seed, budget_ns=budget_ns, **{**fields, **fault.case})
    faulty = group.run(case, faults={rank: injection} if injection else None)
    recovery_budget_ns = max(budget_ns, int(group.call_timeout_s * 5e8))
    following = group.run(group.case(tokens=tokens, seed=seed + 1, budget_ns=recovery_budget_ns,
                                     **fields))
    return FaultVerdict(kind=kind, rank=rank,
                        expected=fault.expected.replace("{rank}", ranks_str({rank})),
                        seen=describe(faulty, following), met=fault.met(faulty, following, rank),
                        diagnosis=faulty.diagnosis, outcome=faulty.outcome,
                        rebuilt=bool(faulty.rebuilt or following.rebuilt))
