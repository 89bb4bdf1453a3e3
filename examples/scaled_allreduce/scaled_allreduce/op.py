"""``scaled_allreduce``: the declaration and the emulated rank kernel.

Every rank publishes its BF16 partial ``[M, hidden]`` into the Lamport
mailbox; every rank's consumer sums the ranks' partials in rank order
(FP32, rounded once to BF16) and scales the sum by the case's ``scale``:
``out = BF16(FP32(BF16 sum) * scale)``, bit for bit against
:func:`scaled_allreduce.reference.scaled_all_reduce`.

Each function gets the case as one frozen value (``cluster.cases.Case``):
the common fields as attributes (``case.seed``, ``case.inputs``), this
op's own as ``case.params.scale`` (the dataclass lamport-lab derives from
``fields``).

On the emulated backend lamport-lab runs the Lamport publish and consume
itself; this module gives it what a rank publishes (:func:`payload`) and
the consumer's epilogue on the reduced sum (:func:`epilogue`). The CuTe DSL
kernel (:mod:`scaled_allreduce.kernel`) is compiled and PTX-checked by
``python -m jobs compile-check``; there is no GPU driver (``RankKernel``),
so GPU rows are skipped with that reason.

Importing this module imports no torch (lamport-lab imports every op's
declaration in every process): the functions import what they need.
"""

from __future__ import annotations

import math

from cluster.ops.all_reduce_norm import COLLECTIVE_FAULTS
from cluster.ops.spec import Field, OpSpec


def finite_float(value) -> bool:
    return isinstance(value, float) and math.isfinite(value)


SPEC = OpSpec(
    name="scaled_allreduce",
    summary="the Lamport all-reduce, its BF16 sum scaled by a constant",
    collective=True,
    impl=__name__,
    inputs=("random", "order_sensitive", "sentinel_pattern"),
    fields={"scale": Field(0.5, finite_float, "a finite float (TOML: 0.5, not 1)")},
    reference="scaled_allreduce.reference:scaled_all_reduce",
    golden="scaled_allreduce.reference",
    compile_variants="scaled_allreduce.kernel.variants",
    faults=COLLECTIVE_FAULTS,
)


def make_inputs(case, *, tp, hidden, tokens):
    from cluster.ops.all_reduce_norm import partials
    return {"partials": partials(case.inputs, tp, tokens, hidden, case.seed)}


def payload(case, inputs, rank):
    return inputs["partials"][rank]


def epilogue(case, inputs, reduced, rank):
    from scaled_allreduce.reference import scale_sum
    return {"out": scale_sum(reduced, case.params.scale)}


def expected(case, inputs, *, tp, facts):
    from scaled_allreduce.reference import scaled_all_reduce
    return {"out": (scaled_all_reduce(inputs["partials"], case.params.scale), 0)}
