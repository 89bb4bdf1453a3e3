"""``python -m jobs check-op`` for every registered op (so no test names
ops or counts them), ``python -m jobs ops``, and check-op catching a wrong
epilogue, a missing golden and a reference that accepts bad input."""

from __future__ import annotations

import sys
import types

import pytest

from cluster import ops
from cluster.ops.spec import OpSpec
from jobs.__main__ import main

pytestmark = pytest.mark.timeout(900)


@pytest.mark.parametrize("name", ops.names())
def test_every_registered_op_passes_check_op(name, capsys):
    code = main(["check-op", name])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = [ln for ln in out.splitlines() if ln[:4] in ("pass", "fail", "skip")]
    assert [ln.split(":")[0].split("  ")[-1].split(" + ")[0] for ln in lines] == [
        "declaration", "goldens reproduce with the reference", "references refuse bad input",
        "emulated correctness tp=1", "emulated correctness tp=2", "emulated correctness tp=4"]
    assert all(ln.startswith(("pass", "skip")) for ln in lines), out
    spec = ops.get(name)
    assert ("+ fault skip_publish" in out) == bool(spec.faults and not spec.needs_gpu)


def test_ops_lists_every_op_with_its_origin_and_parts(capsys):
    assert main(["ops"]) == 0
    out = capsys.readouterr().out
    for name in ops.names():
        assert f"{name}  (" in out and f"origin      {ops.ORIGINS[name]}" in out
    assert out.count("  parts       gpu kernel: ") == len(ops.names())


def test_an_unknown_op_is_a_usage_error(capsys):
    assert main(["check-op", "no_such_op"]) == 2
    assert "check-op 'no_such_op': unknown op 'no_such_op'" in capsys.readouterr().err


@pytest.fixture
def wrong_op():
    """all_reduce_norm's functions, but one element of the epilogue's sum wrong."""
    from cluster.ops import all_reduce_norm as arn

    def epilogue(case, inputs, reduced, rank):
        out = arn.epilogue(case, inputs, reduced, rank)
        out["sum"] = out["sum"].clone()
        out["sum"].view(-1)[0] += 1
        return out

    module = types.ModuleType("check_op_wrong")
    module.__dict__.update(make_inputs=arn.make_inputs, expected=arn.expected,
                           payload=arn.payload, epilogue=epilogue)
    sys.modules[module.__name__] = module
    spec = ops.register(OpSpec(name="check_op_wrong", summary="", collective=True,
                               impl=module.__name__, inputs=("random",),
                               fields=arn.SPEC.fields, faults=("skip_publish",)))
    yield spec
    ops.unregister(spec.name)
    sys.modules.pop(module.__name__, None)


def test_check_op_fails_a_wrong_element_and_no_goldens(wrong_op, capsys):
    assert main(["check-op", wrong_op.name]) == 1
    out = capsys.readouterr().out
    assert "pass  declaration" in out
    assert "fail  goldens reproduce with the reference: op check_op_wrong has no golden case" in out
    assert "fail  emulated correctness tp=1: inputs random: rank 0: {'sum': {" in out
    assert "fix: make payload / epilogue / expected agree" in out


def test_a_reference_that_accepts_bad_input_is_named(monkeypatch):
    from jobs.ops_cmd import bad_inputs_accepted
    from kernels.reference.cases import GOLDEN_CASES
    from kernels.reference import golden

    name = next(iter(sorted(GOLDEN_CASES)))
    lax = types.SimpleNamespace(compute=lambda inputs, params: {})
    assert bad_inputs_accepted({name: GOLDEN_CASES[name]}) == []
    accepted = bad_inputs_accepted({name: lax})
    inputs, _, _ = golden.load_golden(name)
    assert len(accepted) == 3 * len(inputs)
    assert accepted[0].startswith(f"{name}: input {next(iter(inputs))} as float")
