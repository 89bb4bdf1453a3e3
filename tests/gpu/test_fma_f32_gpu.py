"""``numerics.fma_f32`` on CUDA tensors (the mHC GPU tests call it there):
the same bits as the whole-tensor TwoSum oracle on the same device, NaN
payloads included, and as the CPU result wherever that is not a NaN, on the
CPU test's hard cases (tests/test_fma_f32.py)."""

import math

import pytest
import torch

from kernels.reference import numerics as nm
from tests.test_fma_f32 import (F32_MAX, half_ulp_products, midpoint_cases, naive,
                                product_dominant_cases, subnormal_midpoint_cases, two_sum_fma)

pytestmark = pytest.mark.gpu


def _overflow():
    u = torch.arange(1, 362)
    a, b = half_ulp_products(u, torch.full_like(u, 103))
    return a, b, torch.full_like(a, F32_MAX)


def _specials():
    v = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, F32_MAX, 2.0**-149])
    k = len(v)
    return v.view(k, 1, 1).expand(k, k, k), v.view(1, k, 1).expand(k, k, k), v.view(1, 1, k).expand(k, k, k)


CASES = {
    "bit patterns": lambda g: tuple(torch.randint(-2**31, 2**31, (200_000,), generator=g, dtype=torch.int64)
                                    .to(torch.int32).view(torch.float32) for _ in range(3)),
    "normal midpoints": lambda g: midpoint_cases(g, 20_000, -126, 128),
    "product-dominant midpoints": lambda g: product_dominant_cases(g, 200_000)[:3],
    "subnormal midpoints": lambda g: subnormal_midpoint_cases(g, 20_000),
    "overflow threshold": lambda g: _overflow(),
    "specials": lambda g: _specials(),
}


def check_on(device, name):
    a, b, c = CASES[name](torch.Generator().manual_seed(21))
    dev = [t.to(device) for t in (a, b, c)]
    got = nm.fma_f32(*dev)
    assert got.device == dev[0].device
    assert torch.equal(nm.bits(got), nm.bits(two_sum_fma(*dev)))
    cpu = nm.fma_f32(a, b, c)
    got = got.cpu()
    nan = torch.isnan(cpu)
    assert torch.equal(nan, torch.isnan(got))
    assert torch.equal(nm.bits(got)[~nan], nm.bits(cpu)[~nan])
    if name.endswith("midpoints") or name == "overflow threshold":
        assert bool((naive(*dev).cpu() != got).any())  # the double rounding was there to fix


@pytest.mark.parametrize("name", list(CASES))
def test_cuda_fma_f32_matches_the_oracle(name):
    check_on("cuda", name)
