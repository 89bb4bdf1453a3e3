"""``python -m jobs head start``: every listening socket of the head's
processes (GCS, raylet, dashboard and its agents, a worker running an actor
of a driver that joined it) is on the loopback address unless ``--host``
says otherwise; a ``--host`` that is no address of this machine, and a
token file that is not one, are refused before Ray starts."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import procs
from jobs.embedded import LOOPBACK_ENV
from tests.sockets import is_loopback, listening_sockets

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("ray-head")]
"""With the README's Ray section (conftest): one Ray head starting at a time
(two at once on the loaded 2-core box timed out in Ray's node start)."""

ACTOR = """
import os, ray, sys
ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)
@ray.remote(num_cpus=0)
class Echo:
    def pid(self):
        return os.getpid()
actor = Echo.remote()
print(ray.get(actor.pid.remote(), timeout=120), flush=True)
sys.stdin.readline()  # the actor lives until the test has listed the sockets
"""


def jobs(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return subprocess.run([sys.executable, "-m", "jobs", *argv], cwd=REPO, capture_output=True,
                          text=True, env={**env, "PYTHONPATH": str(REPO)}, **kwargs)


def test_the_head_listens_on_loopback_only(tmp_path):
    head = tmp_path / "head"
    try:
        done = jobs("head", "start", "--dir", str(head), "--num-cpus", "2", timeout=240)
        assert done.returncode == 0, done.stdout + done.stderr
        state = json.loads((head / "head.json").read_text())
        env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "token",
               "RAY_AUTH_TOKEN_PATH": state["token_path"], **LOOPBACK_ENV}
        env.pop("RAY_ADDRESS", None)
        driver = subprocess.Popen([sys.executable, "-c", ACTOR, state["address"]], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            ready, _, _ = select.select([driver.stdout], [], [], 180)
            assert ready, "the joined driver's actor did not start within 180 s"
            worker = int(driver.stdout.readline())
            pids = [state["pid"], *procs.descendants(state["pid"])]
            assert worker in pids, "the actor's worker is not one of the head's processes"
            sockets = listening_sockets(pids)
        finally:
            try:
                driver.communicate("done\n", timeout=60)
            finally:
                driver.kill()
    finally:
        jobs("head", "stop", "--dir", str(head), timeout=60)
    outside = [s for s in sockets if not is_loopback(s[2])]
    print(f"\nfigure: head start: {len(pids)} processes (GCS, raylet, dashboard, agents, an "
          f"actor's worker), {len(sockets)} listening sockets, {len(outside)} on a "
          f"non-loopback address")
    assert len(sockets) >= 5, f"too few listening sockets to prove anything: {sockets}"
    assert not outside, f"sockets on non-loopback addresses: {outside}"


@pytest.mark.parametrize("host, said", [("203.0.113.7", "nothing can listen there"),
                                        ("localhost", "give an IP address"),
                                        ("", "give an IP address")])
def test_a_host_that_is_not_here_is_refused_before_ray_starts(tmp_path, host, said):
    done = jobs("head", "start", "--dir", str(tmp_path / "head"), "--host", host, timeout=120)
    assert done.returncode == 2 and said in done.stderr and "--host" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "head" / "head.json").exists()


def test_a_token_file_that_is_not_one_is_refused_and_left_as_it_was(tmp_path):
    head = tmp_path / "head"
    head.mkdir()
    token = head / "auth_token"
    token.write_text("my shopping list\n")
    os.chmod(token, 0o644)
    done = jobs("head", "start", "--dir", str(head), timeout=120)
    assert done.returncode == 2 and "mode 0644" in done.stderr, done.stderr
    assert token.read_text() == "my shopping list\n" and token.stat().st_mode & 0o777 == 0o644
    os.chmod(token, 0o600)
    done = jobs("head", "start", "--dir", str(head), timeout=120)
    assert done.returncode == 2 and "does not hold a token" in done.stderr, done.stderr
    assert not (head / "head.json").exists()


@pytest.mark.parametrize("name", ["head.log", "head.json"])
def test_a_head_dir_holding_someone_elses_file_of_that_name_is_refused(tmp_path, name):
    (tmp_path / name).write_text("my own notes\n")
    done = jobs("head", "start", "--dir", str(tmp_path), timeout=120)
    assert done.returncode == 2 and f"{tmp_path / name} is not a head" in done.stderr
    assert (tmp_path / name).read_text() == "my own notes\n"
