"""The results folder, checked before Ray starts (jobs.results.dataset,
jobs.outputs.check_results): new, empty, or a lamport-lab dataset (its
marker, or a dataset made before the marker), never a system folder
however it is reached, never one with a file of a newer schema; and the
other inputs of issue 64's items 7 and 8 that are not numbers: ``~`` in a
path, a path too long, an unusable compile cache (exit 3), a reader of
stdout that goes away (``schema | head -1``)."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.__main__ import main
from jobs.results import SCHEMA_VERSION, ResultsWriter
from jobs.results import dataset as ds

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def no_ray(monkeypatch):
    import jobs.session as session

    def tripwire(*args, **kwargs):
        raise AssertionError("Ray would have started")

    monkeypatch.setattr(session, "ray_session", tripwire)


def tree(root: Path) -> list:
    """Every entry under ``root`` (links not followed), with its size and times."""
    out = []
    for directory, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            st = os.lstat(os.path.join(directory, name))
            out.append((os.path.relpath(os.path.join(directory, name), root), st.st_size,
                        st.st_mtime_ns, st.st_mode))
    return sorted(out)


def refused(capsys, argv, status=2) -> str:
    assert main(argv) == status
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.rstrip().splitlines()[-1]


def suite(tmp_path: Path) -> Path:
    path = tmp_path / "suite.toml"
    path.write_text("format = 1\nname = 'fuzz'\nversion = 1\n[[correctness]]\n"
                    "op = 'all_reduce_norm'\ntp = 2\nhidden = 256\ntokens = 2\n")
    return path


def row():
    import datetime as dt
    return {"op": "x", "outcome": "pass", "started_at": dt.datetime.now(dt.timezone.utc)}


# ------------------------------------------------------------ the predicate
def test_a_dataset_is_recognised_by_its_marker_or_its_layout(tmp_path):
    assert not ds.looks_like_dataset(tmp_path / "missing")
    assert not ds.looks_like_dataset(tmp_path)  # empty: new, not a dataset
    (tmp_path / "notes.txt").write_text("mine")
    assert not ds.looks_like_dataset(tmp_path)
    assert not ds.looks_like_dataset(tmp_path / "notes.txt")
    (tmp_path / "date=2026-01-01").mkdir()
    assert not ds.looks_like_dataset(tmp_path)  # a date without a suite under it
    (tmp_path / "date=2026-01-01" / "suite=smoke").mkdir()
    assert ds.looks_like_dataset(tmp_path)
    runs = tmp_path / "runs-only"
    (runs / "_runs").mkdir(parents=True)
    assert ds.looks_like_dataset(runs)
    (runs / "_runs").rmdir()
    (runs / "_runs").write_text("")  # a file of that name is not the manifests' folder
    assert not ds.looks_like_dataset(runs)
    marked = tmp_path / "marked"
    marked.mkdir()
    (marked / ds.MARKER).write_text(json.dumps({"schema_version": SCHEMA_VERSION}))
    assert ds.looks_like_dataset(marked)
    (tmp_path / "link").symlink_to(marked)
    assert ds.looks_like_dataset(tmp_path / "link")


def test_system_folders_are_never_a_dataset_and_a_link_to_root_is_not_walked(tmp_path,
                                                                              monkeypatch):
    (tmp_path / "root").symlink_to("/")
    (tmp_path / "etc").symlink_to("/etc")
    listed = []
    real_scandir = os.scandir

    def scandir(path="."):
        listed.append(str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    for path in (tmp_path / "root", tmp_path / "etc", Path("/"), Path("/usr/local"),
                 Path("/var"), Path("/proc/self")):
        assert not ds.looks_like_dataset(path), path
        assert ds.system_folder(path) is not None, path
        assert "system folder" in ds.refusal(path)
    assert not listed  # refused before anything was listed, /proc least of all
    for ok in (tmp_path, Path("/tmp/x"), Path("/var/tmp/x"), Path("/var/www/lamport-lab")):
        assert ds.system_folder(ok) is None, ok


def test_the_first_rows_mark_the_dataset_and_a_newer_writer_raises_its_version(tmp_path):
    root = tmp_path / "r"
    ResultsWriter(root, suite="s").append(row())
    marker = json.loads((root / ds.MARKER).read_text())
    assert marker["schema_version"] == SCHEMA_VERSION and marker["format"] == 1
    # made before the marker: recognised by its layout, marked by its next write
    (root / ds.MARKER).unlink()
    assert ds.looks_like_dataset(root) and ds.refusal(root) is None
    ResultsWriter(root, suite="s").append(row())
    assert ds.read_marker(root)["schema_version"] == SCHEMA_VERSION
    (root / ds.MARKER).write_text(json.dumps({"schema_version": 1, "created_at": "then"}))
    ResultsWriter(root, suite="s").append(row())
    marker = ds.read_marker(root)
    assert marker["schema_version"] == SCHEMA_VERSION and marker["created_at"] == "then"


@pytest.mark.parametrize("content, message", [
    (json.dumps({"schema_version": SCHEMA_VERSION + 1}), "newer than this lamport-lab's"),
    ("{", "not a dataset marker"),
    ("[]", "not a dataset marker"),
    (json.dumps({"schema_version": "4"}), "not a dataset marker"),
    (json.dumps({"schema_version": True}), "not a dataset marker"),
])
def test_a_marker_of_a_newer_version_or_none_is_refused(tmp_path, content, message):
    (tmp_path / ds.MARKER).write_text(content)
    assert message in ds.refusal(tmp_path)


# ---------------------------------------------------- the jobs, before Ray
def test_a_dataset_holding_a_newer_file_exits_2_before_any_case_runs(tmp_path, capsys, no_ray):
    """Issue 64 item 6: at 4a8ac23 the cases ran and wrote rows, then exit 2
    with the run left running; now exit 2 before Ray, nothing written."""
    results = tmp_path / "r"
    ResultsWriter(results, suite="s").append(row())
    part = next(results.glob("date=*/suite=s"))
    table = pa.table({"run_id": ["x"]}).replace_schema_metadata(
        {b"lamport_lab.schema_version": str(SCHEMA_VERSION + 1).encode()})
    name = f"part-1-{'c' * 32}.parquet"
    pq.write_table(table, part / name)
    config = suite(tmp_path)
    before = tree(tmp_path)
    for command in ("correctness", "nightly", "compile-check"):
        argv = [command, "--config", str(config), "--backend", "emulated",
                "--results", str(results)]
        if command == "nightly":
            argv += ["--no-dashboard"]
        if command == "compile-check":  # its own options; the rows' check is open_results's
            argv = [command, "--ops", "all_reduce_norm", "--results", str(results)]
        line = refused(capsys, argv)
        assert "--results" in line and name in line and "newer" in line, line
    assert tree(tmp_path) == before


def test_results_through_a_link_to_a_system_folder_or_into_other_files_is_refused(
        tmp_path, capsys, no_ray):
    (tmp_path / "root").symlink_to("/")
    (tmp_path / "etc").symlink_to("/etc")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "thesis.tex").write_text("mine")
    config = suite(tmp_path)
    before = tree(tmp_path)
    for results, message in ((tmp_path / "root", f"{tmp_path / 'root'} (= /)"),
                             (tmp_path / "root" / "new", "(= /new)"),
                             (tmp_path / "etc", "the system folder /etc"),
                             (tmp_path / "etc" / "cron.d" / "x", "inside the system folder /etc"),
                             (theirs, "is not a lamport-lab results dataset")):
        line = refused(capsys, ["correctness", "--config", str(config), "--backend", "emulated",
                                "--results", str(results)])
        assert line.startswith("python -m jobs correctness: error: --results") and \
            message in line, line
    assert tree(tmp_path) == before and not Path("/new").exists()


def test_a_tilde_is_expanded_in_every_path_option(tmp_path, monkeypatch, capsys, no_ray):
    from jobs.options import path_arg
    monkeypatch.setenv("HOME", str(tmp_path))
    assert path_arg("~/x") == tmp_path / "x" and path_arg("~") == tmp_path
    assert path_arg("a/~/b") == Path("a/~/b")  # only a leading ~ is the home folder
    with pytest.raises(argparse.ArgumentTypeError, match="cannot expand ~"):
        path_arg("~no-such-user-here/x")
    (tmp_path / "file").write_text("mine")
    monkeypatch.chdir(tmp_path)
    line = refused(capsys, ["correctness", "--config", "~/suite-missing.toml"])
    assert f"config {tmp_path}/suite-missing.toml: no such file" in line, line
    line = refused(capsys, ["correctness", "--config", str(suite(tmp_path)), "--backend",
                            "emulated", "--results", "~/file"])
    assert f"--results {tmp_path}/file" in line and "~" not in line, line
    assert not (tmp_path / "~").exists()


@pytest.mark.parametrize("text, message", [
    ("x" * 256, "a component of 256 bytes"),
    ("é" * 128, "a component of 256 bytes"),
    ("a/" + "b" * 1000 + "/c", "a component of 1000 bytes"),
    ("/".join(["d" * 200] * 20), "made absolute; at most 3584"),
])
def test_a_path_too_long_is_refused_by_the_option(text, message, tmp_path, capsys):
    line = refused(capsys, ["correctness", "--results", text])
    assert "argument --results:" in line and message in line, line


def test_an_unusable_compile_cache_is_infrastructure_before_ray(tmp_path, monkeypatch, capsys,
                                                                no_ray):
    (tmp_path / "file").write_text("")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    config = str(suite(tmp_path))
    for cache in (tmp_path / "file", tmp_path / "file" / "sub", tmp_path / "dangling",
                  Path("/proc/lamport-cache"), Path("/dev/null")):
        monkeypatch.setenv("LAMPORT_COMPILE_CACHE", str(cache))
        line = refused(capsys, ["correctness", "--config", config, "--backend", "auto",
                                "--no-results"], status=3)
        assert "infrastructure: LAMPORT_COMPILE_CACHE" in line and str(cache) in line, line
    # the emulated backend builds no kernel: the cache is not its business
    with pytest.raises(AssertionError, match="Ray would have started"):
        main(["correctness", "--config", config, "--backend", "emulated", "--no-results"])
    monkeypatch.setenv("LAMPORT_COMPILE_CACHE", "off")
    with pytest.raises(AssertionError, match="Ray would have started"):
        main(["correctness", "--config", config, "--backend", "auto", "--no-results"])


def test_a_suite_with_an_empty_compile_arch_list_exits_2_before_ray(tmp_path, capsys, no_ray):
    """The regression of issue 64 item 8: at 4a8ac23 Ray started, then exit 1."""
    path = tmp_path / "suite.toml"
    path.write_text(suite(tmp_path).read_text() + "[compile_check]\narch = []\n")
    line = refused(capsys, ["nightly", "--config", str(path), "--backend", "emulated",
                            "--no-results"])
    assert "[compile_check] arch = [] selects nothing" in line, line


# ------------------------------------------------------------------ pipes
def test_schema_into_a_reader_that_is_gone_exits_0_without_a_traceback():
    """``python -m jobs schema | head -1``: the pipe's reader is closed
    before the command writes (BrokenPipeError at the first write)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for argv in (["schema"], ["--help"], ["report", "--help"]):
        child = subprocess.Popen([sys.executable, "-m", "jobs", *argv], cwd=ROOT, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        child.stdout.close()  # the reader is gone before the first line
        err = child.stderr.read().decode()
        assert child.wait(timeout=60) == 0, (argv, err)
        assert "Traceback" not in err and "BrokenPipe" not in err and \
            "Exception ignored" not in err, (argv, err)


def test_a_closed_stdout_ends_no_command_in_process(monkeypatch):
    class Gone(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Gone())
    assert main(["schema"]) == 0
    assert main(["report", "--help"]) == 0
