"""TPGroup: tp rank actors in one placement group, driven as one Lamport group.

Hang handling in layers (docs/design.md, Hang detection):
1. every consumer has a watchdog (``case.budget_ns``) and still returns;
2. the host deadline ``call_timeout_s`` bounds every rank's call, moved
   later by the time its ranks on this host waited for a CPU (at most
   ``STARVED_STRETCH`` times more);
3. :func:`kernels.lamport.diagnosis.diagnose` names the culprits at group level;
4. after anything but a pass the whole group recovers: every rank's call has
   returned (quiesce), then every rank scrubs its mailbox and resets its stage
   state and call count, and the driver collects all of them (barrier) before
   the next call;
5. a rank that missed the host deadline or died is killed and the whole group
   rebuilt (a process that had to die takes its group with it): the stuck
   ones are killed and awaited, the survivors closed gracefully, fresh actors
   placed in the same bundles join a new rendezvous, and the group-start check
   reports (and scrubs) any mailbox a killed process left dirty.

Ranks come from a :class:`cluster.pool.WorkerPool` when one is given
(``pool``): the group leases tp warm workers (no placement group, no process
start), sets them up with a fresh rendezvous and mailbox, and on close hands
them back, each leaving its group; in step 5 only the killed ranks' workers
are replaced (by idle workers of their slots, else fresh ones:
:meth:`cluster.pool.Registry.replace`) and the survivors set up again.
Without a pool the group places and starts tp actors of its own and kills
them on close.

Setup fails fast: the moment one rank's ``setup_group`` raises (or its
process dies) the build stops waiting for the others, which are still in
the rendezvous and never leave it in time, and :class:`SetupFailed` names
that rank, its worker and pid where known and the error. Those ranks' and
the failed one's processes never serve again (killed; pooled: released as
not reusable). A pooled group retries such a build once, with exactly
those ranks' workers replaced (``replaced_ranks``, ``cold_ranks`` show
it); the second failure is raised.

Timeouts: placement and setup ``setup_timeout_s`` (errors say what was
requested and what the cluster has), each call ``call_timeout_s`` (must
exceed the watchdog budget plus any injected delay), every other ``ray.get``
``CONTROL_TIMEOUT_S``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence

import ray
from ray.util.placement_group import (NODE_ID_LABEL_KEY, placement_group,
                                      remove_placement_group)
from ray.util.scheduling_strategies import (NodeAffinitySchedulingStrategy,
                                            PlacementGroupSchedulingStrategy)

from cluster.actors import RankActor, release_rank
from cluster.backend import (actor_env, host_half, needs_rendezvous, require_backend,
                             suspect_after_a_kill)
from cluster.barrier import call_barrier
from cluster.cases import Case, check_outputs, make_case
from cluster.errors import error_text
from kernels.lamport.diagnosis import (GroupDiagnosis, MailboxCheck, RankReport, diagnose,
                               diagnose_start)
from cluster import phases
from cluster.injection import validate_injection
from cluster.placement import Placement
from cluster.procs import cpu_wait_s
from kernels.lamport.protocol import VEC_BF16
from kernels.validation import require_int, require_multiple, require_number, require_tp

CONTROL_TIMEOUT_S = 30.0
"""Bound on control calls (close, state, recover, kill confirmation)."""
CLOSE_TIMEOUT_S = 5.0
"""Bound on a graceful close before ray.kill."""
STARVED_STRETCH = 2.0
"""A call's host deadline moves later by as long as its ranks on this host
waited for a CPU during the call, by at most this many ``call_timeout_s``:
on a starved host (a busy CI runner) a slow rank is not called hung. A rank
stuck asleep accrues no such wait, nor, on a host with CPUs to spare, one
spinning on a GPU: both are still judged at ``call_timeout_s``."""
CPU_PER_RANK_BUNDLE = 0.01
"""A CPU bundle's size for CPU-only ranks: placement groups need a non-zero
bundle; the rank actors themselves declare num_cpus=0."""


@dataclasses.dataclass(frozen=True)
class GroupCall:
    """One collective call on every rank of the group, and what followed."""
    seq: int
    case: dict
    outcome: str
    """``pass``, ``fail`` (wrong or unclean without a timeout), ``hang`` (a
    watchdog fired or a rank missed the host deadline), ``error`` (a rank
    raised or died)."""
    diagnosis: GroupDiagnosis
    results: tuple[dict | None, ...]
    """Per rank, the backend's result dict (None: no result)."""
    checks: tuple[dict | None, ...]
    """Per rank, cluster.cases.check_outputs against the reference."""
    errors: Mapping[int, str]
    recovery: tuple[MailboxCheck, ...] | None
    """The mailboxes as the recovery found them (None: no recovery)."""
    rebuilt: bool
    start_diagnosis: GroupDiagnosis | None
    """The group-start check of the rebuilt group (None: not rebuilt)."""
    wall_s: float
    phases_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """The slowest rank's host time of each phase of this call
    (:func:`cluster.phases.slowest`; empty where no rank reported it)."""
    publish_offsets_us: tuple[float | None, ...] | None = None
    """Per rank, its publish start after the group's first, us
    (:func:`cluster.stragglers.call_offsets`; None: fewer than two marks)."""


RUN_TAG_ENV = "LAMPORT_RUN_TAG"
"""The driver's run (set by ``jobs``); it names every group's mailboxes."""


def new_group_id() -> str:
    """``<run tag>.p<driver pid>-<12 hex>``: the run (LAMPORT_RUN_TAG, else
    ``adhoc``) and the driver that made the group, so what a group leaves
    behind (``/dev/shm/ll-<group id>-r<rank>``) can be traced to a run and
    swept once its driver is gone (``cluster.emulated.segment``)."""
    tag = re.sub(r"[^A-Za-z0-9_-]", "_", os.environ.get(RUN_TAG_ENV) or "adhoc")[:32]
    return f"{tag}.p{os.getpid()}-{uuid.uuid4().hex[:12]}"


class SetupFailed(RuntimeError):
    """A rank's ``setup_group`` raised or its process died while a TP group
    was being set up. ``rank``: that rank; ``unusable``: it and the ranks
    still in ``setup_group`` then (their call still runs, blocked on the
    failed peer): the ranks whose processes must not serve again."""

    def __init__(self, message: str, *, rank: int, unusable: set[int]) -> None:
        super().__init__(message)
        self.rank, self.unusable = rank, frozenset(unusable)


class NodeLost(RuntimeError):
    """The node a TP group is pinned to left the cluster: the group cannot
    be rebuilt there; its remaining cases are lost, not the run."""


def own_error(errors: Sequence[BaseException]) -> BaseException:
    """Of the ranks' errors of one timed case (rank order), the first that is
    a rank's own failure rather than its report that another rank failed
    (:class:`cluster.measure.timing.PeerFailed`, possibly inside a Ray task
    error's ``cause``): the error a row should carry."""
    from cluster.measure.timing import PeerFailed
    for err in errors:
        if not isinstance(getattr(err, "cause", err), PeerFailed):
            return err
    return errors[0]


def placement_for(gpus_per_rank: float) -> Placement:
    """The placement a GPU share implies: 0 emulated, 1 process per GPU, a
    fraction shared GPU."""
    if gpus_per_rank == 0:
        return Placement.EMULATED
    return Placement.PROCESS_PER_GPU if gpus_per_rank == 1 else Placement.SHARED_GPU


class TPGroup:
    """tp RankActors placed with STRICT_PACK (one node: one NVLink domain on
    GPUs, one host's shared memory on the emulated backend), set up as one TP
    group. Use as a context manager or call :meth:`close`.

    ``gpus_per_rank``: 0 for CPU ranks (emulated), 1 for process-per-GPU,
    a fraction for several ranks sharing a GPU (placement ``shared-gpu``:
    one bundle holding ``tp * gpus_per_rank`` of one GPU, every rank in it,
    so all ranks land on the same GPU). ``backend_options``: passed to every
    rank's backend setup (gpu: ``transport``); a backend that needs a
    rendezvous (gpu) also gets ``master_addr`` / ``master_port`` from rank 0's
    actor and the ``placement``, new for every (re)build. ``node_id``: pin
    every bundle to that Ray node (a ``ray.io/node-id`` label selector, as
    cluster.fanout plans it), else Ray picks the node. ``pool``: take the
    ranks from that :class:`cluster.pool.WorkerPool` (same backend) instead
    of starting actors of the group's own.
    """

    def __init__(self, *, tp: int, hidden: int, capacity: int, backend: str = "emulated",
                 gpus_per_rank: float = 0.0, setup_timeout_s: float = 60.0,
                 call_timeout_s: float = 10.0, backend_options: Mapping | None = None,
                 node_id: str | None = None, pool=None) -> None:
        require_tp("tp", tp)
        require_multiple("hidden", hidden, VEC_BF16)
        require_int("capacity", capacity, low=1)
        require_number("gpus_per_rank", gpus_per_rank, nonnegative=True)
        if not gpus_per_rank <= 1:
            raise ValueError(f"gpus_per_rank must be in [0, 1], got {gpus_per_rank}")
        require_number("setup_timeout_s", setup_timeout_s, positive=True)
        require_number("call_timeout_s", call_timeout_s, positive=True)
        if backend_options is not None and not isinstance(backend_options, Mapping):
            raise TypeError(f"backend_options must be a mapping, got "
                            f"{type(backend_options).__name__}")
        self.tp, self.hidden, self.capacity = tp, hidden, capacity
        self.backend = require_backend(backend)
        self.gpus_per_rank = gpus_per_rank
        self.placement = placement_for(gpus_per_rank)
        if self.placement == Placement.SHARED_GPU and tp * gpus_per_rank > 1 + 1e-6:
            raise ValueError(f"shared-gpu: tp * gpus_per_rank must be <= 1 (one GPU), got "
                             f"{tp} * {gpus_per_rank}")
        self.backend_options = dict(backend_options or {})
        if pool is not None and pool.backend != self.backend:
            raise ValueError(f"pool {pool.name} runs the {pool.backend} backend, the group "
                             f"{self.backend}")
        self._rendezvous = needs_rendezvous(self.backend)
        self._prepared: set = set()
        self.setup_timeout_s, self.call_timeout_s = setup_timeout_s, call_timeout_s
        self.group_id = new_group_id()
        self.builds = 0
        self.work_s = 0.0
        """Summed over calls, the slowest rank's publish + consume time (the
        work a call timed on its ranks; the service overhead's denominator)."""
        self.build_s = 0.0
        """Summed wall time of placing the group and of every build (fresh
        rank actors started and set up: process, imports, device, mailbox
        rendezvous), rebuilds included."""
        self.lease_s = 0.0
        """Of ``build_s``, with a pool: the wait for the lease of its workers
        (cluster.pool.WorkerPool.acquire)."""
        self.prepare_s = 0.0
        """Summed wall time of :meth:`prepare` (every rank building the kernels
        a case needs: compiled, or loaded from the compile cache), which the
        first call of each kind pays."""
        self.phases_s: dict[str, float] = {}
        """Summed over calls, the slowest rank's host time of each phase
        (:mod:`cluster.phases`: inputs, load, call, readback, check)."""
        self.start_diagnosis: GroupDiagnosis | None = None
        self.metadata: list[dict] = []
        self.replaced_ranks: set[int] = set()
        """Ranks whose worker was killed and replaced by another (a rebuild,
        or a retried setup); the cases after it ran on the replacement."""
        self._suspect: set[int] = set()
        """Pooled ranks that survived a killed peer where the backend says
        such a survivor must not serve another group: retired on close."""
        self._unusable: frozenset[int] = frozenset()
        """Ranks of the last build whose setup failed or had not ended when
        the build gave up (:meth:`_await_setups`): not asked to close (their
        call may still run), never reused."""
        self._actors: list = []
        self._seq = 0
        self._closed = False
        if self.placement == Placement.SHARED_GPU:
            self._bundles = [{"GPU": round(tp * gpus_per_rank, 4)}]
        else:
            self._bundles = [{"GPU": gpus_per_rank} if gpus_per_rank
                             else {"CPU": CPU_PER_RANK_BUNDLE} for _ in range(tp)]
        self.node_id = node_id
        self._pool, self._lease, self._pg = pool, None, None
        placing = time.monotonic()
        try:
            if pool is None:
                self._place(setup_timeout_s)
            else:
                from cluster.pool import Request
                shared = self.placement == Placement.SHARED_GPU
                self._lease = pool.acquire(
                    Request(tp=tp, placement=self.placement, node_id=node_id,
                            share=round(tp * gpus_per_rank, 4) if shared else 1.0),
                    timeout_s=setup_timeout_s)
                self.lease_s = time.monotonic() - placing
            self.build_s += time.monotonic() - placing
            self._build()
        except BaseException:
            self.close()
            raise

    @property
    def pooled(self) -> bool:
        return self._lease is not None

    @property
    def cold_ranks(self) -> list[int]:
        """Ranks whose worker process was started for this group (all of
        them without a pool; with one, those the pool had no idle worker
        for, at the lease or at a replacement)."""
        if self._lease is None:
            return list(range(self.tp))
        return [r for r, fresh in enumerate(self._lease.fresh) if fresh]

    def _place(self, timeout_s: float) -> None:
        """The group's own placement group (no pool), ready."""
        pin = {} if self.node_id is None else {
            "bundle_label_selector": [{NODE_ID_LABEL_KEY: self.node_id}] * len(self._bundles)}
        self._pg = placement_group(self._bundles, strategy="STRICT_PACK",
                                   name=f"tp{self.tp}-{self.group_id}", **pin)
        try:
            ray.get(self._pg.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            self._require_node()
            raise TimeoutError(
                f"placement group for tp={self.tp} (bundles {self._bundles}, STRICT_PACK"
                f"{'' if self.node_id is None else ', node ' + self.node_id}) not ready "
                f"after {timeout_s} s: {self._resources()}") from None

    def __enter__(self) -> "TPGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- building
    def _resources(self) -> str:
        return f"cluster total {ray.cluster_resources()}, available {ray.available_resources()}"

    def _bundle_index(self, rank: int) -> int:
        return 0 if self.placement == Placement.SHARED_GPU else rank

    def _options(self) -> dict | None:
        """Setup options for this build (a fresh rendezvous address each time)."""
        if not self._rendezvous:
            return self.backend_options or None
        try:
            addr, port = ray.get(self._actors[0].rendezvous_address.remote(),
                                 timeout=self.setup_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(
                f"TP group {self.group_id}: rank 0's actor did not start within "
                f"{self.setup_timeout_s} s (bundles {self._bundles}, num_gpus="
                f"{self.gpus_per_rank} each): {self._resources()}") from None
        return {**self.backend_options, "master_addr": addr, "master_port": port,
                "placement": self.placement}

    def _build(self) -> None:
        """Set every rank up as one group (without a pool, tp fresh actors
        started in the bundles first). Pooled, a :class:`SetupFailed` build
        is retried once with its unusable ranks killed and replaced
        (:meth:`_renew`); the next one, or any without a pool, is raised."""
        started = time.monotonic()
        try:
            try:
                self._start_actors()
            except SetupFailed as failed:
                if self._lease is None:
                    raise
                self._renew(set(failed.unusable))
                self._start_actors()
        finally:
            self.build_s += time.monotonic() - started

    def _start_actors(self) -> None:
        if self._lease is not None:
            self._actors = self._lease.actors
        else:
            env = actor_env(self.backend, placement=self.placement, tp=self.tp)
            extra = {"runtime_env": {"env_vars": env}} if env else {}
            self._actors = [
                RankActor.options(
                    num_gpus=self.gpus_per_rank,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        self._pg, placement_group_bundle_index=self._bundle_index(r)),
                    **extra,
                ).remote(self.backend)
                for r in range(self.tp)]
        self._prepared = set()
        options = self._options()
        self._unusable = frozenset()
        refs = [a.setup_group.remote(group_id=self.group_id, rank=r, tp=self.tp,
                                     capacity=self.capacity, hidden=self.hidden,
                                     timeout_s=self.setup_timeout_s,
                                     **({} if options is None else {"options": options}))
                for r, a in enumerate(self._actors)]
        setups = self._await_setups(refs)
        self.metadata = [s["metadata"] for s in setups]
        self.start_diagnosis = diagnose_start([MailboxCheck(**s["start_check"]) for s in setups])
        if self.tp > 1:  # the batches' barrier serves before any call's host deadline starts
            call_barrier(timeout_s=self.setup_timeout_s)
        self.builds += 1

    def _await_setups(self, refs: list) -> list[dict]:
        """Every rank's ``setup_group`` result (rank order), waited for one at
        a time up to ``setup_timeout_s``: the first that raised (or whose
        process died) ends the wait as :class:`SetupFailed`; ranks still
        running at the deadline are a TimeoutError naming them. Either way
        the ranks it leaves unusable are recorded in ``_unusable``."""
        rank_of = {ref: r for r, ref in enumerate(refs)}
        pending, setups = list(refs), [None] * len(refs)
        deadline = time.monotonic() + self.setup_timeout_s
        while pending:
            ready, pending = ray.wait(pending, num_returns=1,
                                      timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            r = rank_of[ready[0]]
            try:
                setups[r] = ray.get(ready[0], timeout=CONTROL_TIMEOUT_S)
            except ray.exceptions.RayError as err:
                stuck = sorted(rank_of[x] for x in pending)
                self._unusable = frozenset({r, *stuck})
                raise SetupFailed(
                    f"TP group {self.group_id}: rank {r}'s setup_group failed "
                    f"({self._whose(r)}): {error_text(err)}; ranks {stuck} were still in "
                    f"setup_group then (not reused)", rank=r, unusable=self._unusable) from err
        if pending:
            late = sorted(rank_of[x] for x in pending)
            self._unusable = frozenset(late)
            raise TimeoutError(
                f"TP group {self.group_id}: setup_group of ranks {late} did not finish within "
                f"{self.setup_timeout_s} s (requested {self.tp} ranks, bundles {self._bundles}, "
                f"num_gpus={self.gpus_per_rank} each): {self._resources()}")
        return setups

    def _whose(self, rank: int) -> str:
        """``worker KEY, pid PID`` of rank's process: the pool's worker key
        (pooled), the pid its actor gives (``pid unknown`` when it does not
        answer within ``CLOSE_TIMEOUT_S``: a dead process)."""
        parts = [] if self._lease is None else [f"worker {self._lease.workers[rank].key}"]
        try:
            pid = ray.get(self._actors[rank].metadata.remote(), timeout=CLOSE_TIMEOUT_S)["pid"]
        except ray.exceptions.RayError:
            pid = "unknown"
        return ", ".join([*parts, f"pid {pid}"])

    def _rebuild(self, gone: set[int]) -> None:
        """Kill the ranks in ``gone`` and build the group again
        (:meth:`_renew`, then :meth:`_build`)."""
        self._renew(gone)
        self._build()

    def _renew(self, gone: set[int]) -> None:
        """Kill the ranks in ``gone`` and wait until their processes are over,
        and close the survivors; without a pool all of them are then gone,
        pooled the killed ranks' and any survivor that did not close cleanly
        are replaced by other workers (:meth:`cluster.pool.WorkerPool.replace`),
        the others kept to be set up again."""
        for r in sorted(gone):
            ray.kill(self._actors[r], no_restart=True)
        self._require_node()
        for r in sorted(gone):
            self._await_exit(r)
        survivors = set(range(self.tp)) - gone
        if self._lease is None:
            self._stop_actors(survivors)
        else:
            reusable = self._close_ranks(survivors)
            if suspect_after_a_kill(self.backend, self.placement):
                self._suspect |= survivors
            bad = sorted(gone | {r for r in survivors if not reusable[r]})
            for r in bad:
                self._pool.replace(self._lease, r)
                self.replaced_ranks.add(r)
            self._release({r for r in bad if r not in gone})

    def node_alive(self) -> bool:
        """False once the pinned node (or, unpinned, a rank's node) is gone."""
        nodes = {self.node_id} if self.node_id else {m["node_id"] for m in self.metadata}
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        return nodes <= alive

    def _require_node(self) -> None:
        if not self.node_alive():
            where = self.node_id or sorted({m["node_id"] for m in self.metadata})
            raise NodeLost(f"TP group {self.group_id}: node {where} left the cluster")

    def _await_exit(self, rank: int) -> None:
        """Return once rank's killed process can no longer write: Ray reports
        the actor dead and, when it ran on this node, its pid is gone (or a
        zombie). An idle actor (one whose setup raised) may still answer a
        call sent right after ``ray.kill``, before the kill reaches it: it is
        asked again until it is dead; RuntimeError if it still answers
        ``CONTROL_TIMEOUT_S`` after the kill."""
        deadline = time.monotonic() + CONTROL_TIMEOUT_S
        while True:
            try:
                ray.get(self._actors[rank].metadata.remote(),
                        timeout=max(0.1, deadline - time.monotonic()))
            except ray.exceptions.RayActorError:
                break
            except ray.exceptions.GetTimeoutError:
                raise TimeoutError(f"rank {rank} neither answered nor was reported dead "
                                   f"{CONTROL_TIMEOUT_S} s after ray.kill") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"rank {rank} still answers {CONTROL_TIMEOUT_S} s "
                                   f"after ray.kill")
            time.sleep(0.05)
        meta = self.metadata[rank] if rank < len(self.metadata) else None
        if meta is None or meta["node_id"] != ray.get_runtime_context().get_node_id():
            return
        while _process_alive(meta["pid"]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {rank} (pid {meta['pid']}) still running "
                                   f"{CONTROL_TIMEOUT_S} s after ray.kill")
            time.sleep(0.01)

    def _close_ranks(self, ranks: set[int]) -> dict[int, bool]:
        """Graceful close of ``ranks``, bounded by ``CLOSE_TIMEOUT_S``; per
        rank whether it closed and may serve another group (the backend's
        verdict; False when it did not answer in time or raised)."""
        refs = {r: self._actors[r].close.remote() for r in ranks}
        ready, _ = (ray.wait(list(refs.values()), num_returns=len(refs), timeout=CLOSE_TIMEOUT_S)
                    if refs else ([], []))
        reusable = {r: False for r in ranks}
        for r, ref in refs.items():
            if ref in ready:
                try:
                    verdict = ray.get(ref, timeout=CONTROL_TIMEOUT_S)
                    reusable[r] = bool((verdict or {"reusable": True})["reusable"])
                except ray.exceptions.RayError:
                    pass
        return reusable

    def _stop_actors(self, ranks: set[int]) -> None:
        """Graceful close of ``ranks`` (bounded), then ray.kill; a rank whose
        close did not complete gets its leftovers released on its node."""
        if not ranks:
            return
        closed = {r for r, ok in self._close_ranks(ranks - self._unusable).items() if ok}
        for r in ranks:
            ray.kill(self._actors[r], no_restart=True)
        self._release(set(ranks) - closed)

    def _release(self, ranks: set[int]) -> None:
        """Free what the (killed) ``ranks`` left on their node (the backend's
        ``release_rank``), run in their bundle or, pooled, on their node."""
        if not ranks or not self.node_alive():  # nothing to free on a node that is gone
            return

        def where(r: int):
            if self._pg is not None:
                return PlacementGroupSchedulingStrategy(
                    self._pg, placement_group_bundle_index=self._bundle_index(r))
            return NodeAffinitySchedulingStrategy(self._lease.workers[r].node_id, soft=False)
        refs = [release_rank.options(scheduling_strategy=where(r)).remote(
            self.backend, self.group_id, r) for r in sorted(ranks)]
        ray.get(refs, timeout=CONTROL_TIMEOUT_S)

    # -- calls
    def case(self, **fields) -> Case:
        """A validated case for this group (cluster.cases.make_case)."""
        return make_case(capacity=self.capacity, **fields)

    def prepare(self, case: Case) -> list[dict]:
        """Every rank builds (compiles) what ``case`` needs, bounded by
        ``setup_timeout_s``; :meth:`run` does this once per
        :func:`prepare_key` and build, before any rank's watchdog starts."""
        self._require_open()
        case = self.case(**case.to_fields())
        started = time.monotonic()
        try:
            return self._prepare(case)
        finally:
            self.prepare_s += time.monotonic() - started

    def _prepare(self, case: Case) -> list[dict]:
        refs = [a.prepare.remote(case) for a in self._actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.setup_timeout_s)
        if len(ready) < len(refs):
            raise TimeoutError(f"prepare: ranks {[r for r, x in enumerate(refs) if x not in ready]} "
                               f"did not finish within {self.setup_timeout_s} s")
        try:
            out = ray.get(refs, timeout=CONTROL_TIMEOUT_S)
        except ray.exceptions.RayActorError:
            self._require_node()  # NodeLost names the node when that is why
            raise
        self._prepared.add(prepare_key(case))
        return out

    def time(self, spec: Mapping, timeout_s: float) -> list[dict]:
        """Every rank times the fused op and its baselines at once
        (:func:`cluster.measure.timing.time_case`, process per GPU only);
        returns the per-rank results, rank order. A rank past ``timeout_s``
        is a TimeoutError naming it (the caller then closes the group: a
        timed graph cannot be recovered mid-replay)."""
        self._require_open()
        refs = [a.time_case.remote(dict(spec)) for a in self._actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if len(ready) < len(refs):
            raise TimeoutError(f"time: ranks {[r for r, x in enumerate(refs) if x not in ready]} "
                               f"did not finish within {timeout_s} s")
        results, errors = [], []
        for ref in refs:
            try:
                results.append(ray.get(ref, timeout=CONTROL_TIMEOUT_S))
            except Exception as err:  # noqa: BLE001 - re-raised below, the most telling first
                errors.append(err)
        if errors:
            raise own_error(errors)
        return results

    def trace_start(self) -> None:
        """Every rank starts its profiler (cluster.tracing); the calls until
        :meth:`trace_stop` are traced."""
        self._require_open()
        ray.get([a.trace_start.remote() for a in self._actors], timeout=self.setup_timeout_s)

    def trace_stop(self) -> dict:
        """The ranks' traces merged into one timeline (cluster.tracing.merge),
        each rank a track named ``rank r (host, GPU g)``. A group rebuilt
        since :meth:`trace_start` has new actors that traced nothing: a
        RuntimeError says so."""
        from cluster.tracing import merge
        self._require_open()
        traces = ray.get([a.trace_stop.remote() for a in self._actors],
                         timeout=self.setup_timeout_s)
        labels = [f"rank {r} ({m.get('hostname', '?')}, "
                  f"{'GPU ' + ','.join(m['gpu_ids']) if m.get('gpu_ids') else 'CPU'})"
                  for r, m in enumerate(self.metadata)]
        return merge(traces, labels)

    def run(self, case: Case, faults: Mapping[int, Mapping] | None = None) -> GroupCall:
        """One collective call: the same case (same seq, same M) on every rank,
        ``faults[rank]`` injected into that rank's call (cluster.injection).
        Collects every rank's result by the host deadline, diagnoses, then
        recovers or rebuilds the group unless the call passed."""
        return next(self.run_batch([case], [faults]))

    def run_batch(self, cases: Sequence[Case],
                  faults: Sequence[Mapping[int, Mapping] | None] | None = None
                  ) -> Iterator[GroupCall]:
        """The calls ``cases`` (each as in :meth:`run`, ``faults[i]`` into
        call i) in one Ray call per rank (``RankActor.run_cases``, streamed):
        yields each call's GroupCall as every rank's result for it is in,
        with the same per-call host deadline, diagnosis and outcome as
        :meth:`run`, and stops after the first call that did not pass, once
        every rank's batch has ended (quiesce) and the group has recovered or
        been rebuilt; a rank past the deadline of call k leaves calls < k
        recorded and k a hang. Raises NodeLost when the group's node left."""
        self._require_open()
        faults = list(faults) if faults is not None else [None] * len(cases)
        if len(faults) != len(cases):
            raise ValueError(f"{len(cases)} cases but {len(faults)} fault maps")
        calls = [self._validated(c, f) for c, f in zip(cases, faults)]
        for case, _ in calls:
            if prepare_key(case) not in self._prepared:
                self.prepare(case)
        seq0 = self._seq
        barrier = call_barrier() if self.tp > 1 and len(calls) > 1 else None
        key = f"{self.group_id}/{self.builds}/{seq0}"
        host = host_half(self.backend)
        halves = [None if host is None else host(case, f, tp=self.tp, hidden=self.hidden)
                  for case, f in calls]
        streams = [a.run_cases.remote([case.replace(seq=seq0 + i + 1, fault=f.get(r))
                                       for i, (case, f) in enumerate(calls)], barrier, key,
                                      None if host is None else [h.payload(r) for h in halves])
                   for r, a in enumerate(self._actors)]
        ended = [False] * self.tp
        done = False
        try:
            for i, (case, _) in enumerate(calls):
                self._seq = seq0 + i + 1
                started = time.monotonic()
                results, errors, absent, gone = self._collect(streams, ended, started)
                if halves[i] is not None:
                    results = [halves[i].finish(x) for x in results]
                call = self._conclude(case, results, errors, absent, gone, started,
                                      remaining=len(calls) - i - 1, streams=streams, ended=ended)
                if call.outcome != "pass":
                    done = True
                    yield call
                    return
                yield call
            done = True
        finally:
            if not done:  # the caller stopped early: no rank may still be running a call
                late = self._drain(streams, ended, len(calls) - (self._seq - seq0))
                if late:
                    self._rebuild(late)

    def _validated(self, case: Case, faults: Mapping | None) -> tuple[Case, dict]:
        case = self.case(**case.to_fields())
        faults = {int(r): validate_injection(f) for r, f in (faults or {}).items()}
        if not set(faults) <= set(range(self.tp)):
            raise ValueError(f"fault ranks {sorted(faults)} outside 0..{self.tp - 1}")
        delay_s = max((f.get("delay_ns", 0) for f in faults.values()), default=0) / 1e9
        if self.call_timeout_s <= case.budget_ns / 1e9 + delay_s:
            raise ValueError(f"call_timeout_s={self.call_timeout_s} must exceed the watchdog budget "
                             f"{case.budget_ns / 1e9} s plus injected delays {delay_s} s")
        return case, faults

    def _collect(self, streams, ended, started: float):
        """Every rank's next result, each by ``started + call_timeout_s``
        plus the stretch of :meth:`_starved_s`."""
        results: list[dict | None] = [None] * self.tp
        errors, absent, gone = {}, {}, set()
        waited = self._cpu_waits()
        cap = STARVED_STRETCH * self.call_timeout_s
        for r, stream in enumerate(streams):
            if ended[r]:
                absent[r] = errors[r] = "ended its batch early"
                continue
            while True:
                stretch = min(cap, self._starved_s(waited))
                left = started + self.call_timeout_s + stretch - time.monotonic()
                ready, _ = ray.wait([stream], timeout=max(0.0, left))
                if ready or stretch >= cap or self._starved_s(waited) < stretch + 0.05:
                    break
            if not ready:
                absent[r] = f"missed the host deadline of {self.call_timeout_s} s" + (
                    f" (moved {stretch:.1f} s later: its ranks' wait for a CPU)"
                    if stretch >= 0.05 else "")
                gone.add(r)
                continue
            try:
                results[r] = ray.get(next(stream), timeout=CONTROL_TIMEOUT_S)
            except StopIteration:
                ended[r] = True
                absent[r] = errors[r] = "ended its batch early"
            except ray.exceptions.RayActorError as exc:
                ended[r] = True
                absent[r] = f"process died ({type(exc).__name__})"
                errors[r] = absent[r]
                gone.add(r)
            except ray.exceptions.RayTaskError as exc:
                ended[r] = True
                absent[r] = f"raised {type(exc.cause).__name__}"
                errors[r] = str(exc.cause)
        return results, errors, absent, gone

    def _cpu_waits(self) -> dict[int, float]:
        """pid -> run-queue wait so far (:func:`cluster.procs.cpu_wait_s`)
        of this group's ranks that run on this host (none for ranks of
        other hosts, whose load the driver cannot see)."""
        here = (socket.gethostname(), ray.util.get_node_ip_address())
        pids = [m["pid"] for m in self.metadata
                if (m.get("hostname"), m.get("node_ip")) == here]
        return {pid: w for pid in pids if (w := cpu_wait_s(pid)) is not None}

    @staticmethod
    def _starved_s(since: Mapping[int, float]) -> float:
        """The longest any of those ranks has waited for a CPU since ``since``
        (a rank gone since counts none)."""
        longest = 0.0
        for pid, before in since.items():
            now = cpu_wait_s(pid)
            if now is not None:
                longest = max(longest, now - before)
        return longest

    def _drain(self, streams, ended, remaining: int, gone: set[int] = frozenset()) -> set[int]:
        """Wait for every rank's batch to end (each stops after its first
        call that is not clean on that rank); the ranks still running after
        ``call_timeout_s`` per remaining call are returned (to be killed).
        Ranks in ``gone`` (past the call's host deadline: killed whatever
        they do next) are not waited for: a stuck rank costs one host
        deadline, not two."""
        deadline = time.monotonic() + self.call_timeout_s * max(1, remaining)
        late = set()
        for r, stream in enumerate(streams):
            while not ended[r] and r not in gone:
                ready, _ = ray.wait([stream], timeout=max(0.0, deadline - time.monotonic()))
                if not ready:
                    late.add(r)
                    break
                try:
                    ray.get(next(stream), timeout=CONTROL_TIMEOUT_S)
                except (StopIteration, ray.exceptions.RayError):
                    ended[r] = True  # a stream ends after its first exception
        return late

    def _conclude(self, case, results, errors, absent, gone, started, *, remaining, streams,
                  ended) -> GroupCall:
        reports = [RankReport.from_result(x) for x in results if x is not None]
        diagnosis = diagnose(reports, tp=self.tp, absent=absent,
                             expected=(self._seq, case.tokens))
        checks = tuple(None if x is None else x["check"] if x.get("check") is not None else
                       check_outputs(case, tp=self.tp, hidden=self.hidden, outputs=x["outputs"],
                                     rank=x["rank"])
                       for x in results)
        outcome = _outcome(diagnosis, results, checks, errors, hung=gone - set(errors))
        self.work_s += max((x.get("publish_ns", 0) + x.get("consume_ns", 0)
                            for x in results if x is not None), default=0) / 1e9
        phases_s = phases.slowest(x.get("host_ns") for x in results if x is not None)
        phases.add(self.phases_s, phases_s)
        recovery, rebuilt = None, False
        if outcome != "pass":
            gone = gone | self._drain(streams, ended, remaining, gone)
            if not self.node_alive():
                gone = set(range(self.tp))
        if gone:
            self._rebuild(gone)
            rebuilt = True
        elif outcome != "pass":
            try:
                recovery = self.recover()
            except (TimeoutError, ray.exceptions.RayError):
                self._rebuild(set(range(self.tp)))
                rebuilt = True
        return GroupCall(seq=self._seq, case=case, outcome=outcome, diagnosis=diagnosis,
                         results=tuple(results), checks=checks, errors=errors, recovery=recovery,
                         rebuilt=rebuilt, start_diagnosis=self.start_diagnosis if rebuilt else None,
                         wall_s=time.monotonic() - started, phases_s=phases_s,
                         publish_offsets_us=_offsets(results))

    def recover(self) -> tuple[MailboxCheck, ...]:
        """Group recovery: every rank scrubs its mailbox and resets its stage
        state; returns once all have (the barrier). Call only when no call of
        this group is in flight. TimeoutError names the ranks that did not answer."""
        self._require_open()
        refs = [a.recover.remote() for a in self._actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=CONTROL_TIMEOUT_S)
        if len(ready) < len(refs):
            raise TimeoutError(f"recover: ranks {[r for r, x in enumerate(refs) if x not in ready]} "
                               f"did not answer within {CONTROL_TIMEOUT_S} s")
        return tuple(MailboxCheck(**c) for c in ray.get(refs, timeout=CONTROL_TIMEOUT_S))

    def state(self) -> list[dict]:
        """Every rank's state() (mailbox check, calls since reset)."""
        self._require_open()
        return ray.get([a.state.remote() for a in self._actors], timeout=CONTROL_TIMEOUT_S)

    def close(self) -> None:
        """Graceful close of every rank, then ray.kill, then the placement
        group goes; pooled: every rank that closed cleanly goes back to the
        pool, the others are killed. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._lease is not None:
                self._actors = self._actors or self._lease.actors
                ranks = set(range(len(self._actors)))
                reusable = self._close_ranks(ranks - self._unusable)
                self._pool.release(self._lease, [reusable.get(r, False) and r not in self._suspect
                                                 for r in range(self.tp)])
                self._release({r for r in ranks if not reusable.get(r, False)})
            elif self._actors:
                self._stop_actors(set(range(len(self._actors))))
        finally:
            self._actors = []
            if self._pg is not None:
                remove_placement_group(self._pg)

    def _require_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"TP group {self.group_id} is closed")


class BatchedGroup:
    """A TPGroup whose :meth:`run` is served from batches: the calls planned
    up front go to the ranks as one ``run_batch`` (one streamed Ray call per
    rank), and each ``run(case)`` equal to the next planned call returns that
    call's GroupCall. A call off the plan (another case, faults) ends the
    batch and starts a new one at its place in the plan (or runs alone when
    it is not planned), so a caller written for one call at a time keeps
    its exact semantics; after a call that did not pass (the batch ends
    there) the next planned call starts a new batch. Other attributes are
    the group's."""

    def __init__(self, group: TPGroup, planned: Sequence[Case]) -> None:
        self._group = group
        self._planned = [group.case(**c.to_fields()) for c in planned]
        self._pos = 0
        self._stream = None
        self.batches = 0

    def __getattr__(self, name):
        return getattr(self._group, name)

    def __enter__(self) -> "BatchedGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _end(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            stream.close()

    def run(self, case: Case, faults: Mapping[int, Mapping] | None = None) -> GroupCall:
        case = self._group.case(**case.to_fields())
        if faults:
            self._end()
            return self._group.run(case, faults)
        if self._stream is None or self._pos >= len(self._planned) or \
                self._planned[self._pos] != case:
            self._end()
            at = next((i for i in range(self._pos, len(self._planned))
                       if self._planned[i] == case), None)
            if at is None:
                return self._group.run(case)
            self._pos = at
            self._stream = self._group.run_batch(self._planned[at:])
            self.batches += 1
        try:
            call = next(self._stream)
        except BaseException:
            self._stream = None
            raise
        self._pos += 1
        if call.outcome != "pass":
            self._end()
        return call

    def close(self) -> None:
        try:
            self._end()
        finally:
            self._group.close()


PER_CALL_FIELDS = ("tokens", "inputs", "seed", "seq", "fault", "residual")
"""Case fields that change data, not the kernel a rank builds."""


def prepare_key(case: Case) -> tuple:
    """What decides the kernels a rank builds for ``case``: the op, the
    watchdog budget, eps and the op's fields (top_k, hc, finalize, ...)."""
    return tuple(sorted((k, v) for k, v in case.to_fields().items()
                        if k not in PER_CALL_FIELDS))


def _outcome(diagnosis: GroupDiagnosis, results, checks, errors, hung) -> str:
    if errors:
        return "error"
    if hung or diagnosis.timed_out_ranks or diagnosis.bad_stage_ranks:
        return "hang"
    clean = all(x["mailbox_clean"] for x in results if x is not None)
    if not diagnosis.ok or not clean or not all(c["ok"] for c in checks if c is not None):
        return "fail"
    return "pass"


def _process_alive(pid: int) -> bool:
    """True while ``pid`` exists on this node and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _offsets(results) -> tuple[float | None, ...] | None:
    from cluster.stragglers import call_offsets
    offsets = call_offsets(results)
    return None if offsets is None else tuple(offsets)
