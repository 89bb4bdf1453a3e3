"""Cases that differ only in a kernel-only field (all_reduce_norm's mode)
run on one TP group, end to end on the emulated backend: one group build
per (placement, tp, hidden), both modes pass on it, each row names its
mode, and the faults job recovers the shared group between modes. Both
jobs run in this process (``jobs.__main__.main``) on one local cluster
(``local_ray``): what is tested is the jobs' grouping, not their process
start, and a subprocess each started an embedded cluster of its own."""

import json

import pytest

from cluster.group import RUN_TAG_ENV
from jobs.__main__ import main
from jobs.results import read_results

pytestmark = [pytest.mark.xdist_group("ray-head"), pytest.mark.timeout(600)]

SUITE = """
format = 1
name = "mixed"
version = 1
description = "one_shot and owner cases on one group"

[[correctness]]
op = "all_reduce_norm"
mode = ["one_shot", "owner"]
tp = [2, 4]
hidden = [256]
tokens = [1, 5]
inputs = ["random", "order_sensitive"]
repeats = 2

[[faults]]
op = "all_reduce_norm"
mode = ["one_shot", "owner"]
tp = [2]
hidden = [256]
tokens = [4]
kinds = ["skip_publish", "stage_stale"]
"""


def test_both_modes_share_one_group_and_pass(local_ray, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(RUN_TAG_ENV, "groups")  # each run sets its own (jobs.recorder): undone after
    suite = tmp_path / "mixed.toml"
    suite.write_text(SUITE)
    results = tmp_path / "results"
    for job in ("correctness", "faults"):
        code = main([job, "--config", str(suite), "--backend", "emulated", "--results",
                     str(results)])
        said = capsys.readouterr()
        assert code == 0, said.out[-3000:] + said.err[-3000:]
    rows = read_results(results).to_pylist()
    groups: dict = {}
    for r in rows:
        x = json.loads(r["extra"])
        assert r["outcome"] == "pass", (r["reason"], x)
        groups.setdefault((r["job"], x["group_id"]), set()).add(x["mode"])
    assert sum(r["job"] == "correctness" for r in rows) == 16
    assert sum(r["job"] == "faults" for r in rows) == 4
    # tp 2 and 4 for correctness, tp 2 for the faults: three groups, each both modes
    assert sorted(job for job, _ in groups) == ["correctness", "correctness", "faults"]
    assert all(modes == {"one_shot", "owner"} for modes in groups.values())
