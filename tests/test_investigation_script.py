"""scripts/investigation.sh end to end on the emulated backend: a head and a
standing pool of its own, the issue's small correctness check through the
pool (joined by the GCS address the head recorded) and with ``--pool off``,
each step's exit status and wall on a line, and nothing left running."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[1]
STEP = re.compile(r"^(?P<label>.+?)\s+exit\s+(?P<rc>\d+)\s+(?P<wall>[\d.]+) s", re.MULTILINE)


def _investigate(tmp_path, pool_name: str):
    """The script with one pooled run on the emulated backend: its process
    and {step label: exit status} from its lines."""
    env = {**os.environ, "PYTHON": sys.executable, "RUNS": "1", "POOL_NAME": pool_name,
           "LAMPORT_HEAD_DIR": str(tmp_path / "head"), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(["bash", "scripts/investigation.sh", "--backend", "emulated"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=560)
    return out, {m["label"].strip(): int(m["rc"]) for m in STEP.finditer(out.stdout)}


def test_the_investigation_runs_through_a_standing_pool_and_stops_it(tmp_path):
    out, steps = _investigate(tmp_path, "inv-test")
    assert out.returncode == 0, out.stdout + out.stderr
    assert steps == {"jobs head start": 0, "jobs pool start --name inv-test": 0,
                     "correctness --pool inv-test (1)": 0, "correctness --pool off": 0,
                     "jobs pool stop --name inv-test": 0, "jobs head stop": 0}, out.stdout
    assert out.stdout.count("6 pass, 0 fail, 0 hang, 0 error, 0 skipped") == 2, out.stdout
    assert "stopped, 1 worker(s) ended" in out.stdout or "stopped, 2 worker(s) ended" in out.stdout
    assert not (tmp_path / "head" / "head.json").exists()  # head stop removed its state


def test_runs_must_be_a_whole_number(tmp_path):
    out = subprocess.run(["bash", "scripts/investigation.sh"], cwd=ROOT, capture_output=True,
                         text=True, env={**os.environ, "RUNS": "two",
                                         "LAMPORT_HEAD_DIR": str(tmp_path / "head")})
    assert out.returncode == 2 and "RUNS must be a whole number >= 1, got 'two'" in out.stderr


def test_a_failed_step_still_stops_the_head_it_started(tmp_path):
    out, steps = _investigate(tmp_path, "no/such name")
    assert out.returncode == 2, out.stdout + out.stderr
    assert steps == {"jobs head start": 0, "jobs pool start --name no/such name": 2}, out.stdout
    assert "--name" in out.stdout  # the refusal names the option
    assert not (tmp_path / "head" / "head.json").exists()  # the EXIT trap stopped the head
