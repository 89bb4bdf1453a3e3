"""The AllReduceNorm form table (kernels/lamport/norm_tuning.py), on the CPU."""

from __future__ import annotations

import types

import pytest

from kernels.lamport.norm_tuning import (CLUSTER_MAX_TOKENS, DEFAULT, FORMS, SINGLE_MAX_TOKENS,
                                         TABLE, NormTuning, check_sync, forced, norm_tuning)


def test_the_form_follows_the_token_range():
    t = NormTuning(16)
    assert [t.form(m) for m in (1, 16, 17, 64)] == ["single", "single", "two", "two"]
    assert NormTuning(0).form(1) == "two"


def test_the_cluster_covers_the_whole_grid_from_two_tokens_to_its_bound():
    t = NormTuning(64, "cluster")
    assert [t.launch_sync(m) for m in (1, 2, 16, 17)] == [("counter", 1), ("cluster", 2),
                                                           ("cluster", 16), ("counter", 1)]
    assert [t.variant(m) for m in (1, 2, CLUSTER_MAX_TOKENS, 17, 65)] == [
        "single", "single+cluster", "single+cluster", "single", "two"]
    assert NormTuning(64, "none").launch_sync(64) == ("none", 1)
    assert NormTuning(64).variant(8) == "single" and NormTuning(0, "none").variant(4) == "two"


def test_a_moe_output_s_call_has_its_own_bound():
    t = NormTuning(64, "none", 16)
    assert [t.form(m, path="finalize") for m in (1, 16, 17)] == ["single", "single", "two"]
    assert t.variant(17, path="finalize") == "two" and t.variant(17) == "single+nosync"
    assert NormTuning(0, "none", 8).variant(8, path="finalize") == "single+nosync"
    assert NormTuning(8).form(1, path="finalize") == "two"
    with pytest.raises(ValueError, match=r"finalize_max_tokens must be in \[0, 64\], got 65"):
        NormTuning(0, "counter", 65).validate()


def test_an_agreement_that_is_not_one_is_refused():
    with pytest.raises(ValueError, match=r"sync must be one of .*got 'barrier'"):
        NormTuning(64, "barrier").validate()


def test_no_agreement_only_at_tp_1_with_unicast():
    check_sync(NormTuning(64, "none"), tp=1, transport="unicast")
    check_sync(NormTuning(0, "none"), tp=2, transport="unicast")  # never launches it
    with pytest.raises(ValueError, match=r"sync='none' needs tp = 1"):  # the finalize's alone
        check_sync(NormTuning(0, "none", 8), tp=2, transport="unicast")
    for tp, transport in ((2, "unicast"), (1, "multicast")):
        with pytest.raises(ValueError, match=rf"sync='none' needs tp = 1 and unicast.*"
                                             rf"tp={tp}, transport='{transport}'"):
            check_sync(NormTuning(64, "none"), tp=tp, transport=transport)


def test_every_forced_form_is_what_it_names():
    assert forced("auto") is None
    got = {f: forced(f) for f in FORMS if f != "auto"}
    assert {f: t.variant(8) for f, t in got.items()} == {f: f for f in got}
    assert {f: t.variant(8, path="finalize") for f, t in got.items()} == {f: f for f in got}
    with pytest.raises(ValueError, match=r"form must be one of .*got 'cluster'"):
        forced("cluster")


def test_every_entry_is_valid_and_within_the_residency_bound():
    for (_, _, tp), tuning in TABLE.items():
        tuning.validate()
        check_sync(tuning, tp=tp, transport="unicast")
        assert tuning.single_max_tokens <= SINGLE_MAX_TOKENS, tuning
        assert tuning.finalize_max_tokens <= SINGLE_MAX_TOKENS, tuning
    with pytest.raises(ValueError, match=r"single_max_tokens must be in \[0, 64\], got 65"):
        NormTuning(65).validate()


def test_unmeasured_shapes_keep_two_kernels():
    assert norm_tuning(hidden=5120, tp=2, arch="sm_90a") is DEFAULT
    assert norm_tuning(hidden=5120, tp=1, arch="sm_100a") is DEFAULT
    assert norm_tuning(hidden=5120, tp=1, arch="sm_90a").form(16) == "single"


def test_a_given_tuning_is_checked_before_any_cuda_call(monkeypatch):
    import kernels.lamport.all_reduce_norm as arn

    monkeypatch.setattr(arn.Mailbox, "virtual_ranks", lambda **kw: pytest.fail("allocated"))
    with pytest.raises(ValueError, match="single-kernel form is one-shot only.*'owner'"):
        arn.AllReduceNorm(hidden_size=5120, max_num_tokens=8, eps=1e-6, mode="owner",
                          norm_tuning=NormTuning(8))
    with pytest.raises(ValueError, match="single-kernel form is one-shot only.*'owner'"):
        arn.AllReduceNorm(hidden_size=5120, max_num_tokens=8, eps=1e-6, mode="owner",
                          top_k=8, norm_tuning=NormTuning(0, "counter", 8))
    with pytest.raises(ValueError, match=r"single_max_tokens must be in \[0, 64\], got 99"):
        arn.AllReduceNorm(hidden_size=5120, max_num_tokens=8, eps=1e-6,
                          norm_tuning=NormTuning(99))
    with pytest.raises(ValueError, match=r"sync='none' needs tp = 1 and unicast.*tp=2"):
        arn.AllReduceNorm(hidden_size=5120, max_num_tokens=8, eps=1e-6,
                          mailbox=types.SimpleNamespace(tp=2),
                          norm_tuning=NormTuning(8, "none"))
