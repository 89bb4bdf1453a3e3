"""The results dataset as any Parquet reader sees it, per-run facts stored
once, the run manifest's statuses, quarantine and in-place compaction."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from jobs.results import (FILE_SCHEMA, QuarantineWarning, ResultsWriter, compact_run, list_runs,
                          read_results, runs)

REPO = Path(__file__).resolve().parents[1]
T0 = dt.datetime(2025, 3, 4, 5, 6, 7, tzinfo=dt.timezone.utc)
FACTS = {"hostname": "node-a", "torch": "2.13.0", "topology": json.dumps({"gpus": 8} | {
    f"link{i}": "NV18" for i in range(64)}), "gpu_count": 8, "multicast_supported": True,
    "git_commit": "abc123"}

pytestmark = pytest.mark.timeout(120)


def row(seq: int, **fields):
    return {"op": "all_reduce_norm", "outcome": "pass", "started_at": T0, "tp": 2,
            "extra": {"seq": seq}, **FACTS, **fields}


@pytest.fixture
def dataset(tmp_path):
    root = tmp_path / "results"
    for suite, date in (("smoke", dt.date(2025, 3, 4)), ("nightly", dt.date(2025, 3, 5))):
        writer = ResultsWriter(root, suite=suite, run_id="r1", trigger="nightly", date=date)
        for i in range(3):
            writer.append(row(i))
    return root


def test_every_parquet_reader_opens_the_dataset(dataset):
    table = pq.read_table(dataset)
    assert table.num_rows == 6 and sorted(set(table.column("suite").to_pylist())) == [
        "nightly", "smoke"]
    hive = ds.dataset(dataset, partitioning="hive").to_table()
    assert hive.num_rows == 6 and "suite" in hive.column_names and "date" in hive.column_names
    duckdb = pytest.importorskip("duckdb")
    got = duckdb.sql(f"select suite, count(*) as n from read_parquet('{dataset}/**/*.parquet', "
                     "hive_partitioning = true) group by suite order by suite").fetchall()
    assert got == [("nightly", 3), ("smoke", 3)]
    print(f"\nfigure: readers: pyarrow.parquet {table.num_rows}, pyarrow.dataset "
          f"{hive.num_rows}, duckdb {sum(n for _, n in got)} of 6 rows")


def test_per_run_facts_are_stored_once_and_read_back(dataset):
    files = [p for p in dataset.rglob("*.parquet")]
    for path in files:
        names = pq.read_schema(path).names
        assert "topology" not in names and "suite" not in names and "hostname" not in names
        assert names == FILE_SCHEMA.names
    manifest = json.loads((dataset / "_runs" / "r1.json").read_text())
    assert manifest["facts"]["topology"] == FACTS["topology"]
    table = read_results(dataset)
    assert set(table.column("topology").to_pylist()) == {FACTS["topology"]}
    assert set(table.column("gpu_count").to_pylist()) == {8}
    assert set(table.column("multicast_supported").to_pylist()) == {True}
    # filters on a fact apply after the facts are filled in
    assert read_results(dataset, filters={"hostname": "node-a"}).num_rows == 6
    assert read_results(dataset, filters={"hostname": "other"}).num_rows == 0
    assert read_results(dataset, columns=["hostname"]).column_names == ["hostname"]


def test_a_truncated_file_is_quarantined_and_the_rest_reads(dataset):
    victim = sorted(dataset.rglob("*.parquet"))[0]
    victim.write_bytes(victim.read_bytes()[:100])
    with pytest.warns(QuarantineWarning, match="not readable Parquet"):
        table = read_results(dataset)
    assert table.num_rows == 5
    assert not victim.exists()
    assert list((dataset / "_quarantine").rglob("*.quarantined"))
    assert pq.read_table(dataset).num_rows == 5  # plain readers too, once it is aside
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_results(dataset).num_rows == 5


def test_a_damaged_page_is_quarantined_with_its_reason_and_the_rest_reads(dataset, capsys):
    """Bytes flipped inside a data page, the footer intact: the page's
    checksum fails the read of that file only; it goes to quarantine with a
    note of why, and every command that reads the dataset goes on."""
    from jobs.__main__ import main
    victim = sorted(dataset.rglob("*.parquet"))[0]
    data = bytearray(victim.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little")
    assert pq.read_metadata(victim).num_rows == 1
    for i in range(8, len(data) - footer - 8, 7):  # every 7th byte of the pages
        data[i] ^= 0x5A
    victim.write_bytes(bytes(data))
    assert pq.read_metadata(victim).num_rows == 1  # the footer still reads
    with pytest.warns(QuarantineWarning, match="not readable Parquet"):
        table = read_results(dataset)
    assert table.num_rows == 5 and not victim.exists()
    (moved,) = (dataset / "_quarantine").rglob("*.quarantined")
    assert moved.name == f"{victim.name}.quarantined"
    assert "not readable Parquet" in moved.with_name(moved.name + ".reason").read_text()
    victim.write_bytes(bytes(data))  # damaged again, for the commands
    with pytest.warns(QuarantineWarning):
        assert main(["regress", "--results", str(dataset), "--run", "r1"]) == 0
    victim.write_bytes(bytes(data))
    with pytest.warns(QuarantineWarning):
        assert main(["compact", "--results", str(dataset), "--out",
                     str(dataset.parent / "copy")]) == 0
    assert "compacted 5 rows" in capsys.readouterr().out
    from dashboards.__main__ import main as dashboards
    victim.write_bytes(bytes(data))
    with pytest.warns(QuarantineWarning):
        assert dashboards(["build", "--results", str(dataset), "--out",
                           str(dataset.parent / "site")]) == 0


def seqs(table) -> list[int]:
    return sorted(json.loads(e)["seq"] for e in table.column("extra").to_pylist())


def test_compact_run_rewrites_one_file_per_partition_in_place(dataset):
    before = read_results(dataset)
    assert len(list(dataset.rglob("*.parquet"))) == 6
    written = compact_run(dataset, "r1")
    names = sorted(p.name for p in dataset.rglob("*.parquet"))
    assert len(written) == 2 and sorted(p.name for p in written) == names
    assert all(re.fullmatch(r"run-r1-[0-9a-f]{12}\.parquet", n) for n in names)
    assert seqs(read_results(dataset)) == seqs(before) == [0, 0, 1, 1, 2, 2]
    assert pq.read_table(dataset).num_rows == 6  # plain readers too
    assert compact_run(dataset, "r1") == []  # already compact


def test_a_compaction_killed_after_its_rename_loses_and_doubles_nothing(dataset, monkeypatch):
    """Killed between renaming its file in and unlinking the files it covers:
    every reader of jobs.results still reads each row once (the covered
    files are skipped); a plain pyarrow read counts them twice until the
    next compaction in the folder removes them."""
    import jobs.results.compaction as compaction
    directory = dataset / "date=2025-03-04" / "suite=smoke"
    originals = sorted(directory.glob("*.parquet"))

    def killed(path, **kwargs):
        raise KeyboardInterrupt  # the first unlink: stands for a kill -9 there

    monkeypatch.setattr(Path, "unlink", killed)
    with pytest.raises(KeyboardInterrupt):
        compaction.compact_run(dataset, "r1")
    monkeypatch.undo()
    assert all(p.exists() for p in originals) and len(list(directory.glob("run-*"))) == 1
    assert seqs(read_results(dataset)) == [0, 0, 1, 1, 2, 2]
    assert pq.read_table(dataset).num_rows == 9  # the window plain readers see
    compaction.compact_run(dataset, "r1")
    assert not any(p.exists() for p in originals)
    assert pq.read_table(dataset).num_rows == 6 and read_results(dataset).num_rows == 6


def test_a_compaction_killed_before_its_rename_leaves_a_hidden_file_only(dataset, monkeypatch):
    import jobs.results.compaction as compaction

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(compaction, "publish", killed)
    with pytest.raises(KeyboardInterrupt):
        compaction.compact_run(dataset, "r1")
    monkeypatch.undo()
    assert len(list(dataset.rglob("part-*.parquet"))) == 6
    assert pq.read_table(dataset).num_rows == read_results(dataset).num_rows == 6


def test_two_compactions_of_one_run_at_once_swap_one_file_in(dataset, monkeypatch):
    """The second one finds, under the lock, that the files it read are gone
    (the first swapped its file in while it was writing): it gives up."""
    import jobs.results.compaction as compaction
    real = compaction.write_hidden
    first = []

    def write_hidden(path, write):
        if not first:  # the other compaction gets there first
            first.append(True)
            first.extend(compaction.compact_run(dataset, "r1"))
        return real(path, write)

    monkeypatch.setattr(compaction, "write_hidden", write_hidden)
    second = compaction.compact_run(dataset, "r1")
    assert len(first) == 3 and second == []  # lost the race in one folder, found the other compact
    assert sorted(dataset.rglob("run-*.parquet")) == sorted(first[1:])
    assert not list(dataset.rglob(".*.tmp"))
    assert seqs(read_results(dataset)) == [0, 0, 1, 1, 2, 2]
    assert pq.read_table(dataset).num_rows == 6


def _compaction_after_listing(monkeypatch, dataset, swapped: list) -> None:
    """Every read lists the files, then a compaction of run r1 runs (in
    another thread, waiting at most 0.3 s for the lock) before it reads them."""
    import threading

    import jobs.results.compaction as compaction
    import jobs.results.store as store
    real = store.live_files

    def listing_then_compaction(root):
        files = real(root)
        other = threading.Thread(target=lambda: swapped.append(
            compaction.compact_run(dataset, "r1", wait_s=0.3)))
        other.start()
        other.join()
        return files

    monkeypatch.setattr(store, "live_files", listing_then_compaction)


def test_a_compaction_never_swaps_between_a_reads_listing_and_its_rows(dataset, monkeypatch):
    """A read lists the files, then a compaction of the run comes to swap
    its file in before the read has the rows: the compaction waits for the
    read (it gives up here, after 0.3 s), so the read has every row once;
    the next compaction, with no read in progress, swaps."""
    import jobs.results.compaction as compaction
    from jobs.results import lock
    with lock.exclusive(dataset, 1.0):  # the lock files a first compaction makes
        pass
    swapped = []
    _compaction_after_listing(monkeypatch, dataset, swapped)
    assert seqs(read_results(dataset)) == [0, 0, 1, 1, 2, 2]
    assert swapped == [[]] and not list(dataset.rglob("run-*.parquet"))
    assert not list(dataset.rglob(".*.tmp"))  # its written file went with it
    monkeypatch.undo()
    assert len(compaction.compact_run(dataset, "r1", wait_s=0.3)) == 2


def test_a_reader_makes_no_file_and_reads_again_when_a_compaction_began(dataset, monkeypatch):
    """Where no compaction has run there is no lock file, and a reader makes
    none (a dataset in a checkout stays as it is): it reads unlocked, and if
    a compaction made the lock and swapped meanwhile, it reads again, locked."""
    before = sorted(p.name for p in dataset.iterdir())
    assert seqs(read_results(dataset)) == [0, 0, 1, 1, 2, 2]
    assert sorted(p.name for p in dataset.iterdir()) == before
    swapped = []
    _compaction_after_listing(monkeypatch, dataset, swapped)
    assert seqs(read_results(dataset)) == [0, 0, 1, 1, 2, 2]
    assert len(swapped[0]) == 2  # swapped under the first, unlocked read


def test_readers_never_finish_a_compaction_or_read_its_leftovers(dataset):
    """A ``run-<id>.parquet.new`` of an earlier version's compaction cut
    short is not a results file: readers neither read nor move it."""
    directory = dataset / "date=2025-03-04" / "suite=smoke"
    new = directory / "run-r1.parquet.new"
    new.write_bytes(sorted(directory.glob("*.parquet"))[0].read_bytes())
    assert read_results(dataset).num_rows == 6
    assert new.exists() and len(list(directory.glob("*.parquet"))) == 3


DRIVER = """
import sys, time
from jobs.results import ResultsWriter, runs
import datetime as dt
root, run_id, finish = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
runs.begin(root, run_id, trigger="nightly", facts={"hostname": "h"})
w = ResultsWriter(root, suite="s", run_id=run_id, trigger="nightly")
w.append({"op": "x", "outcome": "pass", "started_at": dt.datetime.now(dt.timezone.utc),
          "t_median_us": 10.0})
if finish:
    runs.finish(root, run_id)
    sys.exit(0)
print("written", flush=True)
time.sleep(600)
"""


def _driver(root, run_id, finish):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", DRIVER, str(root), run_id, "1" if finish else "0"],
                            env=env, stdout=subprocess.PIPE, text=True)


def test_run_status_running_finished_incomplete(tmp_path, capsys):
    root = tmp_path / "results"
    assert _driver(root, "done", True).wait(timeout=60) == 0
    child = _driver(root, "killed", False)
    assert child.stdout.readline().strip() == "written"
    statuses = {r["run_id"]: r["run_status"] for r in list_runs(root).to_pylist()}
    assert statuses == {"done": "finished", "killed": "running"}
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    statuses = {r["run_id"]: r["run_status"] for r in list_runs(root).to_pylist()}
    assert statuses == {"done": "finished", "killed": "incomplete"}
    print(f"\nfigure: run statuses after kill -9 of a driver: {statuses}")

    from jobs import report
    from jobs.__main__ import main
    assert main(["report", "--results", str(root), "killed"]) == 1
    out = capsys.readouterr().out
    assert "status: incomplete" in out and "no regression baseline" in out
    assert main(["report", "--results", str(root), "--list"]) == 0
    assert "incomplete" in capsys.readouterr().out
    assert report  # imported for the CLI


def test_incomplete_runs_are_never_a_baseline(tmp_path):
    from jobs.regression import Rule, detect
    root = tmp_path / "results"
    t = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)
    for i, status in enumerate(["finished", "finished", "incomplete", "finished"]):
        run_id = f"run{i}"
        runs._write(root, run_id, {"run_id": run_id, "status": status if status != "incomplete"
                                   else "running", "driver": {"host": "gone", "pid": 1},
                                   "heartbeat_at": "2000-01-01T00:00:00+00:00"})
        ResultsWriter(root, suite="s", run_id=run_id, trigger="nightly").append(
            {"op": "all_reduce_norm", "outcome": "pass", "started_at": t + dt.timedelta(days=i),
             "tp": 1, "hidden": 1024, "tokens": 1, "t_median_us": 100.0 if i != 2 else 1.0,
             "extra": {"job": "profile"}})
    (verdict,) = detect(root, "run3", Rule(history=5, min_history=1))
    assert verdict.history_runs == ("run0", "run1") and verdict.status == "ok"

    from dashboards import model
    from dashboards.build import build_site
    results = model.load(root)
    assert {r.run_id: r.status for r in results.runs}["run2"] == "incomplete"
    runs._write(root, "run3", {"run_id": "run3", "status": "running",
                               "driver": {"host": "gone", "pid": 1},
                               "heartbeat_at": "2000-01-01T00:00:00+00:00"})
    index = build_site(root, tmp_path / "site")
    assert "This run is INCOMPLETE" in index.read_text()


def test_a_run_split_in_parts_is_reopened_and_keeps_every_parts_accounting(tmp_path):
    """``nightly --jobs ... --run-id R`` in several invocations: each part
    takes the run over and appends its sections' accounting as each ends;
    a part stopped by a time limit (no finish) keeps the sections it ended,
    and the last finish stores the counts of all the run's rows."""
    root = tmp_path / "results"
    runs.begin(root, "split", trigger="nightly", facts={"hostname": "h"})
    started = runs.read_manifest(root, "split")["started_at"]
    runs.add_accounting(root, "split", {"job": "correctness"})
    runs.finish(root, "split", counts={"pass": 2})
    assert runs.read_manifest(root, "split")["status"] == "finished"
    runs.begin(root, "split", trigger="nightly")
    data = runs.read_manifest(root, "split")
    assert data["status"] == "running" and data["started_at"] == started
    assert "finished_at" not in data
    runs.add_accounting(root, "split", {"job": "faults"})
    # killed here: the next part finds a dead driver and takes the run over
    dead = subprocess.Popen(["true"])  # noqa: S603,S607 - a pid that has exited
    dead.wait()
    runs._write(root, "split", {**runs.read_manifest(root, "split"),
                                "driver": {"host": socket.gethostname(), "pid": dead.pid}})
    runs.begin(root, "split", trigger="nightly")
    runs.add_accounting(root, "split", {"job": "profile"})
    runs.finish(root, "split", counts={"pass": 5, "fail": 1})
    data = runs.read_manifest(root, "split")
    assert data["status"] == "finished"
    assert data["counts"] == {"pass": 5, "fail": 1}
    assert [a["job"] for a in data["accounting"]] == ["correctness", "faults", "profile"]


def test_a_job_joined_to_a_running_run_leaves_it_running(tmp_path, capsys):
    """The nightly's compile check joins the nightly's run: its closing line
    must not mark the run finished while the nightly goes on."""
    from jobs.__main__ import main
    root = tmp_path / "results"
    runs.begin(root, "night", trigger="nightly")
    assert main(["selfcheck", "--results", str(root), "--run-id", "night",
                 "--case", "all_reduce_norm_sentinel_tp2"]) == 0
    assert runs.read_manifest(root, "night")["status"] == "running"
    assert main(["selfcheck", "--results", str(root),
                 "--case", "all_reduce_norm_sentinel_tp2"]) == 0
    (own,) = set(runs.read_manifests(root)) - {"night"}
    assert runs.read_manifest(root, own)["status"] == "finished"
