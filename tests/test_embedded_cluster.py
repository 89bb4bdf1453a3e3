"""The embedded Ray cluster (jobs.embedded): loopback only, token file only
its owner reads, and nothing left behind when its driver ends (SIGTERM:
the driver cleans up; SIGKILL: its watchdog does)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster import procs
from jobs.embedded import WORKER_ENV
from tests.sockets import is_loopback

REPO = Path(__file__).resolve().parents[1]
GRACE_S = 30.0
"""How long a killed driver's cluster may take to disappear (the watchdog
polls every 0.5 s and gives SIGTERM-deaf agents 3 s before SIGKILL)."""

pytestmark = pytest.mark.timeout(300)


def env(tmp_path: Path) -> dict[str, str]:
    """The driver's environment: this one's, less the worker niceness the
    test session sets (tests/conftest.py), which the cluster must set itself."""
    return {**{k: v for k, v in os.environ.items() if k not in WORKER_ENV},
            "PYTHONPATH": str(REPO), "LAMPORT_RAY_TOKEN_FILE":
            str(tmp_path / "token" / "ray-auth-token"), "RAY_ADDRESS": ""}


SOCKETS = """
import json, os, ray, sys
sys.path.insert(0, sys.argv[1])
from sockets import listening_sockets
from cluster import procs
from jobs.embedded import embedded_cluster
with embedded_cluster(2) as how:
    @ray.remote
    class Echo:
        def ping(self):
            return os.getpid(), os.nice(0)
    actor = Echo.remote()
    _, nice = ray.get(actor.ping.remote(), timeout=120)
    pids = [os.getpid(), *procs.descendants(os.getpid())]
    print(json.dumps({"how": how, "sockets": listening_sockets(pids), "pids": len(pids),
                      "auth": os.environ.get("RAY_AUTH_MODE"), "worker_nice": nice}), flush=True)
"""


def test_the_embedded_cluster_listens_on_loopback_only_with_an_owner_only_token(tmp_path):
    token = tmp_path / "token" / "ray-auth-token"
    token.parent.mkdir()
    token.write_text("a" * 64)
    os.chmod(token, 0o600)  # one of the user's own: read, not changed
    done = subprocess.run([sys.executable, "-c", SOCKETS, str(Path(__file__).parent)],
                          env=env(tmp_path), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    sockets = report["sockets"]
    outside = [s for s in sockets if not is_loopback(s[2])]
    print(f"\nfigure: embedded cluster: {report['pids']} processes, {len(sockets)} listening "
          f"sockets, {len(outside)} on a non-loopback address")
    assert sockets, "no listening socket found: the listing proved nothing"
    assert not outside, f"sockets on non-loopback addresses: {outside}"
    assert report["auth"] == "token"
    assert report["worker_nice"] == os.nice(0) == 0  # not Ray's default 15 (WORKER_ENV)
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert "Token authentication is enabled" not in done.stderr  # set on purpose: no warning


SUITE = """format = 1
name = "killme"
version = 1
[[faults]]
op = "all_reduce_norm"
tp = 2
hidden = 256
tokens = 2
kinds = ["stuck_rank"]
budget_ns = 200_000_000
timeout_s = 120
"""


def _segments_of(pid: int) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith("ll-") and f".p{pid}-" in n)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_killed_driver_leaves_no_ray_process_and_no_segment(tmp_path, sig):
    suite = tmp_path / "killme.toml"
    suite.write_text(SUITE)
    driver = subprocess.Popen(
        [sys.executable, "-m", "jobs", "faults", "--config", str(suite), "--backend", "emulated",
         "--results", str(tmp_path / "results"), "--trigger", "ci"],
        env=env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=tmp_path)
    cluster: dict[int, int] = {}
    try:
        deadline = time.monotonic() + 180
        while not _segments_of(driver.pid):  # a TP group is up: the hang case runs
            assert driver.poll() is None, driver.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "no TP group came up"
            time.sleep(0.2)
        time.sleep(1.0)
        cluster = procs.descendants(driver.pid)
        segments = _segments_of(driver.pid)
        os.kill(driver.pid, sig)
        killed_at = time.monotonic()
        driver.wait(timeout=GRACE_S)
        deadline = killed_at + GRACE_S
        while True:
            left = {p: s for p, s in cluster.items() if procs.alive(p, s)}
            left_segments = _segments_of(driver.pid)
            if (not left and not left_segments) or time.monotonic() > deadline:
                cleared_s = time.monotonic() - killed_at
                break
            time.sleep(0.2)
    finally:
        if driver.poll() is None:
            cluster.update(procs.descendants(driver.pid))
            driver.kill()
            driver.wait()
        # By (pid, start time): the driver is reaped, so its pid may name
        # another process by now (pids wrap quickly on a busy machine).
        procs.stop(cluster, grace_s=1)
    out = driver.stdout.read()
    print(f"\nfigure: {sig.name} of the driver: {len(cluster)} processes and {len(segments)} "
          f"segment(s) before; {len(left)} processes and {len(left_segments)} segment(s) left "
          f"(checked for {cleared_s:.1f} s of the {GRACE_S:.0f} s grace period)")
    assert len(cluster) >= 3 and segments, "the kill did not land on a running cluster"
    assert not left, f"processes left: {[(p, Path(f'/proc/{p}/cmdline').read_bytes()[:80]) for p in left]}"
    assert not left_segments, f"segments left: {left_segments}"
    from jobs.results import list_runs
    status = list_runs(tmp_path / "results").column("run_status").to_pylist() \
        if (tmp_path / "results").exists() else []
    assert status in ([], ["incomplete"]), (status, out[-2000:])
