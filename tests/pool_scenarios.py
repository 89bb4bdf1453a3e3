"""Pooled-worker scenarios (cluster.pool) shared by the emulated test
(tests/test_cluster_pool.py) and the GPU one (tests/gpu/test_pool_gpu.py):
groups of mixed ops, tp and placements formed from one pool, faults in
between, and what every worker holds afterwards."""

from __future__ import annotations

import dataclasses
import sys
import time

import ray

from cluster.actors import RankActor
from cluster.barrier import CallBarrier
from cluster.faults import run_fault
from cluster.group import TPGroup

HIDDEN, CAPACITY = 1024, 8
BUDGET_NS = 2_000_000_000
FAULT_BUDGET_NS = 600_000_000  # emulated ranks on a loaded 2-core box (tests/test_cluster_group.py)
CALL_TIMEOUT_S = 10.0
"""The host deadline of every call: an 8-rank emulated call on a 2-core box
under load was seen to miss 3 s. A stuck rank costs this much, so the
hygiene run kills one in every fourth fault only."""
KILL_EVERY = 4
"""Of the hygiene run's faults, every KILL_EVERY-th kills a rank (stuck_rank,
on a group of more than one); the others are skip_publish (recovered)."""
MiB = 2**20


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of group: ``tp`` ranks, ``placement`` (emulated, process-per-gpu,
    shared-gpu, virtual-ranks), the op and its fields."""
    tp: int
    placement: str
    fields: tuple = (("op", "all_reduce_norm"),)

    @property
    def gpus_per_rank(self) -> float:
        return {"emulated": 0.0, "process-per-gpu": 1.0}.get(self.placement, 1.0 / self.tp)

    def case(self, g, tokens: int, seed: int) -> dict:
        return g.case(tokens=tokens, seed=seed, budget_ns=BUDGET_NS, **dict(self.fields))


def kinds(backend: str) -> list[Kind]:
    """A cycle of group kinds over the ops, tp and placements ``backend`` has."""
    fin = (("op", "finalize_publish"), ("top_k", 8))
    mhc = (("op", "all_reduce_mhc"), ("hc", 4))
    emb = (("op", "embed_norm"),)
    if backend == "emulated":
        return [Kind(1, "emulated"), Kind(2, "emulated", fin), Kind(4, "emulated", mhc), Kind(2, "emulated", emb),
                Kind(8, "emulated")]
    return [Kind(1, "process-per-gpu"), Kind(2, "shared-gpu", fin), Kind(4, "shared-gpu", mhc),
            Kind(2, "virtual-ranks"), Kind(2, "shared-gpu", emb), Kind(8, "shared-gpu")]


def virtual_spec(kind: Kind, seed: int) -> dict:
    fields = dict(kind.fields)
    return {"op": fields.pop("op"), "fields": fields, "tp": kind.tp, "hidden": HIDDEN,
            "capacity": CAPACITY, "eps": 1e-6, "budget_ns": BUDGET_NS,
            "cases": [{"tokens": m, "inputs": "random", "seeds": [seed + m, seed + m + 1]}
                      for m in (1, CAPACITY)]}


def run_group(pool, backend: str, kind: Kind, seed: int, fault: str | None = None,
              tokens: tuple[int, ...] = (1, CAPACITY)) -> dict:
    """Form one group of ``kind`` from ``pool``, make a checked call per
    entry of ``tokens`` (and inject ``fault`` on the last rank before the
    last one); what happened: formation time, pids, cold and replaced ranks."""
    if kind.placement == "virtual-ranks":
        from cluster.gpu.virtual import run_group as virtual
        t0 = time.monotonic()
        out = pool.call(virtual, virtual_spec(kind, seed), share=0.5, node_id=None,
                        timeout_s=300.0)
        bad = [c for case in out["cases"] for c in case["calls"]
               if c["diagnosis"] or not c["mailbox_clean"] or not all(x["ok"] for x in c["checks"])]
        assert not bad, bad
        return {"kind": kind, "wall_s": time.monotonic() - t0, "pids": None, "cold": None,
                "replaced": []}
    t0 = time.monotonic()
    with TPGroup(tp=kind.tp, hidden=HIDDEN, capacity=CAPACITY, backend=backend,
                 gpus_per_rank=kind.gpus_per_rank, call_timeout_s=CALL_TIMEOUT_S,
                 setup_timeout_s=180, pool=pool) as g:
        formed_s = time.monotonic() - t0
        pids = [m["pid"] for m in g.metadata]
        cold = g.cold_ranks
        for i, m in enumerate(tokens):
            if fault is not None and i == len(tokens) - 1:
                verdict = run_fault(g, fault, rank=kind.tp - 1, budget_ns=FAULT_BUDGET_NS,
                                    fields=dict(kind.fields))
                assert verdict.met, (kind, fault, verdict.seen)
            call = g.run(kind.case(g, m, seed + i))
            assert call.outcome == "pass", (
                kind, fault, i, call.outcome, call.diagnosis.summary(), call.errors,
                [None if x is None else x["mailbox_clean"] for x in call.results],
                [None if c is None else c["ok"] for c in call.checks])
        return {"kind": kind, "formed_s": formed_s, "pids": pids, "cold": cold,
                "replaced": sorted(g.replaced_ranks), "cold_after": g.cold_ranks,
                "pids_after": [m["pid"] for m in g.metadata]}


def worker_figures(pool) -> dict[str, dict]:
    """Per worker key, what it holds (RankActor.stats), every worker idle."""
    rows = pool.status()
    assert all(r["state"] == "idle" and "error" not in r for r in rows), rows
    return {r["key"]: r for r in rows}


HELD = ("fds_pipe", "fds_shm", "fds_other", "fds_socket", "gpu_allocated_bytes",
        "gpu_reserved_bytes")


def own_segments() -> int:
    """/dev/shm entries of this driver's groups (cluster.group.new_group_id
    puts the driver's pid in every group id, cluster.emulated.segment in
    every segment name): other processes on the machine do not count."""
    import os
    return sum(f".p{os.getpid()}-" in name for name in os.listdir("/dev/shm"))


def growth(idle: dict[str, dict], end: dict[str, dict]) -> dict[str, dict]:
    """Per worker alive at both points, what it holds now beyond its idle
    figure (only the figures that changed)."""
    out = {}
    for key in idle.keys() & end.keys():
        grew = {k: end[key][k] - idle[key][k] for k in HELD
                if idle[key].get(k) is not None and end[key][k] != idle[key][k]}
        if grew:
            out[key] = grew
    return out


def beyond_contract(grew: dict[str, dict], replaced: int) -> dict[str, dict]:
    """Growth the hygiene contract does not allow: any pipe, /dev/shm or
    other descriptor, more than 1 MiB of device memory, and more sockets
    than workers were replaced (Ray's core worker opens a connection to a
    new peer process and keeps it: bounded by the peers, where a socket
    left per group, a gloo or store connection, would grow with the
    groups)."""
    def bad(k: str, v: int) -> bool:
        if k.endswith("_bytes"):
            return abs(v) > MiB
        return v > replaced if k == "fds_socket" else v != 0
    return {key: g for key, g in grew.items() if any(bad(k, v) for k, v in g.items())}


def hygiene(pool, backend: str, groups: int, *, fault_every: int = 13) -> dict:
    """``groups`` groups cycling through :func:`kinds`, a fault every
    ``fault_every`` groups (prime to the cycle's length, so faults meet
    every kind): a recoverable one (skip_publish), every :data:`KILL_EVERY`-th
    a killing one (stuck_rank, on a group of more than one rank); the
    workers' figures after the
    first cycle (idle) and at the end."""
    cycle = kinds(backend)
    for i, kind in enumerate(cycle):  # every kind once: kernels loaded, every worker warm
        run_group(pool, backend, kind, seed=i)
    idle = worker_figures(pool)
    segments = own_segments()
    replaced, formed = 0, []
    for i in range(len(cycle), groups):
        kind = cycle[i % len(cycle)]
        fault = None
        if i % fault_every == 0 and kind.placement != "virtual-ranks":
            kill = (i // fault_every) % KILL_EVERY == 1 and kind.tp > 1
            fault = "stuck_rank" if kill else "skip_publish"
        out = run_group(pool, backend, kind, seed=i, fault=fault, tokens=(CAPACITY,))
        replaced += len(out["replaced"])
        if out.get("formed_s") is not None and not out["cold"]:
            formed.append(out["formed_s"])
    end = worker_figures(pool)
    return {"idle": idle, "end": end, "replaced": replaced, "formed_s": formed,
            "grew": growth(idle, end), "segments": (segments, own_segments())}


INJECTED = "CUDA error: out of memory (injected)"
"""What a broken worker raises (the H200 nightly's warm-up failure)."""


class _SetupFails(RankActor.__ray_actor_class__):
    """A worker that warms up but whose every ``setup_group`` raises at once."""

    def setup_group(self, **_):
        raise RuntimeError(INJECTED)


class _WarmFails(_SetupFails):
    """A worker whose warm-up raises (and so does every setup after it)."""

    def warm(self):
        raise RuntimeError(INJECTED)


SLOW_WARM_S = 600.0
"""How long a slow worker's warm-up sleeps before warming up (past any test)."""


class _WarmSlow(RankActor.__ray_actor_class__):
    """A worker whose warm-up takes :data:`SLOW_WARM_S` longer."""

    def warm(self):
        time.sleep(SLOW_WARM_S)
        return super().warm()


BROKEN = {"setup": ray.remote(num_cpus=0, max_restarts=0)(_SetupFails),
          "warm": ray.remote(num_cpus=0, max_restarts=0)(_WarmFails),
          "slow": ray.remote(num_cpus=0, max_restarts=0)(_WarmSlow)}
"""Broken workers by what fails; Ray workers cannot import this module by
name: a test that starts them ships it by value (:func:`ship_by_value`)."""


def ship_by_value() -> None:
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Starts:
    """Stands in for ``RankActor`` where actors are started
    (``cluster.actors.RankActor`` for the pool, ``cluster.group.RankActor``
    for a group without one): of the actors started through it (0-based, in
    order), those in ``broken`` are ``BROKEN[how]`` ones."""

    def __init__(self, broken: set[int], how: str) -> None:
        self.broken, self.cls, self.started = set(broken), BROKEN[how], 0

    def options(self, **options):
        cls = self.cls if self.started in self.broken else RankActor
        self.started += 1
        return cls.options(**options)


BARRIER_START_S = 4.0


@ray.remote(num_cpus=0, max_restarts=0)
class SlowBarrier(CallBarrier.__ray_metadata__.modified_class):
    """The batches' barrier actor whose start takes ``BARRIER_START_S``
    (a worker process's start on a starved host)."""

    def __init__(self) -> None:
        time.sleep(BARRIER_START_S)
        super().__init__()
