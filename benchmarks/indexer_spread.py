"""Probe: what spreading the fused indexer's weight stream over every SM, with
one exchange across CTAs through global memory, would buy at one token
(issue 36). It times no indexer math, only the two costs the restructure
trades against each other, side by side in one run:

- the per-SM intake: each CTA streams its share of a weight buffer into
  registers (``ld.global.nc`` v4, issued before the PDL wait, as the fused
  kernel does) and sums it; a grid is as slow as its heaviest CTAs;
- the exchange: the first ``exchange`` CTAs (the key group) add their sums
  in CTA order in one place, as a key LayerNorm spread over more than one
  cluster must: ``+exchange`` each stores its sum and ``atom.acq_rel.gpu``
  a counter, the last to arrive adds (no CTA waits on another);
  ``+flags`` each stores its sum into its own sentinel slot and CTA 0 polls
  the slots (Lamport style: no atomic, no fence; the grid must be resident);
  ``+early`` is ``+flags`` with the exchange moved ahead of the rest of
  the stream: each exchanging CTA sums its first ``early_units`` (the key
  row a key-first grid would give every CTA), publishes that sum, and only
  then sums the rest of its share, and CTA 0 gathers between the two, so
  the exchange can hide behind the rest of the stream instead of following
  it.

    python -m benchmarks.indexer_spread [--replays 20] [--rotate-mb 120] [--pad-kb 120]
        [--shapes today,even-132/1,...]

Shapes (:data:`SHAPES`) are ``(CTAs, 8 KiB a CTA)`` segments at K 7168, each
about the fused kernel's 4.59 MB (rounded up to whole 8 KiB units a CTA):
``today`` is split-k2's grid (80 CTAs in clusters of 16: the key and first
head clusters 112 KiB a CTA, the second head cluster 32 KiB, the last two
16 KiB); ``key-spread`` gives the key four clusters (28 KiB a CTA, 32 as whole units) and leaves
the heavy head cluster; ``even`` spreads every byte over 128 or 132 CTAs.
Each spread shape runs with and without an exchange. ``--pad-kb 120``
leaves one CTA an SM, as the fused kernel's registers do.

Every figure is the median per-call time of a CUDA graph of at least 32
calls, call i reading buffer i % R, R buffers spanning ``--rotate-mb``
(more than the L2), as :mod:`benchmarks.indexer` times the fused kernel
(:func:`benchmarks.indexer.time_calls`). ``clusters`` is
``cuOccupancyMaxActiveClusters`` for the shape's cluster size (a grid with
more clusters than that runs in more than one wave). Each shape's sums are
checked against torch before it is timed; a wrong one exits 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32, Int64, Uint32

from benchmarks.indexer import graph_node_us, time_calls
from cluster.measure.graph import rotation_sets
from kernels.indexer import primitives as ip
from kernels.indexer.layout import MAILBOX_NAN, MAILBOX_SENTINEL
from kernels.lamport import primitives as lp

THREADS = 512
#: Bytes one CTA reads per load of every thread (512 threads x 16 B).
UNIT = THREADS * 16
#: Largest loads a thread issues (registers: four words each).
MAX_UNITS = 16
#: Largest shared-memory pad a CTA may take (sm_90's opt-in, less the probe's own).
MAX_PAD_BYTES = 200 * 1024


@dataclasses.dataclass(frozen=True)
class Shape:
    """A grid: ``segments`` of (CTAs, units a CTA), CTAs in order; clusters of
    ``cluster`` CTAs; the first ``exchange`` CTAs exchange their sums (0:
    none; every CTA writes its own)."""

    name: str
    segments: tuple[tuple[int, int], ...]
    cluster: int
    exchange: int = 0
    #: How the exchange's CTAs meet: "atomic" (each stores its sum and
    #: ``atom.acq_rel`` a counter; the last to arrive adds) or "flags" (each
    #: stores its sum into its own slot, a sentinel until then, and CTA 0's
    #: threads poll the slots, Lamport style: no atomic, no fence; needs the
    #: whole grid resident, one wave).
    mode: str = "atomic"
    #: With "flags": 0, the exchange after the whole share; n > 0, after the
    #: first n units of every exchanging CTA's share (the rest summed after).
    early_units: int = 0

    @property
    def ctas(self) -> int:
        return sum(n for n, _ in self.segments)

    @property
    def units(self) -> int:
        return sum(n * u for n, u in self.segments)

    @property
    def max_units(self) -> int:
        return max(u for _, u in self.segments)

    def validate(self) -> None:
        if self.ctas % self.cluster:
            raise ValueError(f"{self.name}: {self.ctas} CTAs are not whole clusters of "
                             f"{self.cluster}")
        if not 1 <= self.max_units <= MAX_UNITS:
            raise ValueError(f"{self.name}: units a CTA must be in 1..{MAX_UNITS}, got "
                             f"{self.max_units}")
        if self.mode not in ("atomic", "flags"):
            raise ValueError(f"{self.name}: mode must be 'atomic' or 'flags', got {self.mode!r}")
        if not 0 <= self.exchange <= min(self.ctas, THREADS):
            raise ValueError(f"{self.name}: exchange must be in 0..{min(self.ctas, THREADS)}, "
                             f"got {self.exchange}")
        least = min(u for _, u in self.segments)
        if self.early_units and not (self.mode == "flags" and self.exchange
                                     and 0 < self.early_units < least):
            raise ValueError(f"{self.name}: early_units needs mode 'flags', an exchange and "
                             f"0 < early_units < {least} (the fewest units a CTA), got "
                             f"early_units={self.early_units}, mode={self.mode!r}, "
                             f"exchange={self.exchange}")


def _shapes() -> tuple[Shape, ...]:
    today = ((32, 14), (16, 4), (32, 2))
    key_spread = ((64, 4), (16, 14), (16, 4), (32, 2))
    even128 = ((64, 5), (64, 4))
    even132 = ((48, 5), (84, 4))
    return (Shape("today", today, 16),
            Shape("key-spread", key_spread, 16),
            Shape("key-spread+exchange", key_spread, 16, exchange=64),
            Shape("even-128/16", even128, 16),
            Shape("even-128/16+exchange", even128, 16, exchange=64),
            Shape("even-128/8+exchange", even128, 8, exchange=64),
            Shape("even-132/1", even132, 1),
            Shape("even-132/1+exchange", even132, 1, exchange=48),
            Shape("even-132/1+flags", even132, 1, exchange=48, mode="flags"),
            # Key-first: every one of 128 CTAs holds one key row (2 units)
            # and exchanges it, at the end of its share or ahead of the rest.
            Shape("even-132/1+flags128", even132, 1, exchange=128, mode="flags"),
            Shape("even-132/1+early128", even132, 1, exchange=128, mode="flags", early_units=2),
            Shape("tiny-64/16", ((64, 1),), 16),
            Shape("tiny-64/16+exchange", ((64, 1),), 16, exchange=64),
            Shape("tiny-64/1", ((64, 1),), 1),
            Shape("tiny-64/1+exchange", ((64, 1),), 1, exchange=64),
            Shape("tiny-64/1+flags", ((64, 1),), 1, exchange=64, mode="flags"))


SHAPES = _shapes()


#: A flags slot before its sum arrives, and what a sum with those bits is
#: stored as: the fused kernel's ``spread`` key mailbox's
#: (:mod:`kernels.indexer.layout`; its poll, with the deadline,
#: :func:`kernels.indexer.primitives.poll_mailbox_word`).
SENTINEL = MAILBOX_SENTINEL
CANONICAL_NAN = MAILBOX_NAN


class SpreadProbe:
    """The probe kernel of one :class:`Shape`; see the module docstring.
    ``out`` FP32 ``[1 + ctas]``: slot 0 the exchange's total, slot 1 + c CTA
    c's own sum (the CTAs that do not exchange; zero for those that do)."""

    def __init__(self, shape: Shape, pad_bytes: int = 0) -> None:
        shape.validate()
        if not 0 <= pad_bytes <= MAX_PAD_BYTES:
            raise ValueError(f"pad_bytes must be in 0..{MAX_PAD_BYTES}, got {pad_bytes}")
        self.shape = shape
        #: Shared memory a CTA takes beyond what it uses: above half an SM's,
        #: one CTA an SM, as the fused kernel's registers force.
        self.pad_bytes = pad_bytes

    def smem_bytes(self) -> int:
        """Dynamic shared memory the kernel takes at the most: its warp sums
        (``THREADS`` FP32), the flag and the pad, plus alignment slack. The
        occupancy query sets the function's limit to this, so it must not
        be less than what the DSL launches with."""
        return self.pad_bytes + THREADS * 4 + 16 + 1024

    @cute.jit
    def __call__(self, w: Int64, out: Int64, partials: Int64, counter: Int64,
                 stream: cuda.CUstream) -> None:
        self.kernel(w, out, partials, counter).launch(
            grid=(self.shape.ctas, 1, 1), block=(THREADS, 1, 1),
            cluster=(self.shape.cluster, 1, 1), stream=stream, use_pdl=True)

    @cute.jit
    def share(self, cta):
        """(units, byte offset) of CTA ``cta``'s share of the buffer."""
        units = Int32(0)
        offset = Int64(0)
        first, before = 0, 0
        for n, u in self.shape.segments:
            if cta >= first:
                units = Int32(u)
                offset = Int64(before) + Int64(cta - first) * (u * UNIT)
            first += n
            before += n * u * UNIT
        return units, offset

    @cute.jit
    def store_total(self, sums, out: Int64):
        """``out[0]``: the exchange group's sums (shared ``sums[0..exchange)``)
        added in CTA order from +0.0."""
        total = Float32(0.0)
        for c in cutlass.range(self.shape.exchange, unroll_full=True):
            total = ip.add_rn_f32(total, ip.load_shared_f32(sums + c * 4))
        ip.store_f32(out, total)

    @cute.kernel
    def kernel(self, w: Int64, out: Int64, partials: Int64, counter: Int64):
        shape = self.shape
        tid, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        cta, _, _ = cute.arch.block_idx()
        units, offset = self.share(cta)
        words = []
        for j in cutlass.range_constexpr(shape.max_units):
            live = Int32(0)
            if j < units:
                live = Int32(1)
            words += ip.load_weight_u32x4_if(w + offset + (j * THREADS + tid) * 16, live)
        smem = cutlass.memory.SmemAllocator()
        sums = ip.shared_address(smem.allocate_array(Float32, THREADS, byte_alignment=16))
        flag = ip.shared_address(smem.allocate_array(Float32, 4, byte_alignment=16))
        if cutlass.const_expr(self.pad_bytes):
            smem.allocate_array(Float32, self.pad_bytes // 4, byte_alignment=16)
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()
        early = 4 * shape.early_units  # words summed ahead of the exchange (0: all)
        cta_sum = self.cta_total(words[:early] if early else words, sums, tid, warp, lane)
        if cutlass.const_expr(shape.mode == "flags"):
            cute.arch.sync_threads()  # thread 0 has read the warp sums: reuse them
            if cta < shape.exchange:
                if tid == 0:
                    bits = ip.f32_bits(cta_sum)
                    if bits == Uint32(SENTINEL):
                        bits = Uint32(CANONICAL_NAN)
                    lp.store_u32(partials + Int64(cta) * 4, bits)
                if cta == 0:
                    if tid < shape.exchange:
                        slot = partials + Int64(tid) * 4
                        word = ip.poll_mailbox_word(slot)  # a lost peer: NaN, never a hang
                        ip.store_shared_f32(sums + tid * 4, ip.bits_f32(word))
                        lp.store_u32(slot, Uint32(SENTINEL))  # ready for the next call
                    cute.arch.sync_threads()
                    if tid == 0:
                        self.store_total(sums, out)
            if cutlass.const_expr(early):
                cute.arch.sync_threads()  # thread 0 has read the gathered sums: reuse them
                rest = self.cta_total(words[early:], sums, tid, warp, lane)
                if cta < shape.exchange:
                    if tid == 0:
                        ip.store_f32(out + (Int64(cta) + 1) * 4, rest)
                else:
                    cta_sum = ip.add_rn_f32(cta_sum, rest)
        else:
            if cta < shape.exchange:
                if tid == 0:
                    ip.store_f32(partials + Int64(cta) * 4, cta_sum)
                    old = lp.atomic_add_acq_rel_u32(counter, 1)
                    ip.store_shared_f32(flag, Float32(Int32(old)))
                cute.arch.sync_threads()
                if ip.load_shared_f32(flag) == Float32(shape.exchange - 1):
                    # The last to arrive: its acquire saw every other CTA's
                    # release, so their sums are visible to this CTA.
                    if tid < shape.exchange:
                        ip.store_shared_f32(sums + tid * 4, lp.load_f32(partials + Int64(tid) * 4))
                    cute.arch.sync_threads()
                    if tid == 0:
                        self.store_total(sums, out)
                        lp.store_u32(counter, 0)  # ready for the next call
        if cta >= shape.exchange:
            if tid == 0:
                ip.store_f32(out + (Int64(cta) + 1) * 4, cta_sum)

    @cute.jit
    def cta_total(self, words, sums, tid, warp, lane):
        """The CTA's sum of ``words`` (BF16 pairs, FP32 adds: each thread's,
        then butterflies in the warp, then the warps in order from +0.0
        through shared ``sums``), in thread 0; ends with the threads synced
        on ``sums`` written."""
        total = Float32(0.0)
        for i in cutlass.range_constexpr(len(words)):
            lo, hi = ip.bf16x2_to_f32(words[i])
            total = ip.add_rn_f32(total, ip.add_rn_f32(lo, hi))
        for s in cutlass.range_constexpr(5):
            total = ip.add_rn_f32(total, cute.arch.shuffle_sync_bfly(total, offset=1 << s))
        if lane == 0:
            ip.store_shared_f32(sums + warp * 4, total)
        cute.arch.sync_threads()
        cta_sum = Float32(0.0)
        if tid == 0:
            for v in cutlass.range_constexpr(THREADS // 32):
                cta_sum = ip.add_rn_f32(cta_sum, ip.load_shared_f32(sums + v * 4))
        return cta_sum

    def compile(self, arch: str = ""):
        """The compiled probe (``arch`` e.g. ``"sm_90a"`` compiles without a
        GPU; empty: the current device's)."""
        from cutlass.cute.runtime import make_fake_stream

        from kernels.lamport.compile import _options

        return cute.compile(self, *([Int64(0)] * 4), make_fake_stream(),
                            options=_options(arch, None))


def expected(shape: Shape, w: torch.Tensor) -> torch.Tensor:
    """FP64 ``[1 + ctas]`` sums the probe writes (its FP32 order aside):
    slot 0 the exchange group's sums (with ``early_units``, of their first
    units only), slot 1 + c CTA c's own (the rest of it, or zero, for an
    exchanging CTA)."""
    flat = w.view(-1).to(torch.float64)
    heads, rests, at = [], [], 0
    head = shape.early_units * UNIT // 2
    for n, u in shape.segments:
        for _ in range(n):
            cut = at + (head or u * UNIT // 2)
            heads.append(flat[at:cut].sum())
            rests.append(flat[cut:at + u * UNIT // 2].sum())
            at += u * UNIT // 2
    whole = torch.stack(heads) + torch.stack(rests)
    out = torch.zeros(1 + shape.ctas, dtype=torch.float64, device=w.device)
    out[0] = torch.stack(heads)[:shape.exchange].sum()
    out[1 + shape.exchange:] = whole[shape.exchange:]
    if shape.early_units:
        out[1:1 + shape.exchange] = torch.stack(rests)[:shape.exchange]
    return out


def _args(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.indexer_spread",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--replays", type=int, default=20, help="graph replays (default 20)")
    p.add_argument("--rotate-mb", type=float, default=120.0,
                   help="weight buffers rotated over at least this many MB (default 120)")
    p.add_argument("--pad-kb", type=int, default=0,
                   help="KiB of unused shared memory a CTA takes (default 0; 120: one CTA an "
                        "SM, as the fused kernel's 100 registers a thread force)")
    p.add_argument("--shapes", default=",".join(s.name for s in SHAPES),
                   help="comma-separated shape names (default: all)")
    args = p.parse_args(argv)
    known = {s.name: s for s in SHAPES}
    names = [n for n in args.shapes.split(",") if n]
    bad = [n for n in names if n not in known]
    if bad:
        p.error(f"--shapes: unknown {bad}; known: {sorted(known)}")
    if not 0 <= args.pad_kb * 1024 <= MAX_PAD_BYTES:
        p.error(f"--pad-kb must be in 0..{MAX_PAD_BYTES // 1024}, got {args.pad_kb}")
    if args.replays < 2:
        p.error(f"--replays must be >= 2, got {args.replays}")
    if not args.rotate_mb > 0:
        p.error(f"--rotate-mb must be > 0, got {args.rotate_mb}")
    args.shapes = [known[n] for n in names]
    return args


def main(argv=None) -> int:
    args = _args(argv)
    if not torch.cuda.is_available():
        print("indexer_spread: needs a CUDA GPU", file=sys.stderr)
        return 2
    from kernels.indexer.projection import _stream_handle, max_active_clusters

    torch.manual_seed(0)
    node = graph_node_us(args.replays)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; graph node (add_) "
          f"{node:.2f} us; shared-memory pad {args.pad_kb} KiB a CTA")
    print(f"{'shape':<22} {'CTAs':>4} {'cl':>3} {'clusters':>8} {'MB':>5} {'max KiB':>7} "
          f"{'us':>6} {'TB/s':>5}")
    bad = 0
    for shape in args.shapes:
        nbytes = shape.units * UNIT
        sets = rotation_sets(args.rotate_mb, nbytes)
        ws = torch.randn(sets, nbytes // 2, device="cuda").to(torch.bfloat16)
        out = torch.zeros(1 + shape.ctas, dtype=torch.float32, device="cuda")
        partials = torch.zeros(max(shape.exchange, 1), dtype=torch.float32, device="cuda")
        if shape.mode == "flags":
            partials.view(torch.int32).fill_(-1)  # SENTINEL
        counter = torch.zeros(1, dtype=torch.int32, device="cuda")
        probe = SpreadProbe(shape, args.pad_kb * 1024)
        kernel = probe.compile()

        def step(i, kernel=kernel, ws=ws, out=out, partials=partials, counter=counter):
            kernel(ws[i % sets].data_ptr(), out.data_ptr(), partials.data_ptr(),
                   counter.data_ptr(), _stream_handle())

        step(0)
        torch.cuda.synchronize()
        want = expected(shape, ws[0])
        got = out.to(torch.float64)
        ok = (bool(torch.allclose(got, want, rtol=1e-3, atol=1e-2)) and int(counter.item()) == 0
              and (shape.mode != "flags" or bool((partials.view(torch.int32) == -1).all())))
        clusters = max_active_clusters(kernel, cluster=shape.cluster, threads=THREADS,
                                       smem_bytes=probe.smem_bytes())
        us = time_calls(step, max(32, sets), args.replays)
        ok = ok and int(counter.item()) == 0
        if shape.mode == "flags":  # every slot back at the sentinel after the timed calls
            ok = ok and bool((partials.view(torch.int32) == -1).all())
        bad += not ok
        print(f"{shape.name:<22} {shape.ctas:>4} {shape.cluster:>3} {clusters:>8} "
              f"{nbytes / 1e6:>5.2f} {shape.max_units * UNIT // 1024:>7} {us:>6.2f} "
              f"{nbytes / us / 1e6:>5.2f}" + ("" if ok else "  WRONG SUMS"))
        del ws
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
