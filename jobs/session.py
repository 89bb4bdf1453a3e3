"""The Ray session every job runs in, and the backend it uses.

With no ``--address`` and no ``RAY_ADDRESS`` an embedded local cluster
is started (``num_cpus`` = this machine's cores, no dashboard, loopback
only, token authentication; :mod:`jobs.embedded`) and stopped at the end,
with everything it started, also on SIGTERM/SIGINT or a killed driver; with
either, the job joins that cluster (this is what happens under ``ray job
submit``, which sets ``RAY_ADDRESS``). A Ray already initialised in this
process (tests) is used as it is.

Backend: ``auto`` takes ``gpu`` when the cluster has GPUs and
``cluster.backend.BACKENDS`` has a ``gpu`` backend, else ``emulated``, and
says which and why. Also here: the worker pool a job takes its ranks from
(``--pool``) and :func:`gpu_task`, one bounded Ray GPU task.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from cluster.errors import error_text
from jobs import exits
from jobs.config import ConfigError
from jobs.exits import InfraError

UsageError = ConfigError
"""Bad command lines and configs: exit status 2, nothing written."""


def gpu_task(fn, spec: dict, timeout_s: float, *, gpus: float = 1.0, pool=None,
             node_id: str | None = None) -> tuple[Any, tuple[str, str] | None]:
    """Run ``fn(spec)`` as a Ray task holding ``gpus`` of one GPU (with a
    cluster.pool.WorkerPool: in one of its workers, ``gpus`` of its slot, on
    ``node_id`` when given) and wait at most ``timeout_s``. Returns
    ``(result, None)``, or ``(None, (outcome, reason))``: past the deadline
    the task is cancelled with force (its process ends, and a spinning kernel
    with it; a pooled worker is killed and later replaced) and the outcome
    is ``hang``; an AssertionError raised in the task (a wrong answer) is
    ``fail``; anything else ``error``."""
    import ray
    if pool is not None:
        try:
            return pool.call(fn, spec, share=gpus, node_id=node_id, timeout_s=timeout_s), None
        except (ray.exceptions.GetTimeoutError, TimeoutError) as err:
            return None, ("hang", error_text(err, limit=300))
        except Exception as err:
            kind = "fail" if isinstance(getattr(err, "cause", None), AssertionError) else "error"
            return None, (kind, error_text(err, limit=300))
    ref = ray.remote(num_gpus=gpus, num_cpus=0, max_retries=0)(fn).remote(spec)
    try:
        return ray.get(ref, timeout=timeout_s), None
    except ray.exceptions.GetTimeoutError as err:
        # Only a task still running is cancelled: Ray 2.60 aborts the driver
        # (RAY_CHECK in TaskManager::CompletePendingTask) when a force-cancel
        # meets the reply of a task that has just finished, seen in CI.
        if not ray.wait([ref], timeout=0)[0]:
            try:
                ray.cancel(ref, force=True)
            except Exception:
                pass
        return None, ("hang", error_text(err, limit=300))
    except Exception as err:
        kind = "fail" if isinstance(getattr(err, "cause", None), AssertionError) else "error"
        return None, (kind, error_text(err, limit=300))


@contextlib.contextmanager
def ray_session(address: str | None) -> Iterator[str]:
    """Connect to (or start) Ray for the duration; yields how."""
    import ray
    if ray.is_initialized():
        yield "the Ray session already open in this process"
        return
    _no_auto_connect()
    address = address or os.environ.get("RAY_ADDRESS") or None
    if not address:
        from jobs.embedded import embedded_cluster
        with embedded_cluster(max(2, os.cpu_count() or 2)) as how:
            yield how
        return
    from jobs.embedded import shutdown_ray, terminate_raises
    from jobs.head import recorded_auth
    with recorded_auth(address) as head_token:
        _join(address)
        # The address Ray joined, not the one it was given (Ray rewrites a
        # loopback one to this node's address unless _join kept it).
        how = (f"joined the Ray cluster at {ray.get_runtime_context().gcs_address}"
               + (" (with the token of the head jobs head start recorded)" if head_token else ""))
        try:
            with terminate_raises():
                yield how
        finally:
            shutdown_ray()


@contextlib.contextmanager
def worker_pool(choice: str, backend: str) -> Iterator[Any]:
    """The cluster.pool.WorkerPool the jobs take their ranks from, per
    ``--pool``: ``job`` a pool of this run's own (its workers killed when
    the block ends), ``off`` None (every group starts its own actors), else
    the standing pool of that name (left running). UsageError when that
    pool is not there or runs another backend."""
    if choice == "off":
        yield None
        return
    from cluster.pool import WorkerPool
    if choice == "job":
        pool = WorkerPool.for_job(backend)
        try:
            yield pool
        finally:
            pool.close()
        return
    try:
        pool = WorkerPool.attach(choice)
    except ValueError as err:
        raise UsageError(f"--pool {choice}: {err}") from None
    if pool.backend != backend:
        raise UsageError(f"--pool {choice}: that pool runs the {pool.backend} backend, this "
                         f"run the {backend} backend")
    yield pool


JOIN_PROBE_S = 10.0
"""How long a join waits for the GCS address to take a TCP connection
before it gives up (exit 3); ``ray.init`` alone retries for minutes."""
JOIN_TIMEOUT_S = 120.0
"""How long the whole join (every ``ray.init`` attempt) may take once the
GCS port answered: one that answers but never takes the driver (no Ray
GCS there) keeps ``ray.init`` in Ray's C++ client for ever, which no
exception interrupts, so the process then ends with one line and exit 3."""


def check_address(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a cluster address ``HOST:PORT`` (``ray://`` and
    ``[V6]`` forms too), None for ``auto``; UsageError (exit 2) naming it
    otherwise, a port outside 1..65535 included."""
    from ray._private.services import parse_address
    if address == "auto":
        return None
    try:
        parsed = parse_address(address.removeprefix("ray://"))
        host, port = parsed[0].strip("[]"), int(parsed[1])
    except (TypeError, ValueError):
        parsed = None
    if parsed is None or not host or not 0 < port < 65536:
        raise UsageError(f"--address {address!r}: give the GCS address HOST:PORT "
                         f"(e.g. 10.0.0.1:6379) or 'auto'")
    return host, port


def _join(address: str) -> None:
    """``ray.init(address=...)``: a malformed address is a UsageError (exit
    2); a GCS that takes no connection within ``JOIN_PROBE_S``, a
    ``ray.init`` that fails ``jobs.embedded.START_ATTEMPTS`` times, or a
    join not done within ``JOIN_TIMEOUT_S``, exit 3 naming the address. A
    loopback address (a ``jobs head start`` head) is joined with Ray's
    loopback switch (``jobs.embedded.LOOPBACK_ENV``), without which Ray
    rewrites it to this node's routable address, where such a head does
    not listen."""
    import ipaddress
    import socket

    import ray

    from jobs.embedded import LOOPBACK_ENV, cluster_environment, init_with_retry
    loopback = False
    where = check_address(address)
    if where is not None:
        host, port = where
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            pass
        deadline, last = time.monotonic() + JOIN_PROBE_S, None
        while True:
            try:
                socket.create_connection((host, port), timeout=2.0).close()
                break
            except OSError as err:
                last = err
            if time.monotonic() > deadline:
                raise InfraError(f"nothing answers at the Ray cluster address {address} "
                                 f"(tried for {JOIN_PROBE_S:g} s: {last}); is its head up?")
            time.sleep(1.0)

    def give_up() -> None:
        os.write(2, f"python -m jobs: infrastructure: the Ray cluster at {address} did not "
                    f"take this driver within {JOIN_TIMEOUT_S:g} s; is a Ray GCS of this "
                    f"version ({ray.__version__}) there, and its token this side's?\n".encode())
        os._exit(exits.INFRA)

    timer = threading.Timer(JOIN_TIMEOUT_S, give_up)
    timer.daemon = True
    with cluster_environment(LOOPBACK_ENV) if loopback else contextlib.nullcontext():
        timer.start()
        try:
            init_with_retry(lambda: ray.init(address=address, log_to_driver=False,
                                             configure_logging=False),
                            what=f"could not join the Ray cluster at {address}",
                            between=ray.shutdown)
        finally:
            timer.cancel()


def _no_auto_connect() -> None:
    """A Ray call after ``ray.shutdown`` (a TP group's thread still ending
    when a job is interrupted) raises instead of ``ray.init()``-ing a new
    cluster in the background (Ray's auto-connect; a job only ever joins the
    cluster it was given)."""
    from ray._private import auto_init_hook
    auto_init_hook.enable_auto_connect = False


def cluster_gpus() -> tuple[int, int]:
    """(GPUs in the cluster, most GPUs on one node)."""
    import ray
    per_node = [int(n.get("Resources", {}).get("GPU", 0)) for n in ray.nodes() if n.get("Alive")]
    return sum(per_node), max(per_node, default=0)


def check_backend_request(requested: str) -> None:
    """Reject a backend that cannot exist here before anything starts."""
    from cluster.backend import BACKENDS
    if requested not in ("auto", "gpu", "emulated"):
        raise UsageError(f"--backend {requested!r}: choose auto, gpu or emulated")
    if requested == "gpu" and "gpu" not in BACKENDS:
        raise UsageError(f"--backend gpu: no 'gpu' backend is registered in "
                         f"cluster.backend.BACKENDS (registered: {sorted(BACKENDS)})")


def resolve_backend(requested: str) -> tuple[str, str]:
    """(backend, why) once Ray is up."""
    from cluster.backend import BACKENDS
    check_backend_request(requested)
    total, _ = cluster_gpus()
    if requested == "gpu":
        if not total:
            raise UsageError("--backend gpu: the Ray cluster has no GPU resources")
        return "gpu", f"gpu (requested; {total} GPU(s) in the cluster)"
    if requested == "emulated":
        return "emulated", "emulated (requested): the Lamport protocol in numpy on CPU actors"
    if total and "gpu" in BACKENDS:
        return "gpu", f"gpu (auto: {total} GPU(s) in the cluster)"
    why = ("no GPU in the cluster" if not total
           else f"{total} GPU(s) but no 'gpu' backend registered in cluster.backend")
    return "emulated", f"emulated (auto: {why}): the Lamport protocol in numpy on CPU actors"
