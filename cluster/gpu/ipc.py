"""CUDA IPC mailboxes for the shared-GPU placement.

Several rank processes on one GPU (fractional ``num_gpus``) cannot use torch
symmetric memory (it bootstraps over NCCL, which refuses two ranks on one
device). Instead each rank allocates its own mailbox and exports a CUDA IPC
handle for it (torch's CUDA IPC reductions, the path torch.multiprocessing
uses: ``reduce_tensor`` / ``rebuild_cuda_tensor``, reference-counted so the
exporter's allocator keeps the block while importers hold it); the group
exchanges the handles over its gloo process group; each rank opens every
peer's handle (never its own: CUDA refuses that in the exporting process)
and builds the table of tp peer base addresses the unicast publish stores
through.

:class:`IpcHandle` and :func:`peer_addresses` are plain data and logic
(CPU-testable with a fake opener); :func:`export_buffer` and
:func:`open_buffer` need a GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence


@dataclasses.dataclass(frozen=True)
class IpcHandle:
    """What one rank sends its peers about its mailbox."""
    rank: int
    pid: int
    device_uuid: str
    """The exporting GPU (shared GPU: every rank's must be the same)."""
    shape: tuple[int, ...]
    dtype: str
    payload: tuple
    """torch's ``reduce_tensor`` arguments (opaque; None in tests)."""


def check_handles(handles: Sequence[IpcHandle], *, tp: int, rank: int, device_uuid: str,
                  shape: Sequence[int]) -> None:
    """ValueError unless ``handles`` hold exactly ranks 0..tp-1 in order, one
    process each, all exporting a mailbox of ``shape`` on this rank's GPU."""
    got = [h.rank for h in handles]
    if got != list(range(tp)):
        raise ValueError(f"IPC handles must come from ranks 0..{tp - 1} in order, got {got}")
    if handles[rank].device_uuid != device_uuid:
        raise ValueError(f"rank {rank}: own handle names GPU {handles[rank].device_uuid}, "
                         f"this process runs on {device_uuid}")
    others = {h.rank: h.device_uuid for h in handles if h.device_uuid != device_uuid}
    if others:
        raise ValueError(f"shared-GPU group: ranks {sorted(others)} export mailboxes on other GPUs "
                         f"{others} than rank {rank} ({device_uuid}); every rank must be on one GPU")
    pids = [h.pid for h in handles]
    if len(set(pids)) != tp:
        raise ValueError(f"shared-GPU group: ranks must be distinct processes, got pids {pids}")
    bad = {h.rank: list(h.shape) for h in handles if tuple(h.shape) != tuple(shape)}
    if bad:
        raise ValueError(f"mailbox shapes differ from {list(shape)}: {bad}")


def peer_addresses(handles: Sequence[IpcHandle], *, rank: int, own_ptr: int,
                   opener: Callable[[IpcHandle], object],
                   address: Callable[[object], int]) -> tuple[list[int], list[object]]:
    """The peer table (tp base addresses, rank order; the own mailbox at
    ``own_ptr``) and the opened peer objects, which must stay alive as long
    as the table is used. Every address must be 16-byte aligned."""
    ptrs, opened = [], []
    for h in handles:
        if h.rank == rank:
            ptrs.append(int(own_ptr))
            continue
        obj = opener(h)
        opened.append(obj)
        ptr = int(address(obj))
        if ptr % 16:
            raise ValueError(f"rank {h.rank}'s mailbox opened at {ptr:#x}: not 16-byte aligned")
        ptrs.append(ptr)
    return ptrs, opened


def exports_for_peers(export: Callable[[], IpcHandle], own: IpcHandle, tp: int,
                      rank: int) -> list[IpcHandle]:
    """What this rank sends its peers: one export per peer (``export()``
    each time; the own entry is ``own``, never exported). torch's CUDA IPC
    hands one reference to one importer per export and frees the block once
    every reference came back; a handle shared by several importers is
    released once but counted several times, so the block would outlive
    its group (in a pooled worker, a mailbox per group)."""
    return [own if peer == rank else export() for peer in range(tp)]


def handles_for(gathered: Sequence[Sequence[IpcHandle]], rank: int) -> list[IpcHandle]:
    """From every rank's :func:`exports_for_peers` (rank order), the handles
    meant for ``rank``: its peers' exports for it and its own entry."""
    return [sent[rank] for sent in gathered]


def own_handle(buffer, *, rank: int, device_uuid: str) -> IpcHandle:
    """This rank's entry among the handles (checked, never opened: no payload)."""
    import os
    return IpcHandle(rank=rank, pid=os.getpid(), device_uuid=device_uuid,
                     shape=tuple(buffer.shape), dtype=str(buffer.dtype), payload=())


def export_buffer(buffer, *, rank: int, device_uuid: str) -> IpcHandle:
    """An IpcHandle for ``buffer`` (a CUDA tensor this process allocated)."""
    import os

    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(buffer)
    return IpcHandle(rank=rank, pid=os.getpid(), device_uuid=device_uuid,
                     shape=tuple(buffer.shape), dtype=str(buffer.dtype), payload=tuple(args))


def open_buffer(handle: IpcHandle):
    """The peer's mailbox tensor, mapped into this process."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    t = rebuild_cuda_tensor(*handle.payload)
    if tuple(t.shape) != tuple(handle.shape) or str(t.dtype) != handle.dtype:
        raise ValueError(f"rank {handle.rank}'s mailbox opened as {t.dtype}{list(t.shape)}, "
                         f"exported as {handle.dtype}{list(handle.shape)}")
    return t
