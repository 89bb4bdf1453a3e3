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

Not measured (``skipped`` with the reason, never a fake timing): every case
on the emulated backend (numpy on CPUs is no kernel timing), and tp > 1
(the gpu backend's rank actors have no timed call yet).
"""

from __future__ import annotations

from collections.abc import Sequence

from jobs.config import Case, Suite
from jobs.harness import ClusterView, Placement, Run, gpu_task, now

EMULATED_REASON = ("profile needs GPUs: on the emulated backend (numpy on CPU actors) there "
                   "is no kernel timing to record")
MULTI_RANK_REASON = ("tp > 1 timing needs a timed call in the gpu backend's rank actors "
                     "(not built yet); virtual-rank or shared-GPU timings would not be a "
                     "collective's speed anyway")


def run(run: Run, suite: Suite, cases: Sequence[Case], *, view: ClusterView,
        timeout_s: float | None = None) -> None:
    with run.section(f"profile: suite {suite.name} v{suite.version}, {len(cases)} case(s), "
                     f"backend {run.backend}", len(cases)):
        for case in cases:
            run_case(run, suite, case, view, timeout_s)


def run_case(run: Run, suite: Suite, case: Case, view: ClusterView,
             timeout_s: float | None) -> None:
    started = now()
    if run.backend == "emulated":
        run.record(case, suite, outcome="skipped", started_at=started, reason=EMULATED_REASON)
        return
    where = view.resolve(case)
    if isinstance(where, str) or case.op != "all_reduce_norm" or case.tp != 1 \
            or case.transport != "unicast":
        reason = (where if isinstance(where, str) else
                  f"op {case.op}: only all_reduce_norm is profiled so far"
                  if case.op != "all_reduce_norm" else
                  "multicast needs tp >= 2 with NVLS" if case.transport != "unicast"
                  else MULTI_RANK_REASON)
        run.record(case, suite, outcome="skipped", started_at=started, reason=reason)
        return
    _measure(run, suite, case, where, timeout_s or case.param("timeout_s"), started)


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
    impls = out["impls"]
    before, after = out["before"], out["after"]
    gpu = {"sm_clock_mhz_before": before["sm_clock_mhz"], "sm_clock_mhz_after": after["sm_clock_mhz"],
           "mem_clock_mhz": before["mem_clock_mhz"], "temp_c_before": before["temp_c"],
           "temp_c_after": after["temp_c"], "gpu_model": out["device"]}
    timing = {name: profiling.stats(v["times_us"]) for name, v in impls.items() if "times_us" in v}
    base = next((b for b in case.param("baselines") if b in timing), None)
    for name, impl in impls.items():
        variant = case.variant if name == "fused" else f"baseline:{name}"
        extra = {"impl": name, "collective_speed": where.collective_speed,
                 "nvtx_domain": profiling.NVTX_DOMAIN, "calls_per_graph": case.param("calls"),
                 "replays": case.param("replays")}
        if "skipped" in impl:
            run.record(_as(case, variant), suite, outcome="skipped", started_at=started,
                       placement=where.name, reason=impl["skipped"], extra=extra, **gpu)
            continue
        t = timing[name]
        extra.update(compile_s=round(impl["compile_s"], 4), rank_median_us=[t["t_median_us"]],
                     rank_p99_us=[t["t_p99_us"]])
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
