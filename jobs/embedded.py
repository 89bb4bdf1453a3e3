"""The embedded local Ray cluster a job starts when it joins none.

Network: the cluster listens on the loopback address only. Ray binds its
servers (GCS, raylet, workers, dashboard and runtime-env agents, the
autoscaler monitor) to the node IP, and ``ray.init`` turns a loopback
``_node_ip_address`` into the machine's routable address unless Ray's own
switch ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` is set
(``ray._private.services.get_node_ip_address`` then answers the loopback
address); both are set for the embedded cluster and its processes.

Authentication: token authentication stays on (``RAY_AUTH_MODE=token``,
set explicitly, so Ray does not warn about a default), with the token in
``token_path()``: a file only its owner can read or write (0600, in a 0700
folder), made once with 32 random bytes. An existing one is only read
(:mod:`jobs.ray_token`): one others may read, another user's, a directory,
a FIFO or a file holding no token is refused (exit 2), never changed.
Joining a cluster (``--address`` / RAY_ADDRESS) changes none of this: that
is the user's explicit choice.

Cleanup, whichever way the driver ends:

- at a normal end, SIGINT or SIGTERM (turned into ``jobs.exits.Interrupted``,
  a SystemExit, while the cluster runs), ``ray.shutdown()``, then every process the cluster started
  (the driver's descendants that appeared after the start) gets SIGTERM
  and, after ``GRACE_S``, SIGKILL (Ray's dashboard and runtime-env agents
  ignore SIGTERM); then the mailbox segments of this driver's groups go;
- a driver stopped by SIGINT or SIGTERM whose cleanup has not ended
  ``TERM_GRACE_S`` after the signal exits anyway (``terminate_raises``), and
  its watchdog does the rest;
- on SIGKILL of the driver, a watchdog process (``python -m jobs.embedded
  --watch``, started before Ray, in its own session) sees its pipe from the
  driver close, and does the same;
- at start, the segments of earlier drivers that are gone are swept
  (``cluster.emulated.segment.sweep_orphans``), in case a watchdog was
  killed too.

Start: ``ray.init`` is tried ``START_ATTEMPTS`` times (Ray gives a raylet 30
s to register with the GCS, and a loaded machine can miss that), each failed
attempt's processes stopped before the next; then ``jobs.exits.InfraError``
names what did not start (exit 3).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from cluster import procs
from jobs.exits import InfraError, Interrupted

GRACE_S = 3.0
"""How long the cluster's processes get between SIGTERM and SIGKILL."""
TERM_GRACE_S = 20.0
"""How long a driver stopped by SIGTERM gets for its cleanup (closing line,
accounting, ``ray.shutdown``, the cluster's processes) before it exits with
143 anyway (``terminate_raises``). GNU ``timeout`` signals the whole process
group, so the embedded cluster's GCS and raylet get the SIGTERM with the
driver, and a Ray call of the cleanup may then never return. Rows are
written per case, atomically: none written is lost. Below the 30 s that
``timeout -k 30`` (scripts/gpu/nightly_cache.sh) gives before SIGKILL."""
FLUSH_WAIT_S = 1.0
"""How long that late exit waits for stdout and stderr to be flushed."""
WATCH_EVERY_S = 0.5
START_ATTEMPTS = 3
"""How many times ``ray.init`` is tried before the run gives up (exit 3)."""
START_RETRY_WAIT_S = 2.0
"""The pause between two attempts."""
TOKEN_ENV = "LAMPORT_RAY_TOKEN_FILE"
"""Where the embedded cluster's token file is (default: token_path())."""


def token_path() -> Path:
    """``$LAMPORT_RAY_TOKEN_FILE``, else ``$XDG_CONFIG_HOME/lamport-lab/ray-auth-token``
    (``~/.config/...``)."""
    if os.environ.get(TOKEN_ENV):
        return Path(os.environ[TOKEN_ENV])
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "lamport-lab" / "ray-auth-token"


def ensure_token(path: Path) -> Path:
    """The token file at ``path``, made when missing (:func:`jobs.ray_token.make`:
    0600, 32 random bytes as hex); an existing one is read, never changed:
    one others may read, another user's, or one that holds no token is a
    ConfigError (:func:`jobs.ray_token.read`)."""
    from jobs import ray_token
    return ray_token.ensure(path, f"Ray token file (${TOKEN_ENV} or the default)")


LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
"""Ray's switch that keeps every server of a node on the loopback address
given as its node IP (module docstring); the head (jobs.head) sets it too."""


WORKER_ENV = {"RAY_worker_niceness": "0"}
"""Ray starts its worker processes at nice 15. Rank actors are the
service's work, not background work: with a one-core busy loop on the
2-core box, nice-15 rank workers got about 4 % of a core (the busy loop
80 %), so a group's setup (importing torch) ran past its 180 s timeout and
its workers were killed and started again, over and over. Every cluster
the project starts (this one, ``jobs head start``, the test fixtures,
deploy/Dockerfile) runs them at the niceness of the rest."""


def cluster_env(token: Path) -> dict[str, str]:
    """What the driver and every process of the embedded cluster inherit."""
    return {**LOOPBACK_ENV, **WORKER_ENV, "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token)}


@contextlib.contextmanager
def cluster_environment(env: dict[str, str]) -> Iterator[None]:
    """``env`` set for the block (every Ray process started in it inherits
    it) and Ray's loopback switch on, then both as they were; Ray's cached
    auth mode and token are re-read from the environment at both ends, so
    a cluster started in the block and the driver agree on them whatever an
    earlier ``ray.init`` of this process read."""
    import ray._private.ray_constants as constants
    saved = {k: os.environ.get(k) for k in env}
    saved_flag = constants.ENABLE_RAY_CLUSTER
    os.environ.update(env)
    constants.ENABLE_RAY_CLUSTER = False  # read at import; ray may be imported already
    reread_auth()
    try:
        yield
    finally:
        constants.ENABLE_RAY_CLUSTER = saved_flag
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        reread_auth()  # a later ray.init in this process (tests) must not keep token mode


def reread_auth() -> None:
    """Make Ray re-read its auth mode and token from the environment (both
    are cached in the process)."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    except (ImportError, AttributeError):
        pass


_term_timer: threading.Timer | None = None
"""The late-exit timer the first SIGINT or SIGTERM armed (None: no signal yet)."""
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _exit_late(grace_s: float, stop: Interrupted) -> None:
    """The cleanup after the signal outlived ``grace_s``: flush what the driver
    printed (at most ``FLUSH_WAIT_S``; a stuck writer holds its stream's
    lock), say so on stderr, ``os._exit(code)``."""
    def flush() -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    flusher = threading.Thread(target=flush, name="sigterm-flush", daemon=True)
    flusher.start()
    flusher.join(FLUSH_WAIT_S)
    with contextlib.suppress(OSError):
        os.write(2, f"{stop.name}: cleanup did not finish within {grace_s:g} s; exiting "
                    f"{stop.code} (rows written so far are kept)\n".encode())
    os._exit(stop.code)


def _already_terminating(signum, frame) -> None:
    """SIGINT or SIGTERM again while the first one's cleanup runs: the
    cleanup goes on, bounded by the timer the first one armed."""


@contextlib.contextmanager
def terminate_raises(grace_s: float = TERM_GRACE_S) -> Iterator[None]:
    """SIGINT (Ctrl-C) and SIGTERM end the driver through
    ``jobs.exits.Interrupted`` (a SystemExit with status 130 or 143, so
    every ``finally`` runs: a job section's closing line and accounting, the
    cluster's cleanup), and arm a daemon timer that ends a process still
    alive ``grace_s`` later with a line on stderr and ``os._exit`` with that
    status (a cleanup blocked on a Ray process that got the same signal:
    Ctrl-C and GNU ``timeout`` signal the whole process group; the embedded
    cluster's watchdog then stops what is left). One timer per process: a
    later signal neither raises (it would cut the cleanup short) nor rearms
    it, and once a signal came, leaving the block keeps further ones
    ignored rather than restoring the previous handlers. Enter it again
    once ``ray.init`` has returned: the core worker installs its own SIGTERM
    handler there (a C++ stack dump, then death, no ``finally``)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum, frame):
        global _term_timer
        if _term_timer is not None:
            return
        stop = Interrupted(signum)
        _term_timer = threading.Timer(grace_s, _exit_late, (grace_s, stop))
        _term_timer.name = "signal-grace"
        _term_timer.daemon = True
        _term_timer.start()
        raise stop

    previous = {signum: signal.signal(signum, on_signal) for signum in SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if _term_timer is None else _already_terminating)


class Watchdog:
    """The process that cleans up after a driver that died without doing so."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jobs.embedded", "--watch", str(os.getpid())],
            stdin=subprocess.PIPE, start_new_session=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                filter(None, [str(Path(__file__).resolve().parents[1]),
                              os.environ.get("PYTHONPATH")]))})

    def stop(self) -> None:
        """The driver cleaned up itself: the watchdog leaves quietly."""
        try:
            self.process.stdin.write(b"done\n")
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def cleanup(driver: int, started: dict[int, int], preexisting: set[int]) -> tuple[int, int]:
    """Stop the cluster's processes (``started`` plus their descendants,
    none of ``preexisting``) and remove the driver's segments; returns
    (processes stopped, segments removed)."""
    from cluster.emulated.segment import remove_driver_segments
    for pid in list(started):
        started.update(procs.descendants(pid))
    targets = {p: s for p, s in started.items() if p not in preexisting and p != os.getpid()}
    procs.stop(targets, grace_s=GRACE_S)
    return len(targets), len(remove_driver_segments(driver))


def watch(driver: int) -> int:
    """The watchdog's loop: learn the driver's new descendants until the
    driver says ``done`` (exit quietly) or its end of the pipe closes (the
    driver died: clean up)."""
    me = os.getpid()
    preexisting = set(procs.descendants(driver)) | {me}
    seen: dict[int, int] = {}
    while True:
        ready, _, _ = select.select([sys.stdin.buffer], [], [], WATCH_EVERY_S)
        if ready:
            data = os.read(sys.stdin.fileno(), 64)
            if b"done" in data:
                return 0
            if not data:
                break
        if procs.process_start(driver) is None:
            break
        seen.update({p: s for p, s in procs.descendants(driver).items() if p not in preexisting})
    stopped, removed = cleanup(driver, seen, preexisting)
    print(f"jobs.embedded watchdog: driver {driver} ended without cleaning up; stopped "
          f"{stopped} process(es) of its Ray cluster, removed {removed} segment(s)",
          file=sys.stderr, flush=True)
    return 0


def init_with_retry(init: Callable[[], object], *, what: str, between: Callable[[], None],
                    attempts: int = START_ATTEMPTS, wait_s: float = START_RETRY_WAIT_S) -> None:
    """Call ``init`` (a ``ray.init``) up to ``attempts`` times, ``between``
    (stop what the failed attempt started) and a ``wait_s`` pause after
    each failure; then InfraError: ``what``, the attempts, and the first
    line of the last error (Ray's own words for what timed out, e.g. "The
    current node timed out during startup"). Only ``Exception`` is retried:
    SIGINT / SIGTERM (``Interrupted``) end the start at once."""
    for attempt in range(1, attempts + 1):
        try:
            init()
            return
        except Exception as err:
            said = (str(err).strip().splitlines() or [type(err).__name__])[0]
            print(f"ray: attempt {attempt} of {attempts} failed: {type(err).__name__}: {said}",
                  file=sys.stderr, flush=True)
            between()
            if attempt == attempts:
                raise InfraError(f"{what} after {attempts} attempts ({wait_s:g} s apart); the "
                                 f"last said: {type(err).__name__}: {said}") from None
            time.sleep(wait_s)


def shutdown_ray() -> None:
    """``ray.shutdown()`` with this process's heap frozen (``gc.freeze``)
    while it runs, thawed after (a process that goes on, a test, collects
    as before), so that a collection Ray's GC thread runs meanwhile walks
    only what the job made. Not shown to help: the shutdown's join of that
    thread took 0.97 s of a pooled investigation profiled on the H200
    unfrozen and 0.62 s frozen, in runs that differed in more than this
    (docs/results/warm_nightly_h200_2026-12-02b.md); what the join waits on
    is still open."""
    import gc

    import ray
    gc.freeze()
    try:
        ray.shutdown()
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def embedded_cluster(num_cpus: int) -> Iterator[str]:
    """Start the embedded cluster (loopback only, token auth), yield how it
    was started, and stop everything it started when the block ends."""
    import ray
    from cluster.emulated.segment import sweep_orphans
    swept = sweep_orphans()
    token = ensure_token(token_path())
    preexisting = set(procs.descendants(os.getpid()))
    watchdog = Watchdog()
    preexisting.add(watchdog.process.pid)
    def stop_attempt() -> None:
        ray.shutdown()
        cleanup(os.getpid(), {p: s for p, s in procs.descendants(os.getpid()).items()
                              if p not in preexisting}, preexisting)

    with cluster_environment(cluster_env(token)), terminate_raises():
        try:
            # address="local": a fresh cluster even where another one runs on
            # this machine (plain ray.init() would join the latest `ray start`).
            init_with_retry(lambda: ray.init(
                address="local", num_cpus=num_cpus, include_dashboard=False,
                log_to_driver=False, configure_logging=False, _node_ip_address="127.0.0.1"),
                what="the embedded local Ray cluster did not start", between=stop_attempt)
            with terminate_raises():
                yield (f"started an embedded local Ray cluster (num_cpus={num_cpus}, no "
                       f"dashboard, listening on 127.0.0.1 only, token auth with {token})"
                       + (f"; swept {len(swept)} segment(s) of drivers gone" if swept else ""))
        finally:
            started = {p: s for p, s in procs.descendants(os.getpid()).items()
                       if p not in preexisting}
            try:
                shutdown_ray()
            finally:
                cleanup(os.getpid(), started, preexisting)
                watchdog.stop()


if __name__ == "__main__":
    if sys.argv[1:2] != ["--watch"] or len(sys.argv) != 3:
        sys.exit("usage: python -m jobs.embedded --watch DRIVER_PID")
    sys.exit(watch(int(sys.argv[2])))
