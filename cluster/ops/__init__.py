"""The op registry: one :class:`~cluster.ops.spec.OpSpec` per op, by name.

Every job, suite filter, row and page reads op facts from here (the case
fields and their validation, input kinds, reference and check, the emulated
payload and epilogue, the GPU rank and virtual-rank kernels, compile
variants, baselines, applicable fault kinds, the timed workload's name).
Adding an op is one module in this package with its declaration (``SPEC``),
plus its kernel and reference (docs/adding-an-op.md): every module here
that defines ``SPEC`` is registered on import, in module-name order;
:func:`register` adds one at run time (tests, plug-ins). Ops from other
installed packages come through the entry-point group ``lamport_lab.ops``
(:data:`ENTRY_POINTS`: each entry point names an ``OpSpec``, e.g.
``scaled_allreduce = "scaled_allreduce.op:SPEC"`` in the package's
pyproject.toml; examples/scaled_allreduce/), registered after the built-in
ops, in entry-point name order; every process of a run (the driver and its
rank actors, which import this package anew) finds them the same way. A
module not installed as a package reaches them through
``LAMPORT_OP_MODULES``: comma-separated module names, imported last, each
of which calls :func:`register` on import.

Every op is held to the typed contract when it registers
(:func:`cluster.ops.contract.check`: a ContractError naming the missing
attribute), and a name taken by another op is refused, naming both
origins (:data:`ORIGINS`).

Importing this package imports no torch: declarations are plain data, and
the torch-side functions live behind ``OpSpec.module()``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import pkgutil

from cluster.ops import contract
from cluster.ops.spec import Field, OpSpec, import_if_present

OPS: dict[str, OpSpec] = {}
ORIGINS: dict[str, str] = {}
"""Where each registered op comes from: ``built-in <module>``, ``entry
point <name> = <value> (<distribution> <version>)`` or ``registered by
<module>`` (:func:`register` called at run time)."""

ENTRY_POINTS = "lamport_lab.ops"
"""The entry-point group of ops from other installed packages."""


def register(spec: OpSpec, *, origin: str | None = None) -> OpSpec:
    """Add ``spec`` to :data:`OPS` once it meets the op contract
    (:func:`cluster.ops.contract.check`, ContractError naming what is
    missing). ValueError naming both origins if another op has the name;
    registering the same declaration again from the same origin is a no-op
    (a plug-in module that registers itself and is also an entry point)."""
    origin = origin or f"registered by {spec.impl}"
    if spec.name in OPS:
        if OPS[spec.name] is spec:
            return spec
        raise ValueError(f"op {spec.name!r} is already registered ({ORIGINS[spec.name]}); "
                         f"refused from {origin}: rename one")
    contract.check(spec)
    OPS[spec.name] = spec
    ORIGINS[spec.name] = origin
    return spec


def unregister(name: str) -> None:
    """Remove a registered op (tests)."""
    OPS.pop(name, None)
    ORIGINS.pop(name, None)


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


def golden_cases() -> dict:
    """Every golden case (``kernels.reference.cases.GOLDEN_CASES``, by name)
    once each registered op's ``golden`` module is imported (torch: the
    references); ValueError naming the op when its module does not exist."""
    from kernels.reference.cases import GOLDEN_CASES
    for spec in OPS.values():
        contract.golden_cases(spec)
    return GOLDEN_CASES


def collective() -> tuple[str, ...]:
    """Names of the ops that exchange data through a Lamport mailbox."""
    return tuple(n for n, s in OPS.items() if s.collective)


def _declared() -> list[OpSpec]:
    """The ``SPEC`` of every module of this package that defines one, in
    module-name order (``spec`` holds the declaration type, no op)."""
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        spec = getattr(module, "SPEC", None)
        if spec is not None:
            if not isinstance(spec, OpSpec):
                raise TypeError(f"{module.__name__}.SPEC is a {type(spec).__name__}, "
                                f"not an OpSpec")
            found.append(spec)
    return found


PLUGINS_ENV = "LAMPORT_OP_MODULES"
"""Environment variable: modules that register ops of their own (module docstring)."""


def _plugins() -> None:
    """Import each module ``PLUGINS_ENV`` names (they register their ops);
    ImportError naming the variable and the module when one is missing."""
    for name in filter(None, (n.strip() for n in os.environ.get(PLUGINS_ENV, "").split(","))):
        if import_if_present(name) is None:
            raise ImportError(f"{PLUGINS_ENV}: no module {name!r} on sys.path (is its folder "
                              f"on PYTHONPATH?)")


def _entry_points() -> None:
    """Register the op each :data:`ENTRY_POINTS` entry point names (an
    ``OpSpec``, or a module whose ``SPEC`` is one), in name order; an entry
    point that fails to load raises, naming it and its distribution."""
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINTS), key=lambda e: e.name):
        dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "no distribution"
        where = f"entry point {ep.name} = {ep.value!r} ({dist})"
        try:
            found = ep.load()
        except (ImportError, AttributeError) as err:
            raise ImportError(f"{ENTRY_POINTS}: {where} does not load: "
                              f"{type(err).__name__}: {err}") from err
        spec = getattr(found, "SPEC", found)
        if not isinstance(spec, OpSpec):
            raise TypeError(f"{ENTRY_POINTS}: {where} is a {type(spec).__name__}, not an "
                            f"OpSpec (name the declaration, e.g. 'package.module:SPEC')")
        register(spec, origin=where)


for _spec in _declared():
    register(_spec, origin=f"built-in {_spec.impl}")
_entry_points()
_plugins()

__all__ = ["ENTRY_POINTS", "Field", "OPS", "ORIGINS", "OpSpec", "collective", "compiled", "get", "golden_cases", "names",
           "profiled", "register", "unregister"]
