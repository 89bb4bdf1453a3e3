"""What the jobs know about the cluster they run on (:class:`ClusterView`):
the backend, the discovered topology, and so which placements
(:class:`~cluster.placement.Placement`) it offers each case.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from cluster.placement import Placement
from jobs.config import AUTO, Case
from jobs.options import check_groups_per_gpu
from jobs.session import cluster_gpus


@dataclasses.dataclass(frozen=True)
class PlacementOffer:
    """A placement the cluster offers a case, with the GPU share it holds."""
    name: Placement
    gpus_per_rank: float
    """Of one GPU, per rank actor; virtual ranks: the one task's share."""
    collective_speed: bool
    """False where timings cannot be a collective's speed (docs/design.md, Placements and transports:
    virtual ranks and shared-GPU placements land every peer store in one
    GPU's L2; emulated ranks are numpy)."""

    def units(self, tp: int) -> float:
        """What a group of ``tp`` ranks here holds on its node while it runs
        (cluster.fanout): its GPUs (emulated: tp units of ``EMULATED_GPU``)."""
        if self.name == Placement.EMULATED:
            return float(tp)
        return self.gpus_per_rank * (1 if self.name == Placement.VIRTUAL_RANKS else tp)


class ClusterView:
    """What the jobs need to know about the cluster: the backend, the
    topology (``cluster.topology.discover_cluster()`` when that module
    exists; else Ray's GPU counts) and so where a case's ranks can go.

    ``groups_per_gpu``: how many one-GPU groups (shared GPU, virtual ranks)
    may share one GPU at once; each then holds ``1 / groups_per_gpu`` of it
    (Ray's fractional GPUs; their kernels time-slice, so correctness only:
    no such placement's timing is a collective's speed anyway). Process per
    GPU always holds whole GPUs."""

    def __init__(self, backend: str, *, groups_per_gpu: int = 1, pool=None) -> None:
        check_groups_per_gpu(groups_per_gpu)
        self.backend = backend
        self.groups_per_gpu = groups_per_gpu
        self.pool = pool
        """The cluster.pool.WorkerPool the jobs take their ranks from (None:
        every group starts actors of its own); it also keeps the topology
        (:meth:`cluster.pool.WorkerPool.topology`: a standing pool's was
        discovered when it started)."""
        self.topology = None
        self.topology_error = None
        _, self.gpus_per_node = cluster_gpus()
        try:
            from cluster.topology import discover_cluster
        except ImportError as err:
            self.topology_error = f"cluster.topology unavailable: {err}"
        else:
            try:
                self.topology = discover_cluster() if pool is None else pool.topology()
            except Exception as err:  # a topology we cannot read is not a reason to stop
                self.topology_error = f"topology discovery failed: {type(err).__name__}: {err}"

    def columns(self) -> dict[str, Any]:
        """nodes, gpu_count, topology, multicast_supported for every row."""
        import ray
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        cols: dict[str, Any] = {"nodes": len(nodes), "gpu_count": self.gpus_per_node}
        if self.topology is not None:
            summary = self.topology.summary()
            cols["topology"] = self.topology.to_json()
            cols["multicast_supported"] = (False if self.backend == "emulated"
                                           else summary.get("multicast_supported"))
            if summary.get("gpu_models"):
                cols["gpu_model"] = ",".join(summary["gpu_models"])
        else:
            cpus = int(sum(n.get("Resources", {}).get("CPU", 0) for n in nodes))
            cols["topology"] = json.dumps({"backend": self.backend, "nodes": len(nodes),
                                           "cpus": cpus, "gpus_per_node": self.gpus_per_node,
                                           "note": self.topology_error})
            cols["multicast_supported"] = False if self.backend == "emulated" else None
        return cols

    def describe(self) -> str:
        if self.topology is None:
            return f"{self.gpus_per_node} GPU(s) on the largest node ({self.topology_error})"
        layouts = [lay.name for lay in self.topology.plan() if lay.groups]
        return (f"{self.topology.gpu_count} GPU(s); layouts offered: "
                f"{', '.join(layouts) or 'none'}")

    def offered(self, case: Case) -> list[PlacementOffer] | str:
        """Every placement this cluster offers ``case`` (its own, or for
        ``auto`` each one that fits, best first), or why there is none."""
        if self.backend == "emulated":
            if case.placement not in (AUTO, Placement.EMULATED):
                return f"placement {case.placement} needs the gpu backend; this run is emulated"
            return [PlacementOffer(Placement.EMULATED, 0.0, False)]
        if case.placement == Placement.EMULATED:
            return "placement emulated is not run on the gpu backend"
        if case.placement == Placement.VIRTUAL_RANKS:
            if case.job != "correctness":
                return (f"placement virtual-ranks runs the correctness job only (one process, "
                        f"kernels VirtualRanks); {case.job} needs rank actors")
            if not self.gpus_per_node:
                return "no GPU to place the virtual ranks on"
            return [PlacementOffer(Placement.VIRTUAL_RANKS, 1.0 / self.groups_per_gpu, False)]
        wanted = ([Placement.PROCESS_PER_GPU, Placement.SHARED_GPU] if case.placement == AUTO
                  else [Placement(case.placement)])
        found, reasons = [], []
        for name in wanted:
            if name == Placement.SHARED_GPU and case.tp == 1:
                continue
            why = self._fits(name, case.tp)
            if why is None:
                own = name == Placement.PROCESS_PER_GPU
                found.append(PlacementOffer(
                    name, 1.0 if own else 1.0 / (case.tp * self.groups_per_gpu), own))
            else:
                reasons.append(why)
        return found or "; ".join(reasons) or f"no placement for tp={case.tp}"

    def _fits(self, name: Placement, tp: int) -> str | None:
        if self.topology is not None:
            try:
                layout = self.topology.layout(tp, name)
            except ValueError as err:
                return str(err)
            return None if layout.groups else "; ".join(s.reason for s in layout.skipped)
        if name == Placement.PROCESS_PER_GPU and tp > self.gpus_per_node:
            return (f"tp={tp} process-per-gpu needs {tp} GPUs on one node; the largest node "
                    f"has {self.gpus_per_node}")
        if not self.gpus_per_node:
            return "no GPU to place ranks on"
        return None

    def resolve(self, case: Case) -> PlacementOffer | str:
        """The placement ``case`` runs with (the best for ``auto``)."""
        found = self.offered(case)
        return found if isinstance(found, str) else found[0]

    def concretize(self, cases: list[Case], *, every: bool,
                   wanted: tuple[str, ...] | None = None) -> list[Case]:
        """``auto`` cases as concrete placements: each offered one
        (``every``: the nightly's "every topology"; for the profile job
        every one with a collective's speed, else the best) or the best, among
        ``wanted`` when given (``--placement``); a case nothing can host
        stays ``auto`` (its job records why). Cases whose placement is not
        wanted are dropped."""
        out = []
        for case in cases:
            if case.placement != AUTO:
                if wanted is None or case.placement in wanted:
                    out.append(case)
                continue
            found = self.offered(case)
            if isinstance(found, str):
                out.append(case)
                continue
            found = [p for p in found if wanted is None or p.name in wanted]
            chosen = found if every else found[:1]
            if every and case.job == "profile":
                # Only a placement with a collective's speed gives a timing; another one
                # is kept only when nothing better fits (its row then says why it is skipped).
                chosen = [p for p in chosen if p.collective_speed] or chosen[:1]
            for p in chosen:
                out.append(dataclasses.replace(case, placement=p.name))
        return out
