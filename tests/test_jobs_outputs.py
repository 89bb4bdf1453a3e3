"""What the jobs write and read from the file system, checked before Ray
starts (exit 2, the path named, nothing written or changed): output
directories that cannot be written, outputs inside one another, a site or
a trace file that is someone else's, a suite file that is a FIFO, a token
file that is not one; and the readers' side: ``report`` on a dataset with
a file of a newer version or of no version, one line and exit 2."""

from __future__ import annotations

import os
import stat
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.__main__ import main

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def no_ray(monkeypatch):
    import jobs.session as session

    def tripwire(*args, **kwargs):
        raise AssertionError("Ray would have started")

    monkeypatch.setattr(session, "ray_session", tripwire)


def refused(capsys, *argv) -> str:
    """Exit 2 and the error in one line (after argparse's usage, for a bad flag)."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error: " in err.rstrip().splitlines()[-1], err
    return err.rstrip().splitlines()[-1]


QUICK = ["--suite", "smoke", "--ops", "all_reduce_norm", "--tp", "2", "--backend", "emulated"]


def test_an_output_directory_that_cannot_be_written_is_refused(tmp_path, capsys, no_ray):
    assert "--results /proc/1 is inside the system folder /proc" in refused(
        capsys, "nightly", *QUICK, "--results", "/proc/1", "--site", str(tmp_path / "s"))
    assert "--results /proc/x" in refused(capsys, "correctness", *QUICK, "--results", "/proc/x")
    (tmp_path / "file").write_text("mine")
    assert "exists and is not a directory" in refused(
        capsys, "correctness", *QUICK, "--results", str(tmp_path / "file"))
    assert "--results: expected a path, got ''" in refused(
        capsys, "correctness", *QUICK, "--results", "")


def test_outputs_inside_one_another_are_refused(tmp_path, capsys, no_ray):
    results = tmp_path / "r"
    for site in (results, results / "site", tmp_path):
        assert "overlap" in refused(capsys, "nightly", *QUICK, "--results", str(results),
                                    "--site", str(site))
    assert "--results" in refused(capsys, "trace", *QUICK, "--tokens", "3", "--inputs",
                                  "random", "--placement", "emulated", "--results",
                                  str(results), "--trace-out", str(results / "t.json"))
    assert not results.exists()


def test_a_site_directory_of_someone_elses_is_refused_before_the_run(tmp_path, capsys, no_ray):
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<p>my page</p>")
    err = refused(capsys, "nightly", *QUICK, "--results", str(tmp_path / "r"), "--site",
                  str(site))
    assert "--site" in err and "not built by python -m dashboards" in err
    assert (site / "index.html").read_text() == "<p>my page</p>"
    assert main(["nightly", *QUICK, "--results", str(tmp_path / "r"), "--site", str(site),
                 "--no-dashboard", "--suite", "nosuch"]) == 2  # --no-dashboard: not checked
    assert "unknown suite" in capsys.readouterr().err


def test_an_existing_trace_file_is_never_overwritten(tmp_path, capsys, no_ray):
    mine = tmp_path / "mine.json"
    mine.write_text("{}")
    err = refused(capsys, "trace", *QUICK, "--tokens", "3", "--inputs", "random",
                  "--placement", "emulated", "--no-results", "--trace-out", str(mine))
    assert f"--trace-out {mine} exists" in err and mine.read_text() == "{}"


def test_the_atomic_writer_can_refuse_to_replace(tmp_path):
    from jobs.results.atomic import write_atomically
    target = tmp_path / "t.json"
    target.write_text("theirs")
    with pytest.raises(FileExistsError):
        write_atomically(target, lambda sink: sink.write(b"ours"), overwrite=False)
    assert target.read_text() == "theirs" and os.listdir(tmp_path) == ["t.json"]


def test_a_suite_file_that_is_a_fifo_is_refused_without_blocking(tmp_path, capsys, no_ray):
    fifo = tmp_path / "suite.toml"
    os.mkfifo(fifo)
    answer = []
    worker = threading.Thread(target=lambda: answer.append(
        main(["correctness", "--config", str(fifo), "--no-results"])), daemon=True)
    worker.start()
    worker.join(20)
    assert answer == [2], "a FIFO as --config blocked"
    assert "not a regular file" in capsys.readouterr().err
    assert "not a regular file" in refused(capsys, "correctness", "--config", "/dev/zero",
                                           "--no-results")


@pytest.mark.parametrize("kind", ["notes", "loose", "directory", "fifo"])
def test_a_token_file_that_is_not_one_is_refused_and_left_alone(tmp_path, capsys, no_ray,
                                                                  monkeypatch, kind):
    path = tmp_path / "notes.txt"
    said = {"notes": "does not hold a token", "loose": "has mode 0644",
            "directory": "not a regular file", "fifo": "not a regular file"}[kind]
    if kind == "notes":
        path.write_text("call the plumber on Monday\n")
        os.chmod(path, 0o600)
    elif kind == "loose":
        path.write_text("f" * 64)
        os.chmod(path, 0o644)
    elif kind == "directory":
        path.mkdir()
    else:
        os.mkfifo(path)
    before = path.stat()
    monkeypatch.setenv("LAMPORT_RAY_TOKEN_FILE", str(path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    err = refused(capsys, "correctness", *QUICK, "--no-results")
    assert said in err and str(path) in err
    after = path.stat()
    assert stat.S_IMODE(after.st_mode) == stat.S_IMODE(before.st_mode)
    assert after.st_mtime_ns == before.st_mtime_ns


def test_a_missing_token_file_is_made_owner_only(tmp_path, monkeypatch):
    from jobs.embedded import ensure_token
    path = tmp_path / "new" / "token"
    assert ensure_token(path) == path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(path.read_text()) == 64
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert ensure_token(path).read_text() == path.read_text()  # read, not remade


def test_compact_refuses_an_out_inside_the_dataset_or_a_file(tmp_path, capsys):
    from jobs.results import ResultsWriter
    import datetime as dt
    root = tmp_path / "r"
    ResultsWriter(root, suite="s").append({"op": "x", "outcome": "pass",
                                           "started_at": dt.datetime.now(dt.timezone.utc)})
    assert "overlap" in refused(capsys, "compact", "--results", str(root), "--out",
                                str(root / "inner"))
    (tmp_path / "f").write_text("")
    assert "is not a directory" in refused(capsys, "compact", "--results", str(root), "--out",
                                           str(tmp_path / "f"))
    assert not (root / "inner").exists() and (tmp_path / "f").read_text() == ""


@pytest.mark.parametrize("metadata, said", [({b"lamport_lab.schema_version": b"99"},
                                              "schema version 99 is newer"),
                                             ({}, "not written by jobs.results")])
def test_report_on_a_file_it_cannot_read_says_which_in_one_line(tmp_path, capsys, metadata,
                                                                said):
    part = tmp_path / "r" / "date=2026-01-01" / "suite=s"
    part.mkdir(parents=True)
    name = f"part-1-{'a' * 32}.parquet"
    pq.write_table(pa.table({"run_id": ["x"]}).replace_schema_metadata(metadata), part / name)
    err = refused(capsys, "report", "--results", str(tmp_path / "r"))
    assert name in err and said in err
