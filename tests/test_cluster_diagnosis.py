"""Group-level diagnosis (pure functions, no Ray)."""

import pytest

from kernels.lamport.diagnosis import (MailboxCheck, RankReport, diagnose, diagnose_start,
                               fragment_lanes, pending_lanes)
from kernels.lamport.mailbox import TimeoutRecord

ALL_SENTINEL = (0x80008000,) * 4
ONE_LANE_PENDING = (0x80003F80, 0x3F803F80, 0x3F803F80, 0x3F803F80)  # lane 1 is 0x8000


def report(rank, *, blame=(), partial=(), expected=1, consumed=None, published="expected",
           tokens=4, seq=7, headers=None, bad_stage=None, tp=4):
    """A report built from complete records: one all-sentinel fragment per
    blamed source, one fragment with one pending lane per partial source."""
    consumed = expected if consumed is None else consumed
    published = expected if published == "expected" else published
    records = [TimeoutRecord(tokens - 1, s, 0, consumed, ALL_SENTINEL) for s in blame]
    records += [TimeoutRecord(0, s, 2, consumed, ONE_LANE_PENDING) for s in partial]
    if headers is None:
        headers = tuple(None if s in blame else (seq, tokens) for s in range(tp))
    return RankReport.from_records(rank=rank, seq=seq, tokens=tokens, expected_stage=expected,
                                   published_stage=published, consumed_stage=consumed,
                                   bad_stage=bad_stage, headers=headers, records=records)


def test_fragment_lanes_little_endian():
    assert fragment_lanes(ONE_LANE_PENDING)[:2] == [0x3F80, 0x8000]
    assert pending_lanes(ALL_SENTINEL) == 8 and pending_lanes(ONE_LANE_PENDING) == 1
    with pytest.raises(ValueError, match="4 u32 words"):
        fragment_lanes((1, 2))


def test_clean_call_is_ok():
    d = diagnose([report(r) for r in range(4)], tp=4)
    assert d.ok and d.summary() == "ok" and not d.timed_out_ranks


def test_skipped_publish_resolved_at_group_level():
    # Rank 2 did not publish: its stage is stale, it blames every rank; the
    # others blame only rank 2.
    reports = [report(r, blame={2}) for r in (0, 1, 3)]
    reports.append(report(2, blame={0, 1, 2, 3}, consumed=0, published=None))
    d = diagnose(reports, tp=4)
    assert d.kind == "missing_ranks"
    assert d.missing_ranks == {2} and d.stale_ranks == {2} and not d.late_ranks
    assert d.summary().startswith("missing ranks: {2}")
    assert "rank 2 did not publish" in d.summary()
    assert d.first_record.source == 2 and d.first_record.token == 3


def test_skipped_first_publish_without_stale_stage():
    reports = [report(0, tp=2, blame={1}, expected=0),
               report(1, tp=2, blame={1}, expected=0, published=None)]
    d = diagnose(reports, tp=2)
    assert d.missing_ranks == {1} and not d.stale_ranks


def test_late_rank_is_not_missing():
    reports = [report(r, blame={3}) for r in range(3)] + [report(3)]
    d = diagnose(reports, tp=4)
    assert d.kind == "late_ranks" and d.late_ranks == {3} and not d.missing_ranks
    assert d.timed_out_ranks == {0, 1, 2}


def test_token_count_mismatch_explains_the_timeouts():
    reports = [report(r, tp=3, blame={1}, headers=((7, 4), (7, 3), (7, 4))) for r in (0, 2)]
    reports.insert(1, report(1, tp=3, tokens=3, headers=((7, 4), (7, 3), (7, 4))))
    d = diagnose(reports, tp=3)
    assert d.kind == "token_count_mismatch" and d.token_mismatch_ranks == {1}
    assert not d.missing_ranks and not d.late_ranks
    assert "M by rank {0: 4, 1: 3, 2: 4}" in d.summary()


def test_token_count_tie_names_every_rank():
    d = diagnose([report(0, blame={1}, tp=2), report(1, tokens=3, tp=2)], tp=2)
    assert d.token_mismatch_ranks == {0, 1}


def test_absent_rank_header_reveals_its_token_count():
    reports = [report(r, blame={2}, headers=((7, 4), (7, 4), (7, 2))) for r in (0, 1)]
    d = diagnose(reports, tp=3, absent={2: "missed the host deadline of 2 s"})
    assert d.token_mismatch_ranks == {2} and d.unresponsive_ranks == {2}
    assert "rank 2: missed the host deadline of 2 s" in d.summary()


def test_sequence_mismatch():
    d = diagnose([report(0, tp=3), report(1, tp=3), report(2, tp=3, seq=6)], tp=3)
    assert d.kind == "sequence_mismatch" and d.sequence_mismatch_ranks == {2}


def test_corrupt_stage_is_named_not_missing():
    reports = [report(r, tp=3, blame={1}) for r in (0, 2)]
    reports.insert(1, report(1, tp=3, published=None, consumed=7, bad_stage=7))
    d = diagnose(reports, tp=3)
    assert d.kind == "bad_stage" and d.bad_stage_ranks == {1} and not d.missing_ranks
    assert "read stage 7 (>= 3), nothing stored" in d.summary()


def test_stale_stage_is_named():
    reports = [report(r, tp=3, blame={1}) for r in (0, 2)]
    reports.insert(1, report(1, tp=3, blame={0, 2}, consumed=0, published=0))
    d = diagnose(reports, tp=3)
    assert d.kind == "stale_stage" and d.stale_ranks == {1}
    assert not d.missing_ranks and not d.late_ranks
    assert "published 0, consumed 0, expected 1" in d.summary()


def test_unsanitized_payload_is_distinct_from_missing():
    d = diagnose([report(r, tp=3, partial={0}) for r in range(3)], tp=3)
    assert d.kind == "unsanitized_payload" and d.unsanitized_ranks == {0}
    assert not d.missing_ranks
    assert "token 0, fragment 2: 1 of 8 lanes 0x8000" in d.summary()


def test_hung_rank_is_missing_and_unresponsive():
    reports = [report(r, tp=3, blame={1}) for r in (0, 2)]
    d = diagnose(reports, tp=3, absent={1: "missed the host deadline of 2 s"})
    assert d.kind == "missing_ranks" and d.missing_ranks == {1} and d.unresponsive_ranks == {1}


def test_unexplained_timeout_never_reads_ok():
    # Records that name no source (an inconsistent device error buffer).
    odd = RankReport(rank=1, seq=7, tokens=4, expected_stage=1, published_stage=1,
                     consumed_stage=1, headers=((7, 4), (7, 4)), record_count=3)
    d = diagnose([report(0, tp=2), odd], tp=2)
    assert d.kind == "unexplained_timeout" and "ranks {1}" in d.summary()


def test_reports_must_be_distinct_ranks_in_range():
    with pytest.raises(ValueError, match="distinct ranks"):
        diagnose([report(0, tp=2), report(0, tp=2)], tp=2)
    with pytest.raises(ValueError, match="distinct ranks"):
        diagnose([report(3, tp=2)], tp=2)
    with pytest.raises(ValueError, match="headers for other than tp=2"):
        diagnose([report(0, tp=3)], tp=2)


def test_group_start_check():
    clean = [MailboxCheck(r, 0, 0, (0, 0)) for r in range(3)]
    assert diagnose_start(clean).ok
    dirty = clean[:2] + [MailboxCheck(2, 512, 2, (1, 1))]
    d = diagnose_start(dirty)
    assert d.kind == "dirty_mailbox" and d.dirty_ranks == {2}
    assert "rank 2: 512 non-sentinel lanes, 2 headers set, stage_state [1, 1]" in d.summary()
