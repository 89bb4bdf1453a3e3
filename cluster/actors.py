"""RankActor: one rank of a TP group, a thin executor around a RankBackend.

Resources: declared ``num_cpus=0`` (a spinning rank must not hold a whole
logical CPU: on a 2-core host the third rank would never be scheduled);
the caller decides ``num_gpus`` (whole or fractional) and the placement
bundle through ``RankActor.options(...)``. ``max_restarts=0``: a restarted
member cannot rejoin its group's rendezvous, so the TP group, not Ray,
restarts ranks (cluster.group rebuilds the whole group).

The constructor only records metadata (and, for a GPU backend, pins the
device); joining the group is :meth:`setup_group`, so an actor that is
(re)started never blocks in a rendezvous. :meth:`close` leaves the group and
keeps the process (its imports, CUDA context and compiled kernels) for the
next :meth:`setup_group`: a pooled worker (cluster.pool) serves group after
group, or runs a whole task in-process (:meth:`run_function`: virtual ranks).
"""

from __future__ import annotations

import gc
import os
import socket
import time
from typing import TYPE_CHECKING

import ray

from cluster.backend import make_backend, require_backend
from cluster.backend import release_rank as backend_release
from cluster.procs import one_at_a_time, settle_heap, started_at

if TYPE_CHECKING:
    from cluster.cases import Case

CONTEXT_TURN_TIMEOUT_S = 60.0
"""Longest a warm-up waits for its turn to make its CUDA context (then it goes ahead)."""


@ray.remote(num_cpus=0, max_restarts=0)
class RankActor:
    def __init__(self, backend: str) -> None:
        self._backend_name = require_backend(backend)
        self._backend = None
        self._tracer = None
        ctx = ray.get_runtime_context()
        self._metadata = {"backend": backend, "node_id": ctx.get_node_id(),
                          "node_ip": ray.util.get_node_ip_address(),
                          "hostname": socket.gethostname(), "pid": os.getpid(),
                          "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}
        self._started_unix = time.time()
        born = started_at(os.getpid())
        self._spawn_s = None if born is None else max(0.0, self._started_unix - born)
        """From this process's start to the actor's construction (Ray's
        worker start: its imports, the actor class fetched)."""
        self._served = 0
        """Groups joined and tasks run by this process (cluster.pool: reuse)."""
        self._warm = None
        """:meth:`warm`'s figures, once it ran."""

    def metadata(self) -> dict:
        """Node id and IP, hostname, pid, Ray's GPU ids, backend name."""
        return dict(self._metadata)

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's IP and a free TCP port, for the group's torch.distributed
        rendezvous when this actor is rank 0 (Ray Train's MASTER_ADDR/PORT).
        The port is free when picked; the group uses it at once."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return self._metadata["node_ip"], port

    def setup_group(self, *, group_id: str, rank: int, tp: int, capacity: int, hidden: int,
                    timeout_s: float, options: dict | None = None) -> dict:
        """Join the group (see RankBackend.setup); returns the backend's setup
        dict plus this actor's metadata."""
        if self._backend is not None:
            raise RuntimeError(f"actor pid {os.getpid()} already joined a group; close() first")
        backend = make_backend(self._backend_name)
        kwargs = {} if options is None else {"options": options}
        out = backend.setup(group_id=group_id, rank=rank, tp=tp, capacity=capacity,
                            hidden=hidden, timeout_s=timeout_s, **kwargs)
        self._backend = backend
        self._shape = {"tp": tp, "hidden": hidden}
        self._served += 1
        return {**out, "metadata": self.metadata()}

    def warm(self) -> dict:
        """Pay this process's one-time costs now (a pooled worker, while the
        driver does other work): the backend's imports and, on a GPU, the
        CUDA context on this rank's device, the kernel DSL's import and a
        first group (NCCL, symmetric memory).
        Returns the seconds each took (``imports_s``; on a GPU ``dsl_s``, the
        DSL's import, ``cuda_s``, the context, made one process at a time
        on a GPU, ``cuda_wait_s``, the wait for that turn, and ``group_s``,
        a group of one formed and left: the backend's ``warm_group``);
        ``ready_s``: from the
        actor's construction to the end of its warm-up; ``spawn_s``: from the
        process's start to the actor's construction) and the metadata; the
        figures stay in :meth:`stats` (``warm``)."""
        timings = {}
        t0 = time.monotonic()
        backend = make_backend(self._backend_name)
        timings["imports_s"] = time.monotonic() - t0
        if self._metadata["gpu_ids"]:
            t0 = time.monotonic()
            import cutlass  # noqa: F401 (the DSL: seconds of import, once)
            import torch

            from cluster.gpu.rank import local_device_index
            timings["dsl_s"] = time.monotonic() - t0
            # One context at a time on a GPU: sixteen made at once on an H200
            # took 1.27 s each (median) and the first was ready 4.3 s after
            # their start; made in turn, 0.20 s each and the first ready at
            # 3.8 s (scripts/gpu/context_probe.py --turns).
            with one_at_a_time(f"cuda-context-gpu{self._metadata['gpu_ids'][0]}",
                               timeout_s=CONTEXT_TURN_TIMEOUT_S) as waited:
                t0 = time.monotonic()
                torch.cuda.set_device(local_device_index())
                torch.cuda.synchronize()
                timings["cuda_s"] = time.monotonic() - t0
            timings["cuda_wait_s"] = waited
        if hasattr(backend, "warm_group"):
            timings["group_s"] = backend.warm_group()
        settle_heap()  # the imports, frozen: a group's collection walks only what it made
        timings["ready_s"] = time.time() - self._started_unix
        if self._spawn_s is not None:
            timings["spawn_s"] = self._spawn_s
        self._warm = {k: round(v, 3) for k, v in timings.items()}
        return {**timings, "metadata": self.metadata()}

    def run_function(self, fn, spec: dict):
        """``fn(spec)`` in this process, outside any group (the virtual-rank
        form of a group: tp ranks in one process); afterwards the process
        must be as reusable as after :meth:`close` (``stats`` tells)."""
        if self._backend is not None:
            raise RuntimeError(f"actor pid {os.getpid()} is in a group; close() first")
        self._served += 1
        try:
            return fn(spec)
        finally:
            if self._metadata["gpu_ids"]:
                import torch
                settle_heap()
                torch.cuda.empty_cache()

    def stats(self) -> dict:
        """What a pooled worker holds: pid, age, groups served, its warm-up's
        figures (``warm``: :meth:`warm`'s, None before), how many objects
        its heap holds frozen (``gc_frozen``: cluster.procs.settle_heap), open
        file descriptors (all, and by kind: cluster.procs.open_files), resident
        memory and, on a GPU, its device memory (torch: allocated and reserved; NVML: the
        process's whole use, context and modules included), in bytes."""
        from cluster.procs import open_files, process_memory
        out = {**self.metadata(), "age_s": time.time() - self._started_unix,
               "served": self._served, "in_group": self._backend is not None,
               "warm": self._warm, "gc_frozen": gc.get_freeze_count(),
               **open_files(), "rss_bytes": process_memory(os.getpid())}
        if self._metadata["gpu_ids"]:
            import torch

            from cluster.gpu.rank import device_memory
            out.update(device_memory(torch.cuda.current_device()))
        return out

    def prepare(self, case: Case) -> dict:
        return self._joined().prepare(case)

    def run_case(self, case: Case, payload=None) -> dict:
        """One call (RankBackend.run_case); ``payload``: what the backend's
        host half made for this rank (cluster.backend; None: no host half)."""
        args = (case,) if payload is None else (case, payload)
        if self._tracer is None:
            return self._joined().run_case(*args)
        with self._tracer.call(case.seq):
            return self._joined().run_case(*args)

    def trace_start(self) -> None:
        """Start torch.profiler for the calls that follow (cluster.tracing):
        CPU activities, and CUDA ones where this rank has a GPU."""
        from cluster.tracing import RankTracer
        cuda = bool(self._metadata["gpu_ids"])
        self._tracer = RankTracer(cuda=cuda)
        self._tracer.start()

    def trace_stop(self) -> dict:
        """This rank's trace since :meth:`trace_start` (Chrome JSON as a dict)."""
        tracer, self._tracer = self._tracer, None
        if tracer is None:
            raise RuntimeError(f"actor pid {os.getpid()}: trace_stop without trace_start")
        return tracer.stop()

    def run_cases(self, batch: list[Case], barrier=None, key: str = "", payloads=None):
        """A batch of calls in one Ray call, streamed (a generator method:
        the caller gets each result as its call ends). Each result carries
        its ``check`` (cluster.cases.check_outputs, made here unless the
        backend made it), so checking runs on the ranks in parallel. Between
        two calls every rank meets at ``barrier`` (cluster.barrier, key
        ``key/<call index>``; None for a group of one). Stops after the first
        result that is not clean on this rank (:func:`cluster.backend.rank_clean`,
        aborting the barrier so every rank stops there too): the group
        recovers before anything else runs. A raised exception ends the
        stream. A backend with ``plan(case)`` is told each call before the
        one it is running, to make its host work meanwhile (cluster.ahead).
        ``payloads``: per call, what the backend's host half made for this
        rank (None: no host half); such a result carries no ``outputs``, and
        the driver checks it (cluster.emulated.host)."""
        from cluster.backend import rank_clean
        from cluster.cases import check_outputs
        plan = getattr(self._joined(), "plan", None)
        tp = self._shape["tp"]
        for i, case in enumerate(batch):
            if i and barrier is not None and \
                    not ray.get(barrier.arrive.remote(f"{key}/{i - 1}", tp)):
                return  # a peer's call i - 1 was not clean
            if plan is not None:
                for ahead in batch[i:i + 2]:
                    plan(ahead)
            try:
                # through the tracer's call range, if tracing
                result = self.run_case(case, None if payloads is None else payloads[i])
            except BaseException:
                if barrier is not None and i + 1 < len(batch):
                    barrier.abort.remote(f"{key}/{i}")
                raise
            if result.get("check") is None and "outputs" in result:
                result["check"] = check_outputs(case, outputs=result["outputs"],
                                                rank=result["rank"], **self._shape)
            clean = rank_clean(result)
            if not clean and barrier is not None and i + 1 < len(batch):
                barrier.abort.remote(f"{key}/{i}")
            yield result
            if not clean:
                return

    def time_case(self, spec: dict) -> dict:
        backend = self._joined()
        if not hasattr(backend, "time_case"):
            raise ValueError(f"the {self._backend_name} backend has no timed call")
        return backend.time_case(spec)

    def recover(self) -> dict:
        return self._joined().recover()

    def scrub(self) -> dict:
        return self._joined().scrub()

    def state(self) -> dict:
        return self._joined().state()

    def close(self) -> dict:
        """Leave the group and release the mailbox; idempotent. Returns
        ``{"reusable": bool, "why": str}`` (cluster.backend): whether this
        process may serve another group."""
        self._tracer = None
        backend, self._backend = self._backend, None
        if backend is None:
            return {"reusable": True, "why": ""}
        try:
            return backend.close() or {"reusable": True, "why": ""}
        except Exception as err:  # noqa: BLE001 - a close that raised leaves unknown state
            return {"reusable": False, "why": f"close raised {type(err).__name__}: {err}"}

    def _joined(self):
        if self._backend is None:
            raise RuntimeError(f"actor pid {os.getpid()} has not joined a group: call setup_group first")
        return self._backend


@ray.remote(num_cpus=0, max_retries=0)
def release_rank(backend: str, group_id: str, rank: int) -> None:
    """Run on a dead rank's node (its placement bundle): free what it left."""
    backend_release(backend, group_id=group_id, rank=rank)
