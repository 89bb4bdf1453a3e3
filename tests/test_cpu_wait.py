"""cluster.procs.cpu_wait_s: a process kept off the CPU accrues run-queue
wait, a sleeping one none (what moves a call's host deadline on a starved
host, cluster.group)."""

import os
import subprocess
import sys
import time

import pytest

from cluster.procs import cpu_wait_s

SPIN = "while True: pass"
READY = "print('ready', flush=True)\n"


@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="no /proc/<pid>/schedstat")
def test_a_starved_process_accrues_cpu_wait_and_a_sleeping_one_none():
    cpu = min(os.sched_getaffinity(0))
    spin, sleep = (subprocess.Popen([sys.executable, "-c", READY + code], stdout=subprocess.PIPE)
                   for code in (SPIN, "import time; time.sleep(60)"))
    hogs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(3)]
    try:
        for p in (spin, sleep):  # past the interpreter's start
            assert p.stdout.readline() == b"ready\n"
        for p in (spin, sleep, *hogs):  # four spinners share one CPU: each waits ~3/4 of the time
            os.sched_setaffinity(p.pid, {cpu})
        before = {p.pid: cpu_wait_s(p.pid) for p in (spin, sleep)}
        time.sleep(2.0)
        grew = {pid: cpu_wait_s(pid) - w for pid, w in before.items()}
    finally:
        for p in (spin, sleep, *hogs):
            p.kill()
            p.wait()
    assert grew[spin.pid] > 0.5, grew
    assert grew[sleep.pid] < 0.05, grew
    assert cpu_wait_s(spin.pid) is None  # gone
