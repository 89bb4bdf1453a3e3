"""The profile job: timing statistics (CPU), and on a GPU the tp=1
measurement against its same-run baselines (``gpu``-marked: skipped here)."""

import dataclasses
import json
import statistics

import pytest

from jobs import __main__ as cli
from jobs.profiling import NVTX_DOMAIN, stats

pytestmark = pytest.mark.xdist_group("ray")  # starts Ray clusters: one at a time (conftest)


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


class FakeView:
    """Every case resolves to one rank actor per GPU."""
    def resolve(self, case):
        from jobs.harness import Placement
        return Placement("process-per-gpu", 1.0, True)


def test_tp_groups_share_a_group_and_a_case_that_hangs_gets_a_fresh_one(tmp_path, monkeypatch):
    """tp > 1 cases of one group key run on one TP group; after a hang the
    rest run on a rebuilt group; rows are recorded per case, in order."""
    from jobs import correctness, profile
    from jobs.config import load_suite, suite_path
    from jobs.harness import Run
    from jobs.results import read_results
    suite = load_suite(suite_path("nightly"))
    cases = [c for c in suite.of("profile")
             if c.op == "all_reduce_mhc" and c.tp == 2 and c.hidden == 5120]
    assert [c.tokens for c in cases] == [1, 8, 16, 64] and {c.hc for c in cases} == {4}
    opened, specs = [], []

    class FakeGroup:
        def __init__(self, members):
            opened.append([c.tokens for c in members])

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def time(self, spec, timeout_s):
            specs.append(spec)
            if spec["tokens"] == 8:
                raise TimeoutError("time: ranks [1] did not finish within 600 s")
            rank = {"fused": {"times_us": [2.0, 2.0], "compile_s": 1.0},
                    "unfused": {"times_us": [8.0, 8.0], "compile_s": 0.1}}
            return [{"rank": r, "impls": rank} for r in range(2)]

    monkeypatch.setattr(correctness, "open_group",
                        lambda run, suite, members, where, timeout_s: FakeGroup(members))
    run = Run(results=tmp_path, trigger="ci", backend="gpu")
    profile.run(run, suite, cases, view=FakeView())
    assert opened == [[1, 8, 16, 64], [16, 64]]
    assert [s["tokens"] for s in specs] == [1, 8, 16, 64]
    assert specs[0]["op"] == "all_reduce_mhc" and specs[0]["hc"] == 4
    assert specs[0]["watchdog_ns"] == 1_000_000_000 and specs[0]["baselines"] == ["unfused", "symm_mem"]
    rows = read_results(tmp_path).to_pylist()
    fused = sorted((r["tokens"], r["outcome"]) for r in rows
                   if not r["variant"].startswith("baseline"))
    assert fused == [(1, "pass"), (8, "hang"), (16, "pass"), (64, "pass")]
    hang = next(r for r in rows if r["outcome"] == "hang")
    assert hang["reason"] == "TimeoutError: time: ranks [1] did not finish within 600 s"
    assert all(r["ratio"] == 0.25 for r in rows if r["outcome"] == "pass" and r["baseline"])


def test_mhc_at_tp1_and_shared_gpu_groups_are_skipped_with_why(tmp_path):
    from jobs import profile
    from jobs.config import load_suite, suite_path
    from jobs.harness import Placement, Run
    from jobs.results import read_results
    suite = load_suite(suite_path("nightly"))
    norm2 = next(c for c in suite.of("profile") if c.op == "all_reduce_norm" and c.tp == 2)
    mhc2 = next(c for c in suite.of("profile") if c.op == "all_reduce_mhc")
    mhc1 = dataclasses.replace(mhc2, tp=1)

    class SharedView:
        def resolve(self, case):
            return Placement("shared-gpu" if case.tp > 1 else "process-per-gpu",
                             1.0 / case.tp, case.tp == 1)

    run = Run(results=tmp_path, trigger="ci", backend="gpu")
    profile.run(run, suite, [mhc1, norm2], view=SharedView())
    rows = {(r["op"], r["tp"]): r for r in read_results(tmp_path).to_pylist()}
    assert all(r["outcome"] == "skipped" for r in rows.values())
    assert "benchmarks.all_reduce_mhc" in rows[("all_reduce_mhc", 1)]["reason"]
    assert rows[("all_reduce_norm", 2)]["reason"] == profile.MULTI_RANK_REASON


@pytest.mark.parametrize("op", ["all_reduce_norm", "all_reduce_mhc"])
def test_timing_workloads_check_the_fused_outputs_against_the_reference(op):
    """cluster.gpu.timing's per-op pieces on CPU tensors: a 'fused op' that
    writes the reference passes the check, one off by a BF16 ULP in the
    residual fails it; the unfused tail after an all-reduce matches too."""
    import torch

    from cluster.gpu import timing
    from kernels.reference.allreduce import all_reduce_norm
    from kernels.reference.mhc import all_reduce_mhc
    m, hidden, hc, eps, tp = 3, 64, 4, 1e-6, 2
    gens = [torch.Generator().manual_seed(7 * 1009 + r) for r in range(tp)]
    works = []
    for r in range(tp):
        common = dict(m=m, hidden=hidden, eps=eps, device="cpu", sets=2, mine=gens[r],
                      shared=torch.Generator().manual_seed(7))
        works.append(timing.norm_workload(**common) if op == "all_reduce_norm"
                     else timing.mhc_workload(hc=hc, **common))
    partials = [w.x[0] for w in works]
    work = works[0]
    assert timing.set_bytes(op, m, hidden, hc) > 4 * m * hidden

    class Reference:
        """Writes the reference outputs over all ranks' partials of set i."""
        tuning = type("T", (), {"rank_lanes": 1})
        wrong = False

        def __call__(self, x, *args, out):
            i = next(k for k in range(2) if work.x[k].data_ptr() == x.data_ptr())
            xs = [w.x[i] for w in works]
            if op == "all_reduce_norm":
                norm, res = all_reduce_norm(xs, *args[:2], eps)
                out[0].copy_(norm), out[1].copy_(res)
            else:
                res, layer = all_reduce_mhc(xs, *args[:5], eps)
                out[0].copy_(res), out[1].copy_(layer)
            if self.wrong:
                bits = out[1 if op == "all_reduce_norm" else 0].view(torch.int16)
                bits.view(-1)[5] += 1

    fused = Reference()
    call = work.fused(fused)
    call(0)
    work.check(partials)
    fused.wrong = True
    call(0)
    with pytest.raises(AssertionError, match="residual_out"):
        work.check(partials)
    reduced = (partials[0].float() + partials[1].float()).to(torch.bfloat16)
    tail = work.tail(reduced, 0)
    assert all(t.dtype == torch.bfloat16 and t.shape[0] == m for t in tail)
