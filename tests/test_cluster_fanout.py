"""TP groups fanned out over the nodes of a Ray cluster (cluster.fanout):
the scheduler on its own (no Ray), then the correctness job on a simulated
multi-node Ray cluster (ray.cluster_utils.Cluster, emulated backend, fake
GPUs as the ``emulated_gpu`` custom resource): groups land on the node they
were planned for, run at the same time, and a node lost mid-run costs only
its own groups' cases."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cluster.emulated.segment import SHM_DIR
from cluster.fanout import Fanout, Span, Task, peak_overlap

pytestmark = pytest.mark.xdist_group("ray")  # starts Ray clusters: one at a time (conftest)


def _task(label, units, log, hold=0.05):
    def run(node):
        log.append(("start", label, node))
        time.sleep(hold)
        log.append(("end", label, node))
    return Task(label, units, run, lambda why: log.append(("unplaceable", label, why)))


def test_fanout_respects_capacity_and_spreads():
    log = []
    fan = Fanout({"a": 4, "b": 4}, max_parallel=8, alive=lambda: {"a", "b"})
    fan.run([_task("tp4", 4, log), _task("tp2", 2, log), _task("tp2b", 2, log),
             _task("tp8", 8, log), _task("tp1", 1, log)])
    starts = {label: node for kind, label, node in log if kind == "start"}
    assert starts["tp4"] != starts["tp2"] == starts["tp2b"]  # the tp4 fills one node
    assert ("unplaceable", "tp8") == log[[x[1] for x in log].index("tp8")][:2]
    assert "largest alive node has 4" in [x[2] for x in log if x[1] == "tp8"][0]
    assert fan.peak == 3 and len(fan.spans) == 4
    used = {}
    for kind, label, node in log:  # never more units on a node than it has
        if kind in ("start", "end"):
            used[node] = used.get(node, 0) + (1 if kind == "start" else -1) * \
                {"tp4": 4, "tp2": 2, "tp2b": 2, "tp1": 1}[label]
            assert used[node] <= 4


def test_fanout_forgets_a_node_that_left():
    log, alive = [], {"a", "b"}

    def lose_b(node):
        alive.discard("b")
        log.append(("start", "first", node))
    fan = Fanout({"a": 2, "b": 2}, max_parallel=1, alive=lambda: set(alive))
    fan.run([Task("first", 2, lose_b, lambda why: None), _task("second", 2, log),
             _task("third", 2, log)])
    starts = [(label, node) for kind, label, node in log if kind == "start"]
    assert starts == [("first", "b"), ("second", "a"), ("third", "a")]
    assert fan.capacity == {"a": 2}


def test_unbounded_fanout_is_sequential_by_default():
    log = []
    fan = Fanout(None, max_parallel=1, alive=set)
    fan.run([_task("x", 4, log), _task("y", 4, log)])
    assert [x[0] for x in log] == ["start", "end", "start", "end"] and fan.peak == 1


LEFT_BEHIND = """
import signal, sys, threading
from cluster.fanout import Fanout, Task
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))

def run(node):
    print("running", flush=True)
    threading.Event().wait()  # a group stuck in a Ray call to a GCS that is gone

Fanout(None, max_parallel=2).run([Task("stuck", 1, run, print)], stop_wait_s=0.5,
                                 on_interrupt=lambda: print("interrupted", flush=True))
"""


def test_a_group_an_interrupted_run_leaves_behind_does_not_hold_the_process():
    repo = Path(__file__).resolve().parents[1]
    job = subprocess.Popen([sys.executable, "-c", LEFT_BEHIND], cwd=repo, text=True,
                           env={**os.environ, "PYTHONPATH": str(repo)},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert job.stdout.readline() == "running\n"
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=30)  # a pool worker still running is joined at exit: forever
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    out = job.stdout.read()
    assert job.returncode == 143 and out == "interrupted\n", out


def test_peak_overlap():
    assert peak_overlap([Span("a", None, 0, 2), Span("b", None, 1, 3),
                         Span("c", None, 2.5, 4)]) == 2


CONFIG = """
format = 1
name = "fanout"
version = 1
description = "two TP groups over two simulated nodes"

[[correctness]]
op = "all_reduce_norm"
variant = "watchdog"
transport = "unicast"
placement = "auto"
tp = [2]
hidden = [1024, 2048]
tokens = [1, 3, 8, 2]
inputs = ["random"]
repeats = 1
budget_ns = 5_000_000_000
timeout_s = 60.0
"""


def _run(tmp_path, name):
    from jobs.__main__ import main
    from jobs.results import read_results
    status = main(["correctness", "--config", str(tmp_path / "fanout.toml"), "--backend",
                   "emulated", "--results", str(tmp_path / name), "--trigger", "ci"])
    rows = read_results(tmp_path / name).to_pylist()
    return status, rows, [json.loads(r["extra"]) for r in rows]


def _wait(barrier):
    try:
        barrier.wait()
    except threading.BrokenBarrierError:  # a group failed to build: the asserts say which
        pass


@pytest.mark.slow
def test_groups_fan_out_over_simulated_nodes_and_survive_a_lost_node(tmp_path, monkeypatch):
    """Two worker nodes with 2 emulated GPUs each and two tp=2 groups: one
    group a node, each on the node it was planned for, both at once.
    Barriers make the overlap certain, not timing: both groups are built
    before either runs a case, and neither's second case starts before both
    first cases have. Then the same job again, and once both groups are
    built the group of node 0 removes that node: its cases are errors that
    say why, node 1's pass, and the run ends with every row written.
    Run as a user who exported ``RAY_AUTH_MODE=token`` and has no token
    file: the simulated cluster takes the embedded cluster's token (before,
    its GCS never started: exit 3 after three 30-s timeouts)."""
    # jobs.faults (and the other sweep jobs) bind correctness's open_group and
    # run_case by name when first imported: imported here, before the patches
    # below, they keep the real ones, so no later module in this process runs a
    # faults job through this test's barriers (one that did hung until the
    # barrier's timeout: the interrupt-in-every-job module, 2026-12-07).
    from jobs import correctness, faults, profile  # noqa: F401
    from jobs.embedded import TOKEN_ENV
    from jobs.simulate import group_spans, simulated_cluster

    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "XDG_CONFIG_HOME", TOKEN_ENV):
        monkeypatch.delenv(name, raising=False)

    (tmp_path / "fanout.toml").write_text(CONFIG)
    monkeypatch.setattr(correctness, "SETUP_TIMEOUT_S", 600.0)  # 2 loaded cores start the actors
    open_group, run_case = correctness.open_group, correctness.run_case
    state = {}

    def gated_open(*args, **kwargs):
        group = open_group(*args, **kwargs)
        _wait(state["built"])
        if state.get("after_build") and group is not None:
            state["after_build"](kwargs.get("node_id"))
        return group

    def gated_case(run, suite, group, case, where):
        seen = state["seen"].setdefault(id(group), [])
        if len(seen) == 1:
            _wait(state["first_done"])
        seen.append(case)
        return run_case(run, suite, group, case, where)

    monkeypatch.setattr(correctness, "open_group", gated_open)
    monkeypatch.setattr(correctness, "run_case", gated_case)
    with simulated_cluster(2, 2) as cluster:
        state.update(built=threading.Barrier(2, timeout=600),
                     first_done=threading.Barrier(2, timeout=600), seen={})
        status, rows, extras = _run(tmp_path, "overlap")
        assert status == 0 and len(rows) == 8, [(r["outcome"], r["reason"]) for r in rows]
        nodes = {x["node_id"] for x in extras}
        assert len(nodes) == 2 and None not in nodes  # fanned out over both nodes
        assert all(x["rank_nodes"] == [x["node_id"]] for x in extras)  # where planned
        (a, b) = group_spans(rows).values()
        assert a[2] != b[2] and a[0] < b[1] and b[0] < a[1], (a, b)  # at once

        victim_node = sorted(cluster.worker_nodes, key=lambda n: n.node_id)[0]
        victim = victim_node.node_id

        def lose_victim(node_id):
            if node_id == victim:
                cluster.remove_node(victim_node)
        state.update(built=threading.Barrier(2, timeout=600), after_build=lose_victim)
        monkeypatch.setattr(correctness, "run_case", run_case)
        status, rows, extras = _run(tmp_path, "lost")
    # The lost node's rank segments (its actors died with it) are gone too.
    assert not [n for n in os.listdir(SHM_DIR) if f".p{os.getpid()}-" in n]
    assert status == 1 and len(rows) == 8, [(r["outcome"], r["reason"]) for r in rows]
    assert {x["node_id"] for x in extras} == nodes
    for r, x in zip(rows, extras):
        if x["node_id"] == victim:
            assert r["outcome"] == "error", r
            assert "node" in r["reason"].lower() or "died" in r["reason"].lower(), r["reason"]
        else:
            assert r["outcome"] == "pass", (r["outcome"], r["reason"])


@pytest.mark.parametrize("argv, said", [
    (["--units", "0"], "--units 0: must be in 1..64"),
    (["--units", "65"], "--units 65: must be in 1..64"),
    (["--nodes", "1,33"], "node counts in 1..32"),
    (["--nodes", "0"], "node counts in 1..32"),
])
def test_simulate_refuses_counts_out_of_range_before_ray(argv, said, capsys, monkeypatch):
    import ray

    from jobs import simulate
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started"))
    with pytest.raises(SystemExit) as stop:
        simulate.main(argv)
    assert stop.value.code == 2 and said in capsys.readouterr().err
