"""The op contract, typed: what an op's implementation provides, as
:class:`typing.Protocol` classes, and :func:`check`, which holds a
declaration to them when the op registers (:func:`cluster.ops.register`).

An op's parts (:func:`parts`):

- the reference (required): its ``impl`` module is a :class:`Reference`
  (a collective's a :class:`CollectiveReference`);
- a GPU kernel (optional): ``impl.RankKernel``, a :class:`RankKernel` (an op
  that is no collective also a :class:`LocalRankKernel`);
- a virtual-rank kernel (optional): ``impl.VirtualKernel``, a :class:`VirtualKernel`;
- a timed workload (optional): ``OpSpec.workload`` names a :class:`WorkloadBuilder`;
- goldens (optional): ``OpSpec.golden`` names a :class:`GoldenProvider`.

What an op lacks is never faked: its rows are ``skipped`` with the reason
:func:`lacking` gives (correctness and faults on the gpu backend or the
virtual-ranks placement; the profile job skips an op with no workload).

:func:`check` imports the ``impl`` module and the kernel builder's module
(they import no torch: the registry stays light) and only locates the
modules of the workload, the goldens, the reference and the compile
variants (they import torch or CuTe DSL); ``python -m jobs check-op``
resolves those too (:func:`resolve_all`).
"""

from __future__ import annotations

import importlib.util
import inspect
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from cluster.ops.spec import OpSpec


class ContractError(TypeError):
    """A declaration or implementation that does not meet the op contract;
    the message names the op and the missing or wrong attribute."""


@runtime_checkable
class Reference(Protocol):
    """The ``impl`` module of every op (CPU torch tensors, deterministic in
    the case, a frozen :class:`cluster.cases.Case`: ``case.seed``,
    ``case.inputs``, the op's own fields as ``case.params.<name>``):
    ``make_inputs`` every tensor of the group's call, ``expected``
    the reference per output with its bound (``0`` bit for bit, ``n`` within
    n BF16 ULP)."""

    def make_inputs(self, case, *, tp: int, hidden: int, tokens: int) -> dict: ...

    def expected(self, case, inputs: dict, *, tp: int, facts: dict) -> dict: ...


@runtime_checkable
class CollectiveReference(Reference, Protocol):
    """A collective's ``impl`` module also gives the emulated backend what a
    rank publishes and the consumer's epilogue from the reduced BF16 sum."""

    def payload(self, case, inputs: dict, rank: int): ...

    def epilogue(self, case, inputs: dict, reduced, rank: int) -> dict: ...


@runtime_checkable
class RankKernel(Protocol):
    """One rank's kernel on its Lamport mailbox (driven by
    :class:`cluster.gpu.rank.GpuRank`): constructed as ``RankKernel(mailbox,
    *, hidden, capacity, transport, budget_ns, case)``; ``key(case,
    budget_ns)`` (a staticmethod) says which cases share one built kernel;
    ``load`` the rank's share of the inputs, ``publish`` / ``consume`` the
    two halves (an optional ``call`` runs the whole call as a caller makes
    it), ``outputs`` their bits by name, ``facts`` what the reference takes
    from the kernel's decisions."""

    @staticmethod
    def key(case, budget_ns: int) -> tuple: ...

    def load(self, case, inputs: dict, rank: int, device) -> None: ...

    def publish(self) -> None: ...

    def consume(self) -> None: ...

    def outputs(self) -> dict: ...

    def facts(self) -> dict: ...


@runtime_checkable
class LocalRankKernel(RankKernel, Protocol):
    """An op that is no collective checks its own outputs (``check``, in
    :func:`cluster.cases.compare`'s format)."""

    def check(self) -> dict: ...


@runtime_checkable
class VirtualKernel(Protocol):
    """tp ranks in one process (driven by :mod:`cluster.gpu.virtual`):
    constructed as ``VirtualKernel(*, tp, hidden, capacity, budget_ns,
    case)``, with a ``group`` attribute (the kernel's virtual ranks:
    ``diagnose()``, ``is_all_sentinel()``, ``device``); ``load`` the call's
    inputs into static buffers, ``__call__`` the call (captured in a CUDA
    graph), ``outputs(rank)`` a rank's bits, ``facts`` as for a rank."""

    def load(self, case, inputs: dict, tokens: int) -> None: ...

    def __call__(self) -> None: ...

    def outputs(self, rank: int) -> dict: ...

    def facts(self) -> dict: ...


@runtime_checkable
class WorkloadBuilder(Protocol):
    """``builder(ctx, spec) -> cluster.measure.workload.Workload``
    (contract: :mod:`cluster.measure.workload`)."""

    def __call__(self, ctx, spec): ...


@runtime_checkable
class GoldenProvider(Protocol):
    """The module ``OpSpec.golden`` names: importing it registers the op's
    golden cases (:func:`kernels.reference.cases.register`, each a
    ``GoldenCase(name, op, compute, make, directory)``; ``directory`` holds
    their files, default the repository's tests/golden/). Its cases are
    those of :data:`kernels.reference.cases.GOLDEN_CASES` whose ``op`` is the
    op's name (:func:`golden_cases`)."""

    __name__: str


REFERENCE_FUNCTIONS = ("make_inputs", "expected")
COLLECTIVE_FUNCTIONS = ("payload", "epilogue")


def _methods(protocol: type) -> tuple[str, ...]:
    """The members a Protocol class declares (its own and its bases')."""
    names: list[str] = []
    for base in reversed(protocol.__mro__):
        if base in (object, Protocol, Any) or base.__name__ in ("Protocol", "Generic"):
            continue
        names += [n for n, v in vars(base).items()
                  if (callable(v) or isinstance(v, staticmethod))
                  and (not n.startswith("_") or n == "__call__")]
    return tuple(dict.fromkeys(names))


def missing(obj: Any, protocol: type) -> list[str]:
    """The members of ``protocol`` that ``obj`` (a module or a class) lacks
    or holds as something not callable."""
    def has(name: str) -> bool:
        if inspect.isclass(obj):  # a class is callable: look for its own members
            found = next((vars(b)[name] for b in obj.__mro__[:-1] if name in vars(b)), None)
            return isinstance(found, (staticmethod, classmethod)) or callable(found)
        return callable(getattr(obj, name, None))
    return [n for n in _methods(protocol) if not has(n)]


def _where(spec: OpSpec) -> str:
    return f"op {spec.name!r} (impl {spec.impl!r})"


def _located(spec: OpSpec, field: str, path: str, sep: str = ".") -> list[str]:
    """Problems of a dotted name (``module<sep>attr``) whose module is only
    located, not imported (it imports torch or CuTe DSL)."""
    module, found, attr = path.rpartition(sep)
    if not found or not module or not attr:
        want = "package.module:function" if sep == ":" else "package.module.attr"
        return [f"{field} = {path!r} is not a dotted {want!r} name"]
    return [] if _findable(module) else [f"{field} = {path!r}: no module {module!r} on sys.path"]


def _findable(module: str) -> bool:
    """Whether ``module`` exists, without importing it (its parent packages are)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def problems(spec: OpSpec) -> list[str]:
    """Every way ``spec`` and its ``impl`` module miss the contract, each a
    sentence naming the attribute (empty: it meets it). Imports the ``impl``
    module and the kernel builder's module."""
    from cluster.ops.spec import import_if_present, resolve

    out: list[str] = []
    module = import_if_present(spec.impl) if isinstance(spec.impl, str) and spec.impl else None
    if module is None:
        return [f"impl = {spec.impl!r} is no module on sys.path"]
    protocol = CollectiveReference if spec.collective else Reference
    out += [f"impl module {spec.impl!r} lacks {name}() ({protocol.__name__}: "
            f"cluster.ops.contract)" for name in missing(module, protocol)]
    rank = getattr(module, "RankKernel", None)
    if rank is not None:
        kind = RankKernel if spec.collective else LocalRankKernel
        if not inspect.isclass(rank):
            out.append(f"{spec.impl}.RankKernel is a {type(rank).__name__}, not a class")
        else:
            out += [f"{spec.impl}.RankKernel lacks {name}() ({kind.__name__}: "
                    f"cluster.ops.contract)" for name in missing(rank, kind)]
    virtual = getattr(module, "VirtualKernel", None)
    if virtual is not None:
        if not inspect.isclass(virtual):
            out.append(f"{spec.impl}.VirtualKernel is a {type(virtual).__name__}, not a class")
        else:
            out += [f"{spec.impl}.VirtualKernel lacks {name}() (VirtualKernel: "
                    f"cluster.ops.contract)" for name in missing(virtual, VirtualKernel)]
        if not spec.collective:
            out.append(f"{spec.impl}.VirtualKernel: op is no collective; virtual ranks carry "
                       f"collectives only")
    if spec.kernel:
        try:
            resolve(spec.kernel, "kernel")
        except ValueError as err:
            out.append(str(err))
    if spec.reference:
        out += _located(spec, "reference", spec.reference, ":")
    for field in ("workload", "compile_variants"):
        if getattr(spec, field):
            out += _located(spec, field, getattr(spec, field))
    if spec.golden and not _findable(spec.golden):
        out.append(f"golden = {spec.golden!r}: no module {spec.golden!r} on sys.path")
    if spec.faults and not spec.collective:
        out.append("faults: an op that is no collective meets no fault of the Lamport protocol")
    return out


def check(spec: OpSpec) -> None:
    """ContractError listing every problem (:func:`problems`), naming the op."""
    found = problems(spec)
    if found:
        raise ContractError(f"{_where(spec)} does not meet the op contract: "
                            + "; ".join(found))


def parts(spec: OpSpec) -> dict[str, bool]:
    """Which optional parts the op has: ``gpu_kernel`` (a RankKernel),
    ``virtual_kernel`` (a VirtualKernel), ``workload``, ``goldens``."""
    module = spec.module()
    return {"gpu_kernel": hasattr(module, "RankKernel"),
            "virtual_kernel": hasattr(module, "VirtualKernel") and spec.virtual_ranks,
            "workload": bool(spec.workload), "goldens": bool(spec.golden)}


def lacking(spec: OpSpec, backend: str, placement: str | None) -> str | None:
    """Why ``spec`` cannot run on ``backend`` at ``placement`` for want of a
    part (a row's skip reason), or None."""
    if backend != "gpu":
        return None
    module = spec.module()
    if not hasattr(module, "RankKernel"):
        return (f"op {spec.name} has no GPU kernel (no RankKernel in {spec.impl}); "
                f"it runs on the emulated backend only")
    if placement == "virtual-ranks" and spec.virtual_ranks and \
            not hasattr(module, "VirtualKernel"):
        return f"op {spec.name} has no virtual-rank kernel (no VirtualKernel in {spec.impl})"
    return None


def resolve_all(spec: OpSpec) -> list[str]:
    """The problems of :func:`problems` plus those found by importing what it
    only located (torch): the reference function, the workload builder (a
    :class:`WorkloadBuilder`), the golden provider (registers at least one
    case of the op), the compile-variants provider."""
    from cluster.ops.spec import resolve

    out = problems(spec)
    if spec.reference and not any(p.startswith("reference") for p in out):
        try:
            resolve(spec.reference.replace(":", "."), "reference")
        except ValueError as err:
            out.append(str(err))
    for field in ("workload", "compile_variants"):
        path = getattr(spec, field)
        if path and not any(p.startswith(field) for p in out):
            try:
                found = resolve(path, field)
            except ValueError as err:
                out.append(str(err))
                continue
            if field == "workload" and len(inspect.signature(found).parameters) < 2:
                out.append(f"workload = {path!r} takes fewer than (ctx, spec)")
    if spec.golden and not any(p.startswith("golden") for p in out):
        if not golden_cases(spec):
            out.append(f"golden = {spec.golden!r} registers no golden case of op {spec.name!r}")
    return out


def golden_cases(spec: OpSpec) -> dict:
    """The golden cases of ``spec`` (its provider imported), by name: those
    whose ``op`` is the op's name or starts with it and ``_`` (the indexer's
    paths: ``indexer_projection``, ``indexer_fused``)."""
    from cluster.ops.spec import import_if_present
    from kernels.reference.cases import GOLDEN_CASES

    if spec.golden and import_if_present(spec.golden) is None:
        raise ValueError(f"op {spec.name}: golden = {spec.golden!r} is no module")
    return {n: c for n, c in GOLDEN_CASES.items()
            if c.op == spec.name or c.op.startswith(spec.name + "_")}
