"""scripts/gpu/suite.py on the CPU (its GPU tests skip here): which files
are parts, one part's counts from its JUnit XML, the summary and the row for
docs/results/gpu_suite.md, a budget that leaves parts for --resume, and a
part killed at its limit counted as an error."""

import importlib.util
import json
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_suite", ROOT / "scripts/gpu/suite.py")
suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)

PART = "tests/test_reference_moe.py"  # small, with gpu-marked tests (skipped here)


def test_parts_are_the_files_with_gpu_tests():
    files = suite.gpu_files()
    assert PART in files and "tests/gpu/test_cluster_gpu.py" in files
    assert "tests/test_pytest_plugins.py" not in files  # mentions the marks only in strings
    assert "tests/test_golden.py" not in files
    one_gpu = suite.gpu_files(marks=("gpu",))  # a file of multigpu tests only is no part there
    assert "tests/gpu/test_trace_gpu.py" in files and "tests/gpu/test_trace_gpu.py" not in one_gpu
    assert "tests/gpu/test_timing_gpu.py" in one_gpu


def test_a_run_a_budget_and_resume(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SUITE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    monkeypatch.setattr(suite, "gpus", lambda: [])
    assert suite.main([PART]) == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "state/summary.json").read_text())
    assert summary["failed"] == summary["errors"] == 0 and summary["skipped"] > 0
    assert "suite green" in out and PART in out
    row = (tmp_path / "state/row.md").read_text()
    assert row.startswith(f"| {summary['commit'][:12]} |") and '-m "gpu"' in row
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"gpu-suite.tgz", "summary.txt"}

    # no budget left: nothing started, the run is incomplete, --resume finishes it
    assert suite.main([PART, "tests/test_reference_mhc.py", "--budget", "1"]) == 1
    assert "INCOMPLETE" in capsys.readouterr().out
    assert suite.main([PART, "tests/test_reference_mhc.py", "--resume"]) == 0
    assert "suite green" in capsys.readouterr().out


def _stall(tmp_path, monkeypatch, when: str) -> None:
    """Make every part's Python end badly, through a ``sitecustomize`` first
    on the parts' PYTHONPATH: ``"start"`` stalls 3 s before pytest runs (past
    any 1 s limit, no JUnit XML), ``"exit"`` SIGKILLs itself after pytest
    wrote its whole XML (what a kill at the limit of a hung teardown looks
    like to the runner: exit 137). Neither races a limit against how long
    pytest takes on a loaded box."""
    site = tmp_path / "stall"
    site.mkdir()
    body = ("import time\ntime.sleep(3)\n" if when == "start" else
            "import atexit, os, signal\natexit.register(os.kill, os.getpid(), signal.SIGKILL)\n")
    (site / "sitecustomize.py").write_text(body)
    monkeypatch.setenv("PYTHONPATH", f"{site}:{ROOT}")


@pytest.mark.parametrize("when, limit_s, why", [
    ("start", 1, "killed at its 1 s limit"),
    ("exit", 600, "before its 600 s limit after its tests ended")])
def test_a_killed_part_is_an_error(when, limit_s, why, tmp_path, monkeypatch, capsys):
    """Killed, at its own limit or not: one error, whether or not its pytest
    had written a complete JUnit XML (a green XML does not make a killed part
    green)."""
    monkeypatch.setenv("SUITE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("OUT", raising=False)
    monkeypatch.setattr(suite, "gpus", lambda: [])
    _stall(tmp_path, monkeypatch, when)
    assert suite.main([PART, "--part-timeout", str(limit_s)]) == 1
    out = capsys.readouterr().out
    assert why in out and "suite RED" in out
    assert ("after its tests ended" in out) == (when == "exit")


def test_a_part_cut_by_the_budget_is_left_for_resume(tmp_path, monkeypatch, capsys):
    """Killed at the budget's remainder, not its own timeout: not an error,
    not done; --resume runs it."""
    monkeypatch.setenv("SUITE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("OUT", raising=False)
    monkeypatch.setattr(suite, "gpus", lambda: [])
    monkeypatch.setattr(suite, "MIN_PART_S", 0.5)
    with monkeypatch.context() as stalled:  # cut whether its XML was complete or not
        _stall(tmp_path, stalled, "exit")
        assert suite.main([PART, "--budget", "1"]) == 1
    out = capsys.readouterr().out
    assert "cut at the budget's last" in out and "INCOMPLETE" in out and "not started" in out
    assert suite.main([PART, "--resume"]) == 0
    assert "suite green" in capsys.readouterr().out


@pytest.mark.parametrize("opt, value", [("--lanes", "0"), ("--ray-at-once", "0"),
                                        ("--ray-at-once", "17")])
def test_lanes_and_ray_at_once_out_of_range_are_refused(opt, value, capsys):
    with pytest.raises(SystemExit) as exit_:
        suite.main([PART, opt, value])
    assert exit_.value.code == 2 and f"{opt} must be in 1..16, got {value}" in capsys.readouterr().err


def test_an_unknown_file_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        suite.main(["tests/nonesuch.py"])
    assert exit_.value.code == 2 and "tests/nonesuch.py" in capsys.readouterr().err


def test_lanes_run_parts_at_once_at_most_two_ray_ones_and_timed_ones_alone(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SUITE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("OUT", raising=False)
    monkeypatch.setattr(suite, "gpus", lambda: [])
    spans = {}

    def fake(path, state, mark, slow, limit_s, *, cut_by_budget=False):
        t0 = time.monotonic()
        time.sleep(0.3)
        spans[path] = (t0, time.monotonic())
        return {"part": path, "exit": 0, "wall_s": 0.3, "passed": 1, "failed": 0, "skipped": 0,
                "errors": 0, "slowest": []}
    monkeypatch.setattr(suite, "run_part", fake)
    shared = [PART, "tests/test_reference_mhc.py"]
    serial = ["tests/gpu/test_cluster_gpu.py", "tests/gpu/test_cluster_ops_gpu.py",
              "tests/gpu/test_pool_gpu.py"]
    timed = "tests/gpu/test_timing_gpu.py"
    assert set(serial) == set(suite.RAY_PARTS) and timed in suite.ALONE
    assert suite.main([*shared, *serial, timed, "--lanes", "4", "--ray-at-once", "2"]) == 0

    def overlap(p, q):
        return spans[p][0] < spans[q][1] and spans[q][0] < spans[p][1]
    assert overlap(*shared)  # kernel parts side by side
    first_two = sorted(serial, key=suite.RAY_PARTS.index)[:2]  # the longest Ray parts start first
    assert overlap(*first_two) and all(overlap(first_two[0], p) for p in shared)
    # never three at once (intervals that overlap pairwise share a point)
    assert not all(overlap(p, q) for p in serial for q in serial if p < q)
    last = sorted(serial, key=suite.RAY_PARTS.index)[2]
    assert spans[last][0] >= min(spans[p][1] for p in first_two)  # waited for one to end
    assert spans[timed][0] >= max(t1 for _, t1 in (spans[p] for p in [*shared, *serial]))
    assert "4 lane(s)" in capsys.readouterr().out
    said = json.loads((tmp_path / "state" / "summary.json").read_text())["command"]
    assert said == "bash scripts/gpu/suite.sh --lanes 4 --ray-at-once 2"  # the row says the form run

    spans.clear()  # the default, --ray-at-once 1: the Ray parts one after another
    monkeypatch.setenv("SUITE_DIR", str(tmp_path / "state-one-ray"))
    assert suite.main([*shared, *serial, timed, "--lanes", "4"]) == 0
    assert not any(overlap(p, q) for p in serial for q in serial if p < q)
    assert any(overlap(p, shared[0]) for p in serial)
    said = json.loads((tmp_path / "state-one-ray" / "summary.json").read_text())["command"]
    assert said == "bash scripts/gpu/suite.sh --lanes 4"

    spans.clear()  # one lane: every part in turn, in the order given
    monkeypatch.setenv("SUITE_DIR", str(tmp_path / "state1"))
    assert suite.main([*shared, *serial, timed]) == 0
    order = sorted(spans, key=lambda p: spans[p][0])
    assert order == [*shared, *serial, timed]
    assert all(not overlap(p, q) for p, q in zip(order, order[1:]))
