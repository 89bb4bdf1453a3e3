"""Reference for ``AllReduceNorm.__call__``: TP all-reduce + residual add + RMSNorm.

Contract (docs/design.md, Numerical contract):
- ``all_reduce_sum``: FP32 accumulation starting from +0.0, over the ranks in
  ``order`` (default 0..tp-1), rounded once to BF16. This is *not* what NCCL
  returns: NCCL's ring rounds to BF16 after every hop, in ring order.
- ``add_residual``: ``BF16(FP32(BF16 sum) + FP32(residual))``, bit-exact.
- ``rms_norm``: FP32 ``x * rsqrt(mean(x^2) + eps) * weight``, rounded to BF16.
  Kernels reduce the squares in their own order and use a fast rsqrt, so
  their norm output is held to 1 BF16 ULP of this, not bit-exactness.

Owner mode (``AllReduceNorm(mode="owner")``, a reduce-scatter + RMSNorm):
owner ``o`` of a tp group computes only the tokens ``t`` with ``t % tp ==
o``; its row ``j`` is token ``j * tp + o``. Every step above is row-wise, so
:func:`owner_all_reduce_norm` is exactly the one-shot reference's rows for
the owned tokens (tested on CPU), padded to ``ceil(M / tp)`` rows with +0.0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernels.lamport.protocol import owned_tokens, owner_rows
from kernels.validation import (require_int, require_multiple, require_number, require_range,
                                require_tensor)


def stack_partials(partials: Sequence[torch.Tensor] | torch.Tensor, name: str = "partials") -> torch.Tensor:
    """``[tp, M, H]`` BF16 from a list of per-rank ``[M, H]`` tensors (or an
    already stacked tensor); validates dtype, shape and hidden % 8."""
    if isinstance(partials, torch.Tensor):
        stacked = partials
    else:
        if not partials:
            raise ValueError(f"{name} must hold at least one rank's tensor")
        for r, p in enumerate(partials):
            require_tensor(f"{name}[{r}]", p, dtype=torch.bfloat16, shape=(None, None), contiguous=False)
            if p.shape != partials[0].shape:
                raise ValueError(f"{name}[{r}] has shape {list(p.shape)}, rank 0 has {list(partials[0].shape)}")
        stacked = torch.stack(list(partials))
    require_tensor(name, stacked, dtype=torch.bfloat16, shape=(None, None, None), contiguous=False)
    require_multiple(f"{name} hidden size", stacked.shape[-1], 8)
    if stacked.shape[1] < 1:
        raise ValueError(f"{name} must hold at least one token, got shape {list(stacked.shape)}")
    return stacked


def rank_order(tp: int, order: Sequence[int] | None) -> list[int]:
    """The reduction order: ``order`` validated as a permutation of 0..tp-1."""
    if order is None:
        return list(range(tp))
    if isinstance(order, (str, bytes)) or not isinstance(order, Sequence):
        raise TypeError(f"order must be a sequence of rank ids, got {type(order).__name__}")
    order = [require_int(f"order[{i}]", r) for i, r in enumerate(order)]
    if sorted(order) != list(range(tp)):
        raise ValueError(f"order must be a permutation of 0..{tp - 1}, got {order}")
    return order


def all_reduce_sum(partials: Sequence[torch.Tensor] | torch.Tensor,
                   order: Sequence[int] | None = None) -> torch.Tensor:
    """BF16 ``[M, H]``: FP32 sum of the BF16 partials from +0.0 in ``order``,
    rounded once to BF16."""
    stacked = stack_partials(partials)
    acc = torch.zeros(stacked.shape[1:], dtype=torch.float32, device=stacked.device)
    for r in rank_order(stacked.shape[0], order):
        acc = acc + stacked[r].float()
    return acc.to(torch.bfloat16)


def add_residual(reduced: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``BF16(FP32(reduced) + FP32(residual))``."""
    require_tensor("residual", residual, dtype=torch.bfloat16, shape=tuple(reduced.shape), contiguous=False)
    return (reduced.float() + residual.float()).to(torch.bfloat16)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """FP32 RMSNorm of BF16 ``x [..., H]`` with BF16 ``weight [H]``, to BF16:
    ``x * rsqrt(mean(x^2) + eps) * weight`` evaluated left to right."""
    hidden = x.shape[-1]
    require_tensor("norm_weight", weight, dtype=torch.bfloat16, shape=(hidden,), contiguous=False)
    eps = require_number("eps", eps, positive=True)
    values = x.float()
    inv_rms = torch.rsqrt(values.square().mean(dim=-1, keepdim=True) + eps)
    return (values * inv_rms * weight.float()).to(torch.bfloat16)


def all_reduce_norm(partials: Sequence[torch.Tensor] | torch.Tensor, residual: torch.Tensor,
                    norm_weight: torch.Tensor, eps: float,
                    order: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(norm_out, residual_out)`` as ``AllReduceNorm.__call__`` returns them:
    ``residual_out = BF16(all_reduce_sum + residual)`` and
    ``norm_out = rms_norm(residual_out)``; all ``[M, H]`` BF16."""
    reduced = all_reduce_sum(partials, order)
    residual_out = add_residual(reduced, residual)
    return rms_norm(residual_out, norm_weight, eps), residual_out


def owner_view(x: torch.Tensor, tp: int, owner: int) -> torch.Tensor:
    """Owner ``owner``'s rows of a token-indexed ``[M, ...]`` tensor:
    ``[ceil(M / tp), ...]``, row ``j`` = ``x[j * tp + owner]``, rows past the
    owner's last token +0.0 (:func:`kernels.lamport.protocol.owned_tokens`)."""
    require_range("owner", owner, 0, tp - 1)
    m = x.shape[0]
    out = torch.zeros((owner_rows(m, tp), *x.shape[1:]), dtype=x.dtype, device=x.device)
    tokens = owned_tokens(m, tp, owner)
    out[:len(tokens)] = x[owner::tp]
    return out


def owner_all_reduce_norm(partials: Sequence[torch.Tensor] | torch.Tensor,
                          residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, *,
                          owner: int, order: Sequence[int] | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(norm_out, residual_out)`` of owner ``owner`` in owner mode, both
    ``[ceil(M / tp), H]`` BF16: :func:`all_reduce_norm` of the owned tokens
    (``partials[r][owner::tp]`` and this owner's ``residual``, ``[ceil(M / tp),
    H]``, row j = token j * tp + owner), rows holding no token +0.0."""
    stacked = stack_partials(partials)
    tp, m, hidden = stacked.shape
    require_range("owner", owner, 0, tp - 1)
    rows = owner_rows(m, tp)
    require_tensor("residual", residual, dtype=torch.bfloat16, shape=(rows, hidden),
                   contiguous=False)
    count = len(owned_tokens(m, tp, owner))
    norm = torch.zeros(rows, hidden, dtype=torch.bfloat16, device=stacked.device)
    res = torch.zeros_like(norm)
    if count:
        norm[:count], res[:count] = all_reduce_norm(stacked[:, owner::tp], residual[:count],
                                                    norm_weight, eps, order)
    return norm, res
