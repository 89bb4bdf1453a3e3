"""The case a TP group runs, its inputs and its check: a thin generic
layer over the op registry (:mod:`cluster.ops`).

A case is one frozen, typed value, :class:`Case` (it crosses process
boundaries through Ray as itself: no field travels as a dict key):

``op``        a registered op (``cluster.ops.OPS``)
``tokens``    M, 1..capacity: every rank publishes and consumes M tokens
``inputs``    an input kind the op generates (its declaration's ``inputs``:
              ``random``, ``order_sensitive``, ``sentinel_pattern`` and the
              op's own edge cases)
``seed``      int; every input tensor derives from it
``eps``       RMSNorm epsilon, > 0
``budget_ns`` the consumer watchdog's budget for the whole consume, > 0
              (see below)
``params``    the op's own fields, one frozen dataclass per op
              (``OpSpec.params``, derived from ``OpSpec.fields``:
              ``case.params.residual``, ``.top_k``, ``.hc``, ``.finalize``,
              ...), defaults filled in
``seq``       the call's sequence number in its group (the group sets it)
``fault``     None, or the injection this rank applies (``cluster.injection``;
              the group sets it per rank)

:func:`make_case` is the one validating constructor; :meth:`Case.to_fields`
gives back the flat fields it was made from (the op's fields beside the
common ones, as a suite, a row and a repro command name them).

Every GPU rank regenerates the group's inputs from these fields
(:func:`case_inputs`) and takes its own share, so no tensor is shipped; the
driver (or the rank) checks the outputs against the op's torch reference
(:func:`check_outputs`). An emulated rank imports no torch: the driver makes
its payload bits and checks its outputs (:mod:`cluster.emulated.host`).

The budget has one name and one unit everywhere: ``budget_ns``, an int of
nanoseconds, the unit of the ``%globaltimer`` deadline the kernels compare
(a kernel constructor's ``budget_ns``; 0 there compiles the plain consumer
with no watchdog). A suite file states it in the same field and unit
(``jobs.config``, bounds ``jobs.limits.LIMITS["budget_ns"]``), so no layer
converts it; host code that compares it with a deadline in seconds divides
by 1e9 at the comparison.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from cluster import ops
from cluster.ops.spec import GENERIC_FIELDS
# The bit helpers live in the leaf module cluster.bits; importers of cluster.cases
# still find them here.
from cluster.bits import bf16_from_bits, bits_from_bf16, from_bits, tensor_bits  # noqa: F401
from kernels.lamport.protocol import DEFAULT_BUDGET_NS
from kernels.validation import require_int, require_number

DEFAULTS = {"op": "all_reduce_norm", "seed": 0, "eps": 1e-6, "budget_ns": DEFAULT_BUDGET_NS}
"""Generic field defaults (``inputs`` defaults to the op's first kind)."""


@dataclasses.dataclass(frozen=True)
class Case:
    """One call's case (the module docstring); made by :func:`make_case`."""
    op: str
    tokens: int
    inputs: str
    seed: int
    eps: float
    budget_ns: int
    params: Any
    """The op's :attr:`cluster.ops.spec.OpSpec.params` value."""
    seq: int = 0
    fault: Mapping | None = None

    def to_fields(self) -> dict[str, Any]:
        """The flat fields :func:`make_case` takes to make this case again:
        the common ones and the op's own (not ``seq`` or ``fault``)."""
        return {"op": self.op, "tokens": self.tokens, "inputs": self.inputs,
                "seed": self.seed, "eps": self.eps, "budget_ns": self.budget_ns,
                **{f.name: getattr(self.params, f.name)
                   for f in dataclasses.fields(self.params)}}

    def replace(self, **changes) -> "Case":
        """This case with ``changes`` (``seq``, ``fault``, ``tokens``, ...)."""
        return dataclasses.replace(self, **changes)

    def __reduce__(self):
        # the op's params class is made at run time (OpSpec.params): a
        # process unpickling a case takes it from its own registry
        return _unpickle, (self.to_fields(), self.seq, self.fault)


def _unpickle(fields: dict, seq: int, fault: Mapping | None) -> Case:
    spec = ops.get(fields["op"])
    common = {k: fields[k] for k in GENERIC_FIELDS}
    return Case(**common, params=spec.make_params(fields), seq=seq, fault=fault)


def make_case(*, capacity: int, **fields) -> Case:
    """A validated :class:`Case`: DEFAULTS and the op's field defaults
    overlaid with ``fields``; ValueError names any unknown field or bad
    value."""
    spec = ops.get(fields.get("op", DEFAULTS["op"]))
    known = set(DEFAULTS) | {"tokens", "inputs"} | set(spec.fields)
    unknown = set(fields) - known
    if unknown:
        raise ValueError(f"unknown case fields {sorted(unknown)} for op {spec.name}; "
                         f"known: {sorted(known)}")
    require_int("capacity", capacity, low=1)
    common = {**DEFAULTS, "inputs": spec.inputs[0],
              **{k: v for k, v in fields.items() if k not in spec.fields}, "op": spec.name}
    params = spec.make_params(fields)
    if common["inputs"] not in spec.inputs:
        raise ValueError(f"op {spec.name}: unknown inputs {common['inputs']!r}; "
                         f"known: {list(spec.inputs)}")
    if "tokens" not in common:
        raise ValueError(f"tokens must be in 1..capacity={capacity}, got None")
    try:
        common["tokens"] = require_int("tokens", common["tokens"], low=1, high=capacity)
    except ValueError:
        raise ValueError(f"tokens must be in 1..capacity={capacity}, "
                         f"got {common['tokens']}") from None
    common["seed"] = require_int("seed", common["seed"], low=0, high=2**31 - 2)
    require_number("eps", common["eps"], positive=True)
    common["budget_ns"] = require_int("budget_ns", common["budget_ns"], low=1, high=2**63 - 1)
    return Case(**common, params=params)


def case_inputs(case: Case, *, tp: int, hidden: int, tokens: int | None = None,
                reference_device=None) -> dict:
    """Every input tensor of the group's call (the op's ``make_inputs``), BF16
    / FP32 / int on CPU, deterministic in the case's fields; ``tokens``
    overrides M. ``reference_device`` (a torch device; None: the CPU) is kept
    as ``inputs["reference_device"]``: where an op's reference may compute
    the parts proven bit-identical to the CPU's there (the finalize payloads:
    :func:`cluster.ops.finalize_publish.payloads`); its results come back to
    the CPU, and everything else of the reference stays on the CPU."""
    m = int(case.tokens if tokens is None else tokens)
    inputs = ops.get(case.op).module().make_inputs(case, tp=tp, hidden=hidden, tokens=m)
    if reference_device is not None:
        inputs["reference_device"] = reference_device
    return inputs


def compare(name: str, got_bits: np.ndarray | None, ref: torch.Tensor, bound: int) -> dict:
    """One output against its reference: ``bound`` 0 = bit for bit, n = within
    n BF16 ULP (BF16 outputs only); NaN never passes. ``got_bits`` None: the
    backend could not observe this output (reported, not deciding)."""
    import torch

    from kernels.reference import numerics
    if got_bits is None:
        return {"observed": False}
    if tuple(got_bits.shape) != tuple(ref.shape):
        return {"elements": ref.numel(), "mismatches": ref.numel(), "max_ulp": float("inf"),
                "nan": False, "bound_ulp": bound, "ok": False,
                "error": f"{name}: shape {list(got_bits.shape)}, expected {list(ref.shape)}"}
    got = from_bits(got_bits, ref)
    if ref.dtype == torch.bfloat16:
        cmp = numerics.Comparison(got, ref)
        mismatches, max_ulp = cmp.mismatches, cmp.max_ulp
    else:  # other dtypes are held bit for bit
        if bound:
            raise ValueError(f"{name}: a ULP bound needs a BF16 output, got {ref.dtype}")
        same = numerics.bits(got) == numerics.bits(ref)
        mismatches, max_ulp = int((~same).sum()), 0.0 if bool(same.all()) else float("inf")
    nan = bool(torch.isnan(got.float()).any()) if got.is_floating_point() else False
    ok = (mismatches == 0 if bound == 0 else max_ulp <= bound) and not nan
    return {"elements": ref.numel(), "mismatches": mismatches, "max_ulp": max_ulp,
            "nan": nan, "bound_ulp": bound, "ok": ok}


def reference(case: Case, *, tp: int, hidden: int, inputs: dict | None = None,
              facts: Mapping | None = None, rank: int | None = None) -> dict:
    """One rank's expected outputs: output name -> ``(tensor, bound)`` (the
    op's ``expected``; bound 0 = bit for bit, n = within n BF16 ULP).
    ``facts``: what the rank's kernel decided that the reference takes as a
    parameter (e.g. mHC ``rank_lanes``); ``rank``, when given, joins them as
    ``facts["rank"]`` (owner mode: the reference is the rows this rank
    owns). ``inputs``: the case's :func:`case_inputs` where the caller has
    them (one set for every rank of a call: the op's reference keeps what
    every rank shares in it, e.g. the finalize payloads, so tp checks
    compute it once); else made here. Depends on the case alone, never on
    a kernel's outputs (:mod:`cluster.ahead` makes it ahead of the call)."""
    module = ops.get(case.op).module()
    if inputs is None:
        inputs = module.make_inputs(case, tp=tp, hidden=hidden, tokens=case.tokens)
    facts = dict(facts or {}) | ({} if rank is None else {"rank": int(rank)})
    return module.expected(case, inputs, tp=tp, facts=facts)


def check_outputs(case: Case, *, tp: int, hidden: int, outputs: Mapping[str, np.ndarray | None],
                  facts: Mapping | None = None, rank: int | None = None,
                  inputs: dict | None = None, expected: Mapping | None = None) -> dict:
    """Compare one rank's outputs (bit arrays, by output name) with the op's
    torch reference (:func:`reference`, with ``facts``, ``rank`` and
    ``inputs`` as there; ``expected``: that reference where the caller made
    it already): bit for bit or within its ULP bound; NaN never passes. An
    output that is missing or None is reported as ``{"observed": False}``
    and does not decide ``ok``. Returns a plain dict with ``ok`` and, per
    output, elements, mismatches, max ULP, NaN and the bound."""
    if expected is None:
        expected = reference(case, tp=tp, hidden=hidden, inputs=inputs, facts=facts, rank=rank)
    report: dict = {"ok": True}
    for name, (ref, bound) in expected.items():
        report[name] = compare(name, outputs.get(name), ref, bound)
        report["ok"] &= report[name].get("ok", True)
    return report
