"""Bit patterns of tensors as numpy arrays and back: how outputs cross
process boundaries (Ray) and are compared bit for bit.

A leaf module (numpy, torch imported when called, ``kernels.reference``):
the op modules (:mod:`cluster.ops`) and the case layer
(:mod:`cluster.cases`, which imports the op registry) both use it, so
neither imports the other for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


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
