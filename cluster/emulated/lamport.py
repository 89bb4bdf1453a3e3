"""The Lamport publish and watchdog consume in numpy, over host mailboxes.

The protocol is the one written down in :mod:`kernels.lamport.protocol`;
this is its host emulation, step for step:

Launch (rank r, call seq): the emulated ranks are processes that the host
starts one by one, and on a loaded host the last can start a budget after
the first; a GPU group's kernels start within microseconds of each other.
So before the timed part each rank records ``seq`` in its segment's
``launched`` word and waits until every peer has, for at most one watchdog
budget (an absent peer is then left to the watchdog, so a call still ends
within two budgets plus its injected delay). The budget measures the
protocol, not the host's dispatch skew.

Publish (rank r, M tokens): read NEXT_STAGE; if it is not < 3, store
nothing, write the bad value to ACTIVE_STAGE (the local consumer then fails
fast) and report it. Otherwise sanitize (-0.0 -> +0.0, so no payload lane
looks like the sentinel), write the header (call seq, M) into header slot
``(stage, r)`` of every rank's mailbox, then the M x hidden payload into slots
``(stage, r, 0..M-1, :)`` of every rank's mailbox, then ACTIVE_STAGE = stage.

Consume: read ACTIVE_STAGE (bounds-checked: out of range -> no spin, all
outputs NaN); for source 0..tp-1 in order, poll the source's M x hidden/8
fragments and its header until no lane is 0x8000 and the header is set, or
until the watchdog deadline (consume start + budget, ``time.monotonic_ns``);
at the deadline record every fragment still pending (token, source,
fragment, stage, the 16 bytes as 4 little-endian u32) and go on with the next
source. Sum in FP32 in rank order from +0.0; fragments that never arrived
become NaN, and so does everything when a header disagrees with the own
(seq, M) (a mismatched call is never a silent answer). Then NEXT_STAGE =
(stage + 1) % 3 and the sentinel goes back into every slot read.

Owner mode (``mode="owner"``, :mod:`kernels.lamport.protocol`): the publish
writes token ``t`` (of ``max(M, tp)``, tokens ``>= M`` as +0.0) only into
its owner's (rank ``t % tp``) mailbox at slot ``(stage, r, t // tp)`` (the
header still goes to every rank); the consume of owner ``o`` reads its rows
``j`` with ``j * tp + o < M``, or row 0, from every source and returns the
``[ceil(M / tp), H]`` owned rows (row j = token j * tp + o, rows holding no
token +0.0); records name token ids.

Host-memory ordering: x86-64 keeps stores in program order, so a consumer
that sees every lane of a source also sees its header; each lane carries
its own arrival bit, so the payload needs no fence.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence

import numpy as np

from cluster.bits import BF16_NAN_BITS, bf16_bits_from_f32, f32_from_bf16_bits
from cluster.emulated.segment import HEADER_EMPTY, HostMailbox
from kernels.lamport.protocol import (ACTIVE_STAGE, ERR_DEFAULT_RECORDS, LAMPORT_GENERATIONS,
                                      MODES, NEXT_STAGE, SENTINEL_BF16, VEC_BF16, owned_tokens,
                                      owner_published_tokens, owner_rows)

SPIN_SLEEP_S = 50e-6
"""First pause between polls: on a 2-core host, spinning consumers must leave
the cores to the publishers they wait for."""
SPIN_MAX_SLEEP_S = 1e-3
"""Longest pause: a wait doubles its pause from SPIN_SLEEP_S up to this, so a
rank that waits long (a fault's whole budget, a peer the host started late)
polls about a thousand times a second rather than twenty thousand, and a
watchdog fires at most this late."""


class Backoff:
    """The pause of one wait: SPIN_SLEEP_S, doubled after each poll up to
    SPIN_MAX_SLEEP_S."""

    def __init__(self) -> None:
        self.pause_s = SPIN_SLEEP_S

    def sleep(self) -> None:
        time.sleep(self.pause_s)
        self.pause_s = min(SPIN_MAX_SLEEP_S, 2 * self.pause_s)


@dataclasses.dataclass(frozen=True)
class Published:
    stage: int | None
    """The stage written, None when the bounds check refused."""
    bad_stage: int | None


@dataclasses.dataclass(frozen=True)
class Consumed:
    stage: int
    bad_stage: int | None
    sum_bits: np.ndarray
    """uint16 [M, H]: the BF16 all-reduced sum, NaN where not computed."""
    missing_sources: frozenset[int]
    partial_sources: frozenset[int]
    headers: tuple[tuple[int, int] | None, ...]
    header_mismatch: bool
    records: tuple[tuple, ...]
    """(token, source, fragment, stage, (4 x u32)), at most ERR_DEFAULT_RECORDS."""
    record_count: int


def sanitize(bits: np.ndarray) -> np.ndarray:
    """A copy with every -0.0 (0x8000) replaced by +0.0."""
    out = bits.copy()
    out[out == SENTINEL_BF16] = 0
    return out


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")


def publish(mailboxes: Sequence[HostMailbox], *, rank: int, seq: int, payload: np.ndarray,
            bypass: Iterable[tuple[int, int]] = (), mode: str = "one_shot") -> Published:
    """Publish ``payload`` (uint16 [M, H] BF16 bits) of ``rank`` into every
    mailbox (``mailboxes[r]`` is rank r's), or in owner mode each token into
    its owner's. ``bypass``: (token, column) lanes that skip sanitize (fault
    injection only)."""
    _check_mode(mode)
    own = mailboxes[rank]
    stage = int(own.stage_state[NEXT_STAGE])
    if not 0 <= stage < LAMPORT_GENERATIONS:
        own.stage_state[ACTIVE_STAGE] = stage
        return Published(stage=None, bad_stage=stage)
    bits = sanitize(payload)
    for token, column in bypass:
        bits[token, column] = payload[token, column]
    m = bits.shape[0]
    for box in mailboxes:
        box.headers[stage, rank] = (seq, m)
    if mode == "owner":
        tp = len(mailboxes)
        padded = np.zeros((owner_published_tokens(m, tp), bits.shape[1]), dtype=bits.dtype)
        padded[:m] = bits
        for owner, box in enumerate(mailboxes):
            rows = padded[owner::tp]  # token j * tp + owner -> row j
            box.slots[stage, rank, :rows.shape[0]] = rows
    else:
        for box in mailboxes:
            box.slots[stage, rank, :m] = bits
    own.stage_state[ACTIVE_STAGE] = stage
    return Published(stage=stage, bad_stage=None)


def launch(mailboxes: Sequence[HostMailbox], *, rank: int, seq: int, wait_ns: int) -> bool:
    """Record that rank ``rank`` launched call ``seq`` and wait, at most
    ``wait_ns``, for every peer to launch it too (module docstring). Returns
    whether all did."""
    mailboxes[rank].launched[0] = seq
    deadline = time.monotonic_ns() + wait_ns
    backoff = Backoff()
    while any(int(box.launched[0]) < seq for box in mailboxes):
        if time.monotonic_ns() >= deadline:
            return False
        backoff.sleep()
    return True


def consume(own: HostMailbox, *, seq: int, tokens: int, budget_ns: int,
            max_records: int = ERR_DEFAULT_RECORDS, mode: str = "one_shot",
            rank: int = 0) -> Consumed:
    """The watchdog consume of ``tokens`` tokens from every source (see the
    module docstring); returns within about ``budget_ns`` plus one poll
    (at most SPIN_MAX_SLEEP_S).
    Owner mode: ``own`` is rank ``rank``'s mailbox and ``sum_bits`` its
    ``[ceil(M / tp), H]`` owned rows."""
    _check_mode(mode)
    deadline = time.monotonic_ns() + budget_ns
    m, hidden, tp = tokens, own.hidden, own.tp
    out_rows, read = m, m  # rows returned, mailbox rows read per source
    if mode == "owner":
        out_rows = owner_rows(m, tp)
        read = max(len(owned_tokens(m, tp, rank)), 1)  # row 0 is always published
    stage = int(own.stage_state[ACTIVE_STAGE])
    if not 0 <= stage < LAMPORT_GENERATIONS:
        nan = np.full((out_rows, hidden), BF16_NAN_BITS, dtype=np.uint16)
        return Consumed(stage=stage, bad_stage=stage, sum_bits=nan, missing_sources=frozenset(),
                        partial_sources=frozenset(), headers=(), header_mismatch=False,
                        records=(), record_count=0)
    acc = np.zeros((read, hidden), dtype=np.float32)
    unknown = np.zeros((read, hidden // VEC_BF16), dtype=bool)
    missing, partial, headers, records = set(), set(), [], []
    record_count, header_mismatch = 0, False
    for source in range(tp):
        backoff = Backoff()
        while True:
            snap = own.slots[stage, source, :read].copy()
            header = own.headers[stage, source].copy()
            sentinel = snap.reshape(read, -1, VEC_BF16) == SENTINEL_BF16
            pending = sentinel.any(-1)
            if (not pending.any() and header[0] != HEADER_EMPTY) or time.monotonic_ns() >= deadline:
                break
            backoff.sleep()
        seen = None if header[0] == HEADER_EMPTY else (int(header[0]), int(header[1]))
        headers.append(seen)
        if (seen is not None and seen != (seq, m)) or (seen is None and not pending.any()):
            header_mismatch = True
        if pending.any():
            lanes_pending = sentinel.sum(-1)
            if (lanes_pending == VEC_BF16).any():
                missing.add(source)
            if ((lanes_pending > 0) & (lanes_pending < VEC_BF16)).any():
                partial.add(source)
            for token, fragment in zip(*np.nonzero(pending)):
                if len(records) < max_records:
                    lanes = snap[token, fragment * VEC_BF16:(fragment + 1) * VEC_BF16]
                    words = tuple(int(w) for w in lanes.view("<u4"))
                    token_id = int(token) * tp + rank if mode == "owner" else int(token)
                    records.append((token_id, source, int(fragment), stage, words))
            record_count += int(pending.sum())
            unknown |= pending
        with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN are values here
            acc = acc + f32_from_bf16_bits(snap)
    own.stage_state[NEXT_STAGE] = (stage + 1) % LAMPORT_GENERATIONS
    own.slots[stage, :, :read] = SENTINEL_BF16
    own.headers[stage] = HEADER_EMPTY
    if header_mismatch:
        acc.fill(np.nan)
    else:
        acc[np.repeat(unknown, VEC_BF16, axis=1)] = np.nan
    if out_rows > read:  # owner rows past the owned tokens were not published: +0.0
        acc = np.concatenate([acc, np.full((out_rows - read, hidden),
                                           np.nan if header_mismatch else 0.0, dtype=np.float32)])
    return Consumed(stage=stage, bad_stage=None, sum_bits=bf16_bits_from_f32(acc),
                    missing_sources=frozenset(missing), partial_sources=frozenset(partial),
                    headers=tuple(headers), header_mismatch=header_mismatch,
                    records=tuple(records), record_count=record_count)
