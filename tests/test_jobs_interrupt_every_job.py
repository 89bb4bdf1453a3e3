"""``finished`` means every planned case of every job has its row: a nightly
interrupted (SIGINT, after the first row of one job) inside each of its jobs
in turn, the self-check and the compile check included, and then resumed
holds the same case keys as an uninterrupted run, each once, and only then
says ``finished``, its counts those of its rows. (At 4a8ac23 a run
interrupted inside the self-check or the compile check was resumed as
``finished`` with that job's rows missing: "kept, not rerun".)

Cheap: one local Ray cluster for the module and one standing pool of warm
rank workers on it that every run takes its groups from (``--pool NAME``:
with its own pool, each of the eleven runs started and warmed two fresh
workers, importing torch, on its critical path), each run in this process
(``jobs.__main__.main``), a suite of 2 cases a job; the interrupt is a real
SIGINT to this process, sent as the named job's first row is written (the
signal grace's ``os._exit`` backstop, one per process, is disarmed: this
process goes on to the resume)."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter

import pytest

from jobs import embedded, exits
from jobs.__main__ import main
from jobs.results import ResultsWriter, read_results, runs

pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.timeout(1200)]

SUITE = """
format = 1
name = "tiny"
version = 1
description = "two cases a job: the resume of a run interrupted inside each job"

[selfcheck]
cases = ["all_reduce_norm_sentinel_tp2", "embed_norm_tp3"]

[compile_check]
arch = ["sm_90a"]
hidden = [2048]
tp = [2]
ops = ["embed_norm"]

[[correctness]]
op = "embed_norm"
tp = [2]
hidden = [1024]
tokens = [5]
inputs = ["random", "shard_edges"]
budget_ns = 1_000_000_000

[[faults]]
op = "embed_norm"
tp = [2]
hidden = [1024]
tokens = [4]
kinds = ["skip_publish", "negative_zero_payload"]
budget_ns = 800_000_000
timeout_s = 4.0

[[profile]]
op = "embed_norm"
tp = [1]
hidden = [7168]
tokens = [8, 16]
baselines = ["unfused"]
replays = 5
"""

JOBS = ("selfcheck", "compile-check", "correctness", "faults", "profile")


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    path = tmp_path_factory.mktemp("suite") / "tiny.toml"
    path.write_text(SUITE)
    return path


@pytest.fixture(scope="module")
def pool(local_ray):
    """A standing pool of warm workers every run of the module takes its
    ranks from (``--pool NAME``): each run's own pool would start and warm
    (import torch) two fresh workers, eleven times."""
    import ray

    from cluster.pool import WorkerPool
    standing = WorkerPool.start("interrupt-every-job", "emulated")
    standing.prestart(2)
    yield ["--pool", "interrupt-every-job", "--address", ray.get_runtime_context().gcs_address]
    standing.stop()


def _argv(suite, results, run_id, pool):
    return ["nightly", "--config", str(suite), "--backend", "emulated", "--results",
            str(results), "--run-id", run_id, "--no-dashboard", *pool]


def _key(row: dict) -> str | None:
    """The case a row completes, from its columns (written out here, apart
    from ``jobs.recorder.row_case_key``, so the test also reads older trees)."""
    extra = json.loads(row["extra"] or "{}")
    if extra.get("case_key"):
        return extra["case_key"]
    if row["job"] == "selfcheck":
        return f"selfcheck/{row['variant']}"
    if row["job"] == "compile-check":
        return "compile-check/" + "/".join(str(row[c]) for c in (
            "op", "variant", "transport", "tp", "hidden")) + f"/{extra.get('arch')}"
    return None


def _keys(results, run_id) -> Counter:
    rows = read_results(results, filters={"run_id": run_id}).to_pylist()
    return Counter(_key(r) for r in rows)


@pytest.fixture(scope="module")
def uninterrupted(local_ray, suite, pool, tmp_path_factory):
    results = tmp_path_factory.mktemp("whole") / "results"
    assert main(_argv(suite, results, "whole", pool)) == exits.OK
    keys = _keys(results, "whole")
    keys.pop(None, None)  # the profile's further rows (one per implementation)
    jobs = Counter(k.split("/", 1)[0] if k.startswith(("selfcheck/", "compile-check/"))
                   else k.split("|", 1)[0] for k in keys)
    print(f"\nfigure: the uninterrupted run's planned cases: {dict(jobs)}")
    return keys


@pytest.mark.parametrize("job", JOBS)
def test_a_run_interrupted_inside_each_job_is_resumed_to_every_planned_case(
        local_ray, suite, pool, uninterrupted, tmp_path, monkeypatch, capsys, job):
    results = tmp_path / "results"
    append = ResultsWriter.append
    fired = []

    def append_then_interrupt(self, rows):
        written = append(self, rows)
        mine = [rows] if isinstance(rows, dict) else list(rows)
        if not fired and any(r.get("job") == job for r in mine):
            fired.append(True)
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, as this job's first row lands
        return written

    monkeypatch.setattr(ResultsWriter, "append", append_then_interrupt)
    monkeypatch.setattr(embedded, "_exit_late", lambda *args: None)
    handler = signal.getsignal(signal.SIGINT)
    try:
        assert main(_argv(suite, results, "cut", pool)) == exits.INTERRUPTED_SIGINT
    finally:
        if embedded._term_timer is not None:
            embedded._term_timer.cancel()
        embedded._term_timer = None  # (not monkeypatch: it would put the timer back)
        signal.signal(signal.SIGINT, handler)
    monkeypatch.setattr(ResultsWriter, "append", append)
    assert fired
    manifest = runs.read_manifest(results, "cut")
    assert manifest["status"] == "interrupted"
    cut = _keys(results, "cut")
    cut.pop(None, None)
    assert cut and set(cut) < set(uninterrupted), sorted(set(uninterrupted) - set(cut))
    capsys.readouterr()

    assert main([*_argv(suite, results, "cut", pool), "--resume"]) == exits.OK
    out = capsys.readouterr().out
    resumed = _keys(results, "cut")
    resumed.pop(None, None)
    print(f"\nfigure: interrupted inside {job}: {sum(cut.values())} row(s) kept, "
          f"{sum(resumed.values()) - sum(cut.values())} run by --resume; "
          + out[out.index("resume: run cut holds"):].splitlines()[0])
    assert resumed == uninterrupted  # every planned case, each once
    assert max(resumed.values()) == 1
    manifest = runs.read_manifest(results, "cut")
    assert manifest["status"] == "finished" and "missing" not in manifest
    outcomes = Counter(read_results(results, filters={"run_id": "cut"}).column("outcome")
                       .to_pylist())
    assert manifest["counts"] == dict(outcomes)
