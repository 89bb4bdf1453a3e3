"""WorkerPool: long-lived rank actors ("workers") that TP groups are formed from.

Starting a rank actor costs seconds (a process, torch and the kernel DSL
imported, a CUDA context, kernels loaded); a correctness case costs
milliseconds. A pool starts each worker once and hands it to group after
group: :class:`cluster.group.TPGroup` given a pool *acquires* tp idle workers
(a lease), sets them up as a group (a fresh torch.distributed group and
mailbox each time, :meth:`cluster.actors.RankActor.setup_group`), and on
close *releases* them: each leaves its group (``close``: mailbox freed,
process group destroyed, the caching allocator emptied) and goes back to
idle, keeping its imports, context and compiled kernels. A virtual-ranks
group is one worker running the whole group in-process
(:meth:`WorkerPool.call`).

Slots. On the gpu backend the pool reserves every GPU of every node it uses
with a placement group of one ``{"GPU": 1}`` bundle per GPU (a *slot*), so
Ray schedules nothing else onto them, and starts workers inside a slot with
a sliver of it (:data:`WORKER_GPU_SHARE`): every worker of a slot runs on
that slot's GPU and sees every GPU of its node (``cluster.gpu.rank.
ALL_GPUS_VISIBLE``, as process-per-GPU ranks need), so one worker can be a
process-per-GPU rank, a shared-GPU rank or a virtual-ranks group in turn.
The pool counts what each slot holds, in the fan-out's units
(cluster.fanout; ``Request.share``): a process-per-GPU group takes whole
slots (one rank on each of tp slots of one node), a shared-GPU group tp
workers of one slot and ``1 / groups_per_gpu`` of it, a virtual-ranks group
one worker and that share. A request that does not fit waits for a release
(bounded). On the emulated backend workers are CPU actors pinned to a node
(``NodeAffinitySchedulingStrategy``; the driver's node when a group is not
pinned) and nothing is counted.

Faults keep their meaning: a rank that missed its deadline or died is
replaced (:meth:`WorkerPool.replace`: only that worker is killed, and an
idle worker of its slot takes its place, a fresh one where there is none);
a worker whose warm-up (:meth:`~cluster.actors.RankActor.warm`) raised is
never leased (killed where a lease would have picked it, and counted as
retired); a worker whose ``close`` says it is not reusable
(a sticky device error), that did not close in time, or that survived a
killed peer where its backend says such a survivor holds what only its exit
frees (``cluster.backend.suspect_after_a_kill``: shared-GPU CUDA IPC
exports) is retired on release; a worker never serves two groups at once.

Two lifetimes. A job's own pool (:meth:`WorkerPool.for_job`) lives in the
driver: its workers are the driver's actors (Ray ends them with it) and
:meth:`WorkerPool.close` kills them. A standing pool (:meth:`WorkerPool.start`,
``python -m jobs pool start``) lives on a long-running cluster: a named,
detached keeper actor holds the registry, its workers and placement groups
are detached too, and jobs given ``--pool NAME`` attach to it
(:meth:`WorkerPool.attach`); a lease whose driver is gone is reclaimed (its
workers killed and replaced) when capacity runs short.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from cluster.placement import Placement

POOL_NAMESPACE = "lamport-pool"
"""Ray namespace of standing pools' keepers and workers."""
WORKER_GPU_SHARE = 1 / 128
"""Ray GPU resource one worker holds inside its slot's bundle (of 1): never
what limits a slot (:data:`MAX_WORKERS_PER_SLOT` does)."""
MAX_WORKERS_PER_SLOT = 24
"""Workers one slot holds at most, idle ones included. Every worker is a
CUDA context on the slot's GPU, and the contexts of one GPU share its
hardware queues: on an H200, 28 contexts of ``cluster.gpu.WORKER_CONNECTIONS``
(16) came up and the 29th failed with "out of memory"
(``scripts/gpu/context_probe.py``). A request that would pass the cap waits
for room, so fewer groups run at once than ``groups_per_gpu`` asks when
``groups_per_gpu x tp`` is past it (two tp-8 groups a GPU, 16 workers, fit)."""


def gpu_worker_env() -> dict[str, str]:
    """A GPU worker sees every GPU of its node (cluster.gpu.ALL_GPUS_VISIBLE:
    it may be a process-per-GPU rank) and has enough hardware queues for the
    streams of tp virtual ranks, no more (cluster.gpu.WORKER_CONNECTIONS)."""
    from cluster.gpu import ALL_GPUS_VISIBLE, WORKER_CONNECTIONS
    return {ALL_GPUS_VISIBLE: "1", "CUDA_DEVICE_MAX_CONNECTIONS": str(WORKER_CONNECTIONS)}

CONTROL_TIMEOUT_S = 30.0
"""Bound on one call to a standing pool's keeper and on reserving slots."""
WAIT_STEP_S = 0.05
"""How often a request that does not fit looks again."""


@dataclasses.dataclass(frozen=True)
class Request:
    """What one group asks of the pool. ``placement``: a
    :class:`~cluster.placement.Placement` (or its value);
    ``share``: of one GPU the group holds on each slot it uses (1 for
    process per GPU); ``node_id``: the node it is pinned to (None: any)."""
    tp: int
    placement: Placement
    share: float = 1.0
    node_id: str | None = None

    PLACEMENTS = tuple(Placement)

    def __post_init__(self) -> None:
        if self.placement not in self.PLACEMENTS:
            raise ValueError(f"placement must be one of {[str(p) for p in self.PLACEMENTS]}, "
                             f"got {self.placement!r}")
        object.__setattr__(self, "placement", Placement(self.placement))
        if not isinstance(self.tp, int) or self.tp < 1:
            raise ValueError(f"tp must be a positive integer, got {self.tp!r}")
        if not 0 < self.share <= 1:
            raise ValueError(f"share must be in (0, 1], got {self.share!r}")

    @property
    def workers(self) -> int:
        return 1 if self.placement == Placement.VIRTUAL_RANKS else self.tp

    @property
    def slots(self) -> int:
        """Distinct GPUs the group needs (gpu backend)."""
        return self.tp if self.placement == Placement.PROCESS_PER_GPU else 1


@dataclasses.dataclass
class Worker:
    """One pooled process (plain data and an actor handle: crosses Ray)."""
    key: str
    actor: Any
    node_id: str | None
    slot: int | None
    """Index of its GPU's bundle in the node's placement group (None: CPU)."""
    started_unix: float
    lease: str | None = None
    served: int = 0
    """Leases it has been handed out in."""
    warm: Any = None
    """Its :meth:`~cluster.actors.RankActor.warm` call's ref while that is
    not known to have succeeded (None once it has)."""


@dataclasses.dataclass
class Lease:
    """tp workers (rank order) held by one group until released."""
    id: str
    request: Request
    workers: list[Worker]
    owner: str | None = None
    """The Ray job that holds it (a standing pool reclaims a dead one's)."""
    fresh: list[bool] = dataclasses.field(default_factory=list)
    """Per rank, whether its worker was started for this lease (cold), a
    replacement's included (:meth:`Registry.replace`)."""
    warm_failed: int = 0
    """Workers whose warm-up had raised that forming and serving this lease
    found and killed instead of handing out."""

    @property
    def actors(self) -> list:
        return [w.actor for w in self.workers]


class Registry:
    """The pool's state and its operations; not thread-safe (the
    :class:`WorkerPool` in the driver serialises calls, a keeper actor
    serialises them by being an actor)."""

    def __init__(self, backend: str, *, name: str, detached: bool = False) -> None:
        from cluster.backend import require_backend
        self.backend = require_backend(backend)
        self.name, self.detached = name, detached
        self.workers: dict[str, Worker] = {}
        self.leases: dict[str, Lease] = {}
        self.load: dict[tuple[str, int], float] = {}
        """(node, slot) -> share held by leases."""
        self.groups: dict[str, Any] = {}
        """node -> its placement group (one GPU bundle a slot)."""
        self._ids = itertools.count()
        self.created = time.time()
        self.warm_failed = 0
        """Workers killed because their warm-up raised (:meth:`_take`)."""
        self.per_slot = 0
        """Workers :meth:`prestart` put in every slot (the largest asked):
        what :meth:`replace` tops a slot back up to."""
        self._topology: tuple[tuple[str, ...], Any] | None = None
        """(alive node ids, their cluster.topology.Topology) as last kept."""

    # -- slots
    def _reserve(self, node_id: str, timeout_s: float) -> None:
        """Every GPU of ``node_id`` as one bundle of a placement group."""
        import ray
        from ray.util.placement_group import NODE_ID_LABEL_KEY, placement_group
        if node_id in self.groups:
            return
        gpus = next((int(n.get("Resources", {}).get("GPU", 0)) for n in ray.nodes()
                     if n.get("Alive") and n["NodeID"] == node_id), 0)
        if gpus < 1:
            raise ValueError(f"pool {self.name}: node {node_id} has no GPU to reserve")
        pg = placement_group([{"GPU": 1}] * gpus, strategy="STRICT_PACK",
                             name=_slot_group_name(self.name, node_id),
                             bundle_label_selector=[{NODE_ID_LABEL_KEY: node_id}] * gpus,
                             lifetime="detached" if self.detached else None)
        try:
            ray.get(pg.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.util.remove_placement_group(pg)
            raise TimeoutError(
                f"pool {self.name}: {gpus} GPU(s) of node {node_id} not free after {timeout_s} s "
                f"(another job or pool holds them): available {ray.available_resources()}") from None
        self.groups[node_id] = pg
        for slot in range(gpus):
            self.load.setdefault((node_id, slot), 0.0)

    def _gpu_nodes(self, node_id: str | None) -> list[str]:
        import ray
        if node_id is not None:
            return [node_id]
        return [n["NodeID"] for n in ray.nodes()
                if n.get("Alive") and n.get("Resources", {}).get("GPU", 0) >= 1]

    # -- workers
    def _start(self, node_id: str | None, slot: int | None) -> Worker:
        import ray

        from cluster.actors import RankActor
        key = f"w{next(self._ids)}.{(node_id or 'any')[:8]}" + ("" if slot is None else f".g{slot}")
        options: dict = {"num_cpus": 0}
        if self.backend == "gpu":
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            options.update(num_gpus=WORKER_GPU_SHARE, scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.groups[node_id], placement_group_bundle_index=slot),
                runtime_env={"env_vars": gpu_worker_env()})
        elif node_id is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
        if self.detached:
            options.update(name=f"{self.name}.{key}", namespace=POOL_NAMESPACE, lifetime="detached")
        actor = RankActor.options(**options).remote(self.backend)
        # imports and CUDA context now; a group's setup queues behind it
        worker = Worker(key=key, actor=actor, node_id=node_id, slot=slot, started_unix=time.time(),
                        warm=actor.warm.remote())
        self.workers[key] = worker
        return worker

    def _kill(self, worker: Worker) -> None:
        import ray
        self.workers.pop(worker.key, None)
        try:
            ray.kill(worker.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def _warm_raised(self, worker: Worker) -> bool:
        """Whether ``worker``'s warm-up has ended and raised; never waits (a
        warm-up still running is no verdict: a group's setup queues behind it)."""
        import ray
        if worker.warm is None:
            return False
        ready, _ = ray.wait([worker.warm], timeout=0)
        if not ready:
            return False
        try:
            ray.get(worker.warm, timeout=0)
        except Exception:  # noqa: BLE001 - any error: the process is not fit to serve
            return True
        worker.warm = None
        return False

    def _at(self, node_id: str | None, slot: int | None) -> list[Worker]:
        """The workers of that place (node and slot), leased or not."""
        return [w for w in self.workers.values() if w.node_id == node_id and w.slot == slot]

    def _idle(self, node_id: str | None, slot: int | None) -> list[Worker]:
        """Idle workers of that place whose warm-up did not raise: those
        whose warm-up has ended first (a group's setup would queue behind a
        warm-up still running), then the most used first (their kernels are
        warm)."""
        return sorted((w for w in self._at(node_id, slot)
                       if w.lease is None and not self._warm_raised(w)),
                      key=lambda w: (w.warm is not None, -w.served))

    def _take(self, node_id: str | None, slot: int | None, n: int) -> tuple[list[Worker], list[bool]]:
        """``n`` workers of that place for a lease: idle ones first
        (:meth:`_idle`), fresh ones for the rest; and per worker whether it is
        fresh. Idle workers of that place whose warm-up raised are killed
        first (counted in :attr:`warm_failed`), so a fresh one may take
        their place in the slot."""
        for w in [w for w in self._at(node_id, slot) if w.lease is None and self._warm_raised(w)]:
            self._kill(w)
            self.warm_failed += 1
        got = self._idle(node_id, slot)[:n]
        fresh = [False] * len(got)
        while len(got) < n:
            got.append(self._start(node_id, slot))
            fresh.append(True)
        return got, fresh

    # -- leases
    def try_acquire(self, request: Request, owner: str | None = None,
                    local_node: str | None = None) -> Lease | None:
        """A lease for ``request`` now, or None when it does not fit yet."""
        if self.backend == "gpu":
            places = self._fit_gpu(request)
            if places is None:
                return None
        else:
            node = request.node_id or local_node
            places = [(node, None, request.tp)]
        workers, fresh = [], []
        failed_before = self.warm_failed
        for node, slot, n in places:
            got, cold = self._take(node, slot, n)
            workers += got
            fresh += cold
            if slot is not None:
                self.load[node, slot] += request.share
        lease = Lease(id=uuid.uuid4().hex[:12], request=request, workers=workers, owner=owner,
                      fresh=fresh, warm_failed=self.warm_failed - failed_before)
        for w in workers:
            w.lease, w.served = lease.id, w.served + 1
        self.leases[lease.id] = lease
        return lease

    def _fit_gpu(self, request: Request) -> list[tuple[str, int, int]] | None:
        """[(node, slot, workers there)] for ``request``, or None."""
        for node in self._gpu_nodes(request.node_id):
            self._reserve(node, CONTROL_TIMEOUT_S)
            slots = sorted(s for (n, s) in self.load if n == node)
            per_slot = request.workers // request.slots
            # the workers a slot would start for it (its idle ones serve first)
            free = [s for s in slots if self.load[node, s] + request.share <= 1 + 1e-6
                    and len(self._at(node, s)) + max(0, per_slot - len(self._idle(node, s)))
                    <= MAX_WORKERS_PER_SLOT]
            if len(free) < request.slots:
                continue
            # prefer slots whose idle workers cover the request, then the least loaded
            free.sort(key=lambda s: (len(self._idle(node, s)) < per_slot, self.load[node, s]))
            return [(node, s, per_slot) for s in sorted(free[:request.slots])]
        return None

    def release(self, lease_id: str, reusable: Sequence[bool]) -> None:
        """End a lease: each worker back to idle, or killed where
        ``reusable[rank]`` is False."""
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            return
        for worker, ok in zip(lease.workers, reusable):
            worker.lease = None
            if not ok:
                self._kill(worker)
        if self.backend == "gpu":
            for node, slot in {(w.node_id, w.slot) for w in lease.workers}:
                self.load[node, slot] = max(0.0, self.load[node, slot] - lease.request.share)

    def prestart(self, per_slot: int, local_node: str | None = None) -> list[Worker]:
        """Start idle workers up to ``per_slot`` in every slot of every GPU
        node (emulated: on ``local_node``), so the first groups find them
        warm; the workers started. ``per_slot`` (0 to
        :data:`MAX_WORKERS_PER_SLOT`) is also what :meth:`replace` keeps a
        slot at."""
        import ray

        from kernels.validation import require_int
        require_int("per_slot", per_slot, low=0, high=MAX_WORKERS_PER_SLOT)
        self.per_slot = max(self.per_slot, per_slot)
        started = []
        if self.backend == "gpu":
            for node in self._gpu_nodes(None):
                self._reserve(node, CONTROL_TIMEOUT_S)
            places = sorted(self.load)
        else:
            places = [(local_node or ray.get_runtime_context().get_node_id(), None)]
        for node, slot in places:
            have = len(self._at(node, slot))
            started += [self._start(node, slot) for _ in range(max(0, per_slot - have))]
        return started

    def replace(self, lease_id: str, rank: int) -> Lease:
        """Kill rank's worker of the lease and put another in its place, of
        the same node and slot: the most used idle one whose warm-up did not
        fail (:meth:`_idle`), else a fresh one (``lease.fresh[rank]`` says
        which). Policy: a slot left holding fewer workers than :meth:`prestart`
        put there gets fresh ones up to that number (warming up in the
        background), so the next replacement finds a warm worker too; the
        top-up never takes a slot past that number (itself at most
        :data:`MAX_WORKERS_PER_SLOT`), and the lease's share of the slot
        (``load``) does not change. Returns the lease."""
        from kernels.validation import require_int
        if lease_id not in self.leases:
            raise ValueError(f"pool {self.name}: no lease {lease_id!r}")
        lease = self.leases[lease_id]
        require_int("rank", rank, low=0, high=len(lease.workers) - 1)
        old = lease.workers[rank]
        self._kill(old)
        failed_before = self.warm_failed
        (new,), (cold,) = self._take(old.node_id, old.slot, 1)
        lease.warm_failed += self.warm_failed - failed_before
        new.lease, new.served = lease_id, new.served + 1
        lease.workers[rank] = new
        lease.fresh[rank] = cold
        for _ in range(self.per_slot - len(self._at(old.node_id, old.slot))):
            self._start(old.node_id, old.slot)
        return lease

    def reclaim_dead(self, alive_owners: set[str]) -> list[str]:
        """End the leases of owners no longer alive, killing their workers
        (a dead driver may have left a kernel spinning); their ids."""
        dead = [lid for lid, lease in self.leases.items()
                if lease.owner is not None and lease.owner not in alive_owners]
        for lid in dead:
            self.release(lid, [False] * len(self.leases[lid].workers))
        return dead

    def owners(self) -> set[str]:
        return {lease.owner for lease in self.leases.values() if lease.owner}

    def describe_load(self) -> str:
        busy = sum(1 for w in self.workers.values() if w.lease)
        slots = ", ".join(f"{n[:8]}/g{s}: {v:g}" for (n, s), v in sorted(self.load.items()))
        return (f"pool {self.name}: {len(self.workers)} worker(s), {busy} leased, "
                f"{len(self.leases)} lease(s)" + (f"; slots held {slots}" if slots else "")
                + (f"; {self.warm_failed} worker(s) killed because their warm-up raised"
                   if self.warm_failed else ""))

    def info(self) -> dict:
        return {"name": self.name, "backend": self.backend, "detached": self.detached,
                "created_unix": self.created}

    # -- the cluster's topology, discovered once per set of nodes
    def kept_topology(self, nodes: tuple[str, ...]):
        """The topology kept for exactly these alive ``nodes``, else None."""
        if self._topology is not None and self._topology[0] == nodes:
            return self._topology[1]
        return None

    def keep_topology(self, nodes: tuple[str, ...], topology) -> None:
        self._topology = (nodes, topology)

    def snapshot(self) -> list[Worker]:
        return list(self.workers.values())

    def stop(self) -> int:
        """Kill every worker and give the slots back; the workers killed."""
        import ray
        n = len(self.workers)
        for worker in list(self.workers.values()):
            self._kill(worker)
        self.leases.clear()
        for pg in self.groups.values():
            try:
                ray.util.remove_placement_group(pg)
            except Exception:  # noqa: BLE001 - gone with its node
                pass
        self.groups.clear()
        self.load.clear()
        return n


class WorkerPool:
    """The pool as TPGroup and the jobs use it: :meth:`acquire`,
    :meth:`release`, :meth:`replace`, :meth:`call`, :meth:`status`; over a
    :class:`Registry` in this process (a job's own pool) or in a standing
    pool's keeper actor."""

    def __init__(self, *, registry: Registry | None = None, keeper: Any = None,
                 name: str, backend: str) -> None:
        self._registry, self._keeper = registry, keeper
        self.name, self.backend = name, backend
        self._lock = threading.Condition()
        self.standing = keeper is not None
        self.acquired = self.fresh_workers = self.replaced = self.replaced_fresh = 0
        self.retired = self.warm_failed = 0
        """Leases taken, workers started for them (cold), workers replaced
        after a kill and how many of those by a fresh worker (no idle one),
        workers retired (not reusable on release, or their warm-up raised)
        and how many of those because their warm-up raised."""
        self.wait_s = 0.0
        """Summed time requests waited for room."""
        self.cleared = (0, 0)
        """What :meth:`start` cleared of a dead keeper of this name
        (:func:`clear_orphans`): workers killed, placement groups removed."""
        self._warming: list = []
        """(node id, warm-up ref) of the workers :meth:`prestart` started
        last, until one has ended (:meth:`_await_a_warm_worker`)."""

    # -- construction
    @classmethod
    def for_job(cls, backend: str) -> "WorkerPool":
        """A pool of this driver's own (ended by :meth:`close`)."""
        name = f"job-{uuid.uuid4().hex[:8]}"
        return cls(registry=Registry(backend, name=name), name=name, backend=backend)

    @classmethod
    def start(cls, name: str, backend: str) -> "WorkerPool":
        """A standing pool on the connected cluster: its keeper, named
        ``name`` in :data:`POOL_NAMESPACE`, detached. ValueError when one of
        that name exists."""
        import ray
        from kernels.validation import require_name
        require_name("pool name", name)
        try:
            ray.get_actor(name, namespace=POOL_NAMESPACE)
        except ValueError:
            pass
        else:
            raise ValueError(f"a pool named {name!r} already runs on this cluster "
                             f"(python -m jobs pool status --name {name})")
        cleared = clear_orphans(name)
        keeper = ray.remote(num_cpus=0, max_restarts=0)(Registry).options(
            name=name, namespace=POOL_NAMESPACE, lifetime="detached").remote(
            backend, name=name, detached=True)
        ray.get(keeper.describe_load.remote(), timeout=CONTROL_TIMEOUT_S)
        pool = cls(keeper=keeper, name=name, backend=backend)
        pool.cleared = cleared
        return pool

    @classmethod
    def attach(cls, name: str) -> "WorkerPool":
        """The standing pool ``name`` on the connected cluster; ValueError
        naming the pools there when there is none."""
        import ray
        try:
            keeper = ray.get_actor(name, namespace=POOL_NAMESPACE)
        except ValueError:
            raise ValueError(f"no pool named {name!r} on this cluster (standing pools: "
                             f"{standing_pools() or 'none'}; start one with "
                             f"python -m jobs pool start --name {name})") from None
        info = ray.get(keeper.info.remote(), timeout=CONTROL_TIMEOUT_S)
        return cls(keeper=keeper, name=name, backend=info["backend"])

    def _call(self, method: str, *args, **kwargs):
        if self._keeper is None:
            with self._lock:
                out = getattr(self._registry, method)(*args, **kwargs)
                if method in ("release", "reclaim_dead"):
                    self._lock.notify_all()
                return out
        import ray
        return ray.get(getattr(self._keeper, method).remote(*args, **kwargs),
                       timeout=CONTROL_TIMEOUT_S)

    def topology(self):
        """The cluster's :class:`~cluster.topology.Topology`, discovered
        (:func:`~cluster.topology.discover_cluster`, by this process) the
        first time and again whenever the alive nodes differ from those it
        was discovered on, else the one the pool keeps: a job on a standing
        pool does not pay for a discovery (seconds: a task per node
        importing torch) that ``jobs pool start`` already made."""
        import ray

        from cluster.topology import discover_cluster
        nodes = tuple(sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive")))
        kept = self._call("kept_topology", nodes)
        if kept is None:
            kept = discover_cluster()
            self._call("keep_topology", nodes, kept)
        return kept

    # -- leases
    def acquire(self, request: Request, *, timeout_s: float) -> Lease:
        """tp workers for ``request`` (rank order), waiting up to
        ``timeout_s`` for room; TimeoutError says what the pool holds."""
        import ray
        ctx = ray.get_runtime_context()
        owner, here = ctx.get_job_id(), ctx.get_node_id()
        started = time.monotonic()
        deadline = started + timeout_s
        self._await_a_warm_worker(timeout_s, request.node_id)
        reclaimed = False
        while True:
            lease = self._call("try_acquire", request, owner, here)
            if lease is not None:
                break
            if self.standing and not reclaimed:
                reclaimed = True
                alive = alive_jobs()
                if alive is not None and self._call("reclaim_dead", alive):
                    continue
            if time.monotonic() > deadline:
                raise TimeoutError(f"no room for {request} within {timeout_s} s: "
                                   f"{self._call('describe_load')}")
            if self._keeper is None:
                with self._lock:
                    self._lock.wait(WAIT_STEP_S)
            else:
                time.sleep(WAIT_STEP_S)
        with self._lock:  # fan-out threads acquire at once
            self.wait_s += time.monotonic() - started
            self.acquired += 1
            self.fresh_workers += sum(lease.fresh)
            self._count_warm_failed(lease.warm_failed)
        return lease

    def _await_a_warm_worker(self, timeout_s: float, node_id: str | None = None) -> None:
        """Until one of the workers :meth:`prestart` started last has ended
        its warm-up (raised or not), at most ``timeout_s``: a lease takes
        the warm before the warming (:meth:`Registry._idle`), so the first
        group waits for the first warm-up to end, not for whichever its
        workers' ends last. Once one has, never again. Only those on
        ``node_id``, the request's pinned node, when given: a group pinned
        to another node than the warming workers' (the emulated pool
        prestarts on the driver's node) cannot take them, so it starts its
        own at once."""
        import ray
        refs = [ref for node, ref in self._warming if node_id is None or node == node_id]
        if not refs:
            return
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=0)
        if not ready:
            ray.wait(pending, num_returns=1, timeout=timeout_s)
        self._warming = []

    def _count_warm_failed(self, n: int) -> None:
        """Under the lock: ``n`` more workers killed for a failed warm-up."""
        self.warm_failed += n
        self.retired += n

    def release(self, lease: Lease, reusable: Sequence[bool]) -> None:
        with self._lock:
            self.retired += sum(not ok for ok in reusable)
        self._call("release", lease.id, list(reusable))

    def replace(self, lease: Lease, rank: int) -> Any:
        """Another worker for ``rank``, the old one killed
        (:meth:`Registry.replace`: an idle one of its slot, else a fresh
        one; ``lease.fresh[rank]`` says which); its actor."""
        failed_before = lease.warm_failed  # a job's own pool hands back this very lease
        now = self._call("replace", lease.id, rank)
        lease.workers[rank], lease.fresh[rank] = now.workers[rank], now.fresh[rank]
        lease.warm_failed = now.warm_failed
        with self._lock:
            self.replaced += 1
            self.replaced_fresh += now.fresh[rank]
            self._count_warm_failed(now.warm_failed - failed_before)
        return now.workers[rank].actor

    def call(self, fn, spec: Mapping, *, share: float, node_id: str | None, timeout_s: float):
        """``fn(spec)`` in one worker of a slot (``share`` of its GPU): the
        virtual-ranks form of a group. A call past ``timeout_s`` kills
        its worker (a spinning kernel ends with its process; the slot gets a
        fresh one later) and raises GetTimeoutError; a raised exception is
        Ray's RayTaskError (``.cause`` the original), after which the
        worker is kept only when its device still answers."""
        import ray
        lease = self.acquire(Request(tp=1, placement=Placement.VIRTUAL_RANKS, share=share,
                                     node_id=node_id), timeout_s=timeout_s)
        actor = lease.actors[0]
        reusable = False
        try:
            ref = actor.run_function.remote(fn, dict(spec))
            result = ray.get(ref, timeout=timeout_s)
            reusable = True
            return result
        except ray.exceptions.RayTaskError:
            reusable = device_answers(actor)
            raise
        finally:
            self.release(lease, [reusable])

    # -- views
    def counters(self) -> dict:
        """This driver's use of the pool (the job's accounting)."""
        return {"pool": self.name, "standing": self.standing, "leases": self.acquired,
                "fresh_workers": self.fresh_workers, "replaced": self.replaced,
                "replaced_fresh": self.replaced_fresh, "retired": self.retired,
                "warm_failed": self.warm_failed, "wait_s": round(self.wait_s, 3)}

    def prestart(self, per_slot: int, *, wait: bool = False,
                 timeout_s: float = 300.0) -> int:
        """Idle workers up to ``per_slot`` in every slot (Registry.prestart),
        started now; with ``wait`` returns once each has warmed up (imports,
        CUDA context) or failed to (such a one is never leased); TimeoutError
        past ``timeout_s``. The number started.

        All at once, not in waves: tried on one H200, a second wave started
        once the first group's workers had warmed cut that group's build from
        11.4 to 5.0 s, but the next groups then waited for, and ran beside,
        14 workers warming up; correctness took 99 s instead of 70 (two
        machines, not side by side: docs/results/warm_nightly_h200_2026-12-02b.md)."""
        import ray
        here = ray.get_runtime_context().get_node_id()
        workers = self._call("prestart", per_slot, here)
        self._warming = [(w.node_id, w.warm) for w in workers]
        if wait and workers:
            refs = [w.warm for w in workers]
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
            if len(ready) < len(refs):
                raise TimeoutError(f"pool {self.name}: {len(refs) - len(ready)} of {len(refs)} "
                                   f"worker(s) not warm within {timeout_s} s")
        return len(workers)

    def warm_summary(self, timeout_s: float = 10.0) -> str:
        """The workers' warm-ups (:meth:`~cluster.actors.RankActor.warm`) in
        words: how many, their readiness after the actor's construction
        (median and largest) and the median of each part, in seconds; from
        the workers that answer within ``timeout_s`` (:meth:`status`)."""
        import statistics
        warm = [row["warm"] for row in self.status(timeout_s) if row.get("warm")]
        if not warm:
            return "no worker has warmed up"
        parts = ", ".join(f"{name} {statistics.median(w.get(key, 0.0) for w in warm):.1f}"
                          for key, name in (("spawn_s", "process start to actor"),
                                            ("imports_s", "imports"), ("dsl_s", "DSL import"),
                                            ("cuda_wait_s", "turn for the GPU"),
                                            ("cuda_s", "CUDA context"),
                                            ("group_s", "group of one")) if key in warm[0])
        ready = [w["ready_s"] for w in warm]
        return (f"{len(warm)} worker(s) warm {statistics.median(ready):.1f} s after their start "
                f"(median; the last {max(ready):.1f} s); medians: {parts} s")

    def usage(self) -> str:
        """:meth:`counters` in words."""
        return (f"{self.acquired} lease(s), {self.fresh_workers} worker(s) started for them, "
                f"{self.replaced} replaced after a kill ({self.replaced_fresh} by a fresh worker), "
                f"{self.retired} retired (not reusable; {self.warm_failed} of them because their "
                f"warm-up raised), {self.wait_s:.1f} s waiting for room")

    def status(self, timeout_s: float = CONTROL_TIMEOUT_S) -> list[dict]:
        """One dict per worker: its key, node, slot, lease, leases served
        and the actor's own :meth:`~cluster.actors.RankActor.stats` (pid,
        GPU, age, memory, fds; ``error`` where it did not answer)."""
        import ray
        workers = self._call("snapshot")
        refs = [w.actor.stats.remote() for w in workers]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
        out = []
        for w, ref in zip(workers, refs):
            row = {"key": w.key, "node_id": w.node_id, "slot": w.slot,
                   "state": "leased" if w.lease else "idle", "leases": w.served,
                   "age_s": round(time.time() - w.started_unix, 1)}
            if ref in ready:
                try:
                    row.update({k: v for k, v in ray.get(ref).items() if k != "age_s"})
                except Exception as err:  # noqa: BLE001 - one dead worker is a row, not a crash
                    row["error"] = f"{type(err).__name__}: {err}"[:200]
            else:
                row["error"] = f"no answer within {timeout_s} s"
            out.append(row)
        return out

    def describe(self) -> str:
        return self._call("describe_load")

    def close(self) -> int:
        """A job's own pool: kill its workers, free its slots (the workers
        killed). A standing pool: nothing (it outlives the job; :meth:`stop`)."""
        return 0 if self.standing else self._call("stop")

    def stop(self) -> int:
        """Stop a standing pool: its workers, slots and keeper."""
        import ray
        n = self._call("stop")
        if self._keeper is not None:
            ray.kill(self._keeper, no_restart=True)
        return n


def device_answers(actor) -> bool:
    """Whether a worker's device still works (its stats come back within
    a few seconds): a sticky CUDA error or a dead process says no."""
    import ray
    try:
        ray.get(actor.stats.remote(), timeout=10.0)
        return True
    except Exception:  # noqa: BLE001
        return False


def alive_jobs() -> set[str] | None:
    """Hex ids of the cluster's jobs (drivers) that have not ended; None
    when the job table cannot be read (then no lease is reclaimed)."""
    try:
        from ray._private import state
        return {j["JobID"] for j in state.jobs() if not j.get("IsDead")}
    except Exception:  # noqa: BLE001
        return None


def _slot_group_name(pool: str, node_id: str) -> str:
    """The name of the placement group holding ``pool``'s slots on a node."""
    return f"{pool}-{node_id[:8]}"


def clear_orphans(name: str) -> tuple[int, int]:
    """What a standing pool named ``name`` left when its keeper died without
    :meth:`WorkerPool.stop` (a crash, its node lost): its named workers
    (killed) and its slots' placement groups (removed, giving their GPUs
    back). Only for a name no keeper holds: :meth:`WorkerPool.start` calls
    it. Returns (workers killed, placement groups removed)."""
    import re

    import ray
    from ray._raylet import PlacementGroupID
    from ray.util import list_named_actors
    from ray.util.placement_group import PlacementGroup, placement_group_table
    workers = [a["name"] for a in list_named_actors(all_namespaces=True)
               if a.get("namespace") == POOL_NAMESPACE and a["name"].startswith(f"{name}.")]
    for worker in workers:
        try:
            ray.kill(ray.get_actor(worker, namespace=POOL_NAMESPACE), no_restart=True)
        except ValueError:  # gone meanwhile
            pass
    ours = re.compile(re.escape(_slot_group_name(name, "")) + "[0-9a-f]{8}")
    groups = [pg_id for pg_id, info in placement_group_table().items()
              if ours.fullmatch(info.get("name") or "") and info.get("state") != "REMOVED"]
    for pg_id in groups:
        ray.util.remove_placement_group(PlacementGroup(PlacementGroupID(bytes.fromhex(pg_id))))
    return len(workers), len(groups)


def standing_pools() -> list[str]:
    """Names of the standing pools on the connected cluster."""
    try:
        from ray.util import list_named_actors
        return sorted(a["name"] for a in list_named_actors(all_namespaces=True)
                      if a.get("namespace") == POOL_NAMESPACE and "." not in a["name"])
    except Exception:  # noqa: BLE001
        return []
