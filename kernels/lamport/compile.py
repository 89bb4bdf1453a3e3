"""Compile entry points and the compile cache for the Lamport kernels.

Every ``compile_*`` goes through the persistent on-disk cache
(:mod:`kernels.compile_cache`); :func:`cached` adds the in-process one.

Every kernel takes addresses (Int64) and runtime scalars only, so the fake
arguments are plain scalars: the same function compiles on a machine with
no GPU (set ``CUTE_DSL_ARCH`` or pass ``arch``) and on the GPU machine.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any

from kernels.compile_cache import persistent

from .protocol import VEC_BF16


@dataclasses.dataclass(frozen=True)
class PublishConfig:
    tp: int
    transport: str = "unicast"
    arch: str = ""  # "" = the current device / CUTE_DSL_ARCH
    mode: str = "one_shot"  # kernels.lamport.protocol.MODES


@dataclasses.dataclass(frozen=True)
class NormConfig:
    hidden: int
    tp: int
    budget_ns: int = 0
    arch: str = ""
    mode: str = "one_shot"


@dataclasses.dataclass(frozen=True)
class SingleNormConfig:
    """:class:`kernels.lamport.norm_single.SingleNormKernel` (one-shot only).
    ``plant_delay_cycles`` > 0: the test-only slowed build (its docstring);
    a field, so the compile cache keys it apart."""
    hidden: int
    tp: int
    budget_ns: int = 0
    transport: str = "unicast"
    arch: str = ""
    plant_delay_cycles: int = 0


_cache: dict[Any, Any] = {}
_lock = threading.Lock()


def _options(arch: str, dump_dir: str | None) -> str:
    opts = []
    if arch:
        opts.append(f"--gpu-arch {arch}")
    if dump_dir:
        os.makedirs(dump_dir, exist_ok=True)  # the DSL skips a missing dir silently
        opts.append(f"--keep-ptx --keep-cubin --dump-dir {dump_dir}")
    return " ".join(opts)


@persistent
def compile_publish(config: PublishConfig, *, dump_dir: str | None = None):
    import cutlass.cute as cute
    from cutlass import Int32, Int64
    from cutlass.cute.runtime import make_fake_stream

    from .publish import PublishKernel

    kernel = PublishKernel(tp=config.tp, transport=config.transport,
                           owner=config.mode == "owner")
    return cute.compile(kernel, Int64(0), Int64(0), Int64(0), Int64(0), Int32(0),
                        Int32(1), Int32(VEC_BF16), Int32(1), Int32(1),
                        make_fake_stream(), options=_options(config.arch, dump_dir))


@persistent
def compile_norm(config: NormConfig, *, dump_dir: str | None = None):
    import cutlass.cute as cute
    from cutlass import Float32, Int32, Int64
    from cutlass.cute.runtime import make_fake_stream

    from .norm import NormKernel

    kernel = NormKernel(hidden=config.hidden, tp=config.tp, budget_ns=config.budget_ns,
                        owner=config.mode == "owner")
    return cute.compile(kernel, *([Int64(0)] * 7), Int32(1), Int32(1), Float32(1e-6),
                        Int32(1), Int32(0), make_fake_stream(),
                        options=_options(config.arch, dump_dir))


@persistent
def compile_single_norm(config: SingleNormConfig, *, dump_dir: str | None = None):
    import cutlass.cute as cute
    from cutlass import Float32, Int32, Int64
    from cutlass.cute.runtime import make_fake_stream

    from .norm_single import SingleNormKernel

    kernel = SingleNormKernel(hidden=config.hidden, tp=config.tp, budget_ns=config.budget_ns,
                              transport=config.transport,
                              plant_delay_cycles=config.plant_delay_cycles)
    return cute.compile(kernel, *([Int64(0)] * 9), Int32(1), Int32(1), Float32(1e-6),
                        Int32(1), Int32(0), Int32(0), Int32(1), make_fake_stream(),
                        options=_options(config.arch, dump_dir))


def cached(config):
    """The compiled kernel for a config: once per process, and from the
    on-disk cache (kernels.compile_cache) when an earlier process compiled it."""
    with _lock:
        hit = _cache.get(config)
    if hit is not None:
        return hit
    compiler = _COMPILERS.get(type(config))
    if compiler is None:
        raise TypeError(f"unknown kernel config {config!r}; registered: "
                        f"{sorted(t.__name__ for t in _COMPILERS)}")
    compiled = compiler(config)
    with _lock:
        return _cache.setdefault(config, compiled)


# ---------------------------------------------------------------- MoE finalize, embedding
@dataclasses.dataclass(frozen=True)
class FinalizePublishConfig:
    tp: int
    top_k: int
    elements_per_thread: int = 4
    fp32_weights: bool = True
    routed_scaling_factor: float = 1.0
    shared: str = "after"            # "none" | "before" | "after" griddepcontrol.wait
    prefetch_group: int | None = None  # None = top_k
    transport: str = "unicast"
    arch: str = ""
    mode: str = "one_shot"


@dataclasses.dataclass(frozen=True)
class SingleFinalizeNormConfig:
    """:class:`kernels.lamport.finalize_single.SingleFinalizeNormKernel`
    (one-shot only; 16-byte fragments always)."""
    hidden: int
    tp: int
    top_k: int
    budget_ns: int = 0
    fp32_weights: bool = True
    routed_scaling_factor: float = 1.0
    shared: str = "after"
    prefetch_group: int | None = None
    transport: str = "unicast"
    arch: str = ""


@dataclasses.dataclass(frozen=True)
class EmbedPublishConfig:
    tp: int
    transport: str = "unicast"
    arch: str = ""


@dataclasses.dataclass(frozen=True)
class SingleEmbedNormConfig:
    """:class:`kernels.lamport.embed_single.SingleEmbedNormKernel`."""
    hidden: int
    tp: int
    budget_ns: int = 0
    transport: str = "unicast"
    arch: str = ""


@dataclasses.dataclass(frozen=True)
class EmbedNormConfig:
    hidden: int
    tp: int
    budget_ns: int = 0
    arch: str = ""


@persistent
def compile_finalize_publish(config: FinalizePublishConfig, *, dump_dir: str | None = None):
    import cutlass.cute as cute
    from cutlass import Int32, Int64
    from cutlass.cute.runtime import make_fake_stream

    from .finalize_publish import FinalizePublishKernel

    kernel = FinalizePublishKernel(
        tp=config.tp, top_k=config.top_k, elements_per_thread=config.elements_per_thread,
        fp32_weights=config.fp32_weights, routed_scaling_factor=config.routed_scaling_factor,
        shared=config.shared, prefetch_group=config.prefetch_group, transport=config.transport,
        owner=config.mode == "owner")
    return cute.compile(kernel, *([Int64(0)] * 4), Int32(1), *([Int64(0)] * 3), Int32(0),
                        Int32(1), Int32(VEC_BF16), Int32(1), Int32(1), make_fake_stream(),
                        options=_options(config.arch, dump_dir))


@persistent
def compile_single_finalize_norm(config: SingleFinalizeNormConfig, *,
                                 dump_dir: str | None = None):
    import cutlass.cute as cute
    from cutlass import Float32, Int32, Int64
    from cutlass.cute.runtime import make_fake_stream

    from .finalize_single import SingleFinalizeNormKernel

    kernel = SingleFinalizeNormKernel(
        hidden=config.hidden, tp=config.tp, top_k=config.top_k, budget_ns=config.budget_ns,
        transport=config.transport, fp32_weights=config.fp32_weights,
        routed_scaling_factor=config.routed_scaling_factor, shared=config.shared,
        prefetch_group=config.prefetch_group)
    return cute.compile(kernel, *([Int64(0)] * 4), Int32(1), *([Int64(0)] * 8), Int32(1),
                        Int32(1), Float32(1e-6), Int32(1), Int32(0), Int32(0), Int32(1),
                        make_fake_stream(), options=_options(config.arch, dump_dir))


@persistent
def compile_single_embed_norm(config: SingleEmbedNormConfig, *, dump_dir: str | None = None):
    import cutlass.cute as cute
    from cutlass import Float32, Int32, Int64
    from cutlass.cute.runtime import make_fake_stream

    from .embed_single import SingleEmbedNormKernel

    kernel = SingleEmbedNormKernel(hidden=config.hidden, tp=config.tp,
                                   budget_ns=config.budget_ns, transport=config.transport)
    return cute.compile(kernel, Int64(0), Int64(0), Int32(0), Int32(1), *([Int64(0)] * 9),
                        Int32(1), Int32(1), Float32(1e-6), Int32(1), Int32(0), Int32(0),
                        Int32(1), make_fake_stream(), options=_options(config.arch, dump_dir))


@persistent
def compile_embed_publish(config: EmbedPublishConfig, *, dump_dir: str | None = None):
    import cutlass.cute as cute
    from cutlass import Int32, Int64
    from cutlass.cute.runtime import make_fake_stream

    from .embed import EmbedPublishKernel

    kernel = EmbedPublishKernel(tp=config.tp, transport=config.transport)
    return cute.compile(kernel, *([Int64(0)] * 5), Int32(0), Int32(1), Int32(VEC_BF16),
                        Int32(0), Int32(1), Int32(1), Int32(1), make_fake_stream(),
                        options=_options(config.arch, dump_dir))


@persistent
def compile_embed_norm(config: EmbedNormConfig, *, dump_dir: str | None = None):
    import cutlass.cute as cute
    from cutlass import Float32, Int32, Int64
    from cutlass.cute.runtime import make_fake_stream

    from .embed import EmbedNormKernel

    kernel = EmbedNormKernel(hidden=config.hidden, tp=config.tp,
                             budget_ns=config.budget_ns)
    return cute.compile(kernel, *([Int64(0)] * 8), Int32(1), Int32(1), Float32(1e-6),
                        Int32(1), make_fake_stream(), options=_options(config.arch, dump_dir))


_COMPILERS = {
    PublishConfig: compile_publish,
    NormConfig: compile_norm,
    SingleNormConfig: compile_single_norm,
    FinalizePublishConfig: compile_finalize_publish,
    SingleFinalizeNormConfig: compile_single_finalize_norm,
    EmbedPublishConfig: compile_embed_publish,
    EmbedNormConfig: compile_embed_norm,
    SingleEmbedNormConfig: compile_single_embed_norm,
}


def register_compiler(config_type: type, compiler) -> None:
    """Let :func:`cached` compile configs of ``config_type`` (a frozen,
    hashable dataclass) with ``compiler(config)``; used by kernels defined
    outside this module."""
    _COMPILERS[config_type] = compiler
