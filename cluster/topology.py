"""Topology discovery and TP-group planning.

Discovery (per node, read only):
- each GPU: model, UUID, PCI bus id, memory, SM count, compute capability,
  SM / memory clocks, the multicast-support attribute
  (``CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED``; read, never acted on: the
  transport decision is :func:`kernels.lamport.mailbox.multicast_decision`,
  and no multicast object is ever created here) and the NVLink fabric
  cluster (multi-node NVLink) where the driver reports one;
- the peer-to-peer matrix: ``nvlink``, ``pcie`` (peer access without
  NVLink) or ``none``, from NVML (nvidia-ml-py) when importable, else from
  the CUDA driver (cuda-bindings: ``cuDeviceCanAccessPeer`` and
  ``cuDeviceGetP2PAttribute``; the driver does not name the link, so a pair
  with native peer atomics counts as NVLink: PCIe peer access has none on
  the GPUs this targets; ``p2p_source`` says which was used);
- versions: driver, CUDA, NCCL, torch, CuTe DSL, Ray, Python.
A machine without a GPU (or without the driver library) yields a node with
zero GPUs and the reason in ``notes``, never an error.

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
import importlib.metadata
import json
import platform
import socket
from collections.abc import Iterable, Mapping, Sequence

from cluster.placement import Placement

TP_SIZES = (1, 2, 4, 8)
"""TP sizes the Lamport kernels compile for."""
LINKS = ("self", "nvlink", "pcie", "none")
PLANNED = (Placement.PROCESS_PER_GPU, Placement.SHARED_GPU, Placement.VIRTUAL_RANKS)
"""The placements the plan lays out (emulated ranks need no GPU plan)."""


# ---------------------------------------------------------------- values
@dataclasses.dataclass(frozen=True)
class GpuInfo:
    index: int
    """Device ordinal on its node (as the discovering process saw it)."""
    name: str
    uuid: str
    memory_bytes: int
    sm_count: int
    compute_capability: tuple[int, int]
    pci_bus_id: str = ""
    sm_clock_mhz: int | None = None
    """Maximum SM clock (NVML) or the driver's clock-rate attribute."""
    memory_clock_mhz: int | None = None
    multicast_supported: bool | None = None
    """The device attribute as read (None: not readable). Never enough to
    run multicast (docs/design.md, Multicast safety)."""
    fabric_cluster: str | None = None
    """NVLink fabric cluster UUID when the GPU is part of a multi-node NVLink
    domain (NVML fabric info / the driver), else None."""

    @property
    def arch(self) -> str:
        major, minor = self.compute_capability
        return f"sm_{major}{minor}{'a' if major >= 9 else ''}"


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    node_id: str
    hostname: str
    gpus: tuple[GpuInfo, ...] = ()
    p2p: tuple[tuple[str, ...], ...] = ()
    """p2p[i][j]: link from GPU i to GPU j, one of LINKS."""
    p2p_source: str = "none"
    """``nvml``, ``cuda_driver`` or ``none``."""
    versions: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()
    """What could not be read, and why."""

    def __post_init__(self) -> None:
        n = len(self.gpus)
        if len(self.p2p) != n or any(len(row) != n for row in self.p2p):
            raise ValueError(f"node {self.node_id}: p2p must be {n} x {n} for {n} GPUs, got "
                             f"{[len(row) for row in self.p2p]}")
        bad = {link for row in self.p2p for link in row} - set(LINKS)
        if bad:
            raise ValueError(f"node {self.node_id}: unknown p2p links {sorted(bad)}; known {LINKS}")
        if [g.index for g in self.gpus] != list(range(n)):
            raise ValueError(f"node {self.node_id}: GPU indices must be 0..{n - 1}, "
                             f"got {[g.index for g in self.gpus]}")

    def link(self, i: int, j: int) -> str:
        return self.p2p[i][j]


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


# ---------------------------------------------------------------- discovery
def versions() -> dict[str, str]:
    """Software versions of this process's environment ("" when absent)."""
    out = {"python": platform.python_version()}
    for key, dist in (("torch", "torch"), ("cute_dsl", "nvidia-cutlass-dsl"), ("ray", "ray"),
                      ("cuda_bindings", "cuda-bindings"), ("nvidia_ml_py", "nvidia-ml-py")):
        try:
            out[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[key] = ""
    try:
        import torch

        out["torch_cuda"] = torch.version.cuda or ""
        out["nccl"] = (".".join(str(v) for v in torch.cuda.nccl.version())
                       if torch.cuda.is_available() else "")
    except Exception as exc:  # noqa: BLE001 (a version probe must not fail discovery)
        out["torch_cuda"] = out.get("torch_cuda", "")
        out["nccl"] = f"unreadable: {type(exc).__name__}"
    return out


def discover_node(node_id: str | None = None) -> NodeInfo:
    """This node's GPUs as this process sees them, their links and the
    versions. Zero GPUs (with the reason in ``notes``) where there is no
    GPU or no driver. Read only."""
    node_id = node_id or _ray_node_id() or socket.gethostname()
    notes: list[str] = []
    vers = versions()
    gpus, p2p, source = _discover_cuda(notes, vers)
    if gpus:
        nvml = _discover_nvml(gpus, notes, vers)
        if nvml is not None:
            gpus, p2p, source = nvml
    if source == "cuda_driver" and len(gpus) > 1:
        notes.append("p2p from the CUDA driver: NVLink inferred from native peer atomics")
    return NodeInfo(node_id=node_id, hostname=socket.gethostname(), gpus=tuple(gpus),
                    p2p=tuple(tuple(r) for r in p2p), p2p_source=source,
                    versions=tuple(sorted(vers.items())), notes=tuple(notes))


def discover_local() -> Topology:
    """A one-node Topology of this process's node (no Ray needed)."""
    return Topology((discover_node(),))


def discover_cluster(timeout_s: float = 60.0) -> Topology:
    """One :func:`discover_node` per alive Ray node, run there as a task that
    holds all the node's GPUs (so it sees all of them); call before the TP
    groups take the GPUs. TimeoutError names the nodes that did not answer."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(discover_node)
    refs = {}
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        gpus = n.get("Resources", {}).get("GPU", 0)
        refs[n["NodeID"]] = task.options(
            num_gpus=gpus, scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote(n["NodeID"])
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    late = [nid for nid, ref in refs.items() if ref not in ready]
    if late:
        raise TimeoutError(f"topology discovery: nodes {late} did not answer within {timeout_s} s "
                           f"(each task asks for all the node's GPUs; available "
                           f"{ray.available_resources()})")
    return Topology(tuple(ray.get(list(refs.values()), timeout=timeout_s)))


def _ray_node_id() -> str | None:
    try:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001
        pass
    return None


def _discover_cuda(notes: list[str], vers: dict[str, str]):
    """GPUs and the p2p matrix through the CUDA driver (cuda-bindings)."""
    try:
        from cuda.bindings import driver as cu
    except ImportError as exc:
        notes.append(f"cuda-bindings not importable: {exc}")
        return [], [], "none"
    try:
        _cu(cu.cuInit(0), "cuInit")
        count = _cu(cu.cuDeviceGetCount(), "cuDeviceGetCount")
        vers["driver_cuda"] = _cuda_version(_cu(cu.cuDriverGetVersion(), "cuDriverGetVersion"))
    except Exception as exc:  # noqa: BLE001 (no driver library, no device: zero GPUs)
        notes.append(f"CUDA driver unavailable: {type(exc).__name__}: {exc}"[:300])
        return [], [], "none"
    attr = cu.CUdevice_attribute
    gpus = []
    for i in range(count):
        dev = _cu(cu.cuDeviceGet(i), "cuDeviceGet")

        def get(name, default=None, dev=dev):
            try:
                return int(_cu(cu.cuDeviceGetAttribute(getattr(attr, name), dev), name))
            except Exception as exc:  # noqa: BLE001
                notes.append(f"GPU {i}: {name} unreadable: {exc}"[:200])
                return default

        def call(fn, what, default, dev=dev):
            try:
                return fn(dev)
            except Exception as exc:  # noqa: BLE001
                notes.append(f"GPU {i}: {what} unreadable: {exc}"[:200])
                return default

        name = call(lambda d: _cstr(_cu(cu.cuDeviceGetName(256, d), "cuDeviceGetName")),
                    "name", "")
        uuid = call(lambda d: _format_uuid(_uuid_bytes(_cu(cu.cuDeviceGetUuid(d),
                                                            "cuDeviceGetUuid"))), "uuid", "")
        pci = call(lambda d: _cstr(_cu(cu.cuDeviceGetPCIBusId(64, d), "cuDeviceGetPCIBusId")),
                   "PCI bus id", "")
        memory = call(lambda d: int(_cu(cu.cuDeviceTotalMem(d), "cuDeviceTotalMem")),
                      "total memory", 0)
        mc = get("CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED")
        clock = get("CU_DEVICE_ATTRIBUTE_CLOCK_RATE")
        mclock = get("CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE")
        gpus.append(GpuInfo(
            index=i, name=name, uuid=uuid, pci_bus_id=pci, memory_bytes=memory,
            sm_count=get("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT", 0),
            compute_capability=(get("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR", 0),
                                get("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR", 0)),
            sm_clock_mhz=None if clock is None else clock // 1000,
            memory_clock_mhz=None if mclock is None else mclock // 1000,
            multicast_supported=None if mc is None else bool(mc)))
    p2p = [["self" if i == j else "none" for j in range(count)] for i in range(count)]
    p2p_attr = cu.CUdevice_P2PAttribute
    for i in range(count):
        for j in range(count):
            if i == j:
                continue
            try:
                di, dj = cu.cuDeviceGet(i)[1], cu.cuDeviceGet(j)[1]
                if not _cu(cu.cuDeviceCanAccessPeer(di, dj), "cuDeviceCanAccessPeer"):
                    continue
                atomics = _cu(cu.cuDeviceGetP2PAttribute(
                    p2p_attr.CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED, di, dj),
                    "cuDeviceGetP2PAttribute")
                p2p[i][j] = "nvlink" if atomics else "pcie"
            except Exception as exc:  # noqa: BLE001
                notes.append(f"p2p {i}->{j} unreadable: {exc}"[:200])
    return gpus, p2p, "cuda_driver" if count else "none"


def _discover_nvml(gpus: list[GpuInfo], notes: list[str], vers: dict[str, str]):
    """Refine GPUs (clocks, fabric cluster) and the p2p matrix through NVML,
    matching devices by UUID; None when NVML is not importable or fails."""
    try:
        import pynvml
    except ImportError:
        notes.append("nvidia-ml-py not importable: p2p links from the CUDA driver")
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001
        notes.append(f"NVML init failed: {exc}"[:200])
        return None
    try:
        vers["driver"] = _s(pynvml.nvmlSystemGetDriverVersion())
        handles = []
        for g in gpus:
            h = pynvml.nvmlDeviceGetHandleByUUID(g.uuid)
            handles.append(h)
        out = []
        for g, h in zip(gpus, handles):
            fields = {}
            try:
                fields["sm_clock_mhz"] = int(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM))
                fields["memory_clock_mhz"] = int(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM))
            except Exception as exc:  # noqa: BLE001
                notes.append(f"GPU {g.index}: NVML clocks unreadable: {exc}"[:200])
            try:
                info = pynvml.nvmlDeviceGetGpuFabricInfo(h)
                uuid = bytes(info.clusterUuid)
                if info.state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED and any(uuid):
                    fields["fabric_cluster"] = uuid.hex()
            except Exception:  # noqa: BLE001 (no fabric API / not an NVLink-fabric GPU)
                pass
            out.append(dataclasses.replace(g, **fields))
        n = len(gpus)
        p2p = [["self" if i == j else "none" for j in range(n)] for i in range(n)]
        for i in range(n):
            for j in range(n):
                if i == j:
                    continue
                nv = pynvml.nvmlDeviceGetP2PStatus(handles[i], handles[j],
                                                   pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
                if nv == pynvml.NVML_P2P_STATUS_OK:
                    p2p[i][j] = "nvlink"
                    continue
                rd = pynvml.nvmlDeviceGetP2PStatus(handles[i], handles[j],
                                                   pynvml.NVML_P2P_CAPS_INDEX_READ)
                p2p[i][j] = "pcie" if rd == pynvml.NVML_P2P_STATUS_OK else "none"
        return out, p2p, "nvml"
    except Exception as exc:  # noqa: BLE001
        notes.append(f"NVML query failed, p2p from the CUDA driver: {exc}"[:200])
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def _cu(result, what: str):
    """Unpack a cuda-bindings (err, value...) tuple; RuntimeError on an error."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: {err!r}")
    return rest[0] if len(rest) == 1 else tuple(rest) if rest else None


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def _format_uuid(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _cstr(v) -> str:
    return v.split(b"\0", 1)[0].decode() if isinstance(v, bytes) else str(v)


def _uuid_bytes(u) -> bytes:
    raw = u.bytes if hasattr(u, "bytes") else u
    return raw.encode("latin-1") if isinstance(raw, str) else bytes(raw)


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


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

