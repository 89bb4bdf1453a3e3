"""The profile job: timing statistics (CPU), and on a GPU the tp=1
measurement against its same-run baselines (``gpu``-marked: skipped here)."""

import json
import statistics

import pytest

from jobs import __main__ as cli
from jobs.profiling import NVTX_DOMAIN, stats


def test_stats_are_the_results_timing_columns():
    times = [float(x) for x in range(1, 101)]
    s = stats(times)
    assert s["t_n"] == 100 and s["t_min_us"] == 1.0 and s["t_median_us"] == 50.5
    assert s["t_mean_us"] == 50.5 and s["t_p90_us"] == 90.0 and s["t_p99_us"] == 99.0
    assert s["t_stdev_us"] == pytest.approx(statistics.stdev(times))
    assert stats([3.0])["t_stdev_us"] == 0.0


@pytest.mark.gpu
def test_measure_tp1_times_fused_and_baselines_on_one_gpu():
    from jobs.profiling import measure_tp1
    out = measure_tp1({"op": "all_reduce_norm", "variant": "watchdog", "hidden": 7168,
                       "tokens": 8, "calls": 10, "replays": 20, "watchdog_ns": 1_000_000_000,
                       "rotate_mb": 16, "baselines": ["unfused", "symm_mem", "flashinfer"]})
    impls = out["impls"]
    for name in ("fused", "unfused"):
        s = stats(impls[name]["times_us"])
        assert s["t_n"] == 20 and 0.5 < s["t_median_us"] < 500, (name, s)
        assert impls[name]["compile_s"] > 0
    assert "times_us" in impls["symm_mem"] or "symmetric memory" in impls["symm_mem"]["skipped"]
    assert "skipped" in impls["flashinfer"]
    assert NVTX_DOMAIN == "lamport-lab"


@pytest.mark.gpu
def test_profile_job_records_timings_with_baselines(tmp_path, capsys):
    from cluster.backend import BACKENDS
    if "gpu" not in BACKENDS:
        pytest.skip("no gpu backend registered in cluster.backend")
    code = cli.main(["profile", "--suite", "smoke", "--backend", "gpu", "--tokens", "1,64",
                     "--results", str(tmp_path), "--trigger", "ci"])
    assert code == 0, capsys.readouterr().out
    from jobs.results import read_results
    rows = read_results(tmp_path).to_pylist()
    fused = [r for r in rows if r["variant"] == "watchdog"]
    assert len(fused) == 2
    for r in fused:
        assert r["outcome"] == "pass" and r["backend"] == "gpu" and r["tp"] == 1
        assert r["baseline"] == "unfused" and r["ratio"] > 0 and r["t_p99_us"] >= r["t_median_us"]
        assert r["t_max_over_ranks_median_us"] == r["t_median_us"]
        extra = json.loads(r["extra"])
        assert extra["collective_speed"] is True and extra["compile_s"] > 0
    assert any(r["variant"] == "baseline:unfused" and r["t_median_us"] for r in rows)


def test_rows_take_the_max_over_ranks_per_iteration(tmp_path):
    """tp > 1 (cluster.gpu.timing's per-rank results): the timing columns are
    the per-iteration max over ranks, per-rank medians go to extra, a
    baseline one rank could not run is a skipped row."""
    from cluster.gpu.timing import max_over_ranks
    from jobs.config import load_suite, suite_path
    from jobs.harness import Placement, Run, now
    from jobs.profile import record_impls
    from jobs.results import read_results
    suite = load_suite(suite_path("nightly"))
    case = next(c for c in suite.of("profile") if c.tp == 2 and c.tokens == 8)
    r0 = {"fused": {"times_us": [3.0, 5.0, 3.0], "compile_s": 1.0},
          "unfused": {"times_us": [9.0, 9.0, 12.0], "compile_s": 0.1},
          "symm_mem": {"skipped": "symm_mem unavailable: RuntimeError: x"}}
    r1 = {"fused": {"times_us": [4.0, 3.0, 3.5], "compile_s": 2.0},
          "unfused": {"times_us": [10.0, 8.0, 8.0], "compile_s": 0.1},
          "symm_mem": {"skipped": "symm_mem unavailable: RuntimeError: x"}}
    assert max_over_ranks([r0["fused"]["times_us"], r1["fused"]["times_us"]]) == [4.0, 5.0, 3.5]
    with pytest.raises(ValueError, match="different replay counts"):
        max_over_ranks([[1.0], [1.0, 2.0]])
    run = Run(results=tmp_path, trigger="ci", backend="gpu")
    record_impls(run, suite, case, Placement("process-per-gpu", 1.0, True), [r0, r1], {}, now())
    rows = {r["variant"]: r for r in read_results(tmp_path).to_pylist()}
    fused = rows["watchdog"]
    assert fused["t_median_us"] == fused["t_max_over_ranks_median_us"] == 4.0
    assert fused["t_n"] == 3 and fused["baseline"] == "unfused"
    assert fused["ratio"] == pytest.approx(4.0 / 10.0)  # unfused max over ranks: 10, 9, 12
    extra = json.loads(fused["extra"])
    assert extra["rank_median_us"] == [3.0, 3.5] and extra["compile_s"] == 2.0
    assert extra["collective_speed"] is True
    assert rows["baseline:symm_mem"]["outcome"] == "skipped"
    assert "unavailable" in rows["baseline:symm_mem"]["reason"]
