"""The op registry (cluster.ops): one declaration per op, light to import,
consistent with what the jobs enumerate; and a newcomer's sixth op picked
up by the suite loader, the filters, the case validation and the emulated
backend from its declaration alone."""

import dataclasses
import re
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cluster import ops
from cluster.faults import FAULT_KINDS
from cluster.ops import contract
from cluster.ops.spec import Field, OpSpec, positive_int

REPO = Path(__file__).resolve().parents[1]


def test_importing_the_registry_imports_no_torch():
    code = ("import sys, cluster.ops as o; assert 'torch' not in sys.modules, 'torch imported'; "
            "print(','.join(o.names()))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert tuple(done.stdout.strip().split(",")) == ops.names()


def test_get_names_the_known_ops():
    builtin = [n for n in ops.names() if ops.ORIGINS[n].startswith("built-in ")]
    assert builtin == sorted(builtin) and builtin  # module-name order, before any plug-in
    assert ops.names()[:len(builtin)] == tuple(builtin)
    assert set(ops.ORIGINS) == set(ops.names())
    assert ops.collective() == tuple(n for n in ops.names() if ops.get(n).collective)
    with pytest.raises(ValueError, match=r"unknown op 'no such op'; known: \["):
        ops.get("no such op")
    name = ops.names()[0]
    with pytest.raises(ValueError, match=rf"op {name!r} is already registered "
                                         rf"\({re.escape(ops.ORIGINS[name])}\); refused from "
                                         rf"registered by {TOY.impl}"):
        ops.register(dataclasses.replace(TOY, name=name))


@pytest.mark.parametrize("name", ops.names())
def test_each_declaration_is_complete(name):
    """The typed contract (cluster.ops.contract) with everything resolved:
    the reference functions, the kernels it has, the kernel builder, the
    workload, the goldens and the compile variants; the fault kinds it
    declares are faults of the table whose input kinds it generates."""
    spec = ops.get(name)
    assert contract.resolve_all(spec) == []
    assert set(spec.faults) <= set(FAULT_KINDS)
    for kind in spec.faults:
        wanted = FAULT_KINDS[kind].case.get("inputs")
        assert wanted is None or wanted in spec.inputs, (kind, wanted)
    if not spec.collective:
        assert not spec.faults and not contract.parts(spec)["virtual_kernel"]
    ref_module, ref_name = spec.reference.split(":")
    assert callable(getattr(__import__(ref_module, fromlist=[ref_name]), ref_name))


def test_every_op_names_its_compile_variants():
    """Each declaration's provider yields variants of that op only, and the
    compile check enumerates exactly the variants of the ops that declare a
    provider."""
    from jobs import compile_selection
    assert compile_selection.registered_ops() == list(ops.compiled())
    for name in ops.compiled():
        variants = ops.get(name).variants([2048], [2])
        assert variants and {v.op for v in variants} == {name}, name
        assert len(compile_selection.variants([name], [2048], [2])) == len(variants)


def test_a_provider_returning_another_ops_variants_is_refused(monkeypatch):
    import kernels.lamport.compile_variants as cv
    monkeypatch.setattr(cv, "embed_norm_variants", lambda hiddens, tps: [
        dataclasses.replace(v, op="other") for v in cv.all_reduce_norm_variants(hiddens, tps)])
    with pytest.raises(ValueError, match=r"op embed_norm: its provider "
                                         r"'kernels.lamport.compile_variants.embed_norm_variants' "
                                         r"returned variants of ops \['other'\]"):
        ops.get("embed_norm").variants([2048], [2])
    spec = OpSpec(name="bare", summary="", collective=False, impl="x", inputs=("random",))
    with pytest.raises(ValueError, match="op bare declares no compile variants"):
        spec.variants([2048], [2])


def test_every_op_names_its_timed_workload():
    """OpSpec.workload is resolved only when asked (cluster.measure imports
    no torch until a builder is called) and names a callable builder."""
    assert ops.profiled() == tuple(n for n in ops.names() if ops.get(n).workload)
    for name in ops.profiled():
        assert callable(ops.get(name).workload_builder())
    with pytest.raises(ValueError, match="declares no timed workload"):
        TOY.workload_builder()


# ------------------------------------------------------------ a sixth op
def make_inputs(case, *, tp, hidden, tokens):
    from cluster.ops.all_reduce_norm import partials
    return {"partials": partials(case.inputs, tp, tokens, hidden, case.seed)}


def payload(case, inputs, rank):
    return inputs["partials"][rank]


def epilogue(case, inputs, reduced, rank):
    import torch
    return {"scaled": (reduced.float() * case.params.scale).to(torch.bfloat16)}


def expected(case, inputs, *, tp, facts):
    import torch

    from kernels.reference.allreduce import all_reduce_sum
    return {"scaled": ((all_reduce_sum(inputs["partials"]).float() * case.params.scale)
                       .to(torch.bfloat16), 0)}


TOY = OpSpec(name="scaled_sum", summary="a toy: the all-reduced sum times a scale",
             collective=True, impl=__name__, inputs=("order_sensitive", "random"),
             fields={"scale": Field(2, positive_int, "a positive int")},
             reference="kernels.reference.allreduce:all_reduce_sum", faults=("skip_publish",))


@pytest.fixture
def toy():
    ops.register(TOY)
    yield TOY
    ops.unregister(TOY.name)


def test_a_sixth_op_is_one_declaration(toy, tmp_path):
    from cluster.cases import check_outputs, make_case
    from cluster.emulated import EmulatedRank
    from cluster.emulated.host import run_threads
    from jobs.config import ConfigError, Filters, load_suite, select

    suite = tmp_path / "toy.toml"
    suite.write_text('format = 1\nname = "toy"\nversion = 1\n'
                     '[[correctness]]\nop = "scaled_sum"\ntp = [4]\nhidden = [256]\n'
                     'tokens = [2]\nscale = [3, 5]\n'
                     '[[faults]]\nop = "scaled_sum"\ntp = 2\nhidden = 256\ntokens = 2\n'
                     'kinds = "all"\n')
    s = load_suite(suite)
    cases = s.of("correctness")
    assert [(c.inputs, dict(c.op_args)["scale"]) for c in cases] == [
        ("order_sensitive", 3), ("random", 3), ("order_sensitive", 5), ("random", 5)]
    assert len(s.of("faults")) == len(FAULT_KINDS)
    assert select(s, ["correctness"], Filters(ops=("scaled_sum",), inputs=("random",))) \
        == [cases[1], cases[3]]
    bad = tmp_path / "bad.toml"
    bad.write_text(suite.read_text().replace("scale = [3, 5]", "hc = 4"))
    with pytest.raises(ConfigError, match=r"hc does not apply to op\(s\) \['scaled_sum'\]"):
        load_suite(bad)
    bad.write_text(suite.read_text().replace("scale = [3, 5]", 'inputs = ["sentinel_pattern"]'))
    with pytest.raises(ConfigError, match="not input kinds of op scaled_sum"):
        load_suite(bad)

    # the emulated backend runs it from the declaration (threads for rank processes)
    group_id, tp = uuid.uuid4().hex[:12], 4
    ranks = [EmulatedRank() for _ in range(tp)]
    with ThreadPoolExecutor(tp) as pool:
        list(pool.map(lambda r: ranks[r].setup(group_id=group_id, rank=r, tp=tp, capacity=4,
                                               hidden=64, timeout_s=5), range(tp)))
        try:
            case = make_case(capacity=4, tokens=2, **cases[2].op_fields(), op="scaled_sum",
                             inputs="order_sensitive", budget_ns=10**9)
            assert case.params.scale == 5
            results = run_threads(ranks, case.replace(seq=1), hidden=64, pool=pool)
        finally:
            for r in ranks:
                r.close()
    for res in results:
        report = check_outputs(case, tp=tp, hidden=64, outputs=res["outputs"])
        assert report["ok"] and report["scaled"]["elements"] == 2 * 64, report


def test_static_buffers_follow_the_structure_of_moe_inputs():
    """Virtual ranks replay a CUDA graph over static buffers: the MoE inputs
    (a dataclass of tensors) are copied field by field, and a new shape
    (another input kind or M) is seen as such."""
    import torch

    from cluster.cases import make_case
    from cluster.ops.all_reduce_norm import copy_into, shapes
    from cluster.ops.finalize_publish import make_inputs, moe_output

    def moe(kind, seed):
        case = make_case(capacity=4, tokens=4, op="finalize_publish", inputs=kind, seed=seed,
                         top_k=3)
        return moe_output(make_inputs(case, tp=2, hidden=16, tokens=4)["moes"][1], "cpu")

    static, new = moe("random", 1), moe("random", 2)
    assert shapes(static) == shapes(new) == (((12, 16), (4, 3), (4, 3)), (4, 16))
    assert shapes(moe("order_sensitive", 1)) != shapes(static)
    copy_into(static, new)
    assert torch.equal(static.routed.gemm2_permuted, new.routed.gemm2_permuted)
    assert torch.equal(static.shared_output, new.shared_output)
    assert static.routed.gemm2_permuted.data_ptr() != new.routed.gemm2_permuted.data_ptr()


@pytest.mark.parametrize("op,fields", [
    ("finalize_publish", {"top_k": 2, "mode": "one_shot"}),
    ("finalize_publish", {"top_k": 2, "mode": "owner"}),
    ("all_reduce_norm", {"mode": "owner"}),
    ("embed_norm", {}),
    ("all_reduce_mhc", {"hc": 2, "finalize": True, "top_k": 2}),
])
@pytest.mark.parametrize("device", [None, "cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_one_set_of_inputs_checks_every_rank_of_a_call(op, fields, device):
    """cluster.cases.check_outputs with the call's inputs shared by every
    rank's check (what virtual ranks and rank actors pass, with their GPU as
    the reference device) reports exactly what it reports from inputs of its
    own on the CPU, per rank (owner mode: each rank its own rows), and still
    fails a wrong element; so does the reference made ahead on a helper
    thread (cluster.ahead; a GPU reference device: on its side stream)."""
    import torch

    from cluster.ahead import Ahead, side_stream
    from cluster.cases import bits_from_bf16, case_inputs, check_outputs, make_case, reference

    tp, hidden = 4, 64
    case = make_case(capacity=8, tokens=5, op=op, inputs="random", seed=11, budget_ns=10**9,
                     **fields)
    dev = None if device is None else torch.device(device)
    shared = case_inputs(case, tp=tp, hidden=hidden, reference_device=dev)
    module = ops.get(op).module()

    def make(c):
        with side_stream(dev):
            inputs = case_inputs(c, tp=tp, hidden=hidden, reference_device=dev)
            return [reference(c, tp=tp, hidden=hidden, inputs=inputs, rank=r) for r in range(tp)]
    ahead = Ahead(make)
    ahead.plan(case)
    made = ahead.take(case)
    ahead.close()
    for rank in range(tp):
        expected = module.expected(case, case_inputs(case, tp=tp, hidden=hidden), tp=tp,
                                   facts={"rank": rank})
        outputs = {name: bits_from_bf16(ref) for name, (ref, _) in expected.items()}
        alone = check_outputs(case, tp=tp, hidden=hidden, outputs=outputs, rank=rank)
        together = check_outputs(case, tp=tp, hidden=hidden, outputs=outputs, rank=rank,
                                 inputs=shared)
        assert alone == together and together["ok"], (rank, together)
        assert check_outputs(case, tp=tp, hidden=hidden, outputs=outputs,
                             expected=made[rank]) == alone
        name = next(iter(outputs))
        outputs[name] = outputs[name].copy()
        outputs[name].flat[0] ^= 0x4000  # an exponent bit: beyond any ULP bound
        assert not check_outputs(case, tp=tp, hidden=hidden, outputs=outputs, rank=rank,
                                 inputs=shared)["ok"]


def test_no_op_module_imports_the_case_layer():
    """cluster.cases imports the op registry; an op module importing
    cluster.cases back, even inside a function, is a loop that only the
    registry's importlib hides. The bit helpers they need are in the leaf
    module cluster.bits, which imports nothing of cluster."""
    from tests.test_import_cycles import import_graph

    eager, lazy = import_graph()
    edges = {m: eager[m] | lazy[m] for m in eager}
    ops_modules = [m for m in edges if m.startswith("cluster.ops")]
    assert ops_modules and not [m for m in ops_modules if "cluster.cases" in edges[m]], \
        {m: sorted(edges[m]) for m in ops_modules if "cluster.cases" in edges[m]}
    assert not [t for t in edges["cluster.bits"] if t.startswith("cluster")], edges["cluster.bits"]
