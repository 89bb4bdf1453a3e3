"""Torch reference for the MoE finalize payload (the finalize-publish kernel).

One rank's payload for token ``t`` is the BF16 value it publishes into the
Lamport mailbox: its routed experts' GEMM2 rows, weighted and summed over the
top-k routes, plus its TP-partial shared-expert output. The arithmetic follows
the device kernel step by step (all FP32, nearest-even):

1. ``w[t, k] = f32(expert_weights[t, k])`` (BF16 weights widen exactly);
   if ``routed_scaling_factor != 1.0``: ``w = f32(w * routed_scaling_factor)``
   (the scale is applied to each weight, one FP32 multiply, not to the sum);
   ``w = 0.0`` where ``expanded_idx_to_permuted_idx[t, k] == -1``.
2. ``acc = +0.0``; for ``k = 0 .. top_k-1`` in that order, for routes held
   here (index != -1): ``acc = acc + f32(gemm2_permuted[row]) * w``. The
   compiler contracts this into ``fma.rn.f32(x, w, acc)``, the first one with
   the constant +0.0 addend (seen in the PTX of the seed's expression compiled
   by CuTe DSL 4.8.1 for sm_90a); ``fma=True`` emulates that exactly,
   ``fma=False`` rounds the product and the sum separately.
   Routes with index -1 leave ``acc`` unchanged (at most the sign of a zero
   differs between the kernel's code paths; step 5 erases it).
3. ``acc = acc + f32(shared_output)`` (a plain FP32 add), if given.
4. One rounding to BF16 (nearest-even).
5. Sanitize: -0.0 becomes +0.0 (the Lamport sentinel must never be published).

Everything runs on the inputs' device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernels.reference.allreduce import all_reduce_norm, rank_order
from kernels.reference.numerics import fma_f32, round_bf16, sanitize_negative_zero
from kernels.validation import require_tensor

__all__ = [
    "MoEPartial",
    "all_reduce_norm_finalize",
    "finalize_payloads",
    "moe_finalize",
    "validate_finalize_inputs",
    "validate_partials",
]

#: Hidden sizes must be whole 16-byte fragments of 8 BF16.
_FRAGMENT = 8


@dataclass(frozen=True)
class MoEPartial:
    """One rank's unfinalized MoE output (the seed's ``MoEOutput``).

    Attributes:
        gemm2_permuted: [rows, hidden] BF16 unweighted GEMM2 output in the
            MoE's permuted order (this rank's experts only).
        expert_weights: [M, top_k] FP32 or BF16 routing weights.
        expanded_idx_to_permuted_idx: [M, top_k] int32 row of each route in
            ``gemm2_permuted``; -1 for an expert this rank does not hold.
        shared_output: [M, hidden] BF16 TP-partial shared-expert output, or
            None for no shared expert.
    """

    gemm2_permuted: torch.Tensor
    expert_weights: torch.Tensor
    expanded_idx_to_permuted_idx: torch.Tensor
    shared_output: torch.Tensor | None = None


def validate_finalize_inputs(
    gemm2_permuted: torch.Tensor,
    expert_weights: torch.Tensor,
    expanded_idx_to_permuted_idx: torch.Tensor,
    shared_output: torch.Tensor | None,
    *,
    top_k: int | None = None,
) -> tuple[int, int, int]:
    """Check the finalize inputs; return ``(M, hidden, top_k)``.

    Raises ValueError naming the offending argument (shape, dtype, device,
    hidden not a multiple of 8, top_k mismatch, route index out of range).
    """
    require_tensor("gemm2_permuted", gemm2_permuted, dtype=torch.bfloat16, contiguous=False)
    if gemm2_permuted.dim() != 2:
        raise ValueError(
            f"gemm2_permuted must be [rows, hidden], got shape {list(gemm2_permuted.shape)}"
        )
    rows, hidden = gemm2_permuted.shape
    if hidden <= 0 or hidden % _FRAGMENT:
        raise ValueError(f"gemm2_permuted hidden must be a positive multiple of 8, got {hidden}")
    device = gemm2_permuted.device
    require_tensor("expert_weights", expert_weights, dtype=(torch.float32, torch.bfloat16),
                   contiguous=False, device=device)
    if expert_weights.dim() != 2 or expert_weights.shape[0] < 1:
        raise ValueError(f"expert_weights must be [M, top_k], got shape {list(expert_weights.shape)}")
    m, k = expert_weights.shape
    if top_k is not None and k != top_k:
        raise ValueError(f"expert_weights has top_k={k}, expected top_k={top_k}")
    if k < 1:
        raise ValueError(f"expert_weights must have top_k >= 1, got {k}")
    require_tensor(
        "expanded_idx_to_permuted_idx", expanded_idx_to_permuted_idx,
        dtype=torch.int32, shape=(m, k), contiguous=False, device=device,
    )
    idx = expanded_idx_to_permuted_idx
    bad = (idx < -1) | (idx >= rows)
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"expanded_idx_to_permuted_idx holds {int(idx[first])} at {first}, "
            f"outside [-1, {rows}) for gemm2_permuted with {rows} rows"
        )
    if shared_output is not None:
        require_tensor(
            "shared_output", shared_output, dtype=torch.bfloat16, shape=(m, hidden),
            contiguous=False, device=device,
        )
    return m, hidden, k


def moe_finalize(
    gemm2_permuted: torch.Tensor,
    expert_weights: torch.Tensor,
    expanded_idx_to_permuted_idx: torch.Tensor,
    shared_output: torch.Tensor | None = None,
    *,
    routed_scaling_factor: float = 1.0,
    fma: bool = True,
    top_k: int | None = None,
) -> torch.Tensor:
    """One rank's MoE finalize payload, [M, hidden] BF16 (see module docstring
    for the exact arithmetic).

    Args:
        gemm2_permuted: [rows, hidden] BF16; hidden a multiple of 8.
        expert_weights: [M, top_k] FP32 or BF16 routing weights.
        expanded_idx_to_permuted_idx: [M, top_k] int32 rows, -1 = not here.
        shared_output: [M, hidden] BF16 or None.
        routed_scaling_factor: multiplies each weight (FP32) before use.
        fma: True emulates the kernel's contracted ``fma.rn.f32``; False
            multiplies and adds with separate roundings.
        top_k: if given, ``expert_weights.shape[1]`` must equal it.

    Returns:
        The payload as published: BF16, nearest-even, -0.0 sanitized to +0.0.
    """
    m, hidden, k_routes = validate_finalize_inputs(
        gemm2_permuted, expert_weights, expanded_idx_to_permuted_idx, shared_output,
        top_k=top_k,
    )
    idx = expanded_idx_to_permuted_idx.to(torch.int64)
    held = idx != -1
    weights = expert_weights.to(torch.float32)
    if routed_scaling_factor != 1.0:
        weights = weights * torch.tensor(routed_scaling_factor, dtype=torch.float32)
    weights = torch.where(held, weights, torch.zeros_like(weights))

    acc = torch.zeros(m, hidden, dtype=torch.float32, device=gemm2_permuted.device)
    for k in range(k_routes):
        here = held[:, k : k + 1]
        if not bool(here.any()):  # no token's route k is here (always so without experts)
            continue
        x, w = gemm2_permuted[idx[:, k].clamp(min=0)], weights[:, k : k + 1]  # BF16 [M, hidden]
        step = fma_f32(x, w, acc) if fma else x.to(torch.float32) * w + acc
        acc = torch.where(here, step, acc)
    if shared_output is not None:
        acc = acc + shared_output.to(torch.float32)
    return sanitize_negative_zero(round_bf16(acc))


def validate_partials(
    partials: Sequence[MoEPartial],
    *,
    top_k: int | None = None,
    weight_dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16),
) -> tuple[int, int, int]:
    """Check every rank's MoEPartial (see :func:`validate_finalize_inputs`) and
    that all ranks agree on M, hidden and top_k; return ``(M, hidden, top_k)``.
    Errors name ``partials[r]`` and the argument inside it."""
    if isinstance(partials, MoEPartial) or len(partials) < 1:
        raise ValueError("partials must be a sequence of one MoEPartial per rank")
    dims = None
    for rank, p in enumerate(partials):
        if not isinstance(p, MoEPartial):
            raise ValueError(f"partials[{rank}] must be a MoEPartial, got {type(p).__name__}")
        if isinstance(p.expert_weights, torch.Tensor) and p.expert_weights.dtype not in weight_dtypes:
            want = " or ".join(str(d) for d in weight_dtypes)
            raise ValueError(
                f"partials[{rank}].expert_weights must be {want}, got {p.expert_weights.dtype}"
            )
        try:
            got = validate_finalize_inputs(
                p.gemm2_permuted, p.expert_weights, p.expanded_idx_to_permuted_idx,
                p.shared_output, top_k=top_k,
            )
        except ValueError as err:
            raise ValueError(f"partials[{rank}].{err}") from None
        if dims is not None and got != dims:
            raise ValueError(
                f"partials[{rank}] has (M, hidden, top_k) = {got}, partials[0] has {dims}"
            )
        dims = got
    return dims


def finalize_payloads(
    partials: Sequence[MoEPartial],
    *,
    routed_scaling_factor: float = 1.0,
    fma: bool = True,
    top_k: int | None = None,
) -> torch.Tensor:
    """``[tp, M, hidden]`` BF16: :func:`moe_finalize` of every rank's partial,
    in rank order, after validating them all (:func:`validate_partials`)."""
    validate_partials(partials, top_k=top_k)
    return torch.stack([
        moe_finalize(
            p.gemm2_permuted, p.expert_weights, p.expanded_idx_to_permuted_idx,
            p.shared_output, routed_scaling_factor=routed_scaling_factor, fma=fma,
        )
        for p in partials
    ])


def all_reduce_norm_finalize(
    partials: Sequence[MoEPartial],
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    *,
    routed_scaling_factor: float = 1.0,
    order: Sequence[int] | None = None,
    fma: bool = True,
    top_k: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``AllReduceNorm.__call__`` fed a MoE output: every rank's finalize
    payload (:func:`moe_finalize`) all-reduced, added to ``residual`` and
    RMS-normalized by :func:`kernels.reference.allreduce.all_reduce_norm`.

    Args:
        partials: one MoEPartial per rank, rank order.
        residual: [M, hidden] BF16.
        norm_weight: [hidden] BF16.
        eps: RMSNorm epsilon.
        order: rank reduction order (None = 0..tp-1).
        routed_scaling_factor, fma, top_k: as in :func:`moe_finalize`.

    Returns:
        ``(norm_out, residual_out)``, both [M, hidden] BF16, as
        ``all_reduce_norm`` returns them.
    """
    m, hidden, _ = validate_partials(partials, top_k=top_k)
    rank_order(len(partials), order)
    require_tensor("residual", residual, dtype=torch.bfloat16, shape=(m, hidden), contiguous=False)
    require_tensor("norm_weight", norm_weight, dtype=torch.bfloat16, shape=(hidden,), contiguous=False)
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    payloads = finalize_payloads(partials, routed_scaling_factor=routed_scaling_factor, fma=fma)
    return all_reduce_norm(payloads, residual, norm_weight, eps, order=order)
