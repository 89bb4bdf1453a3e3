"""The MoE finalize fused with the Lamport publish (seed
``_QuadFinalizePublishDeviceKernel``).

Rank ``rank`` publishes, for token ``t``, the BF16 payload
``sum_k w[t, k] * gemm2_permuted[idx[t, k]] + shared_output[t]`` straight into
slot ``[stage, rank, t, :]`` of every rank's mailbox, so the routed top-k
reduction never makes a round trip through global memory. The arithmetic is
exactly :func:`kernels.reference.moe.moe_finalize` with ``fma=True``, spelled
out in PTX (``jobs.compile_check`` counts the instructions):

1. ``w = f32(weight)`` (``ld.global.f32``, or ``ld.global.b16`` +
   ``cvt.f32.bf16``); ``w = mul.rn.f32(w, routed_scaling_factor)`` when the
   factor is not 1.0 (compile time); ``w = 0`` where the route is -1;
2. ``acc = +0.0``; for ``k = 0 .. top_k-1`` in order,
   ``acc = fma.rn.f32(x_k, w_k, acc)``. A -1 route loads nothing and
   contributes ``fma(+0, 0, acc) == acc`` (up to the sign of a zero acc,
   which step 5 or the shared add erases);
3. ``acc = add.rn.f32(acc, shared)`` when a shared expert is included;
4. ``cvt.rn.bf16x2.f32`` (one rounding); 5. sanitize -0.0 to +0.0.

A route index outside ``[-1, routed_rows)`` is never dereferenced: the route
is skipped and its weight made NaN, so the token's payload is NaN (loud, not a
wild load and not a silent wrong answer).

Layout: grid ``(ceil(hidden / E / 128), M)``, 128 threads, ``E =
elements_per_thread`` (4 or 8) BF16 a thread, i.e. 8- or 16-byte fragments;
``hidden`` and ``rank`` are runtime, ``tp``, ``top_k`` and the options below
are compile time. Order in the kernel (PTX-checked): the route indices and
weights are staged in shared memory (one thread a route) *before*
``griddepcontrol.wait`` (the seed's choice: routing metadata must be complete
before the kernel preceding this one triggers its dependents, as it is when
the GEMM2 that consumed it runs in between), the shared-expert fragment is
loaded before or after the wait (``load_shared_before_pdl``: before only when
the shared expert's output was produced before the preceding kernel), then
``launch_dependents``, the volatile NEXT_STAGE load, the routed rows in
prefetch groups of ``prefetch_group`` loads issued back to back before their
FMAs, and the stores (one ``st.relaxed.sys`` per peer, or one
``multimem.st``).

8-byte fragments and the mailbox protocol. The mailbox's unit of
consumption stays the 16-byte fragment of 8 BF16: with ``E = 4``, threads
``2j`` and ``2j+1`` of a token store the low and high halves of consumer
fragment ``j`` with independent 8-byte stores (``st.relaxed.sys.global.v2``
or ``multimem.st...v2.bf16x2``), at the same slot addresses a 16-byte
publish would use. Nothing orders the two halves, and nothing needs to: the
consumer's 16-byte volatile spin retries until *no* BF16 lane is 0x8000, and
each 32-bit word (two lanes) lands whole, so a half-arrived fragment always
still shows sentinel lanes in the other half and is never consumed early.
The only visible difference is in the watchdog's classification: a fragment
that times out with exactly one half arrived (the publishing rank died
between its two CTAs' stores) is reported as "unsanitized" (some lanes
written) rather than "missing".

Stage bounds check as in :mod:`kernels.lamport.publish`.

Owner mode (``owner=True``, the seed's ``owner_capacity``; compile time): as
the owner-mode plain publish (:mod:`kernels.lamport.publish`), token ``t``
goes to its owner ``t % tp`` only, at slot ``(stage, rank, t // tp)`` of the
owner's mailbox (``capacity`` = the owner capacity), one ``st.relaxed.sys``
a fragment half instead of tp; the grid covers ``max(M, tp)`` tokens and
tokens ``t >= M`` stage every route as -1 and load no shared expert, so they
publish +0.0. The multicast question does not arise: a token has one
destination, so owner mode is unicast by nature (``transport="multicast"``
with ``owner=True`` is a ValueError).
"""

from __future__ import annotations

import dataclasses
import math

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Float32, Int32, Int64, Uint32
import cuda.bindings.driver as cuda

from kernels.validation import require_tp

from . import primitives as prim
from .protocol import LAMPORT_GENERATIONS, NEXT_STAGE
from .publish import (TRANSPORTS, check_owner_transport, load_peers, publish_grid_tokens,
                      record_stage, store_payload)

FINALIZE_THREADS = 128
ELEMENTS_PER_THREAD = (4, 8)
SHARED_MODES = ("none", "before", "after")
"""Shared expert: absent, loaded before ``griddepcontrol.wait``, or after it."""


def finalize_ctas_per_token(hidden: int, elements_per_thread: int) -> int:
    per_cta = elements_per_thread * FINALIZE_THREADS
    return (hidden + per_cta - 1) // per_cta


def check_finalize_options(*, tp: int, top_k: int, elements_per_thread: int,
                           routed_scaling_factor: float, shared: str,
                           prefetch_group: int, transport: str) -> None:
    """ValueError naming the option and its value."""
    require_tp("tp", tp)
    if not 1 <= top_k <= FINALIZE_THREADS:
        raise ValueError(f"top_k must be in [1, {FINALIZE_THREADS}], got {top_k}")
    if elements_per_thread not in ELEMENTS_PER_THREAD:
        raise ValueError(f"elements_per_thread must be 4 or 8, got {elements_per_thread}")
    if not 1 <= prefetch_group <= top_k:
        raise ValueError(f"prefetch_group must be in [1, top_k={top_k}], got {prefetch_group}")
    if shared not in SHARED_MODES:
        raise ValueError(f"shared must be one of {list(SHARED_MODES)}, got {shared!r}")
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    if not math.isfinite(routed_scaling_factor):
        raise ValueError(f"routed_scaling_factor must be finite, got {routed_scaling_factor}")


class FinalizePublishKernel:
    """MoE finalize + publish of ``[M, hidden]`` (see the module docstring).

    Launch arguments (addresses are device pointers as Int64):
    ``routed`` BF16 [rows, hidden], ``weights`` FP32 or BF16 [M, top_k],
    ``indices`` int32 [M, top_k], ``shared`` BF16 [M, hidden] (ignored when
    ``shared == "none"``), ``routed_rows`` = rows, then as
    :class:`kernels.lamport.publish.PublishKernel`.
    """

    def __init__(self, *, tp: int, top_k: int, elements_per_thread: int = 4,
                 fp32_weights: bool = True, routed_scaling_factor: float = 1.0,
                 shared: str = "after", prefetch_group: int | None = None,
                 transport: str = "unicast", owner: bool = False) -> None:
        prefetch_group = top_k if prefetch_group is None else prefetch_group
        check_finalize_options(tp=tp, top_k=top_k, elements_per_thread=elements_per_thread,
                               routed_scaling_factor=routed_scaling_factor, shared=shared,
                               prefetch_group=prefetch_group, transport=transport)
        check_owner_transport(owner, transport)
        self.tp, self.top_k, self.transport = tp, top_k, transport
        self.owner = bool(owner)
        self.elements = elements_per_thread
        self.words = elements_per_thread // 2
        self.fp32_weights = bool(fp32_weights)
        self.scale = float(routed_scaling_factor)
        self.shared = shared
        self.prefetch_group = prefetch_group
        self.prefetch_groups = (top_k + prefetch_group - 1) // prefetch_group
        self.threads = FINALIZE_THREADS

    @cute.jit
    def __call__(self, routed: Int64, weights: Int64, indices: Int64, shared: Int64,
                 routed_rows: Int32, stage_state: Int64, destination: Int64, error: Int64,
                 rank: Int32, capacity: Int32, hidden: Int32, ctas_per_token: Int32,
                 m: Int32, stream: cuda.CUstream) -> None:
        self.kernel(routed, weights, indices, shared, routed_rows, stage_state,
                    destination, error, rank, capacity, hidden, m).launch(
            grid=(ctas_per_token, publish_grid_tokens(self, m), 1),
            block=(self.threads, 1, 1), stream=stream, use_pdl=True)

    @cute.kernel
    def kernel(self, routed: Int64, weights: Int64, indices: Int64, shared: Int64,
               routed_rows: Int32, stage_state: Int64, destination: Int64, error: Int64,
               rank: Int32, capacity: Int32, hidden: Int32, m: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        cta, token, _ = cute.arch.block_idx()
        column = Int64(cta * self.threads + tidx) * self.elements
        hidden64 = Int64(hidden)

        peers = load_peers(self, destination, token)
        # Owner mode publishes tokens M .. tp-1 (M < tp) as +0.0.
        real = Boolean(True)
        if cutlass.const_expr(self.owner):
            real = token < m

        smem = cutlass.memory.SmemAllocator()
        staged_rows, staged_weights = stage_routes(self, smem, indices, weights, routed_rows,
                                                   token, tidx, real)
        shared_words = cute.make_rmem_tensor(cute.make_layout((self.words,)), Uint32)
        shared_words.fill(Uint32(0))
        if cutlass.const_expr(self.shared == "before"):
            load_shared_words(self, shared_words, shared, token, hidden64, column, real)

        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()

        if cutlass.const_expr(self.shared == "after"):
            load_shared_words(self, shared_words, shared, token, hidden64, column, real)

        stage = prim.load_volatile_u32(stage_state + NEXT_STAGE * 4)
        stage_ok = stage < Uint32(LAMPORT_GENERATIONS)
        if column < hidden64:
            words = finalize_words(self, routed, staged_rows, staged_weights, shared_words,
                                   hidden64, column)
            store_payload(self, words, stage, stage_ok, peers, destination, rank, capacity,
                          token, hidden64, column)
        record_stage(stage, stage_ok, stage_state, error, (cta == 0) & (token == 0) & (tidx == 0))


# The finalize arithmetic, shared by this publish and the single-kernel form
# (kernels.lamport.finalize_single). ``kernel`` supplies, at compile time,
# ``top_k``, ``fp32_weights``, ``scale``, ``shared``, ``owner``, ``elements``
# (BF16 a thread: 4 or 8), ``words`` (elements / 2), ``prefetch_group`` and
# ``prefetch_groups``. Each output element's FMA chain depends only on its own
# column, so the bits do not depend on how the columns are spread over threads.
def load_fragment(kernel, address: Int64):
    """``kernel.elements`` BF16 at ``address`` (8 or 16 bytes), as words."""
    if kernel.elements == 8:
        return prim.load_u32x4(address)
    return prim.load_u32x2(address)


@cute.jit
def stage_routes(kernel, smem, indices: Int64, weights: Int64, routed_rows: Int32, token,
                 tidx, real):
    """Token ``token``'s routing metadata into shared memory, one thread a
    route (the block has at least ``top_k`` threads), then a block barrier;
    returns the arrays (route row, weight). The weight is scaled by the
    routed scaling factor, 0 where the route is -1, and NaN (with the route
    made -1) where the index is outside ``[-1, routed_rows)``. Not ``real``
    (owner mode, a token >= M): every route -1, weight 0."""
    staged_rows = smem.allocate_array(Int32, kernel.top_k)
    staged_weights = smem.allocate_array(Float32, kernel.top_k)
    if tidx < kernel.top_k:
        row = Int32(-1)
        weight = Float32(0.0)
        if real:
            element = Int64(token) * kernel.top_k + Int64(tidx)
            row = prim.load_s32(indices + element * 4)
            if cutlass.const_expr(kernel.fp32_weights):
                weight = prim.load_f32(weights + element * 4)
            else:
                weight = prim.load_bf16_as_f32(weights + element * 2)
            if cutlass.const_expr(kernel.scale != 1.0):
                weight = prim.mul_rn_f32(weight, Float32(kernel.scale))
            if row == Int32(-1):
                weight = Float32(0.0)
            if (row < Int32(-1)) | (row >= routed_rows):
                row = Int32(-1)
                weight = Float32(float("nan"))
        cute.arch.store((staged_rows + tidx).llvm_ptr, row)
        cute.arch.store((staged_weights + tidx).llvm_ptr, weight)
    cute.arch.barrier()
    return staged_rows, staged_weights


@cute.jit
def load_shared_words(kernel, shared_words, shared: Int64, token, hidden64: Int64,
                      column: Int64, real) -> None:
    """The shared expert's fragment of ``token`` at ``column`` into
    ``shared_words`` (rmem, ``kernel.words``), where the column is inside
    the row and the token is ``real``."""
    if (column < hidden64) & real:
        loaded = load_fragment(kernel, shared + (Int64(token) * hidden64 + column) * 2)
        for i in cutlass.range_constexpr(kernel.words):
            shared_words[i] = loaded[i]


@cute.jit
def finalize_words(kernel, routed: Int64, staged_rows, staged_weights, shared_words,
                   hidden64: Int64, column: Int64) -> list:
    """The finalized payload at ``column`` (inside the row): the routed rows
    loaded in prefetch groups, their FMAs in route order, the shared expert
    added, one rounding to BF16, -0.0 sanitized; ``kernel.words`` words."""
    acc = [Float32(0.0) for _ in range(kernel.elements)]
    inputs = cute.make_rmem_tensor(
        cute.make_layout((kernel.prefetch_group, kernel.words)), Uint32)
    for group in cutlass.range_constexpr(kernel.prefetch_groups):
        # Issue the group's loads back to back ...
        for item in cutlass.range_constexpr(kernel.prefetch_group):
            k = group * kernel.prefetch_group + item
            if cutlass.const_expr(k < kernel.top_k):
                for w in cutlass.range_constexpr(kernel.words):
                    inputs[item, w] = Uint32(0)
                row = cute.arch.load((staged_rows + k).llvm_ptr, Int32)
                if row != Int32(-1):
                    loaded = load_fragment(kernel, routed + (Int64(row) * hidden64 + column) * 2)
                    for w in cutlass.range_constexpr(kernel.words):
                        inputs[item, w] = loaded[w]
        # ... then their FMAs, in route order.
        for item in cutlass.range_constexpr(kernel.prefetch_group):
            k = group * kernel.prefetch_group + item
            if cutlass.const_expr(k < kernel.top_k):
                weight = cute.arch.load((staged_weights + k).llvm_ptr, Float32)
                for w in cutlass.range_constexpr(kernel.words):
                    lo, hi = prim.bf16x2_to_f32x2(inputs[item, w])
                    acc[2 * w] = prim.fma_rn_f32(lo, weight, acc[2 * w])
                    acc[2 * w + 1] = prim.fma_rn_f32(hi, weight, acc[2 * w + 1])
    if cutlass.const_expr(kernel.shared != "none"):
        for w in cutlass.range_constexpr(kernel.words):
            lo, hi = prim.bf16x2_to_f32x2(shared_words[w])
            acc[2 * w] = prim.add_rn_f32(acc[2 * w], lo)
            acc[2 * w + 1] = prim.add_rn_f32(acc[2 * w + 1], hi)
    return [prim.sanitize_u32(prim.f32x2_to_bf16x2_rn(acc[2 * w], acc[2 * w + 1]))
            for w in range(kernel.words)]


@dataclasses.dataclass(frozen=True)
class FinalizeTuning:
    """How ``AllReduceNorm`` compiles its finalize publish (data only; part
    of the compile-cache key). ``elements_per_thread``: 4 (8-byte fragments,
    the seed's default) or 8 (16-byte); ``prefetch_group``: routed-row loads
    issued back to back before their FMAs (None = top_k, all at once);
    ``load_shared_before_pdl``: load the shared-expert output before
    ``griddepcontrol.wait`` (only when it was produced before the kernel
    preceding the publish)."""

    elements_per_thread: int = 4
    prefetch_group: int | None = None
    load_shared_before_pdl: bool = False

    def validate(self, top_k: int) -> None:
        if self.elements_per_thread not in ELEMENTS_PER_THREAD:
            raise ValueError(f"elements_per_thread must be 4 or 8, got {self.elements_per_thread}")
        if self.prefetch_group is not None and not 1 <= self.prefetch_group <= top_k:
            raise ValueError(f"prefetch_group must be in [1, top_k={top_k}] or None, "
                             f"got {self.prefetch_group}")
