"""Device primitives of the indexer kernels: mma.sync, DSMEM, FP8 packing.

Every op goes through the project's one inline-asm helper,
:func:`kernels.lamport.primitives._inline_asm` (no copy of it here). Global
addresses are generic 64-bit ``Int64``; shared addresses are 32-bit
``shared::cta`` offsets (:func:`shared_address`).

Memory ordering:
- :func:`load_weight_u32x4` is a non-coherent streaming load
  (``ld.global.nc.L1::no_allocate``): the weights never change while a kernel
  runs, so it may be issued before ``griddepcontrol.wait``; it is marked
  side-effecting so the compiler keeps it there (no memory clobber);
- the plain global loads/stores are weak, ordered by kernel boundaries and
  ``griddepcontrol.wait`` (side-effecting so they stay on their side of it);
- :func:`load_cluster_f32` reads a peer CTA's shared memory; it is ordered by
  the cluster barrier (``barrier.cluster.arrive`` has release, ``wait``
  acquire semantics by default) that precedes it;
- :func:`store_async_cluster_f32x2` is ``st.async`` with
  ``mbarrier::complete_tx::bytes``: the bytes land in the peer's shared
  memory and complete that many transaction bytes on the peer's mbarrier,
  whose phase completion (``mbarrier.try_wait``, acquire) makes them visible.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from kernels.lamport.primitives import (  # noqa: F401  (shared ops, re-exported)
    _f32, _i64, _inline_asm, _u32, add_rn_f32, globaltimer_ns, load_f32, load_shared_f32,
    load_u32x2, load_volatile_u32, mul_rn_f32, store_shared_f32)

from .layout import MAILBOX_DEADLINE_NS, MAILBOX_NAN, MAILBOX_SENTINEL


def _pure(results, operands, asm, constraints, *, loc=None, ip=None):
    """Arithmetic: no side effects, no memory clobber (free to schedule)."""
    return _inline_asm(results, operands, asm, constraints, side_effects=False,
                       clobber_memory=False, loc=loc, ip=ip)


# ---------------------------------------------------------------- global loads
@dsl_user_op
def load_weight_u32x4(address: Int64, *, loc=None, ip=None):
    """16-byte weight load, ``ld.global.nc.L1::no_allocate.v4.u32``: read-only
    for the whole kernel, streamed past L1. Allowed before the PDL wait."""
    words = _inline_asm([T.i32()] * 4, [_i64(address, loc, ip)],
                        "ld.global.nc.L1::no_allocate.v4.u32 {$0, $1, $2, $3}, [$4];",
                        "=r,=r,=r,=r,l", clobber_memory=False, loc=loc, ip=ip)
    return [Uint32(w) for w in words]


@dsl_user_op
def load_weight_u32x4_if(address: Int64, live, *, loc=None, ip=None):
    """:func:`load_weight_u32x4` predicated on ``live`` != 0 (Int32); four
    zero words where it is 0 (no memory access: a zero weight row)."""
    words = _inline_asm([T.i32()] * 4, [_i64(address, loc, ip), _u32(live, loc, ip)],
                        "{\n\t.reg .pred p;\n\tsetp.ne.u32 p, $5, 0;\n\t"
                        "mov.b32 $0, 0;\n\tmov.b32 $1, 0;\n\tmov.b32 $2, 0;\n\tmov.b32 $3, 0;\n\t"
                        "@p ld.global.nc.L1::no_allocate.v4.u32 {$0, $1, $2, $3}, [$4];\n\t}",
                        "=r,=r,=r,=r,l,r", clobber_memory=False, loc=loc, ip=ip)
    return [Uint32(w) for w in words]


@dsl_user_op
def load_const_u32(address: Int64, *, loc=None, ip=None) -> Uint32:
    """4-byte load of a constant parameter, ``ld.global.nc.u32``: read-only
    for the whole kernel, so allowed before the PDL wait."""
    (w,) = _inline_asm([T.i32()], [_i64(address, loc, ip)], "ld.global.nc.u32 $0, [$1];",
                       "=r,l", clobber_memory=False, loc=loc, ip=ip)
    return Uint32(w)


@dsl_user_op
def load_const_f32(address: Int64, *, loc=None, ip=None) -> Float32:
    """FP32 :func:`load_const_u32` (``ld.global.nc.f32``)."""
    (v,) = _inline_asm([T.f32()], [_i64(address, loc, ip)], "ld.global.nc.f32 $0, [$1];",
                       "=f,l", clobber_memory=False, loc=loc, ip=ip)
    return Float32(v)


@dsl_user_op
def load_u32(address: Int64, *, loc=None, ip=None) -> Uint32:
    """Plain 4-byte load (``ld.global.u32``)."""
    (w,) = _inline_asm([T.i32()], [_i64(address, loc, ip)], "ld.global.u32 $0, [$1];",
                       "=r,l", clobber_memory=False, loc=loc, ip=ip)
    return Uint32(w)


# ---------------------------------------------------------------- global stores
@dsl_user_op
def store_bf16(address: Int64, value, *, loc=None, ip=None) -> None:
    """Round FP32 ``value`` to BF16 (nearest-even) and store 2 bytes; weak."""
    _inline_asm([], [_i64(address, loc, ip), _f32(value, loc, ip)],
                "{\n\t.reg .b16 h;\n\tcvt.rn.bf16.f32 h, $1;\n\tst.global.b16 [$0], h;\n\t}",
                "l,f", clobber_memory=False, loc=loc, ip=ip)


@dsl_user_op
def store_f32(address: Int64, value, *, loc=None, ip=None) -> None:
    """Plain 4-byte FP32 store (``st.global.f32``); weak."""
    _inline_asm([], [_i64(address, loc, ip), _f32(value, loc, ip)],
                "st.global.f32 [$0], $1;", "l,f", clobber_memory=False, loc=loc, ip=ip)


@dsl_user_op
def store_b32(address: Int64, word, *, loc=None, ip=None) -> None:
    """Plain 4-byte store (``st.global.b32``); weak."""
    _inline_asm([], [_i64(address, loc, ip), _u32(word, loc, ip)],
                "st.global.b32 [$0], $1;", "l,r", clobber_memory=False, loc=loc, ip=ip)


# ---------------------------------------------------------------- arithmetic
@dsl_user_op
def mma_bf16_m16n8k16(a, b, c, *, loc=None, ip=None):
    """``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32``: ``d = a @ b +
    c`` for one warp; ``a`` 4 words (rows g, g + 8; k pairs), ``b`` 2 words,
    ``c`` 4 FP32 (rows g, g + 8; columns 2q, 2q + 1). Returns 4 FP32."""
    ops = ([_u32(w, loc, ip) for w in a] + [_u32(w, loc, ip) for w in b]
           + [_f32(v, loc, ip) for v in c])
    out = _pure([T.f32()] * 4, ops,
                "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
                "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", loc=loc, ip=ip)
    return [Float32(v) for v in out]


@dsl_user_op
def round_bf16(value, *, loc=None, ip=None) -> Float32:
    """FP32 -> BF16 (nearest-even) -> FP32."""
    (v,) = _pure([T.f32()], [_f32(value, loc, ip)],
                 "{\n\t.reg .b16 h;\n\tcvt.rn.bf16.f32 h, $1;\n\tcvt.f32.bf16 $0, h;\n\t}",
                 "=f,f", loc=loc, ip=ip)
    return Float32(v)


@dsl_user_op
def bf16x2_to_f32(word, *, loc=None, ip=None):
    """The two BF16 lanes of a word as FP32 (low lane first)."""
    lo, hi = _pure([T.f32()] * 2, [_u32(word, loc, ip)],
                   "{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, $2;\n\t"
                   "cvt.f32.bf16 $0, l;\n\tcvt.f32.bf16 $1, h;\n\t}",
                   "=f,=f,r", loc=loc, ip=ip)
    return Float32(lo), Float32(hi)


@dsl_user_op
def sub_rn_f32(a, b, *, loc=None, ip=None) -> Float32:
    """``sub.rn.f32`` (IEEE, no FTZ, never contracted into an FMA)."""
    (v,) = _pure([T.f32()], [_f32(a, loc, ip), _f32(b, loc, ip)],
                 "sub.rn.f32 $0, $1, $2;", "=f,f,f", loc=loc, ip=ip)
    return Float32(v)


@dsl_user_op
def div_rn_f32(a, b, *, loc=None, ip=None) -> Float32:
    """``div.rn.f32`` (IEEE division)."""
    (v,) = _pure([T.f32()], [_f32(a, loc, ip), _f32(b, loc, ip)],
                 "div.rn.f32 $0, $1, $2;", "=f,f,f", loc=loc, ip=ip)
    return Float32(v)


@dsl_user_op
def rsqrt_f32(a, *, loc=None, ip=None) -> Float32:
    """``rsqrt.approx.f32`` (max 2 ulp of FP32; the key is held to 1 BF16 ULP)."""
    (v,) = _pure([T.f32()], [_f32(a, loc, ip)], "rsqrt.approx.f32 $0, $1;", "=f,f",
                 loc=loc, ip=ip)
    return Float32(v)


@dsl_user_op
def pow2_ceil_f32(s, *, loc=None, ip=None):
    """``(2^ceil(log2 s), 2^-ceil(log2 s))`` of a positive normal FP32 ``s``,
    from its bits (DeepSeek-V3.2 ``fast_round_scale``; exact)."""
    p, r = _pure([T.f32()] * 2, [_f32(s, loc, ip)],
                 "{\n\t.reg .b32 b, e, m;\n\t.reg .pred pm;\n\t"
                 "mov.b32 b, $2;\n\tbfe.u32 e, b, 23, 8;\n\tand.b32 m, b, 0x7FFFFF;\n\t"
                 "setp.ne.u32 pm, m, 0;\n\t@pm add.u32 e, e, 1;\n\t"
                 "shl.b32 m, e, 23;\n\tmov.b32 $0, m;\n\t"
                 "sub.u32 e, 254, e;\n\tshl.b32 m, e, 23;\n\tmov.b32 $1, m;\n\t}",
                 "=f,=f,f", loc=loc, ip=ip)
    return Float32(p), Float32(r)


@dsl_user_op
def e4m3x4(v0, v1, v2, v3, *, loc=None, ip=None) -> Uint32:
    """Four FP32 -> four FP8 e4m3 (``cvt.rn.satfinite.e4m3x2.f32``, nearest-even,
    saturating at +-448) packed little-endian: ``v0`` in the lowest byte."""
    (w,) = _pure([T.i32()], [_f32(v, loc, ip) for v in (v0, v1, v2, v3)],
                 "{\n\t.reg .b16 lo, hi;\n\t"
                 "cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;\n\t"
                 "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;\n\t"
                 "mov.b32 $0, {lo, hi};\n\t}",
                 "=r,f,f,f,f", loc=loc, ip=ip)
    return Uint32(w)


# ---------------------------------------------------------------- shared / DSMEM
@dsl_user_op
def shared_address(pointer, *, loc=None, ip=None) -> Int32:
    """The 32-bit ``shared::cta`` address of a shared-memory cute Pointer."""
    return Int32(llvm.ptrtoint(T.i32(), pointer.to_llvm_ptr(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def load_cluster_f32(address, rank, *, loc=None, ip=None) -> Float32:
    """Read FP32 at this CTA's shared ``address`` in cluster CTA ``rank``
    (``mapa.shared::cluster`` + ``ld.shared::cluster.f32``)."""
    (v,) = _inline_asm([T.f32()], [_u32(address, loc, ip), _u32(rank, loc, ip)],
                       "{\n\t.reg .b32 r;\n\tmapa.shared::cluster.u32 r, $1, $2;\n\t"
                       "ld.shared::cluster.f32 $0, [r];\n\t}",
                       "=f,r,r", loc=loc, ip=ip)
    return Float32(v)


@dsl_user_op
def store_async_cluster_f32x2(address, a, b, barrier, rank, *, loc=None, ip=None) -> None:
    """Store (a, b) at shared ``address`` of cluster CTA ``rank`` and complete 8
    transaction bytes on that CTA's mbarrier at ``barrier`` (``st.async
    .shared::cluster.mbarrier::complete_tx::bytes.v2.f32``)."""
    _inline_asm([], [_u32(address, loc, ip), _u32(barrier, loc, ip), _u32(rank, loc, ip),
                     _f32(a, loc, ip), _f32(b, loc, ip)],
                "{\n\t.reg .b32 ra, rb;\n\tmapa.shared::cluster.u32 ra, $0, $2;\n\t"
                "mapa.shared::cluster.u32 rb, $1, $2;\n\t"
                "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [ra], {$3, $4}, [rb];\n\t}",
                "r,r,r,f,f", loc=loc, ip=ip)


@dsl_user_op
def store_async_cluster_f32x4(address, values, barrier, rank, *, loc=None, ip=None) -> None:
    """Store four FP32 ``values`` at 16-byte aligned shared ``address`` of
    cluster CTA ``rank`` and complete 16 transaction bytes on that CTA's
    mbarrier at ``barrier`` (``st.async ... complete_tx::bytes.v4.f32``)."""
    _inline_asm([], [_u32(address, loc, ip), _u32(barrier, loc, ip), _u32(rank, loc, ip)]
                + [_f32(v, loc, ip) for v in values],
                "{\n\t.reg .b32 ra, rb;\n\tmapa.shared::cluster.u32 ra, $0, $2;\n\t"
                "mapa.shared::cluster.u32 rb, $1, $2;\n\t"
                "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [ra], "
                "{$3, $4, $5, $6}, [rb];\n\t}",
                "r,r,r,f,f,f,f", loc=loc, ip=ip)


@dsl_user_op
def mbarrier_init_expect(barrier, tx_bytes, *, loc=None, ip=None) -> None:
    """Initialise the mbarrier at shared ``barrier`` for one arrival, arrive
    with ``tx_bytes`` expected, and fence the init for the cluster
    (``fence.mbarrier_init.release.cluster``). One thread a CTA."""
    _inline_asm([], [_u32(barrier, loc, ip), _u32(tx_bytes, loc, ip)],
                "{\n\t.reg .b64 st;\n\tmbarrier.init.shared::cta.b64 [$0], 1;\n\t"
                "mbarrier.arrive.expect_tx.shared::cta.b64 st, [$0], $1;\n\t"
                "fence.mbarrier_init.release.cluster;\n\t}",
                "r,r", loc=loc, ip=ip)


@dsl_user_op
def mbarrier_init(barrier, count, *, loc=None, ip=None) -> None:
    """Initialise the mbarrier at shared ``barrier`` for ``count`` arrivals
    and fence the init (``fence.mbarrier_init.release.cluster``). One thread;
    a CTA barrier must follow before any thread or copy uses it."""
    _inline_asm([], [_u32(barrier, loc, ip), _u32(count, loc, ip)],
                "mbarrier.init.shared::cta.b64 [$0], $1;\n\t"
                "fence.mbarrier_init.release.cluster;",
                "r,r", loc=loc, ip=ip)


@dsl_user_op
def mbarrier_arrive_expect_tx(barrier, tx_bytes, *, loc=None, ip=None) -> None:
    """Arrive on the mbarrier at shared ``barrier``, expecting ``tx_bytes``
    more transaction bytes in the current phase."""
    _inline_asm([], [_u32(barrier, loc, ip), _u32(tx_bytes, loc, ip)],
                "{\n\t.reg .b64 st;\n\t"
                "mbarrier.arrive.expect_tx.shared::cta.b64 st, [$0], $1;\n\t}",
                "r,r", loc=loc, ip=ip)


@dsl_user_op
def bulk_load_weights(dst, src: Int64, nbytes, barrier, *, loc=None, ip=None) -> None:
    """``nbytes`` (a multiple of 16) of read-only weights from global ``src``
    to shared ``dst`` (both 16-byte aligned) by the copy engine, completing
    on the mbarrier at ``barrier`` (``cp.async.bulk.shared::cluster.global
    .mbarrier::complete_tx::bytes``). Allowed before the PDL wait."""
    _inline_asm([], [_u32(dst, loc, ip), _i64(src, loc, ip), _u32(nbytes, loc, ip),
                     _u32(barrier, loc, ip)],
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                "[$0], [$1], $2, [$3];",
                "r,l,r,r", loc=loc, ip=ip)


@dsl_user_op
def load_shared_u32x4(address, *, loc=None, ip=None):
    """16 bytes at a 32-bit ``shared::cta`` address (``ld.shared.v4.u32``);
    volatile, so it stays after the mbarrier wait that guards it."""
    words = _inline_asm([T.i32()] * 4, [_u32(address, loc, ip)],
                        "ld.shared.v4.u32 {$0, $1, $2, $3}, [$4];",
                        "=r,=r,=r,=r,r", clobber_memory=False, loc=loc, ip=ip)
    return [Uint32(w) for w in words]


@dsl_user_op
def store_shared_u32x4(address, words, *, loc=None, ip=None) -> None:
    """16 bytes to a 32-bit ``shared::cta`` address (``st.shared.v4.u32``)."""
    _inline_asm([], [_u32(address, loc, ip)] + [_u32(w, loc, ip) for w in words],
                "st.shared.v4.u32 [$0], {$1, $2, $3, $4};", "r,r,r,r,r", loc=loc, ip=ip)


@dsl_user_op
def mbarrier_wait_parity(barrier, parity, *, loc=None, ip=None) -> None:
    """Spin until phase ``parity`` of the mbarrier at shared ``barrier``
    completed (``mbarrier.try_wait.parity``, acquire at CTA scope)."""
    _inline_asm([], [_u32(barrier, loc, ip), _u32(parity, loc, ip)],
                "{\n\t.reg .pred p;\n\tWAIT_${:uid}:\n\t"
                "mbarrier.try_wait.parity.shared::cta.b64 p, [$0], $1;\n\t"
                "@!p bra WAIT_${:uid};\n\t}",
                "r,r", loc=loc, ip=ip)


@dsl_user_op
def abs_max_f32(a, b, *, loc=None, ip=None) -> Float32:
    """``max(|a|, b)`` (``abs.f32`` + ``max.f32``)."""
    (v,) = _pure([T.f32()], [_f32(a, loc, ip), _f32(b, loc, ip)],
                 "{\n\t.reg .f32 t;\n\tabs.f32 t, $1;\n\tmax.f32 $0, t, $2;\n\t}",
                 "=f,f,f", loc=loc, ip=ip)
    return Float32(v)


@dsl_user_op
def max_f32(a, b, *, loc=None, ip=None) -> Float32:
    """``max.f32``."""
    (v,) = _pure([T.f32()], [_f32(a, loc, ip), _f32(b, loc, ip)],
                 "max.f32 $0, $1, $2;", "=f,f,f", loc=loc, ip=ip)
    return Float32(v)


# ---------------------------------------------------------------- FP32 bits
@dsl_user_op
def f32_bits(value, *, loc=None, ip=None) -> Uint32:
    """The bits of an FP32 as a word (``mov.b32``)."""
    (w,) = _pure([T.i32()], [_f32(value, loc, ip)], "mov.b32 $0, $1;", "=r,f", loc=loc, ip=ip)
    return Uint32(w)


@dsl_user_op
def bits_f32(word, *, loc=None, ip=None) -> Float32:
    """The FP32 whose bits ``word`` holds (``mov.b32``)."""
    (v,) = _pure([T.f32()], [_u32(word, loc, ip)], "mov.b32 $0, $1;", "=f,r", loc=loc, ip=ip)
    return Float32(v)


# ---------------------------------------------------------------- mailbox
@cute.jit
def poll_mailbox_word(slot: Int64) -> Uint32:
    """The word of a mailbox slot once it is not :data:`MAILBOX_SENTINEL`
    (``ld.volatile`` in a loop), or :data:`MAILBOX_NAN` once
    :data:`MAILBOX_DEADLINE_NS` have passed (a lost writer: a NaN, never a
    hang). The caller resets the slot."""
    deadline = globaltimer_ns() + MAILBOX_DEADLINE_NS
    word = load_volatile_u32(slot)
    while word == Uint32(MAILBOX_SENTINEL):
        word = load_volatile_u32(slot)
        if globaltimer_ns() > deadline:
            word = Uint32(MAILBOX_NAN)
    return word
