"""The single-kernel form of the embedding path: the vocab-parallel
embedding publish (:class:`kernels.lamport.embed.EmbedPublishKernel`), the
Lamport consume and the MTP layer's ``fused_eh_norm``
(:class:`kernels.lamport.embed.EmbedNormKernel`) in one launch.

As :mod:`kernels.lamport.norm_single`: one CTA a token of ``hidden / 8``
threads, one 16-byte fragment a thread. ``enorm`` / ``hnorm`` are loaded
before ``griddepcontrol.wait``; after it ``previous``, ``positions``, the
NEXT_STAGE load, the token's id and this rank's row of it (or +0.0), then
the single norm kernel's stores, consume and stage advance by the launch's
agreement around :func:`kernels.lamport.embed.embed_epilogue`.

Bit for bit the two-kernel form's output: the same payload words
(:func:`kernels.lamport.embed.embedding_words`), the same rank-order sum
and the same epilogue. One-shot only (the embedding path is), with the
single norm kernel's residency condition.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
import cuda.bindings.driver as cuda

from . import primitives as prim
from .embed import embed_epilogue, embedding_words
from .norm_single import SingleNormKernel
from .protocol import NEXT_STAGE, VEC_BF16
from .publish import load_peers


class SingleEmbedNormKernel(SingleNormKernel):
    """Embedding publish + consume + ``[enorm(embedding), hnorm(previous)]``
    of ``[M]`` token ids in one launch. Launch arguments: ``ids`` int32 [M],
    ``weight`` BF16 [>= rows, hidden] (this rank's shard), ``start``,
    ``rows``, ``positions`` int64 [M], ``previous`` BF16 [M, hidden],
    ``enorm``, ``hnorm`` BF16 [hidden], ``output`` BF16 [M, 2 * hidden],
    then ``mailbox``, ``destination``, ``stage_state``, ``error``,
    ``capacity``, ``error_records``, ``eps``, ``m``, ``rank``, ``sync``,
    ``cluster`` as :class:`SingleNormKernel`."""

    @cute.jit
    def __call__(self, ids: Int64, weight: Int64, start: Int32, rows: Int32, positions: Int64,
                 previous: Int64, enorm: Int64, hnorm: Int64, output: Int64, mailbox: Int64,
                 destination: Int64, stage_state: Int64, error: Int64, capacity: Int32,
                 error_records: Int32, eps: Float32, m: Int32, rank: Int32, sync: Int32,
                 cluster: Int32, stream: cuda.CUstream) -> None:
        self.kernel(ids, weight, start, rows, positions, previous, enorm, hnorm, output,
                    mailbox, destination, stage_state, error, capacity, error_records, eps, m,
                    rank, sync).launch(
            grid=(m, 1, 1), block=(self.threads, 1, 1), cluster=(cluster, 1, 1),
            stream=stream, use_pdl=True)

    @cute.kernel
    def kernel(self, ids: Int64, weight: Int64, start: Int32, rows: Int32, positions: Int64,
               previous: Int64, enorm: Int64, hnorm: Int64, output: Int64, mailbox: Int64,
               destination: Int64, stage_state: Int64, error: Int64, capacity: Int32,
               error_records: Int32, eps: Float32, m: Int32, rank: Int32, sync: Int32):
        hidden64 = Int64(self.hidden)
        tidx, _, _ = cute.arch.thread_idx()
        token, _, _ = cute.arch.block_idx()
        column = Int64(tidx) * VEC_BF16
        element = Int64(token) * hidden64 + column

        # Written before this call's producer started (the peer table at
        # construction, the norm weights with the model).
        peers = load_peers(self, destination, token)
        enorm_values = prim.unpack_bf16x8(prim.load_u32x4(enorm + column * 2)).to(Float32)
        hnorm_values = prim.unpack_bf16x8(prim.load_u32x4(hnorm + column * 2)).to(Float32)

        cute.arch.griddepcontrol_wait()

        previous_values = prim.unpack_bf16x8(
            prim.load_u32x4(previous + element * 2)).to(Float32)
        position = prim.load_u64(positions + Int64(token) * 8)
        stage = prim.load_volatile_u32(stage_state + NEXT_STAGE * 4)
        payload = embedding_words(ids, weight, token, start, rows, hidden64, column)
        reduced, failed = self._publish_and_consume(
            payload, stage, peers, mailbox, destination, stage_state, error, capacity,
            error_records, rank, sync, token, tidx, column)
        embed_epilogue(self, reduced, failed, position, previous_values, enorm_values,
                       hnorm_values, output, token, column, eps)
        self._advance(stage, stage_state, error, m, sync, token, tidx)
