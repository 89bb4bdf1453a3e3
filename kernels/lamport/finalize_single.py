"""The single-kernel form of the MoE-finalize AllReduceNorm: the finalize
(:mod:`kernels.lamport.finalize_publish`), the publish, the Lamport consume,
the residual add and the RMSNorm in one launch.

The two-kernel form launches the finalize publish (``ceil(hidden / E /
128)`` CTAs a token) and then the PDL-chained :class:`kernels.lamport.norm.
NormKernel`. Here, as in :mod:`kernels.lamport.norm_single`, one CTA a
token of ``hidden / 8`` threads does both, one 16-byte fragment (8 BF16) a
thread: the token's routes are staged in shared memory (one thread a route,
so ``top_k <= hidden / 8``) before ``griddepcontrol.wait``, the shared
expert's fragment is loaded on the tuning's side of the wait, then the
NEXT_STAGE load, the routed rows in prefetch groups with their FMAs in
route order, and from the sanitized payload on everything is the single
norm kernel's (stores, consume, epilogue, the stage advance by the launch's
agreement: :class:`kernels.lamport.norm_single.SingleNormKernel`).

Bit for bit the two-kernel form's outputs: every output element's FMA chain
(route order, one rounding to BF16, -0.0 sanitized) depends only on its
column, not on how many elements a thread holds, and the consume and
epilogue are the norm kernel's. Out-of-range route indices make the token's
payload NaN, as in the publish. One-shot only (no owner mode), like the
single norm kernel, and with the same residency condition.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Float32, Int32, Int64, Uint32
import cuda.bindings.driver as cuda

from . import primitives as prim
from .finalize_publish import (check_finalize_options, finalize_words, load_shared_words,
                               stage_routes)
from .norm_single import SingleNormKernel
from .protocol import NEXT_STAGE, VEC_BF16
from .publish import load_peers


def check_single_finalize(*, hidden: int, top_k: int) -> None:
    """The single form stages a route a thread: ValueError naming ``top_k``
    when the token's CTA (``hidden / 8`` threads) has fewer threads."""
    threads = hidden // VEC_BF16
    if top_k > threads:
        raise ValueError(f"top_k={top_k} exceeds the single-kernel finalize's {threads} threads "
                         f"a token (hidden={hidden} / 8): one thread stages one route")


class SingleFinalizeNormKernel(SingleNormKernel):
    """Finalize + publish + consume + residual add + RMSNorm of ``[M,
    hidden]`` in one launch. Launch arguments: as
    :class:`kernels.lamport.finalize_publish.FinalizePublishKernel`'s
    routing inputs (``routed`` BF16 [rows, hidden], ``weights`` FP32 or BF16
    [M, top_k], ``indices`` int32 [M, top_k], ``shared`` BF16 [M, hidden] or
    0, ``routed_rows``), then as :class:`SingleNormKernel` without ``x``."""

    def __init__(self, *, hidden: int, tp: int, top_k: int, budget_ns: int = 0,
                 transport: str = "unicast", fp32_weights: bool = True,
                 routed_scaling_factor: float = 1.0, shared: str = "after",
                 prefetch_group: int | None = None) -> None:
        super().__init__(hidden=hidden, tp=tp, budget_ns=budget_ns, transport=transport)
        prefetch_group = top_k if prefetch_group is None else prefetch_group
        check_finalize_options(tp=tp, top_k=top_k, elements_per_thread=VEC_BF16,
                               routed_scaling_factor=routed_scaling_factor, shared=shared,
                               prefetch_group=prefetch_group, transport=transport)
        check_single_finalize(hidden=hidden, top_k=top_k)
        # What the finalize helpers read (kernels.lamport.finalize_publish).
        self.top_k, self.shared, self.owner = top_k, shared, False
        self.fp32_weights, self.scale = bool(fp32_weights), float(routed_scaling_factor)
        self.elements, self.words = VEC_BF16, VEC_BF16 // 2
        self.prefetch_group = prefetch_group
        self.prefetch_groups = (top_k + prefetch_group - 1) // prefetch_group

    @cute.jit
    def __call__(self, routed: Int64, weights: Int64, indices: Int64, shared: Int64,
                 routed_rows: Int32, mailbox: Int64, destination: Int64, residual: Int64,
                 gamma: Int64, residual_out: Int64, norm_out: Int64, stage_state: Int64,
                 error: Int64, capacity: Int32, error_records: Int32, eps: Float32,
                 m: Int32, rank: Int32, sync: Int32, cluster: Int32,
                 stream: cuda.CUstream) -> None:
        self.kernel(routed, weights, indices, shared, routed_rows, mailbox, destination,
                    residual, gamma, residual_out, norm_out, stage_state, error, capacity,
                    error_records, eps, m, rank, sync).launch(
            grid=(m, 1, 1), block=(self.threads, 1, 1), cluster=(cluster, 1, 1),
            stream=stream, use_pdl=True)

    @cute.kernel
    def kernel(self, routed: Int64, weights: Int64, indices: Int64, shared: Int64,
               routed_rows: Int32, mailbox: Int64, destination: Int64, residual: Int64,
               gamma: Int64, residual_out: Int64, norm_out: Int64, stage_state: Int64,
               error: Int64, capacity: Int32, error_records: Int32, eps: Float32,
               m: Int32, rank: Int32, sync: Int32):
        hidden64 = Int64(self.hidden)
        tidx, _, _ = cute.arch.thread_idx()
        token, _, _ = cute.arch.block_idx()
        column = Int64(tidx) * VEC_BF16
        element = Int64(token) * hidden64 + column

        peers = load_peers(self, destination, token)
        residual_values = prim.unpack_bf16x8(
            prim.load_u32x4(residual + element * 2)).to(Float32)
        gamma_values = prim.unpack_bf16x8(
            prim.load_u32x4(gamma + column * 2)).to(Float32)
        smem = cutlass.memory.SmemAllocator()
        staged_rows, staged_weights = stage_routes(self, smem, indices, weights, routed_rows,
                                                   token, tidx, Boolean(True))
        shared_words = cute.make_rmem_tensor(cute.make_layout((self.words,)), Uint32)
        shared_words.fill(Uint32(0))
        if cutlass.const_expr(self.shared == "before"):
            load_shared_words(self, shared_words, shared, token, hidden64, column, Boolean(True))

        cute.arch.griddepcontrol_wait()

        if cutlass.const_expr(self.shared == "after"):
            load_shared_words(self, shared_words, shared, token, hidden64, column, Boolean(True))
        stage = prim.load_volatile_u32(stage_state + NEXT_STAGE * 4)
        payload = finalize_words(self, routed, staged_rows, staged_weights, shared_words,
                                 hidden64, column)
        reduced, failed = self._publish_and_consume(
            payload, stage, peers, mailbox, destination, stage_state, error, capacity,
            error_records, rank, sync, token, tidx, column)
        self._epilogue(reduced, failed, residual_values, gamma_values, residual_out,
                       norm_out, element, eps, smem=smem)
        self._advance(stage, stage_state, error, m, sync, token, tidx)
