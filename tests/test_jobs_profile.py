"""The profile job: rows from the harness's per-rank results (CPU), skip
reasons, TP groups shared by cases, and on a GPU the tp=1 measurement
against its same-run baselines (``gpu``-marked: skipped here)."""

import dataclasses
import json

import pytest

from cluster.measure.nvtx import NVTX_DOMAIN
from cluster.measure.stats import stats
from cluster import ops
from jobs import __main__ as cli

pytestmark = pytest.mark.xdist_group("ray")  # starts Ray clusters: one at a time (conftest)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ops.profiled())
def test_measure_tp1_times_fused_and_baselines_on_one_gpu(op):
    from cluster.measure.timing import measure_tp1
    out = measure_tp1({"op": op, "hidden": 7168, "tokens": 8, "hc": 4, "top_k": 8,
                       "calls": 10, "replays": 20, "budget_ns": 1_000_000_000, "eps": 1e-6,
                       "rotate_mb": 16, "seed": 8,
                       "baselines": ["unfused", "symm_mem", "flashinfer", "stock"]})
    impls = out["impls"]
    for name in ("fused", "stock" if op == "indexer" else "unfused"):
        s = stats(impls[name]["times_us"])
        assert s["t_n"] == 20 and 0.5 < s["t_median_us"] < 500, (name, s)
        assert impls[name]["compile_s"] > 0
    if op == "all_reduce_norm":
        assert "times_us" in impls["symm_mem"], impls["symm_mem"]
        for mode in ("oneshot", "twoshot"):  # FlashInfer needs a TP group of >= 2
            assert "skipped" in impls[f"flashinfer_{mode}"]
    assert NVTX_DOMAIN == "lamport-lab"


@pytest.mark.gpu
def test_profile_job_records_timings_with_baselines(tmp_path, capsys):
    """The smoke suite's all_reduce_norm profile at M 1 and 64 on one GPU:
    a fused row per M against the unfused baseline, each graph at least the
    case's ``calls`` and every rotation set long, replayed as
    ``scaled_replays`` says, and the baseline's own row beside it."""
    from cluster.backend import BACKENDS
    from cluster.measure.graph import scaled_replays
    from jobs.config import load_suite, suite_path
    if "gpu" not in BACKENDS:
        pytest.skip("no gpu backend registered in cluster.backend")
    code = cli.main(["profile", "--suite", "smoke", "--backend", "gpu", "--tokens", "1,64",
                     "--results", str(tmp_path), "--trigger", "ci"])
    assert code == 0, capsys.readouterr().out
    from jobs.results import read_results
    case = next(c for c in load_suite(suite_path("smoke")).of("profile")
                if c.op == "all_reduce_norm")
    calls, replays, floor = (case.param(k) for k in ("calls", "replays", "min_replays"))
    rows = [r for r in read_results(tmp_path).to_pylist() if r["op"] == "all_reduce_norm"]

    def graph_facts(r) -> dict:
        extra = json.loads(r["extra"])
        assert extra["calls_per_graph"] >= max(calls, extra["rotation_sets"]), (r["variant"], extra)
        assert extra["replays"] == scaled_replays(replays, calls, extra["calls_per_graph"],
                                                  floor), (r["variant"], extra)
        assert extra["compile_s"] > 0 and r["t_p99_us"] >= r["t_median_us"] > 0
        return extra

    fused = [r for r in rows if r["variant"] == case.variant]
    assert sorted(r["tokens"] for r in fused) == [1, 64]
    for r in fused:
        assert r["outcome"] == "pass" and r["backend"] == "gpu" and r["tp"] == 1
        assert r["baseline"] == "unfused" and r["ratio"] > 0
        assert r["t_max_over_ranks_median_us"] == r["t_median_us"]
        assert graph_facts(r)["collective_speed"] is True
    unfused = [r for r in rows if r["variant"] == "baseline:unfused"]
    assert sorted(r["tokens"] for r in unfused) == [1, 64]
    for r in unfused:
        assert r["outcome"] == "pass"
        graph_facts(r)
        same_m = next(f for f in fused if f["tokens"] == r["tokens"])
        assert same_m["baseline_median_us"] == r["t_median_us"]


def _rank(r: int, impls: dict) -> dict:
    """A harness result of rank r (cluster.measure.timing.time_case)."""
    state = {"sm_clock_mhz": 1980, "mem_clock_mhz": 3201, "temp_c": 40 + r}
    return {"rank": r, "impls": impls, "sets": 120, "set_bytes": 2**20, "calls": 120,
            "bytes_moved": 8 * 5120 * 2, "bus_factor": 1.0, "collective": True,
            "before": state, "after": state, "device": "NVIDIA H200", "inputs_s": 1.0 + 0.5 * r}


def test_rows_take_the_max_over_ranks_per_iteration(tmp_path):
    """tp > 1 (the harness's per-rank results): the timing columns are the
    per-iteration max over ranks, per-rank medians go to extra, a baseline
    one rank could not run is a skipped row, one beyond its tolerance a
    fail row, FlashInfer's rows name its version and mode."""
    from jobs.config import load_suite, suite_path
    from jobs.cluster_view import PlacementOffer
    from jobs.recorder import Run, now
    from jobs.profile import record_impls
    from jobs.results import read_results
    suite = load_suite(suite_path("nightly"))
    case = next(c for c in suite.of("profile") if c.tp == 2 and c.tokens == 8)
    r0 = {"fused": {"times_us": [3.0, 5.0, 3.0], "compile_s": 1.0, "check_s": 0.25,
                    "graph_s": 0.5},
          "unfused": {"times_us": [9.0, 9.0, 12.0], "compile_s": 0.1, "calls": 600,
                      "check_s": 0.0, "graph_s": 0.75},
          "symm_mem": {"skipped": "symm_mem unavailable: RuntimeError: x"},
          "flashinfer_oneshot": {"times_us": [5.0, 5.0, 5.0], "compile_s": 3.0,
                                 "extra": {"flashinfer_version": "0.7.2.post1", "mode": "oneshot",
                                           "contract_diff": {"residual_out_differs": 7}}},
          "flashinfer_twoshot": {"failed": "flashinfer_twoshot: beyond its tolerance"}}
    r1 = {"fused": {"times_us": [4.0, 3.0, 3.5], "compile_s": 2.0, "check_s": 0.5,
                    "graph_s": 0.25},
          "unfused": {"times_us": [10.0, 8.0, 8.0], "compile_s": 0.1, "calls": 600,
                      "check_s": 0.0, "graph_s": 1.0},
          "symm_mem": {"skipped": "symm_mem unavailable: RuntimeError: x"},
          "flashinfer_oneshot": {"times_us": [6.0, 5.0, 5.0], "compile_s": 3.0},
          "flashinfer_twoshot": {"skipped": "flashinfer_twoshot could not run on 1 other rank(s)"}}
    run = Run(results=tmp_path, trigger="ci", backend="gpu")
    with run.section("profile: one case", 1):
        record_impls(run, suite, case, PlacementOffer("process-per-gpu", 1.0, True),
                     [_rank(0, r0), _rank(1, r1)], now())
    # One case (five rows); the timed work is every timed replay's slowest
    # rank x the calls in its graph: fused 4+5+3.5, unfused 10+9+12 (a graph
    # lengthened to 600 calls by a replay floor), FI 6+5+5.
    (acct,) = run.accounting
    assert acct["cases"] == 1
    assert acct["work_s"] == pytest.approx(((12.5 + 16) * 120 + 31 * 600) / 1e6)
    assert acct["overhead"] is not None
    assert acct["prepare_s"] == pytest.approx(2.0 + 0.1 + 3.0)  # slowest rank's build, per impl
    # host time by phase, per implementation the slowest rank (FlashInfer's
    # one-shot reports no check or graph time here: counted as 0)
    assert acct["phases_s"] == pytest.approx({"inputs": 1.5, "check": 0.5, "graph": 0.5 + 1.0})
    rows = {r["variant"]: r for r in read_results(tmp_path).to_pylist()}
    fused = rows["watchdog"]
    assert fused["t_median_us"] == fused["t_max_over_ranks_median_us"] == 4.0
    assert fused["t_n"] == 3 and fused["baseline"] == "unfused"
    assert fused["ratio"] == pytest.approx(4.0 / 10.0)  # unfused max over ranks: 10, 9, 12
    extra = json.loads(fused["extra"])
    assert extra["rank_median_us"] == [3.0, 3.5] and extra["compile_s"] == 2.0
    assert extra["phases_s"] == acct["phases_s"]  # the case's, on its fused row
    assert extra["replays"] == 3  # the replays timed, not the suite's (min_replays may cut them)
    assert extra["collective_speed"] is True
    # nccl-tests' algbw and busbw (all-reduce at tp 2: factor 2 (2 - 1) / 2 = 1), as columns
    assert extra["bytes"] == 8 * 5120 * 2 and extra["bus_factor"] == 1.0
    assert fused["algbw_gbps"] == pytest.approx(81920 / 4e3)
    assert fused["busbw_gbps"] == pytest.approx(81920 / 4e3 * 1.0)
    assert "algbw_GBps" not in extra
    assert rows["baseline:symm_mem"]["algbw_gbps"] is None  # skipped: no timing
    assert extra["nvtx_range"] == "all_reduce_norm/fused tp=2 hidden=5120 M=8"
    assert fused["sm_clock_mhz_before"] == 1980 and fused["gpu_model"] == "NVIDIA H200"
    assert extra["ratios"]["flashinfer_oneshot"] == pytest.approx(4.0 / 5.0)  # max over ranks: 6, 5, 5
    assert rows["baseline:symm_mem"]["outcome"] == "skipped"
    assert "unavailable" in rows["baseline:symm_mem"]["reason"]
    fi = rows["baseline:flashinfer_oneshot"]
    assert fi["outcome"] == "pass" and fi["t_median_us"] == 5.0
    fi_extra = json.loads(fi["extra"])
    assert (fi_extra["flashinfer_version"], fi_extra["mode"]) == ("0.7.2.post1", "oneshot")
    assert fi_extra["contract_diff"] == {"residual_out_differs": 7}
    two = rows["baseline:flashinfer_twoshot"]
    assert two["outcome"] == "fail" and "beyond its tolerance" in two["reason"]


class FakeView:
    """Every case resolves to one rank actor per GPU; no worker pool."""
    pool = None

    def resolve(self, case):
        from jobs.cluster_view import PlacementOffer
        return PlacementOffer("process-per-gpu", 1.0, True)


def test_tp_groups_share_a_group_and_a_case_that_hangs_gets_a_fresh_one(tmp_path, monkeypatch):
    """tp > 1 cases of one group key run on one TP group; after a hang the
    rest run on a rebuilt group; rows are recorded per case, in order."""
    from jobs import correctness, profile
    from jobs.config import load_suite, suite_path
    from jobs.recorder import Run
    from jobs.results import read_results
    suite = load_suite(suite_path("nightly"))
    cases = [c for c in suite.of("profile")
             if c.op == "all_reduce_mhc" and c.tp == 2 and c.hidden == 5120]
    assert [c.tokens for c in cases] == [1, 8, 16, 64] and {c.hc for c in cases} == {4}
    opened, specs = [], []

    class FakeGroup:
        build_s = 2.5

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
                        lambda run, suite, members, where, timeout_s, pool=None: FakeGroup(members))
    run = Run(results=tmp_path, trigger="ci", backend="gpu")
    profile.run(run, suite, cases, view=FakeView())
    assert opened == [[1, 8, 16, 64], [16, 64]]
    assert run.accounting[-1]["build_s"] == 2 * 2.5  # both builds, the one after the hang too
    assert [s["tokens"] for s in specs] == [1, 8, 16, 64]
    assert specs[0]["op"] == "all_reduce_mhc" and specs[0]["hc"] == 4
    assert specs[0]["budget_ns"] == 1_000_000_000 and specs[0]["baselines"] == ["unfused", "symm_mem"]
    rows = read_results(tmp_path).to_pylist()
    fused = sorted((r["tokens"], r["outcome"]) for r in rows
                   if not r["variant"].startswith("baseline"))
    assert fused == [(1, "pass"), (8, "hang"), (16, "pass"), (64, "pass")]
    hang = next(r for r in rows if r["outcome"] == "hang")
    assert hang["reason"] == "TimeoutError: time: ranks [1] did not finish within 600 s"
    assert all(r["ratio"] == 0.25 for r in rows if r["outcome"] == "pass" and r["baseline"])


def test_tp1_cases_share_a_group_of_one_rank(tmp_path, monkeypatch):
    """tp=1 cases of one group key are timed on one rank actor, built once
    (a Ray task per case paid a new process, CUDA context, kernel load and
    NCCL set-up each time: Ray ends a GPU task's process after each call)."""
    from jobs import correctness, profile
    from jobs.config import load_suite, suite_path
    from jobs.recorder import Run
    from jobs.results import read_results
    suite = load_suite(suite_path("nightly"))
    cases = [c for c in suite.of("profile") if c.tp == 1 and c.op in ("all_reduce_norm", "indexer")]
    assert len(cases) == 12  # all_reduce_norm: 2 hidden x 4 M; indexer: 4 M
    opened, timed = [], []

    class FakeGroup:
        build_s = 0.5

        def __init__(self, members):
            opened.append((members[0].op, members[0].hidden, [c.tokens for c in members]))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def time(self, spec, timeout_s):
            timed.append((spec["op"], spec["tokens"]))
            return [{"rank": 0, "impls": {"fused": {"times_us": [2.0], "compile_s": 1.0}}}]

    monkeypatch.setattr(correctness, "open_group",
                        lambda run, suite, members, where, timeout_s, pool=None: FakeGroup(members))
    run = Run(results=tmp_path, trigger="ci", backend="gpu")
    profile.run(run, suite, cases, view=FakeView())
    assert opened == [("all_reduce_norm", 5120, [1, 8, 16, 64]),
                      ("all_reduce_norm", 7168, [1, 8, 16, 64]), ("indexer", 7168, [1, 8, 16, 64])]
    assert len(timed) == 12
    rows = read_results(tmp_path).to_pylist()
    assert {(r["op"], r["outcome"], r["placement"]) for r in rows} == {
        ("all_reduce_norm", "pass", "process-per-gpu"), ("indexer", "pass", "process-per-gpu")}


def test_every_op_is_profiled_and_what_cannot_be_timed_says_why(tmp_path):
    from jobs import profile
    from jobs.config import load_suite, suite_path
    from jobs.cluster_view import PlacementOffer
    from jobs.recorder import Run
    from jobs.results import read_results
    suite = load_suite(suite_path("nightly"))
    assert {c.op for c in suite.of("profile")} == set(ops.profiled())
    assert {c.tp for c in suite.of("profile") if c.op == "all_reduce_mhc"} == {1, 2, 4, 8}
    norm2 = next(c for c in suite.of("profile") if c.op == "all_reduce_norm" and c.tp == 2)
    idx2 = dataclasses.replace(next(c for c in suite.of("profile") if c.op == "indexer"), tp=2)

    class SharedView:
        def resolve(self, case):
            return PlacementOffer("shared-gpu" if case.tp > 1 else "process-per-gpu",
                             1.0 / case.tp, case.tp == 1)

    run = Run(results=tmp_path, trigger="ci", backend="gpu")
    profile.run(run, suite, [idx2, norm2], view=SharedView())
    rows = {(r["op"], r["tp"]): r for r in read_results(tmp_path).to_pylist()}
    assert all(r["outcome"] == "skipped" for r in rows.values())
    assert rows[("indexer", 2)]["reason"] == profile.LOCAL_OPS["indexer"]
    assert rows[("all_reduce_norm", 2)]["reason"] == profile.MULTI_RANK_REASON
    assert profile.skip_reason("emulated", norm2, None) == profile.EMULATED_REASON


def test_timing_spec_carries_the_case():
    from jobs.config import load_suite, suite_path
    from jobs.profile import timing_spec
    from cluster.measure.workload import Spec
    suite = load_suite(suite_path("nightly"))
    fin = next(c for c in suite.of("profile") if c.op == "finalize_publish" and c.tp == 4
               and c.op_fields()["mode"] == "one_shot")
    spec = Spec.of(timing_spec(fin))
    assert spec.top_k == 8 and spec.budget_ns == 1_000_000_000 and spec.seed == fin.tokens
    assert spec.baselines == ("unfused", "symm_mem") and spec.mode == "one_shot"
    owner = next(c for c in suite.of("profile") if c.op == "finalize_publish" and c.tp == 4
                 and c.op_fields()["mode"] == "owner")
    spec = Spec.of(timing_spec(owner))
    assert spec.mode == "owner" and spec.baselines == ("one_shot",)


def test_benchmark_results_are_written_as_profile_rows(tmp_path):
    """benchmarks --results: a harness result becomes the rows the profile
    job writes (suite benchmarks, variant plain / watchdog, baselines)."""
    from benchmarks.rows import BenchmarkRows
    from jobs.results import read_results
    spec = dict(op="all_reduce_norm", hidden=64, tokens=3, calls=50, replays=2, rotate_mb=1.0,
                eps=1e-6, seed=3, budget_ns=0, baselines=["unfused"])
    rows = BenchmarkRows(tmp_path, "python -m benchmarks.all_reduce_norm")
    rows.record(spec, _rank(0, {"fused": {"times_us": [3.0, 3.0], "compile_s": 1.0},
                                "unfused": {"times_us": [9.0, 9.0], "compile_s": 0.1}}))
    rows.record({**spec, "budget_ns": 10, "baselines": []},
                _rank(0, {"fused": {"times_us": [4.0, 4.0], "compile_s": 1.0}}))
    got = {r["variant"]: r for r in read_results(tmp_path).to_pylist()}
    assert sorted(got) == ["baseline:unfused", "plain", "watchdog"]
    assert got["plain"]["ratio"] == pytest.approx(3.0 / 9.0) and got["plain"]["suite"] == "benchmarks"
    assert got["watchdog"]["t_median_us"] == 4.0 and got["watchdog"]["tp"] == 1
