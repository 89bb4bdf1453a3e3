"""The vocab-parallel embedding through the Lamport mailbox (seed
``_EmbedPublishDeviceKernel`` / ``_EmbedNormDeviceKernel``).

Publish: rank ``rank`` owns the embedding rows of token ids ``[start, start +
rows)`` (row ``id - start`` of its shard ``weight``). For token ``t`` it
publishes that row (sanitized: -0.0 -> +0.0) when it owns ``ids[t]`` and
zeros otherwise, into slot ``[stage, rank, t, :]`` of every rank's mailbox:
the plain publish's protocol, layout (grid ``(ceil(hidden / 1024), M)``, 128
threads, one 16-byte fragment a thread), stage bounds check and stores; only
the source row is gathered. ``start``, ``rows``, ``hidden`` and ``rank`` are
runtime, so one compile serves every rank and shard.

Consume (embed-norm): the :class:`~kernels.lamport.norm.NormKernel` consume
(rank-ordered FP32 sum of the tp fragments, NEXT_STAGE, PDL trigger, sentinel
write-back; the watchdog variant included) followed by the MTP layer's
``fused_eh_norm``: ``out[t] = [enorm(emb), hnorm(previous[t])]`` (``[M, 2 *
hidden]`` BF16) where ``emb`` is the sum rounded to BF16 (exactly the owner's
row, the others publishing +0.0) and replaced by +0.0 where ``positions[t]
== 0``. One CTA a token, ``hidden / 8`` threads. enorm / hnorm are loaded
before ``griddepcontrol.wait``; ids, positions and previous after it. Where
the consume failed (watchdog timeout, bad stage) the embedding half is NaN,
position 0 included.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32
import cuda.bindings.driver as cuda

from kernels.validation import require_tp

from . import primitives as prim
from .norm import NormKernel
from .protocol import LAMPORT_GENERATIONS, NEXT_STAGE, VEC_BF16
from .publish import PUBLISH_THREADS, TRANSPORTS, load_peers, record_stage, store_payload


class EmbedPublishKernel:
    """Publish of this rank's embedding rows of ``ids`` (zeros elsewhere).

    Launch arguments: ``ids`` int32 [M], ``weight`` BF16 [>= rows, hidden],
    ``stage_state``, ``destination`` (peer table or multicast address),
    ``error``, ``rank``, ``capacity``, ``hidden``, ``start``, ``rows``,
    ``ctas_per_token``, ``m``, ``stream``.
    """

    def __init__(self, *, tp: int, transport: str = "unicast") -> None:
        require_tp("tp", tp)
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
        self.tp = tp
        self.transport = transport
        self.owner = False
        self.threads = PUBLISH_THREADS

    @cute.jit
    def __call__(self, ids: Int64, weight: Int64, stage_state: Int64, destination: Int64,
                 error: Int64, rank: Int32, capacity: Int32, hidden: Int32, start: Int32,
                 rows: Int32, ctas_per_token: Int32, m: Int32,
                 stream: cuda.CUstream) -> None:
        self.kernel(ids, weight, stage_state, destination, error, rank, capacity, hidden,
                    start, rows).launch(grid=(ctas_per_token, m, 1),
                                        block=(self.threads, 1, 1), stream=stream,
                                        use_pdl=True)

    @cute.kernel
    def kernel(self, ids: Int64, weight: Int64, stage_state: Int64, destination: Int64,
               error: Int64, rank: Int32, capacity: Int32, hidden: Int32, start: Int32,
               rows: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        cta, token, _ = cute.arch.block_idx()
        column = Int64(cta * self.threads + tidx) * VEC_BF16
        hidden64 = Int64(hidden)

        peers = load_peers(self, destination, token)

        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()

        stage = prim.load_volatile_u32(stage_state + NEXT_STAGE * 4)
        stage_ok = stage < Uint32(LAMPORT_GENERATIONS)
        if column < hidden64:
            payload = embedding_words(ids, weight, token, start, rows, hidden64, column)
            store_payload(self, payload, stage, stage_ok, peers, destination, rank, capacity,
                          token, hidden64, column)
        record_stage(stage, stage_ok, stage_state, error, (cta == 0) & (token == 0) & (tidx == 0))


class EmbedNormKernel(NormKernel):
    """Lamport consume + ``[enorm(embedding), hnorm(previous)]`` (see the
    module docstring). Launch arguments: ``mailbox``, ``positions`` int64 [M],
    ``previous`` BF16 [M, hidden], ``enorm``, ``hnorm`` BF16 [hidden],
    ``output`` BF16 [M, 2 * hidden], ``stage_state``, ``error``, ``capacity``,
    ``error_records``, ``eps``, ``m``, ``stream``."""

    @cute.jit
    def __call__(self, mailbox: Int64, positions: Int64, previous: Int64, enorm: Int64,
                 hnorm: Int64, output: Int64, stage_state: Int64, error: Int64,
                 capacity: Int32, error_records: Int32, eps: Float32, m: Int32,
                 stream: cuda.CUstream) -> None:
        self.kernel(mailbox, positions, previous, enorm, hnorm, output, stage_state, error,
                    capacity, error_records, eps).launch(
            grid=(m, 1, 1), block=(self.threads, 1, 1), stream=stream, use_pdl=True)

    @cute.kernel
    def kernel(self, mailbox: Int64, positions: Int64, previous: Int64, enorm: Int64,
               hnorm: Int64, output: Int64, stage_state: Int64, error: Int64,
               capacity: Int32, error_records: Int32, eps: Float32):
        hidden = self.hidden
        tidx, _, _ = cute.arch.thread_idx()
        token, _, _ = cute.arch.block_idx()
        column = Int64(tidx) * VEC_BF16
        element = Int64(token) * hidden + column

        # Weights: written before the producer of this call's publish started.
        enorm_values = prim.unpack_bf16x8(prim.load_u32x4(enorm + column * 2)).to(Float32)
        hnorm_values = prim.unpack_bf16x8(prim.load_u32x4(hnorm + column * 2)).to(Float32)
        hint = self._stage_hint(stage_state)

        cute.arch.griddepcontrol_wait()

        previous_values = prim.unpack_bf16x8(
            prim.load_u32x4(previous + element * 2)).to(Float32)
        position = prim.load_u64(positions + Int64(token) * 8)
        reduced = cute.make_rmem_tensor(cute.make_layout((VEC_BF16,)), Float32)
        failed = self._consume(mailbox, stage_state, error, capacity, error_records,
                               token, tidx, column, reduced, hint)
        embed_epilogue(self, reduced, failed, position, previous_values, enorm_values,
                       hnorm_values, output, token, column, eps)


@cute.jit
def embedding_words(ids: Int64, weight: Int64, token, start: Int32, rows: Int32,
                    hidden64: Int64, column: Int64) -> list:
    """The publish's payload at ``column`` of ``token``: this rank's
    embedding row of ``ids[token]`` (row ``id - start`` of its shard
    ``weight``, -0.0 sanitized) when it owns the id, else +0.0; 4 words."""
    local = Int64(prim.load_s32(ids + Int64(token) * 4)) - Int64(start)
    words = cute.make_rmem_tensor(cute.make_layout((4,)), Uint32)
    words.fill(Uint32(0))
    if (local >= Int64(0)) & (local < Int64(rows)):
        loaded = prim.sanitize_u32x4(prim.load_u32x4(weight + (local * hidden64 + column) * 2))
        for i in cutlass.range_constexpr(4):
            words[i] = loaded[i]
    return [words[i] for i in range(4)]


@cute.jit
def embed_epilogue(kernel, reduced, failed, position, previous_values, enorm_values,
                   hnorm_values, output: Int64, token, column: Int64, eps: Float32,
                   smem=None) -> None:
    """The MTP layer's ``fused_eh_norm`` of one fragment, shared by the
    embed-norm consumers (``kernel``: a :class:`NormKernel`, its ``hidden``
    and ``warps``): the summed embedding (NaN where ``failed``, +0.0 where
    ``position == 0``) rounded to BF16, then ``[enorm(embedding),
    hnorm(previous)]`` into ``output`` ([M, 2 * hidden] BF16), the two sums
    of squares through warp shuffles and one barrier (``smem``: the
    kernel's allocator, when it allocated shared memory of its own)."""
    hidden = kernel.hidden
    lane = cute.arch.lane_idx()
    warp = cute.arch.warp_idx()
    if failed:
        reduced.fill(Float32(float("nan")))
    else:
        if position == Int64(0):
            reduced.fill(Float32(0.0))
    # Exactly one rank owns each id: the BF16 sum is the owner's row.
    embedding = reduced.load().to(cutlass.BFloat16).to(Float32)

    squares = cute.make_rmem_tensor(cute.make_layout((2,)), Float32)
    squares[0] = (embedding * embedding).reduce(
        cute.ReductionOp.ADD, init_val=Float32(0.0), reduction_profile=0)
    squares[1] = (previous_values * previous_values).reduce(
        cute.ReductionOp.ADD, init_val=Float32(0.0), reduction_profile=0)
    for i in cutlass.range_constexpr(2):
        for offset in cutlass.range_constexpr(5):
            squares[i] = squares[i] + cute.arch.shuffle_sync_bfly(
                squares[i], offset=1 << offset, mask=-1, mask_and_clamp=31)
    if cutlass.const_expr(smem is None):
        smem = cutlass.memory.SmemAllocator()
    warp_sums = smem.allocate_array(Float32, 2 * kernel.warps)
    if lane == 0:
        cute.arch.store((warp_sums + 2 * warp).llvm_ptr, squares[0])
        cute.arch.store((warp_sums + 2 * warp + 1).llvm_ptr, squares[1])
    cute.arch.barrier()
    total_e = Float32(0.0)
    total_h = Float32(0.0)
    for w in cutlass.range_constexpr(kernel.warps):
        total_e = total_e + cute.arch.load((warp_sums + 2 * w).llvm_ptr, Float32)
        total_h = total_h + cute.arch.load((warp_sums + 2 * w + 1).llvm_ptr, Float32)
    inv_e = cute.math.rsqrt(total_e / Float32(hidden) + eps, fastmath=True)
    inv_h = cute.math.rsqrt(total_h / Float32(hidden) + eps, fastmath=True)
    row = Int64(token) * (2 * hidden) + column
    prim.store_u32x4(output + row * 2, prim.pack_bf16x8(
        (embedding * inv_e * enorm_values).to(cutlass.BFloat16)))
    prim.store_u32x4(output + (row + hidden) * 2, prim.pack_bf16x8(
        (previous_values * inv_h * hnorm_values).to(cutlass.BFloat16)))
