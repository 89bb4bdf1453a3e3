"""``OpSpec``: everything the jobs need to know about one op, in one frozen
declaration (the nccl-tests ``testColl`` idea in Python).

A declaration is plain data plus the dotted name of the module that holds
its torch-side functions (``impl``), so importing the registry never imports
torch. The functions an ``impl`` module provides (all on CPU torch tensors,
deterministic in the case, a :class:`cluster.cases.Case`: ``case.seed``,
``case.params.<field>``; see :mod:`cluster.ops.all_reduce_norm` for a
complete example):

``make_inputs(case, *, tp, hidden, tokens) -> dict``
    every tensor of the group's call (each rank regenerates them and takes
    its own share, so no tensor crosses Ray);
``expected(case, inputs, *, tp, facts) -> dict[str, (tensor, bound)]``
    the torch reference per output, with its bound: ``0`` bit for bit, an
    int ``n`` within n BF16 ULP (docs/design.md, Numerical contract); the
    checks of a call's tp ranks may share one ``inputs`` dict, so what
    every rank's reference needs is computed once and kept there
    (:func:`shared`);
collective ops also
``payload(case, inputs, rank) -> tensor [M, hidden] BF16``
    what rank ``rank`` publishes into the Lamport mailbox (the emulated
    backend's publish);
``epilogue(case, inputs, reduced, rank) -> dict[str, tensor]``
    the consumer's epilogue from the all-reduced BF16 ``[M, hidden]`` sum
    (the emulated backend's consumer, from the reference);
and for GPUs
``RankKernel`` (one rank on a Lamport mailbox, :class:`cluster.gpu.rank.GpuRank`)
and ``VirtualKernel`` (tp ranks in one process, :mod:`cluster.gpu.virtual`):
their contract is what :class:`cluster.gpu.rank.GpuRank` and :mod:`cluster.gpu.virtual` call.
Both, and the timed workload, build the kernel through the op's one
builder (``kernel``, :mod:`cluster.ops.kernel`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

def shared(inputs: dict, key: Any, make: Callable[[], Any]) -> Any:
    """``inputs[key]``, made by ``make()`` on first use: a reference's
    intermediate that every rank of a call needs (the tp checks of one
    call share one ``inputs`` dict; :func:`cluster.cases.check_outputs`)."""
    if key not in inputs:
        inputs[key] = make()
    return inputs[key]


GENERIC_FIELDS = ("op", "tokens", "inputs", "seed", "eps", "budget_ns")
"""Case fields every op takes (cluster.cases.make_case validates them)."""


@dataclasses.dataclass(frozen=True)
class Field:
    """One op-specific case field: its default and what it accepts."""
    default: Any
    check: tuple | Callable[[Any], bool]
    """A tuple of choices, or a predicate."""
    doc: str
    kernel_only: bool = False
    """True: the field picks the kernel a rank builds, nothing of the TP
    group (same mailbox, same protocol; every call leaves the mailbox all
    sentinel), so cases that differ only in it share one group
    (``jobs.config.Case.group_key``): one group build instead of one per
    value."""

    def validate(self, name: str, value: Any, op: str) -> Any:
        ok = value in self.check if isinstance(self.check, tuple) else self.check(value)
        if not ok:
            what = f"one of {list(self.check)}" if isinstance(self.check, tuple) else self.doc
            raise ValueError(f"op {op}: {name} = {value!r} is not valid; expected {what}")
        return value


def import_if_present(name: str) -> ModuleType | None:
    """Module ``name`` imported, or None when there is no such module; a
    module that exists but fails to import raises its own error (a missing
    dependency says which)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name is None or not (name == err.name or name.startswith(err.name + ".")):
            raise  # the module exists; something it imports does not
        return None


def resolve(path: str, what: str) -> Callable:
    """The callable at dotted ``path`` (``package.module.attr``), its module
    imported now. ValueError naming ``what`` and ``path`` when the module or
    the attribute does not exist or is not callable; a module that exists
    but fails to import raises its own error (a missing dependency says
    which)."""
    if not isinstance(path, str) or "." not in path:
        raise ValueError(f"{what}: {path!r} is not a dotted 'package.module.attr' name")
    module, _, attr = path.rpartition(".")
    found = getattr(import_if_present(module), attr, None)
    if not callable(found):
        raise ValueError(f"{what}: nothing callable at {path!r}")
    return found


def positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One op of the service (see the module docstring)."""
    name: str
    summary: str
    collective: bool
    """False: no Lamport exchange; the op runs on each rank actor's GPU on
    its own, and its rows say ``collective=false``."""
    impl: str
    """Dotted module name of the torch-side functions (module docstring)."""
    inputs: tuple[str, ...]
    """Input kinds ``make_inputs`` generates; the first is the default."""
    fields: Mapping[str, Field] = dataclasses.field(default_factory=dict)
    """Op-specific case fields (top_k, hc, finalize, ...)."""
    reference: str = ""
    """The torch reference, ``module:function`` (for docs and rows)."""
    compile_variants: str = ""
    """Dotted name of the kernel-side provider of what ``python -m jobs
    compile-check`` compiles and checks for this op, ``provider(hiddens,
    tps) -> list[kernels.ptx_checks.Variant]`` (e.g.
    ``kernels.lamport.compile_variants.all_reduce_norm_variants``); empty:
    the op has no compile variants. Called through :meth:`variants`."""
    golden: str = ""
    """Dotted name of the kernel-side module whose import registers this op's
    golden cases (:func:`kernels.reference.cases.register`, files under
    tests/golden/); empty: none. :func:`cluster.ops.golden_cases` imports them
    for the self-check and tests/test_golden.py."""
    baselines: tuple[str, ...] = ()
    """What the profile compares the fused kernel with."""
    faults: tuple[str, ...] = ()
    """cluster.faults kinds whose expected outcome applies to this op."""
    workload: str = ""
    """Dotted name of its timed workload builder, ``package.module.function``
    (e.g. ``cluster.measure.workloads.norm.all_reduce_norm_workload``; contract
    :mod:`cluster.measure.workload`); empty: the op is not timed."""
    kernel: str = ""
    """Dotted name of the op's kernel builder, the one place its host kernel
    is constructed for every placement (contract: :mod:`cluster.ops.kernel`;
    e.g. ``cluster.ops.all_reduce_norm.kernel``); empty: the op has no GPU
    kernel. Called through :meth:`build_kernel`."""
    needs_gpu: str | None = None
    """Why the emulated backend cannot carry it (None: it can)."""
    virtual_ranks: bool = True
    """Whether the virtual-ranks placement carries it."""

    def __post_init__(self) -> None:
        if not self.inputs:
            raise ValueError(f"op {self.name}: inputs must name at least one input kind")
        clash = set(self.fields) & set(GENERIC_FIELDS)
        if clash:
            raise ValueError(f"op {self.name}: fields {sorted(clash)} are generic case fields")

    def module(self) -> ModuleType:
        """The ``impl`` module (imports torch)."""
        return importlib.import_module(self.impl)

    def workload_builder(self) -> Callable:
        """The timed workload builder named by ``workload``, imported when
        asked for (:func:`resolve`); ValueError if the op declares none."""
        if not self.workload:
            raise ValueError(f"op {self.name} declares no timed workload")
        return resolve(self.workload, f"timing workload of op {self.name!r}")

    def build_kernel(self, params: Any, **where: Any):
        """The op's host kernel from ``params`` (its :attr:`params` value: a
        case's ``case.params``, or :meth:`make_params` of a timing spec's
        fields) and ``eps`` for the placement ``where`` describes
        (:mod:`cluster.ops.kernel`); ValueError if the op declares no builder."""
        if not self.kernel:
            raise ValueError(f"op {self.name} declares no kernel builder")
        return resolve(self.kernel, f"kernel builder of op {self.name!r}")(params, **where)

    def variants(self, hiddens, tps) -> list:
        """The op's compile-check variants for the requested hidden sizes and
        tp values (its ``compile_variants`` provider, imported now: the
        kernels and CuTe DSL); ValueError if the op declares none, or if the
        provider returns a variant of another op."""
        if not self.compile_variants:
            raise ValueError(f"op {self.name} declares no compile variants")
        out = list(resolve(self.compile_variants,
                           f"compile variants of op {self.name!r}")(hiddens, tps))
        other = sorted({v.op for v in out} - {self.name})
        if other:
            raise ValueError(f"op {self.name}: its provider {self.compile_variants!r} returned "
                             f"variants of ops {other}")
        return out

    @functools.cached_property
    def params(self) -> type:
        """The frozen dataclass of this op's own case fields, derived from
        :attr:`fields` (their one declaration): one attribute per field,
        its default the field's, each value validated on construction
        (:meth:`Field.validate`, ValueError naming the field and the value).
        A :class:`cluster.cases.Case` carries one as ``case.params``
        (``case.params.top_k``); it pickles as part of that case."""
        return params_type(self)

    def make_params(self, given: Mapping[str, Any]):
        """This op's :attr:`params` from ``given`` (its own fields taken,
        anything else ignored; defaults filled in), validated."""
        return self.params(**{k: given[k] for k in self.fields if k in given})

    def case_fields(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The op fields of a case: defaults overlaid with ``given`` (only
        this op's fields), each validated."""
        out = {}
        for name, field in self.fields.items():
            out[name] = field.validate(name, given.get(name, field.default), self.name)
        return out


def params_type(spec: OpSpec) -> type:
    """``spec``'s :attr:`OpSpec.params` class: ``<Op>Params`` (e.g.
    ``AllReduceNormParams``), frozen, its module the op's ``impl``."""
    fields = spec.fields

    def __post_init__(self) -> None:
        for name, field in fields.items():
            field.validate(name, getattr(self, name), spec.name)

    name = "".join(part.title() for part in spec.name.split("_")) + "Params"
    cls = dataclasses.make_dataclass(
        name, [(k, Any, dataclasses.field(default=f.default)) for k, f in fields.items()],
        namespace={"__post_init__": __post_init__,
                   "__doc__": f"The case fields of op {spec.name} (OpSpec.params)."},
        frozen=True)
    cls.__module__ = spec.impl
    return cls
