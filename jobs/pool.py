"""``python -m jobs pool start|status|stop``: a standing pool of warm rank
workers on a long-running Ray cluster (cluster.pool), for investigations:

    python -m jobs head start                       # or any cluster: --address
    python -m jobs pool start --name lab            # workers warm on every GPU
    python -m jobs correctness ... --address 127.0.0.1:PORT --pool lab
    python -m jobs submit -- correctness ... --pool lab
    python -m jobs pool status --name lab           # node, GPU, pid, age, leases, memory
    python -m jobs pool stop --name lab

The cluster: ``--address`` (a GCS address, ``HOST:PORT``), else
``RAY_ADDRESS``, else the head ``python -m jobs head start`` recorded (its
address and token, ``--dir``). A pool's keeper and workers are detached
actors in the ``lamport-pool`` namespace: they outlive the command that
started them, and ``stop`` ends them all.
"""

from __future__ import annotations

import os
import time

from jobs.config import ConfigError

DEFAULT_NAME = "lamport"


def add_parser(sub) -> None:
    p = sub.add_parser("pool", help="start, show or stop a standing pool of warm rank workers "
                                    "on a running Ray cluster",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=("start", "status", "stop"))
    p.add_argument("--name", default=DEFAULT_NAME,
                   help="the pool's name on the cluster (default: %(default)s)")
    p.add_argument("--address", default=None,
                   help="the cluster's GCS address HOST:PORT (default: RAY_ADDRESS, else the "
                        "head `python -m jobs head start` recorded)")
    p.add_argument("--backend", default="auto", choices=("auto", "gpu", "emulated"),
                   help="start: the workers' backend (default: %(default)s: gpu where the "
                        "cluster has GPUs)")
    p.add_argument("--warm", type=int, default=2, metavar="N",
                   help="start: workers started and warmed (imports, CUDA context) on every GPU "
                        "(emulated: on every node) before the command returns "
                        "(default: %(default)s)")
    p.set_defaults(func=main)


def cluster_address(address: str | None) -> str:
    """The GCS address to join: ``address``, else RAY_ADDRESS, else the
    recorded head's (whose token ``jobs.session.ray_session`` then uses)."""
    from jobs import head as hd
    given = address or os.environ.get("RAY_ADDRESS")
    if given:
        return given
    where = hd.head_dir()
    state = hd.read_state(where)
    if state is None:
        raise ConfigError(f"a standing pool lives on a running cluster: give --address (or "
                          f"RAY_ADDRESS), or start a head first (python -m jobs head start; none "
                          f"is recorded in {where})")
    return state["address"]


def main(args) -> int:
    from kernels.validation import require_name
    try:
        require_name("--name", args.name)
    except (TypeError, ValueError) as err:
        raise ConfigError(str(err)) from None
    from cluster.pool import MAX_WORKERS_PER_SLOT
    if not 0 <= args.warm <= MAX_WORKERS_PER_SLOT:
        raise ConfigError(f"--warm {args.warm}: must be in 0..{MAX_WORKERS_PER_SLOT} "
                          f"(the workers a GPU holds at most)")
    address = cluster_address(args.address)
    from jobs.session import ray_session
    with ray_session(address):
        return {"start": _start, "status": _status, "stop": _stop}[args.action](args)


def _start(args) -> int:
    from cluster.pool import WorkerPool
    from jobs.session import resolve_backend
    backend, why = resolve_backend(args.backend)
    started = time.monotonic()
    try:
        pool = WorkerPool.start(args.name, backend)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if any(pool.cleared):
        print(f"pool {args.name}: a keeper of this name had died; cleared what it left: "
              f"{pool.cleared[0]} worker(s), {pool.cleared[1]} GPU reservation(s)")
    warmed = pool.prestart(args.warm, wait=True)
    try:
        gpus = f"{pool.topology().gpu_count} GPU(s) discovered"
    except Exception as err:  # noqa: BLE001 - each job then discovers (and reports) it itself
        gpus = f"topology not discovered ({type(err).__name__}: {err})"
    print(f"pool {args.name}: started ({why}); {warmed} worker(s) warm, {gpus}, in "
          f"{time.monotonic() - started:.1f} s; jobs use it with --pool {args.name}")
    _print_status(pool)
    return 0


def _attach(args):
    from cluster.pool import WorkerPool
    try:
        return WorkerPool.attach(args.name)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _status(args) -> int:
    _print_status(_attach(args))
    return 0


def _stop(args) -> int:
    n = _attach(args).stop()
    print(f"pool {args.name}: stopped, {n} worker(s) ended")
    return 0


def _print_status(pool) -> None:
    from jobs.table import Col, Table
    rows = pool.status()
    print(pool.describe())
    table = Table([Col("worker", 22), Col("node", 8), Col("gpu", 3), Col("pid", 8, "d"),
                   Col("state", 6), Col("age_s", 8, ".0f"), Col("groups", 6, "d"),
                   Col("rss_MiB", 8, ".0f"), Col("gpu_MiB", 8, ".0f"), Col("note", 30)])
    for r in rows:
        rss, gpu = r.get("rss_bytes"), r.get("gpu_reserved_bytes")
        table.row([r["key"], (r.get("node_id") or "-")[:8], ",".join(r.get("gpu_ids") or []) or "-",
                   r.get("pid"), r["state"], r["age_s"], r.get("served"),
                   None if rss is None else rss / 2**20, None if gpu is None else gpu / 2**20,
                   r.get("error", "")])
    if not rows:
        print("(no workers)")
