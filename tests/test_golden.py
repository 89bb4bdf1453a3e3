"""Every registered golden case (those of every registered op's ``golden``
module, cluster.ops.golden_cases) is pinned by its committed file, and a
mutated reference fails against it."""

import pytest

from kernels.reference import golden
from cluster.ops import golden_cases

GOLDEN_CASES = golden_cases()


@pytest.mark.parametrize("name", sorted(n for n, c in GOLDEN_CASES.items() if c.make))
def test_reference_matches_golden(name):
    case = GOLDEN_CASES[name]
    inputs, params = case.make()
    golden.check_golden(name, inputs, case.compute(inputs, params), params)


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_file_recomputes(name):
    inputs, outputs, params = golden.load_golden(name)
    verdict = golden.verify_golden(name, GOLDEN_CASES[name].compute)
    assert verdict.passed and verdict.mismatches == 0 and verdict.elements > 0, verdict


def test_reversed_rank_order_fails_golden():
    name = "all_reduce_norm_order_tp3"
    case = GOLDEN_CASES[name]
    inputs, params = case.make()
    mutated = case.compute(inputs, {**params, "order": [2, 1, 0]})
    with pytest.raises(AssertionError, match="output sum"):
        golden.check_golden(name, inputs, mutated, params)


def test_every_registered_case_has_a_committed_file():
    missing = [n for n in GOLDEN_CASES if not golden.golden_path(n).exists()]
    assert not missing


def test_every_op_names_its_golden_module():
    from cluster import ops
    from cluster.ops.spec import OpSpec
    assert {c.op for c in GOLDEN_CASES.values()} >= {"all_reduce_norm", "finalize_publish",
                                                     "embed_norm", "all_reduce_mhc"}
    from cluster.ops.contract import ContractError
    bad = OpSpec(name="golden_toy", summary="", collective=False, impl="cluster.ops.indexer",
                 inputs=("random",), golden="no_such_golden_module")
    with pytest.raises(ContractError, match="golden = 'no_such_golden_module': no module "
                                            "'no_such_golden_module' on sys.path"):
        ops.register(bad)
    assert "golden_toy" not in ops.OPS


def test_hex_round_trip_keeps_bits():
    import torch
    t = torch.tensor([-0.0, 1.5, float("nan")], dtype=torch.bfloat16)
    back = golden.tensor_from_json(golden.tensor_to_json(t))
    assert torch.equal(back.view(torch.int16), t.view(torch.int16))
