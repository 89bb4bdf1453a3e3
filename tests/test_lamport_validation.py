"""Input validation of AllReduceNorm (CPU tensors; nothing is launched)."""

import pytest
import torch

from kernels.lamport.all_reduce_norm import AllReduceNormOptions, validate_inputs
from kernels.lamport.norm import norm_threads

H, CAP = 2560, 16


def bf16(*shape):
    return torch.zeros(*shape, dtype=torch.bfloat16)


def call(x=None, residual=None, weight=None, out=None):
    x = bf16(4, H) if x is None else x
    residual = bf16(x.shape[0] if x.dim() else 1, H) if residual is None else residual
    weight = bf16(H) if weight is None else weight
    return validate_inputs(x, residual, weight, out, hidden=H, capacity=CAP, device="cpu")


def test_valid_call_returns_tokens():
    assert call() == 4
    assert call(out=(bf16(4, H), bf16(4, H))) == 4


@pytest.mark.parametrize("kwargs, match", [
    (dict(x=torch.zeros(4, H)), r"x must be torch.bfloat16.*float32"),
    (dict(x=bf16(4, H + 8)), r"x must have shape \[\*, 2560\].*2568"),
    (dict(x=bf16(0, H), residual=bf16(0, H)), r"x.shape\[0\] \(tokens\) must be in \[1, 16\], got 0"),
    (dict(x=bf16(17, H), residual=bf16(17, H)), r"must be in \[1, 16\], got 17"),
    (dict(x=bf16(H, 4).t()), r"x must be contiguous"),
    (dict(x=bf16(4 * H + 1)[1:].view(4, H)), r"x must be 16-byte aligned"),
    (dict(residual=bf16(3, H)), r"residual must have shape \[4, 2560\]"),
    (dict(weight=bf16(H // 2)), r"norm_weight must have shape \[2560\]"),
    (dict(weight=torch.zeros(H)), r"norm_weight must be torch.bfloat16"),
    (dict(out=(bf16(4, H),)), r"out must be a \(norm_out, residual_out\) pair"),
    (dict(out=(bf16(4, H), bf16(5, H))), r"out\[1\] \(residual_out\) must have shape"),
])
def test_bad_inputs_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        call(**kwargs)


@pytest.mark.parametrize("hidden", [2048, 2560, 3584, 4096, 5120, 7168, 8192])
def test_supported_hidden(hidden):
    assert norm_threads(hidden) == hidden // 8


@pytest.mark.parametrize("hidden, match", [
    (2564, "multiple of 8, got 2564"),
    (2056, "whole number of warps.*2056 \\(257 threads\\)"),
    (8448, "<= 1024.*8448"),
])
def test_unsupported_hidden(hidden, match):
    with pytest.raises(ValueError, match=match):
        AllReduceNormOptions(hidden, 16, 1e-6).validate()


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_num_tokens=0), "max_num_tokens must be >= 1, got 0"),
    (dict(eps=0.0), "eps must be > 0"),
    (dict(transport="nvls"), "transport must be one of .*'nvls'"),
    (dict(budget_ns=-1), "budget_ns must be >= 0, got -1"),
])
def test_bad_options(kwargs, match):
    base = dict(hidden_size=4096, max_num_tokens=16, eps=1e-6)
    base.update(kwargs)
    with pytest.raises(ValueError, match=match):
        AllReduceNormOptions(**base).validate()
