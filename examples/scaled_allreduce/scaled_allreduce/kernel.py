"""The CuTe DSL kernel of ``scaled_allreduce``: the Lamport consumer of
lamport-lab's :class:`~kernels.lamport.norm.NormKernel` (the consume is
reused as it is) with an epilogue of its own, and its compile-check
variants.

One CTA a token, ``hidden / 8`` threads, one 16-byte fragment a thread.
Order: the stage hint (NEXT_STAGE), ``griddepcontrol.wait``, the Lamport
consume of every source rank's fragment in rank order (FP32 from +0.0;
the watchdog build gives up at its deadline and records the source),
``launch_dependents``, the sentinel write-back, then the epilogue: the sum
rounded once to BF16, times ``scale`` (FP32, a runtime argument: one build
serves every scale), rounded to BF16 and stored; NaN where the consume
failed. The publish is lamport-lab's :class:`~kernels.lamport.publish.PublishKernel`
(each rank's partial as it is), so this op compiles only its consumer.

Compiled without a GPU: ``CUTE_DSL_ARCH=sm_90a`` (or ``arch``) and fake
scalar arguments, as every lamport-lab kernel. Not through lamport-lab's
persistent compile cache, whose key covers the repository's ``kernels``
modules only: a compile here is always a fresh one.
"""

from __future__ import annotations

import dataclasses
import os

import cutlass
import cutlass.cute as cute
import cuda.bindings.driver as cuda
from cutlass import Float32, Int32, Int64

from kernels.lamport import primitives as prim
from kernels.lamport.norm import NormKernel
from kernels.lamport.protocol import DEFAULT_BUDGET_NS, VEC_BF16
from kernels.ptx_checks import Variant

OP = "scaled_allreduce"


@dataclasses.dataclass(frozen=True)
class ScaledSumConfig:
    hidden: int
    tp: int
    budget_ns: int = 0
    arch: str = ""  # "" = the current device / CUTE_DSL_ARCH


class ScaledSumKernel(NormKernel):
    """Lamport consume of ``[M, hidden]``, then ``out = BF16(BF16(sum) * scale)``."""

    @cute.jit
    def __call__(self, mailbox: Int64, out: Int64, stage_state: Int64, error: Int64,
                 capacity: Int32, error_records: Int32, scale: Float32, m: Int32,
                 stream: cuda.CUstream) -> None:
        self.kernel(mailbox, out, stage_state, error, capacity, error_records,
                    scale).launch(grid=(m, 1, 1), block=(self.threads, 1, 1),
                                  stream=stream, use_pdl=True)

    @cute.kernel
    def kernel(self, mailbox: Int64, out: Int64, stage_state: Int64, error: Int64,
               capacity: Int32, error_records: Int32, scale: Float32):
        tidx, _, _ = cute.arch.thread_idx()
        token, _, _ = cute.arch.block_idx()
        column = Int64(tidx) * VEC_BF16
        element = Int64(token) * self.hidden + column
        hint = self._stage_hint(stage_state)

        cute.arch.griddepcontrol_wait()

        reduced = cute.make_rmem_tensor(cute.make_layout((VEC_BF16,)), Float32)
        failed = self._consume(mailbox, stage_state, error, capacity, error_records,
                               token, tidx, column, reduced, hint)
        if failed:
            reduced.fill(Float32(float("nan")))
        # The all-reduced value is BF16, as the collective returns it.
        scaled = (reduced.load().to(cutlass.BFloat16).to(Float32) * scale).to(
            cutlass.BFloat16)
        prim.store_u32x4(out + element * 2, prim.pack_bf16x8(scaled))


def compile_scaled_sum(config: ScaledSumConfig, *, dump_dir: str | None = None):
    """The compiled kernel of ``config``; its PTX and cubin kept in ``dump_dir``."""
    from cutlass.cute.runtime import make_fake_stream

    options = []
    if config.arch:
        options.append(f"--gpu-arch {config.arch}")
    if dump_dir:
        os.makedirs(dump_dir, exist_ok=True)  # the DSL skips a missing dir silently
        options.append(f"--keep-ptx --keep-cubin --dump-dir {dump_dir}")
    kernel = ScaledSumKernel(hidden=config.hidden, tp=config.tp, budget_ns=config.budget_ns)
    return cute.compile(kernel, *([Int64(0)] * 4), Int32(1), Int32(1), Float32(0.5), Int32(1),
                        make_fake_stream(), options=" ".join(options))


def _first(lines: list[str], pattern: str, start: int = 0) -> int:
    return next((i for i in range(start, len(lines)) if pattern in lines[i]), -1)


def check_scaled_sum(lines: list[str], v: Variant) -> list[str]:
    """The consumer's PTX: ``griddepcontrol.wait``, the volatile stage load,
    the volatile ``v4`` spin loads, ``launch_dependents``, then the sentinel
    write-back, in that order; no ``multimem.st``; an FP32 multiply (the
    scale); ``%globaltimer`` in the watchdog build and only there."""
    errs = []
    wait = _first(lines, "griddepcontrol.wait")
    launch = _first(lines, "griddepcontrol.launch_dependents")
    stage = _first(lines, "ld.volatile.global.u32", max(wait, 0))
    spin = _first(lines, "ld.volatile.global.v4", max(wait, 0))
    sentinel = _first(lines, "0x80008000", max(launch, 0))
    if wait < 0 or launch < 0:
        errs.append("missing griddepcontrol.wait/launch_dependents")
    elif not wait < stage < spin < launch < sentinel:
        errs.append(f"order wait<stage<spin<launch<sentinel broken: "
                    f"{wait},{stage},{spin},{launch},{sentinel}")
    if any("multimem.st" in ln for ln in lines):
        errs.append("multimem.st in a consumer")
    if not any(ln.startswith("mul") and ".f32" in ln for ln in lines):
        errs.append("no FP32 multiply (the scale)")
    timer = any("%globaltimer" in ln for ln in lines)
    if bool(v.budget_ns) != timer:
        errs.append("watchdog build without %globaltimer" if v.budget_ns
                    else "plain build reads %globaltimer")
    return errs


def variants(hiddens, tps) -> list[Variant]:
    """The compile-check variants (``OpSpec.compile_variants``): the consumer
    for every (hidden, tp), plain and watchdog."""
    from kernels.validation import norm_threads

    out = []
    for hidden in hiddens:
        norm_threads(hidden)  # ValueError for a hidden the consumer does not take
        for tp in tps:
            for budget_ns in (0, DEFAULT_BUDGET_NS):
                config = ScaledSumConfig(hidden=hidden, tp=tp, budget_ns=budget_ns)

                def build(arch, dump, config=config):
                    return compile_scaled_sum(dataclasses.replace(config, arch=arch),
                                              dump_dir=dump)
                out.append(Variant(OP, "consumer", "ScaledSumKernel", build,
                                   budget_ns=budget_ns, hidden=hidden, tp=tp,
                                   check=check_scaled_sum))
    return out
