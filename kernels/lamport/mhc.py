"""The Lamport consumer fused with DSV4.1's mHC post-mix, collapse and RMSNorm
(the seed's ``_LamportMHCDeviceKernel``).

Launch: grid ``(M, cluster_size)``, cluster ``(1, cluster_size, 1)``,
``threads`` a CTA (see :mod:`kernels.lamport.mhc_tuning`). A token's
``F = hidden / 8`` fragments are spread over its cluster in trips:
thread ``tid`` of cluster CTA ``c`` is rank lane ``l = tid % R`` of group
``g = tid // R`` and owns fragments ``c * (threads / R) + g + trip * stride``
(``stride = cluster_size * threads / R``) below ``F``; each fragment is owned
by exactly one group. Any hidden that is a multiple of 8 works (idle threads
of the last trip poll nothing but still take every barrier).

Per token, in kernel order (``jobs.compile_check`` checks it in the PTX):

1. ``barrier.cluster.arrive.relaxed`` (this CTA has started; the DSMEM push
   of step 7 waits for it), then, before ``griddepcontrol.wait``, the lane-0
   thread of each group loads its fragments of the hc residual streams and of
   the RMSNorm weight; every thread loads the token's ``post[hc]``,
   ``pre[hc]`` and ``comb[hc, hc]`` (FP32). These inputs were written before
   the kernel preceding this call's publish started.
2. ``griddepcontrol.wait``; volatile ``ACTIVE_STAGE`` load (a value >= 3 is
   never used as an address: no spin, ``ERR_BAD_STAGE``, NaN outputs).
3. For each trip: lane ``l`` spins with 16-byte volatile loads on the slots
   of source ranks ``l, l + R, ...`` of its fragment (all of them re-issued
   each pass, so they are in flight together) until no lane is 0x8000, sums
   them in FP32 from +0.0 in that order (``add.rn``), then butterfly
   shuffles at offsets 1, 2, 4 (< R) add the lane partials
   (:func:`kernels.reference.mhc.butterfly_rank_sum`; R=1 is the plain rank
   order), and the sum is rounded once to BF16.
4. Token 0, cluster CTA 0, thread 0 writes ``NEXT_STAGE = (stage + 1) % 3``;
   every thread ``griddepcontrol.launch_dependents``; every lane writes the
   sentinel back into the slots it read.
5. Lane 0, per fragment and element, FP32 nearest-even, no flush to zero,
   every rounding spelled in PTX (``mul.rn`` / ``fma.rn`` / ``cvt.rn``):
   for target ``t``: ``mixed = fma(reduced, post[t], mul(res[0], comb[0, t]))``,
   then ``mixed = fma(res[s], comb[s, t], mixed)`` for ``s = 1 .. hc-1``,
   ``residual_out[t] = BF16(mixed)`` (stored);
   ``collapse = fma(residual_out[t], pre[t], collapse)`` from +0.0;
   ``prenorm = BF16(collapse)`` (kept in registers). This is
   :func:`kernels.reference.mhc.mhc_post_collapse` with ``fma=True,
   post_fma=True`` bit for bit.
6. Sum of squares: per thread ``fma(v, v, acc)`` over its fragments in trip
   order, a warp butterfly, the warps in order through shared memory.
7. ``barrier.cluster.wait`` (every CTA started), thread ``i < cluster_size``
   stores its CTA's sum into slot ``[c]`` of CTA ``i``'s shared array
   (``mapa`` + ``st.shared::cluster.f32``), ``barrier.cluster.arrive``
   (release) + ``wait`` (acquire); every CTA adds the slots in cluster-rank
   order, so all of them hold the same total bit for bit. No DSMEM access
   follows that barrier, so a CTA may exit after it.
8. ``layer_input = BF16(prenorm * rsqrt(total / hidden + eps) * weight)``
   (``rsqrt.approx``; within 1 BF16 ULP of an FP32 RMSNorm of ``prenorm``).

Watchdog variant (``budget_ns > 0``, compile time): each thread's spins
share one deadline (``%globaltimer`` at its first spin + ``budget_ns``). A
lane still seeing a sentinel lane at the deadline gives up: it appends one
record per source rank still missing (token, source rank, fragment index,
stage, the 4 words seen; :meth:`kernels.lamport.norm.NormKernel._record`),
and its partial sum becomes NaN, so the fragment's residual streams are NaN
and, through the sum of squares and the DSMEM exchange, the token's whole
layer_input row (every CTA of the cluster). The thread then still writes the
sentinel back and walks every barrier, cluster barrier and DSMEM exchange
(never an early return: its siblings would wait forever).

Unverified on a GPU (no device time when this was written): everything this
kernel does at run time (the sweep in ``tests/gpu/test_all_reduce_mhc_gpu.py``
is written for the H200 and has not run). It compiles for sm_90a and
sm_100a, and its PTX passes ``jobs.compile_check`` (order, spin, cluster
barriers and DSMEM ops, exact FMA / multiply / convert counts).
"""

from __future__ import annotations

import dataclasses

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Float32, Int32, Int64, Uint32
import cuda.bindings.driver as cuda

from kernels.compile_cache import persistent

from . import primitives as prim
from .compile import _options, register_compiler
from .norm import NormKernel
from .mhc_tuning import check_geometry
from .protocol import (ACTIVE_STAGE, ERR_BAD_STAGE, LAMPORT_GENERATIONS, NEXT_STAGE,
                       VEC_BF16, WARP_SIZE, slot_index)

MAX_HC = 8
"""Residual streams at most (DSV4.1 uses 4)."""


def check_hc(hc: int) -> int:
    if isinstance(hc, bool) or not isinstance(hc, int) or not 1 <= hc <= MAX_HC:
        raise ValueError(f"hc_mult must be an int in [1, {MAX_HC}], got {hc!r}")
    return hc


class MHCKernel:
    """Lamport consume + mHC post-mix + collapse + RMSNorm (module docstring).

    Launch arguments (addresses are device pointers as Int64): ``mailbox``,
    ``residual`` BF16 [M, hc, hidden], ``post`` FP32 [M, hc], ``comb`` FP32
    [M, hc, hc] ([source, target]), ``pre`` FP32 [M, hc], ``gamma`` BF16
    [hidden], ``residual_out`` BF16 [M, hc, hidden], ``layer_input`` BF16
    [M, hidden], ``stage_state``, ``error``, ``capacity``, ``error_records``,
    ``eps``, ``m``, ``stream``.
    """

    _record = NormKernel._record  # the watchdog's error record, shared

    def __init__(self, *, hidden: int, tp: int, hc: int, cluster_size: int, threads: int,
                 rank_lanes: int, budget_ns: int = 0) -> None:
        check_geometry(hidden=hidden, tp=tp, cluster_size=cluster_size, threads=threads,
                       rank_lanes=rank_lanes)
        check_hc(hc)
        if budget_ns < 0:
            raise ValueError(f"budget_ns must be >= 0, got {budget_ns}")
        self.hidden, self.tp, self.hc = hidden, tp, hc
        self.cluster_size, self.threads, self.rank_lanes = cluster_size, threads, rank_lanes
        self.budget_ns = int(budget_ns)
        self.fragments = hidden // VEC_BF16
        self.groups = threads // rank_lanes          # fragments a CTA a trip
        self.stride = cluster_size * self.groups     # fragments a cluster a trip
        self.trips = -(-self.fragments // self.stride)
        self.waves = tp // rank_lanes                # source ranks a lane polls
        self.warps = threads // WARP_SIZE

    @cute.jit
    def __call__(self, mailbox: Int64, residual: Int64, post: Int64, comb: Int64, pre: Int64,
                 gamma: Int64, residual_out: Int64, layer_input: Int64, stage_state: Int64,
                 error: Int64, capacity: Int32, error_records: Int32, eps: Float32, m: Int32,
                 stream: cuda.CUstream) -> None:
        self.kernel(mailbox, residual, post, comb, pre, gamma, residual_out, layer_input,
                    stage_state, error, capacity, error_records, eps).launch(
            grid=(m, self.cluster_size, 1), block=(self.threads, 1, 1),
            cluster=(1, self.cluster_size, 1), stream=stream, use_pdl=True)

    @cute.kernel
    def kernel(self, mailbox: Int64, residual: Int64, post: Int64, comb: Int64, pre: Int64,
               gamma: Int64, residual_out: Int64, layer_input: Int64, stage_state: Int64,
               error: Int64, capacity: Int32, error_records: Int32, eps: Float32):
        hidden, hc, R = self.hidden, self.hc, self.rank_lanes
        trips, waves = self.trips, self.waves
        tidx, _, _ = cute.arch.thread_idx()
        token, _, _ = cute.arch.block_idx()
        crank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        lane = cute.arch.lane_idx()
        warp = cute.arch.warp_idx()
        if cutlass.const_expr(R == 1):
            rank_lane = 0
            leader = Boolean(True)
        else:
            rank_lane = tidx % R
            leader = rank_lane == 0
        base = crank * self.groups + tidx // R
        token64 = Int64(token)

        if cutlass.const_expr(self.cluster_size > 1):
            cute.arch.cluster_arrive_relaxed()

        # 1. Inputs written before this call's publish was launched.
        res_words = cute.make_rmem_tensor(cute.make_layout((trips, hc, 4)), Uint32)
        res_words.fill(Uint32(0))
        gamma_words = cute.make_rmem_tensor(cute.make_layout((trips, 4)), Uint32)
        gamma_words.fill(Uint32(0))
        for trip in cutlass.range_constexpr(trips):
            fragment = base + trip * self.stride
            if (fragment < self.fragments) & leader:
                column = Int64(fragment) * VEC_BF16
                loaded = prim.load_u32x4(gamma + column * 2)
                for i in cutlass.range_constexpr(4):
                    gamma_words[trip, i] = loaded[i]
                for s in cutlass.range_constexpr(hc):
                    loaded = prim.load_u32x4(
                        residual + ((token64 * hc + s) * hidden + column) * 2)
                    for i in cutlass.range_constexpr(4):
                        res_words[trip, s, i] = loaded[i]
        post_mix = cute.make_rmem_tensor(cute.make_layout((hc,)), Float32)
        pre_mix = cute.make_rmem_tensor(cute.make_layout((hc,)), Float32)
        comb_mix = cute.make_rmem_tensor(cute.make_layout((hc, hc), stride=(hc, 1)), Float32)
        for t in cutlass.range_constexpr(hc):
            post_mix[t] = prim.load_f32(post + (token64 * hc + t) * 4)
            pre_mix[t] = prim.load_f32(pre + (token64 * hc + t) * 4)
        for s in cutlass.range_constexpr(hc):
            for t in cutlass.range_constexpr(hc):
                comb_mix[s, t] = prim.load_f32(comb + ((token64 * hc + s) * hc + t) * 4)

        cute.arch.griddepcontrol_wait()

        # 2.-3. Consume: every trip's spins, butterfly, one BF16 rounding.
        stage = prim.load_volatile_u32(stage_state + ACTIVE_STAGE * 4)
        stage_ok = stage < Uint32(LAMPORT_GENERATIONS)
        safe_stage = Int64(0)
        if stage_ok:
            safe_stage = Int64(stage)
        deadline = Int64(0)
        if cutlass.const_expr(self.budget_ns > 0):
            deadline = prim.globaltimer_ns() + self.budget_ns
        reduced_words = cute.make_rmem_tensor(cute.make_layout((trips, 4)), Uint32)
        for trip in cutlass.range_constexpr(trips):
            fragment = base + trip * self.stride
            column = Int64(fragment) * VEC_BF16
            words = cute.make_rmem_tensor(cute.make_layout((waves, 4), stride=(4, 1)), Uint32)
            words.fill(Uint32(0))
            pending = Boolean(False)
            if stage_ok & (fragment < self.fragments):
                pending = Boolean(True)
            timed_out = Boolean(False)
            while pending:
                for w in cutlass.range_constexpr(waves):
                    loaded = prim.load_volatile_u32x4(mailbox + slot_index(
                        safe_stage, self.tp, Int64(w * R + rank_lane), Int64(capacity),
                        token64, hidden, column) * 2)
                    for i in cutlass.range_constexpr(4):
                        words[w, i] = loaded[i]
                pending = Boolean(False)
                for w in cutlass.range_constexpr(waves):
                    pending = pending | prim.fragment_has_sentinel(
                        [words[w, 0], words[w, 1], words[w, 2], words[w, 3]])
                if cutlass.const_expr(self.budget_ns > 0):
                    if pending:
                        if prim.globaltimer_ns() > deadline:
                            pending = Boolean(False)
                            timed_out = Boolean(True)
            partial = cute.make_rmem_tensor(cute.make_layout((VEC_BF16,)), Float32)
            partial.fill(Float32(0.0))
            for w in cutlass.range_constexpr(waves):
                for i in cutlass.range_constexpr(4):
                    lo, hi = prim.bf16x2_to_f32x2(words[w, i])
                    partial[2 * i] = prim.add_rn_f32(partial[2 * i], lo)
                    partial[2 * i + 1] = prim.add_rn_f32(partial[2 * i + 1], hi)
            if cutlass.const_expr(self.budget_ns > 0):
                if timed_out:
                    for w in cutlass.range_constexpr(waves):
                        seen = [words[w, 0], words[w, 1], words[w, 2], words[w, 3]]
                        if prim.fragment_has_sentinel(seen):
                            self._record(error, error_records, token, w * R + rank_lane,
                                         fragment, stage, seen)
                    partial.fill(Float32(float("nan")))
            if stage >= Uint32(LAMPORT_GENERATIONS):
                partial.fill(Float32(float("nan")))
            # Lane pairs at offsets 1, 2, 4 (< R), as butterfly_rank_sum.
            for k in cutlass.range_constexpr(3):
                if cutlass.const_expr((1 << k) < R):
                    for e in cutlass.range_constexpr(VEC_BF16):
                        partial[e] = prim.add_rn_f32(partial[e], cute.arch.shuffle_sync_bfly(
                            partial[e], offset=1 << k, mask=-1, mask_and_clamp=31))
            for i in cutlass.range_constexpr(4):
                reduced_words[trip, i] = prim.f32x2_to_bf16x2_rn(partial[2 * i],
                                                                 partial[2 * i + 1])

        # 4. Next stage, dependents, sentinel write-back of the slots read.
        if (token == 0) & (crank == 0) & (tidx == 0):
            if stage_ok:
                prim.store_u32(stage_state + NEXT_STAGE * 4,
                               (stage + Uint32(1)) % Uint32(LAMPORT_GENERATIONS))
            else:
                prim.store_u32(error + ERR_BAD_STAGE * 4, stage + Uint32(1))
        cute.arch.griddepcontrol_launch_dependents()
        if stage_ok:
            for trip in cutlass.range_constexpr(trips):
                fragment = base + trip * self.stride
                if fragment < self.fragments:
                    for w in cutlass.range_constexpr(waves):
                        prim.store_sentinel_u32x4(mailbox + slot_index(
                            safe_stage, self.tp, Int64(w * R + rank_lane), Int64(capacity),
                            token64, hidden, Int64(fragment) * VEC_BF16) * 2)

        # 5.-6. Post-mix, collapse, this thread's sum of squares.
        prenorm_words = cute.make_rmem_tensor(cute.make_layout((trips, 4)), Uint32)
        prenorm_words.fill(Uint32(0))
        square = cute.make_rmem_tensor(cute.make_layout((1,)), Float32)
        square[0] = Float32(0.0)
        for trip in cutlass.range_constexpr(trips):
            fragment = base + trip * self.stride
            if (fragment < self.fragments) & leader:
                column = Int64(fragment) * VEC_BF16
                self._mix(res_words, reduced_words, prenorm_words, post_mix, comb_mix,
                          pre_mix, residual_out, token64, column, trip)
                for i in cutlass.range_constexpr(4):
                    lo, hi = prim.bf16x2_to_f32x2(prenorm_words[trip, i])
                    square[0] = prim.fma_rn_f32(lo, lo, square[0])
                    square[0] = prim.fma_rn_f32(hi, hi, square[0])

        # 7. Token sum of squares: warp, CTA, cluster (DSMEM).
        total = square[0]
        for k in cutlass.range_constexpr(5):
            total = prim.add_rn_f32(total, cute.arch.shuffle_sync_bfly(
                total, offset=1 << k, mask=-1, mask_and_clamp=31))
        smem = cutlass.memory.SmemAllocator()
        warp_sums = prim.shared_address_u32(smem.allocate_array(Float32, self.warps))
        cluster_sums = prim.shared_address_u32(smem.allocate_array(Float32, self.cluster_size))
        if lane == 0:
            prim.store_shared_f32(warp_sums + Uint32(warp * 4), total)
        cute.arch.barrier()
        cta_sum = Float32(0.0)
        for w in cutlass.range_constexpr(self.warps):
            cta_sum = prim.add_rn_f32(cta_sum, prim.load_shared_f32(warp_sums + Uint32(w * 4)))
        token_sum = cta_sum
        if cutlass.const_expr(self.cluster_size > 1):
            cute.arch.cluster_wait()  # every CTA of the cluster has started
            if tidx < self.cluster_size:
                prim.store_shared_cluster_f32(cluster_sums + Uint32(crank * 4), Uint32(tidx),
                                              cta_sum)
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
            token_sum = Float32(0.0)
            for c in cutlass.range_constexpr(self.cluster_size):
                token_sum = prim.add_rn_f32(token_sum,
                                            prim.load_shared_f32(cluster_sums + Uint32(c * 4)))

        # 8. RMSNorm of the collapse.
        inv_rms = cute.math.rsqrt(prim.add_rn_f32(token_sum / Float32(hidden), eps), fastmath=True)
        for trip in cutlass.range_constexpr(trips):
            fragment = base + trip * self.stride
            if (fragment < self.fragments) & leader:
                column = Int64(fragment) * VEC_BF16
                out = []
                for i in cutlass.range_constexpr(4):
                    v_lo, v_hi = prim.bf16x2_to_f32x2(prenorm_words[trip, i])
                    g_lo, g_hi = prim.bf16x2_to_f32x2(gamma_words[trip, i])
                    out.append(prim.f32x2_to_bf16x2_rn(
                        prim.mul_rn_f32(prim.mul_rn_f32(v_lo, inv_rms), g_lo),
                        prim.mul_rn_f32(prim.mul_rn_f32(v_hi, inv_rms), g_hi)))
                prim.store_u32x4(layer_input + (token64 * hidden + column) * 2, out)

    @cute.jit
    def _mix(self, res_words, reduced_words, prenorm_words, post_mix, comb_mix, pre_mix,
             residual_out: Int64, token64, column, trip: cutlass.Constexpr):
        """Step 5 for one fragment: store the hc post-mixed streams, leave
        the BF16 collapse in ``prenorm_words[trip]``."""
        hc, hidden = self.hc, self.hidden
        collapse = cute.make_rmem_tensor(cute.make_layout((VEC_BF16,)), Float32)
        collapse.fill(Float32(0.0))
        for t in cutlass.range_constexpr(hc):
            out = []
            for i in cutlass.range_constexpr(4):
                r_lo, r_hi = prim.bf16x2_to_f32x2(reduced_words[trip, i])
                s_lo, s_hi = prim.bf16x2_to_f32x2(res_words[trip, 0, i])
                m_lo = prim.fma_rn_f32(r_lo, post_mix[t], prim.mul_rn_f32(s_lo, comb_mix[0, t]))
                m_hi = prim.fma_rn_f32(r_hi, post_mix[t], prim.mul_rn_f32(s_hi, comb_mix[0, t]))
                for s in cutlass.range_constexpr(1, hc):
                    s_lo, s_hi = prim.bf16x2_to_f32x2(res_words[trip, s, i])
                    m_lo = prim.fma_rn_f32(s_lo, comb_mix[s, t], m_lo)
                    m_hi = prim.fma_rn_f32(s_hi, comb_mix[s, t], m_hi)
                word = prim.f32x2_to_bf16x2_rn(m_lo, m_hi)
                out.append(word)
                o_lo, o_hi = prim.bf16x2_to_f32x2(word)
                collapse[2 * i] = prim.fma_rn_f32(o_lo, pre_mix[t], collapse[2 * i])
                collapse[2 * i + 1] = prim.fma_rn_f32(o_hi, pre_mix[t], collapse[2 * i + 1])
            prim.store_u32x4(residual_out + ((token64 * hc + t) * hidden + column) * 2, out)
        for i in cutlass.range_constexpr(4):
            prenorm_words[trip, i] = prim.f32x2_to_bf16x2_rn(collapse[2 * i],
                                                             collapse[2 * i + 1])


# ---------------------------------------------------------------- compile
@dataclasses.dataclass(frozen=True)
class MHCConfig:
    """Compile-cache key of one mHC consumer build."""
    hidden: int
    tp: int
    hc: int
    cluster_size: int
    threads: int
    rank_lanes: int
    budget_ns: int = 0
    arch: str = ""  # "" = the current device / CUTE_DSL_ARCH

    @classmethod
    def from_tuning(cls, *, hidden: int, tp: int, hc: int, tuning, budget_ns: int = 0,
                    arch: str = "") -> "MHCConfig":
        return cls(hidden=hidden, tp=tp, hc=hc, cluster_size=tuning.cluster_size,
                   threads=tuning.threads, rank_lanes=tuning.rank_lanes,
                   budget_ns=int(budget_ns), arch=arch)

    def kernel(self) -> MHCKernel:
        return MHCKernel(hidden=self.hidden, tp=self.tp, hc=self.hc,
                         cluster_size=self.cluster_size, threads=self.threads,
                         rank_lanes=self.rank_lanes, budget_ns=self.budget_ns)


@persistent
def compile_mhc(config: MHCConfig, *, dump_dir: str | None = None):
    from cutlass.cute.runtime import make_fake_stream

    return cute.compile(config.kernel(), *([Int64(0)] * 10), Int32(1), Int32(1),
                        Float32(1e-6), Int32(1), make_fake_stream(),
                        options=_options(config.arch, dump_dir))


register_compiler(MHCConfig, compile_mhc)
