"""The harness every job runs in (the nccl-tests shape): a job supplies its
cases and runs them; the harness owns the Ray session, the backend and
placement choice, the results rows (one appended as each case ends, every
failing one with its one-command repro), the fixed-width table, the
progress bar and the failure count.

Ray: with no ``--address`` and no ``RAY_ADDRESS`` an embedded local cluster
is started (``num_cpus`` = this machine's cores, no dashboard, loopback
only, token authentication; :mod:`jobs.embedded`) and stopped at the end,
with everything it started, also on SIGTERM/SIGINT or a killed driver; with either, the job joins that cluster (this is what happens
under ``ray job submit``, which sets ``RAY_ADDRESS``). A Ray already
initialised in this process (tests) is used as it is.

Backend: ``auto`` takes ``gpu`` when the cluster has GPUs and
``cluster.backend.BACKENDS`` has a ``gpu`` backend, else ``emulated``, and
says which and why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cluster.placement import Placement
from jobs import exits
from jobs.config import AUTO, Case, ConfigError, Suite
from jobs.exits import InfraError
from jobs.options import check_groups_per_gpu
from jobs.table import Col, Table, job_col, op_col

UsageError = ConfigError
"""Bad command lines and configs: exit status 2, nothing written."""

FAILING = ("fail", "hang", "error")

COLUMNS = [job_col(), op_col(), Col("tp", 3, "d"), Col("hidden", 6, "d"),
           Col("M", 4, "d"), Col("placement", 15), Col("inputs/fault", 22), Col("n", 3, "d"),
           Col("#wrong", 7, "d"), Col("max_ulp", 7, ".0f"), Col("median_us", 9, ".2f"),
           Col("p99_us", 9, ".2f"), Col("result", 7), Col("note", 48)]


def error_text(err: BaseException, limit: int = 400) -> str:
    """``Type: message`` of the root cause (a RayTaskError's ``cause``, not
    Ray's wrapper with its traceback header), on one line, at most ``limit``
    characters."""
    cause = getattr(err, "cause", None) or err
    text = " ".join(f"{type(cause).__name__}: {cause}".split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


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


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


# --------------------------------------------------------------------- Ray
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
    from jobs.embedded import terminate_raises
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
            ray.shutdown()


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

    from jobs.embedded import LOOPBACK_ENV, _environment, init_with_retry
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
    with _environment(LOOPBACK_ENV) if loopback else contextlib.nullcontext():
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


@dataclasses.dataclass(frozen=True)
class PlacementOffer:
    """A placement the cluster offers a case, with the GPU share it holds."""
    name: Placement
    gpus_per_rank: float
    """Of one GPU, per rank actor; virtual ranks: the one task's share."""
    collective_speed: bool
    """False where timings cannot be a collective's speed (docs/design.md, Placements and transports:
    virtual ranks and shared-GPU placements land every peer store in one
    GPU's L2; emulated ranks are numpy)."""

    def units(self, tp: int) -> float:
        """What a group of ``tp`` ranks here holds on its node while it runs
        (cluster.fanout): its GPUs (emulated: tp units of ``EMULATED_GPU``)."""
        if self.name == Placement.EMULATED:
            return float(tp)
        return self.gpus_per_rank * (1 if self.name == Placement.VIRTUAL_RANKS else tp)


class ClusterView:
    """What the jobs need to know about the cluster: the backend, the
    topology (``cluster.topology.discover_cluster()`` when that module
    exists; else Ray's GPU counts) and so where a case's ranks can go.

    ``groups_per_gpu``: how many one-GPU groups (shared GPU, virtual ranks)
    may share one GPU at once; each then holds ``1 / groups_per_gpu`` of it
    (Ray's fractional GPUs; their kernels time-slice, so correctness only:
    no such placement's timing is a collective's speed anyway). Process per
    GPU always holds whole GPUs."""

    def __init__(self, backend: str, *, groups_per_gpu: int = 1) -> None:
        check_groups_per_gpu(groups_per_gpu)
        self.backend = backend
        self.groups_per_gpu = groups_per_gpu
        self.pool = None
        """The cluster.pool.WorkerPool the jobs take their ranks from (None:
        every group starts actors of its own; set by the driver)."""
        self.topology = None
        self.topology_error = None
        _, self.gpus_per_node = cluster_gpus()
        try:
            from cluster.topology import discover_cluster
        except ImportError as err:
            self.topology_error = f"cluster.topology unavailable: {err}"
        else:
            try:
                self.topology = discover_cluster()
            except Exception as err:  # a topology we cannot read is not a reason to stop
                self.topology_error = f"topology discovery failed: {type(err).__name__}: {err}"

    def columns(self) -> dict[str, Any]:
        """nodes, gpu_count, topology, multicast_supported for every row."""
        import ray
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        cols: dict[str, Any] = {"nodes": len(nodes), "gpu_count": self.gpus_per_node}
        if self.topology is not None:
            summary = self.topology.summary()
            cols["topology"] = self.topology.to_json()
            cols["multicast_supported"] = (False if self.backend == "emulated"
                                           else summary.get("multicast_supported"))
            if summary.get("gpu_models"):
                cols["gpu_model"] = ",".join(summary["gpu_models"])
        else:
            cpus = int(sum(n.get("Resources", {}).get("CPU", 0) for n in nodes))
            cols["topology"] = json.dumps({"backend": self.backend, "nodes": len(nodes),
                                           "cpus": cpus, "gpus_per_node": self.gpus_per_node,
                                           "note": self.topology_error})
            cols["multicast_supported"] = False if self.backend == "emulated" else None
        return cols

    def describe(self) -> str:
        if self.topology is None:
            return f"{self.gpus_per_node} GPU(s) on the largest node ({self.topology_error})"
        layouts = [lay.name for lay in self.topology.plan() if lay.groups]
        return (f"{self.topology.gpu_count} GPU(s); layouts offered: "
                f"{', '.join(layouts) or 'none'}")

    def offered(self, case: Case) -> list[PlacementOffer] | str:
        """Every placement this cluster offers ``case`` (its own, or for
        ``auto`` each one that fits, best first), or why there is none."""
        if self.backend == "emulated":
            if case.placement not in (AUTO, Placement.EMULATED):
                return f"placement {case.placement} needs the gpu backend; this run is emulated"
            return [PlacementOffer(Placement.EMULATED, 0.0, False)]
        if case.placement == Placement.EMULATED:
            return "placement emulated is not run on the gpu backend"
        if case.placement == Placement.VIRTUAL_RANKS:
            if case.job != "correctness":
                return (f"placement virtual-ranks runs the correctness job only (one process, "
                        f"kernels VirtualRanks); {case.job} needs rank actors")
            if not self.gpus_per_node:
                return "no GPU to place the virtual ranks on"
            return [PlacementOffer(Placement.VIRTUAL_RANKS, 1.0 / self.groups_per_gpu, False)]
        wanted = ([Placement.PROCESS_PER_GPU, Placement.SHARED_GPU] if case.placement == AUTO
                  else [Placement(case.placement)])
        found, reasons = [], []
        for name in wanted:
            if name == Placement.SHARED_GPU and case.tp == 1:
                continue
            why = self._fits(name, case.tp)
            if why is None:
                own = name == Placement.PROCESS_PER_GPU
                found.append(PlacementOffer(
                    name, 1.0 if own else 1.0 / (case.tp * self.groups_per_gpu), own))
            else:
                reasons.append(why)
        return found or "; ".join(reasons) or f"no placement for tp={case.tp}"

    def _fits(self, name: Placement, tp: int) -> str | None:
        if self.topology is not None:
            try:
                layout = self.topology.layout(tp, name)
            except ValueError as err:
                return str(err)
            return None if layout.groups else "; ".join(s.reason for s in layout.skipped)
        if name == Placement.PROCESS_PER_GPU and tp > self.gpus_per_node:
            return (f"tp={tp} process-per-gpu needs {tp} GPUs on one node; the largest node "
                    f"has {self.gpus_per_node}")
        if not self.gpus_per_node:
            return "no GPU to place ranks on"
        return None

    def resolve(self, case: Case) -> PlacementOffer | str:
        """The placement ``case`` runs with (the best for ``auto``)."""
        found = self.offered(case)
        return found if isinstance(found, str) else found[0]

    def concretize(self, cases: list[Case], *, every: bool,
                   wanted: tuple[str, ...] | None = None) -> list[Case]:
        """``auto`` cases as concrete placements: each offered one
        (``every``: the nightly's "every topology"; for the profile job
        every one with a collective's speed, else the best) or the best, among
        ``wanted`` when given (``--placement``); a case nothing can host
        stays ``auto`` (its job records why). Cases whose placement is not
        wanted are dropped."""
        out = []
        for case in cases:
            if case.placement != AUTO:
                if wanted is None or case.placement in wanted:
                    out.append(case)
                continue
            found = self.offered(case)
            if isinstance(found, str):
                out.append(case)
                continue
            found = [p for p in found if wanted is None or p.name in wanted]
            chosen = found if every else found[:1]
            if every and case.job == "profile":
                # Only a placement with a collective's speed gives a timing; another one
                # is kept only when nothing better fits (its row then says why it is skipped).
                chosen = [p for p in chosen if p.collective_speed] or chosen[:1]
            for p in chosen:
                out.append(dataclasses.replace(case, placement=p.name))
        return out


# --------------------------------------------------------------------- rows
def done_in_run(results: Path, run_id: str) -> tuple[set[str], set[tuple[str, str]]]:
    """What run ``run_id`` already holds: the keys of its completed cases
    (:meth:`jobs.config.Case.key`, from ``extra.case_key``) and the
    ``(suite, job)`` pairs it has rows of (the self-check and compile check
    have no cases)."""
    import json

    from jobs.results import read_results
    table = read_results(results, filters={"run_id": run_id}, columns=["suite", "job", "extra"])
    keys = set()
    for extra in table.column("extra").to_pylist():
        key = json.loads(extra or "{}").get("case_key")
        if key:
            keys.add(key)
    return keys, set(zip(table.column("suite").to_pylist(), table.column("job").to_pylist()))


def case_seed(case: Case, repeat: int = 0) -> int:
    """A seed that depends on the case, not on its position in a sweep, so a
    filtered re-run (the repro command) sees the same data."""
    return zlib.crc32(f"{case.op}/{case.tp}/{case.hidden}/{case.tokens}/{case.inputs}/"
                      f"{case.fault}/{repeat}".encode()) & 0x7FFFFFFF


def repro_command(case: Case, suite: Suite, backend: str, placement: str | None = None) -> str:
    """One command that reruns exactly ``case`` (every filter of its
    identity; ``placement`` where the run resolved ``auto``)."""
    parts = ["python -m jobs", case.job, suite.source, "--backend", backend,
             "--ops", case.op, "--tp", str(case.tp), "--hidden", str(case.hidden),
             "--tokens", str(case.tokens), "--variant", case.variant,
             "--transport", case.transport, "--placement", str(placement or case.placement)]
    if case.top_k is not None:
        parts += ["--top-k", str(case.top_k)]
    if case.hc is not None:
        parts += ["--hc", str(case.hc)]
    if case.op_args:
        parts += ["--op-args", ",".join(f"{k}={str(v).lower()}" for k, v in case.op_args)]
    if case.inputs:
        parts += ["--inputs", case.inputs]
    if case.fault:
        parts += ["--faults", case.fault]
    return " ".join(parts)


def closing_line(entry: dict) -> str:
    """``12.3 s, 40 cases, overhead 3.1x wall / summed case compute time
    (0.40 s), peak 3 groups at once`` from a :attr:`Run.accounting` entry."""
    parts = [f"{entry['wall_s']:.1f} s", f"{entry['cases']} case(s)"]
    if entry.get("interrupted"):
        parts[1] += " before it was interrupted"
    if entry.get("overhead") is not None:
        parts.append(f"service overhead {entry['overhead']:.1f}x = wall / {entry['work']} "
                     f"({entry['work_s']:.2f} s)")
    else:
        parts.append("service overhead n/a (no timed work)")
    if entry.get("peak_groups"):
        parts.append(f"peak {entry['peak_groups']} group(s) at once")
    if entry.get("build_s"):
        parts.append(f"group builds {entry['build_s']:.1f} s")
    if entry.get("prepare_s"):
        parts.append(f"kernel preparation {entry['prepare_s']:.1f} s")
    if entry.get("rebuilt_cases"):
        parts.append(f"{entry['rebuilt_cases']} case(s) rebuilt their group "
                     f"({entry['rebuilt_s']:.1f} s of case time)")
    if entry.get("phases_s"):
        from cluster.phases import describe
        parts.append(f"host time in cases, slowest rank: {describe(entry['phases_s'])}")
    return ", ".join(parts)


class _BarOut:
    """Table output that does not tear a progress bar on the same terminal."""

    def __init__(self, bar):
        self._bar = bar
        self._pending = ""

    def write(self, text: str) -> None:
        self._pending += text
        while "\n" in self._pending:
            line, self._pending = self._pending.split("\n", 1)
            self._bar.write(line, file=sys.stdout)

    def flush(self) -> None:
        sys.stdout.flush()


class Run:
    """One invocation's results: a writer per suite sharing one run id, the
    environment columns, the table, the counts, the failing rows."""

    def __init__(self, *, results: Path | None, trigger: str, run_id: str | None = None,
                 backend: str = "emulated", environment: dict | None = None) -> None:
        from jobs.results import new_run_id
        self.results = results
        self.trigger = trigger
        from cluster.group import RUN_TAG_ENV
        self.run_id = run_id or new_run_id()
        os.environ[RUN_TAG_ENV] = self.run_id  # names the run's mailbox segments
        self.backend = backend
        self.environment = dict(environment or {})
        self.counts: Counter[str] = Counter()
        self.failing: list[dict] = []
        self.rows_written = 0
        self.finished = False
        """Set by :meth:`finish` (the manifest says ``finished``)."""
        self.stopped_by: str | None = None
        """The signal :meth:`interrupted` handled (once)."""
        self._beat = 0.0
        if results is not None:
            from jobs.results import runs
            runs.begin(results, self.run_id, trigger=trigger, facts=self.environment)
        self._writers: dict[str, Any] = {}
        self._table: Table | None = None
        self._bar = None
        self._lock = threading.RLock()  # groups run at once (cluster.fanout) and record here
        self._section: dict | None = None
        self._tags = threading.local()
        self.accounting: list[dict] = []
        """Per job section: wall_s, work_s (timed GPU work, or on the emulated
        backend the summed case compute time), overhead (wall / work), cases,
        peak_groups, build_s (group builds: :meth:`add_build`, summed over
        groups), prepare_s (kernel preparation: :meth:`add_prepare`,
        summed over groups), and where cases rebuilt their group (a rank killed:
        ``extra.rebuilt``) rebuilt_cases and their summed time rebuilt_s;
        phases_s: the cases' host time by phase (:meth:`add_phases`);
        also appended to the run's manifest as each section ends
        (``accounting``)."""
        self._skips: dict[str, list] = {}
        """A section's skip reasons: reason -> [footnote mark, cases]."""
        self.stopping = threading.Event()
        """Set when a job section ends by an exception (SIGINT's or SIGTERM's
        ``jobs.exits.Interrupted``): the cases its TP-group threads still finish are not
        recorded (cut short, they are run again by ``--resume``)."""

    def writer(self, suite: str):
        from jobs.results import ResultsWriter
        if self.results is None:
            return None
        if suite not in self._writers:
            self._writers[suite] = ResultsWriter(self.results, suite=suite, run_id=self.run_id,
                                                 trigger=self.trigger)
        return self._writers[suite]

    @contextlib.contextmanager
    def section(self, title: str, total: int) -> Iterator[None]:
        """A job's part of the run: a heading, a fresh table, progress with
        an ETA on stderr (a tqdm bar on a terminal, else a plain line every
        10% of the cases), and a closing line with the wall time and the
        service overhead (wall / timed work, :meth:`add_work`)."""
        from tqdm import tqdm
        print(f"\n== {title} ==", flush=True)
        t0 = time.monotonic()
        job = title.split(":", 1)[0]
        self._section = {"job": job, "t0": t0, "total": total, "done": 0, "work_s": 0.0,
                         "work_kind": None, "peak_groups": None, "next_line": 0.1,
                         "rebuilt_cases": 0, "rebuilt_s": 0.0, "build_s": 0.0,
                         "prepare_s": 0.0, "phases_s": {}}
        self._bar = tqdm(total=total, file=sys.stderr, leave=False, unit="case",
                         disable=not sys.stderr.isatty() or total < 2, dynamic_ncols=True)
        self._table = Table(COLUMNS, out=None if self._bar.disable else _BarOut(self._bar))
        self._skips = {}
        interrupted = False
        try:
            yield
        except BaseException:
            interrupted = True
            self.stop()
            raise
        finally:
            self._bar.close()
            self._bar = None
            if self._skips:
                print("   skipped, by reason:")
                for reason, (mark, n) in self._skips.items():
                    print(f"   [{mark}] {n} case(s): {reason}")
            sec, self._section = self._section, None
            wall = time.monotonic() - t0
            entry = {"job": job, "wall_s": round(wall, 3), "cases": sec["done"],
                     "work_s": round(sec["work_s"], 6), "work": sec["work_kind"],
                     "overhead": round(wall / sec["work_s"], 2) if sec["work_s"] > 0 else None,
                     "peak_groups": sec["peak_groups"]}
            if interrupted:
                entry["interrupted"] = True
            if sec["rebuilt_cases"]:
                entry.update(rebuilt_cases=sec["rebuilt_cases"],
                             rebuilt_s=round(sec["rebuilt_s"], 3))
            for key in ("build_s", "prepare_s"):
                if sec[key] > 0:
                    entry[key] = round(sec[key], 3)
            if sec["phases_s"]:
                from cluster.phases import rounded
                entry["phases_s"] = rounded(sec["phases_s"], 3)
            self.accounting.append(entry)
            if self.results is not None:
                from jobs.results import runs
                runs.add_accounting(self.results, self.run_id, entry)
            print(f"   ({closing_line(entry)})", flush=True)

    def stop(self) -> None:
        """Record no further row (:attr:`stopping`); a row being written now
        completes, and counts."""
        with self._lock:
            self.stopping.set()

    def add_work(self, seconds: float, kind: str) -> None:
        """Add timed work to the current job's overhead figure; ``kind``
        says what was timed (e.g. ``GPU kernel time`` or, on the emulated
        backend, ``summed case compute time``)."""
        with self._lock:
            if self._section is not None and seconds > 0:
                self._section["work_s"] += seconds
                self._section["work_kind"] = kind

    def add_group(self, group, kind: str) -> None:
        """A TP group's share of the current job's accounting as it closes:
        its timed work (:meth:`add_work`), its builds (``TPGroup.build_s``),
        its kernel preparation time
        (``TPGroup.prepare_s``: compiling, or loading from the compile cache,
        what its cases needed) and its cases' host time by phase
        (``TPGroup.phases_s``)."""
        self.add_work(group.work_s, kind)
        self.add_build(group.build_s)
        self.add_prepare(group.prepare_s)
        self.add_phases(group.phases_s)

    def add_phases(self, phases_s: dict) -> None:
        """Add cases' host time by phase (:mod:`cluster.phases`, seconds) to
        the current job's accounting."""
        from cluster.phases import add
        with self._lock:
            if self._section is not None:
                add(self._section["phases_s"], phases_s)

    def add_build(self, seconds: float) -> None:
        """Add a group's build (placing it, starting its processes, their
        imports and device set-up, the mailbox rendezvous) to the current
        job's accounting."""
        self._add("build_s", seconds)

    def add_prepare(self, seconds: float) -> None:
        """Add kernel preparation (compile or load from the compile cache,
        and what a first call sets up) to the current job's accounting."""
        self._add("prepare_s", seconds)

    def _add(self, key: str, seconds: float) -> None:
        with self._lock:
            if self._section is not None and seconds > 0:
                self._section[key] += seconds

    def note_fanout(self, fan) -> None:
        """Record the peak number of TP groups the current job ran at once."""
        with self._lock:
            if self._section is not None:
                self._section["peak_groups"] = fan.peak

    @contextlib.contextmanager
    def tagged(self, **extra: Any) -> Iterator[None]:
        """Within (on this thread): every row's ``extra`` also holds ``extra``
        (e.g. the node a TP group was pinned to and its ranks' nodes)."""
        old = getattr(self._tags, "extra", {})
        self._tags.extra = {**old, **extra}
        try:
            yield
        finally:
            self._tags.extra = old

    def _progress(self) -> None:
        """One case done: the bar, or off a terminal a plain line with the ETA
        every 10% of the job's cases."""
        sec = self._section
        if self._bar is not None:
            self._bar.update(1)
        if sec is None:
            return
        sec["done"] += 1
        if (self._bar is None or self._bar.disable) and sec["total"] >= 10 and \
                sec["done"] >= sec["next_line"] * sec["total"] and sec["done"] < sec["total"]:
            sec["next_line"] += 0.1
            elapsed = time.monotonic() - sec["t0"]
            eta = elapsed / sec["done"] * (sec["total"] - sec["done"])
            print(f"   [{sec['job']}] {sec['done']}/{sec['total']} cases, {elapsed:.0f} s, "
                  f"ETA {eta:.0f} s", file=sys.stderr, flush=True)

    def announce(self, text: str) -> None:
        """A line in the table, before a case runs (e.g. a rank killed on
        purpose, so the Ray message that follows is expected)."""
        out = self._table.out if self._table is not None else sys.stdout
        print(f"   >> {text}", file=out, flush=True)

    def record(self, case: Case | None, suite: Suite, **kwargs: Any) -> dict:
        """Append one row (as the case ends), print its table line; returns
        the row ({} and nothing written once :attr:`stopping` is set). Safe
        to call from the threads of concurrent groups.
        ``progress=False``: a further row of a case already counted (the
        profile writes one row per implementation of one case)."""
        with self._lock:
            if self.stopping.is_set():
                return {}  # a case the run's stop cut short: not a result
            return self._record(case, suite, **kwargs)

    def _record(self, case: Case | None, suite: Suite, *, outcome: str, started_at: dt.datetime,
                reason: str | None = None, note: str | None = None, extra: dict | None = None,
                placement: str | None = None, progress: bool = True, **fields: Any) -> dict:
        from jobs.results import make_row
        columns: dict[str, Any] = {}
        if case is not None:
            columns = dict(op=case.op, variant=case.variant, transport=case.transport,
                           placement=str(placement or case.placement), tp=case.tp,
                           hidden=case.hidden, tokens=case.tokens, top_k=case.top_k, hc=case.hc,
                           dtype=case.dtype, backend=self.backend)
        columns.update(fields)
        if case is not None:
            columns.setdefault("job", case.job)
            if outcome != "pass" and not columns.get("repro_command"):
                columns["repro_command"] = repro_command(case, suite, self.backend,
                                                         columns["placement"])
        info = {"suite_version": suite.version, "inputs": case.inputs if case else None,
                **getattr(self._tags, "extra", {}), **(extra or {})}
        if progress and case is not None:
            info.setdefault("case_key", case.key())  # this row completes the case
        row = make_row(started_at=started_at, finished_at=now(), outcome=outcome, reason=reason,
                       extra={k: v for k, v in info.items() if v is not None},
                       **{**self.environment, **columns})
        writer = self.writer(suite.name)
        if writer is not None:
            writer.append(row)
            self.rows_written += 1
            self.heartbeat()
        self.counts[outcome] += 1
        if outcome in FAILING:
            self.failing.append({**row, "suite": suite.name})
        if outcome == "skipped" and reason and self._table is not None:
            mark = self._skips.setdefault(reason, [len(self._skips) + 1, 0])
            mark[1] += 1
            note = note or f"see [{mark[0]}] below"
        if self._table is not None:
            what = (case.inputs or case.fault or ",".join(case.param("baselines", ()) or ())) if case else ""
            self._table.row([columns.get("job", "-"), columns.get("op"), columns.get("tp"),
                             columns.get("hidden"), columns.get("tokens"), columns.get("placement"),
                             what, columns.get("t_n") or (case.repeats if case else None),
                             columns.get("mismatches"), columns.get("max_ulp"),
                             columns.get("t_median_us"), columns.get("t_p99_us"), outcome,
                             note or reason or ""])
        if progress:
            if info.get("rebuilt") and self._section is not None:
                self._section["rebuilt_cases"] += 1
                self._section["rebuilt_s"] += (row["finished_at"] - started_at).total_seconds()
            self._progress()
        return row

    def heartbeat(self) -> None:
        """Refresh the run manifest's heartbeat (at most every
        ``runs.HEARTBEAT_EVERY_S``)."""
        import time

        from jobs.results import runs
        if self.results is not None and time.monotonic() - self._beat > runs.HEARTBEAT_EVERY_S:
            runs.heartbeat(self.results, self.run_id)
            self._beat = time.monotonic()

    def finish(self, *, compact: bool = False) -> None:
        """Mark the run finished in its manifest (a run is ``incomplete``
        until then, once its driver is gone); ``compact``: first rewrite its
        rows as one file per partition (``jobs.results.compact_run``)."""
        if self.results is None:
            return
        from jobs.results import runs
        self._compact(compact)
        runs.finish(self.results, self.run_id, counts=dict(self.run_counts()))
        self.finished = True

    def _compact(self, compact: bool) -> None:
        if compact and self._writers:
            from jobs.results import compact_run
            files = compact_run(self.results, self.run_id)
            if files:
                print(f"results: run {self.run_id} compacted into {len(files)} file(s)",
                      flush=True)

    def interrupted(self, stop, *, compact: bool, resume: str) -> None:
        """The run was stopped by ``stop`` (``jobs.exits.Interrupted``) after
        the case in hand (its section printed its closing line and wrote its
        accounting): the failing rows and counts, the rows compacted as
        :meth:`finish` would (``compact``), the manifest marked
        ``interrupted``, and ``resume``, the command that completes the run,
        printed. Once per run; a run already finished (the signal came
        during the dashboard build) is left as it is. Takes the row lock: a
        row being written completes first."""
        with self._lock:
            if self.stopped_by is not None:
                return
            self.stopped_by = stop.name
        if self.results is None:
            print(f"\n{stop.name}: stopped; nothing to resume (--no-results)", flush=True)
            return
        if self.finished:
            print(f"\n{stop.name}: stopped after run {self.run_id} finished", flush=True)
            return
        from jobs.results import runs
        self.summary()
        self._compact(compact)
        runs.interrupt(self.results, self.run_id, by=stop.name, counts=dict(self.run_counts()))
        print(f"\n{stop.name}: run {self.run_id} interrupted after the case in hand; "
              f"complete it (only the cases it lacks) with:\n  {resume}", flush=True)

    def count_external(self, outcome_counts: Counter[str]) -> None:
        """Fold in the counts of parts that write their own rows (selfcheck,
        compile-check)."""
        self.counts.update(outcome_counts)

    def run_counts(self) -> Counter[str]:
        """Rows by outcome: read back from the run's rows (every part of a
        run split in parts, self-check and compile check included), else
        (no rows: --no-results, or none written yet) this process's own count."""
        if self.results is None or not Path(self.results).is_dir():
            return Counter(self.counts)
        from jobs.results import read_results
        outcomes = read_results(self.results, filters={"run_id": self.run_id},
                                columns=["outcome"]).column("outcome").to_pylist()
        return Counter(outcomes) if outcomes else Counter(self.counts)

    def summary(self) -> int:
        """Print the failing rows with their repro commands and the closing
        line (counts over every row of the run, self-check and compile
        check included, when rows were written); returns the number of
        failing cases."""
        counts = self.run_counts()
        n = max(sum(counts[o] for o in FAILING), sum(self.counts[o] for o in FAILING))
        if self.failing:
            print(f"\n{len(self.failing)} failing case(s), each with the command that reproduces it:")
            for row in self.failing:
                print(f"  [{row['outcome']}] {row['op']} tp={row['tp']} hidden={row['hidden']} "
                      f"M={row['tokens']}: {row['reason'] or ''}")
                print(f"      {row['repro_command']}")
        counts = ", ".join(f"{counts[o]} {o}" for o in ("pass", "fail", "hang", "error", "skipped"))
        where = (f"rows written to {self.results}/ (run {self.run_id})"
                 if self.results is not None else "no rows written (--no-results)")
        print(f"\n{counts}; {where}", flush=True)
        return n
