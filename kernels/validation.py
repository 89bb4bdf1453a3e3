"""Argument checks shared by the references, the kernel host classes and the
layers above (cluster backends, suite configs).

Every check raises ``ValueError`` (a bad value) or ``TypeError`` (a value of
the wrong type) naming the argument and the offending value *before*
anything is computed, allocated or launched: bad input never reaches a
kernel, where it would hang or produce a silent wrong answer. Integers are
``int`` (or a numpy integer), never ``bool`` and never an integral ``float``
(no silent truncation); numbers are finite.

This module is also the one home of what the Lamport kernels accept as a
group shape (``TP_SIZES``, :func:`require_lamport_hidden`,
:func:`norm_threads`), so a suite config is refused for exactly what a
kernel would refuse. It imports no GPU code (torch only when a tensor is
checked).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kernels.lamport.protocol import MAX_THREADS, VEC_BF16, WARP_SIZE

if TYPE_CHECKING:
    import torch

TP_SIZES = (1, 2, 4, 8)
"""Group sizes the Lamport kernels are built for (and so every backend runs)."""

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""An ASCII word: suite names, group ids and run ids name directories and
shared-memory segments."""


def shown(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def require_int(name: str, value: object, *, low: int | None = None,
                high: int | None = None) -> int:
    """``value`` is an integer (not a bool, not a float) in ``[low, high]``;
    returns it as ``int``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {shown(value)}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = (f"in [{low}, {high}]" if low is not None and high is not None
                  else f">= {low}" if low is not None else f"<= {high}")
        raise ValueError(f"{name} must be {bounds}, got {value}")
    return value


def require_number(name: str, value: object, *, positive: bool = False,
                   nonnegative: bool = False) -> float:
    """``value`` is a finite real number (not a bool), ``> 0`` with
    ``positive``, ``>= 0`` with ``nonnegative``; returns it as ``float``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {shown(value)}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if positive and not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    if nonnegative and not value >= 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def require_name(name: str, value: object) -> str:
    """``value`` is an ASCII word (``NAME_PATTERN``): it names files and
    shared-memory segments."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__} {shown(value)}")
    if not NAME_PATTERN.fullmatch(value):
        raise ValueError(f"{name} must be an ASCII word of 1..64 characters (letters, digits, "
                         f"'_', '.', '-'; not starting with '_', '.' or '-'), got {shown(value)}")
    return value


def require_tp(name: str, tp: object) -> int:
    """``tp`` is a group size the kernels are built for (``TP_SIZES``)."""
    tp = require_int(name, tp)
    if tp not in TP_SIZES:
        raise ValueError(f"{name} must be one of {', '.join(map(str, TP_SIZES))}, got {tp}")
    return tp


def require_lamport_hidden(name: str, hidden: object) -> int:
    """``hidden`` is a positive multiple of ``VEC_BF16`` (one 16-byte fragment
    a thread) and ``hidden / VEC_BF16`` a whole number of warps: the shape
    every Lamport consumer of this project takes."""
    hidden = require_int(name, hidden)
    if hidden <= 0 or hidden % VEC_BF16:
        raise ValueError(f"{name} must be a positive multiple of {VEC_BF16}, got {hidden}")
    if (hidden // VEC_BF16) % WARP_SIZE:
        raise ValueError(f"{name}/{VEC_BF16} must be a whole number of warps ({WARP_SIZE} "
                         f"threads), i.e. {name} a multiple of {VEC_BF16 * WARP_SIZE}, "
                         f"got {name}={hidden} ({hidden // VEC_BF16} threads)")
    return hidden


def norm_threads(hidden: object, name: str = "hidden_size") -> int:
    """Threads a CTA of the RMSNorm consumer for ``hidden`` (one fragment a
    thread, at most ``MAX_THREADS``); ValueError/TypeError when unsupported."""
    hidden = require_lamport_hidden(name, hidden)
    threads = hidden // VEC_BF16
    if threads > MAX_THREADS:
        raise ValueError(
            f"{name}/{VEC_BF16} must be a whole number of warps <= {MAX_THREADS} "
            f"threads, got {name}={hidden} ({threads} threads)")
    return threads


def _describe(t: "torch.Tensor") -> str:
    return f"{t.dtype}{list(t.shape)} on {t.device}"


def require_tensor(
    name: str,
    t: object,
    *,
    dtype: torch.dtype | Sequence[torch.dtype] | None = None,
    shape: Sequence[int | None] | None = None,
    contiguous: bool = True,
    align: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Check one tensor argument and return it.

    Args:
        name: the argument's name, as the caller spells it (used in errors).
        dtype: the dtype, or a sequence of accepted dtypes.
        shape: expected shape; ``None`` entries match any extent.
        contiguous: require a contiguous tensor.
        align: required byte alignment of ``data_ptr()`` (e.g. 16 for
            16-byte vector loads), or ``None``.
        device: required device (compared by type and index).
    """
    import torch
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtype is not None:
        accepted = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)
        if t.dtype not in accepted:
            want = " or ".join(str(d) for d in accepted)
            raise ValueError(f"{name} must be {want}, got {_describe(t)}")
    if shape is not None:
        if t.dim() != len(shape) or any(
            want is not None and got != want for got, want in zip(t.shape, shape)
        ):
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise ValueError(f"{name} must have shape {want}, got {_describe(t)}")
    if contiguous and not t.is_contiguous():
        raise ValueError(
            f"{name} must be contiguous, got strides {tuple(t.stride())} for {_describe(t)}"
        )
    if align is not None and t.numel() and t.data_ptr() % align:
        raise ValueError(
            f"{name} must be {align}-byte aligned, got address {t.data_ptr():#x} "
            f"(offset {t.data_ptr() % align})"
        )
    if device is not None and t.device != torch.device(device):
        raise ValueError(f"{name} must be on {torch.device(device)}, got {_describe(t)}")
    return t


def require_same_device(**tensors: torch.Tensor) -> torch.device:
    """All named tensors share one device; return it."""
    devices = {n: t.device for n, t in tensors.items()}
    first = next(iter(devices.values()))
    odd = {n: str(d) for n, d in devices.items() if d != first}
    if odd:
        raise ValueError(f"tensors must share one device ({first}); got {odd}")
    return first


def require_multiple(name: str, value: int, factor: int) -> int:
    """``value`` is a positive multiple of ``factor``."""
    value = require_int(name, value)
    if value <= 0 or value % factor:
        raise ValueError(f"{name} must be a positive multiple of {factor}, got {value}")
    return value


def require_range(name: str, value: int, low: int, high: int) -> int:
    """``low <= value <= high`` (inclusive)."""
    value = require_int(name, value)
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def require_choice(name: str, value: object, choices: Sequence[object]) -> object:
    """``value`` is one of ``choices``; unknown options are rejected by name."""
    try:
        known = value in choices and not (isinstance(value, bool)
                                          and not any(isinstance(c, bool) for c in choices))
    except TypeError:  # unhashable against a set of choices
        known = False
    if not known:
        raise ValueError(f"{name} must be one of {list(choices)}, got {shown(value)}")
    return value
