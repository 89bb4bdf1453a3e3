"""``--pool NAME`` without ``--address``: the job joins the head ``jobs head
start`` recorded (as ``jobs pool start`` does); with none recorded it is
refused before Ray starts, naming --pool and where it looked."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_named_pool_without_a_cluster_is_refused_naming_the_option(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(LAMPORT_HEAD_DIR=str(tmp_path / "no-head"), PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "jobs", "correctness", "--suite", "smoke",
                          "--pool", "lab", "--no-results"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--pool lab: a standing pool lives on a running cluster" in out.stderr
    assert str(tmp_path / "no-head") in out.stderr and "python -m jobs head start" in out.stderr
    assert "ray" not in out.stdout.lower()  # refused before Ray started


def test_more_warm_workers_than_a_gpu_holds_are_refused_before_ray(tmp_path):
    from cluster.pool import MAX_WORKERS_PER_SLOT
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(LAMPORT_HEAD_DIR=str(tmp_path / "no-head"), PYTHONPATH=str(ROOT))
    too_many = MAX_WORKERS_PER_SLOT + 1
    out = subprocess.run([sys.executable, "-m", "jobs", "pool", "start", "--name", "lab",
                          "--warm", str(too_many)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"--warm {too_many}: must be in 0..{MAX_WORKERS_PER_SLOT}" in out.stderr
    assert "ray" not in out.stdout.lower()
