"""CPU tests of the Arrow results store (jobs.results)."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.results import (OUTCOMES, SCHEMA, SCHEMA_VERSION, SCHEMA_VERSION_KEY,
                          ForeignFileWarning, ResultsError, ResultsWriter, env_info, list_runs,
                          make_row, read_results)

REPO = Path(__file__).resolve().parents[1]
T0 = dt.datetime(2025, 3, 4, 5, 6, 7, 891011, tzinfo=dt.timezone.utc)
DAY = dt.date(2025, 3, 4)


def case(seq: int, **fields):
    return {"op": "allreduce_norm", "outcome": "pass", "started_at": T0, "tp": 4,
            "extra": {"seq": seq}, **fields}


def visible_files(root: Path) -> list[Path]:
    """Files a dataset reader would open: no path part starts with '.' or '_'."""
    return [p for p in root.rglob("*") if p.is_file()
            and not any(part.startswith((".", "_")) for part in p.relative_to(root).parts)]


def hidden_files(root: Path) -> list[Path]:
    """Temporary files: a writer's, before the rename."""
    return [p for p in root.rglob("*") if p.is_file() and p.name.startswith(".")]


def seqs(table: pa.Table) -> list[int]:
    return sorted(json.loads(extra)["seq"] for extra in table.column("extra").to_pylist())


def spawn(script: str, *args: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], env=env,
                            stdout=subprocess.PIPE, text=True)


# --- rows and schema ---------------------------------------------------------------------

def test_make_row_fills_defaults_and_is_idempotent():
    row = make_row(op="x", outcome="fail", missing_ranks={3, 1}, extra={"b": 1})
    assert set(row) == set(SCHEMA.names)
    assert row["reason"] is None and row["missing_ranks"] == [1, 3]
    assert row["extra"] == '{"b": 1}'
    assert make_row(**row) == row
    assert set(OUTCOMES) == {"pass", "fail", "hang", "error", "skipped"}


def test_unknown_field_rejected_by_name():
    with pytest.raises(ValueError, match="bogus_field"):
        make_row(op="x", outcome="pass", bogus_field=1)


@pytest.mark.parametrize("fields, named", [
    ({"outcome": "passed"}, "passed"),
    ({"outcome": None}, "outcome"),
    ({"outcome": "pass", "trigger": "weekly"}, "weekly"),
    ({"outcome": "pass", "backend": "tpu"}, "tpu"),
    ({"outcome": "pass", "started_at": dt.datetime(2025, 1, 1)}, "naive"),
    ({"outcome": "pass", "extra": "[1, 2]"}, "extra"),
])
def test_invalid_values_rejected(fields, named):
    with pytest.raises(ValueError, match=named):
        make_row(**fields)


def test_append_names_bad_type_and_missing_required(tmp_path):
    writer = ResultsWriter(tmp_path, suite="s", date=DAY)
    with pytest.raises(ValueError, match=r"tp.*row 1 value 'four'"):
        writer.append([case(0), case(1, tp="four")])
    with pytest.raises(ValueError, match="required column 'started_at'"):
        writer.append(case(0, started_at=None))
    with pytest.raises(ValueError, match="suite='other'"):
        writer.append(case(0, suite="other"))
    assert not list(tmp_path.rglob("*.parquet*"))


@pytest.mark.parametrize("suite", ["", "_hidden", ".x", "a/b", "a=b", None])
def test_bad_suite_names_rejected(tmp_path, suite):
    with pytest.raises(ValueError, match="suite="):
        ResultsWriter(tmp_path, suite=suite)


# --- round trip, partitions, metadata, versions ------------------------------------------

def test_round_trip(tmp_path):
    writer = ResultsWriter(tmp_path, suite="correctness", trigger="ci", date=DAY)
    full = case(0, finished_at=T0 + dt.timedelta(seconds=2), variant="v1", tokens=128,
                max_ulp=1.0, mismatches=0, elements=1 << 40, t_n=200, t_median_us=12.5,
                missing_ranks=[2], multicast_supported=False, fault_stage=1,
                repro_command="python -m jobs correctness --op allreduce_norm")
    writer.append(full)
    writer.append([case(1, outcome="hang"), case(2, outcome="skipped", reason="no GPU")])
    table = read_results(tmp_path)
    assert table.num_rows == 3
    assert table.schema.field("started_at").type == pa.timestamp("us", tz="UTC")
    rows = {row["extra"]: row for row in table.to_pylist()}
    got = rows['{"seq": 0}']
    expected = {**make_row(**full), "run_id": writer.run_id, "suite": "correctness",
                "trigger": "ci", "date": "2025-03-04", "run_status": "unrecorded"}
    assert got == expected
    assert sorted(r["outcome"] for r in rows.values()) == ["hang", "pass", "skipped"]


def test_compact_keeps_every_row_in_one_file_per_run(tmp_path):
    from jobs.results import compact
    runs = []
    for suite, n in (("smoke", 3), ("smoke", 2), ("nightly", 4)):
        writer = ResultsWriter(tmp_path / "src", suite=suite, trigger="ci", date=DAY)
        for i in range(n):  # one file per case, as the jobs write
            writer.append(case(10 * len(runs) + i, t_median_us=1.5 + i))
        runs.append(writer.run_id)
    written = compact(tmp_path / "src", tmp_path / "dst")
    assert len(written) == 3 and len(visible_files(tmp_path / "src")) == 9
    assert sorted(p.parent.name for p in written) == ["suite=nightly", "suite=smoke", "suite=smoke"]
    key = ["run_id", "extra"]
    before, after = (read_results(tmp_path / d).sort_by([(k, "ascending") for k in key])
                     for d in ("src", "dst"))
    assert after.equals(before)
    for path in written:
        assert int(pq.read_schema(path).metadata[SCHEMA_VERSION_KEY]) == SCHEMA_VERSION
    with pytest.raises(ValueError, match="exists and is not empty"):
        compact(tmp_path / "src", tmp_path / "dst")


def test_partitions_and_file_names(tmp_path):
    first = ResultsWriter(tmp_path, suite="faults", date=DAY)
    second = ResultsWriter(tmp_path, suite="profile", date=dt.date(2025, 3, 5),
                           run_id=first.run_id)
    path = first.append(case(0))
    second.append(case(1))
    assert path.parent == tmp_path / "date=2025-03-04" / "suite=faults"
    assert path.name.startswith(f"part-{os.getpid()}-") and path.suffix == ".parquet"
    assert (tmp_path / "date=2025-03-05" / "suite=profile").is_dir()
    assert not hidden_files(tmp_path)
    assert first.append([]) is None
    assert seqs(read_results(tmp_path, {"suite": "faults"})) == [0]
    assert seqs(read_results(tmp_path, {"date": ["2025-03-05"]})) == [1]
    runs = list_runs(tmp_path)
    assert runs.column("run_id").to_pylist() == [first.run_id]
    assert sorted(runs.column("suites")[0].as_py()) == ["faults", "profile"]
    assert runs.column("rows").to_pylist() == [2]
    with pytest.raises(ValueError, match="nonexistent"):
        read_results(tmp_path, {"nonexistent": 1})


def test_schema_version_in_file_metadata(tmp_path):
    path = ResultsWriter(tmp_path, suite="s", date=DAY).append(case(0))
    metadata = pq.read_schema(path).metadata
    assert metadata[SCHEMA_VERSION_KEY] == str(SCHEMA_VERSION).encode()


def test_older_version_reads_with_nulls_newer_and_unversioned_rejected(tmp_path):
    ResultsWriter(tmp_path, suite="s", date=DAY).append(case(0))
    part = tmp_path / "date=2025-03-04" / "suite=s"
    started_at = pa.array([T0], SCHEMA.field("started_at").type)
    old = pa.table({"run_id": ["old"], "started_at": started_at,
                    "trigger": ["nightly"], "suite": ["s"], "op": ["x"], "outcome": ["fail"],
                    "retired_column": [7]})
    name = f"part-1-{'0' * 32}.parquet"  # a name the store writes
    pq.write_table(old.replace_schema_metadata({SCHEMA_VERSION_KEY: b"0"}), part / name)
    table = read_results(tmp_path)
    assert table.num_rows == 2
    by_run = {row["run_id"]: row for row in table.to_pylist()}
    assert by_run["old"]["max_ulp"] is None and by_run["old"]["retired_column"] == 7

    newer = old.replace_schema_metadata({SCHEMA_VERSION_KEY: str(SCHEMA_VERSION + 1).encode()})
    pq.write_table(newer, part / name)
    with pytest.raises(ResultsError, match=f"{name}.*newer"):
        read_results(tmp_path)
    pq.write_table(old.replace_schema_metadata({}), part / name)
    with pytest.raises(ResultsError, match=f"{name}.*not written by"):
        read_results(tmp_path)
    pq.write_table(old.replace_schema_metadata({SCHEMA_VERSION_KEY: b"x"}), part / name)
    with pytest.raises(ResultsError, match=f"{name}.*not a version number"):
        read_results(tmp_path)


def test_files_the_store_did_not_write_are_left_alone_and_unread(tmp_path):
    ResultsWriter(tmp_path, suite="s", date=DAY).append(case(0))
    part = tmp_path / "date=2025-03-04" / "suite=s"
    notes = part / "notes.parquet"
    notes.write_text("my notes, not Parquet")
    theirs = tmp_path / "theirs.parquet"
    pq.write_table(pa.table({"x": [1, 2]}), theirs)
    (part / "dir.parquet").mkdir()
    with pytest.warns(ForeignFileWarning) as caught:
        table = read_results(tmp_path)
    assert table.num_rows == 1 and seqs(table) == [0]
    assert {str(notes), str(theirs), str(part / "dir.parquet")} <= {
        str(w.message).split(" ")[0] for w in caught}
    assert notes.read_text() == "my notes, not Parquet" and theirs.exists()
    assert not (tmp_path / "_quarantine").exists()


def test_empty_and_missing_root(tmp_path):
    assert read_results(tmp_path).num_rows == 0
    with pytest.raises(FileNotFoundError, match="absent"):
        read_results(tmp_path / "absent")


def test_env_info_fills_a_row():
    info = env_info()
    row = make_row(op="x", outcome="pass", **info)
    assert row["hostname"] and row["python"] and row["pyarrow"] == pa.__version__


def test_env_info_soon_gathers_the_same_facts_on_a_thread_and_hands_on_its_error(monkeypatch):
    import threading

    from jobs.results import env_info_soon
    from jobs.results import environment

    assert env_info_soon()() == env_info()
    seen = []

    def broken():
        seen.append(threading.current_thread().name)
        raise OSError("no nvidia-smi today")
    monkeypatch.setattr(environment, "env_info", broken)
    facts = env_info_soon()
    with pytest.raises(OSError, match="no nvidia-smi today"):
        facts()
    assert seen == ["env-info"]


def test_env_info_imports_no_torch_and_reads_its_cuda_version(tmp_path):
    """A driver that only submits work never pays torch's import for its
    environment columns; torch's CUDA version comes from its version file."""
    import subprocess
    import sys

    from jobs.results.environment import _torch_cuda
    done = subprocess.run([sys.executable, "-c", "import sys; from jobs.results import env_info; "
                           "info = env_info(); print('torch' in sys.modules, info['torch'])"],
                          cwd=REPO, capture_output=True, text=True, check=True)
    imported, version = done.stdout.split()
    assert imported == "False" and version != "None"
    for text, cuda in (("cuda: Optional[str] = '13.0'\n", "13.0"), ("cuda = None\n", None),
                       ('cuda: Optional[str] = "12.8"\n', "12.8")):
        (tmp_path / "version.py").write_text("git_version = 'x'\n" + text)
        assert _torch_cuda(tmp_path / "version.py") == cuda


# --- several processes -------------------------------------------------------------------

CONCURRENT_WRITER = """
import datetime as dt, pathlib, sys, time
from jobs.results import ResultsWriter
root, run_id = sys.argv[1], sys.argv[2]
writer_id, n, go = int(sys.argv[3]), int(sys.argv[4]), pathlib.Path(sys.argv[5])
writer = ResultsWriter(root, suite="concurrent", run_id=run_id)
print("ready", flush=True)
while not go.exists():
    time.sleep(0.001)
for i in range(n):
    writer.append({"op": "x", "outcome": "pass", "started_at": dt.datetime.now(dt.timezone.utc),
                   "extra": {"seq": writer_id * 1000 + i}})
"""


def test_two_processes_append_concurrently(tmp_path):
    root, go, n = tmp_path / "results", tmp_path / "go", 50
    children = [spawn(CONCURRENT_WRITER, root, "run-c", k, n, go) for k in (1, 2)]
    for child in children:
        assert child.stdout.readline().strip() == "ready"
    go.touch()
    for child in children:
        assert child.wait(timeout=60) == 0
    table = read_results(root)
    print(f"\nfigure: concurrent writers: rows expected {2 * n}, found {table.num_rows}")
    assert seqs(table) == [k * 1000 + i for k in (1, 2) for i in range(n)]
    assert len(visible_files(root)) == 2 * n and not hidden_files(root)


# A writer whose file bytes trickle out (small chunks, short sleeps), so a kill
# lands mid-write. It patches pyarrow's writer, not the store, and handles a
# path or a file object, so a store that wrote in place would show up partial.
TRICKLING_WRITER = """
import datetime as dt, io, os, sys, time
import pyarrow.parquet as pq
real_write_table = pq.write_table
def trickle(table, where, **kwargs):
    buffer = io.BytesIO()
    real_write_table(table, buffer, **kwargs)
    data = buffer.getvalue()
    sink = open(where, "wb") if isinstance(where, (str, os.PathLike)) else where
    for start in range(0, len(data), 256):
        sink.write(data[start:start + 256])
        sink.flush()
        time.sleep(0.002)
    if sink is not where:
        sink.close()
pq.write_table = trickle
from jobs.results import ResultsWriter
writer = ResultsWriter(sys.argv[1], suite="killed")
for i in range(10_000):
    writer.append({"op": "x", "outcome": "pass", "started_at": dt.datetime.now(dt.timezone.utc),
                   "extra": {"seq": i}})
    print(i, flush=True)
"""


def being_written(path: Path) -> bool:
    """A non-empty file without Parquet's closing magic yet."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(size - 4, 0))
            return size > 0 and f.read() != b"PAR1"
    except (IsADirectoryError, FileNotFoundError):
        return False


def test_writer_killed_mid_write_leaves_only_finished_rows(tmp_path):
    child = spawn(TRICKLING_WRITER, tmp_path)
    try:
        reported = [child.stdout.readline() for _ in range(3)]
        deadline = time.monotonic() + 30
        while not any(map(being_written, tmp_path.rglob("*.parquet*"))):  # not the marker
            assert time.monotonic() < deadline, "the next append never started writing"
            time.sleep(0.001)
    finally:
        child.kill()  # SIGKILL
        child.wait()
    finished = [int(line) for line in reported + child.stdout.read().split()]
    assert child.returncode == -signal.SIGKILL

    for path in visible_files(tmp_path):
        try:
            pq.read_table(path)
        except pa.ArrowException as err:
            pytest.fail(f"partial file visible to readers: {path}: {err}")
    got = seqs(read_results(tmp_path))
    print(f"\nfigure: writer killed -9 mid-write: rows reported finished {len(finished)}, "
          f"found {len(got)}")
    # The last append may have been renamed into place before it could report.
    assert got in (finished, finished + [len(finished)])
    assert finished == list(range(len(finished)))
    leftovers = hidden_files(tmp_path)
    assert leftovers, "the kill did not land mid-write; the test proved nothing"
    for partial in leftovers:
        with pytest.raises(pa.ArrowException):
            pq.read_table(partial)
