"""AllReduceMHC's argument checks: ValueError naming the argument and the
values, before anything is allocated or launched (CPU tensors, no GPU)."""

import pytest
import torch

from kernels.all_reduce_mhc import AllReduceMHC, MHCOptions, MHCTuning, MHCVirtualRanks
from kernels.lamport.all_reduce_mhc import (_per_rank, validate_finalize_inputs,
                                            validate_mix_inputs, validate_x)
from kernels.lamport.mhc import MHCKernel

M, HC, H, K, CAP = 5, 4, 64, 8, 16


def _mix(m=M, hc=HC, h=H):
    return dict(residual=torch.zeros(m, hc, h, dtype=torch.bfloat16),
                post=torch.zeros(m, hc), comb=torch.zeros(m, hc, hc), pre=torch.zeros(m, hc),
                norm_weight=torch.ones(h, dtype=torch.bfloat16), norm_eps=1e-6)


def _check_mix(**change):
    args = _mix() | change
    out = args.pop("out", None)
    return validate_mix_inputs(*args.values(), out, m=M, hidden=H, hc=HC)


def test_good_inputs_pass():
    assert _check_mix() == 1e-6
    assert _check_mix(post=torch.zeros(M, HC, 1)) == 1e-6
    out = (torch.empty(M, HC, H, dtype=torch.bfloat16), torch.empty(M, H, dtype=torch.bfloat16))
    assert _check_mix(out=out) == 1e-6
    assert validate_x(torch.zeros(M, H, dtype=torch.bfloat16), hidden=H, capacity=CAP) == M


@pytest.mark.parametrize("change, match", [
    (dict(residual=torch.zeros(M, 2, H, dtype=torch.bfloat16)),
     r"residual must have shape \[5, 4, 64\]"),
    (dict(residual=torch.zeros(M, HC, H)), "residual must be torch.bfloat16"),
    (dict(residual=torch.zeros(M, H, HC, dtype=torch.bfloat16).transpose(1, 2)),
     "residual must be contiguous"),
    (dict(post=torch.zeros(M, HC, 2)), r"post must have shape \[5, 4\] or \[5, 4, 1\]"),
    (dict(post=torch.zeros(M, HC, dtype=torch.float64)), "post must be torch.float32"),
    (dict(comb=torch.zeros(M, HC, HC - 1)), r"comb must have shape \[5, 4, 4\]"),
    (dict(pre=torch.zeros(M, HC).bfloat16()), "pre must be torch.float32"),
    (dict(norm_weight=torch.ones(H)), "norm_weight must be torch.bfloat16"),
    (dict(norm_eps=0.0), "norm_eps must be a finite real > 0"),
    (dict(norm_eps=float("nan")), "norm_eps must be a finite real > 0"),
    (dict(norm_eps=True), "norm_eps must be a finite real > 0"),
    (dict(norm_eps="1e-6"), "norm_eps must be a finite real > 0"),
    (dict(out=(torch.empty(M, HC, H, dtype=torch.bfloat16),)), "out must be a"),
    (dict(out=(torch.empty(M, HC, H, dtype=torch.bfloat16),
               torch.empty(M, H + 8, dtype=torch.bfloat16))), r"out\[1\] \(layer_input\)"),
])
def test_bad_mix_names_the_argument(change, match):
    with pytest.raises(ValueError, match=match):
        _check_mix(**change)


def test_bad_x_and_alignment():
    with pytest.raises(ValueError, match=r"x must have shape \[\*, 64\]"):
        validate_x(torch.zeros(M, H + 8, dtype=torch.bfloat16), hidden=H, capacity=CAP)
    with pytest.raises(ValueError, match=r"x.shape\[0\] \(tokens\) must be in \[1, 16\], got 17"):
        validate_x(torch.zeros(CAP + 1, H, dtype=torch.bfloat16), hidden=H, capacity=CAP)
    raw = torch.zeros(M * H + 1, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="x must be 16-byte aligned"):
        validate_x(raw[1:].view(M, H), hidden=H, capacity=CAP)
    with pytest.raises(ValueError, match=r"xs\[3\] must be torch.bfloat16"):
        validate_x(torch.zeros(M, H), hidden=H, capacity=CAP, name="xs[3]")


def _moe(m=M, rows=12):
    return dict(gemm2_permuted=torch.zeros(rows, H, dtype=torch.bfloat16),
                expert_weights=torch.zeros(m, K),
                expanded_idx_to_permuted_idx=torch.zeros(m, K, dtype=torch.int32),
                shared_output=torch.zeros(m, H, dtype=torch.bfloat16))


@pytest.mark.parametrize("change, match", [
    (dict(expert_weights=torch.zeros(M, K, dtype=torch.bfloat16)),
     "moes.1.expert_weights must be torch.float32"),
    (dict(expert_weights=torch.zeros(M, K - 1)), r"expert_weights must have shape \[5, 8\]"),
    (dict(expanded_idx_to_permuted_idx=torch.zeros(M, K, dtype=torch.int64)),
     "expanded_idx_to_permuted_idx must be torch.int32"),
    (dict(gemm2_permuted=torch.zeros(12, H - 8, dtype=torch.bfloat16)),
     r"gemm2_permuted must have shape \[\*, 64\]"),
    (dict(shared_output=torch.zeros(CAP + 1, H, dtype=torch.bfloat16)),
     r"shared_output.shape\[0\] \(tokens\) must be in \[1, 16\]"),
    (dict(shared_output=None), "shared_output must be a torch.Tensor"),
])
def test_bad_finalize_inputs_name_the_argument(change, match):
    args = _moe() | change
    with pytest.raises(ValueError, match=match):
        validate_finalize_inputs(*args.values(), hidden=H, capacity=CAP, top_k=K,
                                 prefix="moes.1." if "moes" in match else "")


def test_finalize_needs_top_k():
    assert validate_finalize_inputs(*_moe().values(), hidden=H, capacity=CAP, top_k=K) == M
    with pytest.raises(ValueError, match="constructed with top_k"):
        validate_finalize_inputs(*_moe().values(), hidden=H, capacity=CAP, top_k=None)


@pytest.mark.parametrize("kw, match", [
    (dict(hidden_size=5124), "hidden_size must be a positive multiple of 8, got 5124"),
    (dict(hc_mult=0), r"hc_mult must be an int in \[1, 8\], got 0"),
    (dict(max_num_tokens=0), "max_num_tokens must be an int >= 1, got 0"),
    (dict(transport="nvls"), r"transport must be one of \['unicast', 'multicast'\], got 'nvls'"),
    (dict(budget_ns=-1), "budget_ns must be an int >= 0, got -1"),
    (dict(top_k=0), r"top_k must be None or an int in \[1, 128\], got 0"),
    (dict(tuning=MHCTuning(cluster_size=5, rank_lanes=2)), "rank_lanes=2 must divide tp=1"),
    (dict(tuning=MHCTuning(cluster_size=1, threads=32)), "needs 20 trips"),
    (dict(tuning=(5, 128, 1)), "tuning must be an MHCTuning, got tuple"),
])
def test_constructor_rejects_before_allocating(kw, match):
    """No CUDA on this machine: reaching the mailbox would fail differently."""
    args = dict(hidden_size=5120, hc_mult=4, max_num_tokens=8) | kw
    with pytest.raises(ValueError, match=match):
        AllReduceMHC(**args)


def test_virtual_ranks_reject_before_allocating():
    with pytest.raises(ValueError, match="virtual ranks support transport='unicast' only"):
        MHCVirtualRanks(tp=2, hidden_size=5120, hc_mult=4, max_num_tokens=8,
                        transport="multicast")
    with pytest.raises(ValueError, match="tp must be one of 1, 2, 4, 8, got 3"):
        MHCVirtualRanks(tp=3, hidden_size=5120, hc_mult=4, max_num_tokens=8)
    with pytest.raises(ValueError, match="rank_lanes=8 must divide tp=4"):
        AllReduceMHC.virtual_ranks(tp=4, hidden_size=5120, hc_mult=4, max_num_tokens=8,
                                   tuning=MHCTuning(5, 1024, 8))


def test_options_and_per_rank():
    MHCOptions(8, 1, 1).validate()
    t = torch.zeros(1)
    assert _per_rank("post", t, 3) == [t, t, t]
    assert _per_rank("post", [t, t], 2) == [t, t]
    with pytest.raises(ValueError, match="post must be a tensor or a sequence of tp=2 tensors, "
                                         "got list of length 3"):
        _per_rank("post", [t, t, t], 2)


def test_kernel_rejects_bad_hc_and_watchdog():
    base = dict(hidden=5120, tp=1, cluster_size=5, threads=128, rank_lanes=1)
    with pytest.raises(ValueError, match=r"hc_mult must be an int in \[1, 8\], got 9"):
        MHCKernel(hc=9, **base)
    with pytest.raises(ValueError, match="budget_ns must be >= 0"):
        MHCKernel(hc=4, budget_ns=-5, **base)
