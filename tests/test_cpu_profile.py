"""tests/cpu_profile.py: a test's own CPU and the CPU of a process it started
are charged to it; the report names them."""

import json
import sys
from pathlib import Path

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
