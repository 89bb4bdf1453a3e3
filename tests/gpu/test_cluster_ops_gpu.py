"""Every op of the registry (cluster.ops) through the service's GPU paths on
one GPU: each collective op through a shared-GPU tp=2 TP group of rank
actors (GpuRank builds the op's RankKernel; gloo + CUDA IPC mailboxes) with
its input kinds, a skipped publish diagnosed and recovered; each collective
op through virtual ranks (cluster.gpu.virtual.run_group: eager, then CUDA
graph replays with new data); the indexer (no collective) on a rank actor's
GPU on every path, its rows' check on the rank.

Run under a process timeout (a spinning kernel is stopped only by ending its
process); Ray must be importable:
    timeout 900 python -m pytest -m gpu tests/gpu/test_cluster_ops_gpu.py -v
"""

from __future__ import annotations

import pytest
from tests.gpu import sweep  # noqa: E402

pytestmark = pytest.mark.gpu
ray = pytest.importorskip("ray")

from cluster import ops  # noqa: E402
from cluster.faults import run_fault  # noqa: E402
from cluster.group import TPGroup  # noqa: E402

HIDDEN, CAPACITY = 4096, 16
BUDGET_NS = 2_000_000_000
FAULT_BUDGET_NS = 500_000_000
CALL_TIMEOUT_S = 20.0
COLLECTIVE = {
    "all_reduce_norm": {},
    "finalize_publish": {"top_k": 8},
    "embed_norm": {},
    "all_reduce_mhc": {"hc": 4},
    "all_reduce_mhc+finalize": {"hc": 4, "finalize": True, "top_k": 8},
}


def op_of(name: str) -> str:
    return name.split("+")[0]


@pytest.mark.parametrize("tp, gpus_per_rank", [(1, 1), (2, 0.5)])
def test_indexer_runs_on_each_rank_actors_gpu(cluster, tp, gpus_per_rank):
    # Before the shared-GPU group below: that module fixture holds a whole GPU
    # until the module ends, so on one GPU these groups could not be placed after it.
    with TPGroup(tp=tp, hidden=7168, capacity=64, backend="gpu", gpus_per_rank=gpus_per_rank,
                 call_timeout_s=120, setup_timeout_s=180) as g:
        for path, tokens in (("projection", 64), ("fused", 16), ("stage", 1), ("stage", 17)):
            call = g.run(g.case(op="indexer", tokens=tokens, path=path, seed=tokens,
                                budget_ns=BUDGET_NS))
            print(f"\nindexer tp={tp} {path} M={tokens}: {call.outcome}; "
                  f"{[c and {k: v for k, v in c.items() if k != 'ok'} for c in call.checks]}")
            assert call.outcome == "pass", (path, call.checks, call.errors)
            assert all(x["collective"] is False for x in call.results)
            assert all(c["ok"] for c in call.checks)


@pytest.fixture(scope="module")
def shared_group(cluster):
    with TPGroup(tp=2, hidden=HIDDEN, capacity=CAPACITY, backend="gpu", gpus_per_rank=0.5,
                 call_timeout_s=CALL_TIMEOUT_S, setup_timeout_s=180) as g:
        assert g.placement == "shared-gpu" and g.start_diagnosis.ok
        yield g


@pytest.mark.parametrize("name", sorted(COLLECTIVE))
def test_collective_op_through_a_shared_gpu_group(shared_group, name):
    g, op = shared_group, op_of(name)
    fields = {"op": op, **COLLECTIVE[name]}
    g.recover()
    for i, (tokens, kind) in enumerate(zip((1, 7, CAPACITY, 3, 5), ops.get(op).inputs)):
        extra = {"residual": "zeros"} if "residual" in ops.get(op).fields and i % 2 else {}
        call = g.run(g.case(tokens=tokens, inputs=kind, seed=i, budget_ns=BUDGET_NS,
                            **fields, **extra))
        print(f"\n{name} M={tokens} {kind}: {call.outcome} {call.diagnosis.summary()}; "
              f"checks {[c and {k: v for k, v in c.items() if k != 'ok'} for c in call.checks]}")
        assert call.outcome == "pass", (name, kind, call.diagnosis.summary(), call.checks,
                                        call.errors)
        for x, check in zip(call.results, call.checks):
            assert x["mailbox_clean"] and check["ok"], (name, kind, check)
            observed = [k for k, v in check.items() if k != "ok" and v.get("observed", True)]
            assert observed and all(check[k]["elements"] > 0 for k in observed)
    verdict = run_fault(g, "skip_publish", rank=1, budget_ns=FAULT_BUDGET_NS, fields=fields)
    print(f"{name} skip_publish: met={verdict.met}; seen {verdict.seen}")
    assert verdict.met, verdict.seen


@sweep.parametrize("name, tp", sorted(COLLECTIVE), [2, 4], default=lambda name, tp: tp == 2)
def test_collective_op_through_virtual_ranks(name, tp):
    from cluster.gpu.virtual import run_group

    op = op_of(name)
    fields = {k: v for k, v in COLLECTIVE[name].items()}
    kinds = ops.get(op).inputs
    out = run_group({"op": op, "fields": fields, "tp": tp, "hidden": HIDDEN,
                     "capacity": CAPACITY, "eps": 1e-6, "budget_ns": BUDGET_NS,
                     "cases": [{"tokens": m, "inputs": kinds[i % len(kinds)],
                                "seeds": [10 * m, 10 * m + 1, 10 * m + 2]}
                               for i, m in enumerate((1, 5, CAPACITY))]})
    for case in out["cases"]:
        calls = case["calls"]
        assert [c["graph"] for c in calls] == [False, True, True], (name, case)
        for call in calls:
            assert call["diagnosis"] is None and call["mailbox_clean"], (name, call)
            assert len(call["checks"]) == tp and all(c["ok"] for c in call["checks"]), call
    print(f"\n{name} tp={tp} virtual ranks: {sum(len(c['calls']) for c in out['cases'])} "
          f"calls pass on {out['device']}")
