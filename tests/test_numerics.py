"""The contract helpers themselves: exact FMA, ULP distances, poisoning,
generators."""

import math
import struct
from fractions import Fraction

import pytest
import torch

from kernels.reference import numerics as nm


def _exact_f32(x: Fraction) -> float:
    """Correctly rounded (nearest-even) FP32 of a rational, no flush-to-zero."""
    if x == 0:
        return 0.0
    sign, x = (-1 if x < 0 else 1), abs(x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if Fraction(2) ** e > x:
        e -= 1
    e = max(e, -126)
    m = round(x * Fraction(2) ** (23 - e))  # Fraction.__round__: half to even
    value = sign * float(m * Fraction(2) ** (e - 23))
    return struct.unpack("f", struct.pack("f", value))[0]


def test_fma_matches_exact_rational_rounding():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4000, generator=g) * torch.exp2(torch.randint(-30, 30, (4000,), generator=g).float())
    b = torch.randn(4000, generator=g)
    c = -(a * b) + torch.randn(4000, generator=g) * 1e-3  # cancellation-heavy
    got = nm.fma_f32(a, b, c)
    for i in range(0, 4000, 7):
        want = _exact_f32(Fraction(a[i].item()) * Fraction(b[i].item()) + Fraction(c[i].item()))
        assert got[i].item() == want, (i, a[i].item(), b[i].item(), c[i].item())


def test_fma_avoids_double_rounding():
    # a*b = 2^-24 - 2^-70, c = 1 + 2^-23: the exact sum lies just below an
    # FP32 midpoint; FP64 rounds onto the midpoint and then to the wrong side.
    a = torch.tensor([2.0**-24 * (1 + 2.0**-23)])
    b = torch.tensor([1 - 2.0**-23])
    c = torch.tensor([1 + 2.0**-23])
    assert nm.fma_f32(a, b, c).item() == 1 + 2.0**-23
    assert (a.double() * b.double() + c.double()).float().item() == 1 + 2.0**-22


def test_fma_differs_from_separate_rounding():
    a = torch.tensor([1 + 2.0**-12])
    c = torch.tensor([-1.0])
    assert nm.fma_f32(a, a, c).item() == 2.0**-11 + 2.0**-24
    assert (a * a + c).item() == 2.0**-11


def test_fma_keeps_subnormals_and_specials():
    tiny = torch.tensor([2.0**-140])
    assert nm.fma_f32(tiny, torch.tensor([1.0]), torch.tensor([0.0])).item() == 2.0**-140
    out = nm.fma_f32(torch.tensor([math.inf, 1.0]), torch.tensor([1.0, math.nan]), torch.tensor([0.0, 0.0]))
    assert out[0].item() == math.inf and math.isnan(out[1].item())


def test_bf16_ulp_distance():
    a = torch.tensor([1.0, -0.0, 1.0, -1.0, math.nan], dtype=torch.bfloat16)
    b = torch.tensor([1.0078125, 0.0, 1.0, 1.0, 1.0], dtype=torch.bfloat16)
    d = nm.bf16_ulp_distance(a, b)
    assert d[:3].tolist() == [1.0, 0.0, 0.0]
    assert d[3].item() == 2 * 0x3F80
    assert d[4].item() == math.inf


def test_ulp_in_sum_abs_scales_with_terms():
    # An error of 2^-7 is one BF16 ULP at magnitude 1 and 1/2 at magnitude 2.
    u = nm.ulp_in_sum_abs(torch.tensor([1.0, 1.0]), torch.tensor([1.0 + 2**-7, 1.0 + 2**-7]),
                          torch.tensor([1.0, 2.0]))
    assert u.tolist() == [1.0, 0.5]


def test_round_bf16_from_f64_is_single_rounding():
    # 1 + 2^-8 + 2^-40: above the BF16 midpoint, but FP32 rounds it onto the
    # midpoint (1 + 2^-8) and nearest-even would then go down.
    x = torch.tensor([1 + 2.0**-8 + 2.0**-40], dtype=torch.float64)
    assert nm.round_bf16(x).item() == 1 + 2.0**-7
    assert x.float().to(torch.bfloat16).item() == 1.0


def test_poison_and_all_written():
    t = nm.poison_(torch.empty(4, 3, dtype=torch.bfloat16))
    assert nm.unwritten(t).all()
    t[:, :2] = 0
    try:
        nm.assert_all_written(t, "out")
    except AssertionError as e:
        assert "4 of 12" in str(e) and "(0, 2)" in str(e)
    else:
        raise AssertionError("poison went unnoticed")
    t[:, 2] = float("nan")  # a canonical NaN is written, not poison
    nm.assert_all_written(t, "out")


def test_assert_bit_exact_rejects_nan_and_one_bit():
    x = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    nm.assert_bit_exact(x, x.clone(), "x")
    y = x.clone(); y.view(torch.int16)[1] += 1
    for bad in (y, torch.tensor([1.0, math.nan], dtype=torch.bfloat16)):
        try:
            nm.assert_bit_exact(bad, x, "x")
        except AssertionError:
            continue
        raise AssertionError("a mismatch passed")


def test_sentinel_patterns_cover_every_negative_subnormal():
    p = nm.sentinel_pattern_partials(4, 8, 256, seed=1)
    raw = set((nm.bits(p).int() & 0xFFFF).flatten().tolist())
    assert 0x8000 in raw and set(range(0x8001, 0x8080)) <= raw


def test_order_sensitive_partials_depend_on_order():
    from kernels.reference.allreduce import all_reduce_sum
    p = nm.order_sensitive_partials(4, 1, 16)
    forward, backward = all_reduce_sum(p), all_reduce_sum(p, order=[3, 2, 1, 0])
    assert not torch.equal(forward, backward)


def _comparison_everywhere(actual, expected):
    """Comparison's figures computed over every element (no shortcut)."""
    ulp = nm.bf16_ulp_distance(actual, expected)
    diff = (actual.to(torch.float64) - expected.to(torch.float64)).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
    same = (nm.bits(actual) == nm.bits(expected) if actual.dtype == expected.dtype
            else ulp == 0)
    first = tuple(int(i) for i in (~same).nonzero()[0]) if (~same).any() else None
    return (actual.numel(), int((~same).sum()), float(ulp.max()) if ulp.numel() else 0.0,
            float(diff.max()) if diff.numel() else 0.0, first)


@pytest.mark.parametrize("dtypes", [(torch.bfloat16, torch.bfloat16),
                                    (torch.float32, torch.float32),
                                    (torch.bfloat16, torch.float32)])
def test_comparison_figures_are_those_over_every_element(dtypes):
    """The shortcut (only elements whose bits differ, NaN and infinities get
    distances) changes no figure: equal and unequal bits, NaN on either
    side, equal and opposite infinities, +0.0 against -0.0, empty."""
    g = torch.Generator().manual_seed(7)
    specials = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0])
    for trial in range(40):
        expected = torch.randn(3, 37, generator=g).to(dtypes[1])
        actual = expected.to(dtypes[0]).clone()
        flat = actual.view(-1)
        for _ in range(trial % 6):
            i = int(torch.randint(flat.numel(), (1,), generator=g))
            pick = int(torch.randint(3, (1,), generator=g))
            if pick == 0:  # one step away
                flat[i] = torch.nextafter(flat[i].float(), torch.tensor(math.inf)).to(flat.dtype)
            else:
                value = specials[int(torch.randint(len(specials), (1,), generator=g))]
                (flat if pick == 1 else expected.view(-1))[i] = value.to(flat.dtype)
        cmp = nm.Comparison(actual, expected)
        assert (cmp.elements, cmp.mismatches, cmp.max_ulp, cmp.max_abs_err,
                cmp.first_mismatch) == _comparison_everywhere(actual, expected), trial
    same = torch.tensor([1.0, math.inf, math.nan, -0.0])  # equal bits, yet inf apart
    cmp = nm.Comparison(same.to(dtypes[0]), same.to(dtypes[1]))
    assert (cmp.mismatches, cmp.max_ulp, cmp.max_abs_err) == (0 if dtypes[0] == dtypes[1] else 1,
                                                             math.inf, math.inf)
    assert (cmp.elements, cmp.mismatches, cmp.max_ulp, cmp.max_abs_err, cmp.first_mismatch) \
        == _comparison_everywhere(same.to(dtypes[0]), same.to(dtypes[1]))
    empty = torch.empty(0, 4, dtype=dtypes[0])
    assert nm.Comparison(empty, empty.to(dtypes[1])).max_ulp == 0.0


@pytest.mark.parametrize("dtype, width", [(torch.bfloat16, torch.int16),
                                          (torch.float16, torch.int16),
                                          (torch.float32, torch.int32)])
def test_the_comparisons_non_finite_test_on_bits_is_isfinite_negated(dtype, width):
    """numerics._not_finite reads the exponent bits; over every BF16/FP16
    pattern (FP32: a random million) it is exactly ~torch.isfinite."""
    from kernels.reference.numerics import _not_finite

    if width == torch.int16:
        patterns = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    else:
        g = torch.Generator().manual_seed(0)
        patterns = torch.randint(-(2**31), 2**31 - 1, (1_000_000,), dtype=torch.int64,
                                 generator=g).to(torch.int32)
        patterns[:3] = torch.tensor([0x7F800000, -0x800000, 0x7FC00000], dtype=torch.int32)
    values = patterns.view(dtype)
    assert torch.equal(_not_finite(values), ~torch.isfinite(values))
