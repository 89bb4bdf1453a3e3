"""Multicast gate and group diagnosis (no GPU)."""

import pytest

from kernels.lamport.diagnosis import diagnose_errors as diagnose
from kernels.lamport.mailbox import (RankErrors, multicast_decision,
                                     require_multicast)
from kernels.lamport.protocol import (ERR_BAD_STAGE, ERR_COUNT, ERR_HEADER_WORDS,
                                      ERR_MISSING_MASK, ERR_UNSANITIZED_MASK,
                                      error_buffer_words)

MC = 0x7F0000000000


def test_multicast_allowed_only_with_everything():
    assert multicast_decision(opt_in=True, multicast_ptr=MC, env={})[0]


@pytest.mark.parametrize("kw, env, why", [
    (dict(opt_in=False, multicast_ptr=MC), {}, "opted in"),
    (dict(opt_in=True, multicast_ptr=0), {}, "multicast_ptr == 0"),
    (dict(opt_in=True, multicast_ptr=MC + 8), {}, "aligned"),
    (dict(opt_in=True, multicast_ptr=MC), {"NCCL_NVLS_ENABLE": "0"}, "NCCL_NVLS_ENABLE"),
    (dict(opt_in=True, multicast_ptr=MC), {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"},
     "TORCH_SYMM_MEM_DISABLE_MULTICAST"),
    (dict(opt_in=True, multicast_ptr=MC), {"NVSHMEM_DISABLE_NVLS": "1"}, "NVSHMEM_DISABLE_NVLS"),
])
def test_multicast_refused(kw, env, why):
    ok, reason = multicast_decision(env=env, **kw)
    assert not ok and why in reason
    with pytest.raises(RuntimeError, match="multicast"):
        require_multicast(env=env, **kw)


def test_multicast_gate_ignores_other_values():
    env = {"NCCL_NVLS_ENABLE": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "0"}
    assert multicast_decision(opt_in=True, multicast_ptr=MC, env=env)[0]


def test_multicast_gate_reads_process_env(monkeypatch):
    monkeypatch.setenv("NVSHMEM_DISABLE_NVLS", "1")
    assert not multicast_decision(opt_in=True, multicast_ptr=MC)[0]


def _report(rank, stage, missing=(), unsanitized=(), bad=None, records=()):
    words = [0] * error_buffer_words(4)
    words[ERR_COUNT] = len(records)
    words[ERR_MISSING_MASK] = sum(1 << s for s in missing)
    words[ERR_UNSANITIZED_MASK] = sum(1 << s for s in unsanitized)
    words[ERR_BAD_STAGE] = 0 if bad is None else bad + 1
    for i, rec in enumerate(records):
        words[ERR_HEADER_WORDS + 8 * i: ERR_HEADER_WORDS + 8 * (i + 1)] = rec
    return RankErrors.decode(rank, [stage, (stage + 1) % 3], words)


def test_decode_records():
    r = _report(1, 2, missing=(3,), records=[[5, 3, 17, 2] + [-2147450880] * 4])
    (rec,) = r.records
    assert (rec.token, rec.source, rec.fragment, rec.stage) == (5, 3, 17, 2)
    assert rec.missing and rec.words == (0x80008000,) * 4
    assert not r.ok


def test_diagnose_names_the_rank_that_skipped():
    reports = [_report(0, 1, missing=[2]), _report(1, 1, missing=[2]),
               _report(2, 0, missing=[0, 1, 2, 3]), _report(3, 1, missing=[2])]
    d = diagnose(reports)
    assert d.missing_ranks == {2} and d.stale_ranks == {2}
    assert "missing ranks: {2}" in d.summary() and "stale stage" in d.summary()


def test_diagnose_tp2_and_clean():
    d = diagnose([_report(0, 1, missing=[1]), _report(1, 0, missing=[0, 1])])
    assert d.missing_ranks == {1}
    assert diagnose([_report(0, 1), _report(1, 1)]).ok
    assert diagnose([_report(0, 1), _report(1, 1)]).summary() == "ok"


def test_diagnose_late_rank_without_stale_stage():
    """Rank 3 published at the right stage but its data came too late: a
    late rank (the cluster's vocabulary), neither missing nor stale."""
    d = diagnose([_report(0, 1, missing=[3]), _report(1, 1, missing=[3]),
                  _report(2, 1, missing=[3]), _report(3, 1)])
    assert d.late_ranks == {3} and not d.missing_ranks and not d.stale_ranks
    assert "late ranks: {3}" in d.summary()


def test_diagnose_unsanitized_and_bad_stage_are_distinct():
    d = diagnose([_report(0, 1, unsanitized=[1]), _report(1, 1)])
    assert d.unsanitized_ranks == {1} and not d.missing_ranks
    d = diagnose([_report(0, 1), _report(1, 7, bad=7)])
    assert d.bad_stage_ranks == {1} and "stage_state corrupt on rank 1: read stage 7" in d.summary()
