"""The GPU backend: rank actors on GPUs running the CuTe DSL Lamport kernels.

- :mod:`.rank`: :class:`GpuRank`, the RankBackend (process per GPU over NCCL
  + symmetric memory, or shared GPU over gloo + CUDA IPC);
- :mod:`.ipc`: CUDA IPC handle export / exchange / peer table;
- :mod:`.report`: the kernels' error buffer → the result contract's
  diagnosis fields (kernels.lamport.diagnosis makes the group view).

This package itself holds only the backend's declarations (cluster.backend:
rendezvous, faults it cannot inject, the rank actors' environment): the
driver imports it without the ranks' torch and kernels.
"""

from cluster.placement import Placement

ALL_GPUS_VISIBLE = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
"""Set (to "1") in a process-per-GPU rank actor's environment (cluster.group):
Ray then leaves every GPU of the node visible instead of narrowing
CUDA_VISIBLE_DEVICES to the actor's, because torch symmetric memory's
rendezvous tells peers apart by device index and opens their allocations
by it (with each rank seeing only "its" cuda:0 it refuses: "allocations
from overlapping devices from different ranks")."""

WORKER_CONNECTIONS = 16
"""CUDA_DEVICE_MAX_CONNECTIONS of a pooled GPU worker (cluster.pool), set
before its CUDA context exists: the hardware queues its streams map onto.
A worker may host tp virtual ranks, one stream each plus the caller's
(9 at tp 8), whose spinning consumers must not queue behind one another,
so it needs more than the default 8. It is not 32, the most CUDA allows:
the queues of one GPU are shared by every context on it, and on an H200
sixteen contexts of 32 (the workers of two tp-8 groups a GPU) left three
failing in their first CUDA call with "out of memory" while sixteen of 8
all came up (``scripts/gpu/context_probe.py``, results in
docs/results/nightly_h200_2026-12-01.md)."""

UNSUPPORTED_INJECTIONS = {
    "unsanitized_lane": "the GPU publish always sanitizes; the consumer's unsanitized-lane "
                        "report is covered at kernel level by tests/gpu/test_all_reduce_norm_gpu.py",
}
"""Fault injections the gpu backend refuses, each with why (cluster.injection)."""

NEEDS_RENDEZVOUS = True
"""TPGroup passes ``master_addr`` / ``master_port`` (from rank 0's node) and
the placement in the setup options."""


UNSUPPORTED_FAULTS = {
    "unsanitized_lane": UNSUPPORTED_INJECTIONS["unsanitized_lane"],
    "dirty_mailbox": "a killed rank's mailbox is device memory freed with its process, so a "
                     "rebuilt group starts on fresh mailboxes and there is no dirty one to "
                     "detect; killing a rank and rebuilding the group is the stuck_rank case",
}
"""Fault kinds (cluster.faults) whose expected outcome cannot happen on GPUs,
each with why: the fault campaign records them as skipped with the reason."""


SUSPECT_AFTER_A_KILL = (Placement.SHARED_GPU,)
"""Placements whose surviving ranks must not serve another group once a
peer was killed: a shared-GPU rank exports its mailbox to each peer through
torch's CUDA IPC, which frees the block once every importer has released
it, and a killed importer never does, so the block stays with the survivor's
process until it exits (seen on the H200: a tp=8 group's 384 KiB per
survivor and kill). A pooled survivor finishes its group and is then
retired (cluster.pool)."""


def actor_env(*, placement: Placement, tp: int) -> dict[str, str]:
    """Process per GPU with peers: keep every GPU visible (see
    :data:`ALL_GPUS_VISIBLE`)."""
    return {ALL_GPUS_VISIBLE: "1"} if placement == Placement.PROCESS_PER_GPU and tp > 1 else {}


def release_rank(group_id: str, rank: int) -> None:
    """Nothing to free: a dead process's device memory, CUDA IPC exports and
    sockets go with it (the driver and the kernel reclaim them)."""


def __getattr__(name: str):
    """``Backend`` (= ``GpuRank``) on first use: the driver imports this
    package for its declarations (rendezvous, faults, environment) and must
    not pay for the rank's imports (torch, the kernels)."""
    if name in ("Backend", "GpuRank"):
        from cluster.gpu.rank import GpuRank
        return GpuRank
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Backend", "GpuRank", "actor_env", "NEEDS_RENDEZVOUS", "SUSPECT_AFTER_A_KILL",
           "UNSUPPORTED_FAULTS", "release_rank"]
