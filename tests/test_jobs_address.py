"""``--address``: a listener there that is no Ray cluster (it takes the TCP
connection and never answers as a GCS) ends the job with one line and exit
3 within ``jobs.session.JOIN_TIMEOUT_S``, where ``ray.init`` would wait for
ever; a malformed address, a port outside 1..65535 included, is bad usage
(exit 2) before anything is tried. (Nothing listening at all:
tests/test_jobs_exits.py.)"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs import exits
from jobs.__main__ import main

REPO = Path(__file__).resolve().parents[1]
QUICK = ["correctness", "--suite", "smoke", "--ops", "all_reduce_norm", "--tp", "2",
         "--backend", "emulated", "--no-results"]

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000",
                                     "127.0.0.1:x", ":6379", "[::1]"])
def test_a_malformed_address_is_bad_usage(capsys, address):
    assert main([*QUICK, "--address", address]) == exits.USAGE
    err = capsys.readouterr().err
    assert "give the GCS address HOST:PORT" in err and "Traceback" not in err


JOIN = """
import sys
import jobs.session
jobs.session.JOIN_TIMEOUT_S = 5.0
from jobs.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_listener_that_is_no_ray_cluster_is_exit_3_within_the_timeout():
    """Something accepts the connection and says nothing (not a GCS): the
    join gives up after its timeout (5 s here) with one line."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, "-c", JOIN, *QUICK, "--address",
                               f"127.0.0.1:{port}"], cwd=REPO, capture_output=True, text=True,
                              timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
                                                "HOME": str(Path.home())})
        took = time.monotonic() - t0
    assert done.returncode == exits.INFRA, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert f"the Ray cluster at 127.0.0.1:{port} did not take this driver within 5 s" in last
    assert took < 90, took
