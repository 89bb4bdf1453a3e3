"""The single-kernel form of the one-shot AllReduceNorm: publish, Lamport
consume, residual add and RMSNorm in one launch.

The two-kernel form (:mod:`kernels.lamport.publish` then
:mod:`kernels.lamport.norm`, PDL-chained) pays two kernel launches (two
graph nodes) a call and a dependent ACTIVE_STAGE round trip in the
consumer. Here one CTA a token, ``hidden / 8`` threads, one 16-byte
fragment a thread, does both. Order inside the kernel (checked in the PTX by
:func:`kernels.ptx_checks.check_single_norm`): peer table, residual and
gamma loads, then ``griddepcontrol.wait``, the volatile NEXT_STAGE load
(every thread) and the payload load (sanitized), the stores into slot
``(stage, rank, token)`` of every peer's mailbox (``st.relaxed.sys`` a
peer, or one ``multimem.st`` to all), the first volatile load of every
peer's slot at that stage, the spins in rank order,
``griddepcontrol.launch_dependents``, the sentinel write-back, the epilogue
of :class:`kernels.lamport.norm.NormKernel` (its barrier included), then
the stage advance (:mod:`kernels.lamport.protocol`, "Single-kernel form")
by one CTA once no other CTA still has to read NEXT_STAGE and act on it.
How the CTAs agree on that is the launch's ``sync``
(:data:`kernels.lamport.protocol.SINGLE_SYNCS`, the form table's choice,
:mod:`kernels.lamport.norm_tuning`):

- ``counter`` (a plain grid): thread 0's arrival at the end of every CTA
  (``atom.acq_rel.gpu`` on ARRIVALS, after the epilogue's barrier; none
  when M = 1), and the CTA that arrived last advances. Its release waits
  for the thread's output stores, then the atomic's round trip follows.
- ``cluster`` (the grid is one cluster, M <= 16): every thread's
  ``barrier.cluster.arrive`` (release) right after its NEXT_STAGE and
  payload loads, before any store; CTA 0's thread 0 alone waits
  (``barrier.cluster.wait``, acquire) after the epilogue and advances. No
  atomic, and no wait on anyone's stores.
- ``none`` (tp = 1 and unicast, where a CTA's stage decides nothing but
  its validity): CTA 0 advances after its epilogue's barrier, as a grid of
  one CTA does; no CTA waits for another. A build for any other (tp,
  transport) runs ``none`` as ``counter``.

Unicast: a rank's own fragment is summed from registers, in its rank-order
place; its own mailbox slot is neither written nor read (so at tp=1 the
kernel moves no data through the mailbox at all). Multicast writes the own
slot too (one ``multimem.st`` reaches every rank), so it is read back and
reset like a peer's.

Same outputs bit for bit as the two-kernel form (the same rank-order FP32
sum, the same epilogue), the same watchdog (``budget_ns > 0``: records,
NaN, error masks) and bad-stage handling (NEXT_STAGE >= 3: nothing stored,
no spin, ``ERR_BAD_STAGE`` set, NaN outputs, the bad value copied into
ACTIVE_STAGE, NEXT_STAGE unchanged).

Use it only where the whole grid is resident at once and no peer's grid
can be queued behind this one on the same GPU (a CTA spins on its peers'
CTA of the same token): ranks in processes of their own, M within the
tuning's bound (:mod:`kernels.lamport.norm_tuning`).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Float32, Int32, Int64, Uint32
import cuda.bindings.driver as cuda

from kernels.validation import require_choice, require_int

from . import primitives as prim
from .norm import NormKernel
from .protocol import (ACTIVE_STAGE, ARRIVALS, ERR_BAD_STAGE, LAMPORT_GENERATIONS,
                       NEXT_STAGE, SINGLE_SYNCS, VEC_BF16)
from .publish import TRANSPORTS, load_peers, store_payload


PLANT_MAX_CYCLES = 10_000_000
"""About 5 ms at 2 GHz: far beyond any step the detection-power script plants."""

SYNC_COUNTER = SINGLE_SYNCS.index("counter")
SYNC_CLUSTER = SINGLE_SYNCS.index("cluster")
SYNC_NONE = SINGLE_SYNCS.index("none")


class SingleNormKernel(NormKernel):
    """Publish + consume + residual add + RMSNorm of ``[M, hidden]`` BF16 in
    one launch (one-shot mode only). ``destination`` at launch is what
    :class:`kernels.lamport.publish.PublishKernel` takes: the peer table
    (unicast) or the multicast base address."""

    plant_delay_cycles = 0
    """Test-only, a planted slowdown for scripts/gpu/detection_power.sh alone
    (:mod:`jobs.plant`): SM cycles every thread spins before its payload
    stores (:meth:`_plant_spin`). 0, the default and every other caller's,
    builds the kernel without a trace of it (the same PTX)."""

    def __init__(self, *, hidden: int, tp: int, budget_ns: int = 0,
                 transport: str = "unicast", plant_delay_cycles: int = 0) -> None:
        super().__init__(hidden=hidden, tp=tp, budget_ns=budget_ns)
        require_choice("transport", transport, TRANSPORTS)
        require_int("plant_delay_cycles", plant_delay_cycles, low=0, high=PLANT_MAX_CYCLES)
        self.transport = transport
        self.plant_delay_cycles = plant_delay_cycles

    @cute.jit
    def __call__(self, x: Int64, mailbox: Int64, destination: Int64, residual: Int64,
                 gamma: Int64, residual_out: Int64, norm_out: Int64, stage_state: Int64,
                 error: Int64, capacity: Int32, error_records: Int32, eps: Float32,
                 m: Int32, rank: Int32, sync: Int32, cluster: Int32,
                 stream: cuda.CUstream) -> None:
        """``sync``: the index of the agreement in
        :data:`kernels.lamport.protocol.SINGLE_SYNCS`; ``cluster``: ``m``
        for ``cluster`` (m <= :data:`kernels.lamport.norm_tuning.CLUSTER_MAX_TOKENS`),
        else 1. The caller checks both."""
        self.kernel(x, mailbox, destination, residual, gamma, residual_out, norm_out,
                    stage_state, error, capacity, error_records, eps, m, rank, sync).launch(
            grid=(m, 1, 1), block=(self.threads, 1, 1), cluster=(cluster, 1, 1),
            stream=stream, use_pdl=True)

    @cute.kernel
    def kernel(self, x: Int64, mailbox: Int64, destination: Int64, residual: Int64,
               gamma: Int64, residual_out: Int64, norm_out: Int64, stage_state: Int64,
               error: Int64, capacity: Int32, error_records: Int32, eps: Float32,
               m: Int32, rank: Int32, sync: Int32):
        hidden = self.hidden
        tidx, _, _ = cute.arch.thread_idx()
        token, _, _ = cute.arch.block_idx()
        column = Int64(tidx) * VEC_BF16
        element = Int64(token) * hidden + column

        # Written before this call's producer started (the peer table at
        # construction).
        peers = load_peers(self, destination, token)
        residual_values = prim.unpack_bf16x8(
            prim.load_u32x4(residual + element * 2)).to(Float32)
        gamma_values = prim.unpack_bf16x8(
            prim.load_u32x4(gamma + column * 2)).to(Float32)

        cute.arch.griddepcontrol_wait()

        stage = prim.load_volatile_u32(stage_state + NEXT_STAGE * 4)
        payload = prim.sanitize_u32x4(prim.load_u32x4(x + element * 2))
        reduced, failed = self._publish_and_consume(
            payload, stage, peers, mailbox, destination, stage_state, error, capacity,
            error_records, rank, sync, token, tidx, column)
        self._epilogue(reduced, failed, residual_values, gamma_values, residual_out,
                       norm_out, element, eps)
        self._advance(stage, stage_state, error, m, sync, token, tidx)

    @cute.jit
    def _publish_and_consume(self, payload, stage, peers, mailbox: Int64, destination: Int64,
                             stage_state: Int64, error: Int64, capacity: Int32,
                             error_records: Int32, rank: Int32, sync: Int32, token, tidx,
                             column):
        """What every single-kernel form does between its NEXT_STAGE read
        (``stage``) with its sanitized ``payload`` (4 words) and its
        epilogue: the cluster arrive (``sync`` the cluster barrier), the
        stores, the consume. Returns ``(reduced, failed)`` as
        :meth:`NormKernel._consume` leaves them; the caller's epilogue
        follows, then :meth:`_advance`."""
        hidden = self.hidden
        stage_ok = stage < Uint32(LAMPORT_GENERATIONS)
        if sync == Int32(SYNC_CLUSTER):
            # Release: this thread's NEXT_STAGE read happens before CTA 0's
            # advance. Only loads precede it (the payload's included: the
            # stores need it).
            cute.arch.cluster_arrive()

        # Unicast: this rank's own fragment never goes through its mailbox
        # (summed from registers); multicast stores it there too, so it is
        # read back and reset like a peer's.
        unicast = self.transport == "unicast"
        if cutlass.const_expr(self.plant_delay_cycles > 0):
            self._plant_spin()
        store_payload(self, payload, stage, stage_ok, peers, destination, rank, capacity,
                      token, Int64(hidden), column, skip_own=unicast)
        reduced = cute.make_rmem_tensor(cute.make_layout((VEC_BF16,)), Float32)
        failed = self._consume(mailbox, stage_state, error, capacity, error_records,
                               token, tidx, column, reduced, Int64(0), stage=stage,
                               own=payload if unicast else None, rank=rank)
        return reduced, failed

    @cute.jit
    def _plant_spin(self) -> None:
        """Spin :attr:`plant_delay_cycles` SM cycles (a planted slowdown).

        ``%clock64``, not ``%globaltimer``: the global timer ticks about once
        a microsecond on these GPUs (:func:`kernels.lamport.primitives.globaltimer_ns`),
        coarser than the whole kernel (2-4 us) and 30-100 times coarser than
        a 1-3 % step, so a wait on it would be 0 or about 1 us depending on
        where in a tick the thread starts. ``%clock64`` counts every SM cycle
        (0.5 ns at 2 GHz), so the wait is exact in cycles; in ns it is cycles
        / SM clock, which the caller fixes from the SM clock the rows
        recorded (:mod:`jobs.plant`); the measured step (``python -m
        jobs.power``) shows what it came to.
        """
        start = prim.clock64()
        waiting = Boolean(True)
        while waiting:
            waiting = prim.clock64() - start < Int64(self.plant_delay_cycles)

    @cute.jit
    def _advance(self, stage, stage_state: Int64, error: Int64, m: Int32, sync: Int32, token,
                 tidx) -> None:
        """The stage advance by the agreement ``sync``, after the epilogue's
        barrier (see the module docstring)."""
        stage_ok = stage < Uint32(LAMPORT_GENERATIONS)
        clustered = sync == Int32(SYNC_CLUSTER)
        counted = sync == Int32(SYNC_COUNTER)
        if cutlass.const_expr(not (self.tp == 1 and self.transport == "unicast")):
            # ``none`` only where a late CTA may act on an advanced stage
            # unharmed; anywhere else it runs as ``counter``.
            counted = sync != Int32(SYNC_CLUSTER)

        # After the epilogue's barrier every thread of this CTA has read
        # NEXT_STAGE, so the CTA that arrives last may advance it; a grid of
        # one CTA is the last without asking (the barrier orders its reads).
        # In a cluster, CTA 0 advances once every thread of the cluster has
        # arrived (the others exit without waiting); with ``none``, CTA 0
        # advances without asking.
        if tidx == 0:
            arrived = Uint32(0)
            if clustered:
                if token == 0:
                    cute.arch.cluster_wait()
                    arrived = Uint32(m - 1)
                else:
                    arrived = Uint32(m)  # never the last
            elif counted:
                if m > Int32(1):
                    arrived = prim.atomic_add_acq_rel_u32(stage_state + ARRIVALS * 4,
                                                          Uint32(1))
            else:
                arrived = Uint32(m)
                if token == 0:
                    arrived = Uint32(m - 1)
            if arrived == Uint32(m - 1):
                prim.store_u32(stage_state + ACTIVE_STAGE * 4, stage)
                if stage_ok:
                    prim.store_u32(stage_state + NEXT_STAGE * 4,
                                   (stage + Uint32(1)) % Uint32(LAMPORT_GENERATIONS))
                else:
                    prim.store_u32(error + ERR_BAD_STAGE * 4, stage + Uint32(1))
                if counted:
                    prim.store_u32(stage_state + ARRIVALS * 4, Uint32(0))

