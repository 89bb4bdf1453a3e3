"""The AllReduceNorm form table (kernels/lamport/norm_tuning.py), on the CPU."""

from __future__ import annotations

import pytest

from kernels.lamport.norm_tuning import (DEFAULT, SINGLE_MAX_TOKENS, TABLE, NormTuning,
                                         norm_tuning)


def test_the_form_follows_the_token_range():
    t = NormTuning(16)
    assert [t.form(m) for m in (1, 16, 17, 64)] == ["single", "single", "two", "two"]
    assert NormTuning(0).form(1) == "two"


def test_every_entry_is_valid_and_within_the_residency_bound():
    for key, tuning in TABLE.items():
        tuning.validate()
        assert tuning.single_max_tokens <= SINGLE_MAX_TOKENS, key
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
    with pytest.raises(ValueError, match=r"single_max_tokens must be in \[0, 64\], got 99"):
        arn.AllReduceNorm(hidden_size=5120, max_num_tokens=8, eps=1e-6,
                          norm_tuning=NormTuning(99))
