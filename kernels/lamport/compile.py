"""Compile entry points and the compile cache for the Lamport kernels.

Every kernel takes addresses (Int64) and runtime scalars only, so the fake
arguments are plain scalars: the same function compiles on a machine with
no GPU (set ``CUTE_DSL_ARCH`` or pass ``arch``) and on the GPU machine.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any

from .protocol import VEC_BF16


@dataclasses.dataclass(frozen=True)
class PublishConfig:
    tp: int
    transport: str = "unicast"
    arch: str = ""  # "" = the current device / CUTE_DSL_ARCH


@dataclasses.dataclass(frozen=True)
class NormConfig:
    hidden: int
    tp: int
    watchdog_ns: int = 0
    arch: str = ""


_cache: dict[Any, Any] = {}
_lock = threading.Lock()


def _options(arch: str, dump_dir: str | None) -> str:
    opts = []
    if arch:
        opts.append(f"--gpu-arch {arch}")
    if dump_dir:
        os.makedirs(dump_dir, exist_ok=True)  # the DSL skips a missing dir silently
        opts.append(f"--keep-ptx --dump-dir {dump_dir}")
    return " ".join(opts)


def compile_publish(config: PublishConfig, *, dump_dir: str | None = None):
    import cutlass.cute as cute
    from cutlass import Int32, Int64
    from cutlass.cute.runtime import make_fake_stream

    from .publish import PublishKernel

    kernel = PublishKernel(tp=config.tp, transport=config.transport)
    return cute.compile(kernel, Int64(0), Int64(0), Int64(0), Int64(0), Int32(0),
                        Int32(1), Int32(VEC_BF16), Int32(1), Int32(1),
                        make_fake_stream(), options=_options(config.arch, dump_dir))


def compile_norm(config: NormConfig, *, dump_dir: str | None = None):
    import cutlass.cute as cute
    from cutlass import Float32, Int32, Int64
    from cutlass.cute.runtime import make_fake_stream

    from .norm import NormKernel

    kernel = NormKernel(hidden=config.hidden, tp=config.tp, watchdog_ns=config.watchdog_ns)
    return cute.compile(kernel, *([Int64(0)] * 7), Int32(1), Int32(1), Float32(1e-6),
                        Int32(1), make_fake_stream(), options=_options(config.arch, dump_dir))


def cached(config):
    """The compiled kernel for a config, compiled once per process."""
    with _lock:
        hit = _cache.get(config)
    if hit is not None:
        return hit
    if isinstance(config, PublishConfig):
        compiled = compile_publish(config)
    elif isinstance(config, NormConfig):
        compiled = compile_norm(config)
    else:
        raise TypeError(f"unknown kernel config {config!r}")
    with _lock:
        return _cache.setdefault(config, compiled)
