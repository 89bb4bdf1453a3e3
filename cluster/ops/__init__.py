"""The op registry: one :class:`~cluster.ops.spec.OpSpec` per op, by name.

Every job, suite filter, row and page reads op facts from here (the case
fields and their validation, input kinds, reference and check, the emulated
payload and epilogue, the GPU rank and virtual-rank kernels, compile
variants, baselines, applicable fault kinds, the timed workload's name).
Adding an op is one module in this package with its declaration (``SPEC``),
plus its kernel and reference (docs/adding-an-op.md): every module here
that defines ``SPEC`` is registered on import, in module-name order;
:func:`register` adds one at run time (tests, plug-ins). An op declared
outside this package reaches every process of a run (the driver and its
rank actors, which import this package anew) through
``LAMPORT_OP_MODULES``: comma-separated module names, imported after the
package's own ops, each of which calls :func:`register` on import.

Importing this package imports no torch: declarations are plain data, and
the torch-side functions live behind ``OpSpec.module()``.
"""

from __future__ import annotations

import importlib
import os
import pkgutil

from cluster.ops.spec import Field, OpSpec, import_if_present

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


def golden_cases() -> dict:
    """Every golden case (``kernels.reference.cases.GOLDEN_CASES``, by name)
    once each registered op's ``golden`` module is imported (torch: the
    references); ValueError naming the op when its module does not exist."""
    from kernels.reference.cases import GOLDEN_CASES
    for name, spec in OPS.items():
        if spec.golden and import_if_present(spec.golden) is None:
            raise ValueError(f"op {name}: golden = {spec.golden!r} is no module")
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


for _spec in _declared():
    register(_spec)
_plugins()

__all__ = ["Field", "OPS", "OpSpec", "collective", "compiled", "get", "golden_cases", "names",
           "profiled", "register", "unregister"]
