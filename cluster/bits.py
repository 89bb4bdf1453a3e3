"""Bit patterns of tensors as numpy arrays and back: how outputs cross
process boundaries (Ray) and are compared bit for bit.

A leaf module (numpy, torch imported when called, ``kernels.reference``):
the op modules (:mod:`cluster.ops`) and the case layer
(:mod:`cluster.cases`, which imports the op registry) both use it, so
neither imports the other for it. :func:`f32_from_bf16_bits` and
:func:`bf16_bits_from_f32` are numpy alone: the emulated ranks
(:mod:`cluster.emulated`) sum with them and import no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


BF16_NAN_BITS = 0x7FC0
"""The canonical BF16 NaN (what the kernels write where they give up)."""


def f32_from_bf16_bits(a: np.ndarray) -> np.ndarray:
    """FP32 values of uint16 BF16 bit patterns (exact: BF16 is FP32's top half)."""
    return (np.asarray(a, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def bf16_bits_from_f32(x: np.ndarray) -> np.ndarray:
    """uint16 BF16 bit patterns of FP32 values rounded to nearest even, as
    ``torch.Tensor.to(torch.bfloat16)`` and ``cvt.rn.bf16.f32`` round
    (overflow to +-inf, subnormals kept); every NaN becomes
    :data:`BF16_NAN_BITS` (torch's CPU cast writes other NaN patterns)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)  # no wrap-around past 0xFFFF7FFF
    out = ((u + ((u >> 16) & 1) + 0x7FFF) >> 16).astype(np.uint16)
    out[np.isnan(x)] = BF16_NAN_BITS
    return out


def bf16_from_bits(a: np.ndarray) -> torch.Tensor:
    """BF16 tensor (a copy) from a uint16 array of bit patterns."""
    import torch
    return torch.from_numpy(np.ascontiguousarray(a).view(np.int16).copy()).view(torch.bfloat16)


def bits_from_bf16(t: torch.Tensor) -> np.ndarray:
    """uint16 array of the bit patterns of a BF16 tensor."""
    import torch
    return t.contiguous().view(torch.int16).numpy().view(np.uint16).copy()


def tensor_bits(t: torch.Tensor) -> np.ndarray:
    """The raw bits of any tensor as an unsigned numpy array of its width
    (BF16 -> uint16, FP32 -> uint32, FP8 -> uint8)."""
    from kernels.reference import numerics
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32}[t.element_size()]
    return numerics.bits(t.detach().contiguous().cpu()).numpy().view(width).copy()


def from_bits(a: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """A tensor of ``like``'s dtype from the unsigned bit patterns
    :func:`tensor_bits` made."""
    import torch
    signed = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[like.element_size()]
    raw = torch.from_numpy(np.ascontiguousarray(a).copy()).view(signed)
    return raw.view(like.dtype)
