"""Argument checks shared by the references and the kernel host classes.

Every check raises ``ValueError`` naming the argument and the offending value
*before* anything is computed or launched: bad input never reaches a kernel,
where it would hang or produce a silent wrong answer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _describe(t: torch.Tensor) -> str:
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
    if value <= 0 or value % factor:
        raise ValueError(f"{name} must be a positive multiple of {factor}, got {value}")
    return value


def require_range(name: str, value: int, low: int, high: int) -> int:
    """``low <= value <= high`` (inclusive)."""
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def require_choice(name: str, value: object, choices: Sequence[object]) -> object:
    """``value`` is one of ``choices``; unknown options are rejected by name."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value
