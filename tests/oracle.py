"""A scalar oracle for the references' arithmetic: exact rational values
(``fractions.Fraction``) rounded to FP32 / BF16 nearest-even at exactly the
points the kernels round. Independent of ``numerics.fma_f32`` and of torch's
vectorized arithmetic; slow, so only for small shapes. Signs of zero are not
modelled (compare values, not bits)."""

from __future__ import annotations

from fractions import Fraction

import torch

_EMIN = -126  # FP32 and BF16 share the exponent range


def round_to(q: Fraction, significand_bits: int) -> Fraction:
    """``q`` rounded nearest-even to a binary format with ``significand_bits``
    (24 for FP32, 8 for BF16) and the FP32 exponent range, subnormals kept."""
    if q == 0:
        return Fraction(0)
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    ulp = Fraction(2) ** (max(e, _EMIN) - significand_bits + 1)
    n, rem = divmod(a, ulp)
    if rem > ulp / 2 or (rem == ulp / 2 and n % 2):
        n += 1
    assert n * ulp < Fraction(2) ** 128, "overflow is not modelled"
    return (n * ulp) if q > 0 else -(n * ulp)


def f32(q: Fraction) -> Fraction:
    return round_to(q, 24)


def bf16(q: Fraction) -> Fraction:
    return round_to(q, 8)


def exact(t: torch.Tensor) -> list:
    """Nested lists of Fractions with the tensor's exact values."""
    return _map(t.double().tolist())


def _map(v):
    return [_map(x) for x in v] if isinstance(v, list) else Fraction(v)


def madd(x: Fraction, w: Fraction, acc: Fraction, fma: bool) -> Fraction:
    """``acc + x * w`` in FP32: one rounding (FMA) or two."""
    return f32(x * w + acc) if fma else f32(f32(x * w) + acc)


def to_tensor(values: list, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(_unmap(values), dtype=torch.float64).to(dtype)


def _unmap(v):
    return [_unmap(x) for x in v] if isinstance(v, list) else float(v)
