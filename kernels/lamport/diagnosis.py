"""Group-level diagnosis of a Lamport call from every rank's watchdog report:
the project's one diagnosis and its one vocabulary of findings.

Pure functions (no torch), used by every placement: the cluster's TP groups
(emulated and GPU rank actors, :mod:`cluster.group`), the host classes'
process groups (``LamportGroupMember.diagnose``) and virtual ranks
(``VirtualRanks.diagnose``), the latter two through :func:`diagnose_errors`
from the decoded device error buffers. A rank alone
cannot tell who is at fault: the rank that skipped its publish keeps its own
ACTIVE_STAGE stale, reads an old (all-sentinel) generation and blames every
rank, itself included. As PyTorch's Flight Recorder analyzer does with its
per-rank collective traces, :func:`diagnose` lines the reports up and names
the culprits at group level ("missing ranks: {2}").

Inputs, one :class:`RankReport` per rank that answered:
- the watchdog records (token, source rank, fragment, stage, the 16 bytes
  seen as 4 u32; :class:`kernels.lamport.mailbox.TimeoutRecord`), a sample
  capped like the device error buffer, plus the complete per-source sets
  (the buffer's missing / unsanitized masks);
- the rank's stage facts: the stage it was expected to use (host side:
  calls since the last reset, modulo 3), the stage its publish wrote (None
  if it did not publish), the ACTIVE_STAGE its consumer read, and an
  out-of-range stage value if the bounds check fired;
- its own (call seq, M) and the (call seq, M) headers it saw from each source.

Findings, in the order :attr:`GroupDiagnosis.kind` ranks them:
``bad_stage`` (stage_state out of bounds: nothing stored), ``sequence_mismatch``
and ``token_count_mismatch`` (the ranks did not make the same call; these
explain every timeout of that call), ``missing_ranks`` (blamed and did not
publish), ``stale_stage`` (published or consumed another generation than
expected), ``late_ranks`` (blamed although they published at the right
stage: their data came after the deadline), ``unsanitized_payload`` (a
fragment where some lanes arrived and some are still 0x8000: a -0.0 that
bypassed sanitize), ``unresponsive`` (no report: died or missed the host
deadline), ``unexplained_timeout`` (a watchdog fired and nothing above
explains it: never read as success). :func:`diagnose_start` reports
``dirty_mailbox`` at group start.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from kernels.lamport.protocol import LAMPORT_GENERATIONS, SENTINEL_BF16, VEC_BF16

KINDS = ("ok", "bad_stage", "sequence_mismatch", "token_count_mismatch", "missing_ranks",
         "stale_stage", "late_ranks", "unsanitized_payload", "unresponsive",
         "unexplained_timeout", "dirty_mailbox")
"""Diagnosis kinds, most fundamental first (``kind`` is the first that applies)."""


@dataclasses.dataclass(frozen=True)
class TimeoutRecord:
    """One watchdog record: the fragment a consumer gave up on."""
    token: int
    source: int
    fragment: int
    stage: int
    words: tuple[int, int, int, int]

    @property
    def missing(self) -> bool:
        return all(w == 0x80008000 for w in self.words)


def ranks_str(ranks: Iterable[int]) -> str:
    """``{0, 2}``: a rank set as the Flight Recorder prints it."""
    return "{" + ", ".join(str(r) for r in sorted(ranks)) + "}"


def fragment_lanes(words: Sequence[int]) -> list[int]:
    """The VEC_BF16 BF16 lanes (16-bit patterns) of a fragment given as 4
    little-endian u32 words."""
    lanes = []
    for w in words:
        lanes += [w & 0xFFFF, (w >> 16) & 0xFFFF]
    if len(lanes) != VEC_BF16:
        raise ValueError(f"a fragment is {VEC_BF16 // 2} u32 words, got {len(words)}: {list(words)}")
    return lanes


def pending_lanes(words: Sequence[int]) -> int:
    """How many lanes of the fragment still hold the sentinel 0x8000."""
    return sum(lane == SENTINEL_BF16 for lane in fragment_lanes(words))


@dataclasses.dataclass(frozen=True)
class RankReport:
    """One rank's view of one call (see the module docstring)."""
    rank: int
    seq: int
    tokens: int
    expected_stage: int
    published_stage: int | None
    consumed_stage: int
    bad_stage: int | None = None
    missing_sources: frozenset[int] = frozenset()
    partial_sources: frozenset[int] = frozenset()
    headers: tuple[tuple[int, int] | None, ...] = ()
    records: tuple[TimeoutRecord, ...] = ()
    record_count: int = 0

    @classmethod
    def from_records(cls, *, records: Sequence[TimeoutRecord], **fields) -> "RankReport":
        """A report whose per-source sets are derived from ``records`` (all of
        them: use when the records are complete, e.g. in tests)."""
        missing = frozenset(r.source for r in records if pending_lanes(r.words) == VEC_BF16)
        partial = frozenset(r.source for r in records if 0 < pending_lanes(r.words) < VEC_BF16)
        return cls(records=tuple(records), record_count=len(records), missing_sources=missing,
                   partial_sources=partial, **fields)

    @classmethod
    def from_result(cls, result: Mapping) -> "RankReport":
        """From a backend's ``run_case`` result dict (see cluster.backend)."""
        return cls(
            rank=int(result["rank"]), seq=int(result["seq"]), tokens=int(result["tokens"]),
            expected_stage=int(result["expected_stage"]),
            published_stage=result["published_stage"],
            consumed_stage=int(result["consumed_stage"]), bad_stage=result["bad_stage"],
            missing_sources=frozenset(result["missing_sources"]),
            partial_sources=frozenset(result["partial_sources"]),
            headers=tuple(None if h is None else (int(h[0]), int(h[1])) for h in result["headers"]),
            records=tuple(TimeoutRecord(*r[:4], tuple(r[4])) for r in result["records"]),
            record_count=int(result["record_count"]))

    @property
    def timed_out(self) -> bool:
        return self.record_count > 0


@dataclasses.dataclass(frozen=True)
class MailboxCheck:
    """One rank's mailbox as found (at group start, or before a recovery
    scrub): lanes not holding the sentinel, header slots set, stage state."""
    rank: int
    non_sentinel: int
    headers_set: int
    stage_state: tuple[int, int]

    @property
    def clean(self) -> bool:
        return self.non_sentinel == 0 and self.headers_set == 0 and self.stage_state == (0, 0)

    def describe(self) -> str:
        return (f"rank {self.rank}: {self.non_sentinel} non-sentinel lanes, "
                f"{self.headers_set} headers set, stage_state {list(self.stage_state)}")


@dataclasses.dataclass(frozen=True)
class GroupDiagnosis:
    """The group view of one call (or of a group start)."""
    kind: str
    missing_ranks: frozenset[int] = frozenset()
    late_ranks: frozenset[int] = frozenset()
    stale_ranks: frozenset[int] = frozenset()
    bad_stage_ranks: frozenset[int] = frozenset()
    token_mismatch_ranks: frozenset[int] = frozenset()
    sequence_mismatch_ranks: frozenset[int] = frozenset()
    unsanitized_ranks: frozenset[int] = frozenset()
    unresponsive_ranks: frozenset[int] = frozenset()
    dirty_ranks: frozenset[int] = frozenset()
    timed_out_ranks: frozenset[int] = frozenset()
    first_record: TimeoutRecord | None = None
    details: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.kind == "ok"

    def summary(self) -> str:
        """One line: every finding, most fundamental first."""
        return "; ".join(self.details) if self.details else "ok"


def _minority(values: Mapping[int, int]) -> set[int]:
    """Ranks whose value differs from the most common one (all of them on a tie)."""
    counts = collections.Counter(values.values())
    if len(counts) < 2:
        return set()
    (top, n), (_, n2) = counts.most_common(2)
    if n == n2:
        return set(values)
    return {r for r, v in values.items() if v != top}


def _by_rank(values: Mapping[int, int]) -> str:
    return "{" + ", ".join(f"{r}: {v}" for r, v in sorted(values.items())) + "}"


def diagnose(reports: Sequence[RankReport], *, tp: int,
             absent: Mapping[int, str] | None = None,
             expected: tuple[int, int] | None = None) -> GroupDiagnosis:
    """The group diagnosis of one call from the reports of the ranks that
    answered. Ranks in 0..tp-1 without a report are unresponsive; ``absent``
    may say why (e.g. ``{1: "missed the host deadline of 2 s"}``).
    ``expected``: the (call seq, M) the driver asked every rank for; with it
    a sequence or token-count mismatch names the ranks that differ from it,
    without it the minority (all of them on a tie, e.g. 1:1 at tp=2 on the
    GPU kernels, which publish no header)."""
    by_rank = {r.rank: r for r in reports}
    if len(by_rank) != len(reports) or not set(by_rank) <= set(range(tp)):
        raise ValueError(f"reports must come from distinct ranks in 0..{tp - 1}, "
                         f"got ranks {[r.rank for r in reports]}")
    bad_headers = [r.rank for r in reports if len(r.headers) not in (0, tp)]
    if bad_headers:
        raise ValueError(f"ranks {bad_headers} report headers for other than tp={tp} sources")
    absent = dict(absent or {})
    unresponsive = set(range(tp)) - set(by_rank)
    if not set(absent) <= unresponsive:
        raise ValueError(f"absent ranks {sorted(absent)} also have reports")

    bad = {r.rank for r in reports if r.bad_stage is not None}
    stale = {r.rank for r in reports if r.rank not in bad and (
        r.consumed_stage != r.expected_stage
        or (r.published_stage is not None and r.published_stage != r.expected_stage))}
    in_step = [r for r in reports if r.rank not in bad | stale]

    # What every rank called: its own (seq, M), else the header its peers saw.
    seqs = {r.rank: r.seq for r in reports}
    tokens = {r.rank: r.tokens for r in reports}
    for r in in_step:
        for source, header in enumerate(r.headers):
            if header is not None and source not in seqs:
                seqs[source], tokens[source] = header
    if expected is None:
        seq_mismatch = _minority(seqs)
        token_mismatch = _minority(tokens)
    else:
        seq_mismatch = {r for r, v in seqs.items() if v != expected[0]}
        token_mismatch = {r for r, v in tokens.items() if v != expected[1]}

    details: list[str] = []
    for rank in sorted(bad):
        details.append(f"stage_state corrupt on rank {rank}: read stage {by_rank[rank].bad_stage} "
                       f"(>= {LAMPORT_GENERATIONS}), nothing stored")
    if seq_mismatch:
        details.append(f"call sequence mismatch: ranks {ranks_str(seq_mismatch)}; "
                       f"seq by rank {_by_rank(seqs)}")
    if token_mismatch:
        details.append(f"token-count mismatch: ranks {ranks_str(token_mismatch)}; "
                       f"M by rank {_by_rank(tokens)}")

    missing: set[int] = set()
    late: set[int] = set()
    unsanitized: set[int] = set()
    first_record = None
    if not (seq_mismatch or token_mismatch):
        # Timeouts are evidence only from ranks in step with the group.
        witnesses = in_step or list(reports)
        blamed = set().union(*(r.missing_sources for r in witnesses)) - bad - stale
        published = {r.rank for r in reports if r.published_stage is not None}
        missing = blamed - published
        missing |= {r.rank for r in reports if r.published_stage is None and r.rank not in bad}
        late = blamed & published
        unsanitized = set().union(*(r.partial_sources for r in witnesses)) - bad - stale - missing
        culprits = missing | late | unsanitized
        first_record = next((rec for r in sorted(witnesses, key=lambda r: r.rank)
                             for rec in r.records if rec.source in culprits), None)
        if missing:
            details.append(f"missing ranks: {ranks_str(missing)}")
            for rank in sorted(missing & set(by_rank)):
                r = by_rank[rank]
                if rank in stale:
                    details.append(f"rank {rank} did not publish: its consumer read stale stage "
                                   f"{r.consumed_stage} (expected {r.expected_stage}) and blamed "
                                   f"{ranks_str(r.missing_sources)}")
    for rank in sorted(stale - missing):
        r = by_rank[rank]
        details.append(f"stale stage on rank {rank}: published {r.published_stage}, consumed "
                       f"{r.consumed_stage}, expected {r.expected_stage}")
    if late:
        details.append(f"late ranks: {ranks_str(late)} (published after the watchdog deadline)")
    if unsanitized:
        example = next((rec for r in reports for rec in r.records
                        if rec.source in unsanitized and 0 < pending_lanes(rec.words) < VEC_BF16), None)
        where = "" if example is None else (
            f" (token {example.token}, fragment {example.fragment}: "
            f"{pending_lanes(example.words)} of {VEC_BF16} lanes 0x8000)")
        details.append(f"unsanitized payload from ranks {ranks_str(unsanitized)}{where}")
    if unresponsive:
        why = "; ".join(f"rank {r}: {absent[r]}" for r in sorted(absent))
        details.append(f"no report from ranks {ranks_str(unresponsive)}" + (f" ({why})" if why else ""))

    found = {"bad_stage": bad, "sequence_mismatch": seq_mismatch,
             "token_count_mismatch": token_mismatch, "missing_ranks": missing,
             "stale_stage": stale, "late_ranks": late, "unsanitized_payload": unsanitized,
             "unresponsive": unresponsive}
    timed_out = {r.rank for r in reports if r.timed_out}
    kind = next((k for k in KINDS if found.get(k)), "ok")
    if kind == "ok" and timed_out:
        kind = "unexplained_timeout"
        details.append(f"unexplained watchdog timeouts on ranks {ranks_str(timed_out)}")
    return GroupDiagnosis(
        kind=kind, missing_ranks=frozenset(missing), late_ranks=frozenset(late),
        stale_ranks=frozenset(stale), bad_stage_ranks=frozenset(bad),
        token_mismatch_ranks=frozenset(token_mismatch),
        sequence_mismatch_ranks=frozenset(seq_mismatch),
        unsanitized_ranks=frozenset(unsanitized), unresponsive_ranks=frozenset(unresponsive),
        timed_out_ranks=frozenset(timed_out), first_record=first_record, details=tuple(details))


def diagnose_start(checks: Sequence[MailboxCheck]) -> GroupDiagnosis:
    """The group-start check: every mailbox must be all sentinel, with no
    header set and stage state (0, 0); a dirty one (left by a killed process)
    is named with what was found (the backend has scrubbed it)."""
    dirty = [c for c in checks if not c.clean]
    if not dirty:
        return GroupDiagnosis(kind="ok")
    ranks = frozenset(c.rank for c in dirty)
    details = (f"dirty mailbox at group start on ranks {ranks_str(ranks)}, scrubbed: "
               + "; ".join(c.describe() for c in dirty),)
    return GroupDiagnosis(kind="dirty_mailbox", dirty_ranks=ranks, details=details)


def diagnose_errors(errors: Sequence, *, tokens: int = 0) -> GroupDiagnosis:
    """The group diagnosis from every rank's decoded device error buffer
    (:class:`kernels.lamport.mailbox.RankErrors`: rank, ACTIVE_STAGE, the
    missing / unsanitized source masks, the bad-stage flag, the records),
    for callers that hold every rank but no host-side call count (virtual
    ranks, a process group's all-gather).

    The stage facts come from the buffers themselves: a rank whose consumer
    names itself missing did not publish (its ACTIVE_STAGE stayed where the
    previous call left it); every other rank published at its ACTIVE_STAGE;
    the stage the call was expected at is the one most ranks that published
    read (so the rank that skipped is also named stale). Every rank made the
    same call (one process, or validated), so sequence and token count are
    taken as equal."""
    def bits(mask: int) -> frozenset[int]:
        return frozenset(i for i in range(32) if mask >> i & 1)

    silent = {e.rank for e in errors if e.rank in bits(e.missing_mask)}
    stages = collections.Counter(e.active_stage for e in errors
                                 if e.rank not in silent and e.bad_stage is None)
    reports = []
    for e in errors:
        expected = stages.most_common(1)[0][0] if stages else e.active_stage
        published = None if (e.rank in silent or e.bad_stage is not None) else e.active_stage
        reports.append(RankReport(
            rank=e.rank, seq=0, tokens=tokens, expected_stage=expected,
            published_stage=published, consumed_stage=e.active_stage, bad_stage=e.bad_stage,
            missing_sources=bits(e.missing_mask), partial_sources=bits(e.unsanitized_mask),
            records=tuple(e.records), record_count=int(e.count)))
    return diagnose(reports, tp=max((e.rank for e in errors), default=-1) + 1)
