"""The typed op contract (cluster.ops.contract) and ops from other packages
(the ``lamport_lab.ops`` entry-point group): a declaration that misses the
contract is refused at registration naming the attribute; a name clash is
refused naming both origins; what an op lacks is a skip reason, never a
fake run."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from cluster import ops
from cluster.ops import contract
from cluster.ops.spec import OpSpec

REPO = Path(__file__).resolve().parents[1]


def _module(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


@pytest.fixture
def impl():
    """A fresh impl module with the collective reference functions only."""
    module = _module("contract_probe_impl", make_inputs=lambda case, **kw: {},
                     expected=lambda case, inputs, **kw: {}, payload=lambda *a: None,
                     epilogue=lambda *a: {})
    yield module
    sys.modules.pop(module.__name__, None)
    ops.unregister("contract_probe")


def _spec(**kw) -> OpSpec:
    return OpSpec(**{"name": "contract_probe", "summary": "", "collective": True,
                     "impl": "contract_probe_impl", "inputs": ("random",), **kw})


def test_a_reference_function_missing_is_named(impl):
    del impl.expected
    with pytest.raises(contract.ContractError,
                       match=r"op 'contract_probe' \(impl 'contract_probe_impl'\) does not meet "
                             r"the op contract: impl module 'contract_probe_impl' lacks "
                             r"expected\(\) \(CollectiveReference"):
        ops.register(_spec())
    assert "contract_probe" not in ops.OPS
    impl.expected = lambda *a, **kw: {}
    del impl.epilogue
    assert contract.problems(_spec(collective=False)) == []  # no collective: no epilogue
    with pytest.raises(contract.ContractError, match=r"lacks epilogue\(\)"):
        ops.register(_spec())


def test_kernel_classes_are_held_to_their_protocols(impl):
    class RankKernel:
        @staticmethod
        def key(case, budget_ns):
            return ()

        def load(self, case, inputs, rank, device): ...

        def publish(self): ...

        def consume(self): ...

        def outputs(self):
            return {}

    class VirtualKernel:
        def load(self, case, inputs, tokens): ...

        def outputs(self, rank):
            return {}

        def facts(self):
            return {}

    impl.RankKernel, impl.VirtualKernel = RankKernel, VirtualKernel
    found = contract.problems(_spec())
    assert found == ["contract_probe_impl.RankKernel lacks facts() (RankKernel: "
                     "cluster.ops.contract)",
                     "contract_probe_impl.VirtualKernel lacks __call__() (VirtualKernel: "
                     "cluster.ops.contract)"], found
    RankKernel.facts = lambda self: {}
    VirtualKernel.__call__ = lambda self: None
    assert contract.problems(_spec()) == []
    assert contract.problems(_spec(collective=False))[0] == (
        "contract_probe_impl.RankKernel lacks check() (LocalRankKernel: cluster.ops.contract)")
    assert isinstance(RankKernel(), contract.RankKernel)


def test_dotted_names_and_fault_kinds_are_checked_at_registration(impl):
    found = contract.problems(_spec(workload="no_such_pkg.builder", reference="nocolon",
                                    golden="no_such_golden_mod", kernel="cluster.ops.nothing",
                                    collective=False, faults=("skip_publish",)))
    assert found == [
        "kernel: nothing callable at 'cluster.ops.nothing'",
        "reference = 'nocolon' is not a dotted 'package.module:function' name",
        "workload = 'no_such_pkg.builder': no module 'no_such_pkg' on sys.path",
        "golden = 'no_such_golden_mod': no module 'no_such_golden_mod' on sys.path",
        "faults: an op that is no collective meets no fault of the Lamport protocol"], found


def test_what_an_op_lacks_is_a_skip_reason(impl):
    from jobs.config import Case
    from jobs.correctness import skip_reason

    spec = ops.register(_spec())
    assert contract.parts(spec) == {"gpu_kernel": False, "virtual_kernel": False,
                                    "workload": False, "goldens": False}
    case = Case(job="correctness", op="contract_probe", variant="watchdog", transport="unicast",
                placement=None, tp=2, hidden=256, tokens=2, top_k=None, hc=None,
                dtype="bfloat16", repeats=1, inputs="random")
    assert skip_reason(case, "emulated") is None
    assert skip_reason(case, "gpu") == ("op contract_probe has no GPU kernel (no RankKernel in "
                                        "contract_probe_impl); it runs on the emulated backend "
                                        "only")
    impl.RankKernel = type("RankKernel", (), {})
    assert skip_reason(case, "gpu") is None
    assert skip_reason(case, "gpu", "virtual-ranks") == (
        "op contract_probe has no virtual-rank kernel (no VirtualKernel in contract_probe_impl)")


ENTRY_MODULE = '''
from cluster.ops.spec import OpSpec


def make_inputs(case, *, tp, hidden, tokens):
    return {}


def expected(case, inputs, *, tp, facts):
    return {}


SPEC = OpSpec(name=NAME, summary="an entry-point op", collective=False, impl=__name__,
              inputs=("random",), needs_gpu="a probe", virtual_ranks=False)
'''


def _installed(root: Path, name: str, op: str) -> Path:
    """A distribution ``ep_probe`` in ``root`` as pip lays one out: its module
    and its dist-info with the entry point (no pip: a few files)."""
    (root / "ep_probe_op.py").write_text(textwrap.dedent(ENTRY_MODULE).replace("NAME", repr(op)))
    info = root / "ep_probe-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ep_probe\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[lamport_lab.ops]\n{name} = ep_probe_op:SPEC\n")
    return root


def _import_ops(path: Path, code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), str(REPO)])}
    env.pop(ops.PLUGINS_ENV, None)
    return subprocess.run([sys.executable, "-c", "import cluster.ops as o; " + code], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)


def test_an_entry_point_op_is_registered_beside_the_built_in_ones(tmp_path):
    done = _import_ops(_installed(tmp_path, "ep_probe", "ep_probe"),
                       "print(o.names()[-1]); print(o.ORIGINS['ep_probe'])")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "ep_probe", "entry point ep_probe = 'ep_probe_op:SPEC' (ep_probe 0.1)"]


def test_an_entry_point_op_taking_a_built_in_name_is_refused_naming_both(tmp_path):
    name = ops.names()[0]
    done = _import_ops(_installed(tmp_path, "clash", name), "")
    assert done.returncode != 0
    assert (f"ValueError: op {name!r} is already registered ({ops.ORIGINS[name]}); refused "
            f"from entry point clash = 'ep_probe_op:SPEC' (ep_probe 0.1): rename one"
            in done.stderr), done.stderr


def test_an_entry_point_naming_no_op_spec_is_refused(tmp_path):
    root = _installed(tmp_path, "ep_probe", "ep_probe")
    info = root / "ep_probe-0.1.dist-info" / "entry_points.txt"
    info.write_text("[lamport_lab.ops]\nep_probe = ep_probe_op:make_inputs\n")
    done = _import_ops(root, "")
    assert done.returncode != 0
    assert ("lamport_lab.ops: entry point ep_probe = 'ep_probe_op:make_inputs' (ep_probe 0.1) "
            "is a function, not an OpSpec" in done.stderr), done.stderr
    info.write_text("[lamport_lab.ops]\nep_probe = ep_probe_gone:SPEC\n")
    done = _import_ops(root, "")
    assert "entry point ep_probe = 'ep_probe_gone:SPEC' (ep_probe 0.1) does not load: " \
           "ModuleNotFoundError" in done.stderr, done.stderr


def test_the_same_declaration_registered_twice_is_one_op(impl):
    spec = ops.register(_spec())
    assert ops.register(spec) is spec
    with pytest.raises(ValueError, match="already registered"):
        ops.register(dataclasses.replace(spec))
