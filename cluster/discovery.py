"""Hardware discovery: one node's GPUs, links and versions
(:func:`discover_node`, :class:`NodeInfo`), what :mod:`cluster.topology`
assembles into a topology and plans over.

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
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import importlib.util
import platform
import socket
import sys
from pathlib import Path

LINKS = ("self", "nvlink", "pcie", "none")


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


def versions(*, gpus: bool = True) -> dict[str, str]:
    """Software versions of this process's environment ("" when absent).
    NCCL's is read through torch only where the node has GPUs (``gpus``):
    elsewhere it is "" without torch's import, seconds of CPU in every
    discovery task, and ``torch_cuda`` is read from torch's version file."""
    out = {"python": platform.python_version()}
    for key, dist in (("torch", "torch"), ("cute_dsl", "nvidia-cutlass-dsl"), ("ray", "ray"),
                      ("cuda_bindings", "cuda-bindings"), ("nvidia_ml_py", "nvidia-ml-py")):
        try:
            out[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[key] = ""
    out["torch_cuda"] = torch_cuda_version()
    out["nccl"] = nccl_version() if gpus else ""
    return out


def nccl_version() -> str:
    """NCCL's version as torch reports it ("" without CUDA); imports torch."""
    try:
        import torch

        return (".".join(str(v) for v in torch.cuda.nccl.version())
                if torch.cuda.is_available() else "")
    except Exception as exc:  # noqa: BLE001 (a version probe must not fail discovery)
        return f"unreadable: {type(exc).__name__}"


def torch_cuda_version() -> str:
    """``torch.version.cuda`` ("" for a CPU build or without torch), read
    from torch's ``version.py`` (plain assignments) unless torch is imported
    already, so that reading it costs no import."""
    if "torch" in sys.modules:
        return sys.modules["torch"].version.cuda or ""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return ""
    try:
        tree = ast.parse((Path(list(spec.submodule_search_locations)[0]) / "version.py")
                         .read_text())
    except (OSError, SyntaxError, ValueError):
        return ""
    for node in tree.body:
        if isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == "cuda" and isinstance(value, ast.Constant):
            return str(value.value or "")
    return ""


def discover_node(node_id: str | None = None) -> NodeInfo:
    """This node's GPUs as this process sees them, their links and the
    versions. Zero GPUs (with the reason in ``notes``) where there is no
    GPU or no driver. Read only."""
    node_id = node_id or _ray_node_id() or socket.gethostname()
    notes: list[str] = []
    vers = versions(gpus=False)
    gpus, p2p, source = _discover_cuda(notes, vers)
    if gpus:
        vers["nccl"] = nccl_version()
    if gpus:
        nvml = _discover_nvml(gpus, notes, vers)
        if nvml is not None:
            gpus, p2p, source = nvml
    if source == "cuda_driver" and len(gpus) > 1:
        notes.append("p2p from the CUDA driver: NVLink inferred from native peer atomics")
    return NodeInfo(node_id=node_id, hostname=socket.gethostname(), gpus=tuple(gpus),
                    p2p=tuple(tuple(r) for r in p2p), p2p_source=source,
                    versions=tuple(sorted(vers.items())), notes=tuple(notes))


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
