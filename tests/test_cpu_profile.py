"""tests/cpu_profile.py: a test's own CPU and the CPU of a process it started
are charged to it; the report names them; the split parts a run and says
what a target wall leaves."""

import json
import sys
from pathlib import Path

import pytest

from tests import cpu_profile

pytest_plugins = ["pytester"]

BURN = """
import subprocess, sys, time

def test_burns_in_a_child():
    subprocess.run([sys.executable, "-c",
                    "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 1.0: pass"],
                   check=True)

def test_burns_itself():
    t = time.process_time()
    while time.process_time() - t < 0.6:
        pass

def test_idle():
    time.sleep(0.6)
"""


def test_a_test_is_charged_its_own_cpu_and_its_childrens(pytester, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    pytester.makepyfile(test_burn=BURN)
    out = tmp_path / "cpu.json"
    done = pytester.runpytest_subprocess("-p", "tests.cpu_profile", "--cpu-profile", str(out),
                                         "-p", "no:cacheprovider")
    done.assert_outcomes(passed=3)
    profile = json.loads(out.read_text())
    own = {t[0].rsplit("::", 1)[1]: t[2] for t in profile["tests"] if t[0]}
    assert own["test_burns_itself"] >= 0.5 and own["test_idle"] < 0.3, own
    child = [p for p in profile["processes"] if "test_burns_in_a_child" in p[1]]
    assert len(child) == 1 and child[0][4] >= 0.7, child
    assert not any("test_idle" in p[1] for p in profile["processes"])
    text = cpu_profile.report(profile)
    assert "  test_burn.py\n" in text and "python -c ..." in text, text


def test_the_report_refuses_a_file_it_cannot_read(tmp_path, capsys):
    bad = tmp_path / "cpu.json"
    bad.write_text("{")
    assert cpu_profile.main([str(bad)]) == 2
    assert str(bad) in capsys.readouterr().err
    assert sys.modules["tests.cpu_profile"] is cpu_profile


def test_the_split_parts_the_run_and_says_what_a_target_leaves():
    """100 CPU-s over 50 s on 2 cores (100 % use): a named module's own 10
    and its child's 30, pytest's own 5 beyond its tests' 12, the rest 55;
    30 s holds 60, leaving 15 for the rest."""
    profile = {"wall_s": 50.0, "cores": 2,
               "tests": [["tests/test_a.py::test_x", "gw0", 10.0, 1.0, 0.0],
                         ["tests/test_b.py::test_y", "gw1", 2.0, 1.0, 0.0],
                         ["", "gw0", 12.0, 50.0, 0.0], ["", "gw1", 5.0, 50.0, 0.0]],
               "processes": [[1, "tests/test_a.py::test_x (call)", "gw0", "python -c x", 30.0],
                             [2, "tests/test_b.py::test_y (setup)", "gw1", "ray", 41.0],
                             [3, "", "", "pytest gw0", 12.0], [4, "", "", "pytest gw1", 5.0],
                             [5, "", "", "chromium", 12.0]]}
    text = cpu_profile.split(profile, {"tests/test_a.py"}, target_s=30)
    assert text.splitlines() == [
        "    100 CPU-s in all: 100% of 2 cores over 50 s",
        "     40  the 1 named modules (own and started)",
        "      5  pytest's own outside any test (collection, xdist)",
        "     55  the rest (the other tests, the machine's processes)",
        "     60  what 30 s holds at 100% use: 15 left for the rest (27% of what it took)"], text


def test_the_split_refuses_a_module_the_profile_lacks_and_a_target_alone(tmp_path, capsys):
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"wall_s": 1.0, "cores": 2, "processes": [],
                                "tests": [["tests/test_a.py::test_x", "gw0", 1.0, 1.0, 0.0]]}))
    assert cpu_profile.main([str(path), "--split", "tests/test_a.py,tests/test_nope.py"]) == 2
    assert "--split 'tests/test_a.py,tests/test_nope.py': no test of tests/test_nope.py" in \
        capsys.readouterr().err
    for argv in (["--target-s", "600"], ["--split", "tests/test_a.py", "--target-s", "0"]):
        with pytest.raises(SystemExit) as stop:
            cpu_profile.main([str(path), *argv])
        assert stop.value.code == 2
        assert "--target-s" in capsys.readouterr().err
    assert cpu_profile.main([str(path), "--split", "tests/test_a.py"]) == 0
    assert "the 1 named modules" in capsys.readouterr().out
