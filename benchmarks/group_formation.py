"""Benchmark: forming a TP group from a worker pool (cluster.pool) against
starting its rank processes fresh (``--pool off``, the path before pools),
side by side in one run on one Ray cluster.

    python -m benchmarks.group_formation [--backend auto] [--repeats 5]
        [--kinds process-per-gpu:1,shared-gpu:2,shared-gpu:4,shared-gpu:8,
                 virtual-ranks:2,virtual-ranks:4,virtual-ranks:8] [--json PATH]

For each kind (placement:tp) it forms ``--repeats`` groups each way and
reports the median and the worst formation time and their ratio. Formation
is what a job waits for before a group's first case can run:

- rank-actor groups: ``TPGroup(...)`` returning (placing it, rank processes
  started or leased, their imports and CUDA context where fresh, the
  torch.distributed group and the mailbox rendezvous);
- virtual ranks: from submitting the group until its task runs the first
  case (a fresh Ray GPU task: scheduling, a worker process, imports; a
  pooled worker: the lease and the dispatch), i.e. ``entered_unix`` minus
  the submit time plus the task's own ``imports`` (``cluster.gpu.virtual``).

The pool is warmed first (one group of each kind, not counted), as a
nightly's pool is after its first groups. Each group makes one checked call
(a 1-token all_reduce_norm case) so that a formation that only looks done
fails here. On the emulated backend the virtual kinds are skipped (they
need a GPU) and the others run as CPU ranks (placement ``emulated``). Wall-clock
host times: this measures the service, not a kernel.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from cluster.placement import Placement

KINDS = ("process-per-gpu:1", "shared-gpu:2", "shared-gpu:4", "shared-gpu:8",
         "virtual-ranks:2", "virtual-ranks:4", "virtual-ranks:8")
"""placement:tp (a placement's underscore spelling, process_per_gpu, is taken too)."""
HIDDEN, CAPACITY, BUDGET_NS = 4096, 8, 1_000_000_000


def _parse(argv):
    on_gpus = (Placement.PROCESS_PER_GPU, Placement.SHARED_GPU, Placement.VIRTUAL_RANKS)
    p = argparse.ArgumentParser(prog="python -m benchmarks.group_formation",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="auto", choices=("auto", "gpu", "emulated"))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--kinds", default=",".join(KINDS),
                   help="placement:tp, comma-separated (default: %(default)s)")
    p.add_argument("--json", default=None, help="also write the figures here")
    args = p.parse_args(argv)
    if not 1 <= args.repeats <= 100:
        p.error(f"--repeats must be in 1..100, got {args.repeats}")
    kinds = []
    for item in args.kinds.split(","):
        placement, _, tp = item.partition(":")
        try:
            placement = Placement(placement)
        except ValueError:
            placement = None
        if placement not in on_gpus or not tp.isdigit():
            p.error(f"--kinds: {item!r} is not placement:tp (placements "
                    f"{', '.join(on_gpus)})")
        kinds.append((placement, int(tp)))
    args.kinds = kinds
    return args


def _rank_group(backend: str, placement: Placement, tp: int, pool) -> float:
    from cluster.group import TPGroup
    gpus = (0.0 if backend == "emulated" else
            1.0 if placement == Placement.PROCESS_PER_GPU else 1.0 / tp)
    t0 = time.monotonic()
    with TPGroup(tp=tp, hidden=HIDDEN, capacity=CAPACITY, backend=backend, gpus_per_rank=gpus,
                 call_timeout_s=30.0, setup_timeout_s=300.0, pool=pool) as g:
        formed = time.monotonic() - t0
        call = g.run(g.case(tokens=1, seed=1, budget_ns=BUDGET_NS))
        if call.outcome != "pass":
            raise RuntimeError(f"{placement} tp={tp}: {call.outcome}: {call.diagnosis.summary()}")
    return formed


def _virtual_group(tp: int, pool) -> float:
    from cluster.gpu import virtual
    from jobs.session import gpu_task
    spec = {"tp": tp, "hidden": HIDDEN, "capacity": CAPACITY, "eps": 1e-6,
            "budget_ns": BUDGET_NS, "cases": [{"tokens": 1, "inputs": "random", "seeds": [1]}]}
    submitted = time.time()
    out, failed = gpu_task(virtual.run_group, spec, 300.0, gpus=1.0, pool=pool)
    if failed:
        raise RuntimeError(f"virtual-ranks tp={tp}: {failed}")
    return max(out["entered_unix"] - submitted, 0.0) + out["setup_s"]["imports"]


def formation_s(backend: str, placement: Placement, tp: int, pool) -> float:
    if placement == Placement.VIRTUAL_RANKS:
        return _virtual_group(tp, pool)
    return _rank_group(backend, placement, tp, pool)


def main(argv=None) -> int:
    args = _parse(argv)
    import ray

    from cluster.pool import WorkerPool
    from jobs.session import ray_session, resolve_backend
    with ray_session(None):
        backend, why = resolve_backend(args.backend)
        if backend == "gpu":
            kinds = args.kinds
        else:  # CPU ranks: one kind per tp, the virtual ones need a GPU
            kinds = list(dict.fromkeys((Placement.EMULATED, tp) for p, tp in args.kinds
                                       if p != Placement.VIRTUAL_RANKS))
        print(f"backend: {why}; {args.repeats} group(s) per kind and way; ray "
              f"{ray.__version__}", flush=True)
        figures = {}
        for placement, tp in kinds:  # today's path first: nothing warm from the pool helps it
            figures[placement, tp] = {"off": [formation_s(backend, placement, tp, None)
                                              for _ in range(args.repeats)]}
        pool = WorkerPool.for_job(backend)
        try:
            for placement, tp in kinds:  # warm-up: every kind once
                formation_s(backend, placement, tp, pool)
            for placement, tp in kinds:
                figures[placement, tp]["pool"] = [formation_s(backend, placement, tp, pool)
                                                  for _ in range(args.repeats)]
            usage = pool.usage()
        finally:
            pool.close()
    print(f"\n{'placement':<16}{'tp':>3}  {'off p50 s':>10}{'off max s':>10}  "
          f"{'pool p50 s':>11}{'pool max s':>11}  {'off/pool':>8}")
    rows = []
    for (placement, tp), f in figures.items():
        off, pooled = statistics.median(f["off"]), statistics.median(f["pool"])
        rows.append({"placement": placement, "tp": tp, "off_s": f["off"], "pool_s": f["pool"],
                     "off_p50_s": off, "pool_p50_s": pooled, "ratio": off / pooled})
        print(f"{placement:<16}{tp:>3}  {off:>10.3f}{max(f['off']):>10.3f}  {pooled:>11.3f}"
              f"{max(f['pool']):>11.3f}  {off / pooled:>8.1f}")
    print(f"pool: {usage}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": backend, "repeats": args.repeats, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
