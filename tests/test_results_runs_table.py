"""``RESULTS/_runs/runs.pq``: the per-run facts as a Parquet table, one row
per run, rewritten with the manifests (jobs/results/runs_table.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.results import ResultsWriter, compact, read_results, runs, runs_table

REPO = Path(__file__).resolve().parents[1]
FACTS = {"git_commit": "c" * 40, "torch": "2.13.0", "ray": "2.60.0", "gpu_count": 8,
         "multicast_supported": True, "topology": json.dumps({"nodes": 1})}

pytestmark = pytest.mark.timeout(120)


def _rows(root) -> dict[str, dict]:
    return {r["run_id"]: r for r in runs_table.read(root).to_pylist()}


def test_the_table_follows_each_runs_status_and_facts(tmp_path):
    root = tmp_path / "results"
    runs.begin(root, "r1", trigger="nightly", facts=FACTS)
    row = _rows(root)["r1"]
    assert (row["status"], row["trigger"], row["finished_at"]) == ("running", "nightly", None)
    assert {k: row[k] for k in FACTS} == FACTS
    assert runs_table.read(root).schema.field("gpu_count").type == "int32"  # the column's type
    runs.interrupt(root, "r1", by="SIGINT")
    assert _rows(root)["r1"]["status"] == "interrupted"
    runs.begin(root, "r1", trigger="nightly", facts=FACTS)  # --resume takes it over
    assert _rows(root)["r1"]["status"] == "running"
    before = runs_table.table_path(root).stat().st_mtime_ns
    runs.heartbeat(root, "r1")
    runs.add_accounting(root, "r1", {"job": "correctness", "wall_s": 1.0})
    assert "heartbeat_at" in runs.read_manifest(root, "r1")
    assert runs_table.table_path(root).stat().st_mtime_ns == before  # not its row: not rewritten
    runs.finish(root, "r1")
    row = _rows(root)["r1"]
    assert row["status"] == "finished" and row["finished_at"] >= row["started_at"]
    assert not list(root.rglob("*.parquet"))  # **/*.parquet stays the rows


def test_a_hand_edited_manifest_does_not_stop_the_table(tmp_path):
    root = tmp_path / "results"
    runs.begin(root, "good", trigger="adhoc", facts=FACTS)
    bad = runs.manifest_path(root, "bad")
    bad.write_text(json.dumps({"run_id": "bad", "status": "finished",
                               "facts": {"gpu_count": "eight", "torch": "2.13.0"}}))
    damaged = runs.manifest_path(root, "damaged")
    damaged.write_text(json.dumps({"run_id": "damaged", "status": "finished",
                                   "started_at": "yesterday"}))
    with pytest.warns(runs.ManifestWarning, match=rf"{damaged}: damaged run manifest "
                                                  r"\(started_at is \"yesterday\", not an ISO"):
        runs_table.write(root)
    rows = _rows(root)
    row = rows["bad"]  # a fact of the wrong type: that fact only is left out
    assert (row["gpu_count"], row["started_at"], row["torch"]) == (None, None, "2.13.0")
    assert rows["good"]["gpu_count"] == 8
    assert "damaged" not in rows  # a damaged manifest: said, and left out


WRITER = """
import sys
from jobs.results import runs
root, prefix = sys.argv[1], sys.argv[2]
for i in range(15):
    runs.begin(root, f"{prefix}{i}", trigger="ci", facts={"git_commit": prefix})
"""


def test_two_drivers_writing_at_once_lose_no_run(tmp_path):
    """Each rewrite reads every manifest under the table's lock, so the last
    one of two concurrent drivers sees the other's runs."""
    root = tmp_path / "results"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(root), prefix], env=env)
             for prefix in ("a", "b")]
    assert [p.wait(timeout=100) for p in procs] == [0, 0]
    got = _rows(root)
    assert sorted(got) == sorted(f"{p}{i}" for p in "ab" for i in range(15))
    assert {r["git_commit"] for r in got.values()} == {"a", "b"}


def test_compact_writes_the_table_of_its_copy(tmp_path):
    src = tmp_path / "results"
    runs.begin(src, "r1", trigger="nightly", facts=FACTS)
    ResultsWriter(src, suite="smoke", run_id="r1").append(
        {"op": "all_reduce_norm", "outcome": "pass", "started_at": runs_table._time(
            runs.read_manifest(src, "r1")["started_at"]), **FACTS})
    runs.finish(src, "r1")
    compact(src, tmp_path / "copy")
    assert _rows(tmp_path / "copy")["r1"]["git_commit"] == FACTS["git_commit"]
    assert read_results(tmp_path / "copy").num_rows == 1
