"""``python -m jobs profile``: latency of the fused ops against same-run baselines.

On the gpu backend, tp=1 cases run in a Ray task holding one GPU
(``jobs.profiling.measure_tp1``: NVTX ranges, CUDA-graph replay over
rotating inputs, compile time apart, GPU clocks and temperature before and
after). Rows: one per implementation, the fused op's row carrying the
unfused baseline's median and the ratio (``ratio`` < 1: fused is faster),
each baseline its own row (``variant = baseline:<name>``) so trends show
them beside the kernel; a baseline that cannot run here is a ``skipped``
row with the reason. Per-rank medians and p99 go to ``extra``
(``rank_median_us``, ``rank_p99_us``), the per-iteration max over ranks to
``t_max_over_ranks_median_us``; ``extra.collective_speed`` is false for any
timing that is not a collective's speed (virtual ranks, shared GPU).

At tp > 1 with one rank actor per GPU (all_reduce_norm and all_reduce_mhc),
the cases of one (op, tp, hidden, ...) share a TP group; every rank times
the same graphs at once (:mod:`cluster.gpu.timing`: an NCCL barrier before
each replay, the fused op checked against the reference first) and the rows
take per iteration the max over ranks. A case that hangs, fails or errors
is recorded and the group is rebuilt for the cases after it.

Not measured (``skipped`` with the reason, never a fake timing): every case
on the emulated backend (numpy on CPUs is no kernel timing), tp > 1 on
shared-GPU or virtual-rank placements (not a collective's speed), and
all_reduce_mhc at tp=1 (``python -m benchmarks.all_reduce_mhc`` compares
it with the torch path).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from jobs.config import Case, Suite
from jobs.harness import ClusterView, Placement, Run, error_text, gpu_task, now

EMULATED_REASON = ("profile needs GPUs: on the emulated backend (numpy on CPU actors) there "
                   "is no kernel timing to record")
TP1_OPS = ("all_reduce_norm",)
MULTI_RANK_REASON = ("tp > 1 timing needs one rank actor per GPU (process per GPU): "
                     "virtual-rank or shared-GPU timings would not be a collective's speed")


def run(run: Run, suite: Suite, cases: Sequence[Case], *, view: ClusterView,
        timeout_s: float | None = None) -> None:
    with run.section(f"profile: suite {suite.name} v{suite.version}, {len(cases)} case(s), "
                     f"backend {run.backend}", len(cases)):
        groups: OrderedDict[tuple, list[Case]] = OrderedDict()
        for case in cases:
            where = _placement(run, suite, case, view)
            if where is None:
                continue
            timeout = timeout_s or case.param("timeout_s")
            if case.tp == 1:
                _measure(run, suite, case, where, timeout, now())
            else:
                groups.setdefault(case.group_key, []).append(case)
        for members in groups.values():
            where = view.resolve(members[0])
            assert isinstance(where, Placement)
            _measure_group(run, suite, members, where, timeout_s or members[0].param("timeout_s"))


def _placement(run: Run, suite: Suite, case: Case, view: ClusterView) -> Placement | None:
    """Where ``case`` is timed, or None once it is recorded as skipped with why."""
    if run.backend == "emulated":
        reason = EMULATED_REASON
    else:
        from cluster.gpu.timing import TIMED_OPS  # imports torch: only off the emulated path
        where = view.resolve(case)
        timed_ops = TP1_OPS if case.tp == 1 else TIMED_OPS
        reason = (where if isinstance(where, str) else
                  f"op {case.op} at tp={case.tp}: profiled ops there are {list(timed_ops)}"
                  + (" (benchmarks.all_reduce_mhc times mHC at tp=1)"
                     if case.op == "all_reduce_mhc" else "")
                  if case.op not in timed_ops else
                  "multicast needs tp >= 2 with NVLS" if case.transport != "unicast"
                  else MULTI_RANK_REASON if case.tp > 1 and where.name != "process-per-gpu"
                  else None)
        if reason is None:
            return where
    run.record(case, suite, outcome="skipped", started_at=now(), reason=reason)
    return None


def _measure(run: Run, suite: Suite, case: Case, where: Placement, timeout_s: float,
             started) -> None:
    from jobs import profiling
    spec = {"op": case.op, "variant": case.variant, "hidden": case.hidden, "tokens": case.tokens,
            "calls": case.param("calls"), "replays": case.param("replays"),
            "watchdog_ns": case.param("watchdog_ns"), "rotate_mb": case.param("rotate_mb"),
            "baselines": list(case.param("baselines"))}
    # A timeout is a hang; the fused op's pre-timing check failing a wrong answer.
    out, failed = gpu_task(profiling.measure_tp1, spec, timeout_s)
    if failed:
        kind, why = failed
        run.record(case, suite, outcome=kind, started_at=started, placement=where.name, reason=why)
        return
    before, after = out["before"], out["after"]
    gpu = {"sm_clock_mhz_before": before["sm_clock_mhz"], "sm_clock_mhz_after": after["sm_clock_mhz"],
           "mem_clock_mhz": before["mem_clock_mhz"], "temp_c_before": before["temp_c"],
           "temp_c_after": after["temp_c"], "gpu_model": out["device"]}
    record_impls(run, suite, case, where, [out["impls"]], gpu, started)


def group_spec(case: Case) -> dict:
    """The :func:`cluster.gpu.timing.time_rank` spec of a tp > 1 case."""
    from cluster.cases import DEFAULTS
    return {"op": case.op, "hidden": case.hidden, "tokens": case.tokens, "hc": case.hc,
            "calls": case.param("calls"), "replays": case.param("replays"),
            "rotate_mb": case.param("rotate_mb"),
            "watchdog_ns": case.param("watchdog_ns") if case.variant == "watchdog" else 0,
            "eps": DEFAULTS["eps"], "baselines": list(case.param("baselines")),
            "seed": case.tokens}


def _measure_group(run: Run, suite: Suite, members: list[Case], where: Placement,
                   timeout_s: float) -> None:
    """tp > 1, one rank actor per GPU: the cases on one TP group (capacity:
    their largest M), every rank timing each case's graphs at once; after a
    case that does not pass, a fresh group for the rest (a timed call cut
    short leaves the group in an unknown state)."""
    from jobs.correctness import open_group
    pending = list(members)
    while pending:
        group = open_group(run, suite, pending, where, timeout_s)
        if group is None:
            return
        with group:
            while pending:
                case, started = pending.pop(0), now()
                try:
                    per_rank = group.time(group_spec(case), timeout_s)
                except Exception as err:  # a broken case is a result, not a crash
                    kind = "hang" if isinstance(err, TimeoutError) else (
                        "fail" if isinstance(getattr(err, "cause", None), AssertionError)
                        else "error")
                    run.record(case, suite, outcome=kind, started_at=started,
                               placement=where.name, reason=error_text(err, limit=300))
                    break
                record_impls(run, suite, case, where, [r["impls"] for r in per_rank], {},
                             started)


def record_impls(run: Run, suite: Suite, case: Case, where: Placement, per_rank: list[dict],
                 gpu: dict, started) -> None:
    """One row per implementation from every rank's ``{name: {"times_us",
    "compile_s"} | {"skipped": why}}``: the timing columns are those of the
    per-iteration max over ranks; per-rank medians and p99 go to ``extra``;
    the fused row carries the first baseline's median and the ratio."""
    from cluster.gpu.timing import max_over_ranks
    from jobs import profiling
    names = list(per_rank[0])
    timing, ranks = {}, {}
    for name in names:
        impls = [r[name] for r in per_rank]
        if all("times_us" in i for i in impls):
            timing[name] = profiling.stats(max_over_ranks([i["times_us"] for i in impls]))
            ranks[name] = [profiling.stats(i["times_us"]) for i in impls]
    base = next((b for b in case.param("baselines") if b in timing), None)
    for name in names:
        impl = per_rank[0][name]
        variant = case.variant if name == "fused" else f"baseline:{name}"
        extra = {"impl": name, "collective_speed": where.collective_speed,
                 "nvtx_domain": profiling.NVTX_DOMAIN, "calls_per_graph": case.param("calls"),
                 "replays": case.param("replays")}
        if name not in timing:
            why = next((r[name]["skipped"] for r in per_rank if "skipped" in r[name]),
                       impl.get("skipped"))
            run.record(_as(case, variant), suite, outcome="skipped", started_at=started,
                       placement=where.name, reason=why, extra=extra, **gpu)
            continue
        t = timing[name]
        extra.update(compile_s=round(max(r[name]["compile_s"] for r in per_rank), 4),
                     rank_median_us=[s["t_median_us"] for s in ranks[name]],
                     rank_p99_us=[s["t_p99_us"] for s in ranks[name]])
        cmp = {}
        if name == "fused" and base is not None:
            cmp = {"baseline": base, "baseline_median_us": timing[base]["t_median_us"],
                   "ratio": t["t_median_us"] / timing[base]["t_median_us"]}
            extra["ratios"] = {b: t["t_median_us"] / timing[b]["t_median_us"]
                               for b in timing if b != "fused"}
        run.record(_as(case, variant), suite, outcome="pass", started_at=started,
                   placement=where.name, t_max_over_ranks_median_us=t["t_median_us"], **t, **cmp,
                   **gpu, extra=extra,
                   note=f"x{cmp['ratio']:.2f} vs {base}" if cmp else None)


def _as(case: Case, variant: str) -> Case:
    import dataclasses
    return dataclasses.replace(case, variant=variant)
