"""Pooled rank workers (cluster.pool) on the GPUs of this machine: groups of
every placement (process per GPU, shared GPU, virtual ranks) formed from the
same warm workers, each leaving its group clean for the next (a fresh NCCL
or gloo group and mailbox each time), a stuck rank's worker alone replaced,
and a worker reused across 200 groups of mixed ops, tp and placements with
faults in between holding no more device memory (within 1 MiB) or
descriptors than when idle.

    timeout -s KILL 600 python -m pytest -m gpu tests/gpu/test_pool_gpu.py -v -s [--slow]
"""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.gpu
ray = pytest.importorskip("ray")

from cluster.pool import WorkerPool  # noqa: E402
from tests import pool_scenarios as sc  # noqa: E402


@pytest.fixture(scope="module")
def pool(cluster):
    p = WorkerPool.for_job("gpu")
    yield p
    p.close()


def test_every_placement_from_the_same_warm_workers(pool):
    runs = [sc.run_group(pool, "gpu", kind, seed=i) for i, kind in enumerate(sc.kinds("gpu"))]
    warm = sc.worker_figures(pool)
    runs += [sc.run_group(pool, "gpu", kind, seed=10 + i) for i, kind in enumerate(sc.kinds("gpu"))]
    for r in runs:
        k = r["kind"]
        how = (f"{r['wall_s']:.2f} s (in one worker)" if r["pids"] is None else
               f"formed in {r['formed_s']:.3f} s, cold ranks {r['cold']}, pids {r['pids']}")
        print(f"\n{k.placement} tp={k.tp} {dict(k.fields)['op']}: {how}")
    second = runs[len(runs) // 2:]
    assert all(r["cold"] == [] for r in second if r["cold"] is not None)  # all warm now
    grew = sc.growth(warm, sc.worker_figures(pool))
    print(f"pool: {pool.usage()}; growth over the second cycle {grew}")
    assert sc.beyond_contract(grew, replaced=0) == {}, grew


def test_a_warm_worker_has_formed_and_left_a_group_of_one(pool):
    pool.prestart(1, wait=True)
    rows = pool.status()
    warm = [r["warm"] for r in rows if r.get("warm")]
    assert warm and all(w["group_s"] > 0 and "cuda_wait_s" in w for w in warm), warm  # RankActor.warm
    assert not any(r["in_group"] for r in rows)  # ... and left it
    out = sc.run_group(pool, "gpu", sc.Kind(1, "process-per-gpu"), seed=70)
    assert out["cold"] == [], out  # a group of a worker warmed that way


def test_a_stuck_rank_is_replaced_alone(pool):
    out = sc.run_group(pool, "gpu", sc.Kind(2, "shared-gpu"), seed=50, fault="stuck_rank")
    assert out["replaced"] == [1]
    assert out["pids_after"][0] == out["pids"][0] and out["pids_after"][1] != out["pids"][1]
    pids = {r["pid"]: r for r in pool.status()}
    assert out["pids"][1] not in pids  # the stuck one was killed
    assert out["pids"][0] not in pids  # its survivor too, once the group ended (shared GPU:
    assert pids[out["pids_after"][1]]["state"] == "idle"  # cluster.gpu.SUSPECT_AFTER_A_KILL)


@pytest.mark.slow
def test_a_worker_reused_across_200_groups_holds_nothing_more(pool):
    t0 = time.monotonic()
    out = sc.hygiene(pool, "gpu", 200)
    formed = sorted(out["formed_s"])
    print(f"\n200 pooled groups (GPU, mixed ops and placements, faults) in "
          f"{time.monotonic() - t0:.1f} s; {out['replaced']} worker(s) replaced; formation "
          f"from idle workers p50 {formed[len(formed) // 2] * 1e3:.0f} ms, max "
          f"{formed[-1] * 1e3:.0f} ms; {len(out['end'])} workers")
    for key in sorted(out["idle"]):
        if key in out["end"]:
            a, b = out["idle"][key], out["end"][key]
            print(f"  {key}: fds {a['fds']} -> {b['fds']}, reserved {a['gpu_reserved_bytes']} -> "
                  f"{b['gpu_reserved_bytes']} B, device used {a['gpu_device_used_bytes'] / 2**20:.0f}"
                  f" -> {b['gpu_device_used_bytes'] / 2**20:.0f} MiB, served {b['served']}")
    assert out["replaced"] >= 3
    assert sc.beyond_contract(out["grew"], out["replaced"]) == {}, out["grew"]
