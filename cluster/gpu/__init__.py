"""The GPU backend: rank actors on GPUs running the CuTe DSL Lamport kernels.

- :mod:`.rank`: :class:`GpuRank`, the RankBackend (process per GPU over NCCL
  + symmetric memory, or shared GPU over gloo + CUDA IPC);
- :mod:`.ipc`: CUDA IPC handle export / exchange / peer table;
- :mod:`.report`: the kernels' error buffer → the result contract's
  diagnosis fields (cluster.diagnosis makes the group view).
"""

from cluster.gpu.rank import GpuRank

Backend = GpuRank
NEEDS_RENDEZVOUS = True
"""TPGroup passes ``master_addr`` / ``master_port`` (from rank 0's node) and
the placement in the setup options."""


def release_rank(group_id: str, rank: int) -> None:
    """Nothing to free: a dead process's device memory, CUDA IPC exports and
    sockets go with it (the driver and the kernel reclaim them)."""


__all__ = ["Backend", "GpuRank", "NEEDS_RENDEZVOUS", "release_rank"]
