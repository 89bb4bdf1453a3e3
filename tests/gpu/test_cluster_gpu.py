"""The gpu backend through Ray on one GPU: topology discovery, one actor on
the GPU running tp=1 (NCCL + symmetric memory, a group of one), and the
shared-GPU placement (2 and 4 actors on the one GPU, gloo bootstrap, CUDA
IPC mailboxes) running tp=2 and tp=4 AllReduceNorm cases checked against the
reference; injected faults are diagnosed and the group recovers.

Run under a process timeout (a spinning kernel is stopped only by ending its
process); Ray must be importable (stage it with --with-ray):
    timeout 400 python -m pytest -m gpu tests/gpu/test_cluster_gpu.py -v
Timings here are orchestration, not collective speed (shared GPU: every
peer store lands in the local L2 and the processes time-slice the GPU).
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from tests.gpu import sweep  # noqa: E402

pytestmark = pytest.mark.gpu
ray = pytest.importorskip("ray")

from cluster.faults import run_fault  # noqa: E402
from cluster.group import TPGroup  # noqa: E402
from cluster.topology import discover_cluster, discover_local  # noqa: E402

HIDDEN, CAPACITY = 4096, 16
CASE_BUDGET_NS = 2_000_000_000
FAULT_BUDGET_NS = 500_000_000
CALL_TIMEOUT_S = 10.0
GPU_FAULTS = ("skip_publish", "late_within_budget", "late_beyond_budget", "token_count_differs",
              "stage_out_of_bounds", "stage_stale", "negative_zero_payload")
"""Every fault kind the gpu backend injects and whose expectation holds on a
GPU (unsanitized_lane: the GPU publish always sanitizes; dirty_mailbox: a
killed process's device memory goes with it, so a rebuilt group starts clean;
stuck_rank: its own test below)."""


def run_sweep(g: TPGroup, label: str) -> list[float]:
    """Calls with every input kind and both residuals, checked on the ranks
    against kernels.reference (sum and residual bit-exact where observed,
    norm within 1 ULP, every output written, mailbox all sentinel)."""
    plan = [(1, "random", "random"), (7, "order_sensitive", "zeros"),
            (CAPACITY, "sentinel_pattern", "random"), (5, "random", "zeros"),
            (3, "order_sensitive", "random"), (CAPACITY, "random", "zeros")]
    walls = []
    for i, (tokens, inputs, residual) in enumerate(plan):
        call = g.run(g.case(tokens=tokens, inputs=inputs, residual=residual, seed=i,
                            budget_ns=CASE_BUDGET_NS))
        assert call.outcome == "pass", (label, i, call.diagnosis.summary(), call.checks, call.errors)
        assert [x["consumed_stage"] for x in call.results] == [i % 3] * g.tp
        for x, check in zip(call.results, call.checks):
            assert x["mailbox_clean"] and check["ok"], (label, i, check)
            assert check["residual"]["mismatches"] == 0 and check["norm"]["max_ulp"] <= 1
            if residual == "zeros":
                assert check["sum"]["mismatches"] == 0 and not check["sum"]["nan"]
                assert np.array_equal(x["outputs"]["sum"], x["outputs"]["residual"])
            else:
                assert check["sum"] == {"observed": False}
        walls.append(call.wall_s)
    print(f"\n{label}: {len(plan)} calls pass, wall per call (ms) "
          f"{[round(w * 1e3, 1) for w in walls]}")
    return walls


def test_topology_discovery(cluster):
    local = discover_local()
    (node,) = local.nodes
    assert len(node.gpus) >= 1
    gpu = node.gpus[0]
    assert gpu.compute_capability[0] >= 9 and gpu.sm_count > 0 and gpu.memory_bytes > 0
    assert gpu.uuid.startswith("GPU-") and gpu.multicast_supported is not None
    through_ray = discover_cluster(timeout_s=60)
    assert through_ray.gpu_count == local.gpu_count
    assert [lay.name for lay in through_ray.plan()][0] == f"{local.gpu_count}xTP1"
    print("\ntopology (local):", json.dumps(local.summary(), indent=1, default=str))
    print("layouts through Ray:", [lay.name for lay in through_ray.plan()])


def test_one_actor_on_the_gpu_runs_tp1(cluster):
    t0 = time.monotonic()
    with TPGroup(tp=1, hidden=HIDDEN, capacity=CAPACITY, backend="gpu", gpus_per_rank=1,
                 call_timeout_s=CALL_TIMEOUT_S, setup_timeout_s=120) as g:
        built = time.monotonic() - t0
        assert g.placement == "process-per-gpu" and g.start_diagnosis.ok
        assert g.metadata[0]["gpu_ids"] == ["0"]
        prep = g.prepare(g.case(tokens=1, budget_ns=CASE_BUDGET_NS))
        print(f"\ntp=1 process-per-GPU: group built in {built:.1f} s; prepare {prep}")
        run_sweep(g, "tp=1 process-per-GPU (NCCL, symmetric memory)")
        # One AllReduceNorm (one compile of each kernel) for the whole sweep,
        # under the key the op's RankKernel declares for these cases.
        from cluster.ops.all_reduce_norm import RankKernel
        assert [tuple(k) for k in g.state()[0]["kernels"]] == [
            RankKernel.key(g.case(tokens=1, budget_ns=CASE_BUDGET_NS), CASE_BUDGET_NS)]


@sweep.parametrize("tp", [2, 4], default=lambda tp: tp == 2)
def test_shared_gpu_runs_tp_and_recovers_from_faults(cluster, tp):
    group_sweep_and_faults(tp, shared=True)


@pytest.mark.multigpu
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_process_per_gpu_runs_tp_and_recovers_from_faults(cluster, tp):
    """One rank actor per GPU: NCCL group, torch symmetric memory mailboxes
    (unicast; multicast stays off), peer stores over NVLink."""
    import torch
    if torch.cuda.device_count() < tp:
        pytest.skip(f"tp={tp} process per GPU needs {tp} GPUs, this machine has "
                    f"{torch.cuda.device_count()}")
    group_sweep_and_faults(tp, shared=False)


def group_sweep_and_faults(tp: int, *, shared: bool) -> None:
    t0 = time.monotonic()
    with TPGroup(tp=tp, hidden=HIDDEN, capacity=CAPACITY, backend="gpu",
                 gpus_per_rank=1 / tp if shared else 1,
                 call_timeout_s=CALL_TIMEOUT_S, setup_timeout_s=120) as g:
        built = time.monotonic() - t0
        assert g.placement == ("shared-gpu" if shared else "process-per-gpu")
        assert g.start_diagnosis.ok
        assert len({m["pid"] for m in g.metadata}) == tp
        assert len({tuple(m["gpu_ids"]) for m in g.metadata}) == (1 if shared else tp)
        label = "shared GPU (gloo, CUDA IPC)" if shared else \
            "process per GPU (NCCL, symmetric memory, unicast)"
        print(f"\ntp={tp} {label}: group built in {built:.1f} s; gpu ids "
              f"{[m['gpu_ids'] for m in g.metadata]}, pids {[m['pid'] for m in g.metadata]}")
        run_sweep(g, f"tp={tp} {label}")

        # A skipped publish: diagnosed at group level as exactly that rank.
        k = tp - 1
        g.recover()
        g.run(g.case(tokens=2, budget_ns=FAULT_BUDGET_NS))  # the skipper's stage goes stale
        t1 = time.monotonic()
        call = g.run(g.case(tokens=3, budget_ns=FAULT_BUDGET_NS), faults={k: {"kind": "skip_publish"}})
        took = time.monotonic() - t1
        print(f"skip_publish on rank {k}: {call.outcome} in {took * 1e3:.0f} ms "
              f"(budget {FAULT_BUDGET_NS / 1e6:.0f} ms): {call.diagnosis.summary()}; records "
              f"{[x['record_count'] for x in call.results]}; scrubbed "
              f"{[m.non_sentinel for m in call.recovery]}")
        assert call.outcome == "hang" and call.diagnosis.missing_ranks == {k}
        assert call.diagnosis.summary().startswith(f"missing ranks: {{{k}}}")
        assert all(x["missing_sources"] == [k] for r, x in enumerate(call.results) if r != k)
        assert call.recovery is not None and not call.rebuilt
        follow = g.run(g.case(tokens=5, seed=3, residual="zeros", budget_ns=CASE_BUDGET_NS))
        assert follow.outcome == "pass", follow.diagnosis.summary()
        assert [x["consumed_stage"] for x in follow.results] == [0] * tp

        for kind in GPU_FAULTS:
            g.recover()
            verdict = run_fault(g, kind, rank=k, budget_ns=FAULT_BUDGET_NS)
            print(f"fault {kind} on rank {k}: met={verdict.met}; seen: {verdict.seen}")
            assert verdict.met, f"{kind}: expected {verdict.expected!r}, seen {verdict.seen!r}"


@pytest.mark.slow  # 40 s; tests/gpu/test_pool_gpu.py kills a stuck shared-GPU rank by default
def test_stuck_rank_is_killed_and_the_shared_gpu_group_rebuilt(cluster):
    with TPGroup(tp=2, hidden=HIDDEN, capacity=CAPACITY, backend="gpu", gpus_per_rank=0.5,
                 call_timeout_s=CALL_TIMEOUT_S, setup_timeout_s=120) as g:
        old = [m["pid"] for m in g.metadata]
        t0 = time.monotonic()
        verdict = run_fault(g, "stuck_rank", rank=1, budget_ns=FAULT_BUDGET_NS)
        print(f"\nstuck_rank (tp=2 shared GPU): met={verdict.met} in "
              f"{time.monotonic() - t0:.1f} s; seen: {verdict.seen}")
        assert verdict.met, verdict.seen
        assert g.builds == 2 and set(old).isdisjoint(m["pid"] for m in g.metadata)

