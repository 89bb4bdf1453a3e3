"""Device primitives for the Lamport kernels: every inline PTX op lives here.

All of them go through :func:`_inline_asm`, the one place that spells the
``llvm.inline_asm`` boilerplate. Addresses are generic 64-bit addresses of
global memory (``Int64``). Packed fragments are 4 x ``Uint32`` words holding
8 BF16 lanes (lane 2i in the low half of word i).

Memory ordering, in short:
- volatile loads (``ld.volatile``) are re-issued on every call and never
  cached in registers: the Lamport spin relies on that; they carry a
  ``memory`` clobber so the compiler keeps them in program order with the
  stores around them;
- ``st.relaxed.sys`` stores are visible to other GPUs' volatile loads
  eventually, with no ordering between fragments; the protocol needs none
  (each lane carries its own "arrived" bit);
- ``multimem.st.relaxed.sys`` is the same for every GPU of a multicast
  object (compiled and PTX-checked only here);
- plain loads/stores are weak: use them only for data ordered by kernel
  boundaries (``griddepcontrol.wait``); they are marked side-effecting, so
  they stay on their side of ``griddepcontrol.wait``.
"""

from __future__ import annotations

from cutlass import BFloat16, Boolean, Float32, Int32, Int64, Uint32
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm, vector
from cutlass.cutlass_dsl import T, dsl_user_op

from .protocol import SENTINEL_WORD


def _inline_asm(results, operands, asm, constraints, *, side_effects=True,
                clobber_memory=True, loc=None, ip=None):
    """Emit one inline PTX block; returns a list of i32/i64 ir values.

    ``results`` is a list of MLIR types (empty for none); several results
    come back as a literal LLVM struct and are extracted here.
    """
    if clobber_memory:
        constraints = constraints + ("," if constraints else "") + "~{memory}"
    if not results:
        res_type = None
    elif len(results) == 1:
        res_type = results[0]
    else:
        res_type = llvm.StructType.get_literal(list(results))
    value = llvm.inline_asm(
        res_type, operands, asm, constraints,
        has_side_effects=side_effects, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
    if not results:
        return []
    if len(results) == 1:
        return [value]
    return [llvm.extractvalue(results[i], value, [i], loc=loc, ip=ip)
            for i in range(len(results))]


def _i64(x, loc, ip):
    return Int64(x).ir_value(loc=loc, ip=ip)


def _u32(x, loc, ip):
    return Uint32(x).ir_value(loc=loc, ip=ip)


# ---------------------------------------------------------------- loads
@dsl_user_op
def load_volatile_u32x4(address: Int64, *, loc=None, ip=None):
    """16-byte volatile load (``ld.volatile.global.v4.u32``): the Lamport
    spin load. Never served from a register copy; no acquire semantics."""
    words = _inline_asm(
        [T.i32()] * 4, [_i64(address, loc, ip)],
        "ld.volatile.global.v4.u32 {$0, $1, $2, $3}, [$4];",
        "=r,=r,=r,=r,l", loc=loc, ip=ip)
    return [Uint32(w) for w in words]


@dsl_user_op
def load_volatile_u32(address: Int64, *, loc=None, ip=None) -> Uint32:
    """32-bit volatile load (``ld.volatile.global.u32``), e.g. of a stage."""
    (word,) = _inline_asm([T.i32()], [_i64(address, loc, ip)],
                          "ld.volatile.global.u32 $0, [$1];", "=r,l",
                          loc=loc, ip=ip)
    return Uint32(word)


@dsl_user_op
def load_u32x4(address: Int64, *, loc=None, ip=None):
    """Plain 16-byte load (``ld.global.v4.u32``); weak, ordered only by
    kernel boundaries. Side-effecting, so it is not hoisted above
    ``griddepcontrol.wait`` (no memory clobber: it may move among loads)."""
    words = _inline_asm(
        [T.i32()] * 4, [_i64(address, loc, ip)],
        "ld.global.v4.u32 {$0, $1, $2, $3}, [$4];",
        "=r,=r,=r,=r,l", clobber_memory=False, loc=loc, ip=ip)
    return [Uint32(w) for w in words]


@dsl_user_op
def load_u64(address: Int64, *, loc=None, ip=None) -> Int64:
    """Plain 64-bit load (``ld.global.u64``), e.g. a peer-table entry."""
    (value,) = _inline_asm([T.i64()], [_i64(address, loc, ip)],
                           "ld.global.u64 $0, [$1];", "=l,l",
                           clobber_memory=False, loc=loc, ip=ip)
    return Int64(value)


# ---------------------------------------------------------------- stores
@dsl_user_op
def store_u32x4(address: Int64, words, *, loc=None, ip=None) -> None:
    """Plain 16-byte store (``st.global.v4.b32``); weak."""
    _inline_asm([], [_i64(address, loc, ip)] + [_u32(w, loc, ip) for w in words],
                "st.global.v4.b32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r",
                loc=loc, ip=ip)


@dsl_user_op
def store_relaxed_sys_u32x4(address: Int64, words, *, loc=None, ip=None) -> None:
    """16-byte ``st.relaxed.sys.global.v4.b32``: the unicast publish store,
    visible to volatile loads on any GPU of the system; unordered."""
    _inline_asm([], [_i64(address, loc, ip)] + [_u32(w, loc, ip) for w in words],
                "st.relaxed.sys.global.v4.b32 [$0], {$1, $2, $3, $4};",
                "l,r,r,r,r", loc=loc, ip=ip)


@dsl_user_op
def store_multicast_bf16x8(address: Int64, words, *, loc=None, ip=None) -> None:
    """16-byte ``multimem.st.relaxed.sys.global.v4.bf16x2`` to a multicast
    address: one store reaches every GPU of the multicast object. Compiled
    and PTX-checked only in this project; never run it without the gate in
    :mod:`kernels.lamport.mailbox`."""
    _inline_asm([], [_i64(address, loc, ip)] + [_u32(w, loc, ip) for w in words],
                "multimem.st.relaxed.sys.global.v4.bf16x2 [$0], {$1, $2, $3, $4};",
                "l,r,r,r,r", loc=loc, ip=ip)


@dsl_user_op
def store_sentinel_u32x4(address: Int64, *, loc=None, ip=None) -> None:
    """Write 8 sentinel lanes (16 bytes of 0x80008000) with a plain store:
    the consumer's reset of the slots it read (ordered for the next use of
    the stage by the kernel boundaries between calls)."""
    _inline_asm([], [_i64(address, loc, ip)],
                "{\n\t.reg .b32 s;\n\tmov.b32 s, 0x80008000;\n\t"
                "st.global.v4.b32 [$0], {s, s, s, s};\n\t}",
                "l", loc=loc, ip=ip)


@dsl_user_op
def store_u32(address: Int64, value, *, loc=None, ip=None) -> None:
    """32-bit volatile store (``st.volatile.global.u32``), e.g. a stage."""
    _inline_asm([], [_i64(address, loc, ip), _u32(value, loc, ip)],
                "st.volatile.global.u32 [$0], $1;", "l,r", loc=loc, ip=ip)


@dsl_user_op
def atomic_add_u32(address: Int64, value, *, loc=None, ip=None) -> Uint32:
    """``atom.global.add.u32`` (relaxed, gpu scope); returns the old value."""
    (old,) = _inline_asm([T.i32()], [_i64(address, loc, ip), _u32(value, loc, ip)],
                         "atom.global.add.u32 $0, [$1], $2;", "=r,l,r",
                         loc=loc, ip=ip)
    return Uint32(old)


@dsl_user_op
def atomic_add_acq_rel_u32(address: Int64, value, *, loc=None, ip=None) -> Uint32:
    """``atom.acq_rel.gpu.global.add.u32``; returns the old value. Release:
    this thread's earlier loads and stores (and, after a ``bar.sync``, its
    CTA's) happen before any thread that reads the sum; acquire: the stores
    of the threads whose adds it read happen before this thread's later
    ones."""
    (old,) = _inline_asm([T.i32()], [_i64(address, loc, ip), _u32(value, loc, ip)],
                         "atom.acq_rel.gpu.global.add.u32 $0, [$1], $2;", "=r,l,r",
                         loc=loc, ip=ip)
    return Uint32(old)


@dsl_user_op
def atomic_or_u32(address: Int64, value, *, loc=None, ip=None) -> None:
    """``red.global.or.b32`` (relaxed, gpu scope)."""
    _inline_asm([], [_i64(address, loc, ip), _u32(value, loc, ip)],
                "red.global.or.b32 [$0], $1;", "l,r", loc=loc, ip=ip)


# ---------------------------------------------------------------- timer
@dsl_user_op
def globaltimer_ns(*, loc=None, ip=None) -> Int64:
    """``%globaltimer`` in nanoseconds (about 1 us resolution; it keeps
    running while the process is descheduled)."""
    (value,) = _inline_asm([T.i64()], [], "mov.u64 $0, %globaltimer;", "=l",
                           clobber_memory=False, loc=loc, ip=ip)
    return Int64(value)


@dsl_user_op
def clock64(*, loc=None, ip=None) -> Int64:
    """``%clock64``: this SM's cycle counter (one count a cycle of the SM
    clock; volatile, so never hoisted out of a loop)."""
    (value,) = _inline_asm([T.i64()], [], "mov.u64 $0, %clock64;", "=l",
                           clobber_memory=False, loc=loc, ip=ip)
    return Int64(value)


# ---------------------------------------------------------------- packed BF16
def _sanitize_asm(w, *, loc=None, ip=None) -> Uint32:
    (out,) = _inline_asm(
        [T.i32()], [_u32(w, loc, ip)],
        "{\n\t.reg .b16 l, h;\n\t.reg .pred pl, ph;\n\t"
        "mov.b32 {l, h}, $1;\n\t"
        "setp.eq.b16 pl, l, 0x8000;\n\tsetp.eq.b16 ph, h, 0x8000;\n\t"
        "selp.b16 l, 0, l, pl;\n\tselp.b16 h, 0, h, ph;\n\t"
        "mov.b32 $0, {l, h};\n\t}",
        "=r,r", side_effects=False, clobber_memory=False, loc=loc, ip=ip)
    return Uint32(out)


@dsl_user_op
def sanitize_u32(word, *, loc=None, ip=None) -> Uint32:
    """Replace each BF16 lane equal to -0.0 (0x8000) by +0.0; other lanes
    (negative subnormals 0x8001..0x807F included) pass unchanged."""
    return _sanitize_asm(Uint32(word), loc=loc, ip=ip)


@dsl_user_op
def sanitize_u32x4(words, *, loc=None, ip=None):
    """:func:`sanitize_u32` on each of 4 words."""
    return [_sanitize_asm(Uint32(w), loc=loc, ip=ip) for w in words]


def _lane_is_sentinel_u32(w):
    # Non-zero where the low or the high lane is exactly 0x8000.
    lo = (w & Uint32(0xFFFF)) == Uint32(0x8000)
    hi = (w >> Uint32(16)) == Uint32(0x8000)
    return lo | hi


@dsl_user_op
def has_negative_zero_u32(word, *, loc=None, ip=None) -> Boolean:
    """True when either BF16 lane of the packed word is exactly 0x8000."""
    return _lane_is_sentinel_u32(Uint32(word))


@dsl_user_op
def fragment_has_sentinel(words, *, loc=None, ip=None) -> Boolean:
    """True when any of the 8 lanes of a fragment is exactly 0x8000, i.e.
    the fragment has not fully arrived (a bitwise test, so negative
    subnormals 0x8001..0x807F count as arrived)."""
    result = _lane_is_sentinel_u32(Uint32(words[0]))
    for w in words[1:]:
        result = result | _lane_is_sentinel_u32(Uint32(w))
    return result


@dsl_user_op
def fragment_all_sentinel(words, *, loc=None, ip=None) -> Boolean:
    """True when all 8 lanes of a fragment are 0x8000 (nothing arrived)."""
    result = Uint32(words[0]) == Uint32(SENTINEL_WORD)
    for w in words[1:]:
        result = result & (Uint32(w) == Uint32(SENTINEL_WORD))
    return result


@dsl_user_op
def unpack_bf16x8(words, *, loc=None, ip=None) -> cute.TensorSSA:
    """4 packed words -> a TensorSSA of 8 BF16 (lane 2i = low half of word i)."""
    vec = vector.from_elements(T.vector(4, T.i32()),
                               [_u32(w, loc, ip) for w in words], loc=loc, ip=ip)
    bf = llvm.bitcast(T.vector(8, BFloat16.mlir_type), vec, loc=loc, ip=ip)
    return cute.TensorSSA(bf, (8,), BFloat16)


@dsl_user_op
def pack_bf16x8(values: cute.TensorSSA, *, loc=None, ip=None):
    """A TensorSSA of 8 BF16 -> 4 packed Uint32 words."""
    vec = llvm.bitcast(T.vector(4, T.i32()), values.ir_value(loc=loc, ip=ip),
                       loc=loc, ip=ip)
    return [Uint32(vector.extract(vec, [], [i], loc=loc, ip=ip)) for i in range(4)]


# ---------------------------------------------------------------- MoE finalize / embedding
# 8-byte fragments (4 BF16 lanes in 2 words) for the finalize publish's
# ``elements_per_thread=4`` variant, scalar metadata loads, and FP32 arithmetic
# spelled out so that the rounding of every step is fixed by the PTX (no
# contraction or reassociation left to the compiler).
@dsl_user_op
def load_u32x2(address: Int64, *, loc=None, ip=None):
    """Plain 8-byte load (``ld.global.v2.u32``); weak, like :func:`load_u32x4`."""
    words = _inline_asm([T.i32()] * 2, [_i64(address, loc, ip)],
                        "ld.global.v2.u32 {$0, $1}, [$2];", "=r,=r,l",
                        clobber_memory=False, loc=loc, ip=ip)
    return [Uint32(w) for w in words]


@dsl_user_op
def load_s32(address: Int64, *, loc=None, ip=None) -> Int32:
    """Plain 32-bit signed load (``ld.global.s32``), e.g. a route index."""
    (value,) = _inline_asm([T.i32()], [_i64(address, loc, ip)],
                           "ld.global.s32 $0, [$1];", "=r,l",
                           clobber_memory=False, loc=loc, ip=ip)
    return Int32(value)


@dsl_user_op
def load_f32(address: Int64, *, loc=None, ip=None) -> Float32:
    """Plain FP32 load (``ld.global.f32``)."""
    (value,) = _inline_asm([T.f32()], [_i64(address, loc, ip)],
                           "ld.global.f32 $0, [$1];", "=f,l",
                           clobber_memory=False, loc=loc, ip=ip)
    return Float32(value)


@dsl_user_op
def load_bf16_as_f32(address: Int64, *, loc=None, ip=None) -> Float32:
    """Plain BF16 load widened exactly to FP32 (``ld.global.b16`` +
    ``cvt.f32.bf16``)."""
    (value,) = _inline_asm([T.f32()], [_i64(address, loc, ip)],
                           "{\n\t.reg .b16 h;\n\tld.global.b16 h, [$1];\n\t"
                           "cvt.f32.bf16 $0, h;\n\t}", "=f,l",
                           clobber_memory=False, loc=loc, ip=ip)
    return Float32(value)


@dsl_user_op
def store_relaxed_sys_u32x2(address: Int64, words, *, loc=None, ip=None) -> None:
    """8-byte ``st.relaxed.sys.global.v2.b32``: the unicast store of a half
    fragment. Two of them (two threads) fill one 16-byte mailbox fragment;
    each BF16 lane carries its own arrival bit, so the consumer's 16-byte spin
    simply keeps spinning until both halves have landed."""
    _inline_asm([], [_i64(address, loc, ip)] + [_u32(w, loc, ip) for w in words],
                "st.relaxed.sys.global.v2.b32 [$0], {$1, $2};", "l,r,r",
                loc=loc, ip=ip)


@dsl_user_op
def store_multicast_bf16x4(address: Int64, words, *, loc=None, ip=None) -> None:
    """8-byte ``multimem.st.relaxed.sys.global.v2.bf16x2``: the multicast store
    of a half fragment. Compiled and PTX-checked only (see
    :func:`store_multicast_bf16x8`)."""
    _inline_asm([], [_i64(address, loc, ip)] + [_u32(w, loc, ip) for w in words],
                "multimem.st.relaxed.sys.global.v2.bf16x2 [$0], {$1, $2};",
                "l,r,r", loc=loc, ip=ip)


def _f32(x, loc, ip):
    return Float32(x).ir_value(loc=loc, ip=ip)


@dsl_user_op
def fma_rn_f32(a, b, c, *, loc=None, ip=None) -> Float32:
    """``fma.rn.f32 a*b+c``: one rounding, no flush-to-zero."""
    (value,) = _inline_asm([T.f32()], [_f32(a, loc, ip), _f32(b, loc, ip), _f32(c, loc, ip)],
                           "fma.rn.f32 $0, $1, $2, $3;", "=f,f,f,f",
                           side_effects=False, clobber_memory=False, loc=loc, ip=ip)
    return Float32(value)


@dsl_user_op
def add_rn_f32(a, b, *, loc=None, ip=None) -> Float32:
    """``add.rn.f32`` (the ``.rn`` forbids contraction into an FMA)."""
    (value,) = _inline_asm([T.f32()], [_f32(a, loc, ip), _f32(b, loc, ip)],
                           "add.rn.f32 $0, $1, $2;", "=f,f,f",
                           side_effects=False, clobber_memory=False, loc=loc, ip=ip)
    return Float32(value)


@dsl_user_op
def mul_rn_f32(a, b, *, loc=None, ip=None) -> Float32:
    """``mul.rn.f32`` (the ``.rn`` forbids contraction into an FMA)."""
    (value,) = _inline_asm([T.f32()], [_f32(a, loc, ip), _f32(b, loc, ip)],
                           "mul.rn.f32 $0, $1, $2;", "=f,f,f",
                           side_effects=False, clobber_memory=False, loc=loc, ip=ip)
    return Float32(value)


@dsl_user_op
def bf16x2_to_f32x2(word, *, loc=None, ip=None):
    """One packed word -> (low lane, high lane) as FP32 (exact: BF16 is the
    top half of an FP32)."""
    lo, hi = _inline_asm([T.f32(), T.f32()], [_u32(word, loc, ip)],
                         "{\n\t.reg .b32 t;\n\tshl.b32 t, $2, 16;\n\tmov.b32 $0, t;\n\t"
                         "and.b32 t, $2, 0xFFFF0000;\n\tmov.b32 $1, t;\n\t}",
                         "=f,=f,r", side_effects=False, clobber_memory=False, loc=loc, ip=ip)
    return Float32(lo), Float32(hi)


@dsl_user_op
def f32x2_to_bf16x2_rn(lo, hi, *, loc=None, ip=None) -> Uint32:
    """(low, high) FP32 -> one packed word, each rounded to nearest-even
    (``cvt.rn.bf16x2.f32``; its first source goes to the high half)."""
    (word,) = _inline_asm([T.i32()], [_f32(hi, loc, ip), _f32(lo, loc, ip)],
                          "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f",
                          side_effects=False, clobber_memory=False, loc=loc, ip=ip)
    return Uint32(word)


# ---------------------------------------------------------------- shared memory / DSMEM
# The mHC consumer reduces one sum of squares over a cluster of CTAs through
# distributed shared memory. Ordering: a remote store is made visible to the
# peer CTA by the cluster barrier that follows it (``barrier.cluster.arrive``
# has release, ``barrier.cluster.wait`` acquire semantics by default); a CTA
# may only touch a peer's shared memory after a cluster barrier proved the
# peer started, and before a cluster barrier that the peer waits on before
# it exits.
@dsl_user_op
def shared_address_u32(pointer, *, loc=None, ip=None) -> Uint32:
    """The 32-bit ``shared::cta`` address of a shared-memory cute Pointer."""
    return Uint32(llvm.ptrtoint(T.i32(), pointer.to_llvm_ptr(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def store_shared_cluster_f32(address, rank, value, *, loc=None, ip=None) -> None:
    """Store FP32 ``value`` at this CTA's shared ``address`` (32-bit) in
    cluster CTA ``rank`` (``mapa.shared::cluster.u32`` +
    ``st.shared::cluster.f32``); weak, published by the next cluster barrier."""
    _inline_asm([], [_u32(address, loc, ip), _u32(rank, loc, ip), _f32(value, loc, ip)],
                "{\n\t.reg .b32 r;\n\tmapa.shared::cluster.u32 r, $0, $1;\n\t"
                "st.shared::cluster.f32 [r], $2;\n\t}",
                "r,r,f", loc=loc, ip=ip)


@dsl_user_op
def load_shared_f32(address, *, loc=None, ip=None) -> Float32:
    """``ld.shared.f32`` at a 32-bit ``shared::cta`` address (volatile with
    respect to the compiler: side-effecting, memory clobber)."""
    (value,) = _inline_asm([T.f32()], [_u32(address, loc, ip)],
                           "ld.shared.f32 $0, [$1];", "=f,r", loc=loc, ip=ip)
    return Float32(value)


@dsl_user_op
def store_shared_f32(address, value, *, loc=None, ip=None) -> None:
    """``st.shared.f32`` at a 32-bit ``shared::cta`` address."""
    _inline_asm([], [_u32(address, loc, ip), _f32(value, loc, ip)],
                "st.shared.f32 [$0], $1;", "r,f", loc=loc, ip=ip)

