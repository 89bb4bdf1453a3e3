"""Torch reference for ``AllReduceMHC``: all-reduce fused with the mHC post-mix
of ``hc`` residual streams, their pre-mix collapse and RMSNorm.

The consumer kernel's arithmetic, per token and hidden element (all FP32,
nearest-even; ``fma(a, b, c)`` is ``fma.rn.f32``):

1. ``reduced = BF16(sum of the tp BF16 contributions)``: FP32 from +0.0 in rank
   order 0..tp-1 (``rank_lanes=1``, the seed's setting), or with
   ``rank_lanes = R > 1`` the seed kernel's lane split: lane ``l`` sums ranks
   ``l, l+R, l+2R, ...`` from +0.0, then butterfly shuffles at offsets 1, 2, 4
   (< R) add lane pairs, so for R=4 the result is ``(s0 + s1) + (s2 + s3)``.
2. For each target stream ``t`` in 0..hc-1, sources ``s`` in 0..hc-1 in order,
   ``comb`` indexed [source, target]:
   ``mixed = fma(f32(reduced), post[t], f32(f32(residual[0]) * comb[0, t]))``,
   then for ``s >= 1``: ``mixed = fma(f32(residual[s]), comb[s, t], mixed)``;
   ``residual_out[t] = BF16(mixed)``.
   (The seed writes ``mixed = reduced * post[t]`` and then
   ``mixed = mixed + residual[s] * comb[s, t]``; for the first sum of two
   products LLVM's NVPTX backend folds the *left* product, ``reduced *
   post[t]``, into the FMA and rounds ``residual[0] * comb[0, t]`` alone; seen
   in the PTX of the seed's expression compiled by CuTe DSL 4.8.1 for sm_90a,
   ``mul.f32`` then ``fma.rn.f32``. ``post_fma=False`` models the other
   contraction: ``mixed = f32(reduced * post[t])`` then an FMA for every
   source.)
3. ``collapse = +0.0``; for ``t`` in 0..hc-1:
   ``collapse = fma(f32(residual_out[t]), pre[t], collapse)``;
   ``prenorm = BF16(collapse)``.
4. ``layer_input = BF16(f32(prenorm) * rsqrt(mean(prenorm^2) + eps) * weight)``
   (:func:`kernels.reference.allreduce.rms_norm`; the kernel's own square-sum
   order and fast rsqrt hold it to 1 BF16 ULP, not bit-exactness).

``fma=False`` replaces every ``fma`` by a rounded multiply then a rounded add
(``post_fma`` is then moot): the mutation the contract tests must catch, or
the model of a build with contraction off (``--fmad=false``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernels.reference.allreduce import all_reduce_sum, rank_order, rms_norm, stack_partials
from kernels.reference.moe import MoEPartial, finalize_payloads, validate_partials
from kernels.reference.numerics import fma_f32, round_bf16
from kernels.validation import require_choice, require_tensor

__all__ = [
    "all_reduce_mhc",
    "butterfly_rank_sum",
    "finalize",
    "mhc_post_collapse",
    "reduce_ranks",
]

RANK_LANES = (1, 2, 4, 8)


def butterfly_rank_sum(partials: Sequence[torch.Tensor] | torch.Tensor, rank_lanes: int) -> torch.Tensor:
    """BF16 ``[M, H]``: the sum the seed's consumer forms with ``rank_lanes``
    lanes per fragment (see module docstring, step 1), rounded once to BF16.
    ``rank_lanes=1`` is the plain rank-order sum."""
    stacked = stack_partials(partials)
    tp = stacked.shape[0]
    require_choice("rank_lanes", rank_lanes, RANK_LANES)
    if tp % rank_lanes:
        raise ValueError(f"rank_lanes={rank_lanes} must divide tp={tp}")
    lanes = []
    for lane in range(rank_lanes):
        acc = torch.zeros(stacked.shape[1:], dtype=torch.float32, device=stacked.device)
        for wave in range(tp // rank_lanes):
            acc = acc + stacked[wave * rank_lanes + lane].float()
        lanes.append(acc)
    offset = 1
    while offset < rank_lanes:
        # IEEE addition is commutative, so each lane pair agrees bit for bit.
        lanes = [lanes[lane] + lanes[lane ^ offset] for lane in range(rank_lanes)]
        offset *= 2
    return lanes[0].to(torch.bfloat16)


def reduce_ranks(
    partials: Sequence[torch.Tensor] | torch.Tensor,
    *,
    order: Sequence[int] | None = None,
    rank_lanes: int = 1,
) -> torch.Tensor:
    """BF16 ``[M, H]`` all-reduced sum: ``all_reduce_sum(partials, order)`` for
    ``rank_lanes=1``, else :func:`butterfly_rank_sum` (``order`` must then be
    None: the lane split fixes the order)."""
    if rank_lanes == 1:
        return all_reduce_sum(partials, order)
    if order is not None:
        raise ValueError(f"order must be None when rank_lanes={rank_lanes} (got {list(order)})")
    return butterfly_rank_sum(partials, rank_lanes)


def validate_mix(
    m: int,
    hidden: int,
    residual: torch.Tensor,
    post: torch.Tensor,
    comb: torch.Tensor,
    pre: torch.Tensor,
    norm_weight: torch.Tensor,
    norm_eps: float,
    *,
    hc: int | None = None,
    device: torch.device | None = None,
) -> int:
    """Check the mHC arguments against ``M`` tokens of ``hidden``; return hc.
    Raises ValueError naming the argument."""
    require_tensor("residual", residual, dtype=torch.bfloat16, shape=(m, None, hidden),
                   contiguous=False, device=device)
    streams = residual.shape[1]
    if hc is not None and streams != hc:
        raise ValueError(f"residual has hc={streams} streams, expected hc={hc}")
    if streams < 1:
        raise ValueError(f"residual must hold hc >= 1 streams, got shape {list(residual.shape)}")
    hc = streams
    require_tensor("post", post, dtype=torch.float32, contiguous=False, device=device)
    if tuple(post.shape) not in ((m, hc), (m, hc, 1)):
        raise ValueError(f"post must have shape [{m}, {hc}] or [{m}, {hc}, 1], got {list(post.shape)}")
    require_tensor("comb", comb, dtype=torch.float32, shape=(m, hc, hc), contiguous=False, device=device)
    require_tensor("pre", pre, dtype=torch.float32, shape=(m, hc), contiguous=False, device=device)
    require_tensor("norm_weight", norm_weight, dtype=torch.bfloat16, shape=(hidden,),
                   contiguous=False, device=device)
    if not norm_eps > 0:
        raise ValueError(f"norm_eps must be > 0, got {norm_eps}")
    return hc


def mhc_post_collapse(
    reduced: torch.Tensor,
    residual: torch.Tensor,
    post: torch.Tensor,
    comb: torch.Tensor,
    pre: torch.Tensor,
    *,
    fma: bool = True,
    post_fma: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 2-3 of the module docstring.

    Args:
        reduced: [M, H] BF16 all-reduced sublayer output.
        residual: [M, hc, H] BF16 residual streams.
        post: [M, hc] or [M, hc, 1] FP32; comb: [M, hc, hc] FP32 [source,
            target]; pre: [M, hc] FP32.
        fma: emulate the contracted FMAs exactly (else multiply, then add).
        post_fma: which product of the first sum is folded (module doc).

    Returns:
        ``(residual_out [M, hc, H] BF16, prenorm [M, H] BF16)``.
    """
    m, hidden = reduced.shape
    hc = residual.shape[1]
    post = post.reshape(m, hc)
    r = reduced.float()
    streams = residual.float()

    def madd(x, c, acc):  # acc + x * c
        return fma_f32(x, c, acc) if fma else x * c + acc

    collapse = torch.zeros(m, hidden, dtype=torch.float32, device=reduced.device)
    outputs = []
    for target in range(hc):
        p = post[:, target : target + 1]
        if fma and post_fma:
            first = streams[:, 0] * comb[:, 0, target : target + 1]
            mixed = fma_f32(r, p, first)
        else:
            mixed = madd(streams[:, 0], comb[:, 0, target : target + 1], r * p)
        for source in range(1, hc):
            mixed = madd(streams[:, source], comb[:, source, target : target + 1], mixed)
        out = round_bf16(mixed)
        outputs.append(out)
        collapse = madd(out.float(), pre[:, target : target + 1], collapse)
    return torch.stack(outputs, dim=1), round_bf16(collapse)


def all_reduce_mhc(
    partials: Sequence[torch.Tensor] | torch.Tensor,
    residual: torch.Tensor,
    post: torch.Tensor,
    comb: torch.Tensor,
    pre: torch.Tensor,
    norm_weight: torch.Tensor,
    norm_eps: float,
    *,
    order: Sequence[int] | None = None,
    rank_lanes: int = 1,
    fma: bool = True,
    post_fma: bool = True,
    hc: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``AllReduceMHC.__call__`` over the whole TP group.

    Args:
        partials: tp x [M, H] BF16 (or [tp, M, H]): every rank's ``x``; H a
            multiple of 8.
        residual: [M, hc, H] BF16 residual streams.
        post: [M, hc(, 1)] FP32 post-mix.
        comb: [M, hc, hc] FP32 residual mix, indexed [source, target].
        pre: [M, hc] FP32 pre-mix for the collapse.
        norm_weight: [H] BF16 RMSNorm weight.
        norm_eps: RMSNorm epsilon (> 0).
        order: rank reduction order (None = 0..tp-1); only with rank_lanes=1.
        rank_lanes: 1, 2, 4 or 8 (the kernel's lane split, see module doc).
        fma: emulate the kernel's contracted FMAs exactly (else mul + add).
        post_fma: which product of the first post-mix sum is folded into an
            FMA (module doc, step 2); default as CuTe DSL 4.8.1 compiles it.
        hc: if given, ``residual.shape[1]`` must equal it.

    Returns:
        ``(residual_out [M, hc, H] BF16, layer_input [M, H] BF16)``.
    """
    stacked = stack_partials(partials)
    tp, m, hidden = stacked.shape
    validate_mix(m, hidden, residual, post, comb, pre, norm_weight, norm_eps, hc=hc,
                 device=stacked.device)
    _check_reduction(tp, order, rank_lanes)
    reduced = reduce_ranks(stacked, order=order, rank_lanes=rank_lanes)
    residual_out, prenorm = mhc_post_collapse(reduced, residual, post, comb, pre, fma=fma,
                                              post_fma=post_fma)
    return residual_out, rms_norm(prenorm, norm_weight, norm_eps)


def finalize(
    partials: Sequence[MoEPartial],
    residual: torch.Tensor,
    post: torch.Tensor,
    comb: torch.Tensor,
    pre: torch.Tensor,
    norm_weight: torch.Tensor,
    norm_eps: float,
    *,
    routed_scaling_factor: float = 1.0,
    order: Sequence[int] | None = None,
    rank_lanes: int = 1,
    fma: bool = True,
    post_fma: bool = True,
    hc: int | None = None,
    top_k: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``AllReduceMHC.finalize`` over the whole TP group: every rank's MoE
    finalize payload (:func:`kernels.reference.moe.moe_finalize`, FP32
    routing weights as the seed requires; its ``routed_scaling_factor`` is
    1.0 because the router folds the scale into the weights) fed into
    :func:`all_reduce_mhc`. ``partials`` holds one MoEPartial per rank with a
    shared_output [M, H] BF16 each; other arguments as in
    :func:`all_reduce_mhc`. ``fma`` applies to both the finalize and the mix.
    Every validation (MoE partials, mixes, reduction options) runs before any
    arithmetic.
    """
    if isinstance(partials, MoEPartial) or not partials:
        raise ValueError("partials must be a sequence of one MoEPartial per rank")
    for rank, p in enumerate(partials):
        if isinstance(p, MoEPartial) and p.shared_output is None:
            raise ValueError(f"partials[{rank}].shared_output is required by finalize")
    m, hidden, _ = validate_partials(partials, top_k=top_k, weight_dtypes=(torch.float32,))
    device = partials[0].gemm2_permuted.device
    validate_mix(m, hidden, residual, post, comb, pre, norm_weight, norm_eps, hc=hc, device=device)
    _check_reduction(len(partials), order, rank_lanes)
    payloads = finalize_payloads(partials, routed_scaling_factor=routed_scaling_factor, fma=fma)
    return all_reduce_mhc(payloads, residual, post, comb, pre, norm_weight, norm_eps,
                          order=order, rank_lanes=rank_lanes, fma=fma, post_fma=post_fma, hc=hc)


def _check_reduction(tp: int, order: Sequence[int] | None, rank_lanes: int) -> None:
    require_choice("rank_lanes", rank_lanes, RANK_LANES)
    if tp % rank_lanes:
        raise ValueError(f"rank_lanes={rank_lanes} must divide tp={tp}")
    if rank_lanes != 1 and order is not None:
        raise ValueError(f"order must be None when rank_lanes={rank_lanes} (got {list(order)})")
    rank_order(tp, order)
