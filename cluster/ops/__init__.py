"""The op registry: one :class:`~cluster.ops.spec.OpSpec` per op, by name.

Every job, suite filter, row and page reads op facts from here (the case
fields and their validation, input kinds, reference and check, the emulated
payload and epilogue, the GPU rank and virtual-rank kernels, compile
variants, baselines, applicable fault kinds, the timed workload's name).
Adding an op is one module with its declaration (``SPEC``) plus its
kernel and reference, and one line in ``_MODULES``; :func:`register` adds
one at run time (tests, plug-ins).

Importing this package imports no torch: declarations are plain data, and
the torch-side functions live behind ``OpSpec.module()``.
"""

from __future__ import annotations

import importlib

from cluster.ops.spec import Field, OpSpec

_MODULES = ("all_reduce_norm", "finalize_publish", "embed_norm", "all_reduce_mhc", "indexer")

OPS: dict[str, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
    """Add ``spec`` to :data:`OPS`; ValueError if the name is taken."""
    if spec.name in OPS:
        raise ValueError(f"op {spec.name!r} is already registered")
    OPS[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a registered op (tests)."""
    OPS.pop(name, None)


def get(name: str) -> OpSpec:
    """The declaration of op ``name``; ValueError naming the known ops."""
    try:
        return OPS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown op {name!r}; known: {sorted(OPS)}") from None


def names() -> tuple[str, ...]:
    """Registered op names, in registration order."""
    return tuple(OPS)


def profiled() -> tuple[str, ...]:
    """Names of the ops the profile job times: those that declare a timed
    workload (``OpSpec.workload``)."""
    return tuple(n for n, s in OPS.items() if s.workload)


def compiled() -> tuple[str, ...]:
    """Names of the ops with compile-check variants (``OpSpec.compile_variants``)."""
    return tuple(n for n, s in OPS.items() if s.compile_variants)


def collective() -> tuple[str, ...]:
    """Names of the ops that exchange data through a Lamport mailbox."""
    return tuple(n for n, s in OPS.items() if s.collective)


for _name in _MODULES:
    register(importlib.import_module(f"cluster.ops.{_name}").SPEC)

__all__ = ["Field", "OPS", "OpSpec", "collective", "compiled", "get", "names", "profiled",
           "register", "unregister"]
