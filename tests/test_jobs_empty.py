"""A job that runs no case (none selected on this cluster, or every one
skipped) is not green: exit 1 with a line saying so, unless
``--allow-empty``."""

from __future__ import annotations

import pytest

from jobs import exits
from jobs.__main__ import main

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("ray")]


NONE_HERE = ["correctness", "--suite", "smoke", "--ops", "all_reduce_norm", "--tp", "2",
             "--placement", "process-per-gpu", "--backend", "emulated", "--no-results"]
ALL_SKIPPED = ["profile", "--suite", "smoke", "--ops", "all_reduce_norm", "--tp", "1",
               "--backend", "emulated", "--no-results"]


@pytest.mark.parametrize("argv", [NONE_HERE, ALL_SKIPPED], ids=["none-selected", "all-skipped"])
def test_a_job_that_runs_no_case_fails_unless_allowed(local_ray, capsys, argv):
    assert main(argv) == exits.FAILED
    out = capsys.readouterr().out
    assert "no case ran" in out and "--allow-empty" in out
    assert "0 pass, 0 fail, 0 hang, 0 error" in out
    assert main([*argv, "--allow-empty"]) == exits.OK
    assert "no case ran" not in capsys.readouterr().out


def test_a_job_that_runs_a_case_is_judged_by_it(local_ray, capsys):
    argv = ["correctness", "--suite", "smoke", "--ops", "all_reduce_norm", "--tp", "1",
            "--tokens", "3", "--inputs", "random", "--backend", "emulated", "--no-results"]
    assert main(argv) == exits.OK
    out = capsys.readouterr().out
    assert "no case ran" not in out and "1 pass" in out
