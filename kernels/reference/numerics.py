"""The numerical contract's tools: BF16 bits and ULPs, exact FMA emulation,
output poisoning, and the input generators every test and job draws from.

Conventions (see docs/design.md, Numerical contract):
- BF16 ULP distance counts representable BF16 values between two numbers
  (-0.0 and +0.0 are the same point); a NaN on either side is infinitely far,
  so NaN never passes a comparison.
- Where a kernel contracts ``a * b + c`` into an FMA, references call
  :func:`fma_f32`, which rounds once, exactly as the hardware does, with no
  flush-to-zero.
"""

from __future__ import annotations

import math

import torch

from kernels.validation import require_int, require_number

#: The numerical contract's bound on RMSNorm outputs: within this many BF16
#: ULP of the FP32 reference (sums and residuals are bit-exact, bound 0). Op
#: declarations' references and the timed workloads' checks both use it.
NORM_MAX_ULP = 1

#: BF16 negative zero: the Lamport sentinel's bit pattern.
BF16_NEG_ZERO_BITS = 0x8000
#: Negative BF16 subnormals: payload values that look almost like the sentinel.
BF16_NEG_SUBNORMAL_BITS = range(0x8001, 0x8080)

#: Poison written into outputs before a call; an all-ones NaN that no kernel
#: produces (kernels write the canonical NaN 0x7FC0 where they give up).
POISON_BITS = {torch.bfloat16: -1, torch.float16: -1, torch.float32: -1, torch.uint8: 0xFF}

_INT_VIEW = {
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
    torch.float8_e4m3fn: torch.uint8,
    torch.int32: torch.int32,
    torch.int64: torch.int64,
    torch.int16: torch.int16,
    torch.uint8: torch.uint8,
}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bits as a same-width integer tensor (a view)."""
    return t.view(_INT_VIEW[t.dtype])


def from_bf16_bits(values, *, device=None) -> torch.Tensor:
    """BF16 tensor from 16-bit patterns (ints 0..0xFFFF)."""
    raw = torch.as_tensor(values, dtype=torch.int32, device=device)
    return (((raw & 0xFFFF) ^ 0x8000) - 0x8000).to(torch.int16).view(torch.bfloat16)


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    """Round FP32/FP64 values to BF16, nearest-even (as ``cvt.rn.bf16.f32``)."""
    if x.dtype == torch.float64:
        # Round-to-odd to FP32 first keeps the double rounding exact.
        x = _round_to_odd_f32(x)
    return x.to(torch.bfloat16)


def sanitize_negative_zero(x: torch.Tensor) -> torch.Tensor:
    """``x`` with every -0.0 replaced by +0.0, as a publish does before its
    store so that no payload lane looks like the sentinel; all other values
    (negative subnormals included) are unchanged."""
    return torch.where(x == 0, torch.zeros_like(x), x)


def _round_to_odd_f32(x: torch.Tensor) -> torch.Tensor:
    """FP64 -> FP32 rounding to odd (truncate, then set the last bit if
    inexact); a later nearest-even rounding to a format of at most 22
    significant bits (BF16 has 8) is then correctly rounded."""
    f = x.to(torch.float32)
    back = f.to(torch.float64)
    inexact = (back != x) & torch.isfinite(x)
    overshot = inexact & (back.abs() > x.abs())
    f = torch.where(overshot, torch.nextafter(f, torch.zeros_like(f)), f)
    fb = bits(f)
    return torch.where(inexact, fb | 1, fb).view(torch.float32)


#: The FP64 mantissa bits below an FP32 ULP at FP32-normal magnitudes (52 - 23
#: = 29), and their value on an FP32 rounding midpoint: exactly half a ULP.
_BELOW_F32_ULP = (1 << 29) - 1
_HALF_F32_ULP = 1 << 28
#: FP32 bits: the magnitude mask; 2^-126 (the smallest normal) is 1 << 23.
_F32_MAGNITUDE = 0x7FFF_FFFF
_F32_NORMAL_MIN_LOG2 = 23


def _exact_f64(t: torch.Tensor) -> torch.Tensor:
    """``t`` rounded to FP32, as FP64 (exact): one conversion where the dtype
    widens to FP32 exactly anyway."""
    if t.dtype in (torch.float32, torch.bfloat16, torch.float16):
        return t.to(torch.float64)
    return t.to(torch.float32).to(torch.float64)


def _round_to_odd_sum_f32(p: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """FP32 of the exact ``p + c`` (FP64 operands), one rounding: the FP64 sum's
    rounding error (TwoSum) folded in by rounding to odd, then nearest-even to
    FP32. Every element, any shapes that broadcast."""
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    finite = torch.isfinite(s)
    err = torch.where(finite, err, torch.zeros_like(err))
    # Round s to odd in FP64 using err, then nearest-even to FP32.
    sb = bits(s)
    need = (err != 0) & ((sb & 1) == 0)
    toward = torch.where(err > 0, torch.full_like(s, math.inf), torch.full_like(s, -math.inf))
    s = torch.where(need, torch.nextafter(s, toward), s)
    return s.to(torch.float32)


def _may_double_round(s: torch.Tensor, rounded: torch.Tensor) -> torch.Tensor:
    """Boolean mask over the FP64 sums ``s = p + c`` of :func:`fma_f32` (``rounded``
    = ``FP32(s)``), a superset of those an inexact FP64 sum can leave on an
    FP32 tie (a midpoint between adjacent FP32 values, or the overflow
    threshold 2^128 - 2^103).

    At FP32-normal magnitudes the ties are exactly the values whose 29
    mantissa bits below the FP32 ULP read 1000...0. Below 2^-126 the FP32 ULP
    is the fixed 2^-149 and the midpoint bit moves up, so every ``s`` that
    rounds to 0 < |FP32(s)| <= 2^-126 is taken. That leaves out the tie
    +-2^-150 (rounds to 0), which an inexact sum never reaches: were ``s =
    +-2^-150`` inexact, ``p`` and ``c`` would both be nonzero, so |c| >= 2^-149
    (FP32), |p| > 2^-151 and ``p`` (48 significant bits) a multiple of 2^-198,
    as is ``c``; ``p + c`` would then be a multiple of 2^-198 below 2^-149,
    49 bits, exact in FP64."""
    mask = torch.bitwise_and(bits(s), _BELOW_F32_ULP) == _HALF_F32_ULP
    magnitude = torch.bitwise_and(bits(rounded), _F32_MAGNITUDE)
    # 1 <= magnitude <= 2^23, i.e. 0 <= magnitude - 1 < 2^23.
    magnitude.sub_(1).bitwise_right_shift_(_F32_NORMAL_MIN_LOG2)
    return mask.logical_or_(torch.logical_not(magnitude))  # == 0, at half the cost


def fma_f32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``a * b + c`` in FP32 with a single rounding (nearest-even), as
    ``fma.rn.f32`` computes it, bit for bit (infinities, NaNs, signed zeros,
    subnormals, overflow to infinity included; no flush-to-zero); inputs are
    FP32 (or anything that converts to FP32 exactly, e.g. BF16), broadcast
    together.

    Exact: the product of two FP32 values fits FP64, so ``s = a*b + c`` in FP64
    rounds once, and ``FP32(s)`` is then the correctly rounded result except
    where ``s`` is inexact and lands exactly on an FP32 tie (a midpoint, or the
    overflow threshold): only there does the second rounding see a tie the
    exact sum did not have. The rare elements that may sit on a tie
    (:func:`_may_double_round`) are recomputed with the FP64 sum's rounding
    error (TwoSum) folded in by rounding to odd
    (:func:`_round_to_odd_sum_f32`); elsewhere the round-to-odd step would
    move ``s`` at most one FP64 ULP toward the exact sum, never across a tie
    (ties are FP64 values) nor onto one (it moves to an odd last bit; a tie
    ends in 28 zero bits), so both give the same FP32 bits: NaN payloads and
    signs of zeros included, since ``s`` is computed by the same operations.
    tests/test_fma_f32.py holds the whole-tensor algorithm as the oracle.
    """
    if not (a.dim() or b.dim() or c.dim()):  # 0-d: the tie path indexes a dimension
        return fma_f32(a.reshape(1), b.reshape(1), c.reshape(1)).reshape(())
    a64, b64, c64 = (_exact_f64(t) for t in (a, b, c))
    p = a64 * b64
    s = p + c64
    out = s.to(torch.float32)
    if not out.numel():
        return out
    tie = _may_double_round(s, out)
    if tie.view(torch.uint8).max():  # bool.any() is several times slower
        where = tie.nonzero(as_tuple=True)
        out[where] = _round_to_odd_sum_f32(p.expand(s.shape)[where], c64.expand(s.shape)[where])
    return out


def _ordered(t: torch.Tensor) -> torch.Tensor:
    """Map BF16 bit patterns onto integers ordered like the values."""
    raw = bits(t.to(torch.bfloat16)).to(torch.int32) & 0xFFFF
    magnitude = raw & 0x7FFF
    return torch.where(raw >= 0x8000, -magnitude, magnitude)


def bf16_ulp_distance(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Number of BF16 steps between ``actual`` and ``expected`` (int64 as
    float64, ``inf`` where either is NaN). Both are rounded to BF16 first."""
    a, e = actual.to(torch.bfloat16), expected.to(torch.bfloat16)
    dist = (_ordered(a) - _ordered(e)).abs().to(torch.float64)
    nan = torch.isnan(a) | torch.isnan(e)
    return torch.where(nan, torch.full_like(dist, math.inf), dist)


def bf16_ulp_at(magnitude: torch.Tensor) -> torch.Tensor:
    """The BF16 ULP (spacing) at ``|magnitude|``, FP64; subnormal spacing 2^-133
    below the normal range."""
    m = magnitude.to(torch.float64).abs()
    exponent = torch.floor(torch.log2(torch.clamp(m, min=2.0**-126)))
    return torch.pow(2.0, exponent - 7)


def ulp_in_sum_abs(
    actual: torch.Tensor, expected: torch.Tensor, sum_abs: torch.Tensor
) -> torch.Tensor:
    """``|actual - expected|`` in BF16 ULPs of ``sum_abs`` (the sum of the
    absolute values of the terms that produced the value): the bound to use
    where the kernel's contraction order or FMA use is not modelled exactly.
    NaN on either side gives ``inf``."""
    diff = (actual.to(torch.float64) - expected.to(torch.float64)).abs()
    ulps = diff / bf16_ulp_at(sum_abs)
    nan = torch.isnan(actual.to(torch.float64)) | torch.isnan(expected.to(torch.float64))
    return torch.where(nan, torch.full_like(ulps, math.inf), ulps)


_EXPONENT_BITS = {torch.bfloat16: 0x7F80, torch.float16: 0x7C00, torch.float32: 0x7F800000}


def _not_finite(t: torch.Tensor) -> torch.Tensor:
    """``~torch.isfinite(t)`` (NaN or infinity: every exponent bit set), on
    the bits for BF16 / FP16 / FP32: a few times faster on the CPU."""
    mask = _EXPONENT_BITS.get(t.dtype)
    if mask is None:
        return ~torch.isfinite(t)
    return (bits(t) & mask) == mask


class Comparison:
    """Summary of one output compared against its reference: ``elements``,
    ``mismatches`` (elements whose bits differ), ``max_ulp`` (BF16 steps,
    ``inf`` where either side is NaN), ``max_abs_err`` (``inf`` where the
    difference is NaN: a NaN, or equal infinities) and ``first_mismatch``."""

    def __init__(self, actual: torch.Tensor, expected: torch.Tensor):
        if actual.shape != expected.shape:
            raise ValueError(f"shape mismatch: actual {list(actual.shape)} vs expected {list(expected.shape)}")
        if actual.dtype == expected.dtype:
            same_bits = bits(actual) == bits(expected)
            # Elements with equal finite bits are 0 ULP and 0 apart: only the
            # others (mismatches, NaN, infinities) need the distances, which
            # keeps a check of a mostly exact output cheap.
            odd = ~same_bits | _not_finite(actual) | _not_finite(expected)
            actual, expected = actual[odd], expected[odd]
        ulp = bf16_ulp_distance(actual, expected)
        diff = (actual.to(torch.float64) - expected.to(torch.float64)).abs()
        diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
        if actual.dtype != expected.dtype:
            same_bits = ulp == 0
        self.elements = same_bits.numel()
        self.mismatches = int((~same_bits).sum())
        self.max_ulp = float(ulp.max()) if ulp.numel() else 0.0
        self.max_abs_err = float(diff.max()) if diff.numel() else 0.0
        self.first_mismatch = (
            tuple(int(i) for i in (~same_bits).nonzero()[0]) if self.mismatches else None
        )

    @property
    def bit_exact(self) -> bool:
        return self.mismatches == 0

    def __repr__(self) -> str:
        return (f"Comparison(elements={self.elements}, mismatches={self.mismatches}, "
                f"max_ulp={self.max_ulp}, max_abs_err={self.max_abs_err:.3g}, "
                f"first_mismatch={self.first_mismatch})")


def assert_bit_exact(actual: torch.Tensor, expected: torch.Tensor, what: str) -> Comparison:
    """Raise AssertionError unless every bit matches (NaN included: a NaN only
    matches the same NaN pattern, which the references never produce)."""
    cmp = Comparison(actual, expected)
    if not cmp.bit_exact or torch.isnan(actual.to(torch.float32)).any():
        raise AssertionError(f"{what} is not bit-exact: {cmp}")
    return cmp


def assert_within_ulp(actual: torch.Tensor, expected: torch.Tensor, max_ulp: float, what: str) -> Comparison:
    """Raise AssertionError if any element is more than ``max_ulp`` BF16 ULPs
    away (NaN is infinitely far)."""
    cmp = Comparison(actual, expected)
    if not cmp.max_ulp <= max_ulp:
        raise AssertionError(f"{what} exceeds {max_ulp} BF16 ULP: {cmp}")
    return cmp


# --- poisoning -------------------------------------------------------------

def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` in place with the poison pattern (an all-ones NaN)."""
    bits(t).fill_(POISON_BITS.get(t.dtype, -1))
    return t


def unwritten(t: torch.Tensor) -> torch.Tensor:
    """Boolean mask of elements still holding the poison pattern."""
    return bits(t) == POISON_BITS.get(t.dtype, -1)


def assert_all_written(t: torch.Tensor, what: str) -> None:
    """Raise AssertionError if any element of ``t`` still holds the poison."""
    mask = unwritten(t)
    if mask.any():
        first = tuple(int(i) for i in mask.nonzero()[0])
        raise AssertionError(f"{what}: {int(mask.sum())} of {t.numel()} elements never written (first at {first})")


# --- input generators ------------------------------------------------------

def _require_shape(tp: int, tokens: int, hidden: int) -> None:
    """A generator's ``[tp, tokens, hidden]``: positive ints, below a size
    that could not be allocated anyway."""
    require_int("tp", tp, low=1, high=1 << 10)
    require_int("tokens", tokens, low=1, high=1 << 24)
    require_int("hidden", hidden, low=1, high=1 << 20)
    if tp * tokens * hidden > 1 << 31:
        raise ValueError(f"tp * tokens * hidden = {tp * tokens * hidden} elements is over "
                         f"{1 << 31}; got tp={tp}, tokens={tokens}, hidden={hidden}")


def random_partials(tp: int, tokens: int, hidden: int, *, seed: int = 0, scale: float = 1.0,
                    device=None) -> torch.Tensor:
    """``[tp, tokens, hidden]`` BF16 normal partials (deterministic by seed)."""
    _require_shape(tp, tokens, hidden)
    require_int("seed", seed, low=0)
    require_number("scale", scale)
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(tp, tokens, hidden, generator=g)
    if scale != 1.0:  # x * 1.0 is x bit for bit: skip the pass
        x = x * scale
    return x.to(torch.bfloat16).to(device)


def order_sensitive_partials(tp: int, tokens: int, hidden: int, *, device=None) -> torch.Tensor:
    """``[tp, tokens, hidden]`` BF16 partials whose FP32 sum depends on the
    reduction order: each column holds 2^24, +1 and -2^24 on three ranks
    (rotated with the column so each rank sees each value), zeros elsewhere.

    In rank order 0, 1, 2 the FP32 sum is (2^24 + 1) - 2^24 = 0, since
    2^24 + 1 rounds to 2^24; summed as 1 + (2^24 - 2^24) it is 1. For tp < 3
    the values are spread over the ranks there are (order no longer matters).
    """
    _require_shape(tp, tokens, hidden)
    triple = torch.tensor([2.0**24, 1.0, -(2.0**24)])
    x = torch.zeros(tp, tokens, hidden)
    cols = torch.arange(hidden)
    for k in range(3):
        rank = (cols + k) % max(tp, 1)
        if tp >= 3:
            x[rank, :, cols] = triple[k]
        else:
            x[rank, :, cols] += triple[k]
    return x.to(torch.bfloat16).to(device)


def sentinel_pattern_partials(tp: int, tokens: int, hidden: int, *, seed: int = 0,
                              device=None) -> torch.Tensor:
    """``[tp, tokens, hidden]`` BF16 partials full of values that look like the
    Lamport sentinel: -0.0 (0x8000) and every negative subnormal 0x8001..0x807F,
    mixed with +0.0 and ordinary normals. A publish must sanitize -0.0 to +0.0
    and the consumer's bitwise sentinel test must not mistake the subnormals."""
    _require_shape(tp, tokens, hidden)
    require_int("seed", seed, low=0)
    g = torch.Generator(device="cpu").manual_seed(seed)
    n = tp * tokens * hidden
    patterns = torch.tensor([BF16_NEG_ZERO_BITS, 0x0000, *BF16_NEG_SUBNORMAL_BITS], dtype=torch.int32)
    pick = torch.randint(0, len(patterns), (n,), generator=g)
    raw = patterns[pick]
    normals = bits(torch.randn(n, generator=g).to(torch.bfloat16)).to(torch.int32) & 0xFFFF
    use_normal = torch.rand(n, generator=g) < 0.25
    raw = torch.where(use_normal, normals, raw)
    return from_bf16_bits(raw).reshape(tp, tokens, hidden).to(device)
