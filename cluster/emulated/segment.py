"""One rank's Lamport mailbox in POSIX shared memory (``multiprocessing.shared_memory``).

Segment layout (bytes; name ``ll-<group id>-r<rank>``), C order throughout:

=======  =====================================  ==================================
offset   field                                  meaning
=======  =====================================  ==================================
0        meta int64[4]                          MAGIC, tp, capacity, hidden; MAGIC
                                                is written last, so a peer that
                                                sees it sees an initialised segment
32       stage_state int32[2]                   [ACTIVE_STAGE, NEXT_STAGE]
40       launched int64[1]                      seq of the last call this rank
                                                launched (-1: none); the launch
                                                rendezvous, not protocol state
64       headers int64[3, tp, 2]                per (stage, source): (call seq, M)
                                                the source published; HEADER_EMPTY
                                                (-1, -1) when free
aligned  slots uint16[3, tp, capacity, hidden]  BF16 bit patterns; flat index is
                                                ``protocol.slot_index``; free lanes
                                                hold the sentinel 0x8000
=======  =====================================  ==================================

The header slot is the emulation's answer to "every rank makes the same
call with the same token count": a source writes its header into slot
``(stage, source)`` of every peer before its payload; a consumer counts a
source as arrived only when its fragments and its header are there, compares
the header with its own (seq, M), and frees the slot with the payload.

Lifetime: a segment belongs to the TP group, not to the process that created
it. It is deliberately left out of Python's resource tracker (which would
unlink it when any process that touched it dies), so a killed process leaves
its mailbox behind, dirty, exactly as a device buffer from a pool would be;
the next setup of the group finds it, reports it and scrubs it. The rank
that owns a segment unlinks it on a clean close. (Python 3.13's
``track=False`` does what :func:`_untrack` does.)

Names carry their driver: a TP group's id is ``<run tag>.p<driver pid>-<12
hex>`` (:func:`cluster.group.new_group_id`), so :func:`sweep_orphans` can
remove, at the start of a later run, the segments of drivers that are gone
(``kill -9`` included), and a driver's own leftovers can be removed by
prefix (:func:`remove_driver_segments`).
"""

from __future__ import annotations

import os
import re
import time
from multiprocessing import resource_tracker, shared_memory

import numpy as np

from cluster.procs import started_at
from kernels.lamport.diagnosis import MailboxCheck
from kernels.lamport.protocol import (ACTIVE_STAGE, LAMPORT_GENERATIONS, NEXT_STAGE,
                                      SENTINEL_BF16, mailbox_shape)

MAGIC = 0x4C414D504F525431  # "LAMPORT1"
HEADER_EMPTY = -1
_META, _STAGE, _LAUNCHED, _HEADERS = 0, 32, 40, 64
_POLL_S = 0.01


SHM_DIR = "/dev/shm"
_OWNED = re.compile(r"ll-(?P<tag>[A-Za-z0-9_.-]*?)\.p(?P<pid>[0-9]+)-[0-9a-f]{12}-r[0-9]+")


def segment_name(group_id: str, rank: int) -> str:
    return f"ll-{group_id}-r{rank}"


def driver_gone(name: str) -> bool:
    """Whether ``name`` is a segment whose driver (the pid in its name) is no
    longer running on this host: no such process, or one that started after
    the segment was made (a reused pid). Names without a driver: False."""
    match = _OWNED.fullmatch(name)
    if match is None:
        return False
    try:
        made = os.stat(os.path.join(SHM_DIR, name)).st_mtime
    except OSError:
        return False
    started = started_at(int(match["pid"]))
    return started is None or started > made + 2.0


def sweep_orphans() -> list[str]:
    """Remove every segment of a driver that is gone; returns their names."""
    try:
        names = sorted(os.listdir(SHM_DIR))
    except OSError:
        return []
    removed = [n for n in names if driver_gone(n)]
    for name in removed:
        unlink_segment(name)
    return removed


def remove_driver_segments(pid: int) -> list[str]:
    """Remove every segment made for driver ``pid``; returns their names."""
    try:
        names = sorted(os.listdir(SHM_DIR))
    except OSError:
        return []
    mine = [n for n in names if (m := _OWNED.fullmatch(n)) and int(m["pid"]) == pid]
    for name in mine:
        unlink_segment(name)
    return mine


def _layout(tp: int, capacity: int, hidden: int) -> tuple[int, int]:
    """(offset of the slots, total bytes)."""
    slots_at = -(-(_HEADERS + LAMPORT_GENERATIONS * tp * 2 * 8) // 64) * 64
    return slots_at, slots_at + int(np.prod(mailbox_shape(tp, capacity, hidden))) * 2


def _untrack(shm: shared_memory.SharedMemory) -> shared_memory.SharedMemory:
    resource_tracker.unregister(shm._name, "shared_memory")  # noqa: SLF001 (see module doc)
    return shm


class HostMailbox:
    """numpy views of one rank's segment. Open with :meth:`open_own` (the
    owning rank) or :meth:`attach` (a peer)."""

    def __init__(self, shm: shared_memory.SharedMemory, *, tp: int, capacity: int, hidden: int):
        slots_at, size = _layout(tp, capacity, hidden)
        if shm.size < size:
            raise ValueError(f"segment {shm.name} holds {shm.size} bytes, tp={tp} capacity={capacity} "
                             f"hidden={hidden} needs {size}")
        self.name, self.tp, self.capacity, self.hidden = shm.name, tp, capacity, hidden
        self._shm = shm
        buf = shm.buf
        self.meta = np.ndarray((4,), np.int64, buf, _META)
        self.stage_state = np.ndarray((2,), np.int32, buf, _STAGE)
        self.launched = np.ndarray((1,), np.int64, buf, _LAUNCHED)
        self.headers = np.ndarray((LAMPORT_GENERATIONS, tp, 2), np.int64, buf, _HEADERS)
        self.slots = np.ndarray(mailbox_shape(tp, capacity, hidden), np.uint16, buf, slots_at)

    @classmethod
    def open_own(cls, name: str, *, tp: int, capacity: int, hidden: int) -> tuple["HostMailbox", bool]:
        """Create the segment, or attach to one a previous incarnation of this
        rank left behind. Returns (mailbox, created); a created mailbox is
        initialised (all sentinel, headers empty, stage state 0)."""
        size = _layout(tp, capacity, hidden)[1]
        try:
            shm = _untrack(shared_memory.SharedMemory(name, create=True, size=size))
            created = True
        except FileExistsError:
            try:
                shm = _untrack(shared_memory.SharedMemory(name))
            except ValueError:  # an empty segment a failed setup left: replace it
                unlink_segment(name)
                shm = _untrack(shared_memory.SharedMemory(name, create=True, size=size))
            created = False
        box = cls(shm, tp=tp, capacity=capacity, hidden=hidden)
        if created or box.meta[0] != MAGIC:
            box.scrub()
            box.launched[0] = -1
            box.meta[1:] = (tp, capacity, hidden)
            box.meta[0] = MAGIC
            created = True
        box._require_shape()
        return box, created

    @classmethod
    def attach(cls, name: str, *, tp: int, capacity: int, hidden: int, timeout_s: float) -> "HostMailbox":
        """Attach to a peer's segment, waiting up to ``timeout_s`` for it to
        exist and be initialised; TimeoutError names it."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                shm = shared_memory.SharedMemory(name)
            except (FileNotFoundError, ValueError):  # not created, or not sized yet
                shm = None
            if shm is not None and shm.size < _layout(tp, capacity, hidden)[1]:
                # Created but caught between its fstat and ftruncate (the
                # mapping can succeed while .size reads 0): not sized yet.
                _untrack(shm).close()
                shm = None
            if shm is not None:
                box = cls(_untrack(shm), tp=tp, capacity=capacity, hidden=hidden)
                if box.meta[0] == MAGIC:
                    box._require_shape()
                    return box
                box.close()
            if time.monotonic() > deadline:
                raise TimeoutError(f"peer mailbox {name} not created and initialised within {timeout_s} s")
            time.sleep(_POLL_S)

    def _require_shape(self) -> None:
        want = (self.tp, self.capacity, self.hidden)
        if tuple(int(v) for v in self.meta[1:]) != want:
            raise ValueError(f"segment {self.name} was made for (tp, capacity, hidden) "
                             f"{tuple(int(v) for v in self.meta[1:])}, wanted {want}")

    def check(self, rank: int) -> MailboxCheck:
        """The mailbox as it is now."""
        return MailboxCheck(rank=rank,
                            non_sentinel=int(np.count_nonzero(self.slots != SENTINEL_BF16)),
                            headers_set=int(np.count_nonzero((self.headers != HEADER_EMPTY).any(-1))),
                            stage_state=(int(self.stage_state[ACTIVE_STAGE]),
                                         int(self.stage_state[NEXT_STAGE])))

    def dirt(self, limit: int = 6) -> str:
        """Where the mailbox is not free, for a failure's reason: per (stage,
        source) with lanes not holding the sentinel or a header set, its rows
        and lane count and the header's (call seq, M); at most ``limit``
        places, then how many more. Empty when the mailbox is all free."""
        lanes = np.count_nonzero(self.slots != SENTINEL_BF16, axis=-1)  # [stage, source, row]
        places = []
        for stage in range(LAMPORT_GENERATIONS):
            for source in range(self.tp):
                rows = np.nonzero(lanes[stage, source])[0]
                header = tuple(int(v) for v in self.headers[stage, source])
                if not len(rows) and header[0] == HEADER_EMPTY:
                    continue
                what = []
                if len(rows):
                    span = (f"row {rows[0]}" if len(rows) == 1 else
                            f"rows {rows[0]}-{rows[-1]}" if rows[-1] - rows[0] + 1 == len(rows)
                            else f"{len(rows)} rows in {rows[0]}-{rows[-1]}")
                    what.append(f"{span} ({int(lanes[stage, source].sum())} lanes)")
                if header[0] != HEADER_EMPTY:
                    what.append(f"header (seq {header[0]}, M {header[1]})")
                places.append(f"stage {stage} source {source}: " + ", ".join(what))
        more = f"; {len(places) - limit} more" if len(places) > limit else ""
        return "; ".join(places[:limit]) + more

    def scrub(self) -> None:
        """Every lane := sentinel, every header := empty, stage state := (0, 0).
        Only safe while no peer can write into this mailbox."""
        self.slots.fill(SENTINEL_BF16)
        self.headers.fill(HEADER_EMPTY)
        self.stage_state.fill(0)

    def close(self) -> None:
        """Drop the views and unmap (the segment stays); idempotent."""
        if self._shm is None:
            return
        self.meta = self.stage_state = self.launched = self.headers = self.slots = None
        self._shm.close()
        self._shm = None

    def unlink(self) -> None:
        """Remove the segment's name (the owner, on a clean close); idempotent."""
        unlink_segment(self.name)


def unlink_segment(name: str) -> None:
    """Remove a segment by name, empty or not; a no-op if it is gone. (It
    never maps the segment: an empty one, left by a setup that failed after
    creating it, cannot be mapped; and the resource tracker never hears of
    it, as in :func:`_untrack`.)"""
    import _posixshmem
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass
