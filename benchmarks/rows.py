"""``--results DIR`` of the benchmark commands: each harness result
(:func:`cluster.measure.timing.measure_tp1`) also written as the profile
rows ``python -m jobs profile`` writes for the same case (suite
``benchmarks``, trigger ``adhoc``, one row per implementation)."""

from __future__ import annotations

from pathlib import Path


class BenchmarkRows:
    """Writes rows when ``results`` is given; otherwise does nothing."""

    def __init__(self, results: Path | None, command: str) -> None:
        from jobs.config import Suite
        self.run = None
        if results is not None:
            from jobs.recorder import Run
            from jobs.results import env_info
            self.run = Run(results=Path(results), trigger="adhoc", backend="gpu",
                           environment=env_info())
        self.suite = Suite(name="benchmarks", version=1, description=command,
                           path=Path(command), selfcheck=None, compile_check=None, cases=())

    def record(self, spec: dict, out: dict) -> None:
        """Rows of one :func:`measure_tp1` result for ``spec`` (variant
        ``watchdog`` when it has a watchdog budget, else ``plain``)."""
        if self.run is None:
            return
        from cluster.placement import Placement
        from jobs.config import Case
        from jobs.cluster_view import PlacementOffer
        from jobs.recorder import now
        from jobs.profile import record_impls
        case = Case(job="profile", op=spec["op"], variant="watchdog" if spec.get("budget_ns")
                    else "plain", transport="unicast", placement=Placement.PROCESS_PER_GPU, tp=1,
                    hidden=spec["hidden"], tokens=spec["tokens"], top_k=spec.get("top_k"),
                    hc=spec.get("hc"), dtype="bfloat16", repeats=1,
                    params=(("baselines", tuple(spec["baselines"])), ("calls", spec["calls"]),
                            ("replays", spec["replays"]), ("rotate_mb", spec["rotate_mb"])))
        record_impls(self.run, self.suite, case,
                     PlacementOffer(Placement.PROCESS_PER_GPU, 1.0, True), [out], now())

    def plain_and_watchdog(self, spec: dict, budget_ns: int):
        """:func:`measure_tp1` of ``spec`` (the plain consumer and its
        baselines; the fused outputs checked first) and of its watchdog
        build alone, both recorded; returns ``(plain, watchdog)`` with
        ``(median, p10, p90)`` of ``fused``, ``unfused`` and the watchdog's
        fused under ``"stats"``."""
        from cluster.measure.timing import measure_tp1
        from cluster.measure.stats import median_p10_p90
        plain = measure_tp1({**spec, "budget_ns": 0})
        wd_spec = {**spec, "budget_ns": budget_ns, "baselines": []}
        wd = measure_tp1(wd_spec)
        self.record({**spec, "budget_ns": 0}, plain)
        self.record(wd_spec, wd)
        plain["stats"] = [median_p10_p90(res["impls"][n]["times_us"]) for res, n in (
            (plain, "fused"), (plain, "unfused"), (wd, "fused"))]
        return plain, wd

    def close(self) -> None:
        if self.run is not None:
            print(f"rows: {self.run.rows_written} written to {self.run.results} "
                  f"(run {self.run.run_id})")
