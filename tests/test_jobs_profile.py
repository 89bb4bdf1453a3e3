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
