"""Pooled rank workers (cluster.pool) on the emulated backend: groups formed
from warm workers reuse their processes, a killed rank's worker alone is
replaced, a worker reused across 200 mixed groups with faults in between
holds no more descriptors than when idle and no group leaves a /dev/shm
segment behind, closing the
pool leaves no worker process, and a standing pool (a detached keeper) is
used by a job and stopped. (tests/gpu/test_pool_gpu.py: the same on a GPU.)"""

import os
import time

import pytest

from cluster.group import SetupFailed, TPGroup
from cluster.pool import Lease, Registry, Request, Worker, WorkerPool
from jobs.correctness import SETUP_TIMEOUT_S
from tests import pool_scenarios as sc

pytestmark = pytest.mark.xdist_group("ray")  # starts Ray clusters: one at a time (conftest)


@pytest.fixture(scope="module")
def cluster(local_ray):
    sc.ship_by_value()  # its broken workers
    yield


@pytest.fixture
def pool(cluster):
    p = WorkerPool.for_job("emulated")
    yield p
    p.close()


def _gone(pids, within_s: float = 30.0) -> list[int]:
    """The pids still alive after ``within_s``."""
    from cluster.procs import process_start
    deadline = time.monotonic() + within_s
    while True:
        alive = [p for p in pids if process_start(p) is not None]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def test_requests_are_checked():
    with pytest.raises(ValueError, match="placement must be one of"):
        Request(tp=2, placement="nonesuch")
    with pytest.raises(ValueError, match="share must be in"):
        Request(tp=2, placement="shared-gpu", share=0)
    with pytest.raises(ValueError, match="tp must be a positive integer"):
        Request(tp=0, placement="emulated")


def test_a_gpu_worker_has_queues_for_its_virtual_ranks_and_not_every_queue():
    from cluster.gpu import ALL_GPUS_VISIBLE
    from cluster.pool import gpu_worker_env
    from kernels.validation import TP_SIZES
    env = gpu_worker_env()
    assert env[ALL_GPUS_VISIBLE] == "1"
    connections = int(env["CUDA_DEVICE_MAX_CONNECTIONS"])
    # tp virtual ranks' streams plus the caller's each get a queue of their
    # own; 32 (CUDA's most) a worker left sixteen workers of one H200 short
    assert max(TP_SIZES) + 1 <= connections < 32


def test_a_gpu_slot_holds_at_most_the_cap_and_its_idle_workers_serve_first(monkeypatch):
    # the gpu backend's fit without Ray: one node, one slot, workers as plain records
    from cluster import pool as pl
    reg = Registry("gpu", name="cap")
    monkeypatch.setattr(reg, "_gpu_nodes", lambda node_id: ["n"])
    monkeypatch.setattr(reg, "_reserve", lambda node, timeout_s: reg.load.setdefault(("n", 0), 0.0))
    monkeypatch.setattr(reg, "_warm_raised", lambda w: False)

    def start(node, slot):
        worker = Worker(f"w{len(reg.workers)}", None, node, slot, 0.0)
        reg.workers[worker.key] = worker
        return worker
    monkeypatch.setattr(reg, "_start", start)
    tp8 = Request(tp=8, placement="shared-gpu", share=0.25)
    per_group = tp8.workers
    held = [reg.try_acquire(tp8) for _ in range(pl.MAX_WORKERS_PER_SLOT // per_group)]
    assert all(held) and len(reg.workers) == pl.MAX_WORKERS_PER_SLOT
    assert reg.try_acquire(tp8) is None  # room by share, none by the cap: it waits
    assert "killed because" not in reg.describe_load()
    reg.warm_failed = 2
    assert reg.describe_load().endswith("; 2 worker(s) killed because their warm-up raised")
    reg.release(held[0].id, [True] * per_group)
    again = reg.try_acquire(tp8)  # the released workers serve it: none started
    assert again is not None and len(reg.workers) == pl.MAX_WORKERS_PER_SLOT
    assert {w.key for w in again.workers} == {w.key for w in held[0].workers}


def test_registry_arguments_are_checked():
    reg = Registry("emulated", name="checks")
    with pytest.raises(ValueError, match=r"per_slot must be in \[0, 24\], got 25"):
        reg.prestart(25)
    with pytest.raises(ValueError, match="pool checks: no lease 'nonesuch'"):
        reg.replace("nonesuch", 0)
    worker = Worker(key="w0", actor=None, node_id="n", slot=None, started_unix=0.0)
    reg.leases["l"] = Lease(id="l", request=Request(tp=1, placement="emulated"), workers=[worker],
                            fresh=[True])
    with pytest.raises(ValueError, match=r"rank must be in \[0, 0\], got 1"):
        reg.replace("l", 1)


def test_the_pool_keeps_the_topology_until_the_nodes_change(pool, monkeypatch):
    import ray

    import cluster.topology as topology
    found = []
    real = topology.discover_cluster
    monkeypatch.setattr(topology, "discover_cluster", lambda: found.append(1) or real())
    first = pool.topology()
    assert first.nodes and pool.topology() is first and len(found) == 1  # kept
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    monkeypatch.setattr(ray, "nodes", lambda: nodes + [{"NodeID": "f" * 56, "Alive": True}])
    monkeypatch.setattr(topology, "discover_cluster", lambda: found.append(2) or "rediscovered")
    assert pool.topology() == "rediscovered" and found == [1, 2]  # a node joined
    assert pool.topology() == "rediscovered" and found == [1, 2]


def test_a_pool_whose_keeper_died_is_started_again_and_its_leftovers_cleared(cluster):
    import ray
    from ray.util.placement_group import placement_group, placement_group_table

    from cluster.pool import POOL_NAMESPACE
    first = WorkerPool.start("orphaned", "emulated")
    assert first.prestart(1, wait=True) == 1
    (row,) = first.status()
    pid = row["pid"]
    held = placement_group([{"CPU": 0.01}], name="orphaned-0123abcd", lifetime="detached")
    ray.get(held.ready(), timeout=30)
    ray.kill(first._keeper, no_restart=True)  # died without stopping its workers
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ray.get_actor("orphaned", namespace=POOL_NAMESPACE)
        except ValueError:
            break
        time.sleep(0.1)
    again = WorkerPool.start("orphaned", "emulated")  # the same name: no clash
    try:
        assert again.cleared == (1, 1)
        assert not _gone([pid])
        assert placement_group_table(held)["state"] == "REMOVED"
    finally:
        again.stop()


def test_groups_reuse_the_workers_of_earlier_groups(pool):
    first = sc.run_group(pool, "emulated", sc.Kind(2, "emulated"), seed=1)
    assert first["cold"] == [0, 1]
    again = sc.run_group(pool, "emulated", sc.Kind(2, "emulated"), seed=2)
    assert again["cold"] == [] and sorted(again["pids"]) == sorted(first["pids"])
    wider = sc.run_group(pool, "emulated", sc.Kind(4, "emulated"), seed=3)
    assert set(first["pids"]) < set(wider["pids"]) and len(wider["cold"]) == 2
    assert pool.counters()["fresh_workers"] == 4 and pool.counters()["leases"] == 3


def test_a_stuck_rank_is_replaced_alone(pool):
    out = sc.run_group(pool, "emulated", sc.Kind(2, "emulated"), seed=5, fault="stuck_rank")
    assert out["replaced"] == [1]
    assert out["pids_after"][0] == out["pids"][0] and out["pids_after"][1] != out["pids"][1]
    assert _gone([out["pids"][1]]) == []
    assert out["cold_after"] == [0, 1]  # no idle worker: the replacement is a fresh one
    assert pool.counters()["replaced"] == 1 and pool.counters()["replaced_fresh"] == 1
    # the replacement serves the next group; the killed process is in no lease
    nxt = sc.run_group(pool, "emulated", sc.Kind(2, "emulated"), seed=6)
    assert sorted(nxt["pids"]) == sorted(out["pids_after"]) and nxt["cold"] == []


def test_a_replacement_is_an_idle_warm_worker_and_the_slot_is_topped_up(pool):
    assert pool.prestart(3, wait=True) == 3
    idle = {r["pid"] for r in pool.status()}
    warm = [r["warm"] for r in pool.status()]  # RankActor.warm's figures, kept
    assert all(w and w["ready_s"] >= w["imports_s"] > 0 for w in warm), warm
    # the warm-up froze the imports' heap (cluster.procs.settle_heap)
    assert all(r["gc_frozen"] > 10_000 for r in pool.status()), pool.status()
    summary = pool.warm_summary()
    assert summary.startswith("3 worker(s) warm ") and "process start to actor" in summary \
        and "imports" in summary and "CUDA" not in summary, summary
    out = sc.run_group(pool, "emulated", sc.Kind(2, "emulated"), seed=5, fault="stuck_rank")
    assert out["replaced"] == [1] and out["cold"] == [] and out["cold_after"] == []
    assert out["pids_after"][1] in idle - set(out["pids"])
    assert pool.counters()["replaced"] == 1 and pool.counters()["replaced_fresh"] == 0
    assert "1 replaced after a kill (0 by a fresh worker)" in pool.usage()
    rows = pool.status()  # the killed one gone, a fresh one in its place: prestart's 3 again
    assert len(rows) == 3 and out["pids"][1] not in {r["pid"] for r in rows}


def test_a_worker_whose_warm_up_raised_is_never_leased(pool, monkeypatch):
    monkeypatch.setattr("cluster.actors.RankActor", sc.Starts({1}, "warm"))
    assert pool.prestart(3, wait=True) == 3  # waits for the failed warm-up too, raises nothing
    broken = sorted(r["key"] for r in pool.status())[1]
    out = sc.run_group(pool, "emulated", sc.Kind(2, "emulated"), seed=7)
    assert out["cold"] == []  # the two healthy ones; no setup waited on the broken one
    assert broken not in {r["key"] for r in pool.status()}
    c = pool.counters()
    assert (c["warm_failed"], c["retired"], c["fresh_workers"]) == (1, 1, 0)
    assert "1 retired (not reusable; 1 of them because their warm-up raised)" in pool.usage()


def test_the_first_group_takes_the_worker_whose_warm_up_ended_first(pool, monkeypatch):
    """Of three workers warming up at once, two take SLOW_WARM_S longer: a
    tp 1 group waits for the first warm-up to end and takes that worker, so
    it serves while the other two still warm up."""
    monkeypatch.setattr("cluster.actors.RankActor", sc.Starts({0, 1}, "slow"))
    assert pool.prestart(3) == 3
    out = sc.run_group(pool, "emulated", sc.Kind(1, "emulated"), seed=9)
    assert out["cold"] == []
    warming = [w for w in pool._registry.workers.values() if w.warm is not None]
    import ray
    assert len(warming) == 2 and not ray.wait([w.warm for w in warming], timeout=0)[0]


def test_a_failed_setup_is_retried_once_on_replaced_workers(pool, monkeypatch):
    """Rank 1's worker raises in setup_group at once: rank 0, in the
    rendezvous, is not waited for; both are replaced by idle workers and
    the group is set up again, well within the setup timeout."""
    monkeypatch.setattr("cluster.actors.RankActor", sc.Starts({1}, "setup"))
    assert pool.prestart(4, wait=True) == 4
    first = sorted(pool.status(), key=lambda r: int(r["key"][1:].split(".")[0]))[:2]
    t0 = time.monotonic()
    with TPGroup(tp=2, hidden=sc.HIDDEN, capacity=sc.CAPACITY, backend="emulated",
                 call_timeout_s=sc.CALL_TIMEOUT_S, setup_timeout_s=SETUP_TIMEOUT_S, pool=pool) as g:
        formed_s = time.monotonic() - t0
        assert g.replaced_ranks == {0, 1} and g.cold_ranks == []
        assert g.run(sc.Kind(2, "emulated").case(g, 3, 1)).outcome == "pass"
    assert formed_s < SETUP_TIMEOUT_S, formed_s  # formed, not waited out
    assert not {r["pid"] for r in first} & {r["pid"] for r in pool.status()}
    assert _gone([r["pid"] for r in first]) == []
    c = pool.counters()
    assert (c["replaced"], c["replaced_fresh"]) == (2, 0)


def test_a_killed_rank_that_still_answers_is_waited_for(pool, monkeypatch):
    """``ray.kill`` is asynchronous: a rank whose setup raised is idle and
    may answer a call sent right after the kill (CI saw it, under load).
    Here the first kill lands at once and each later one 2 s after the one
    before, so a rank is asked while its kill is on the way; the group
    waits for the killed ranks to be reported dead and forms on replaced
    workers."""
    import itertools
    import threading

    import ray
    real_kill, nth = ray.kill, itertools.count()

    def late_kill(actor, **kwargs):
        threading.Timer(2.0 * next(nth), real_kill, (actor,), kwargs).start()
    monkeypatch.setattr(ray, "kill", late_kill)
    monkeypatch.setattr("cluster.actors.RankActor", sc.Starts({1}, "setup"))
    assert pool.prestart(4, wait=True) == 4
    with TPGroup(tp=2, hidden=sc.HIDDEN, capacity=sc.CAPACITY, backend="emulated",
                 call_timeout_s=sc.CALL_TIMEOUT_S, setup_timeout_s=SETUP_TIMEOUT_S, pool=pool) as g:
        assert g.replaced_ranks == {0, 1}
        assert g.run(sc.Kind(2, "emulated").case(g, 3, 1)).outcome == "pass"


def test_a_second_failed_setup_is_raised_and_no_rank_serves_again(pool, monkeypatch):
    monkeypatch.setattr("cluster.actors.RankActor", sc.Starts({1, 3}, "setup"))
    segments = sc.own_segments()
    t0 = time.monotonic()
    with pytest.raises(SetupFailed, match=r"rank 1's setup_group failed \(worker w3\.\S+, "
                       r"pid \d+\): RuntimeError: CUDA error: out of memory \(injected\); "
                       r"ranks \[0\] were still in setup_group then \(not reused\)$"):
        TPGroup(tp=2, hidden=sc.HIDDEN, capacity=sc.CAPACITY, backend="emulated",
                call_timeout_s=sc.CALL_TIMEOUT_S, setup_timeout_s=SETUP_TIMEOUT_S, pool=pool)
    assert time.monotonic() - t0 < SETUP_TIMEOUT_S  # raised, not waited out
    assert pool.status() == []  # all four retired: two killed for the retry, two on close
    c = pool.counters()
    assert (c["replaced"], c["replaced_fresh"], c["retired"]) == (2, 2, 2)
    assert sc.own_segments() == segments  # the killed ranks' mailboxes were released


def test_survivors_a_backend_calls_suspect_are_retired(pool, monkeypatch):
    """Where the backend says a survivor of a killed peer holds what only
    its exit frees (the GPU's shared-GPU placement), the survivor finishes
    the group and is then retired, not handed to the next group."""
    import cluster.group
    monkeypatch.setattr(cluster.group, "suspect_after_a_kill", lambda backend, placement: True)
    out = sc.run_group(pool, "emulated", sc.Kind(2, "emulated"), seed=8, fault="stuck_rank")
    assert out["replaced"] == [1] and pool.counters()["retired"] == 1
    assert _gone([out["pids_after"][0]]) == []  # the survivor, retired on release
    assert [r["pid"] for r in pool.status()] == [out["pids_after"][1]]


def test_a_worker_reused_across_200_groups_holds_nothing_more(pool, capsys):
    t0 = time.monotonic()
    out = sc.hygiene(pool, "emulated", 200)
    took = time.monotonic() - t0
    with capsys.disabled():
        formed = sorted(out["formed_s"])
        print(f"\n200 pooled groups (emulated, mixed ops, tp 1-8, faults) in {took:.1f} s; "
              f"{out['replaced']} worker(s) replaced; formation from idle workers p50 "
              f"{formed[len(formed) // 2] * 1e3:.0f} ms, max {formed[-1] * 1e3:.0f} ms; "
              f"{len(out['end'])} workers")
    assert out["replaced"] >= 3  # the stuck ranks
    assert sc.beyond_contract(out["grew"], out["replaced"]) == {}, out["grew"]
    assert out["segments"] == (0, 0)  # no /dev/shm segment of a group outlives it


def test_closing_the_pool_leaves_no_worker_process(cluster):
    pool = WorkerPool.for_job("emulated")
    sc.run_group(pool, "emulated", sc.Kind(4, "emulated"), seed=7)
    pids = [r["pid"] for r in pool.status()]
    assert len(pids) == 4
    assert pool.close() == 4
    assert _gone(pids) == []


def test_a_standing_pool_serves_groups_and_stops(cluster):
    pool = WorkerPool.start("ci-standing", "emulated")
    try:
        with pytest.raises(ValueError, match="already runs"):
            WorkerPool.start("ci-standing", "emulated")
        assert pool.prestart(2, wait=True) == 2
        user = WorkerPool.attach("ci-standing")
        assert user.standing and user.backend == "emulated"
        with TPGroup(tp=2, hidden=sc.HIDDEN, capacity=sc.CAPACITY, backend="emulated",
                     call_timeout_s=sc.CALL_TIMEOUT_S, pool=user) as g:
            assert g.cold_ranks == []
            assert g.run(sc.Kind(2, "emulated").case(g, 3, 1)).outcome == "pass"
        rows = user.status()
        assert [r["state"] for r in rows] == ["idle", "idle"]
        assert sorted(r["served"] for r in rows) == [1, 1]
        assert user.close() == 0  # a job leaves a standing pool running
        pids = [r["pid"] for r in rows]
    finally:
        stopped = WorkerPool.attach("ci-standing").stop()
    assert stopped == 2 and _gone(pids) == []
    with pytest.raises(ValueError, match="no pool named 'ci-standing'"):
        WorkerPool.attach("ci-standing")
