"""The Lamport consumer fused with residual add and RMSNorm.

One CTA a token, ``hidden / 8`` threads, one 16-byte fragment a thread.
Order inside the kernel (checked in the PTX by ``jobs.compile_check``):
residual and gamma loads and the stage hint (NEXT_STAGE), then
``griddepcontrol.wait``, the volatile ACTIVE_STAGE load with a first
volatile load of every source's slot at the hinted stage right behind it
(all in flight at once), one spin per source rank in rank order on those
that still hold a sentinel lane (or were loaded at a stage other than
ACTIVE_STAGE), NEXT_STAGE store (token 0 thread 0),
``griddepcontrol.launch_dependents``, sentinel write-back of the slots
read, then the epilogue: ``sum`` rounded once to BF16,
``residual_out = BF16(sum + residual)``, ``norm_out = BF16(residual_out *
rsqrt(mean(residual_out^2) + eps) * gamma)`` with the mean reduced by warp
shuffles and shared memory.

Watchdog variant (``budget_ns > 0``, compile time): each thread's spins
share one deadline, ``%globaltimer`` at the first spin + ``budget_ns``.
A fragment still holding a sentinel lane at the deadline is given up:
the thread appends a record (token, source rank, fragment index, stage, the
4 words seen) to the error buffer (``ERR_COUNT`` is the atomic append
counter; records past the capacity are counted but not written), sets the
source's bit in ``ERR_MISSING_MASK`` (all lanes sentinel) or
``ERR_UNSANITIZED_MASK`` (some lanes written: an unsanitized -0.0), and
continues with NaN as its sum. It still passes the block barrier, writes
the sentinel back and writes its outputs: NaN in its residual_out fragment
and, through the reduction, NaN in the token's whole norm_out row.

Owner mode (``owner=True``, compile time; :mod:`kernels.lamport.protocol`):
the grid is ``ceil(M / tp)`` CTAs, CTA ``j`` of rank ``rank`` computes token
``t = j * tp + rank`` from mailbox row ``j`` of every source (a mailbox of
``capacity`` = the owner capacity rows). ``residual``, ``residual_out`` and
``norm_out`` are ``[ceil(M / tp), hidden]`` (row ``j`` = token ``j * tp +
rank``). A row with ``t >= M`` holds no token: it spins only when it is row 0
(then every source published +0.0 there, keeping the stage rotation in
lockstep), skips its residual and writes +0.0 (NaN if its spin timed out).
NEXT_STAGE is written by CTA 0, which every owner has.

An ACTIVE_STAGE >= 3 (corrupt, or copied there by publish's bounds check)
is never used as an address: no spin, no sentinel write-back,
``ERR_BAD_STAGE`` set, NaN outputs, NEXT_STAGE left unchanged. This holds in
the plain variant too.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Float32, Int32, Int64, Uint32
import cuda.bindings.driver as cuda

from kernels.validation import norm_threads, require_int, require_tp

from . import primitives as prim
from .protocol import (ACTIVE_STAGE, ERR_BAD_STAGE, ERR_COUNT,
                       ERR_HEADER_WORDS, ERR_MISSING_MASK, ERR_RECORD_WORDS,
                       ERR_UNSANITIZED_MASK, LAMPORT_GENERATIONS, MAX_THREADS,
                       NEXT_STAGE, VEC_BF16, WARP_SIZE, slot_index)


class NormKernel:
    """Lamport consume + residual add + RMSNorm for ``[M, hidden]``."""

    def __init__(self, *, hidden: int, tp: int, budget_ns: int = 0,
                 owner: bool = False) -> None:
        require_tp("tp", tp)
        require_int("budget_ns", budget_ns, low=0)
        self.hidden = hidden
        self.tp = tp
        self.budget_ns = int(budget_ns)
        self.owner = bool(owner)
        self.threads = norm_threads(hidden)
        self.warps = self.threads // WARP_SIZE

    @cute.jit
    def __call__(self, mailbox: Int64, residual: Int64, gamma: Int64,
                 residual_out: Int64, norm_out: Int64, stage_state: Int64,
                 error: Int64, capacity: Int32, error_records: Int32,
                 eps: Float32, m: Int32, rank: Int32, stream: cuda.CUstream) -> None:
        rows = m
        if cutlass.const_expr(self.owner):
            rows = (m + Int32(self.tp - 1)) // Int32(self.tp)
        self.kernel(mailbox, residual, gamma, residual_out, norm_out,
                    stage_state, error, capacity, error_records, eps, m, rank).launch(
            grid=(rows, 1, 1), block=(self.threads, 1, 1), stream=stream,
            use_pdl=True)

    @cute.kernel
    def kernel(self, mailbox: Int64, residual: Int64, gamma: Int64,
               residual_out: Int64, norm_out: Int64, stage_state: Int64,
               error: Int64, capacity: Int32, error_records: Int32,
               eps: Float32, m: Int32, rank: Int32):
        hidden = self.hidden
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()  # the token, or the owned row in owner mode
        column = Int64(tidx) * VEC_BF16
        element = Int64(row) * hidden + column

        # Written before the producer of this call's publish started.
        residual_values = prim.unpack_bf16x8(
            prim.load_u32x4(residual + element * 2)).to(Float32)
        gamma_values = prim.unpack_bf16x8(
            prim.load_u32x4(gamma + column * 2)).to(Float32)
        hint = self._stage_hint(stage_state)

        cute.arch.griddepcontrol_wait()

        reduced = cute.make_rmem_tensor(cute.make_layout((VEC_BF16,)), Float32)
        if cutlass.const_expr(self.owner):
            token = row * Int32(self.tp) + rank
            valid = token < m
            owned = cute.make_rmem_tensor(cute.make_layout((VEC_BF16,)), Float32)
            owned.store(residual_values)
            failed = self._consume(mailbox, stage_state, error, capacity, error_records,
                                   row, tidx, column, reduced, hint, token, valid | (row == 0))
            if not valid:
                owned.fill(Float32(0.0))
            residual_values = owned.load()
        else:
            failed = self._consume(mailbox, stage_state, error, capacity, error_records,
                                   row, tidx, column, reduced, hint)

        self._epilogue(reduced, failed, residual_values, gamma_values, residual_out,
                       norm_out, element, eps)

    @cute.jit
    def _epilogue(self, reduced, failed, residual_values, gamma_values, residual_out: Int64,
                  norm_out: Int64, element, eps: Float32, smem=None):
        """Step 5, shared by the consumer kernels of this class and its
        subclasses: ``sum`` (``reduced``, NaN where ``failed``) rounded once
        to BF16, ``+ residual``, stored as ``residual_out``; RMSNorm of that
        row (warp shuffles, then the warps' sums through shared memory and
        one barrier) times gamma, stored as ``norm_out``. ``smem``: the
        kernel's ``SmemAllocator`` when it allocates shared memory of its
        own (the warps' sums then go after that)."""
        hidden = self.hidden
        lane = cute.arch.lane_idx()
        warp = cute.arch.warp_idx()
        if failed:
            reduced.fill(Float32(float("nan")))
        # The all-reduced value is BF16, as the collective returns it.
        summed = (reduced.load().to(cutlass.BFloat16).to(Float32)
                  + residual_values).to(cutlass.BFloat16)
        prim.store_u32x4(residual_out + element * 2, prim.pack_bf16x8(summed))
        values = summed.to(Float32)
        square = (values * values).reduce(cute.ReductionOp.ADD,
                                          init_val=Float32(0.0),
                                          reduction_profile=0)
        for offset in cutlass.range_constexpr(5):
            square = square + cute.arch.shuffle_sync_bfly(
                square, offset=1 << offset, mask=-1, mask_and_clamp=31)
        if cutlass.const_expr(smem is None):
            smem = cutlass.memory.SmemAllocator()
        warp_sums = smem.allocate_array(Float32, self.warps)
        if lane == 0:
            cute.arch.store((warp_sums + warp).llvm_ptr, square)
        cute.arch.barrier()
        total = Float32(0.0)
        for w in cutlass.range_constexpr(self.warps):
            total = total + cute.arch.load((warp_sums + w).llvm_ptr, Float32)
        inv_rms = cute.math.rsqrt(total / Float32(hidden) + eps, fastmath=True)
        prim.store_u32x4(norm_out + element * 2, prim.pack_bf16x8(
            (values * inv_rms * gamma_values).to(cutlass.BFloat16)))

    @cute.jit
    def _stage_hint(self, stage_state: Int64) -> Int64:
        """NEXT_STAGE read before ``griddepcontrol.wait``, clamped to a valid
        stage: the stage this call's publish is writing in every ordinary
        case (the previous consumer wrote it and finished before that
        publish passed its own wait). Only an address guess for the first
        loads of :meth:`_consume`; ACTIVE_STAGE, read after the wait, decides."""
        hint = prim.load_volatile_u32(stage_state + NEXT_STAGE * 4)
        hint_stage = Int64(0)
        if hint < Uint32(LAMPORT_GENERATIONS):
            hint_stage = Int64(hint)
        return hint_stage

    @cute.jit
    def _consume(self, mailbox: Int64, stage_state: Int64, error: Int64,
                 capacity: Int32, error_records: Int32, token, tidx, column,
                 reduced, hint_stage, record_token=None, active=None,
                 stage=None, own=None, rank=None) -> Boolean:
        """The Lamport consume of one fragment (steps 1-4 of the protocol),
        shared by every consumer kernel: volatile ACTIVE_STAGE load (bounds
        checked) issued together with a first volatile load of every
        source's slot at ``hint_stage`` (:meth:`_stage_hint`), then, in rank
        order, a spin on each source whose first load still held a sentinel
        lane or was made at another stage (watchdog deadline in the watchdog
        variant), summed into ``reduced`` (FP32 rmem [8]) in rank order,
        NEXT_STAGE store (token 0 thread 0), ``launch_dependents``, sentinel
        write-back. Call it right after ``griddepcontrol.wait``. Returns
        True where the fragment could not be computed (timeout or bad stage);
        the caller writes NaN then.

        ``token`` is the mailbox row (the token itself outside owner mode);
        owner mode passes the token id for the error record
        (``record_token``) and ``active``, False for a row nobody published
        (no spin, no sentinel write-back, ``reduced`` stays +0.0).

        ``stage`` given (the single-kernel form, which read it itself and
        advances it itself): no ACTIVE_STAGE load, the first loads at that
        stage (``hint_stage`` unused), no NEXT_STAGE store. ``own`` (the
        sanitized payload words this thread published itself, with
        ``rank``): source ``rank``'s fragment is taken from them, its slot
        neither read nor reset (the publish did not write it)."""
        hidden = self.hidden
        known = stage is not None
        if cutlass.const_expr(known):
            hint_stage = Int64(0)
            if stage < Uint32(LAMPORT_GENERATIONS):
                hint_stage = Int64(stage)
        else:
            stage = prim.load_volatile_u32(stage_state + ACTIVE_STAGE * 4)
        # First load of every source at once, at the hinted stage, so that
        # the stage load and all of them are in flight together: one memory
        # round trip after the wait instead of 1 + tp dependent ones.
        first = []
        for source in cutlass.range_constexpr(self.tp):
            where = mailbox + slot_index(hint_stage, self.tp, source, Int64(capacity),
                                         Int64(token), hidden, column) * 2
            if cutlass.const_expr(own is None):
                first.append(prim.load_volatile_u32x4(where))
            else:
                f0, f1, f2, f3 = own[0], own[1], own[2], own[3]
                if rank != Int32(source):
                    f0, f1, f2, f3 = prim.load_volatile_u32x4(where)
                first.append([f0, f1, f2, f3])
        stage_ok = stage < Uint32(LAMPORT_GENERATIONS)
        safe_stage = Int64(0)
        if stage_ok:
            safe_stage = Int64(stage)
        failed = Boolean(True)
        if stage_ok:
            failed = Boolean(False)
        reading = stage_ok
        if cutlass.const_expr(active is not None):
            reading = stage_ok & active
        if cutlass.const_expr(record_token is None):
            record_token = token
        hint_missed = Boolean(False)
        if cutlass.const_expr(not known):
            hint_missed = safe_stage != hint_stage

        reduced.fill(0.0)
        deadline = Int64(0)
        if cutlass.const_expr(self.budget_ns > 0):
            deadline = prim.globaltimer_ns() + self.budget_ns
        for source in cutlass.range_constexpr(self.tp):
            address = mailbox + slot_index(safe_stage, self.tp, source,
                                           Int64(capacity), Int64(token),
                                           hidden, column) * 2
            w0, w1, w2, w3 = first[source]
            pending = reading & (hint_missed | prim.fragment_has_sentinel([w0, w1, w2, w3]))
            if not reading:
                w0, w1, w2, w3 = Uint32(0), Uint32(0), Uint32(0), Uint32(0)
            timed_out = Boolean(False)
            while pending:
                w0, w1, w2, w3 = prim.load_volatile_u32x4(address)
                pending = prim.fragment_has_sentinel([w0, w1, w2, w3])
                if cutlass.const_expr(self.budget_ns > 0):
                    if pending:
                        if prim.globaltimer_ns() > deadline:
                            pending = Boolean(False)
                            timed_out = Boolean(True)
            if cutlass.const_expr(self.budget_ns > 0):
                if timed_out:
                    failed = Boolean(True)
                    self._record(error, error_records, record_token, source, tidx,
                                 stage, [w0, w1, w2, w3])
            reduced.store(reduced.load()
                          + prim.unpack_bf16x8([w0, w1, w2, w3]).to(Float32))

        if cutlass.const_expr(not known):
            if (token == 0) & (tidx == 0):
                if stage_ok:
                    prim.store_u32(stage_state + NEXT_STAGE * 4,
                                   (stage + Uint32(1)) % Uint32(LAMPORT_GENERATIONS))
                else:
                    prim.store_u32(error + ERR_BAD_STAGE * 4, stage + Uint32(1))
        cute.arch.griddepcontrol_launch_dependents()
        if reading:
            for source in cutlass.range_constexpr(self.tp):
                where = mailbox + slot_index(safe_stage, self.tp, source, Int64(capacity),
                                             Int64(token), hidden, column) * 2
                if cutlass.const_expr(own is None):
                    prim.store_sentinel_u32x4(where)
                elif rank != Int32(source):
                    prim.store_sentinel_u32x4(where)
        return failed

    @cute.jit
    def _record(self, error: Int64, error_records: Int32, token, source,
                fragment, stage, words):
        """Append one timeout record; classify missing vs unsanitized."""
        if prim.fragment_all_sentinel(words):
            prim.atomic_or_u32(error + ERR_MISSING_MASK * 4, Uint32(1 << source))
        else:
            prim.atomic_or_u32(error + ERR_UNSANITIZED_MASK * 4, Uint32(1 << source))
        index = prim.atomic_add_u32(error + ERR_COUNT * 4, Uint32(1))
        if index < Uint32(error_records):
            base = error + (Int64(ERR_HEADER_WORDS)
                            + Int64(index) * ERR_RECORD_WORDS) * 4
            fields = [Uint32(token), Uint32(source), Uint32(fragment), stage,
                      words[0], words[1], words[2], words[3]]
            for i in cutlass.range_constexpr(ERR_RECORD_WORDS):
                prim.store_u32(base + i * 4, fields[i])
