"""The cluster's topology and TP-group planning over it.

A :class:`Topology` is the nodes that :mod:`cluster.discovery` read
(:func:`discover_local`: this process's node; :func:`discover_cluster`:
every alive Ray node, a task on each holding its GPUs), or that
:func:`fake_node` makes up for tests and what-ifs.

Planning (pure, so CPU tests use fake topologies): an NVLink domain is a
set of GPUs every pair of which is NVLink-connected, inside one node, or
across nodes when every GPU reports the same fabric cluster. For every TP
size the kernels support (1, 2, 4, 8) the plan lays out as many groups as
fit (8 GPUs in one domain: 1 x TP8, 2 x TP4, 4 x TP2, 8 x TP1), each group
inside one domain (STRICT_PACK on one node; pinned per node across nodes),
and records every GPU or group it cannot place with the reason. The one-GPU
placements (shared GPU: tp actors with ``num_gpus=1/tp``; virtual ranks: tp
ranks in one process) are planned for every GPU.

:class:`Topology` is frozen and hashable; :meth:`Topology.summary` is the
JSON-serialisable value stored with every result row (``topology`` column).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence

from cluster.discovery import GpuInfo, NodeInfo, discover_node
from cluster.placement import Placement

TP_SIZES = (1, 2, 4, 8)
"""TP sizes the Lamport kernels compile for."""
PLANNED = (Placement.PROCESS_PER_GPU, Placement.SHARED_GPU, Placement.VIRTUAL_RANKS)
"""The placements the plan lays out (emulated ranks need no GPU plan)."""


# ---------------------------------------------------------------- plans
@dataclasses.dataclass(frozen=True)
class GroupPlan:
    """One TP group: rank r runs on ``gpus[r]`` = (node id, GPU index)."""
    tp: int
    placement: Placement
    gpus: tuple[tuple[str, int], ...]
    gpus_per_rank: float
    strategy: str
    """Placement-group strategy: STRICT_PACK (one node) or PACK with per-node
    bundles (one NVLink domain spanning nodes)."""
    domain: str

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n for n, _ in self.gpus))

    @property
    def cross_node(self) -> bool:
        return len(self.nodes) > 1

    def bundles(self) -> list[dict]:
        """Ray placement-group bundles: one a rank with its GPU share (a
        shared-GPU group is one bundle holding the whole GPU share)."""
        if self.placement == Placement.SHARED_GPU:
            return [{"GPU": round(self.tp * self.gpus_per_rank, 4)}]
        return [{"GPU": self.gpus_per_rank} for _ in range(self.tp)]


@dataclasses.dataclass(frozen=True)
class Skip:
    """Something the plan could not host, and why."""
    tp: int
    placement: Placement
    reason: str
    gpus: tuple[tuple[str, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class Layout:
    """Every group of one TP size and placement that the cluster hosts at once."""
    tp: int
    placement: Placement
    groups: tuple[GroupPlan, ...]
    skipped: tuple[Skip, ...]

    @property
    def name(self) -> str:
        kind = {Placement.PROCESS_PER_GPU: "", Placement.SHARED_GPU: " shared-GPU",
                Placement.VIRTUAL_RANKS: " virtual ranks"}[self.placement]
        return f"{len(self.groups)}xTP{self.tp}{kind}"


@dataclasses.dataclass(frozen=True)
class Topology:
    """The discovered cluster: nodes, their GPUs and links."""
    nodes: tuple[NodeInfo, ...]

    def __post_init__(self) -> None:
        ids = [n.node_id for n in self.nodes]
        if len(set(ids)) != len(ids):
            raise ValueError(f"node ids must be distinct, got {ids}")

    # -- facts
    @property
    def gpu_count(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)

    def node(self, node_id: str) -> NodeInfo:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise KeyError(f"no node {node_id!r}; nodes: {[n.node_id for n in self.nodes]}")

    def gpu(self, node_id: str, index: int) -> GpuInfo:
        return self.node(node_id).gpus[index]

    def domains(self) -> tuple[tuple[tuple[str, int], ...], ...]:
        """NVLink domains, largest first: maximal sets of GPUs every pair of
        which is NVLink-connected (inside a node), merged across nodes when
        every GPU of them reports the same fabric cluster."""
        per_node: list[tuple[tuple[str, int], ...]] = []
        for node in self.nodes:
            per_node += [tuple((node.node_id, i) for i in clique) for clique in _cliques(node)]
        fabric: dict[str, list[tuple[str, int]]] = {}
        rest = []
        for dom in per_node:
            clusters = {self.gpu(*g).fabric_cluster for g in dom}
            if len(clusters) == 1 and None not in clusters:
                fabric.setdefault(clusters.pop(), []).extend(dom)
            else:
                rest.append(dom)
        out = [tuple(v) for v in fabric.values()] + rest
        return tuple(sorted(out, key=lambda d: (-len(d), d)))

    # -- planning
    def plan(self, tp_sizes: Iterable[int] = TP_SIZES) -> tuple[Layout, ...]:
        """Process-per-GPU layouts for every TP size, then the one-GPU
        placements (shared GPU and virtual ranks, tp > 1)."""
        sizes = tuple(tp_sizes)
        bad = [t for t in sizes if t not in TP_SIZES]
        if bad:
            raise ValueError(f"tp sizes {bad} not supported by the kernels; supported {TP_SIZES}")
        layouts = [self._process_per_gpu(t) for t in sizes]
        for placement in (Placement.SHARED_GPU, Placement.VIRTUAL_RANKS):
            layouts += [self._one_gpu(t, placement) for t in sizes if t > 1]
        return tuple(layouts)

    def layout(self, tp: int, placement: Placement | str = Placement.PROCESS_PER_GPU) -> Layout:
        if placement not in {*PLANNED, *(p.name.lower() for p in PLANNED)}:
            raise ValueError(f"unknown placement {placement!r}; known {[str(p) for p in PLANNED]}")
        placement = Placement(placement)
        for lay in self.plan((tp,)):
            if lay.placement == placement:
                return lay
        raise ValueError(f"placement {str(placement)!r} is planned for tp > 1 only, got tp={tp}")

    def _process_per_gpu(self, tp: int) -> Layout:
        groups, skipped = [], []
        if self.gpu_count == 0:
            skipped.append(Skip(tp, Placement.PROCESS_PER_GPU, "the cluster has no GPU"))
        for n, dom in enumerate(self.domains()):
            name = f"nvlink{n}" if len(dom) > 1 else f"gpu:{dom[0][0]}:{dom[0][1]}"
            fits = len(dom) // tp
            if tp > 1 and len(dom) == 1 and fits == 0:
                continue  # lone GPUs: reported once below
            for k in range(fits):
                members = tuple(sorted(dom, key=_node_order(self))[k * tp:(k + 1) * tp])
                cross = len({node for node, _ in members}) > 1
                groups.append(GroupPlan(tp=tp, placement=Placement.PROCESS_PER_GPU, gpus=members,
                                        gpus_per_rank=1.0,
                                        strategy="PACK" if cross else "STRICT_PACK",
                                        domain=name))
            left = tuple(sorted(dom, key=_node_order(self))[fits * tp:])
            if left:
                skipped.append(Skip(tp, Placement.PROCESS_PER_GPU,
                                    f"NVLink domain {name} has {len(dom)} GPUs: {len(left)} left "
                                    f"over after {fits} x TP{tp}", left))
        if tp > 1:
            lone = [d[0] for d in self.domains() if len(d) == 1]
            if lone:
                skipped.append(Skip(tp, Placement.PROCESS_PER_GPU, self._lone_reason(tp, lone),
                                    tuple(lone)))
        if tp > 1 and not groups and self.gpu_count:
            largest = max((len(d) for d in self.domains()), default=0)
            skipped.append(Skip(tp, Placement.PROCESS_PER_GPU,
                                f"tp={tp} needs {tp} GPUs in one NVLink domain; the largest domain "
                                f"has {largest} (cluster: {self.gpu_count} GPUs on "
                                f"{len(self.nodes)} nodes; groups never span nodes without "
                                f"NVLink between them)"))
        return Layout(tp, Placement.PROCESS_PER_GPU, tuple(groups), tuple(skipped))

    def _lone_reason(self, tp: int, lone: Sequence[tuple[str, int]]) -> str:
        why = []
        for node_id, i in lone:
            node = self.node(node_id)
            links = {node.link(i, j) for j in range(len(node.gpus)) if j != i}
            why.append(f"{node_id}:{i} " + (f"peers over {'/'.join(sorted(links))} only"
                                             if links else "alone on its node"))
        return (f"tp={tp}: GPUs without an NVLink peer cannot join a group ("
                + "; ".join(why) + ")")

    def _one_gpu(self, tp: int, placement: Placement) -> Layout:
        groups, skipped = [], []
        for node in self.nodes:
            for g in node.gpus:
                groups.append(GroupPlan(
                    tp=tp, placement=placement, gpus=((node.node_id, g.index),) * tp,
                    gpus_per_rank=(1.0 / tp) if placement == Placement.SHARED_GPU else 1.0,
                    strategy="STRICT_PACK", domain=f"gpu:{node.node_id}:{g.index}"))
        if not groups:
            skipped.append(Skip(tp, placement, "the cluster has no GPU"))
        return Layout(tp, placement, tuple(groups), tuple(skipped))

    # -- serialisation
    def summary(self) -> dict:
        """JSON-serialisable: nodes (GPUs, links, versions, notes), NVLink
        domains, multicast support, and the layouts with what was skipped."""
        models = sorted({g.name for n in self.nodes for g in n.gpus})
        mc = [g.multicast_supported for n in self.nodes for g in n.gpus]
        return {
            "nodes": [dataclasses.asdict(n) | {"versions": dict(n.versions)} for n in self.nodes],
            "gpu_count": self.gpu_count, "gpu_models": models,
            "multicast_supported": (None if not mc or None in mc else all(mc)),
            "nvlink_domains": [[f"{node}:{i}" for node, i in d] for d in self.domains()],
            "layouts": [{"name": lay.name, "tp": lay.tp, "placement": lay.placement,
                         "groups": [[f"{node}:{i}" for node, i in g.gpus] for g in lay.groups],
                         "skipped": [s.reason for s in lay.skipped]} for lay in self.plan()],
        }

    def to_json(self) -> str:
        return json.dumps(self.summary(), sort_keys=True)

    @classmethod
    def from_summary(cls, summary: Mapping) -> "Topology":
        """The Topology a :meth:`summary` came from."""
        nodes = []
        for n in summary["nodes"]:
            gpus = tuple(GpuInfo(**{**g, "compute_capability": tuple(g["compute_capability"])})
                         for g in n["gpus"])
            nodes.append(NodeInfo(node_id=n["node_id"], hostname=n["hostname"], gpus=gpus,
                                  p2p=tuple(tuple(row) for row in n["p2p"]),
                                  p2p_source=n["p2p_source"],
                                  versions=tuple(sorted(n["versions"].items())),
                                  notes=tuple(n["notes"])))
        return cls(tuple(nodes))


def brief(summary: Mapping | str | None) -> str:
    """One line for people from a :meth:`Topology.summary` (or its JSON, as
    the results' ``topology`` column holds it), e.g. "1 node, 2x H200,
    NVLink between all 2, multicast capable"; a JSON object of another shape
    (the jobs' fallback when discovery failed) as its ``key=value`` pairs;
    "—" for nothing."""
    if summary is None or summary == "":
        return "—"
    if isinstance(summary, str):
        try:
            summary = json.loads(summary)
        except json.JSONDecodeError:
            return summary
    if not isinstance(summary, Mapping):
        return str(summary)
    nodes = summary.get("nodes")
    if not isinstance(nodes, list):
        return ", ".join(f"{k}={v}" for k, v in summary.items() if v is not None and k != "note")
    parts = [f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}"]
    models: dict[str, int] = {}
    for node in nodes:
        for gpu in node.get("gpus", ()):
            name = str(gpu.get("name", "GPU")).removeprefix("NVIDIA ")
            models[name] = models.get(name, 0) + 1
    if not models:
        return parts[0] + ", no GPU"
    parts += [f"{n}x {name}" for name, n in sorted(models.items())]
    links = {link for node in nodes for row in node.get("p2p", ()) for link in row} - {"self"}
    total = sum(models.values())
    domains = summary.get("nvlink_domains") or []
    largest = max((len(d) for d in domains), default=0)
    if "nvlink" in links:
        parts.append(f"NVLink between all {total}" if largest == total and len(domains) == 1
                     else f"NVLink domains of {', '.join(str(len(d)) for d in domains)} GPUs")
    elif total > 1:
        parts.append("PCIe only" if "pcie" in links else "no peer links")
    mc = summary.get("multicast_supported")
    parts.append({True: "multicast capable", False: "no multicast"}.get(mc, "multicast unknown"))
    return ", ".join(parts)


def _node_order(topo: Topology):
    order = {n.node_id: k for k, n in enumerate(topo.nodes)}
    return lambda g: (order[g[0]], g[1])


def _cliques(node: NodeInfo) -> list[tuple[int, ...]]:
    """Partition a node's GPUs into NVLink cliques (greedy in index order:
    a GPU joins the first clique it has NVLink to every member of)."""
    cliques: list[list[int]] = []
    for i in range(len(node.gpus)):
        for c in cliques:
            if all(node.link(i, j) == "nvlink" and node.link(j, i) == "nvlink" for j in c):
                c.append(i)
                break
        else:
            cliques.append([i])
    return [tuple(c) for c in cliques]


def fake_node(node_id: str, gpus: int, *, links: str | Sequence[Sequence[str]] = "nvlink",
              name: str = "NVIDIA H200", fabric_cluster: str | None = None,
              multicast: bool | None = False) -> NodeInfo:
    """A made-up node (tests, planning what-ifs): ``gpus`` identical GPUs,
    every pair linked by ``links`` (a link name or an explicit matrix)."""
    infos = tuple(GpuInfo(index=i, name=name, uuid=f"GPU-fake-{node_id}-{i}",
                          memory_bytes=141 << 30, sm_count=132, compute_capability=(9, 0),
                          multicast_supported=multicast, fabric_cluster=fabric_cluster)
                  for i in range(gpus))
    if isinstance(links, str):
        matrix = tuple(tuple("self" if i == j else links for j in range(gpus)) for i in range(gpus))
    else:
        matrix = tuple(tuple(row) for row in links)
    return NodeInfo(node_id=node_id, hostname=node_id, gpus=infos, p2p=matrix,
                    p2p_source="fake", versions=(("fake", "1"),))


# ---------------------------------------------------------------- a topology discovered
def discover_local() -> Topology:
    """A one-node Topology of this process's node (no Ray needed)."""
    return Topology((discover_node(),))


_PENDING: dict[tuple, dict] = {}
"""Discovery tasks that had not answered when a call gave up, by (job, alive
nodes): the next call in this process waits on those rather than submitting
more. On a loaded node a task's worker can take longer than the timeout to
start, and every new submission only starts another worker beside it."""


def discover_cluster(timeout_s: float = 60.0) -> Topology:
    """One :func:`discover_node` per alive Ray node, run there as a task that
    holds no GPU and sees all of them (Ray leaves its CUDA_VISIBLE_DEVICES
    alone: cluster.gpu.ALL_GPUS_VISIBLE, set on nodes that have GPUs only:
    that runtime environment costs a worker of its own, while a plain task
    runs in an idle worker the node already has). Discovery only reads, so GPUs held
    by a standing pool or another job do not delay it (a task that asked for
    every GPU waited out the timeout behind a pool's placement group).
    TimeoutError names the nodes that did not answer; their tasks are kept,
    and the next call here (same job, same nodes) waits on them."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from cluster.gpu import ALL_GPUS_VISIBLE

    alive = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
    nodes = tuple(sorted(alive))
    key = (ray.get_runtime_context().get_job_id(), nodes)
    refs = _PENDING.pop(key, None)
    again = refs is not None
    if refs is None:
        task = ray.remote(num_cpus=0, num_gpus=0, max_retries=0)(discover_node)
        see_all = {"runtime_env": {"env_vars": {ALL_GPUS_VISIBLE: "1"}}}
        refs = {nid: task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False),
            **(see_all if (alive[nid].get("Resources") or {}).get("GPU") else {})).remote(nid)
            for nid in nodes}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    late = [nid for nid, ref in refs.items() if ref not in ready]
    if late:
        _PENDING.clear()  # one job, one node set: anything older is moot
        _PENDING[key] = refs
        raise TimeoutError(f"topology discovery: nodes {late} did not answer within {timeout_s} s"
                           f"{' (again: the tasks of an earlier call)' if again else ''}; "
                           f"their tasks are kept for the next discovery "
                           f"(available {ray.available_resources()})")
    return Topology(tuple(ray.get(list(refs.values()), timeout=timeout_s)))
