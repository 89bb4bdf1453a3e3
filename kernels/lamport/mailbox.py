"""Lamport mailboxes: the BF16 ``[3, tp, capacity, hidden]`` buffer, the
int32[2] stage state, the peer-address table and the error buffer of one
rank, plus the multicast gate.

Constructors:
- :meth:`Mailbox.virtual_ranks`: tp ranks in one process on one GPU (tp
  buffers; every rank's peer table points at every rank's buffer);
- :meth:`Mailbox.symmetric`: torch symmetric memory over a process group
  (rendezvous; the peer table is the handle's ``buffer_ptrs_dev``);
- :meth:`Mailbox.from_peer_table`: an externally supplied buffer and peer
  addresses (CUDA IPC buffers, ...).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

import torch

from kernels.validation import require_int, require_multiple, require_tp

from .diagnosis import TimeoutRecord
from .protocol import (ACTIVE_STAGE, ERR_BAD_STAGE, ERR_COUNT,
                       ERR_DEFAULT_RECORDS, ERR_HEADER_WORDS, ERR_MISSING_MASK,
                       ERR_RECORD_WORDS, ERR_UNSANITIZED_MASK, NEXT_STAGE,
                       SENTINEL_INT16, STAGE_STATE_WORDS, VEC_BF16, error_buffer_words,
                       mailbox_shape)

# ---------------------------------------------------------------- multicast gate
MULTICAST_KILL_SWITCHES = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def multicast_decision(*, opt_in: bool, multicast_ptr: int,
                       env: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """Whether the multicast transport may run, and why (docs/design.md,
    Multicast safety): an explicit opt-in, a non-zero 16-byte aligned
    multicast address from the rendezvous, and none of the kill switches
    set. A device attribute alone is never enough. Pure: no CUDA calls."""
    env = os.environ if env is None else env
    if not opt_in:
        return False, "multicast not opted in (allow_multicast=False)"
    if not multicast_ptr:
        return False, "rendezvous returned multicast_ptr == 0"
    if multicast_ptr % 16:
        return False, f"multicast_ptr {multicast_ptr:#x} is not 16-byte aligned"
    for name, value in MULTICAST_KILL_SWITCHES.items():
        if env.get(name, "").strip() == value:
            return False, f"{name}={value} is set"
    return True, "multicast allowed"


def require_multicast(*, opt_in: bool, multicast_ptr: int,
                      env: Mapping[str, str] | None = None) -> int:
    """Return ``multicast_ptr`` if the gate allows it, else RuntimeError."""
    ok, reason = multicast_decision(opt_in=opt_in, multicast_ptr=multicast_ptr, env=env)
    if not ok:
        raise RuntimeError(f"transport='multicast' refused: {reason}")
    return multicast_ptr


# ---------------------------------------------------------------- error reports
@dataclasses.dataclass(frozen=True)
class RankErrors:
    """One rank's error buffer and stage state, decoded on the host
    (:func:`kernels.lamport.diagnosis.diagnose_errors` makes the group view)."""
    rank: int
    active_stage: int
    next_stage: int
    count: int
    missing_mask: int
    unsanitized_mask: int
    bad_stage: int | None
    records: tuple[TimeoutRecord, ...]

    @property
    def ok(self) -> bool:
        return not (self.count or self.bad_stage is not None
                    or self.missing_mask or self.unsanitized_mask)

    @staticmethod
    def decode(rank: int, stage_state: Sequence[int], words: Sequence[int]) -> "RankErrors":
        u = [w & 0xFFFFFFFF for w in words]
        count = u[ERR_COUNT]
        capacity = (len(u) - ERR_HEADER_WORDS) // ERR_RECORD_WORDS
        records = []
        for i in range(min(count, capacity)):
            r = u[ERR_HEADER_WORDS + i * ERR_RECORD_WORDS:
                  ERR_HEADER_WORDS + (i + 1) * ERR_RECORD_WORDS]
            records.append(TimeoutRecord(r[0], r[1], r[2], r[3], tuple(r[4:8])))
        bad = u[ERR_BAD_STAGE]
        return RankErrors(rank=rank, active_stage=int(stage_state[ACTIVE_STAGE]),
                          next_stage=int(stage_state[NEXT_STAGE]), count=count,
                          missing_mask=u[ERR_MISSING_MASK],
                          unsanitized_mask=u[ERR_UNSANITIZED_MASK],
                          bad_stage=None if bad == 0 else bad - 1,
                          records=tuple(records))


# ---------------------------------------------------------------- the mailbox
class Mailbox:
    """One rank's Lamport state. Construct with a classmethod."""

    def __init__(self, *, rank: int, tp: int, capacity: int, hidden: int,
                 buffer: torch.Tensor, peer_table_ptr: int,
                 multicast_ptr: int = 0, error_records: int = ERR_DEFAULT_RECORDS,
                 keepalive: object = None) -> None:
        if buffer.dtype != torch.bfloat16 or tuple(buffer.shape) != mailbox_shape(tp, capacity, hidden):
            raise ValueError(
                f"buffer must be bfloat16{list(mailbox_shape(tp, capacity, hidden))}, "
                f"got {buffer.dtype}{list(buffer.shape)}")
        if not 0 <= rank < tp:
            raise ValueError(f"rank must be in [0, {tp}), got {rank}")
        if buffer.data_ptr() % 16:
            raise ValueError(f"buffer must be 16-byte aligned, got {buffer.data_ptr():#x}")
        self.rank, self.tp, self.capacity, self.hidden = rank, tp, capacity, hidden
        self.device = buffer.device
        self._buffer = buffer
        self._peer_table_ptr = int(peer_table_ptr)
        self._multicast_ptr = int(multicast_ptr)
        self._keepalive = keepalive
        self.error_records = error_records
        self._stage_state = torch.zeros(STAGE_STATE_WORDS, dtype=torch.int32,
                                        device=self.device)
        self._errors = torch.zeros(error_buffer_words(error_records), dtype=torch.int32,
                                   device=self.device)
        self.fill_sentinel()

    # -- constructors
    @classmethod
    def virtual_ranks(cls, *, tp: int, capacity: int, hidden: int,
                      device: torch.device | str | None = None,
                      error_records: int = ERR_DEFAULT_RECORDS) -> list["Mailbox"]:
        """tp mailboxes on one GPU; each rank's peer table lists all buffers."""
        require_tp("tp", tp)
        require_int("capacity", capacity, low=1)
        require_multiple("hidden", hidden, VEC_BF16)
        device = torch.device(device if device is not None else "cuda")
        buffers = [torch.empty(mailbox_shape(tp, capacity, hidden), dtype=torch.bfloat16,
                               device=device) for _ in range(tp)]
        table = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64,
                             device=device)
        boxes = [cls(rank=r, tp=tp, capacity=capacity, hidden=hidden, buffer=buffers[r],
                     peer_table_ptr=table.data_ptr(), keepalive=table,
                     error_records=error_records) for r in range(tp)]
        torch.cuda.synchronize(device)
        return boxes

    @classmethod
    def symmetric(cls, *, group, capacity: int, hidden: int,
                  device: torch.device | str | None = None,
                  error_records: int = ERR_DEFAULT_RECORDS) -> "Mailbox":
        """Collective over ``group``: symmetric-memory mailbox + rendezvous."""
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        device = (torch.device("cuda", torch.cuda.current_device()) if device is None
                  else torch.device(device))
        tp, rank = dist.get_world_size(group), dist.get_rank(group)
        buffer = symm_mem.empty(mailbox_shape(tp, capacity, hidden), dtype=torch.bfloat16,
                                device=device)
        handle = symm_mem.rendezvous(buffer, group)
        table = int(getattr(handle, "buffer_ptrs_dev", 0) or 0)
        keep = handle
        if not table:
            t = torch.tensor(list(handle.buffer_ptrs), dtype=torch.int64, device=device)
            table, keep = t.data_ptr(), (handle, t)
        box = cls(rank=rank, tp=tp, capacity=capacity, hidden=hidden, buffer=buffer,
                  peer_table_ptr=table, multicast_ptr=int(handle.multicast_ptr or 0),
                  keepalive=keep, error_records=error_records)
        torch.cuda.synchronize(device)
        dist.barrier(group=group)
        return box

    @classmethod
    def from_peer_table(cls, *, rank: int, tp: int, capacity: int, hidden: int,
                        buffer: torch.Tensor, peers: Sequence[int] | torch.Tensor,
                        multicast_ptr: int = 0,
                        error_records: int = ERR_DEFAULT_RECORDS) -> "Mailbox":
        """An externally allocated buffer and the tp peer base addresses
        (host ints or a device int64[tp] tensor)."""
        if isinstance(peers, torch.Tensor):
            table = peers.to(device=buffer.device, dtype=torch.int64).contiguous()
        else:
            table = torch.tensor(list(peers), dtype=torch.int64, device=buffer.device)
        if table.numel() != tp:
            raise ValueError(f"peers must hold tp={tp} addresses, got {table.numel()}")
        return cls(rank=rank, tp=tp, capacity=capacity, hidden=hidden, buffer=buffer,
                   peer_table_ptr=table.data_ptr(), multicast_ptr=multicast_ptr,
                   keepalive=table, error_records=error_records)

    # -- addresses for the kernels
    @property
    def buffer(self) -> torch.Tensor:
        return self._buffer

    @property
    def stage_state(self) -> torch.Tensor:
        return self._stage_state

    @property
    def buffer_ptr(self) -> int:
        return self._buffer.data_ptr()

    @property
    def stage_state_ptr(self) -> int:
        return self._stage_state.data_ptr()

    @property
    def error_ptr(self) -> int:
        return self._errors.data_ptr()

    @property
    def peer_table_ptr(self) -> int:
        return self._peer_table_ptr

    @property
    def multicast_ptr(self) -> int:
        return self._multicast_ptr

    # -- state
    def fill_sentinel(self) -> None:
        """Every slot := BF16 -0.0 (async on the current stream)."""
        self._buffer.view(torch.int16).fill_(SENTINEL_INT16)

    def scrub(self) -> None:
        """Refill the sentinel, reset the stage state and the error buffer.
        Only safe when no kernel of the group is in flight (see recover)."""
        self.fill_sentinel()
        self._stage_state.zero_()
        self._errors.zero_()

    def clear_errors(self) -> None:
        self._errors.zero_()

    def is_all_sentinel(self) -> bool:
        return bool((self._buffer.view(torch.int16) == SENTINEL_INT16).all().item())

    def read_errors(self) -> RankErrors:
        """Decode the error buffer (synchronizes with the device)."""
        return RankErrors.decode(self.rank, self._stage_state.tolist(), self._errors.tolist())
