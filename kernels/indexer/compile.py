"""Compile entry points and the compile cache of the indexer kernels.

The kernels take device addresses (``Int64``) and scalars only, so a config
(shapes, tactic, arch) is the whole compile-cache key and the same function
compiles on a machine with no GPU (``arch="sm_90a"``; PTX kept with
``dump_dir``) and on the GPU machine (``arch=""``: the current device).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from kernels.compile_cache import persistent
from kernels.lamport.compile import _options

from .layout import (FUSED_PARTIAL_SLOTS, FUSED_WARPS, MAX_SMEM_BYTES, ROWS, FusedVariant, Tactic,
                     check_key_first_shape, check_projection_shape, fused_smem_bytes)


@dataclasses.dataclass(frozen=True)
class ProjectionConfig:
    """``IndexerProjection.__call__``: the seed's cache key (rows, K, heads, M)
    plus the key width, the tactic, the arch and where the kernel lets the
    next one launch (``early_launch``: first thing, else after its PDL wait;
    the same bits either way)."""
    key: int
    heads: int
    gate: int
    k: int
    tokens: int
    tactic: Tactic
    arch: str = ""
    early_launch: bool = False

    @property
    def rows(self) -> int:
        return self.key + self.heads + self.gate

    def validate(self) -> None:
        check_projection_shape(self.key, self.heads, self.gate, self.k)
        self.tactic.span(self.k)  # ValueError if K does not tile for the tactic
        if self.tokens < 1:
            raise ValueError(f"tokens must be >= 1, got {self.tokens}")
        if not isinstance(self.early_launch, bool):
            raise ValueError(f"early_launch must be a bool, got {self.early_launch!r}")


@dataclasses.dataclass(frozen=True)
class FusedConfig:
    """``IndexerProjection.fused``: the seed's cache key ("fused", rows, K,
    heads, padded, bf16, M) plus key, gate, the q-scale format, the arch and
    the :class:`~kernels.indexer.layout.FusedVariant`."""
    key: int
    heads: int
    gate: int
    k: int
    tokens: int
    padded: int
    bf16: bool = False
    ue8m0: bool = True
    arch: str = ""
    #: Which loads the kernel issues where (``TacticTable.fused_variant``).
    variant: FusedVariant = FusedVariant()

    @property
    def rows(self) -> int:
        return self.key + self.heads + self.gate

    def validate(self) -> None:
        check_projection_shape(self.key, self.heads, self.gate, self.k)
        if not isinstance(self.variant, FusedVariant):
            raise ValueError(f"variant must be a FusedVariant, got {self.variant!r}")
        if self.tokens < 1:
            raise ValueError(f"tokens must be >= 1, got {self.tokens}")
        if self.padded < self.heads:
            raise ValueError(f"padded must be >= heads = {self.heads}, got {self.padded}")
        self.variant.tactic(self.key).span(self.k)
        if self.variant.spread and (32 * FUSED_WARPS) % self.key:
            raise ValueError(f"the fused kernel {self.variant.name} needs key to divide its "
                             f"{32 * FUSED_WARPS} threads, got key = {self.key}")
        if not self.variant.runs(self.tokens):
            raise ValueError(f"the fused kernel {self.variant.name} runs one token tile: tokens "
                             f"must be <= {self.variant.token_limit}, got {self.tokens}")
        if self.variant.key_first:
            check_key_first_shape(self.key, self.heads, self.gate)
        smem = self.smem_bytes()
        if smem > MAX_SMEM_BYTES:
            raise ValueError(f"the fused kernel {self.variant.name} at K = {self.k}, {self.tokens} "
                             f"tokens needs {smem} B of shared memory, more than {MAX_SMEM_BYTES}")

    def smem_bytes(self) -> int:
        """Dynamic shared memory this config's kernel uses (an upper bound)."""
        return (fused_smem_bytes(self.tokens, FUSED_PARTIAL_SLOTS, self.key)
                + self.variant.bulk_tile_bytes(self.k, self.key)
                + self.variant.gather_bytes(self.tokens, self.key)
                + self.variant.x_stage_bytes(self.tokens, self.k, self.key))


def _fused_shape(config: FusedConfig):
    from .kernel import FusedShape

    order, first = config.variant.layout(config.key, config.heads, config.gate)
    return FusedShape(padded=config.padded, ctas=len(order) // ROWS, first_head=first,
                      bf16=config.bf16, ue8m0=config.ue8m0, variant=config.variant)


@persistent
def compile_projection(config: ProjectionConfig, *, dump_dir: str | None = None):
    import cutlass.cute as cute
    from cutlass import Int64
    from cutlass.cute.runtime import make_fake_stream

    from .kernel import ProjectionKernel

    config.validate()
    kernel = ProjectionKernel(rows=config.rows, k=config.k, key=config.key, heads=config.heads,
                              tokens=config.tokens, warps=config.tactic.warps,
                              split=config.tactic.split, early_launch=config.early_launch)
    return cute.compile(kernel, *([Int64(0)] * 5), make_fake_stream(),
                        options=_options(config.arch, dump_dir))


@persistent
def compile_fused(config: FusedConfig, *, dump_dir: str | None = None):
    import cutlass.cute as cute
    from cutlass import Float32, Int64
    from cutlass.cute.runtime import make_fake_stream

    from .kernel import ProjectionKernel

    config.validate()
    kernel = ProjectionKernel(rows=config.rows, k=config.k, key=config.key, heads=config.heads,
                              tokens=config.tokens, warps=FUSED_WARPS, split=1,
                              fused=_fused_shape(config))
    return cute.compile(kernel.fused_call, *([Int64(0)] * 11), Float32(1.0), Float32(1e-6),
                        make_fake_stream(), options=_options(config.arch, dump_dir))


_cache: dict[Any, Any] = {}
_lock = threading.Lock()


def cached(config):
    """The compiled kernel of ``config``, compiled once per process."""
    with _lock:
        hit = _cache.get(config)
    if hit is not None:
        return hit
    if isinstance(config, ProjectionConfig):
        compiled = compile_projection(config)
    elif isinstance(config, FusedConfig):
        compiled = compile_fused(config)
    else:
        raise TypeError(f"unknown indexer kernel config {config!r}")
    with _lock:
        return _cache.setdefault(config, compiled)
