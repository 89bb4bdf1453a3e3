"""GpuRank: the ``"gpu"`` RankBackend (see cluster.backend).

Placements (``options["placement"]``):
- ``process-per-gpu``: one rank a GPU. torch.distributed NCCL group
  (MASTER_ADDR/PORT from rank 0, as Ray Train does), the mailbox in torch
  symmetric memory (:meth:`kernels.lamport.mailbox.Mailbox.symmetric`: the
  peer table is the rendezvous' ``buffer_ptrs_dev``).
- ``shared-gpu``: several rank processes on one GPU (fractional
  ``num_gpus``). NCCL refuses two ranks on one device, so the group
  bootstraps over gloo; each rank allocates its mailbox, exports a CUDA IPC
  handle, the group all-gathers the handles, each rank opens its peers' and
  builds the peer table (:mod:`cluster.gpu.ipc`) →
  :meth:`~kernels.lamport.mailbox.Mailbox.from_peer_table`.

Kernels: every op of :mod:`cluster.ops` through its declaration's
``RankKernel`` (AllReduceNorm for all_reduce_norm, its finalize publish and
its embedding path; AllReduceMHC with or without its finalize; the indexer,
which is no collective and leaves the mailbox alone), one per
``RankKernel.key`` (op, watchdog budget, eps, op fields) on the one mailbox
(they share its stage rotation: every rank makes the same sequence of
calls); the compiled kernels come from ``kernels.lamport.compile.cached``,
keyed by frozen configs, so a sweep compiles each configuration once per
process. :meth:`prepare` compiles before a call: a rank still compiling
while its peers' watchdogs run would read as a missing rank.

Results follow cluster.backend's contract; the diagnosis fields come from
the kernels' error buffer (:mod:`cluster.gpu.report`). Outputs are poisoned
before every call. Outputs a consumer does not write (the reduced sum) are
None (not observed), except where the op makes them observable (a zero
residual: residual_out is then BF16(sum) bit for bit). The check runs on the
rank, with the facts the kernel decided (e.g. mHC rank lanes).

Fault injections: every kind of cluster.injection except
``unsanitized_lane`` (the GPU publish always sanitizes; that fault is
covered at kernel level by tests/gpu/test_all_reduce_norm_gpu.py).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import time
from collections.abc import Mapping

from cluster import ops
from cluster.ahead import Ahead, side_stream
from cluster.cases import Case, case_inputs, check_outputs, reference
from kernels.lamport.diagnosis import MailboxCheck
from cluster.gpu import ALL_GPUS_VISIBLE, UNSUPPORTED_INJECTIONS
from cluster.gpu.ipc import (check_handles, export_buffer, exports_for_peers, handles_for,
                             open_buffer, own_handle, peer_addresses)
from cluster.gpu.report import result_fields
from cluster.injection import rank_tokens, validate_injection
from cluster.phases import PhaseClock
from cluster.placement import Placement
from cluster.procs import settle_heap
from kernels.lamport.protocol import LAMPORT_GENERATIONS, NEXT_STAGE, SENTINEL_INT16, mailbox_shape

PLACEMENTS = (Placement.PROCESS_PER_GPU, Placement.SHARED_GPU)
WARM_GROUP_HIDDEN = 1024
"""Hidden size of :meth:`GpuRank.warm_group`'s mailbox (one token, three generations: 6 KiB)."""
OPTIONS = ("master_addr", "master_port", "placement", "transport")


SPLIT_FAULTS = ("skip_publish", "die_after_publish", "delay_publish")
"""Faults that need the publish and the consumer launched apart; every other
call of a kernel with a ``call()`` goes through it (AllReduceNorm's
``__call__``: the single kernel where its form table picks it)."""


class GpuRank:
    """One rank of a GPU TP group. Not thread-safe; the actor serialises calls."""

    def __init__(self) -> None:
        self._mailbox = None
        self._peers: list = []
        self._kernels: dict = {}
        self._measure_cache: dict = {}  # per-group timing objects (a baseline's workspace)
        self._rank = self._tp = self._hidden = self._capacity = None
        self._group_id = None
        self._placement = None
        self._transport = "unicast"
        self._timeout_s = 60.0
        self._calls = 0
        self._pg = False
        self._device = None
        self._ahead = Ahead(self._host_work)

    # -- group lifetime
    def setup(self, *, group_id: str, rank: int, tp: int, capacity: int, hidden: int,
              timeout_s: float, options: Mapping | None = None) -> dict:
        import torch
        import torch.distributed as dist

        if self._mailbox is not None:
            raise RuntimeError(f"rank {self._rank} is already set up in group {self._group_id}; "
                               f"close() first")
        options = dict(options or {})
        unknown = set(options) - set(OPTIONS)
        if unknown:
            raise ValueError(f"unknown gpu backend options {sorted(unknown)}; known {list(OPTIONS)}")
        placement = options.get("placement", Placement.PROCESS_PER_GPU)
        if placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {placement!r} for the gpu backend; known "
                             f"{[str(p) for p in PLACEMENTS]}")
        placement = Placement(placement)
        if not 0 <= rank < tp:
            raise ValueError(f"rank must be in 0..{tp - 1}, got {rank}")
        if "master_addr" not in options or "master_port" not in options:
            raise ValueError(f"the gpu backend needs master_addr and master_port, got {sorted(options)}")
        if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
            raise RuntimeError(f"rank {rank}: no CUDA device visible "
                               f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
        self._device = torch.device("cuda", local_device_index())
        torch.cuda.set_device(self._device)
        self._rank, self._tp, self._hidden, self._capacity = rank, tp, hidden, capacity
        self._group_id, self._placement = group_id, placement
        self._transport = options.get("transport", "unicast")
        self._timeout_s = float(timeout_s)
        kwargs = {"device_id": self._device} if placement == Placement.PROCESS_PER_GPU else {}
        dist.init_process_group(
            backend="nccl" if placement == Placement.PROCESS_PER_GPU else "gloo",
            init_method=f"tcp://{options['master_addr']}:{int(options['master_port'])}",
            rank=rank, world_size=tp, timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
        self._pg = True
        try:
            self._mailbox = (self._symmetric_mailbox() if placement == Placement.PROCESS_PER_GPU
                             else self._ipc_mailbox())
        except BaseException:
            self.close()
            raise
        self._calls = 0
        found = self._check()
        return {"rank": rank, "placement": placement, "device_uuid": _device_uuid(self._device),
                "start_check": dataclasses.asdict(found)}

    def warm_group(self, timeout_s: float = 60.0) -> float:
        """Form and leave a process-per-GPU group of one on this process's
        GPU: an NCCL process group bound to the device and a symmetric-memory
        mailbox of one token, then :meth:`close`. A process's first group
        pays NCCL's and symmetric memory's first use (3.8 s on an H200,
        against 0.03 s for its next group); a pooled worker pays it here, in
        its warm-up. The rendezvous is an in-process store: no port to race
        for. Returns the seconds it took; RuntimeError when the device
        faulted (the worker is then unfit, as after any warm-up that raises)."""
        import torch
        import torch.distributed as dist

        if self._mailbox is not None or self._pg:
            raise RuntimeError(f"rank {self._rank} is in group {self._group_id}; close() first")
        started = time.monotonic()
        self._device = torch.device("cuda", local_device_index())
        torch.cuda.set_device(self._device)
        self._rank, self._tp, self._hidden, self._capacity = 0, 1, WARM_GROUP_HIDDEN, 1
        self._group_id, self._placement = f"warm-{os.getpid()}", Placement.PROCESS_PER_GPU
        self._timeout_s = float(timeout_s)
        dist.init_process_group(backend="nccl", store=dist.HashStore(), rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=self._device)
        self._pg = True
        try:
            self._mailbox = self._symmetric_mailbox()
            self._check()
        finally:
            verdict = self.close()
        if not verdict["reusable"]:
            raise RuntimeError(f"the warm-up's group of one left the device faulted: {verdict['why']}")
        return time.monotonic() - started

    def _symmetric_mailbox(self):
        import torch.distributed as dist

        from kernels.lamport.mailbox import Mailbox

        return Mailbox.symmetric(group=dist.group.WORLD, capacity=self._capacity,
                                 hidden=self._hidden, device=self._device)

    def _ipc_mailbox(self):
        import torch
        import torch.distributed as dist

        from kernels.lamport.mailbox import Mailbox

        shape = mailbox_shape(self._tp, self._capacity, self._hidden)
        buffer = torch.empty(shape, dtype=torch.bfloat16, device=self._device)
        uuid = _device_uuid(self._device)
        mine = exports_for_peers(lambda: export_buffer(buffer, rank=self._rank, device_uuid=uuid),
                                 own_handle(buffer, rank=self._rank, device_uuid=uuid),
                                 self._tp, self._rank)
        gathered: list = [None] * self._tp
        dist.all_gather_object(gathered, mine)
        handles = handles_for(gathered, self._rank)
        check_handles(handles, tp=self._tp, rank=self._rank, device_uuid=uuid, shape=shape)
        ptrs, self._peers = peer_addresses(handles, rank=self._rank, own_ptr=buffer.data_ptr(),
                                           opener=open_buffer, address=lambda t: t.data_ptr())
        box = Mailbox.from_peer_table(rank=self._rank, tp=self._tp, capacity=self._capacity,
                                      hidden=self._hidden, buffer=buffer, peers=ptrs)
        torch.cuda.synchronize(self._device)  # own sentinel fill done ...
        self._barrier()  # ... on every rank before anyone publishes
        return box

    def close(self) -> dict:
        """Release kernels, mailboxes (peer mappings first) and the process
        group, and hand the caching allocator's free blocks back to the
        driver, so that a pooled worker (cluster.pool) is back to its idle
        GPU memory; idempotent. No collective: a peer may be dead. Returns
        ``{"reusable": bool, "why": str}``: not reusable once the device
        reported an error (a sticky CUDA error stays with the context)."""
        import torch

        verdict = {"reusable": True, "why": ""}
        self._ahead.close()
        if self._device is not None and torch.cuda.is_available():
            try:
                torch.cuda.synchronize(self._device)
            except Exception as err:  # noqa: BLE001 (a faulted context must not block close)
                verdict = {"reusable": False, "why": f"{type(err).__name__}: {err}"}
        self._kernels = {}
        for obj in self._measure_cache.values():
            try:
                getattr(obj, "destroy", lambda: None)()
            except Exception:  # noqa: BLE001 (a peer may be gone)
                pass
        self._measure_cache = {}
        self._peers = []
        self._mailbox = None
        if self._pg:
            import torch.distributed as dist

            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass
            self._pg = False
        self._rank = self._group_id = None
        if verdict["reusable"] and self._device is not None:
            settle_heap()  # mailbox handles and graphs in reference cycles
            torch.cuda.ipc_collect()  # exported mailboxes whose importers are gone
            torch.cuda.empty_cache()
        return verdict

    # -- kernels
    def prepare(self, case: Case) -> dict:
        """Build (and compile) the kernels ``case`` needs, before any rank's
        watchdog starts; returns what it took."""
        started = time.monotonic()
        self._op_kernel(case)
        return {"rank": self._rank, "prepare_s": time.monotonic() - started,
                "kernels": len(self._kernels)}

    def _op_kernel(self, case: Case):
        """The op's RankKernel for ``case`` on this rank's mailbox (cached by
        its key)."""
        kind = ops.get(case.op).module().RankKernel
        budget = case.budget_ns
        key = kind.key(case, budget)
        if key not in self._kernels:
            self._kernels[key] = kind(self._own(), hidden=self._hidden, capacity=self._capacity,
                                      transport=self._transport, budget_ns=budget, case=case)
        return self._kernels[key]

    # -- one call
    def plan(self, case: Case) -> None:
        """Start making ``case``'s inputs and reference on the helper thread
        (:mod:`cluster.ahead`): a call planned after the running one
        (``RankActor.run_cases``). Only a call without a fault whose kernel
        is built (the group prepares a batch's kernels before it starts)."""
        if case.fault is None and self._mailbox is not None:
            key = ops.get(case.op).module().RankKernel.key(case, case.budget_ns)
            if key in self._kernels:
                self._ahead.plan(case)

    def _reference_device(self):
        # shared GPU: a reference computed on the GPU waits for this process's
        # time slice among its peers', and took longer than on the CPU there
        return None if self._placement == Placement.SHARED_GPU else self._device

    def _host_work(self, case: Case) -> tuple[dict, dict | None]:
        """``case``'s inputs and, for a collective, this rank's reference
        (on the helper thread; its GPU work on a side stream)."""
        device = self._reference_device()
        with side_stream(device):
            inputs = case_inputs(case, tp=self._tp, hidden=self._hidden,
                                 reference_device=device)
            if not ops.get(case.op).collective:
                return inputs, None
            kernel = self._op_kernel(case)
            return inputs, reference(case, tp=self._tp, hidden=self._hidden, inputs=inputs,
                                     facts=kernel.facts(), rank=self._rank)

    def run_case(self, case: Case) -> dict:
        import torch

        box = self._own()
        spec = ops.get(case.op)
        fault = validate_injection(case.fault) or {"kind": None}
        kind = fault["kind"]
        if kind in UNSUPPORTED_INJECTIONS:
            raise ValueError(f"fault injection {kind!r} is not supported by the gpu backend "
                             f"({UNSUPPORTED_INJECTIONS[kind]})")
        if kind is not None and not spec.collective:
            raise ValueError(f"fault injection {kind!r}: op {spec.name} is not a collective")
        tokens = rank_tokens(case.tokens, case.fault)
        if not 1 <= tokens <= self._capacity:
            raise ValueError(f"tokens must be in 1..capacity={self._capacity}, got {tokens}")
        kernel = self._op_kernel(case)
        clock = PhaseClock()
        made = self._ahead.take(case) if kind is None else None
        inputs, expected = made or (case_inputs(case, tp=self._tp, hidden=self._hidden,
                                                tokens=tokens,
                                                reference_device=self._reference_device()),
                                    None)
        clock.mark("inputs")
        kernel.load(case, inputs, self._rank, self._device)
        seq = int(case.seq)
        if not spec.collective:
            return self._run_local(case, kernel, seq=seq, tokens=tokens, clock=clock)
        expected_stage = self._calls % LAMPORT_GENERATIONS
        self._calls += 1
        box.clear_errors()
        state = box.stage_state
        if kind == "set_next_stage":
            state[NEXT_STAGE] = int(fault["value"])
        if kind == "shift_next_stage":
            state[NEXT_STAGE] = (state[NEXT_STAGE] + int(fault["by"])) % LAMPORT_GENERATIONS
        next_before = int(state[NEXT_STAGE].item())  # synchronizes: inputs are on the device
        clock.mark("load")

        started = time.monotonic_ns()
        if kind == "hang":
            while True:
                time.sleep(1.0)
        if kind == "delay_publish":
            time.sleep(fault["delay_ns"] / 1e9)
        published = kind != "skip_publish"
        consume_from = started
        if kind in SPLIT_FAULTS or not hasattr(kernel, "call"):
            if published:
                kernel.publish()
            if kind == "die_after_publish":
                torch.cuda.synchronize(self._device)
                os._exit(1)
            consume_from = time.monotonic_ns()
            kernel.consume()
        else:
            kernel.call()  # the op's own call: the form a caller gets (one kernel or two)
        torch.cuda.synchronize(self._device)
        done = time.monotonic_ns()
        clock.mark("call")

        errors = box.read_errors()
        outputs = kernel.outputs()
        result = result_fields(errors, seq=seq, tokens=tokens, expected_stage=expected_stage,
                               next_stage_before=next_before, published=published)
        result.update({"mailbox_clean": box.is_all_sentinel(), "outputs": outputs,
                       "publish_ns": consume_from - started, "consume_ns": done - consume_from,
                       "publish_start_ns": started})  # cluster.stragglers
        clock.mark("readback")
        result["check"] = check_outputs(case, tp=self._tp, hidden=self._hidden, outputs=outputs,
                                        facts=kernel.facts(), rank=self._rank,
                                        inputs=inputs if tokens == case.tokens else None,
                                        expected=expected)
        clock.mark("check")
        result["host_ns"] = clock.ns
        return result

    def _run_local(self, case: Case, kernel, *, seq: int, tokens: int,
                   clock: PhaseClock) -> dict:
        """An op that is no collective (the indexer) on this rank's GPU: no
        publish, no stage; the result says the protocol was not touched (in
        step, nothing missing) and carries the op's own check."""
        import torch

        stage = self._calls % LAMPORT_GENERATIONS
        torch.cuda.synchronize(self._device)
        clock.mark("load")
        started = time.monotonic_ns()
        kernel.consume()
        torch.cuda.synchronize(self._device)
        done = time.monotonic_ns()
        clock.mark("call")
        result = {"rank": self._rank, "seq": seq, "tokens": tokens, "expected_stage": stage,
                  "published_stage": stage, "consumed_stage": stage, "bad_stage": None,
                  "missing_sources": [], "partial_sources": [], "headers": [], "records": [],
                  "record_count": 0, "header_mismatch": False,
                  "mailbox_clean": self._own().is_all_sentinel(), "outputs": kernel.outputs(),
                  "publish_ns": 0, "consume_ns": done - started, "collective": False}
        clock.mark("readback")
        result["check"] = kernel.check()
        clock.mark("check")
        result["host_ns"] = clock.ns
        return result

    # -- timing (cluster.measure)
    def time_case(self, spec: dict) -> dict:
        """Time the fused op of ``spec["op"]`` and its baselines on this rank,
        every rank of the group at once (:func:`cluster.measure.timing.time_case`,
        its workload built on this group's mailbox); process per GPU only
        (the baselines need NCCL, and shared-GPU timings are no collective's
        speed). ``spec``: :data:`cluster.measure.workload.SPEC_KEYS` (+ ``hc``,
        ``top_k``; ``budget_ns`` 0: the plain consumer; ``workload``: the
        builder's dotted name, default the op's ``OpSpec.workload``)."""
        import torch

        from cluster.measure.timing import time_case
        from cluster.measure.workload import RankContext

        if self._placement != Placement.PROCESS_PER_GPU:
            raise ValueError(f"timing needs the process-per-gpu placement (NCCL baselines); this "
                             f"group is {self._placement}, whose timings would not be a "
                             f"collective's speed")
        spec = dict(spec)
        workload = spec.pop("workload", None)
        tokens = int(spec.get("tokens", 0))
        if not 1 <= tokens <= self._capacity:
            raise ValueError(f"tokens must be in 1..capacity={self._capacity}, got {tokens}")
        spec["transport"] = self._transport
        ctx = RankContext(rank=self._rank, tp=self._tp, device=self._device,
                          capacity=self._capacity, dist=True, mailbox=self._own(),
                          transport=self._transport, cache=self._measure_cache)
        out = time_case(ctx, spec, workload)
        torch.cuda.synchronize(self._device)
        return out

    # -- recovery
    def recover(self) -> dict:
        """Quiesce (this rank's stream drained: no kernel of it in flight),
        scrub (sentinel, stage state, error buffer), reset the call count,
        then barrier with the group's other ranks (bounded by the setup
        timeout); returns the mailbox as found."""
        import torch

        box = self._own()
        torch.cuda.synchronize(self._device)
        found = self._check()
        box.scrub()
        torch.cuda.synchronize(self._device)
        self._calls = 0
        self._barrier()
        return dataclasses.asdict(found)

    def scrub(self) -> dict:
        import torch

        box = self._own()
        torch.cuda.synchronize(self._device)
        found = self._check()
        if not found.clean:
            box.scrub()
            torch.cuda.synchronize(self._device)
            self._calls = 0
        return dataclasses.asdict(found)

    def state(self) -> dict:
        return {"rank": self._rank, "group_id": self._group_id, "placement": self._placement,
                "calls_since_reset": self._calls, "kernels": sorted(self._kernels, key=str),
                "check": dataclasses.asdict(self._check())}

    # -- helpers
    def _check(self) -> MailboxCheck:
        import torch

        box = self._own()
        non_sentinel = int((box.buffer.view(torch.int16) != SENTINEL_INT16).sum().item())
        active, nxt = (int(v) for v in box.stage_state.tolist()[:2])
        return MailboxCheck(rank=self._rank, non_sentinel=non_sentinel, headers_set=0,
                            stage_state=(active, nxt))

    def _barrier(self) -> None:
        import torch.distributed as dist

        if self._tp == 1:
            return
        if self._placement == Placement.SHARED_GPU:  # gloo: bounded, names the missing ranks
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=self._timeout_s))
        else:
            dist.barrier(device_ids=[self._device.index])

    def _own(self):
        if self._mailbox is None:
            raise RuntimeError("this rank is not set up: call setup() first")
        return self._mailbox


def device_memory(device) -> dict[str, int]:
    """Device memory in bytes as this process sees it: torch's caching
    allocator (``gpu_allocated_bytes``: live tensors, ``gpu_reserved_bytes``:
    held from the driver) and the device's used memory over every process
    (``gpu_device_used_bytes``, cudaMemGetInfo: contexts, loaded modules,
    symmetric-memory and NCCL allocations included)."""
    import torch

    free, total = torch.cuda.mem_get_info(device)
    return {"gpu_allocated_bytes": int(torch.cuda.memory_allocated(device)),
            "gpu_reserved_bytes": int(torch.cuda.memory_reserved(device)),
            "gpu_device_used_bytes": int(total - free)}


def local_device_index() -> int:
    """The CUDA device index, in this process, of the GPU Ray assigned to it:
    0 where Ray narrowed CUDA_VISIBLE_DEVICES to it (shared GPU, tp=1), else
    (:data:`ALL_GPUS_VISIBLE`) the position of Ray's GPU id among the
    visible devices."""
    if os.environ.get(ALL_GPUS_VISIBLE) != "1":
        return 0
    import ray

    ids = [str(i) for i in ray.get_gpu_ids()]
    if len(ids) != 1:
        raise RuntimeError(f"a process-per-GPU rank needs exactly one GPU from Ray, got {ids}")
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if not visible:
        return int(ids[0])
    if ids[0] not in visible:
        raise RuntimeError(f"Ray's GPU id {ids[0]} is not among CUDA_VISIBLE_DEVICES={visible}")
    return visible.index(ids[0])


def _device_uuid(device) -> str:
    import torch

    props = torch.cuda.get_device_properties(device)
    return str(getattr(props, "uuid", "")) or f"cuda:{device.index}"
