"""EmulatedRank: the ``"emulated"`` RankBackend (see cluster.backend): the
Lamport protocol alone, on payload bits the driver made (no torch in a rank
process: :mod:`cluster.emulated.host`)."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import TYPE_CHECKING

import numpy as np

from cluster import ops
from cluster.emulated.lamport import consume, launch, publish
from cluster.emulated.segment import HostMailbox, segment_name
from cluster.injection import rank_tokens, validate_injection
from cluster.phases import PhaseClock
from kernels.lamport.protocol import LAMPORT_GENERATIONS, NEXT_STAGE, SENTINEL_BF16, VEC_BF16
from kernels.validation import (require_int, require_multiple, require_name, require_number,
                                require_tp)

if TYPE_CHECKING:
    from cluster.cases import Case


def bad_stage(published, consumed_bad: int | None) -> int | None:
    """The out-of-range stage value the publish (first) or the consume read."""
    if published is not None and published.bad_stage is not None:
        return published.bad_stage
    return consumed_bad


class EmulatedRank:
    """One rank of an emulated TP group: its own mailbox (a shared-memory
    segment it creates) and every peer's (attached). Not thread-safe; the
    actor serialises calls."""

    def __init__(self) -> None:
        self._rank = self._tp = self._hidden = None
        self._group_id = None
        self._mailboxes: list[HostMailbox] = []
        self._calls = 0

    # -- group lifetime
    def setup(self, *, group_id: str, rank: int, tp: int, capacity: int, hidden: int,
              timeout_s: float, options: dict | None = None) -> dict:
        unknown = set(options or {}) - {"placement"}
        if unknown:
            raise ValueError(f"unknown emulated backend options {sorted(unknown)}; known ['placement']")
        if self._mailboxes:
            raise RuntimeError(f"rank {self._rank} is already set up in group {self._group_id}; "
                               f"close() first")
        require_name("group_id", group_id)  # it names shared-memory segments
        require_tp("tp", tp)
        require_int("rank", rank, low=0, high=tp - 1)
        require_multiple("hidden", hidden, VEC_BF16)
        require_int("capacity", capacity, low=1)
        require_number("timeout_s", timeout_s, nonnegative=True)
        shape = {"tp": tp, "capacity": capacity, "hidden": hidden}
        own, created = HostMailbox.open_own(segment_name(group_id, rank), **shape)
        found = own.check(rank)
        if not found.clean:
            own.scrub()
        boxes = {rank: own}
        deadline = time.monotonic() + timeout_s
        try:
            for peer in range(tp):
                if peer != rank:
                    boxes[peer] = HostMailbox.attach(segment_name(group_id, peer), **shape,
                                                     timeout_s=max(0.0, deadline - time.monotonic()))
        except BaseException:
            for box in boxes.values():
                box.close()
            own.unlink()
            raise
        self._rank, self._tp, self._hidden, self._group_id = rank, tp, hidden, group_id
        self._mailboxes = [boxes[r] for r in range(tp)]
        self._calls = 0
        return {"rank": rank, "created": created, "start_check": dataclasses.asdict(found)}

    def close(self) -> dict:
        """Detach every mailbox and unlink the own segment; idempotent. The
        process stays reusable (cluster.backend's close contract)."""
        if self._mailboxes:
            own = self._mailboxes[self._rank]
            for box in self._mailboxes:
                box.close()
            own.unlink()
            self._mailboxes = []
        return {"reusable": True, "why": ""}

    def prepare(self, case: Case) -> dict:
        """Nothing to build: the op's reference runs in the driver
        (:mod:`cluster.emulated.host`)."""
        return {"rank": self._rank}

    # -- one call
    def run_case(self, case: Case, payload: np.ndarray | None = None) -> dict:
        """One call of ``case.op``: ``payload`` (this rank's uint16 ``[M,
        hidden]`` BF16 bits, made by the driver's
        :class:`~cluster.emulated.host.HostHalf`) through the emulated Lamport
        publish and watchdog consume. The result has no ``outputs`` or
        ``check``: it carries the reduced sum as ``sum_bits`` (uint16, NaN
        where not computed), which the driver's ``HostHalf.finish`` turns into
        the op's outputs and checks. No torch here."""
        own = self._own()
        spec = ops.get(case.op)
        if spec.needs_gpu:
            raise ValueError(f"op {spec.name} on the emulated backend: {spec.needs_gpu}")
        fault = validate_injection(case.fault) or {"kind": None}
        kind = fault["kind"]
        tokens = rank_tokens(case.tokens, case.fault)
        if not 1 <= tokens <= own.capacity:
            raise ValueError(f"tokens must be in 1..capacity={own.capacity}, got {tokens}")
        if not isinstance(payload, np.ndarray) or payload.dtype != np.uint16 \
                or payload.shape != (tokens, self._hidden):
            what = (f"{payload.dtype} {list(payload.shape)}" if isinstance(payload, np.ndarray)
                    else type(payload).__name__)
            raise ValueError(f"payload must be uint16 [{tokens}, {self._hidden}] (M, hidden) "
                             f"BF16 bits, got {what}")
        clock = PhaseClock()
        payload = payload.copy()  # the unsanitized_lane fault writes into it
        seq = int(case.seq)
        expected_stage = self._calls % LAMPORT_GENERATIONS
        self._calls += 1

        launch(self._mailboxes, rank=self._rank, seq=seq, wait_ns=case.budget_ns)
        started = time.monotonic_ns()
        bypass = ()
        if kind == "hang":
            while True:
                time.sleep(1.0)
        if kind == "delay_publish":
            time.sleep(fault["delay_ns"] / 1e9)
        if kind == "set_next_stage":
            own.stage_state[NEXT_STAGE] = fault["value"]
        if kind == "shift_next_stage":
            own.stage_state[NEXT_STAGE] = (own.stage_state[NEXT_STAGE] + fault["by"]) % LAMPORT_GENERATIONS
        if kind == "unsanitized_lane":
            payload[fault["token"], fault["column"]] = SENTINEL_BF16
            bypass = ((fault["token"], fault["column"]),)
        mode = getattr(case.params, "mode", "one_shot")  # AllReduceNorm's (ops that declare it)
        published = None
        if kind != "skip_publish":
            published = publish(self._mailboxes, rank=self._rank, seq=seq, payload=payload,
                                bypass=bypass, mode=mode)
        if kind == "die_after_publish":
            os._exit(1)
        consume_from = time.monotonic_ns()
        got = consume(own, seq=seq, tokens=tokens, budget_ns=case.budget_ns, mode=mode,
                      rank=self._rank)
        done = time.monotonic_ns()
        clock.mark("call")  # the emulated kernel: publish and consume
        after = own.check(self._rank)
        clock.mark("readback")
        return {
            "rank": self._rank, "seq": seq, "tokens": tokens, "expected_stage": expected_stage,
            "published_stage": None if published is None else published.stage,
            "consumed_stage": got.stage,
            "bad_stage": bad_stage(published, got.bad_stage),
            "missing_sources": sorted(got.missing_sources),
            "partial_sources": sorted(got.partial_sources),
            "headers": [None if h is None else list(h) for h in got.headers],
            "records": [[t, s, f, st, list(w)] for t, s, f, st, w in got.records],
            "record_count": got.record_count, "header_mismatch": got.header_mismatch,
            "mailbox_clean": after.non_sentinel == 0 and after.headers_set == 0,
            "mailbox_dirt": own.dirt() if after.non_sentinel or after.headers_set else None,
            "sum_bits": got.sum_bits,
            "publish_ns": consume_from - started, "consume_ns": done - consume_from,
            "publish_start_ns": started,  # CLOCK_MONOTONIC: cluster.stragglers
            "host_ns": clock.ns,
        }

    # -- recovery
    def recover(self) -> dict:
        """Nothing of this rank is in flight once run_case has returned (the
        emulation is synchronous), so quiescing is the caller's wait for every
        rank's call; then scrub unconditionally."""
        own = self._own()
        found = own.check(self._rank)
        own.scrub()
        self._calls = 0
        return dataclasses.asdict(found)

    def scrub(self) -> dict:
        own = self._own()
        found = own.check(self._rank)
        if not found.clean:
            own.scrub()
            self._calls = 0
        return dataclasses.asdict(found)

    def state(self) -> dict:
        own = self._own()
        return {"rank": self._rank, "group_id": self._group_id, "calls_since_reset": self._calls,
                "check": dataclasses.asdict(own.check(self._rank))}

    def _own(self) -> HostMailbox:
        if not self._mailboxes:
            raise RuntimeError("this rank is not set up: call setup() first")
        return self._mailboxes[self._rank]
