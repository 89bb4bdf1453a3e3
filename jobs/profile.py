"""``python -m jobs profile``: latency of the fused ops against same-run baselines.

Every timing goes through the one measurement harness
(:mod:`cluster.measure`: rotation over more than the L2, CUDA-graph replay,
a barrier before each replay, per-rank times and the per-iteration max over
ranks, NVTX ranges, statistics, GPU clocks); this module turns its results
into rows.

- Every tp, one rank actor per GPU: the cases of one (op, tp, hidden, ...)
  share a TP group (at tp=1 a group of one), built once; every rank times
  the same graphs at once (``GpuRank.time_case``) and the rows take per
  iteration the max over ranks. A case that hangs, fails or errors is
  recorded and the group is rebuilt for the cases after it. (tp=1 cases
  were Ray tasks, one per case: Ray ends a GPU task's process after each
  call, so every case paid a process start, a CUDA context, its kernels'
  load and an NCCL set-up; docs/results/service_h200x2_2026-11-30.md
  section 8 has the figures.)

Rows: one per implementation; the fused op's row carries the first
baseline's median and the ratio (``ratio`` < 1: fused is faster); each
baseline is its own row (``variant = baseline:<impl>``, e.g.
``baseline:flashinfer_oneshot``) so trends show them beside the kernel. A
baseline that cannot run here is a ``skipped`` row with the reason, one
whose outputs are beyond its tolerance a ``fail`` row. ``extra``: per-rank
medians and p99 (``rank_median_us``, ``rank_p99_us``), bytes moved and
nccl-tests' algbw / busbw (GB/s) at the median, the rotation (sets, MB,
calls per graph), the NVTX range, what the implementation reports (e.g.
FlashInfer's version, mode and the elements differing from our bit-exact
contract); ``extra.collective_speed`` is false for any timing that is not a
collective's speed.

Not measured (``skipped`` with the reason, never a fake timing): every case
on the emulated backend (numpy on CPUs is no kernel timing), tp > 1 on
shared-GPU or virtual-rank placements (not a collective's speed), multicast,
and the indexer at tp > 1 (not a collective: timed at tp=1).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Sequence

from cluster import ops
from cluster.errors import error_text
from cluster.placement import Placement
from jobs.config import Case, Suite
from jobs.cluster_view import ClusterView, PlacementOffer
from jobs.plant import key as plant_key
from jobs.recorder import Run, now

EMULATED_REASON = ("profile needs GPUs: on the emulated backend (numpy on CPU actors) there "
                   "is no kernel timing to record")
MULTI_RANK_REASON = ("tp > 1 timing needs one rank actor per GPU (process per GPU): "
                     "virtual-rank or shared-GPU timings would not be a collective's speed")
TIMED_WORK = "timed CUDA-graph replays (per replay the slowest rank)"
LOCAL_OPS = {"indexer": "the indexer is not a collective (the same kernel runs on every "
                        "rank's GPU): it is timed at tp=1 on one GPU"}


def run(run: Run, suite: Suite, cases: Sequence[Case], *, view: ClusterView,
        timeout_s: float | None = None, plant: dict | None = None) -> None:
    """``plant``: test-only, ``jobs.plant.key(case) -> jobs.plant.Plant`` (the
    detection-power script's ``--plant-slowdown``): those cases' fused
    kernel slowed on purpose, every row of theirs marked."""
    plant = plant or {}
    if plant:
        from jobs.plant import describe
        print(describe(plant), flush=True)
    with run.section(f"profile: suite {suite.name} v{suite.version}, {len(cases)} case(s), "
                     f"backend {run.backend}", len(cases)):
        groups: OrderedDict[tuple, list[Case]] = OrderedDict()
        for case in cases:
            where = _placement(run, suite, case, view)
            if where is None:
                continue
            groups.setdefault(case.group_key, []).append(case)
        for members in groups.values():
            where = view.resolve(members[0])
            assert isinstance(where, PlacementOffer)
            _measure_group(run, suite, members, where, timeout_s or members[0].param("timeout_s"),
                           pool=view.pool, plant=plant)


def skip_reason(backend: str, case: Case, where: PlacementOffer | str) -> str | None:
    """Why ``case`` is not timed at ``where`` (a PlacementOffer, or the reason it
    has none), or None."""
    if backend == "emulated":
        return EMULATED_REASON
    if isinstance(where, str):
        return where
    if case.op not in ops.profiled():
        return f"op {case.op}: no timing workload; profiled ops: {list(ops.profiled())}"
    if case.transport != "unicast":
        return "multicast needs tp >= 2 with NVLS and is never run on these machines"
    if case.tp > 1 and case.op in LOCAL_OPS:
        return LOCAL_OPS[case.op]
    if case.tp > 1 and where.name != Placement.PROCESS_PER_GPU:
        return MULTI_RANK_REASON
    return None


def _placement(run: Run, suite: Suite, case: Case, view: ClusterView) -> PlacementOffer | None:
    """Where ``case`` is timed, or None once it is recorded as skipped with why."""
    where = None if run.backend == "emulated" else view.resolve(case)
    reason = skip_reason(run.backend, case, where)
    if reason is None:
        return where
    run.record(case, suite, outcome="skipped", started_at=now(), reason=reason)
    return None


def timing_spec(case: Case, plant=None) -> dict:
    """The harness spec of a case (:data:`cluster.measure.workload.SPEC_KEYS`);
    ``plant`` (a :class:`jobs.plant.Plant`): its delay too."""
    from cluster.cases import DEFAULTS
    return {**({"plant_delay_cycles": plant.delay_cycles} if plant else {}),"op": case.op, "hidden": case.hidden, "tokens": case.tokens, "hc": case.hc,
            "top_k": case.top_k, "calls": case.param("calls"), "replays": case.param("replays"),
            "min_replay_ms": case.param("min_replay_ms"), "min_replays": case.param("min_replays"),
            "rotate_mb": case.param("rotate_mb"),
            "budget_ns": case.param("budget_ns") if case.variant == "watchdog" else 0,
            "eps": DEFAULTS["eps"], "baselines": list(case.param("baselines")),
            "seed": case.tokens, "mode": case.op_fields().get("mode", "one_shot")}


def _measure_group(run: Run, suite: Suite, members: list[Case], where: PlacementOffer,
                   timeout_s: float, pool=None, plant: dict | None = None) -> None:
    """One rank actor per GPU: the cases on one TP group (capacity:
    their largest M), every rank timing each case's graphs at once; after a
    case that does not pass, a fresh group for the rest (a timed call cut
    short leaves the group in an unknown state)."""
    from jobs.correctness import open_group
    pending = list(members)
    while pending:
        group = open_group(run, suite, pending, where, timeout_s, pool=pool)
        if group is None:
            return
        with group:
            while pending:
                case, started = pending.pop(0), now()
                try:
                    planted = (plant or {}).get(plant_key(case))
                    per_rank = group.time(timing_spec(case, planted), timeout_s)
                except Exception as err:  # a broken case is a result, not a crash
                    kind = "hang" if isinstance(err, TimeoutError) else (
                        "fail" if isinstance(getattr(err, "cause", None), AssertionError)
                        else "error")
                    run.record(case, suite, outcome=kind, started_at=started,
                               placement=where.name, reason=error_text(err, limit=300),
                               extra=planted.extra() if planted else None)
                    break
                record_impls(run, suite, case, where, per_rank, started, planted)
        run.add_build(group.build_s)


def _gpu_columns(first: dict) -> dict:
    from cluster.measure.clocks import gpu_columns
    if "before" not in first:
        return {}
    return gpu_columns(first["before"], first["after"], first.get("device"))


def record_impls(run: Run, suite: Suite, case: Case, where: PlacementOffer, per_rank: list[dict],
                 started, planted=None) -> None:
    """One row per implementation from every rank's harness result
    (:func:`cluster.measure.timing.time_case`): the timing columns are those
    of the per-iteration max over ranks; per-rank medians and p99 go to
    ``extra``; the fused row carries the first baseline's median and the ratio.
    ``planted`` (a :class:`jobs.plant.Plant`): every row carries its mark."""
    from cluster.measure.nvtx import NVTX_DOMAIN, range_name
    from cluster.measure.stats import bandwidth, max_over_ranks, stats
    from cluster.phases import add as add_phases
    from cluster.phases import rounded
    first = per_rank[0]
    gpu = _gpu_columns(first)
    names = list(first["impls"])
    timing, ranks = {}, {}
    calls = first.get("calls", case.param("calls"))
    # host time by phase (cluster.phases): per implementation the slowest rank
    phases_s = {"inputs": max(r.get("inputs_s", 0.0) for r in per_rank)}
    for name in names:
        impls = [r["impls"][name] for r in per_rank]
        if all("times_us" in i for i in impls):
            slowest = max_over_ranks([i["times_us"] for i in impls])
            timing[name] = stats(slowest)
            ranks[name] = [stats(i["times_us"]) for i in impls]
            run.add_work(sum(slowest) * impls[0].get("calls", calls) / 1e6, TIMED_WORK)
            run.add_prepare(max(i["compile_s"] for i in impls))
            add_phases(phases_s, {"check": max(i.get("check_s", 0.0) for i in impls),
                                  "graph": max(i.get("graph_s", 0.0) for i in impls)})
    run.add_phases(phases_s)
    base = next((b for b in case.param("baselines") if b in timing), None)
    for name in names:
        progress = name == names[-1]  # one case, however many rows (implementations)
        variant = case.variant if name == "fused" else f"baseline:{name}"
        extra = {"impl": name, "collective_speed": where.collective_speed,
                 **({"case_key": case.key()} if progress else {}),
                 **({"phases_s": rounded(phases_s)} if name == "fused" else {}),
                 "nvtx_domain": NVTX_DOMAIN,
                 "nvtx_range": range_name(case.op, name, tp=case.tp, hidden=case.hidden,
                                          tokens=case.tokens),
                 "calls_per_graph": first["impls"][name].get("calls", calls),
                 "rotation_sets": first.get("sets"),
                 "replays": len(first["impls"][name].get("times_us") or ()) or None,
                 **(planted.extra() if planted else {})}
        if name not in timing:
            impls = [r["impls"][name] for r in per_rank]
            failed = next((i["failed"] for i in impls if "failed" in i), None)
            why = failed or next((i["skipped"] for i in impls if "skipped" in i),
                                 f"{name}: not timed on every rank")
            run.record(_as(case, variant), suite, outcome="fail" if failed else "skipped",
                       started_at=started, placement=where.name, reason=why, extra=extra,
                       progress=progress, **gpu)
            continue
        t = timing[name]
        impl_extra = first["impls"][name].get("extra") or {}
        extra.update(impl_extra, compile_s=round(max(r["impls"][name]["compile_s"]
                                                      for r in per_rank), 4),
                     rank_median_us=[s["t_median_us"] for s in ranks[name]],
                     rank_p99_us=[s["t_p99_us"] for s in ranks[name]])
        bw = {}
        if first.get("bytes_moved"):
            b = bandwidth(first["bytes_moved"], first["bus_factor"], t["t_median_us"])
            bw = {"algbw_gbps": b["algbw_GBps"], "busbw_gbps": b["busbw_GBps"]}
            extra.update(bytes=first["bytes_moved"], bus_factor=first["bus_factor"])
        cmp, note = {}, None
        if name == "fused" and base is not None:
            cmp = {"baseline": base, "baseline_median_us": timing[base]["t_median_us"],
                   "ratio": t["t_median_us"] / timing[base]["t_median_us"]}
            extra["ratios"] = {b: t["t_median_us"] / timing[b]["t_median_us"]
                               for b in timing if b != "fused"}
            note = f"x{cmp['ratio']:.2f} vs {base}"
        elif "flashinfer_version" in impl_extra:
            note = f"flashinfer {impl_extra['flashinfer_version']} {impl_extra['mode']}"
        run.record(_as(case, variant), suite, outcome="pass", started_at=started,
                   placement=where.name, t_max_over_ranks_median_us=t["t_median_us"], **t, **cmp,
                   **bw, **gpu, extra=extra, note=note, progress=progress)


def _as(case: Case, variant: str) -> Case:
    return dataclasses.replace(case, variant=variant)
