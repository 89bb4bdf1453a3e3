"""One live driver per run (jobs.results.lease), and manifests that cannot
be used: two drivers racing for one run id (exactly one wins each), a second
driver refused before Ray starts naming the live one, a stale lease taken
over, the heartbeat thread, damaged manifests (said in one line, never
resumed), ``_runs`` that is a file, and a full disk writing the manifest
(exit 3, the rows kept). None of these start Ray."""

from __future__ import annotations

import datetime as dt
import errno
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs import exits
from jobs.results import lease, read_results, runs

REPO = Path(__file__).resolve().parents[1]
RACE_RUNS = 150

pytestmark = pytest.mark.timeout(300)

RACER = """
import json, sys, time
from pathlib import Path
from jobs.results import runs
root, n, go = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.0005)
won = []
for i in range(n):
    try:
        runs.begin(root, f"race-{i}", trigger="nightly")
        won.append(i)
    except Exception as err:
        if type(err).__name__ != "LeaseHeld":
            raise
print(json.dumps(won), flush=True)
sys.stdin.readline()  # alive, holding the leases it won, until both have answered
"""


def _spawn(code: str, *argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *argv], cwd=REPO, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def test_two_drivers_racing_for_the_same_runs_one_wins_each(tmp_path):
    """Two driver processes take the lease of the same 150 run ids in the
    same order at the same moment (``runs.begin``, the entry point every
    driver goes through): each run id is won by exactly one, and its
    manifest names that one. (At 4a8ac23 both won all 150: ``begin`` let a
    second driver join a running run.)"""
    root, go = tmp_path / "results", tmp_path / "go"
    racers = [_spawn(RACER, str(root), str(RACE_RUNS), str(go)) for _ in range(2)]
    try:
        for racer in racers:
            assert racer.stdout.readline() == "ready\n"
        go.touch()
        won = [set(json.loads(racer.stdout.readline())) for racer in racers]
        manifests = runs.read_manifests(root)
    finally:
        for racer in racers:
            racer.stdin.close()
            racer.wait(timeout=60)
    both = won[0] & won[1]
    print(f"\nfigure: {RACE_RUNS} run ids raced by 2 drivers: won {len(won[0])} + {len(won[1])}, "
          f"by both {len(both)}, by neither {RACE_RUNS - len(won[0] | won[1])}")
    assert not both, f"both drivers won {len(both)} of {RACE_RUNS} runs"
    assert won[0] | won[1] == set(range(RACE_RUNS))
    for index, racer in enumerate(racers):
        for i in won[index]:
            assert manifests[f"race-{i}"]["driver"]["pid"] == racer.pid


HOLDER = """
import sys
from jobs.results import runs
runs.begin(sys.argv[1], sys.argv[2], trigger="nightly", keep_alive=True)
print("held", flush=True)
sys.stdin.readline()
"""


def _jobs(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-m", "jobs", *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=200)


def test_a_second_driver_exits_2_before_ray_naming_the_live_one_and_a_dead_ones_lease_is_taken(
        tmp_path):
    root = tmp_path / "results"
    holder = _spawn(HOLDER, str(root), "held")
    try:
        assert holder.stdout.readline() == "held\n"
        for argv in (["nightly", "--suite", "smoke", "--resume", "--no-dashboard"],
                     ["correctness", "--suite", "smoke"],
                     # the jobs that run no Ray (at 7cb8c33 both wrote into the held run)
                     ["selfcheck", "--case", "embed_norm_tp3"],
                     ["compile-check", "--ops", "all_reduce_norm", "--hidden", "2560",
                      "--tp", "2", "--arch", "sm_90a"]):
            done = _jobs(*argv, "--run-id", "held", "--results", str(root))
            assert done.returncode == exits.USAGE, done.stdout[-2000:] + done.stderr[-2000:]
            assert done.stdout == ""  # refused before Ray starts: not even its heading
            (line,) = done.stderr.splitlines()
            assert (f": --run-id held: the run is being driven by pid {holder.pid}@"
                    f"{socket.gethostname()}, heartbeat ") in line, line
            assert "one live driver per run" in line
        assert not read_results(root).num_rows
        data = runs.read_manifest(root, "held")
        assert data["driver"]["pid"] == holder.pid
    finally:
        holder.kill()
        holder.wait(timeout=30)
    # Its driver gone (kill -9: no release): the next driver takes the lease over.
    taken = _spawn(HOLDER, str(root), "held")
    try:
        assert taken.stdout.readline() == (
            f"run held: taking over its stale lease from pid {holder.pid}@{socket.gethostname()}"
            f", heartbeat {lease.heartbeat_age(data):.0f} s ago (its process is gone)\n")
        assert taken.stdout.readline() == "held\n"
        data = runs.read_manifest(root, "held")
        assert data["driver"]["pid"] == taken.pid and data["status"] == "running"
    finally:
        taken.kill()
        taken.wait(timeout=30)


def test_a_job_joining_a_run_with_run_id_holds_its_lease_and_ends_it(tmp_path):
    """A standalone self-check joining run ``joined`` (``--run-id``) takes
    the run's lease as it opens and ends the run with the counts of all its
    rows: a second part reopens it and adds its row to the counts."""
    root = tmp_path / "results"
    for part in (1, 2):
        done = _jobs("selfcheck", "--case", "embed_norm_tp3", "--run-id", "joined",
                     "--results", str(root))
        assert done.returncode == exits.OK, done.stdout[-2000:] + done.stderr[-2000:]
        data = runs.read_manifest(root, "joined")
        assert data["status"] == "finished" and not lease.live(data), data
        assert data["counts"] == {"pass": part}, data
    assert read_results(root).num_rows == 2


def _stamp(seconds_ago: float) -> str:
    return (dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=seconds_ago)).isoformat()


def test_a_lease_elsewhere_is_held_while_its_heartbeat_is_fresh(tmp_path, capsys):
    root = tmp_path / "results"
    other = {"host": "elsewhere.example", "pid": 4242, "create_time": 1.0}
    runs._write(root, "far", {"run_id": "far", "status": "running", "driver": other,
                              "heartbeat_at": _stamp(5)})
    with pytest.raises(lease.LeaseHeld, match=r"driven by pid 4242@elsewhere.example, "
                                              r"heartbeat 5 s ago"):
        runs.begin(root, "far", trigger="nightly")
    assert runs.effective_status(runs.read_manifest(root, "far")) == "running"
    runs._write(root, "far", {"run_id": "far", "status": "running", "driver": other,
                              "heartbeat_at": _stamp(lease.STALE_S + 1)})
    assert runs.effective_status(runs.read_manifest(root, "far")) == "incomplete"
    runs.begin(root, "far", trigger="nightly")
    assert capsys.readouterr().out == (
        f"run far: taking over its stale lease from pid 4242@elsewhere.example, heartbeat "
        f"{lease.STALE_S + 1:.0f} s ago (no heartbeat for more than {lease.STALE_S:g} s)\n")
    assert runs.owns(runs.read_manifest(root, "far"))
    runs.begin(root, "far", trigger="nightly")  # its own driver again: nothing said
    assert capsys.readouterr().out == ""


def test_the_heartbeat_thread_beats_until_the_run_ends(tmp_path, monkeypatch):
    monkeypatch.setattr(lease, "HEARTBEAT_S", 0.05)
    root = tmp_path / "results"
    runs.begin(root, "beat", trigger="nightly", keep_alive=True)
    first = runs.read_manifest(root, "beat")["heartbeat_at"]
    deadline = time.monotonic() + 30
    while runs.read_manifest(root, "beat")["heartbeat_at"] == first:
        assert time.monotonic() < deadline, "no heartbeat in 30 s"
        time.sleep(0.05)
    runs.finish(root, "beat", counts={"pass": 1}, missing=2)
    data = runs.read_manifest(root, "beat")
    assert (data["status"], data["missing"]) == ("incomplete", 2)  # rows lacking: not finished
    assert (str(root), "beat") not in runs._HEARTBEATS
    time.sleep(0.2)
    assert runs.read_manifest(root, "beat") == data  # no beat after the end
    runs.begin(root, "beat", trigger="nightly")  # --resume: the lease again
    assert "missing" not in runs.read_manifest(root, "beat")
    runs.release(root, "beat")  # the driver stopped another way
    assert runs.read_manifest(root, "beat")["status"] == "incomplete"


DAMAGED = {
    "not JSON": ('{"run_id": "bad", "status": "finis', "not JSON: "),
    "deeply nested": ('{"run_id": "bad", "facts": ' + "[" * 100_000 + "]" * 100_000 + "}",
                      "nested deeper than the JSON parser's limit"),
    "wrong types": (json.dumps({"run_id": "bad", "status": "finished", "counts": {"pass": "3"}}),
                    'counts is {"pass": "3"}, not {outcome: int}'),
    "unknown status": (json.dumps({"run_id": "bad", "status": "done"}), 'status is "done"'),
    "missing fields": (json.dumps({"run_id": "bad", "status": "running"}),
                       "status is running but driver and heartbeat_at missing"),
    "another run's": (json.dumps({"run_id": "good", "status": "finished"}),
                      "run_id is 'good', the file is named for 'bad'"),
    "not an object": ("[1, 2]", "not a JSON object but list"),
}


@pytest.mark.parametrize("kind", list(DAMAGED))
def test_a_damaged_manifest_is_said_in_one_line_and_never_resumed(tmp_path, capsys, kind):
    from jobs.__main__ import main
    text, problem = DAMAGED[kind]
    root = tmp_path / "results"
    path = runs.manifest_path(root, "bad")
    path.parent.mkdir(parents=True)
    path.write_text(text)
    for argv in (["nightly", "--resume", "--no-dashboard"], ["correctness"]):
        assert main([*argv, "--suite", "smoke", "--run-id", "bad", "--results", str(root)]) \
            == exits.USAGE
        out, err = capsys.readouterr()
        (line,) = err.splitlines()
        assert f"{path}: damaged run manifest (" in line and problem in line, line
        assert out == ""
    assert path.read_text() == text  # not overwritten
    with pytest.warns(runs.ManifestWarning, match=f"{path}: damaged run manifest") as said:
        assert runs.read_manifests(root) == {}
    assert len(said) == 1


def test_runs_that_is_a_file_is_one_line_exit_2(tmp_path, capsys):
    from jobs.__main__ import main
    root = tmp_path / "results"
    root.mkdir()
    (root / runs.RUNS_DIR).write_text("not a folder")
    for extra in ([], ["--run-id", "r1"]):
        assert main(["correctness", "--suite", "smoke", "--results", str(root), *extra]) \
            == exits.USAGE
        (line,) = capsys.readouterr().err.splitlines()
        assert f"{root / runs.RUNS_DIR}: not a folder (the run manifests live in it)" in line


def test_a_full_disk_writing_the_manifest_is_exit_3_and_keeps_the_rows(tmp_path, capsys,
                                                                      monkeypatch):
    from jobs.__main__ import main
    root = tmp_path / "results"
    replace = os.replace

    def full_disk(src, dst, *args, **kwargs):
        if Path(dst).parent.name == runs.RUNS_DIR and any(root.rglob("*.parquet")):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        return replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", full_disk)
    status = main(["selfcheck", "--case", "all_reduce_norm_sentinel_tp2",
                   "--case", "embed_norm_tp3", "--results", str(root)])
    out, err = capsys.readouterr()
    assert status == exits.INFRA, out + err
    (line,) = err.splitlines()
    assert "infrastructure: " in line and "could not be written (No space left on device); " \
                                          "the rows written so far are kept" in line, line
    monkeypatch.setattr(os, "replace", replace)
    assert sorted(read_results(root).column("variant").to_pylist()) == [
        "all_reduce_norm_sentinel_tp2", "embed_norm_tp3"]
