"""The plain Lamport publish kernel: rank ``rank`` stores its ``[M, hidden]``
BF16 partial into slot ``[stage, rank, token, :]`` of every rank's mailbox.

Grid ``(ceil(hidden / 8 / 128), M)``, 128 threads, 8 BF16 (one 16-byte
fragment) a thread; the last CTA of a token may be partial (hidden 2560,
3584) and its surplus threads store nothing. ``rank``, ``capacity``,
``hidden`` and ``M`` are runtime arguments, so one compile serves every rank
and hidden size; ``tp`` is compile-time so the unicast peer table lives in
registers.

Stage bounds check: when ``NEXT_STAGE >= LAMPORT_GENERATIONS`` (corrupt
state) nothing is stored through the peer table / multicast address, block
(0, 0) thread 0 writes ``error[ERR_BAD_STAGE] = stage + 1`` and copies the
bad value into ACTIVE_STAGE, so this rank's consumer sees it, records it and
writes NaN without spinning; the other ranks' consumers see this rank as
missing (their watchdog names it).

Owner mode (``owner=True``, compile time; unicast only, see
:mod:`kernels.lamport.protocol`): the grid covers ``max(M, tp)`` tokens;
token ``t`` goes only to its owner ``t % tp`` (peer address loaded from the
table before ``griddepcontrol.wait``), into slot ``(stage, rank, t // tp)``
of a mailbox with ``capacity`` = the owner capacity; tokens ``t >= M``
publish +0.0 without loading ``x``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32
import cuda.bindings.driver as cuda

from kernels.validation import require_tp

from . import primitives as prim
from .protocol import (ACTIVE_STAGE, ERR_BAD_STAGE, LAMPORT_GENERATIONS,
                       NEXT_STAGE, VEC_BF16, owner_slot_index, slot_index)

PUBLISH_THREADS = 128
TRANSPORTS = ("unicast", "multicast")


def check_owner_transport(owner: bool, transport: str) -> None:
    """Owner mode is unicast by nature (one destination a token)."""
    if owner and transport != "unicast":
        raise ValueError(f"mode='owner' sends every token to one rank (unicast by nature): "
                         f"transport must be 'unicast', got {transport!r}")


def publish_grid_tokens(kernel, m):
    """Grid rows of a publish (in ``@cute.jit`` code): M, or ``max(M, tp)``
    in owner mode (:func:`kernels.lamport.protocol.owner_published_tokens`)."""
    if not kernel.owner:
        return m
    return cutlass.max(m, Int32(kernel.tp))


def publish_ctas_per_token(hidden: int) -> int:
    per_cta = VEC_BF16 * PUBLISH_THREADS
    return (hidden + per_cta - 1) // per_cta


class PublishKernel:
    """Publish of a plain ``[M, hidden]`` BF16 tensor.

    ``destination`` at launch: for ``unicast`` the address of a device
    int64[tp] table of every rank's mailbox base address; for ``multicast``
    the multicast base address of the mailbox.
    """

    def __init__(self, *, tp: int, transport: str = "unicast", owner: bool = False) -> None:
        require_tp("tp", tp)
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
        check_owner_transport(owner, transport)
        self.tp = tp
        self.transport = transport
        self.owner = bool(owner)
        self.threads = PUBLISH_THREADS

    @cute.jit
    def __call__(self, x: Int64, stage_state: Int64, destination: Int64,
                 error: Int64, rank: Int32, capacity: Int32, hidden: Int32,
                 ctas_per_token: Int32, m: Int32, stream: cuda.CUstream) -> None:
        self.kernel(x, stage_state, destination, error, rank, capacity,
                    hidden, m).launch(grid=(ctas_per_token, publish_grid_tokens(self, m), 1),
                                      block=(self.threads, 1, 1),
                                      stream=stream, use_pdl=True)

    @cute.kernel
    def kernel(self, x: Int64, stage_state: Int64, destination: Int64,
               error: Int64, rank: Int32, capacity: Int32, hidden: Int32, m: Int32):
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
            if cutlass.const_expr(self.owner):
                # Tokens M .. tp-1 (M < tp) carry +0.0 and load nothing.
                words = cute.make_rmem_tensor(cute.make_layout((4,)), Uint32)
                words.fill(Uint32(0))
                if token < m:
                    loaded = prim.sanitize_u32x4(
                        prim.load_u32x4(x + (Int64(token) * hidden64 + column) * 2))
                    for i in cutlass.range_constexpr(4):
                        words[i] = loaded[i]
                payload = [words[i] for i in range(4)]
            else:
                payload = prim.sanitize_u32x4(
                    prim.load_u32x4(x + (Int64(token) * hidden64 + column) * 2))
            store_payload(self, payload, stage, stage_ok, peers, destination, rank, capacity,
                          token, hidden64, column)
        record_stage(stage, stage_ok, stage_state, error, (cta == 0) & (token == 0) & (tidx == 0))


@cute.jit
def load_peers(kernel, destination: Int64, token) -> list:
    """The peer table a publish stores through (see :func:`store_payload`),
    loaded into registers. The table is written once, at construction, so
    every publish loads it before ``griddepcontrol.wait`` and before its
    store loop: tp addresses in unicast, the owner of ``token`` alone in
    owner mode, none in multicast (``destination`` is the address)."""
    peers = []
    if cutlass.const_expr(kernel.owner):
        peers.append(prim.load_u64(destination + Int64(token % kernel.tp) * 8))
    elif cutlass.const_expr(kernel.transport == "unicast"):
        for p in cutlass.range_constexpr(kernel.tp):
            peers.append(prim.load_u64(destination + p * 8))
    return peers


@cute.jit
def store_payload(kernel, payload, stage, stage_ok, peers, destination: Int64, rank: Int32,
                  capacity: Int32, token, hidden64: Int64, column: Int64,
                  skip_own: bool = False) -> None:
    """The publish's stores, shared by every publish kernel: ``payload``
    (4 words, one 16-byte fragment, or 2, its half) goes to slot ``(stage,
    rank, token)`` of every rank's mailbox, or, owner mode, to slot ``(stage,
    rank, token // tp)`` of the owner's only; nothing where ``stage_ok`` is
    False. ``kernel`` supplies ``tp``, ``transport`` and ``owner`` (compile
    time); ``peers`` is the peer table loaded from ``destination`` in
    unicast and owner mode (the owner's address alone in owner mode);
    multicast stores through ``destination`` itself. Stores are
    ``st.relaxed.sys`` a peer or one ``multimem.st``
    (:mod:`kernels.lamport.protocol`). ``skip_own`` (compile time, unicast
    one-shot): no store into this rank's own mailbox (a caller that sums
    its own fragment from registers)."""
    if stage_ok:
        if cutlass.const_expr(kernel.owner):
            offset = owner_slot_index(Int64(stage), kernel.tp, Int64(rank), Int64(capacity),
                                      Int64(token), hidden64, column) * 2
            _store_unicast(peers[0] + offset, payload)
        else:
            offset = slot_index(Int64(stage), kernel.tp, Int64(rank), Int64(capacity),
                                Int64(token), hidden64, column) * 2
            if cutlass.const_expr(kernel.transport == "unicast"):
                for p in cutlass.range_constexpr(kernel.tp):
                    if cutlass.const_expr(not skip_own):
                        _store_unicast(peers[p] + offset, payload)
                    elif rank != Int32(p):
                        _store_unicast(peers[p] + offset, payload)
            else:
                _store_multicast(destination + offset, payload)


@cute.jit
def record_stage(stage, stage_ok, stage_state: Int64, error: Int64, first) -> None:
    """The end of every publish, by one thread (``first``): the stage it
    published at into ACTIVE_STAGE for this rank's consumer, and a stage out
    of range (``stage_ok`` False) into ``error[ERR_BAD_STAGE]`` as
    ``stage + 1`` (see the module docstring)."""
    if first:
        prim.store_u32(stage_state + ACTIVE_STAGE * 4, stage)
        if not stage_ok:
            prim.store_u32(error + ERR_BAD_STAGE * 4, stage + Uint32(1))


def _store_unicast(address, words):
    if len(words) == 4:
        prim.store_relaxed_sys_u32x4(address, words)
    else:
        prim.store_relaxed_sys_u32x2(address, words)


def _store_multicast(address, words):
    if len(words) == 4:
        prim.store_multicast_bf16x8(address, words)
    else:
        prim.store_multicast_bf16x4(address, words)
