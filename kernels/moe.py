"""``MoEOutput``: a MoE layer's output whose routed top-k reduction is still
open (the seed's ``MoEOutput``), as ``AllReduceNorm.__call__`` takes it.

``AllReduceNorm`` finalizes it inside its publish kernel
(:mod:`kernels.lamport.finalize_publish`): the weighted sum of the routed
rows plus the shared-expert output never round-trips through global memory.
The torch reference is :func:`kernels.reference.moe.moe_finalize`
(:meth:`MoEOutput.to_partial` converts).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["MoEOutput", "RoutedExperts"]


@dataclass(frozen=True)
class RoutedExperts:
    """The routed experts' unreduced output on this rank.

    Attributes:
        gemm2_permuted: [rows, hidden] BF16 GEMM2 output rows in the MoE's
            permuted order (this rank's experts only; rows may be 0).
        expert_weights: [M, top_k] FP32 or BF16 routing weights.
        expanded_idx_to_permuted_idx: [M, top_k] int32 row of each route in
            ``gemm2_permuted``; -1 for a route this rank does not hold.
    """

    gemm2_permuted: torch.Tensor
    expert_weights: torch.Tensor
    expanded_idx_to_permuted_idx: torch.Tensor


@dataclass(frozen=True)
class MoEOutput:
    """``routed`` (top-k reduction open) plus the TP-partial shared-expert
    output ``shared_output`` ([M, hidden] BF16, or None)."""

    routed: RoutedExperts
    shared_output: torch.Tensor | None = None

    @property
    def tokens(self) -> int:
        return int(self.routed.expert_weights.shape[0])

    @property
    def top_k(self) -> int:
        return int(self.routed.expert_weights.shape[-1])

    def tensors(self) -> list[torch.Tensor]:
        r = self.routed
        out = [r.gemm2_permuted, r.expert_weights, r.expanded_idx_to_permuted_idx]
        return out + ([self.shared_output] if self.shared_output is not None else [])

    def to_partial(self):
        """The reference's :class:`~kernels.reference.moe.MoEPartial`."""
        from kernels.reference.moe import MoEPartial

        r = self.routed
        return MoEPartial(r.gemm2_permuted, r.expert_weights, r.expanded_idx_to_permuted_idx,
                          self.shared_output)

    @classmethod
    def from_partial(cls, partial) -> "MoEOutput":
        return cls(RoutedExperts(partial.gemm2_permuted, partial.expert_weights,
                                 partial.expanded_idx_to_permuted_idx),
                   partial.shared_output)
