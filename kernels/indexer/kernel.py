"""The indexer projection kernel and its fused query-epilogue variant.

``x @ weight.T`` on ``mma.sync`` m16n8k16 BF16: tokens are the m16, 8 weight
rows the n8. A cluster of ``split`` CTAs owns 8 weight rows, each CTA a
contiguous K part and each warp a contiguous ``span`` of it. The dot product
does not care which K a fragment slot holds, so lane (g, q) = (lane / 4,
lane % 4) keeps the contiguous 16-byte chunks ``q * 8 + 32 p`` of its span for
weight row g (and tokens g, g + 8): the loaded words are the mma fragments as
they are; words 0-1 of a chunk feed accumulator 0, words 2-3 accumulator 1.
The reduction tree (two accumulators, ``acc0 + acc1``, warps in order from
+0.0, cluster CTAs in rank order from +0.0) is the one
:func:`kernels.reference.indexer.projection_accumulate` models.

Order in the kernel (checked in the PTX by ``jobs.compile_check``): the
weight fragments are loaded into registers (``ld.global.nc``) before
``griddepcontrol.wait``; the inputs after it. Padding tokens of the last
16-token tile repeat the last token and are never stored. Outputs are written
in their stock dtypes (key BF16, head weights FP32, kpool gate BF16).

All tensors are passed as ``Int64`` device addresses with compile-time shapes
(the compile cache is keyed by shape, see :mod:`kernels.indexer.compile`), so
the same function compiles without a GPU and a CUDA graph can replay it.

The fused variant (``fused=FusedShape(...)``, ``split == 1``) runs the same
GEMV in the fused row order (:func:`kernels.indexer.layout.fused_layout`),
then the query epilogue: CTA ``first_head + h`` rotates and quantizes head h's
query (warp w: tokens w, w + warps, ...; lane l holds elements 4l..4l+3),
writes its FP8 words and folds the per-(token, head) scale and
``softmax_scale * heads^-0.5`` into head h's weight; the first cluster (the
key CTAs) rounds the key to BF16, pushes each CTA's per-token (mean, M2) to
every CTA of the cluster with ``st.async`` completing on an mbarrier, combines
them in rank order (Chan, equal counts) and writes the normed key. Heads
``heads..padded-1`` are written as zeros.

``FusedShape.variant`` (:class:`kernels.indexer.layout.FusedVariant`): its
``split_k = G`` has the CTAs of a cluster split K instead of rows (CTA c sums
K part c of the cluster's 16 row groups, each warp G groups over 1/G of the
part, and pushes each group's partial tile to the CTA owning the group, which
adds the parts in the projection's order at ``Tactic(G, 16)``); its other
fields move loads, never arithmetic, so they write the same bits:
``skip_zero`` predicates off the loads of the layout's zero rows (at 64 heads
half of the 80 CTAs' slots), ``early_consts`` loads each thread's slot code
and the key CTAs' LayerNorm weight and bias with the weights, before the PDL
wait, instead of in the epilogue; ``early_launch`` lets the next kernel launch
(``launch_dependents``) at the start instead of after the PDL wait;
``spread`` runs the grid of :func:`kernels.indexer.layout.spread_layout` (2-3
rows a CTA, no clusters, weights read from the concatenated rows; with
``bulk`` by one whole-row copy a live slot) and moves the key through a global
mailbox to key CTA 0, which runs the cluster's LayerNorm
(:meth:`ProjectionKernel.key_gather_norm`): the same bits. ``key_first``
(with ``spread`` and ``bulk``) runs :func:`kernels.indexer.layout.
key_first_layout` instead, one CTA a key row, and the GEMV twice
(:meth:`ProjectionKernel.key_first_gemv`): once the key row's copy landed,
the key slot into the mailbox (the last CTA gathers and norms it there), then
once the other rows' did. ``exchange=False`` (a timing probe) skips the
mailbox and the reducer and writes the un-normed key.
"""

from __future__ import annotations

import dataclasses

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32

from kernels.lamport import primitives as lp

from . import primitives as ip
from .layout import (DIM, FUSED_WARPS, MAILBOX_SENTINEL, ROWS, SLOT_GATE, SLOT_HEAD,
                     SLOT_INDEX_BITS, SLOT_KEY, SPREAD_KEY_ROWS, SPREAD_ROWS, TILE, FusedVariant,
                     bulk_row_stride, bulk_tile_bytes)

#: FP32(1 / 448): ``act_quant``'s scale factor.
INV_FP8_MAX = 1.0 / 448.0
#: ``act_quant``'s floor on a block's amax.
AMAX_FLOOR = 1e-4


@dataclasses.dataclass(frozen=True)
class FusedShape:
    """Compile-time shape of the fused variant."""
    padded: int        # heads written (>= heads), zeros beyond ``heads``
    ctas: int          # CTAs of the grid, a multiple of the launch cluster
    first_head: int    # CTA holding head 0 (key // ROWS; spread: key // SPREAD_KEY_ROWS; key-first: 0)
    bf16: bool         # head weights in BF16 (else FP32)
    ue8m0: bool        # power-of-two q scales (else amax / 448)
    variant: FusedVariant = FusedVariant()  # which loads go where (same bits)


class ProjectionKernel:
    """``x @ weight.T`` for ``tokens`` tokens; see the module docstring."""

    def __init__(self, *, rows: int, k: int, key: int, heads: int, tokens: int, warps: int,
                 split: int, fused: FusedShape | None = None, early_launch: bool = False) -> None:
        if rows % ROWS or k % (32 * warps * split) or tokens < 1:
            raise ValueError(f"rows={rows} must tile by {ROWS}, K={k} by {32 * warps * split}, "
                             f"tokens={tokens} >= 1")
        self.rows, self.k, self.key, self.heads = rows, k, key, heads
        self.gate = rows - key - heads
        self.tokens, self.warps, self.split = tokens, warps, split
        self.threads = 32 * warps
        self.span = k // (warps * split)
        self.pairs = self.span // 32
        self.tiles = (tokens + TILE - 1) // TILE
        self.fused = fused
        #: The projection's ``launch_dependents`` first thing instead of after
        #: the PDL wait (the fused kernel's is ``fused.variant.early_launch``).
        self.early_launch = early_launch
        if fused is not None:
            #: The key LayerNorm's partitions (of ROWS rows; the key cluster's CTAs).
            self.partitions = key // ROWS
            #: CTAs a launch cluster holds: the key cluster, or none (spread).
            self.cluster = 1 if fused.variant.spread else self.partitions
            if split != 1 or warps != FUSED_WARPS or fused.ctas % self.cluster:
                raise ValueError(f"the fused kernel needs split 1, {FUSED_WARPS} warps and whole "
                                 f"clusters of {self.cluster} CTAs, got split={split} "
                                 f"warps={warps} ctas={fused.ctas}")
            if fused.variant.spread and self.threads % key:
                raise ValueError(f"the spread fused kernel needs key to divide its "
                                 f"{self.threads} threads, got key={key}")
            if fused.variant.key_first and self.tiles != 1:
                raise ValueError(f"the key-first fused kernel needs one token tile (tokens <= "
                                 f"{TILE}), got tokens={tokens}")
            #: The spread reducer's CTA: key CTA 0, or the key-first grid's
            #: last CTA (the fewest rows of its layout).
            self.reducer = key - 1 if fused.variant.key_first else 0
            fused.variant.tactic(key)  # ValueError: split_k without a FUSED_WARPS-CTA cluster

    # ------------------------------------------------------------ launches
    @cute.jit
    def __call__(self, w: Int64, x: Int64, key: Int64, weights: Int64, gate: Int64,
                 stream: cuda.CUstream) -> None:
        self.kernel(w, x, key, weights, gate).launch(
            grid=(self.rows // ROWS * self.split, 1, 1), block=(self.threads, 1, 1),
            cluster=(self.split, 1, 1), stream=stream, use_pdl=True)

    @cute.jit
    def fused_call(self, w: Int64, x: Int64, gate: Int64, q: Int64, q_out: Int64,
                   w_out: Int64, key: Int64, norm_w: Int64, norm_b: Int64, slots: Int64,
                   mailbox: Int64, scale: Float32, eps: Float32, stream: cuda.CUstream) -> None:
        self.fused_kernel(w, x, gate, q, q_out, w_out, key, norm_w, norm_b, slots, mailbox,
                          scale, eps).launch(
            grid=(self.fused.ctas, 1, 1), block=(self.threads, 1, 1),
            cluster=(self.cluster, 1, 1), stream=stream, use_pdl=True)

    # ------------------------------------------------------------ shared parts
    @cute.jit
    def load_weights(self, w: Int64, group, part, lane, live=None, span=0, row=None):
        """Lane (g, q)'s fragments of weight row g of row group ``group`` (or
        of row ``row`` of ``w``) in K part ``part`` (``span`` wide, default
        ``self.span``), before the PDL wait; with ``live`` (Int32), zeros
        instead of the loads where it is 0."""
        span = span or self.span
        first = part * span + lane % 4 * 8
        if cutlass.const_expr(row is None):
            row = group * ROWS + lane // 4
        row = Int64(row)
        b = []
        for p in cutlass.range_constexpr(span // 32):
            address = w + (row * self.k + first + p * 32) * 2
            if cutlass.const_expr(live is None):
                b += ip.load_weight_u32x4(address)
            else:
                b += ip.load_weight_u32x4_if(address, live)
        return b

    @cute.jit
    def live_row(self, cta, g):
        """1 if row g of fused CTA ``cta`` is a weight row, 0 if a zero row:
        :func:`kernels.indexer.layout.fused_row_live`."""
        per = ROWS - 1
        live = Int32(1)
        head = cta - self.fused.first_head
        if head >= 0:
            if head < self.heads:
                if g > 0:
                    if per * head + g > self.gate:
                        live = Int32(0)
            else:
                if (head - self.heads) * ROWS + g >= self.gate - per * self.heads:
                    live = Int32(0)
        return live

    @cute.jit
    def spread_row(self, cta, g):
        """Source row of slot g of CTA ``cta`` of the spread layout, -1 for a
        zero slot: :func:`kernels.indexer.layout.spread_source_row`."""
        key_ctas = self.fused.first_head
        per = SPREAD_ROWS - 1
        src = Int32(-1)
        head = cta - key_ctas
        if head < 0:
            if g < SPREAD_KEY_ROWS:
                src = cta * SPREAD_KEY_ROWS + g
        elif head < self.heads:
            if g == 0:
                src = self.key + head
            elif g <= per:
                if per * head + g - 1 < self.gate:
                    src = self.key + self.heads + per * head + g - 1
        else:
            r = per * self.heads + (head - self.heads) * SPREAD_ROWS + g
            if g < SPREAD_ROWS:
                if r < self.gate:
                    src = self.key + self.heads + r
        return src

    @cute.jit
    def key_first_row(self, cta, g):
        """Source row of slot g of CTA ``cta`` of the key-first layout, -1 for
        a zero slot: :func:`kernels.indexer.layout.key_first_source_row`."""
        src = Int32(-1)
        if g == 0:
            src = cta
        else:
            other = (g - 1) * self.key + cta
            if other < self.heads + self.gate:
                src = self.key + other
        return src

    @cute.jit
    def tile_tokens(self, tile, g):
        """The tokens (rows g and g + 8 of 16-token tile ``tile``) whose input
        a lane of group g loads: padding tokens repeat the last token (never
        stored); with at most 8 tokens both are row g."""
        lo = tile * TILE + g
        if lo >= self.tokens:
            lo = self.tokens - 1
        hi = lo
        if cutlass.const_expr(self.tokens > 8):
            hi = tile * TILE + 8 + g
            if hi >= self.tokens:
                hi = self.tokens - 1
        return lo, hi

    @cute.jit
    def gemv(self, x: Int64, b, partial: Int32, part, warp, lane, tile_in=None):
        """Each warp's partial C tiles of K part ``part`` into shared
        ``partial`` ``[warps, tiles, 32 lanes, 4]`` FP32 at slot ``warp``.
        The weight fragments are ``b`` (registers), or with ``tile_in =
        (tile, mbarrier)`` read from the whole-row bulk tile (row g at
        ``g * stride``) once the mbarrier says it arrived (the tile's ``x``
        loads go out first)."""
        g = lane // 4
        first = part * self.span + lane % 4 * 8
        for tile in cutlass.range(self.tiles, unroll=1):
            lo, hi = self.tile_tokens(tile, g)
            # Register weights: each x load next to its mma. Tile weights:
            # the tile's x loads first, then the wait, then the mma chain.
            if cutlass.const_expr(tile_in is None):
                acc0 = [Float32(0.0)] * 4
                acc1 = [Float32(0.0)] * 4
                for p in cutlass.range_constexpr(self.pairs):
                    a_lo, a_hi = self.pair_inputs(x, lo, hi, first + p * 32)
                    acc0, acc1 = self.mma_pair(a_lo, a_hi, b[p * 4:p * 4 + 4], acc0, acc1)
            else:
                xs = [self.pair_inputs(x, lo, hi, first + p * 32) for p in range(self.pairs)]
                acc0, acc1 = self.tile_mma(xs, tile_in, g, first)
            self.store_partial(partial, warp, tile, lane, acc0, acc1)

    @cute.jit
    def pair_inputs(self, x: Int64, lo, hi, offset, stage=None):
        """(a_lo, a_hi): the ``x`` fragments of tokens ``lo`` and ``hi`` at K
        ``offset`` (the same words twice with at most 8 tokens); with
        ``stage``, from the ``stage_x`` tile (:meth:`stage_x`), ``offset``
        then counted from the CTA's K part."""
        if cutlass.const_expr(stage is None):
            a_lo = lp.load_u32x4(x + (Int64(lo) * self.k + offset) * 2)
        else:
            a_lo = ip.load_shared_u32x4(stage + lo * bulk_row_stride(self.k, self.key) + offset * 2)
        a_hi = a_lo
        if cutlass.const_expr(self.tokens > 8):
            if cutlass.const_expr(stage is None):
                a_hi = lp.load_u32x4(x + (Int64(hi) * self.k + offset) * 2)
            else:
                a_hi = ip.load_shared_u32x4(stage + hi * bulk_row_stride(self.k, self.key)
                                            + offset * 2)
        return a_lo, a_hi

    @cute.jit
    def stage_x(self, x: Int64, stage, rank):
        """The ``stage_x`` copy: cluster CTA ``rank``'s K part of ``x``
        (``tokens x K / cluster`` BF16) into the shared tile ``stage``, token
        rows :func:`~kernels.indexer.layout.bulk_row_stride` apart, each
        thread taking 16-byte chunks ``tid``, ``tid + threads``, ... (all its
        loads issued before its stores), then a CTA barrier."""
        tid, _, _ = cute.arch.thread_idx()
        width = self.k // self.cluster  # BF16 of the CTA's K part
        chunks = width * 2 // 16  # 16-byte chunks of a token row's part
        total = self.tokens * chunks
        stride = bulk_row_stride(self.k, self.key)
        rounds = (total + self.threads - 1) // self.threads
        words = []
        for j in cutlass.range_constexpr(rounds):
            # Past the end a thread copies the last chunk again (same bytes).
            i = tid + j * self.threads
            if i >= total:
                i = total - 1
            words.append(lp.load_u32x4(x + (Int64(i // chunks) * self.k + rank * width) * 2
                                       + i % chunks * 16))
        for j in cutlass.range_constexpr(rounds):
            i = tid + j * self.threads
            if i >= total:
                i = total - 1
            ip.store_shared_u32x4(stage + i // chunks * stride + i % chunks * 16, words[j])
        cute.arch.sync_threads()

    @cute.jit
    def tile_mma(self, xs, tile_in, g, first):
        """(acc0, acc1) of one token tile over the whole-row bulk tile
        ``tile_in = (tile, mbarrier)`` (row g at ``g * stride``), once the
        mbarrier says it arrived; ``xs`` the tile's ``x`` fragments, loaded
        before the wait."""
        stride = bulk_row_stride(self.k, self.key, split_k=False)
        acc0 = [Float32(0.0)] * 4
        acc1 = [Float32(0.0)] * 4
        ip.mbarrier_wait_parity(tile_in[1], 0)
        for p in cutlass.range_constexpr(self.pairs):
            bp = ip.load_shared_u32x4(tile_in[0] + g * stride + (first + p * 32) * 2)
            acc0, acc1 = self.mma_pair(xs[p][0], xs[p][1], bp, acc0, acc1)
        return acc0, acc1

    @cute.jit
    def store_partial(self, partial: Int32, warp, tile, lane, acc0, acc1):
        """A warp's partial C tile ``acc0 + acc1`` into slot ``warp`` of
        shared ``partial`` ``[warps, tiles, 32 lanes, 4]`` FP32."""
        base = partial + (((warp * self.tiles + tile) * 32 + lane) * 4) * 4
        for i in cutlass.range_constexpr(4):
            ip.store_shared_f32(base + i * 4, ip.add_rn_f32(acc0[i], acc1[i]))

    @cute.jit
    def mma_pair(self, a_lo, a_hi, b, acc0, acc1):
        """One 32-element K step: words 0-1 of the 16-byte chunks into
        ``acc0``, words 2-3 into ``acc1`` (the module docstring's order)."""
        acc0 = ip.mma_bf16_m16n8k16((a_lo[0], a_hi[0], a_lo[1], a_hi[1]), (b[0], b[1]), acc0)
        acc1 = ip.mma_bf16_m16n8k16((a_lo[2], a_hi[2], a_lo[3], a_hi[3]), (b[2], b[3]), acc1)
        return acc0, acc1

    @cute.jit
    def gemv_split(self, x: Int64, bs, partial: Int32, part, dest, lane, push, tile_in=None,
                   stage=None):
        """The split-K fused GEMV: one warp, ``G = split_k`` row groups (owned
        by cluster CTAs ``dest``, ``dest + 1``, ...) over K part ``part``
        (``K / G / cluster`` wide); each group's partial tile goes to slot
        ``part`` of its owner's ``partial`` by ``st.async`` completing on the
        owner's mbarrier ``push``. One load of ``x`` feeds every group. The
        weight fragments are ``bs`` (registers), or with ``tile_in = (tile,
        mbarrier)`` read from the bulk variant's shared tile once the
        mbarrier says it arrived (the ``x`` loads go out first). With
        ``stage`` (``stage_x``) the ``x`` fragments come from the shared tile
        that :meth:`stage_x` fills first (every warp of the CTA calls this)."""
        groups = self.fused.variant.split_k
        span = self.k // (self.cluster * groups)
        stride = bulk_row_stride(self.k, self.key)
        half = part % groups
        g = lane // 4
        first = part * span + lane % 4 * 8
        if cutlass.const_expr(stage is not None):
            self.stage_x(x, stage, part // groups)
            first = half * span + lane % 4 * 8
        for tile in cutlass.range(self.tiles, unroll=1):
            lo, hi = self.tile_tokens(tile, g)
            accs = [[[Float32(0.0)] * 4, [Float32(0.0)] * 4] for _ in range(groups)]
            xs = [self.pair_inputs(x, lo, hi, first + p * 32, stage) for p in range(span // 32)]
            if cutlass.const_expr(tile_in is not None):
                ip.mbarrier_wait_parity(tile_in[1], 0)
            for p in cutlass.range_constexpr(span // 32):
                a_lo, a_hi = xs[p]
                for i in cutlass.range_constexpr(groups):
                    if cutlass.const_expr(tile_in is None):
                        b = bs[i][p * 4:p * 4 + 4]
                    else:
                        b = ip.load_shared_u32x4(
                            tile_in[0] + ((dest + i) * ROWS + g) * stride
                            + (half * span + lane % 4 * 8 + p * 32) * 2)
                    accs[i][0], accs[i][1] = self.mma_pair(a_lo, a_hi, b, accs[i][0],
                                                           accs[i][1])
            base = partial + (((part * self.tiles + tile) * 32 + lane) * 4) * 4
            for i in cutlass.range_constexpr(groups):
                ip.store_async_cluster_f32x4(
                    base, [ip.add_rn_f32(accs[i][0][v], accs[i][1][v]) for v in range(4)],
                    push, dest + i)

    @cute.jit
    def split_total(self, partial: Int32, e):
        """Element e = (token, row) of C summed in the projection's order at
        ``Tactic(G, cluster)``: slot ``c * G + s`` holds CTA c's K half s;
        halves from +0.0 within a CTA, CTAs from +0.0 in rank order."""
        groups = self.fused.variant.split_k
        total = Float32(0.0)
        for c in cutlass.range_constexpr(self.cluster):
            cta_sum = Float32(0.0)
            for h in cutlass.range_constexpr(groups):
                cta_sum = ip.add_rn_f32(cta_sum, ip.load_shared_f32(
                    self.partial_address(partial, c * groups + h, e)))
            total = ip.add_rn_f32(total, cta_sum)
        return total

    @cute.jit
    def partial_address(self, partial: Int32, slot, e):
        """Shared address of element e = (token, row) of partial tile
        ``slot``: lane ``(token % 8) * 4 + row / 2``, value ``(token % 16) /
        8 * 2 + row % 2`` of the token's 16-token tile."""
        t = e // ROWS
        r = e % ROWS
        src = t % 8 * 4 + r // 2
        idx = t % TILE // 8 * 2 + r % 2
        return partial + (((slot * self.tiles + t // TILE) * 32 + src) * 4 + idx) * 4

    @cute.jit
    def warp_total(self, partial: Int32, e):
        """Element e = (token, row) of C summed over the warps (from +0.0)."""
        total = Float32(0.0)
        for v in cutlass.range_constexpr(self.warps):
            total = ip.add_rn_f32(total, ip.load_shared_f32(self.partial_address(partial, v, e)))
        return total

    @cute.jit
    def store(self, key: Int64, weights: Int64, gate: Int64, t, row, total):
        if row < self.key:
            ip.store_bf16(key + (Int64(t) * self.key + row) * 2, total)
        elif row < self.key + self.heads:
            ip.store_f32(weights + (Int64(t) * self.heads + row - self.key) * 4, total)
        else:
            ip.store_bf16(gate + (Int64(t) * self.gate + row - self.key - self.heads) * 2, total)

    # ------------------------------------------------------------ projection
    @cute.kernel
    def kernel(self, w: Int64, x: Int64, key: Int64, weights: Int64, gate: Int64):
        tid, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        block, _, _ = cute.arch.block_idx()
        cta = block // self.split
        rank = block % self.split
        if cutlass.const_expr(self.early_launch):
            cute.arch.griddepcontrol_launch_dependents()
        b = self.load_weights(w, cta, rank * self.warps + warp, lane)
        smem = cutlass.memory.SmemAllocator()
        partial = ip.shared_address(smem.allocate_array(
            Float32, self.warps * self.tiles * 32 * 4, byte_alignment=16))
        sums = ip.shared_address(smem.allocate_array(Float32, self.tokens * ROWS,
                                                     byte_alignment=16))

        cute.arch.griddepcontrol_wait()
        if cutlass.const_expr(not self.early_launch):
            cute.arch.griddepcontrol_launch_dependents()
        self.gemv(x, b, partial, rank * self.warps + warp, warp, lane)
        cute.arch.sync_threads()

        for e in cutlass.range(tid, self.tokens * ROWS, self.threads, unroll=1):
            total = self.warp_total(partial, e)
            if cutlass.const_expr(self.split == 1):
                self.store(key, weights, gate, e // ROWS, cta * ROWS + e % ROWS, total)
            else:
                ip.store_shared_f32(sums + e * 4, total)
        if cutlass.const_expr(self.split > 1):
            # Rank c adds elements c, c + split, ... over the cluster's K parts.
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
            for e in cutlass.range(tid * self.split + rank, self.tokens * ROWS,
                                   self.threads * self.split, unroll=1):
                total = Float32(0.0)
                for c in cutlass.range_constexpr(self.split):
                    total = ip.add_rn_f32(total, ip.load_cluster_f32(sums + e * 4, c))
                self.store(key, weights, gate, e // ROWS, cta * ROWS + e % ROWS, total)
            # Keep this CTA's sums alive until the whole cluster has read them.
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()

    # ------------------------------------------------------------ fused
    @cute.jit
    def store_weight(self, w_out: Int64, t, head, value):
        f = self.fused
        if cutlass.const_expr(f.bf16):
            ip.store_bf16(w_out + (Int64(t) * f.padded + head) * 2, value)
        else:
            ip.store_f32(w_out + (Int64(t) * f.padded + head) * 4, value)

    @cute.jit
    def hadamard_quant(self, words, lane):
        """(4 FP8 e4m3 of elements 4 lane..4 lane + 3 as one word, the head's
        FP32 scale) of one 128-wide head held 4 BF16 a lane: FP32
        butterflies of strides 1, 2 (in the lane) and 4..64 (lanes xor 1..16),
        times FP32(128^-0.5), rounded to BF16; amax over the head, floor 1e-4,
        scale ``amax * FP32(1/448)`` (``ue8m0``: ``2^ceil(log2)``), ``q =
        e4m3(v / scale)`` saturating. As :func:`kernels.reference.indexer.
        hadamard_transform` + ``quantize_fp8``, bit for bit."""
        v0, v1 = ip.bf16x2_to_f32(words[0])
        v2, v3 = ip.bf16x2_to_f32(words[1])
        v0, v1 = ip.add_rn_f32(v0, v1), ip.sub_rn_f32(v0, v1)
        v2, v3 = ip.add_rn_f32(v2, v3), ip.sub_rn_f32(v2, v3)
        v0, v2 = ip.add_rn_f32(v0, v2), ip.sub_rn_f32(v0, v2)
        v1, v3 = ip.add_rn_f32(v1, v3), ip.sub_rn_f32(v1, v3)
        vals = [v0, v1, v2, v3]
        for s in cutlass.range_constexpr(5):
            m = 1 << s
            # Lower index: v + partner; upper: partner - v == (-v) + partner.
            sign = Float32(1.0) - Float32(2.0) * Float32((lane >> s) & 1)
            for i in cutlass.range_constexpr(4):
                partner = cute.arch.shuffle_sync_bfly(vals[i], offset=m)
                vals[i] = ip.add_rn_f32(ip.mul_rn_f32(vals[i], sign), partner)
        amax = Float32(AMAX_FLOOR)
        for i in cutlass.range_constexpr(4):
            vals[i] = ip.round_bf16(ip.mul_rn_f32(vals[i], Float32(DIM ** -0.5)))
            amax = ip.abs_max_f32(vals[i], amax)
        for s in cutlass.range_constexpr(5):
            amax = ip.max_f32(amax, cute.arch.shuffle_sync_bfly(amax, offset=1 << s))
        q_scale = ip.mul_rn_f32(amax, Float32(INV_FP8_MAX))
        if cutlass.const_expr(self.fused.ue8m0):
            q_scale, inverse = ip.pow2_ceil_f32(q_scale)
            for i in cutlass.range_constexpr(4):
                vals[i] = ip.mul_rn_f32(vals[i], inverse)
        else:
            for i in cutlass.range_constexpr(4):
                vals[i] = ip.div_rn_f32(vals[i], q_scale)
        return ip.e4m3x4(vals[0], vals[1], vals[2], vals[3]), q_scale

    @cute.kernel
    def fused_kernel(self, w: Int64, x: Int64, gate: Int64, q: Int64, q_out: Int64,
                     w_out: Int64, key: Int64, norm_w: Int64, norm_b: Int64, slots: Int64,
                     mailbox: Int64, scale: Float32, eps: Float32):
        f = self.fused
        tid, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        cta, _, _ = cute.arch.block_idx()
        if cutlass.const_expr(f.variant.early_launch):
            cute.arch.griddepcontrol_launch_dependents()
        split_k = f.variant.split_k
        tiles_in = self.warps  # partial tiles this CTA receives
        if cutlass.const_expr(split_k):
            # Warp (half, set): row groups base + set * G .. + G - 1 of this
            # cluster over K part rank * G + half (K / (cluster * G) wide).
            sets = self.cluster // split_k
            tiles_in = self.cluster * split_k
            rank = cta % self.cluster
            dest = warp % sets * split_k
            part = rank * split_k + warp // sets
            span = self.k // tiles_in
            bs = []
            for i in cutlass.range_constexpr(0 if f.variant.bulk else split_k):
                group = cta - rank + dest + i
                if cutlass.const_expr(f.variant.skip_zero):
                    bs.append(self.load_weights(w, group, part, lane, self.live_row(group, lane // 4),
                                                span=span))
                else:
                    bs.append(self.load_weights(w, group, part, lane, span=span))
        else:
            b = []
            if cutlass.const_expr(f.variant.bulk):
                pass  # the CTA's rows come by bulk copies, below
            elif cutlass.const_expr(f.variant.spread):
                # w is the concatenated weight: slot g's source row, or none.
                src = self.spread_row(cta, lane // 4)
                src_live = Int32(0)
                src_row = Int32(0)
                if src >= 0:
                    src_live = Int32(1)
                    src_row = src
                b = self.load_weights(w, cta, warp, lane, src_live, row=src_row)
            elif cutlass.const_expr(f.variant.skip_zero):
                b = self.load_weights(w, cta, warp, lane, self.live_row(cta, lane // 4))
            else:
                b = self.load_weights(w, cta, warp, lane)
        is_key = cta < f.first_head
        # A thread's epilogue elements e = tid + j * threads all sit in slot
        # e % ROWS = tid % ROWS (threads is a multiple of ROWS): with
        # early_consts its slot code and, in the key CTAs, the LayerNorm weight
        # and bias of that row are loaded here, beside the weights.
        code0 = Int32(0)
        nw0 = Float32(0.0)
        nb0 = Float32(0.0)
        if cutlass.const_expr(f.variant.early_consts):
            code0 = Int32(ip.load_const_u32(slots + (cta * ROWS + tid % ROWS) * 4))
        if cutlass.const_expr(f.variant.spread):
            if cta == self.reducer:
                # The reducer normalizes elements tid + j * threads, all in
                # key row tid % key (key divides threads).
                nw0 = ip.load_const_f32(norm_w + (tid % self.key) * 4)
                nb0 = ip.load_const_f32(norm_b + (tid % self.key) * 4)
        elif cutlass.const_expr(f.variant.early_consts):
            if is_key:
                index0 = code0 & ((1 << SLOT_INDEX_BITS) - 1)
                nw0 = ip.load_const_f32(norm_w + index0 * 4)
                nb0 = ip.load_const_f32(norm_b + index0 * 4)
        smem = cutlass.memory.SmemAllocator()
        tile_in = None
        key_in = None
        if cutlass.const_expr(f.variant.bulk):
            stride = bulk_row_stride(self.k, self.key, split_k=bool(split_k))
            tile = ip.shared_address(smem.allocate_array(
                Float32, bulk_tile_bytes(self.k, self.key, split_k=bool(split_k)) // 4,
                byte_alignment=128))
            wbar = ip.shared_address(smem.allocate_array(Int64, 1, byte_alignment=16))
            kbar = wbar
            if cutlass.const_expr(f.variant.key_first):
                # The key row's own copy: the first GEMV pass waits on it alone.
                kbar = ip.shared_address(smem.allocate_array(Int64, 1, byte_alignment=16))
                if tid == 0:
                    ip.mbarrier_init(kbar, 1)
            if tid == 0:
                ip.mbarrier_init(wbar, 32)
            cute.arch.sync_threads()
            if cutlass.const_expr(not split_k):
                if warp == 0:
                    # Lane r < ROWS copies this CTA's row r, all of K, if it
                    # is live; every lane arrives expecting its bytes.
                    live = Int32(0)
                    if cutlass.const_expr(f.variant.spread):
                        # Slot r's source row of the concatenated weight, if any.
                        copied = Int32(0)
                        if lane < ROWS:
                            if cutlass.const_expr(f.variant.key_first):
                                slot_src = self.key_first_row(cta, lane)
                            else:
                                slot_src = self.spread_row(cta, lane)
                            if slot_src >= 0:
                                live = Int32(1)
                                copied = slot_src
                    else:
                        if lane < ROWS:
                            live = self.live_row(cta, lane)
                        copied = cta * ROWS + lane
                    if cutlass.const_expr(f.variant.key_first):
                        # Lane 0's key row (always live) on kbar, the rest on wbar.
                        row_bytes = live * (self.k * 2)
                        if lane == 0:
                            ip.mbarrier_arrive_expect_tx(kbar, self.k * 2)
                            ip.bulk_load_weights(tile, w + Int64(copied) * (self.k * 2),
                                                 self.k * 2, kbar)
                            row_bytes = Int32(0)
                        ip.mbarrier_arrive_expect_tx(wbar, row_bytes)
                        if row_bytes != 0:
                            ip.bulk_load_weights(tile + lane * stride,
                                                 w + Int64(copied) * (self.k * 2), self.k * 2,
                                                 wbar)
                    else:
                        ip.mbarrier_arrive_expect_tx(wbar, live * (self.k * 2))
                        if live != 0:
                            ip.bulk_load_weights(tile + lane * stride,
                                                 w + Int64(copied) * (self.k * 2), self.k * 2,
                                                 wbar)
            else:
                if warp == 0:
                    # Lane l copies rows l, l + 32, ... of the cluster's live rows
                    # over this CTA's K part (every CTA of a cluster has the same
                    # live rows) and arrives expecting their bytes.
                    row_bytes = self.k // self.cluster * 2
                    nbytes = Int32(0)
                    for j in cutlass.range_constexpr(self.cluster * ROWS // 32):
                        r = lane + 32 * j
                        live = self.live_row(cta - rank + r // ROWS, r % ROWS)
                        nbytes = nbytes + live * row_bytes
                    ip.mbarrier_arrive_expect_tx(wbar, nbytes)
                    for j in cutlass.range_constexpr(self.cluster * ROWS // 32):
                        r = lane + 32 * j
                        if self.live_row(cta - rank + r // ROWS, r % ROWS) != 0:
                            ip.bulk_load_weights(
                                tile + r * stride,
                                w + (Int64((cta - rank) * ROWS + r) * self.k
                                     + rank * (row_bytes // 2)) * 2,
                                row_bytes, wbar)
            tile_in = (tile, wbar)
            key_in = (tile, kbar)
        partial = ip.shared_address(smem.allocate_array(
            Float32, tiles_in * self.tiles * 32 * 4, byte_alignment=16))
        scales = ip.shared_address(smem.allocate_array(Float32, self.tokens, byte_alignment=16))
        values = ip.shared_address(smem.allocate_array(Float32, self.tokens * ROWS,
                                                       byte_alignment=16))
        stats = ip.shared_address(smem.allocate_array(Float32, self.tokens * 2,
                                                      byte_alignment=16))
        peers = ip.shared_address(smem.allocate_array(Float32, self.partitions * self.tokens * 2,
                                                      byte_alignment=16))
        bar = ip.shared_address(smem.allocate_array(Int64, 1, byte_alignment=16))
        kvals = bar
        if cutlass.const_expr(f.variant.spread):
            kvals = ip.shared_address(smem.allocate_array(Float32, self.tokens * self.key,
                                                          byte_alignment=16))
        gather = bar
        if cutlass.const_expr(split_k):
            gather = ip.shared_address(smem.allocate_array(Int64, 1, byte_alignment=16))
        stage = None
        if cutlass.const_expr(f.variant.stage_x):
            stage = ip.shared_address(smem.allocate_array(
                Float32, f.variant.x_stage_bytes(self.tokens, self.k, self.key) // 4,
                byte_alignment=128))
        if cutlass.const_expr(split_k):
            # Armed for the cluster's partial tiles (and, in the key CTAs, the
            # (mean, M2) pushes) before the PDL wait; the cluster barrier,
            # waited on right after it, publishes the inits.
            if tid == 0:
                ip.mbarrier_init_expect(gather, tiles_in * self.tiles * 32 * 16)
                if is_key:
                    ip.mbarrier_init_expect(bar, self.cluster * self.tokens * 8)
            cute.arch.cluster_arrive_relaxed()
        elif cutlass.const_expr(not f.variant.spread):
            if is_key:
                # Armed for every key CTA's (mean, M2) pushes before the PDL
                # wait; the cluster barrier (completed in key_norm) publishes
                # the init.
                if tid == 0:
                    ip.mbarrier_init_expect(bar, self.cluster * self.tokens * 8)
                cute.arch.cluster_arrive_relaxed()

        cute.arch.griddepcontrol_wait()
        if cutlass.const_expr(not f.variant.early_launch):
            cute.arch.griddepcontrol_launch_dependents()
        if cutlass.const_expr(split_k):
            # Every CTA of a cluster arrived before its PDL wait: no stall.
            cute.arch.cluster_wait()
        if cutlass.const_expr(f.padded > self.heads):
            spare = f.padded - self.heads
            for i in cutlass.range(cta * self.warps + warp, self.tokens * spare,
                                   f.ctas * self.warps, unroll=1):
                t = i // spare
                head = self.heads + i % spare
                ip.store_b32(q_out + ((Int64(t) * f.padded + head) * DIM + lane * 4), Uint32(0))
                if lane == 0:
                    self.store_weight(w_out, t, head, Float32(0.0))
        rounds = (self.tokens + self.warps - 1) // self.warps
        head = cta - f.first_head
        is_head = (head >= 0) & (head < self.heads)
        if head < 0:
            head = 0
        if head >= self.heads:
            head = self.heads - 1
        # Issued before the GEMV, so the query loads hide behind it.
        got = []
        for j in cutlass.range_constexpr(rounds):
            t = j * self.warps + warp
            if t >= self.tokens:
                t = self.tokens - 1
            got.append(ip.load_u32x2(q + ((Int64(t) * self.heads + head) * DIM + lane * 4) * 2))
        if cutlass.const_expr(split_k):
            self.gemv_split(x, bs, partial, part, dest, lane, gather, tile_in, stage)
        elif cutlass.const_expr(f.variant.key_first):
            self.key_first_gemv(x, key_in, tile_in, partial, warp, lane, tid, cta, key, mailbox,
                                kvals, peers, stats, eps, nw0, nb0)
        else:
            self.gemv(x, b, partial, warp, warp, lane, tile_in)
        if is_head:
            for j in cutlass.range_constexpr(rounds):
                t = j * self.warps + warp
                if t < self.tokens:
                    word, q_scale = self.hadamard_quant(got[j], lane)
                    ip.store_b32(q_out + ((Int64(t) * f.padded + head) * DIM + lane * 4), word)
                    if lane == 0:
                        ip.store_shared_f32(scales + t * 4, q_scale)
        if cutlass.const_expr(split_k):
            ip.mbarrier_wait_parity(gather, 0)
        cute.arch.sync_threads()

        for e in cutlass.range(tid, self.tokens * ROWS, self.threads, unroll=1):
            t = e // ROWS
            code = code0
            if cutlass.const_expr(not f.variant.early_consts):
                code = Int32(ip.load_u32(slots + (cta * ROWS + e % ROWS) * 4))
            index = code & ((1 << SLOT_INDEX_BITS) - 1)
            kind = code >> SLOT_INDEX_BITS
            if cutlass.const_expr(split_k):
                total = self.split_total(partial, e)
            else:
                total = self.warp_total(partial, e)
            if kind == SLOT_HEAD:
                value = ip.mul_rn_f32(ip.mul_rn_f32(total, ip.load_shared_f32(scales + t * 4)),
                                      scale)
                self.store_weight(w_out, t, index, value)
            elif kind == SLOT_GATE:
                ip.store_bf16(gate + (Int64(t) * self.gate + index) * 2, total)
            elif kind == SLOT_KEY:
                if cutlass.const_expr(not f.variant.exchange):
                    # Timing probe: the un-normed key, nobody reduces it.
                    ip.store_bf16(key + (Int64(t) * self.key + index) * 2, total)
                elif cutlass.const_expr(f.variant.key_first):
                    pass  # sent after the first GEMV pass (key_first_gemv)
                elif cutlass.const_expr(f.variant.spread):
                    # A BF16-rounded FP32 has a zero low half: never the sentinel.
                    lp.store_u32(mailbox + (Int64(t) * self.key + index) * 4,
                                 ip.f32_bits(ip.round_bf16(total)))
                else:
                    ip.store_shared_f32(values + e * 4, ip.round_bf16(total))
        if cutlass.const_expr(f.variant.spread):
            if cutlass.const_expr(f.variant.exchange and not f.variant.key_first):
                if cta == self.reducer:
                    self.key_gather_norm(key, mailbox, kvals, peers, stats, eps, tid, nw0, nb0)
        elif is_key:
            self.key_norm(key, values, peers, bar, stats, norm_w, norm_b, slots, eps, cta, tid,
                          code0, nw0, nb0)

    @cute.jit
    def key_first_gemv(self, x: Int64, key_in, rest_in, partial: Int32, warp, lane, tid, cta,
                       key: Int64, mailbox: Int64, kvals, peers, stats, eps: Float32, nw0, nb0):
        """The key-first GEMV (one token tile): the pass over the whole-row
        tile once ``key_in``'s mbarrier says the key row (slot 0) landed,
        the key slot's sums into the mailbox (slot ``t * key + cta``, as the
        spread key CTAs store), then in the reducer the gather and the
        LayerNorm (:meth:`key_gather_norm`), then the same pass over the
        same ``x`` fragments once ``rest_in``'s says the other rows did; its
        partial tiles are left in ``partial`` for the epilogue. Every
        column's sums are the default's (the arithmetic of :meth:`gemv`)."""
        g = lane // 4
        first = warp * self.span + lane % 4 * 8
        lo, hi = self.tile_tokens(0, g)
        xs = [self.pair_inputs(x, lo, hi, first + p * 32) for p in range(self.pairs)]
        acc0, acc1 = self.tile_mma(xs, key_in, g, first)
        self.store_partial(partial, warp, 0, lane, acc0, acc1)
        cute.arch.sync_threads()
        for t in cutlass.range(tid, self.tokens, self.threads, unroll=1):
            total = self.warp_total(partial, t * ROWS)
            # A BF16-rounded FP32 has a zero low half: never the sentinel.
            lp.store_u32(mailbox + (Int64(t) * self.key + cta) * 4,
                         ip.f32_bits(ip.round_bf16(total)))
        if cta == self.reducer:
            self.key_gather_norm(key, mailbox, kvals, peers, stats, eps, tid, nw0, nb0)
        cute.arch.sync_threads()  # every key sum read before the tiles are reused
        acc0, acc1 = self.tile_mma(xs, rest_in, g, first)
        self.store_partial(partial, warp, 0, lane, acc0, acc1)

    @cute.jit
    def partition_stats(self, value):
        """(mean, M2) of one ROWS-row partition of token t's key, ``value(r)``
        its row r (FP32): sequential sums from +0.0, ``mean = sum *
        FP32(1 / ROWS)``, ``M2 = sum (v - mean)^2``."""
        total = Float32(0.0)
        for r in cutlass.range_constexpr(ROWS):
            total = ip.add_rn_f32(total, value(r))
        mean = ip.mul_rn_f32(total, Float32(1.0 / ROWS))
        m2 = Float32(0.0)
        for r in cutlass.range_constexpr(ROWS):
            d = ip.sub_rn_f32(value(r), mean)
            m2 = ip.add_rn_f32(m2, ip.mul_rn_f32(d, d))
        return mean, m2

    @cute.jit
    def combine_stats(self, peers, stats, eps: Float32, tid):
        """Per token, the partitions' (mean, M2) (shared ``peers``, partition
        c of token t at ``(c * tokens + t) * 8``) combined in partition order
        (Chan, equal counts) into shared ``stats`` (mean, rstd) at ``t * 8``."""
        for t in cutlass.range(tid, self.tokens, self.threads, unroll=1):
            means = [ip.load_shared_f32(peers + (c * self.tokens + t) * 8)
                     for c in range(self.partitions)]
            mean = means[0]
            for c in cutlass.range_constexpr(1, self.partitions):
                mean = ip.add_rn_f32(mean, means[c])
            mean = ip.mul_rn_f32(mean, Float32(1.0 / self.partitions))
            m2 = Float32(0.0)
            for c in cutlass.range_constexpr(self.partitions):
                d = ip.sub_rn_f32(means[c], mean)
                m2 = ip.add_rn_f32(
                    ip.add_rn_f32(m2, ip.load_shared_f32(peers + (c * self.tokens + t) * 8 + 4)),
                    ip.mul_rn_f32(ip.mul_rn_f32(Float32(ROWS), d), d))
            ip.store_shared_f32(stats + t * 8, mean)
            ip.store_shared_f32(stats + t * 8 + 4, ip.rsqrt_f32(
                ip.add_rn_f32(ip.div_rn_f32(m2, Float32(self.key)), eps)))

    @cute.jit
    def normed(self, value, stats, t, nw, nb):
        """``((v - mean) * rstd) * w + b`` of one key value of token t (FP32)."""
        centred = ip.sub_rn_f32(value, ip.load_shared_f32(stats + t * 8))
        normed = ip.mul_rn_f32(ip.mul_rn_f32(centred, ip.load_shared_f32(stats + t * 8 + 4)), nw)
        return ip.add_rn_f32(normed, nb)

    @cute.jit
    def key_gather_norm(self, key: Int64, mailbox: Int64, kvals, peers, stats, eps: Float32,
                        tid, nw0, nb0):
        """The spread variant's reducer (key CTA 0): every key value of every
        token from its mailbox slot (``ld.volatile`` until it is not
        :data:`MAILBOX_SENTINEL`; after :data:`MAILBOX_DEADLINE_NS` a NaN),
        each slot reset to the sentinel once read (the next call's key CTAs
        store only after their PDL wait, so after this grid ends), then the
        key cluster's LayerNorm: each partition's (mean, M2), combined in
        partition order, and the normed key. ``nw0``, ``nb0``: the affine of
        key row ``tid % key``, loaded before the PDL wait."""
        for e in cutlass.range(tid, self.tokens * self.key, self.threads, unroll=1):
            slot = mailbox + Int64(e) * 4
            word = ip.poll_mailbox_word(slot)  # a lost key CTA: a NaN key, never a hang
            ip.store_shared_f32(kvals + e * 4, ip.bits_f32(word))
            lp.store_u32(slot, Uint32(MAILBOX_SENTINEL))
        cute.arch.sync_threads()
        for i in cutlass.range(tid, self.tokens * self.partitions, self.threads, unroll=1):
            t = i // self.partitions
            base = kvals + (t * self.key + i % self.partitions * ROWS) * 4
            mean, m2 = self.partition_stats(lambda r: ip.load_shared_f32(base + r * 4))
            ip.store_shared_f32(peers + (i % self.partitions * self.tokens + t) * 8, mean)
            ip.store_shared_f32(peers + (i % self.partitions * self.tokens + t) * 8 + 4, m2)
        cute.arch.sync_threads()
        self.combine_stats(peers, stats, eps, tid)
        cute.arch.sync_threads()
        for e in cutlass.range(tid, self.tokens * self.key, self.threads, unroll=1):
            t = e // self.key
            ip.store_bf16(key + Int64(e) * 2,
                          self.normed(ip.load_shared_f32(kvals + e * 4), stats, t, nw0, nb0))

    @cute.jit
    def key_norm(self, key: Int64, values, peers, bar, stats, norm_w: Int64, norm_b: Int64,
                 slots: Int64, eps: Float32, rank, tid, code0, nw0, nb0):
        """Each key CTA pushes its eight rows' (mean, M2) per token to every CTA
        of the cluster (``st.async`` completing on the peer's mbarrier), which
        combine them in rank order (Chan, equal counts); then the LayerNorm.
        ``code0``, ``nw0``, ``nb0``: this thread's slot code and LayerNorm
        weight and bias when loaded early (``early_consts``); with ``split_k``
        the cluster barrier was waited on after the PDL wait."""
        cute.arch.sync_threads()
        if cutlass.const_expr(not self.fused.variant.split_k):
            cute.arch.cluster_wait()
        for t in cutlass.range(tid, self.tokens, self.threads, unroll=1):
            mean, m2 = self.partition_stats(
                lambda r: ip.load_shared_f32(values + (t * ROWS + r) * 4))
            dst = peers + (rank * self.tokens + t) * 8
            for peer in cutlass.range_constexpr(self.cluster):
                ip.store_async_cluster_f32x2(dst, mean, m2, bar, peer)
        ip.mbarrier_wait_parity(bar, 0)
        self.combine_stats(peers, stats, eps, tid)
        cute.arch.sync_threads()
        for e in cutlass.range(tid, self.tokens * ROWS, self.threads, unroll=1):
            t = e // ROWS
            r = e % ROWS
            code = code0
            nw = nw0
            nb = nb0
            if cutlass.const_expr(not self.fused.variant.early_consts):
                code = Int32(ip.load_u32(slots + (rank * ROWS + r) * 4))
            index = code & ((1 << SLOT_INDEX_BITS) - 1)
            if cutlass.const_expr(not self.fused.variant.early_consts):
                nw = ip.load_f32(norm_w + index * 4)
                nb = ip.load_f32(norm_b + index * 4)
            ip.store_bf16(key + (Int64(t) * self.key + index) * 2,
                          self.normed(ip.load_shared_f32(values + e * 4), stats, t, nw, nb))
