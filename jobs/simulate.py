"""``python -m jobs.simulate``: the emulated jobs on a simulated multi-node
Ray cluster, to show the fan-out of TP groups over nodes without GPUs.

For each requested node count N it starts a fresh ``ray.cluster_utils.Cluster``
on this machine (a head node holding no units, N worker nodes each declaring
``--units`` emulated GPUs as the ``cluster.fanout.EMULATED_GPU`` custom
resource), runs the requested jobs of a suite on the emulated backend through
it (``python -m jobs <job> --suite ... --backend emulated``), and prints per
node count the wall time, the case counts, the nodes the groups ran on and
the peak number of groups whose cases ran at once (from the rows' start and
finish times). Every node is a process tree on this one machine, so the
speed-up is bounded by its cores (the emulated ranks spin in numpy), not by
the simulated units.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

from cluster.emulated.segment import remove_driver_segments
from jobs import exits
from jobs.exits import InfraError


@contextlib.contextmanager
def simulated_cluster(nodes: int, units: int, *, cpus_per_node: int = 1) -> Iterator:
    """A connected Ray cluster of a head (no units) and ``nodes`` worker
    nodes with ``units`` emulated GPUs each; yields the Cluster (its
    ``worker_nodes`` for ``remove_node``). Ray is shut down at the end, and
    then the mailbox segments still named for this driver are removed: the
    simulated nodes share this host's /dev/shm, and the rank actors of a
    node removed mid-run died without closing theirs (on a real cluster
    they would be on the lost node).

    Authentication and addresses are the embedded cluster's
    (:func:`jobs.embedded.cluster_env`: token auth with its token file,
    servers on loopback), set for the cluster's processes and the driver
    alike: with only the caller's environment, a ``RAY_AUTH_MODE=token``
    there and no token file let no GCS start (three 30-s timeouts, exit 3),
    and a process whose earlier ``ray.init`` had left token mode cached
    drove a cluster without it, where every actor was "cancelled before it
    started running"."""
    from jobs.embedded import cluster_env, cluster_environment, ensure_token, token_path
    if nodes < 1 or units < 1:
        raise ValueError(f"nodes and units must be >= 1, got nodes={nodes}, units={units}")
    with cluster_environment(cluster_env(ensure_token(token_path()))):
        yield from _simulated_cluster(nodes, units, cpus_per_node)


def _simulated_cluster(nodes: int, units: int, cpus_per_node: int) -> Iterator:
    import ray
    from ray.cluster_utils import Cluster

    from cluster import procs
    from cluster.fanout import EMULATED_GPU
    from jobs.embedded import cleanup, init_with_retry
    preexisting = set(procs.descendants(os.getpid()))
    started: list = []

    def start() -> None:
        started.append(Cluster(initialize_head=True, head_node_args={"num_cpus": cpus_per_node}))
        for _ in range(nodes):
            started[-1].add_node(num_cpus=cpus_per_node, resources={EMULATED_GPU: units})
        ray.init(address=started[-1].address, log_to_driver=False, configure_logging=False)
        started[-1].wait_for_nodes()

    def stop_attempt() -> None:  # a start cut short: what it started, by process
        ray.shutdown()
        with contextlib.suppress(Exception):
            if started:
                started.pop().shutdown()
        cleanup(os.getpid(), {p: t for p, t in procs.descendants(os.getpid()).items()
                              if p not in preexisting}, preexisting)

    # A loaded machine can miss Ray's start deadlines: the bounded retry of
    # the jobs' own embedded cluster (exit 3 after it).
    init_with_retry(start, what=f"the simulated {nodes}-node Ray cluster did not start",
                    between=stop_attempt)
    try:
        yield started[-1]
    finally:
        ray.shutdown()
        started[-1].shutdown()
        remove_driver_segments(os.getpid())


def group_spans(rows: Sequence[dict]) -> dict[tuple, tuple[float, float, str]]:
    """Per TP group (its ``group_id`` tag), the span from its first case's
    start to its last case's finish (epoch seconds) and its node; rows
    without the tags (never ran on a group) are left out."""
    spans: dict[tuple, list] = {}
    for r in rows:
        x = json.loads(r["extra"] or "{}")
        if not x.get("rank_nodes"):
            continue
        key = x["group_id"]
        s, e = r["started_at"].timestamp(), r["finished_at"].timestamp()
        if key in spans:
            spans[key][0], spans[key][1] = min(spans[key][0], s), max(spans[key][1], e)
        else:
            spans[key] = [s, e, x.get("node_id") or x["rank_nodes"][0]]
    return {k: tuple(v) for k, v in spans.items()}


def peak_groups(rows: Sequence[dict]) -> int:
    """Most TP groups whose case spans are open at one instant."""
    from cluster.fanout import Span, peak_overlap
    return peak_overlap([Span(str(k), v[2], v[0], v[1]) for k, v in group_spans(rows).items()])


def run_jobs(jobs: Sequence[str], suite: str, results: Path, extra: Sequence[str] = ()) -> int:
    """The jobs through the CLI in this process (Ray already connected);
    returns the worst exit status."""
    from jobs.__main__ import main
    worst = 0
    for job in jobs:
        worst = max(worst, main([job, "--suite", suite, "--backend", "emulated",
                                 "--results", str(results), "--trigger", "adhoc", *extra]))
    return worst


def simulate(nodes: int, *, units: int, jobs: Sequence[str], suite: str,
             extra: Sequence[str] = ()) -> dict:
    """One simulated cluster of ``nodes`` nodes: the jobs' figures."""
    from jobs.results import read_results
    with tempfile.TemporaryDirectory(prefix="simulate-") as tmp:
        with simulated_cluster(nodes, units):
            t0 = time.monotonic()
            status = run_jobs(jobs, suite, Path(tmp), extra)
            wall = time.monotonic() - t0
        rows = read_results(tmp).to_pylist()
    spans = group_spans(rows)
    return {"nodes": nodes, "units_per_node": units, "wall_s": round(wall, 1), "status": status,
            "cases": len(rows), "outcomes": dict(Counter(r["outcome"] for r in rows)),
            "groups": len(spans), "nodes_used": len({v[2] for v in spans.values()}),
            "peak_groups": peak_groups(rows)}


MAX_NODES = 32
"""Simulated nodes at most: each is a Ray node (a raylet and its workers)
started on this one machine."""
MAX_UNITS = 64
"""Emulated GPUs a simulated node declares at most."""


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jobs.simulate", description=__doc__.splitlines()[0])
    p.add_argument("--nodes", default="1,2,4", help="comma-separated node counts (default 1,2,4)")
    p.add_argument("--units", type=int, default=8, help="emulated GPUs per node (default 8)")
    p.add_argument("--suite", default="smoke", help="suite name or TOML file (default smoke)")
    p.add_argument("--jobs", default="correctness,faults",
                   help="comma-separated jobs among correctness,faults (default both)")
    p.add_argument("--json", action="store_true", help="print one JSON object per node count")
    args, extra = p.parse_known_args(argv)
    try:
        counts = [int(n) for n in args.nodes.split(",") if n.strip()]
    except ValueError:
        p.error(f"--nodes {args.nodes!r}: expected comma-separated integers")
    jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    bad = [j for j in jobs if j not in ("correctness", "faults")]
    if bad or not counts or not all(1 <= n <= MAX_NODES for n in counts):
        p.error(f"--jobs {args.jobs!r} / --nodes {args.nodes!r}: jobs among correctness,faults; "
                f"node counts in 1..{MAX_NODES} (each is a raylet on this machine)")
    if not 1 <= args.units <= MAX_UNITS:
        p.error(f"--units {args.units}: must be in 1..{MAX_UNITS} (emulated GPUs per node)")
    figures = []
    for n in counts:
        try:
            fig = simulate(n, units=args.units, jobs=jobs, suite=args.suite, extra=extra)
        except InfraError as err:
            print(f"python -m jobs.simulate: infrastructure: {err}", file=sys.stderr)
            return exits.INFRA
        figures.append(fig)
        if args.json:
            print(json.dumps(fig), flush=True)
    print(f"\n{'nodes':>5} {'units/node':>10} {'wall_s':>8} {'cases':>6} {'groups':>6} "
          f"{'nodes used':>10} {'peak groups':>11}  outcomes")
    for f in figures:
        print(f"{f['nodes']:>5} {f['units_per_node']:>10} {f['wall_s']:>8.1f} {f['cases']:>6} "
              f"{f['groups']:>6} {f['nodes_used']:>10} {f['peak_groups']:>11}  {f['outcomes']}")
    return max(f["status"] for f in figures)


if __name__ == "__main__":
    raise SystemExit(main())
