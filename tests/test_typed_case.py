"""A case is one frozen, typed value from the suite to the rank kernel
(issue 65): :class:`cluster.cases.Case`, the common fields and the op's own
as ``case.params`` (``OpSpec.params``, derived from the declaration's
``fields``). It pickles as itself (Ray), gives back the fields it was made
from (``to_fields``: rows, repro commands, re-validation), and no module
of the service indexes a case by a string key.
"""

from __future__ import annotations

import ast
import dataclasses
import pickle
from pathlib import Path

import pytest

from cluster import ops
from cluster.cases import Case, make_case

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("op", ops.names())
def test_every_op_makes_a_frozen_case_that_round_trips(op):
    spec = ops.get(op)
    case = make_case(capacity=8, tokens=3, op=op, seed=5, budget_ns=123)
    assert isinstance(case, Case) and isinstance(case.params, spec.params)
    assert (case.op, case.tokens, case.seed, case.budget_ns, case.inputs) == \
        (op, 3, 5, 123, spec.inputs[0])
    assert [f.name for f in dataclasses.fields(case.params)] == list(spec.fields)
    assert all(getattr(case.params, k) == f.default for k, f in spec.fields.items())
    fields = case.to_fields()
    assert set(fields) == {"op", "tokens", "inputs", "seed", "eps", "budget_ns", *spec.fields}
    assert make_case(capacity=8, **fields) == case
    with pytest.raises(dataclasses.FrozenInstanceError):
        case.tokens = 4
    if spec.fields:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(case.params, next(iter(spec.fields)), None)


def test_a_case_pickles_as_itself_with_its_call_fields():
    from ray import cloudpickle

    case = make_case(capacity=8, tokens=2, op="all_reduce_mhc", hc=2, finalize=True, top_k=3)
    sent = case.replace(seq=7, fault={"kind": "delay_publish", "delay_ns": 5})
    for dumps in (pickle.dumps, cloudpickle.dumps):
        got = pickle.loads(dumps(sent))
        assert got == sent and type(got.params) is ops.get("all_reduce_mhc").params
        assert (got.seq, got.fault, got.params.top_k) == (7, sent.fault, 3)
    assert sent != case and sent.to_fields() == case.to_fields()


def test_op_params_validate_on_construction_naming_field_and_value():
    mhc = ops.get("all_reduce_mhc")
    with pytest.raises(ValueError, match=r"op all_reduce_mhc: hc = 9 is not valid"):
        mhc.params(hc=9)
    with pytest.raises(ValueError, match=r"op all_reduce_mhc: hc = 9 is not valid"):
        make_case(capacity=8, tokens=1, op="all_reduce_mhc", hc=9)
    assert mhc.make_params({"hc": 2, "eps": 1.0, "mode": "owner"}) == mhc.params(hc=2)


def string_subscripts_of_case(source: str) -> list[int]:
    """Lines where a name ``case`` is indexed by a string (``case["tokens"]``)."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
            and node.value.id == "case" and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)]


def test_no_module_indexes_a_case_by_a_string_key():
    found = [f"{path.relative_to(ROOT)}:{line}"
             for package in ("cluster", "jobs", "kernels", "examples")
             for path in sorted((ROOT / package).rglob("*.py"))
             for line in string_subscripts_of_case(path.read_text())]
    assert not found, f"case fields read as dict keys: {found}"
    # the scan finds what it looks for
    assert string_subscripts_of_case('case = {}\ncase["tokens"]\nother["tokens"]\n') == [2]
