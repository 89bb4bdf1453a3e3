"""``python -m jobs nightly --suite smoke`` end to end: the dataset it writes,
the fault campaign's verdicts, the console, the report of the run.

The run is the one the README's Ray section submits to a local head
(tests/readme_ray.py, shared with test_jobs_submit.py: one smoke nightly a
test session, not two); on a CPU machine its backend is the emulated one.
The embedded cluster the README's first command starts is tested on its
own (test_embedded_cluster.py: loopback, token, cleanup after a kill)."""

import datetime as dt
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.faults import FAULT_KINDS
from jobs import __main__ as cli
from jobs.config import load_suite, suite_path
from jobs.recorder import Run
from jobs.results import COLUMNS, read_results

# The README run's group (its smoke nightly: about 3 minutes on a loaded
# 2-core machine; the module gets 20).
pytestmark = [pytest.mark.xdist_group("ray-head"), pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[1]

IDENTITY = {"run_id", "started_at", "finished_at", "trigger", "git_commit", "suite", "job", "op",
            "outcome", "hostname", "python", "torch", "pyarrow", "ray", "cute_dsl", "extra"}
CLUSTER = IDENTITY | {"variant", "transport", "placement", "backend", "tp", "hidden", "tokens",
                      "dtype", "nodes", "gpu_count", "topology", "multicast_supported"}
APPLIES = {
    "correctness": CLUSTER | {"max_ulp", "mismatches", "elements"},
    "faults": CLUSTER | {"fault_kind", "fault_expected", "fault_seen", "missing_ranks",
                         "diagnosis"},
    "profile": CLUSTER | {"reason", "repro_command"},
    "selfcheck": IDENTITY - {"extra"} | {"variant", "backend", "placement", "elements",
                                         "mismatches", "max_ulp", "repro_command"},
    "compile-check": IDENTITY | {"variant", "backend"},
}
NOT_ON_CPU = {
    # Timings and GPU state: the profile job records `skipped` off GPUs.
    "t_n", "t_min_us", "t_median_us", "t_mean_us", "t_p90_us", "t_p99_us", "t_stdev_us",
    "t_max_over_ranks_median_us", "baseline", "baseline_median_us", "ratio",
    "algbw_gbps", "busbw_gbps",
    "sm_clock_mhz_before", "sm_clock_mhz_after", "mem_clock_mhz", "temp_c_before",
    "temp_c_after", "gpu_model", "driver", "cuda",
    # Finalize / mHC ops only, and failing cases only.
    "top_k", "hc", "max_abs_err",
    # Watchdog position: faults with a timeout record (checked below).
    "fault_token", "fault_fragment", "fault_stage",
}
STRAGGLERS = {"publish_skew_us", "publish_skew_max_us", "last_rank", "last_rank_share",
              "publish_offsets_us"}
"""Correctness rows of groups of two ranks or more only (checked below)."""


@pytest.fixture(scope="module")
def smoke(readme_ray_run):
    """(the run's console, its rows with ``extra`` parsed as ``x``, the
    folder holding ``results`` and ``site``)."""
    root = readme_ray_run.root
    results = root / "ray-results"
    rows = read_results(results).to_pylist() if results.is_dir() else []
    for r in rows:
        r["x"] = json.loads(r["extra"] or "{}")
    return readme_ray_run, rows, root


def test_nightly_smoke_passes(smoke):
    run, rows, root = smoke
    out = run.out
    assert run.done.returncode == 0, out[-8000:]
    assert "ray: joined the Ray cluster at" in out
    assert "backend: emulated (auto" in out, out[:3000]
    assert "regression: no timed case in this run" in out
    assert "dashboard: built" in out or "dashboard: not built" in out
    assert "0 fail, 0 hang, 0 error" in out
    assert f"rows written to {root / 'ray-results'}/ (run " in out
    # Skip reasons: in full, each distinct one once with its count, after its table.
    skipped = [r for r in rows if r["outcome"] == "skipped"]
    for reason in {r["reason"] for r in skipped}:  # once per part it appears in
        n = sum(r["reason"] == reason for r in skipped)
        listed = re.findall(rf"   \[\d+\] (\d+) case\(s\): {re.escape(reason)}\n", out)
        assert listed and sum(map(int, listed)) == n, (reason, listed, n)
    # The rank killed on purpose is announced before Ray reports it.
    assert re.search(r">> dirty_mailbox: rank \d of tp=\d exits after its publish, on purpose; "
                     r"Ray reports its worker as died or killed next", out), out[-4000:]
    suite = load_suite(suite_path("smoke"))
    jobs = {r["job"] for r in rows}
    assert jobs == {"selfcheck", "compile-check", "correctness", "faults", "profile"}
    assert len({r["run_id"] for r in rows}) == 1
    assert sum(r["job"] in ("correctness", "faults", "profile") for r in rows) == len(suite.cases)


def test_the_readme_block_leaves_only_what_git_ignores(smoke):
    """Its head's directory, results and sites (the interrupted run's too)
    are all git-ignored outputs: nothing a clone's ``git status`` lists."""
    from tests.docs_commands import left_behind
    run, _, root = smoke
    assert (root / "ray-results").is_dir() and (root / ".ray-head").is_dir()
    assert left_behind(root) == [], run.out[-3000:]


def test_the_run_finished_compacted_with_its_facts_once(smoke):
    _, rows, root = smoke
    results = root / "ray-results"
    assert {r["run_status"] for r in rows} == {"finished"}
    (run_id,) = {r["run_id"] for r in rows}
    files = sorted(results.rglob("*.parquet"))  # one per partition
    assert files and all(re.fullmatch(rf"run-{run_id}-[0-9a-f]{{12}}\.parquet", f.name)
                         for f in files) and len({f.parent for f in files}) == len(files)
    manifest = json.loads((results / "_runs" / f"{run_id}.json").read_text())
    assert manifest["status"] == "finished" and manifest["facts"]["topology"]
    assert {r["topology"] for r in rows} == {manifest["facts"]["topology"]}
    assert ((root / "ray-site") / ".lamport-lab-site").is_file()


def test_rows_carry_every_schema_field_that_applies(smoke):
    _, rows, _ = smoke
    names = {c.name for c in COLUMNS}
    assert set().union(*APPLIES.values()) | NOT_ON_CPU | STRAGGLERS | \
        {"reason", "repro_command"} == names, "a new column needs a decision here"
    for r in rows:
        several = r["job"] == "correctness" and r["outcome"] == "pass" and r["tp"] > 1 \
            and r["placement"] == "emulated"
        filled = sorted(c for c in STRAGGLERS if r[c] is not None)
        assert filled == (sorted(STRAGGLERS) if several else []), (r["job"], r["op"], r["tp"])
    virtual = [r for r in rows if r["placement"] == "virtual-ranks"]
    assert virtual and all(r["job"] == "correctness" and r["outcome"] == "skipped"
                           and "needs the gpu backend" in r["reason"] for r in virtual)
    indexer = [r for r in rows if r["op"] == "indexer" and r["job"] == "correctness"]
    assert indexer and all(r["outcome"] == "skipped" and r["reason"] == (
        "op indexer: needs a GPU: not a collective; runs on each rank actor's GPU")
        for r in indexer)
    rows = [r for r in rows if r["placement"] != "virtual-ranks" and r not in indexer]
    for r in rows:
        missing = sorted(c for c in APPLIES[r["job"]] if r[c] is None)
        assert not missing, (r["job"], r["op"], r.get("fault_kind"), missing)
        assert r["trigger"] == "nightly" and r["suite"] == "smoke"
        if r["job"] in ("correctness", "faults", "profile"):
            assert r["backend"] == "emulated" and r["placement"] == "emulated"
            assert r["multicast_supported"] is False
            assert r["x"]["suite_version"] == load_suite(suite_path("smoke")).version
    for r in rows:
        if r["job"] == "profile":
            assert r["outcome"] == "skipped" and "emulated backend" in r["reason"]
            assert r["t_median_us"] is None  # never a fake timing
        if r["job"] == "correctness":
            assert r["outcome"] == "pass" and r["mismatches"] == 0 and r["max_ulp"] == 0
            assert r["x"]["collective"] is True
            if r["op"] == "all_reduce_norm":
                assert r["elements"] == 2 * r["tp"] * 3 * r["tokens"] * r["hidden"]
            else:
                assert r["elements"] >= r["tp"] * 2 * r["tokens"] * r["hidden"]


def test_every_op_runs_and_no_row_says_the_cluster_cannot(smoke):
    """Issue 15: the emulated smoke passes every collective op (finalize,
    embedding, mHC with and without its finalize) and marks the indexer
    (no collective) as needing a GPU; no row says an op is not run by the
    cluster."""
    from cluster import ops
    _, rows, _ = smoke
    correctness = [r for r in rows if r["job"] == "correctness"]
    passed = {r["op"] for r in correctness if r["outcome"] == "pass"}
    assert passed == set(ops.collective())
    assert {r["x"].get("finalize") for r in correctness if r["op"] == "all_reduce_mhc"} \
        == {False, True}
    assert {r["op"] for r in correctness} == set(ops.names())
    assert [r["x"]["collective"] for r in correctness if r["op"] == "indexer"] == [False] * 3
    for r in rows:
        assert "cluster runs only" not in (r["reason"] or "") and "so far" not in (r["reason"] or "")
    faulted = {r["op"] for r in rows if r["job"] == "faults" and r["outcome"] == "pass"}
    assert faulted == set(ops.collective())


def test_the_fault_campaign_meets_every_expected_outcome(smoke):
    _, rows, _ = smoke
    every = [r for r in rows if r["job"] == "faults"]
    assert all(r["outcome"] == "pass" for r in every), [
        (r["op"], r["fault_kind"], r["reason"]) for r in every if r["outcome"] != "pass"]
    from cluster import ops
    others = {(r["op"], r["fault_kind"]) for r in every if r["op"] != "all_reduce_norm"}
    assert others == {(op, k) for op in set(ops.collective()) - {"all_reduce_norm"}
                      for k in ("skip_publish", "negative_zero_payload", "unsanitized_lane")}
    faults = {r["fault_kind"]: r for r in every if r["op"] == "all_reduce_norm"}
    assert set(faults) == set(FAULT_KINDS)
    for kind, r in faults.items():
        assert r["outcome"] == "pass", (kind, r["reason"])
        assert r["fault_expected"] and r["fault_seen"]
    skip = faults["skip_publish"]
    assert skip["missing_ranks"] == [skip["tp"] - 1] and skip["x"]["call_outcome"] == "hang"
    assert "missing ranks: {3}" in skip["diagnosis"]
    assert skip["fault_token"] is not None and skip["fault_fragment"] is not None \
        and skip["fault_stage"] is not None
    assert faults["stuck_rank"]["x"]["call_outcome"] == "hang"
    assert faults["late_within_budget"]["x"]["call_outcome"] == "pass"
    # the cases that rebuilt their group say so, and the job's closing line counts them
    assert {k for k, r in faults.items() if r["x"]["rebuilt"]} == {"dirty_mailbox", "stuck_rank"}
    rebuilt = sum(r["x"]["rebuilt"] for r in every)
    assert re.search(rf"\(.*, group builds \d+\.\d s, kernel preparation \d+\.\d s, "
                     rf"{rebuilt} case\(s\) "
                     rf"rebuilt their group \(\d+\.\d s of case time\), host time in cases, "
                     rf"slowest rank: inputs \d+\.\d s, call .*check \d+\.\d s\)", smoke[0].out), \
        smoke[0].out[-3000:]
    # the first case of each group pays its kernels' preparation, and says so
    first = {}
    for r in sorted(every, key=lambda r: r["started_at"]):
        first.setdefault(r["x"]["group_id"], r)
    assert all(r["x"].get("prepare_s", 0) > 0 for r in first.values()), \
        [(r["fault_kind"], r["x"].get("prepare_s")) for r in first.values()]
    # and every row names its group's build time (starting rank processes is not free)
    assert all(r["x"]["group_build_s"] > 0 for r in every)
    # of it, a pooled group's wait for its lease
    assert all(0 <= r["x"]["group_lease_s"] <= r["x"]["group_build_s"] for r in every
               if r["x"]["pooled"]), [r["x"] for r in every][:3]


def test_report_prints_the_run_and_compares(smoke, capsys):
    _, rows, root = smoke
    run_id = rows[0]["run_id"]
    assert cli.main(["report", "--results", str(root / "ray-results")]) == 0
    out = capsys.readouterr().out
    assert f"run {run_id}" in out and "trigger=nightly" in out
    faults = len(load_suite(suite_path("smoke")).of("faults"))
    assert re.search(rf"^smoke +faults +{faults} +0 ", out, re.M), out
    assert cli.main(["report", "--results", str(root / "ray-results"), run_id[:20], run_id]) == 0
    assert "0 case(s) changed outcome" in capsys.readouterr().out
    assert cli.main(["report", "--results", str(root / "ray-results"), "nosuch"]) == 2
    assert "run 'nosuch': unknown" in capsys.readouterr().err


def test_failing_rows_carry_their_repro_command(tmp_path, capsys):
    suite = load_suite(suite_path("smoke"))
    case = suite.of("correctness")[5]
    run = Run(results=tmp_path, trigger="ci", backend="emulated")
    with run.section("unit", 1):
        run.record(case, suite, outcome="fail", started_at=dt.datetime.now(dt.timezone.utc),
                   reason="synthetic", mismatches=3)
    assert run.summary() == 1
    (row,) = read_results(tmp_path).to_pylist()
    assert row["repro_command"] == (
        "python -m jobs correctness --suite smoke --backend emulated --ops all_reduce_norm "
        f"--tp {case.tp} --hidden {case.hidden} --tokens {case.tokens} --variant watchdog "
        f"--transport unicast --placement auto --inputs {case.inputs}")
    assert row["repro_command"] in capsys.readouterr().out


def test_every_row_not_passing_reruns_exactly_its_case(smoke):
    """Each repro command, parsed by the CLI's parser and planned as the job
    would plan it, selects exactly the row's case."""
    _, rows, _ = smoke
    not_passing = [r for r in rows if r["outcome"] != "pass"]
    assert not_passing and all(r["repro_command"] for r in not_passing)
    for r in not_passing:
        argv = shlex.split(r["repro_command"])
        assert argv[:3] == ["python", "-m", "jobs"]
        if argv[3] not in ("correctness", "faults", "profile"):
            continue  # selfcheck --case NAME / compile-check: one case by construction
        args = cli.build_parser().parse_args(argv[3:])
        assert args.jobs == (r["job"],)
        ((_, cases),) = cli._plan(args, args.jobs)
        wanted = args.placement
        hits = [c for c in cases if c.placement in wanted or c.placement == "auto"]
        assert len(hits) == 1 and len(wanted) == 1, (r["repro_command"], hits)
        (case,) = hits
        assert (case.op, case.tp, case.hidden, case.tokens, case.inputs, case.fault) == (
            r["op"], r["tp"], r["hidden"], r["tokens"], r["x"].get("inputs"), r["fault_kind"])
