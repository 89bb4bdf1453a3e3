"""One kernel builder per op (issue 34): an op's rank driver (``RankKernel``),
its virtual-ranks driver (``VirtualKernel``) and its timed workload all build
the host kernel through the op's ``OpSpec.kernel`` (:mod:`cluster.ops.kernel`).

On the CPU, with the host kernel classes replaced by recorders: for a case,
the three get the same options, and only where they run differs (a mailbox,
tp ranks, a device). And a scan of the source: nothing under cluster/, jobs/
or dashboards/ constructs a host kernel class outside a builder.
"""

from __future__ import annotations

import ast
import types
from pathlib import Path

import pytest

from cluster import ops
from cluster.cases import make_case

ROOT = Path(__file__).resolve().parents[1]
HOST_CLASSES = {"AllReduceNorm", "VirtualRanks", "AllReduceMHC", "MHCVirtualRanks", "Indexer",
                "IndexerProjection"}
"""The kernels' host classes (and ``virtual_ranks``, their tp-ranks form)."""
PLACEMENT_KEYS = {"mailbox", "tp", "device", "transport"}
"""What says where a kernel runs, not which kernel it is."""


def builder_sites() -> set[tuple[str, str]]:
    """(file, function) of every builder: each op's ``kernel`` and the
    Lamport helper."""
    sites = {("cluster/ops/kernel.py", "lamport")}
    for name in ops.names():
        module, _, function = ops.get(name).kernel.rpartition(".")
        sites.add((module.replace(".", "/") + ".py", function))
    return sites


def constructions(path: Path) -> list[tuple[str, int]]:
    """(enclosing function, line) of each call of a host class or of
    ``virtual_ranks`` in ``path``."""
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                else function
            if isinstance(child, ast.Call):
                f = child.func
                name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")
                if name in HOST_CLASSES or name == "virtual_ranks":
                    found.append((function, child.lineno))
            visit(child, inner)
    visit(ast.parse(path.read_text()), "<module>")
    return found


def test_only_the_builders_construct_host_kernels():
    sites = builder_sites()
    stray = []
    for package in ("cluster", "jobs", "dashboards"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            stray += [f"{rel}:{line} (in {fn})" for fn, line in constructions(path)
                      if (rel, fn) not in sites]
    assert not stray, f"host kernels built outside the ops' builders: {stray}"
    # the scan itself finds what it looks for
    assert {fn for fn, _ in constructions(ROOT / "cluster/ops/kernel.py")} == {"lamport"}


class Recorder:
    """Stands in for a host class: records how it was built."""
    built: list = []

    def __init__(self, **kw) -> None:
        Recorder.built.append(kw)
        self.device = kw.get("device") or "cpu"

    @classmethod
    def virtual_ranks(cls, **kw):
        return cls(**kw)

    def prepare_embedding(self, *args) -> None:
        pass


@pytest.fixture
def recorded(monkeypatch):
    import kernels.indexer.projection as projection
    import kernels.indexer.stage as stage
    import kernels.lamport.all_reduce_mhc as mhc
    import kernels.lamport.all_reduce_norm as norm

    for module, name in ((norm, "AllReduceNorm"), (mhc, "AllReduceMHC"), (stage, "Indexer"),
                         (projection, "IndexerProjection")):
        monkeypatch.setattr(module, name, type(name, (Recorder,), {}))
    monkeypatch.setattr(projection, "IndexerProjection",
                        lambda module: types.SimpleNamespace(device="cpu", module=module))
    Recorder.built = []
    return Recorder.built


def what(kw: dict) -> dict:
    return {k: v for k, v in kw.items() if k not in PLACEMENT_KEYS}


CASES = [("all_reduce_norm", {}), ("all_reduce_norm", {"mode": "owner"}),
         ("finalize_publish", {"top_k": 4}), ("finalize_publish", {"mode": "owner"}),
         ("embed_norm", {}), ("all_reduce_mhc", {"hc": 4}),
         ("all_reduce_mhc", {"hc": 2, "finalize": True, "top_k": 6}), ("indexer", {"heads": 32})]


@pytest.mark.parametrize("op,fields", CASES, ids=[f"{op}-{f}" for op, f in CASES])
def test_every_placement_builds_the_same_kernel(recorded, op, fields):
    from cluster.measure.workload import RankContext, Spec
    from cluster.measure.workloads.common import host_kernel

    spec = ops.get(op)
    case = make_case(capacity=8, op=op, tokens=4, eps=1e-5, budget_ns=7, **fields)
    module = spec.module()
    mailbox = types.SimpleNamespace(device="cpu", rank=1)
    module.RankKernel(mailbox, hidden=64, capacity=8, transport="unicast", budget_ns=7,
                      case=case)
    rank = recorded[-1]
    assert rank.get("mailbox") is mailbox or rank["device"] == "cpu"  # indexer: its device
    built = [rank]
    if spec.virtual_ranks:
        module.VirtualKernel(tp=2, hidden=64, capacity=8, budget_ns=7, case=case)
        assert recorded[-1]["tp"] == 2 and recorded[-1].get("mailbox") is None
        built.append(recorded[-1])
    finalize = getattr(case.params, "finalize", False)
    if spec.collective and not finalize:  # the mHC workload times no finalize
        timing = Spec.of({"op": op, "hidden": 64, "tokens": 4, "calls": 1, "replays": 1,
                          "rotate_mb": 1, "eps": 1e-5, "baselines": [], "seed": 0,
                          "budget_ns": 7, "hc": getattr(case.params, "hc", None),
                          "top_k": getattr(case.params, "top_k", None),
                          "mode": getattr(case.params, "mode", "one_shot")})
        ctx = RankContext(rank=0, tp=1, device="cpu", capacity=8, dist=False, mailbox=mailbox)
        host_kernel(ctx, timing)
        built.append(recorded[-1])
    assert all(what(kw) == what(rank) for kw in built), built
    if op in ("finalize_publish",) or finalize:
        assert rank["top_k"] == case.params.top_k
    elif op != "indexer":
        assert rank.get("top_k") is None


def test_builders_refuse_what_they_cannot_build(recorded):
    from cluster.ops import kernel

    with pytest.raises(ValueError, match="tp = 2 ranks in one process make their own mailboxes"):
        kernel.lamport(Recorder, hidden=64, capacity=8, budget_ns=0, tp=2, mailbox=object())
    with pytest.raises(ValueError, match="indexer: not a collective.*got tp = 2"):
        indexer = ops.get("indexer")
        indexer.build_kernel(indexer.make_params({"heads": 32}), eps=1e-6, hidden=64, tp=2)
    with pytest.raises(ValueError, match="op finalize_publish: top_k = None is not valid"):
        ops.get("finalize_publish").make_params({"top_k": None})  # params never lack top_k
    assert not recorded, "nothing built after a refusal"
    bare = ops.OpSpec(name="bare", summary="", collective=False, impl=__name__,
                      inputs=("random",))
    with pytest.raises(ValueError, match="op bare declares no kernel builder"):
        bare.build_kernel(bare.params(), eps=1e-6, hidden=64)
