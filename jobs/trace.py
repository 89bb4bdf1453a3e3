"""``python -m jobs trace``: one TP group's correctness cases with every rank
under torch.profiler, merged into ONE Chrome / Perfetto trace in which each
rank is a track on one timeline (cluster.tracing): a straggler or a hung
rank shows at a glance. Open it in https://ui.perfetto.dev or
chrome://tracing.

The filters must select the cases of exactly one TP group (one op, tp,
hidden, variant, transport, placement); they run as the correctness job
runs them (same checks, same rows), each row naming the trace in
``extra.trace_path``, which the dashboard links from the op's details page.
On the emulated backend the trace holds the CPU side (the ``lamport.call``
ranges and the profiler's CPU events); on GPUs the CUDA kernels of every
rank too.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from cluster.errors import error_text
from cluster.placement import Placement
from jobs.config import Case, ConfigError, Suite
from jobs.cluster_view import ClusterView
from jobs.recorder import Run, now
from jobs.results.atomic import write_atomically


def default_path(results: Path | None, run_id: str, case: Case) -> Path:
    """``traces/RUN-OP-tpN.json`` beside the results directory (not inside
    it: the dataset holds Parquet files only)."""
    base = (results.parent if results is not None else Path(".")) / "traces"
    return base / f"{run_id}-{case.op}-tp{case.tp}.json"


def check_one_group(cases: Sequence[Case]) -> None:
    """ConfigError unless ``cases`` form exactly one TP group."""
    keys = {c.group_key for c in cases}
    if len(keys) != 1:
        raise ConfigError(
            f"trace: the filters select {len(keys)} TP groups; narrow them to one "
            f"(e.g. --ops all_reduce_norm --tp 2 --hidden 1024): "
            + "; ".join(_group_label(k) for k in sorted(keys, key=str)))


def _group_label(key: tuple) -> str:
    """A TP group's key (:attr:`jobs.config.Case.group_key`) in words, with
    the op fields that split groups (``all_reduce_mhc finalize=true``), so
    no two groups read the same."""
    op, variant, transport, placement, tp, hidden, top_k, hc, dtype, shared = key
    words = [op, f"tp={tp}", f"hidden={hidden}", variant, transport, placement]
    words += [f"{name}={value}" for name, value in (("top_k", top_k), ("hc", hc)) if value is not None]
    words += [f"{k}={str(v).lower()}" for k, v in shared]
    return " ".join(words)


def run(run: Run, suite: Suite, cases: Sequence[Case], *, view: ClusterView,
        timeout_s: float | None, out: Path | None) -> Path | None:
    """Run and trace the group; returns the trace's path (None when no
    trace was written: the group could not be placed, set up or traced)."""
    from cluster.tracing import summary
    from jobs.correctness import group_placement, open_group, run_case
    check_one_group(cases)
    path = (out or default_path(run.results, run.run_id, cases[0])).resolve()
    with run.section(f"trace: suite {suite.name} v{suite.version}, {len(cases)} case(s) on one "
                     f"group, backend {run.backend}", len(cases)):
        where = group_placement(run, suite, cases, view)
        if where is None:
            return None
        if where.name == Placement.VIRTUAL_RANKS:
            for case in cases:
                run.record(case, suite, outcome="skipped", started_at=now(), placement=where.name,
                           reason="virtual ranks share one process: there are no rank "
                                  "processes to trace; trace a process-per-gpu group")
            return None
        group = open_group(run, suite, cases, where, timeout_s or cases[0].param("timeout_s"),
                           pool=view.pool)
        if group is None:
            return None
        with group:
            group.trace_start()
            for case in cases:
                run_case(run, suite, group, case, where, extra={"trace_path": str(path)})
            try:
                trace = group.trace_stop()
            except Exception as err:  # a rebuilt group's new actors traced nothing
                print(f"trace: not written: {error_text(err)}")
                run.count_external(Counter(error=1))
                return None
    try:  # a new file only: never over one this run did not write
        write_atomically(path, lambda sink: sink.write(json.dumps(trace).encode()),
                         overwrite=False)
    except FileExistsError:
        print(f"trace: not written: {path} appeared while the group ran; lamport-lab "
              f"writes over no file it did not make")
        run.count_external(Counter(error=1))
        return None
    s = summary(trace)
    print(f"\ntrace: {path} ({len(s['tracks'])} rank tracks; open in https://ui.perfetto.dev)")
    for label, c in s["per_rank"].items():
        print(f"  {label}: {c['events']} events, {c['calls']} lamport.call ranges, "
              f"{c['kernels']} GPU kernels")
    return path
