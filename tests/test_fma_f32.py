"""``numerics.fma_f32`` (FP64 sum, TwoSum only where an FP32 tie may double
round) gives the same bits as the full TwoSum + round-to-odd algorithm it
replaced (kept here as the oracle), and the exact rational FMA where the
values are finite: random operands at many scales, raw bit patterns, sums
built to land on FP32 midpoints (normal and subnormal) and on the overflow
threshold with a nonzero rounding error, infinities, NaNs, signed zeros,
broadcasting, dtypes and strides."""

import math
from fractions import Fraction

import torch

from kernels.reference import numerics as nm
from tests.oracle import f32 as exact_f32

F32_MAX = (2 - 2.0**-23) * 2.0**127


def two_sum_fma(a, b, c):
    """The algorithm ``fma_f32`` had before (every element through TwoSum and
    round-to-odd), verbatim: the oracle for bit-identity."""
    a64, b64, c64 = (t.to(torch.float32).to(torch.float64) for t in (a, b, c))
    p = a64 * b64
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)
    finite = torch.isfinite(s)
    err = torch.where(finite, err, torch.zeros_like(err))
    sb = nm.bits(s)
    need = (err != 0) & ((sb & 1) == 0)
    toward = torch.where(err > 0, torch.full_like(s, math.inf), torch.full_like(s, -math.inf))
    s = torch.where(need, torch.nextafter(s, toward), s)
    return s.to(torch.float32)


def naive(a, b, c):
    """FP64 ``a * b + c`` rounded to FP32: double rounding where it bites."""
    return (a.double() * b.double() + c.double()).float()


def rounding_error(a, b, c):
    """The FP64 sum's rounding error (TwoSum; finite inputs)."""
    p, c64 = a.double() * b.double(), c.double()
    s = p + c64
    bb = s - p
    return (p - (s - bb)) + (c64 - bb)


def assert_same_bits(a, b, c):
    got, want = nm.fma_f32(a, b, c), two_sum_fma(a, b, c)
    assert got.dtype == torch.float32 and got.shape == want.shape
    diff = (nm.bits(got) != nm.bits(want)).nonzero()
    assert not len(diff), [(a.expand(got.shape)[tuple(i)].item(), b.expand(got.shape)[tuple(i)].item(),
                            c.expand(got.shape)[tuple(i)].item(), got[tuple(i)].item(),
                            want[tuple(i)].item()) for i in diff[:5]]
    return got


def assert_exact(a, b, c, got, sample):
    """``got`` equals the correctly rounded rational ``a * b + c`` (values; the
    sign of a zero is checked elsewhere) at the ``sample`` indices."""
    for i in sample:
        x = Fraction(a[i].item()) * Fraction(b[i].item()) + Fraction(c[i].item())
        assert got[i].item() == float(exact_f32(x)), (i, a[i].item(), b[i].item(), c[i].item())


def f32_from_parts(sign, exponent, mantissa):
    """FP32 tensors ``sign * (2^23 + mantissa) * 2^(exponent - 23)`` (normal)."""
    raw = ((sign < 0).to(torch.int64) << 31) | ((exponent + 127) << 23) | mantissa
    return raw.to(torch.int32).view(torch.float32)


def half_ulp_products(u, scale_log2):
    """FP32 pairs ``(a, b)`` with ``a * b = 2^scale_log2 * (1 - u^2 * 2^-46)``
    exactly: ``(2^23 + u)(2^23 - u) = 2^46 - u^2``; u in [1, 362) keeps the
    deficit below 2^-29 (relative), i.e. below half an FP64 ULP of a sum
    2^24 times larger."""
    k1 = torch.div(scale_log2 - 46, 2, rounding_mode="floor")
    k2 = scale_log2 - 46 - k1
    a = (2.0**23 + u.double()) * torch.pow(2.0, k1.double())
    b = (2.0**23 - u.double()) * torch.pow(2.0, k2.double())
    assert torch.equal(a.float().double(), a) and torch.equal(b.float().double(), b)
    return a.float(), b.float()


def test_random_operands_at_many_scales():
    g = torch.Generator().manual_seed(1)
    n = 100_000

    def scaled(lo, hi):
        return torch.randn(n, generator=g) * torch.exp2(torch.randint(lo, hi, (n,), generator=g).float())

    a, b, c = scaled(-60, 60), scaled(-60, 60), scaled(-100, 100)
    got = assert_same_bits(a, b, c)
    assert_exact(a, b, c, got, range(0, n, 97))
    cancel = -(a * b) + scaled(-80, 0)  # a * b + c cancels most bits
    got = assert_same_bits(a, b, cancel)
    assert_exact(a, b, cancel, got, range(0, n, 97))
    # Low-precision operands (BF16 values, rand() weights): many exact FP32
    # midpoints, which must come through untouched.
    x = torch.randn(n, generator=g).to(torch.bfloat16).float()
    w, acc = torch.rand(n, generator=g), torch.randn(n, generator=g)
    assert_same_bits(x, w, acc)
    tie_bits = nm.bits(x.double() * w.double() + acc.double()) & ((1 << 29) - 1)
    assert int((tie_bits == 1 << 28).sum()) > 100


def test_random_bit_patterns():
    """Every FP32 bit pattern is fair: NaNs with payloads, infinities,
    subnormals, zeros and wildly different exponents (inexact FP64 sums)."""
    g = torch.Generator().manual_seed(2)
    n = 200_000
    a, b, c = (torch.randint(-2**31, 2**31, (n,), generator=g, dtype=torch.int64)
               .to(torch.int32).view(torch.float32) for _ in range(3))
    assert_same_bits(a, b, c)
    a16, b16, c16 = (torch.randint(-2**15, 2**15, (n,), generator=g).to(torch.int16).view(torch.bfloat16)
                     for _ in range(3))
    assert_same_bits(a16, b16, c16)
    # Exponents near each other and near the subnormal / overflow edges.
    for lo, hi in ((0, 40), (100, 160), (230, 255)):
        e = [torch.randint(lo, hi, (n,), generator=g) for _ in range(3)]
        m = [torch.randint(0, 1 << 23, (n,), generator=g) for _ in range(3)]
        s = [torch.randint(0, 2, (n,), generator=g) for _ in range(3)]
        a, b, c = ((s[i] << 31 | e[i] << 23 | m[i]).to(torch.int32).view(torch.float32)
                   for i in range(3))
        assert_same_bits(a, b, c)
        assert_same_bits(a, b, -(a * b))


def midpoint_cases(g, n, exponent_lo, exponent_hi):
    """``c`` an FP32 value, ``a * b`` just under half an FP32 ULP of ``c``
    toward a neighbour: the exact sum lies strictly between ``c`` and the
    midpoint, the FP64 sum is the midpoint itself, so ``c`` is the answer and
    nearest-even from the midpoint is wrong wherever ``c``'s mantissa is odd.
    Mantissas 0 toward zero are moved off (the ULP halves there)."""
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1, 1)
    exponent = torch.randint(exponent_lo, exponent_hi, (n,), generator=g)
    mantissa = torch.randint(0, 1 << 23, (n,), generator=g)
    mantissa[:8] = torch.tensor([0, 1, (1 << 23) - 1, (1 << 23) - 2, 0, 1, (1 << 23) - 1, 2])
    toward = torch.where(torch.rand(n, generator=g) < 0.5, -1, 1)  # relative to |c|
    mantissa = torch.where((mantissa == 0) & (toward < 0), torch.ones_like(mantissa), mantissa)
    c = f32_from_parts(sign, exponent, mantissa)
    u = torch.randint(1, 362, (n,), generator=g)
    a, b = half_ulp_products(u, exponent - 24)
    a = a * (sign * toward).float()
    return a, b, c


def test_normal_midpoints_with_rounding_error():
    g = torch.Generator().manual_seed(3)
    a, b, c = midpoint_cases(g, 20_000, -126, 128)
    got = assert_same_bits(a, b, c)
    assert torch.equal(got, c)  # the exact sum is strictly inside c's rounding interval
    s = a.double() * b.double() + c.double()
    on_tie = (nm.bits(s) & ((1 << 29) - 1)) == 1 << 28
    inexact = rounding_error(a, b, c) != 0
    assert bool((on_tie & inexact).all())
    bites = int((naive(a, b, c) != got).sum())
    assert bites > 5_000, bites  # about half: c's mantissa odd
    assert_exact(a, b, c, got, range(0, len(c), 41))


def product_dominant_cases(g, n):
    """``a * b`` (up to 48 bits) within 2^-30 (relative) of an FP32 midpoint,
    ``d`` the exact distance to it and ``c`` one of its own ULPs off ``d``
    (alternately up and down): ``a * b + c`` is inexact on the midpoint.
    Returns ``(a, b, c, d)``; about 1.5 % of the ``n`` drawn pairs qualify."""
    a = f32_from_parts(torch.ones(n, dtype=torch.int64), torch.randint(-30, 40, (n,), generator=g),
                       torch.randint(0, 1 << 23, (n,), generator=g))
    b = f32_from_parts(torch.where(torch.rand(n, generator=g) < 0.5, -1, 1),
                       torch.randint(-30, 40, (n,), generator=g), torch.randint(0, 1 << 23, (n,), generator=g))
    p = a.double() * b.double()
    e = torch.floor(torch.log2(p.abs()))
    half = torch.exp2(e - 24)
    midpoint = (torch.floor(p / (2 * half)) * 2 + 1) * half  # the nearest odd multiple of half
    d = midpoint - p  # exact: p and midpoint share their top bits
    same_binade = torch.floor(torch.log2(midpoint.abs())) == e  # else it is an FP32 value
    keep = same_binade & (d != 0) & (d.abs() < torch.exp2(e - 30))
    a, b, p, d, midpoint = a[keep], b[keep], p[keep], d[keep], midpoint[keep]
    assert torch.equal(d.float().double(), d)
    nudge = torch.exp2(torch.floor(torch.log2(d.abs())) - 23)
    side = torch.where(torch.arange(len(d)) % 2 == 0, 1.0, -1.0).double()
    c = (d + side * nudge).float()
    assert torch.equal(c.double(), d + side * nudge)
    assert torch.equal(p + c.double(), midpoint) and bool((rounding_error(a, b, c) != 0).all())
    return a, b, c, d.float()


def test_midpoints_from_a_dominant_product():
    """A tiny ``c`` puts a product that nearly sits on an FP32 midpoint exactly
    on it in FP64, with a rounding error (:func:`product_dominant_cases`)."""
    a, b, c, d = product_dominant_cases(torch.Generator().manual_seed(4), 400_000)
    got = assert_same_bits(a, b, c)
    bites = int((naive(a, b, c) != got).sum())
    assert bites > 1_000, bites
    assert_exact(a, b, c, got, range(0, len(c), max(1, len(c) // 500)))
    # Exactly on the midpoint (c = d): no rounding error, nearest-even is right.
    got = assert_same_bits(a, b, d)
    assert torch.equal(got, naive(a, b, d))


def subnormal_midpoint_cases(g, n):
    """Below 2^-126 the FP32 ULP is 2^-149 and the midpoints are the odd
    multiples of 2^-150; an inexact FP64 sum can land on one from 2^-143 up
    (``a * b = 2^-150 (1 - u^2 2^-46)`` needs ``u^2 2^-196`` under half an FP64
    ULP). ``c = k 2^-149``, the exact sum strictly between ``c`` and a
    midpoint; the first is the largest subnormal (odd) heading for 2^-126."""
    k = torch.randint(1 << 7, 1 << 23, (n,), generator=g)  # c = k 2^-149
    k[:4] = torch.tensor([(1 << 23) - 1, (1 << 23) - 2, (1 << 22) + 1, 1 << 7])
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1, 1)
    toward = torch.where(torch.rand(n, generator=g) < 0.5, -1, 1)
    toward[:4] = 1
    c = (sign * k).double() * 2.0**-149
    midpoint = c + (sign * toward).double() * 2.0**-150
    half_ulp64 = torch.exp2(torch.floor(torch.log2(midpoint.abs())) - 53)
    u_max = torch.floor(torch.sqrt(half_ulp64 / 2.0**-196 - 1)).clamp(max=361).long()
    keep = u_max >= 1
    c, sign, toward, u_max = c[keep].float(), sign[keep], toward[keep], u_max[keep]
    u = (torch.rand(len(c), generator=g) * u_max).long() + 1
    a, b = half_ulp_products(u, torch.full_like(u, -150))
    return a * (sign * toward).float(), b, c


def test_subnormal_midpoints_with_rounding_error():
    a, b, c = subnormal_midpoint_cases(torch.Generator().manual_seed(5), 20_000)
    got = assert_same_bits(a, b, c)
    assert torch.equal(got, c)
    assert bool((rounding_error(a, b, c) != 0).all())
    assert bool((got.abs() < 2.0**-126).all())
    bites = int((naive(a, b, c) != got).sum())
    assert bites > 2_000, bites
    # The largest subnormal, odd: the midpoint below 2^-126 rounds up to the
    # smallest normal when the FP64 sum lands on it.
    assert naive(a[:1], b[:1], c[:1]).abs().item() == 2.0**-126
    assert got[0].abs().item() == (1 - 2.0**-23) * 2.0**-126
    assert_exact(a, b, c, got, range(0, len(c), 37))


def test_subnormal_results():
    g = torch.Generator().manual_seed(6)
    n = 100_000
    a = torch.randn(n, generator=g) * 2.0**-70
    b = torch.randn(n, generator=g) * 2.0**-70
    c = torch.randint(-(1 << 20), 1 << 20, (n,), generator=g).double().mul(2.0**-149).float()
    got = assert_same_bits(a, b, c)
    assert int(((got != 0) & (got.abs() < 2.0**-126)).sum()) > n // 2
    assert_exact(a, b, c, got, range(0, n, 97))
    tiny = torch.tensor([2.0**-149, -(2.0**-149), 2.0**-140, 1e-45])
    assert_same_bits(tiny, torch.tensor([0.5, 0.5, 1.0, 1.0]), torch.zeros(4))
    # 2^-150 rounds to 0 (tie, even), a hair above it to 2^-149.
    got = assert_same_bits(torch.tensor([2.0**-75, 2.0**-75 * (1 + 2.0**-23)]),
                           torch.tensor([2.0**-75, 2.0**-75]), torch.zeros(2))
    assert got.tolist() == [0.0, 2.0**-149]


def test_overflow_threshold():
    """2^128 - 2^103, the midpoint between the largest FP32 and 2^128, rounds
    to infinity; an inexact FP64 sum landing on it from below must not."""
    u = torch.arange(1, 362)
    a, b = half_ulp_products(u, torch.full_like(u, 103))
    for sign in (1.0, -1.0):
        c = torch.full_like(a, sign * F32_MAX)
        got = assert_same_bits(sign * a, b, c)
        assert bool((got == sign * F32_MAX).all())
        assert bool((naive(sign * a, b, c) == sign * math.inf).all())
    # Exactly on the threshold, or past it: infinity.
    a = torch.tensor([2.0**52, 2.0**52, 2.0**100, -(2.0**100), 2.0**64, 3.0e38])
    b = torch.tensor([2.0**51, 2.0**51 * (1 + 2.0**-23), 2.0**100, 2.0**100, 2.0**64, 2.0])
    c = torch.tensor([F32_MAX, F32_MAX, 1.0, -1.0, 0.0, 1.0])
    got = assert_same_bits(a, b, c)
    assert got.tolist() == [math.inf, math.inf, math.inf, -math.inf, math.inf, math.inf]


def test_infinities_nans_and_zeros():
    nan_bits = [0x7FC00000, 0xFFC00000, 0x7FC00001, 0x7F800001, 0xFFFFFFFF, 0x7FFFFFFF]
    nans = torch.tensor(nan_bits, dtype=torch.int64).to(torch.int32).view(torch.float32)
    values = torch.cat([nans, torch.tensor([math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, F32_MAX,
                                            -F32_MAX, 2.0**-149, -(2.0**-149), 2.0**-126, 3.0])])
    n = len(values)
    a = values.view(n, 1, 1).expand(n, n, n)
    b = values.view(1, n, 1).expand(n, n, n)
    c = values.view(1, 1, n).expand(n, n, n)
    got = assert_same_bits(a, b, c)
    assert bool(torch.isnan(got[:len(nan_bits)]).all())
    # Zeros: only (-0) + (-0) is -0 under nearest-even.
    z, one = torch.tensor([0.0, -0.0]), torch.tensor([1.0, -1.0])
    got = assert_same_bits(z.view(2, 1, 1), one.view(1, 2, 1), z.view(1, 1, 2))
    signs = torch.signbit(got).reshape(-1).tolist()
    # (+0*1)+0, (+0*1)-0, (+0*-1)+0, (+0*-1)-0, (-0*1)+0, (-0*1)-0, (-0*-1)+0, (-0*-1)-0
    assert signs == [False, False, False, True, False, True, False, False]


def test_exact_cancellation_is_positive_zero():
    g = torch.Generator().manual_seed(7)
    a = torch.randn(10_000, generator=g).to(torch.bfloat16).float()
    b = torch.randn(10_000, generator=g).to(torch.bfloat16).float()
    c = -(a * b)  # exact: 16-bit products
    assert torch.equal(c.double(), -(a.double() * b.double()))
    got = assert_same_bits(a, b, c)
    assert bool((got == 0).all()) and not bool(torch.signbit(got).any())
    got = assert_same_bits(-a, b, a * b)
    assert not bool(torch.signbit(got).any())


def test_broadcasting_dtypes_and_strides():
    g = torch.Generator().manual_seed(8)
    x = torch.randn(6, 40, generator=g)
    w = torch.rand(6, 1, generator=g)
    acc = torch.randn(40, generator=g) * 2.0**-30
    got = assert_same_bits(x, w, acc)
    assert got.shape == (6, 40)
    assert_same_bits(w, torch.randn(1, 40, generator=g), torch.randn(6, 1, generator=g))
    assert_same_bits(x.t(), w.t(), acc.view(40, 1))  # non-contiguous
    assert_same_bits(x[:, ::3], w, acc[::3])
    for dtype in (torch.bfloat16, torch.float16, torch.float64):
        assert_same_bits(x.to(dtype), w.to(dtype), acc.to(dtype))
    assert_same_bits(torch.tensor(3.0), torch.tensor(1 + 2.0**-23), torch.tensor(-3.0))  # 0-d
    assert nm.fma_f32(torch.tensor(3.0), torch.tensor(1 + 2.0**-23), torch.tensor(-3.0)).shape == ()
    empty = nm.fma_f32(torch.empty(0, 5), torch.empty(1, 5), torch.empty(5))
    assert empty.shape == (0, 5) and empty.dtype == torch.float32
    # A midpoint case inside a broadcast: c broadcast over a row of products.
    a, b, c = midpoint_cases(torch.Generator().manual_seed(9), 64, -20, 20)
    got = assert_same_bits(a.view(8, 8), b.view(8, 8), c.view(8, 8))
    assert got.shape == (8, 8) and torch.equal(got, c.view(8, 8))
    got = assert_same_bits(a.view(8, 8), b.view(8, 8)[:1], c.view(8, 8)[:, :1])  # broadcast
    assert bool((naive(a[0], b[0], c[0]) != c[0]).item()) or bool((naive(a[1], b[1], c[1]) != c[1]).item())
    for i in range(2):  # 0-d operands on the tie path
        assert nm.bits(assert_same_bits(a[i], b[i], c[i])).item() == nm.bits(c[i]).item()


def test_the_finalize_step_shape():
    """The MoE finalize's own call: BF16 rows, a [M, 1] FP32 weight, the FP32
    accumulator, with and without the rounding error of a tiny accumulator."""
    g = torch.Generator().manual_seed(10)
    shape = (64, 7168)
    x = torch.randn(*shape, generator=g).to(torch.bfloat16).float()
    w = torch.rand(shape[0], 1, generator=g)
    for scale in (1.0, 2.0**-40):
        acc = torch.randn(*shape, generator=g) * scale
        assert_same_bits(x, w, acc)


def test_the_tie_mask_takes_every_midpoint():
    """``_may_double_round`` holds every FP32 tie (normal midpoints at every
    exponent, the overflow threshold, subnormal midpoints, the one below
    2^-126 that rounds up to it), both signs; and it passes over ordinary
    values, zeros and the non-ties among the subnormals."""
    g = torch.Generator().manual_seed(11)
    exponent = torch.arange(-126, 128).repeat(40)
    mantissa = torch.randint(1, 1 << 23, exponent.shape, generator=g)  # 2^-126 itself is taken
    c = f32_from_parts(torch.ones_like(exponent), exponent, mantissa).double()
    normal = c + torch.exp2(exponent.double() - 24)
    subnormal = (2 * torch.randint(1, 1 << 23, (20_000,), generator=g) + 1).double() * 2.0**-150
    edges = torch.tensor([2.0**128 - 2.0**103, 2.0**-126 - 2.0**-150, 3 * 2.0**-150], dtype=torch.float64)
    ties = torch.cat([normal, subnormal, edges])
    ties = torch.cat([ties, -ties])
    assert bool(nm._may_double_round(ties, ties.float()).all())
    plain = torch.cat([c, c + torch.exp2(exponent.double() - 30), torch.tensor([0.0, -0.0])])
    assert not bool(nm._may_double_round(plain, plain.float()).any())
