"""``jobs head start --dashboard auto|on|off``: a head without Ray's
dashboard (a minimal ``ray`` install, as on the offline GPU machine) has no
job server; ``submit`` against it is refused (exit 2, before contacting
anything, naming the head and why), while a standing pool and ``--pool
NAME`` join its GCS as they would any head's; ``head status|stop`` work."""

from __future__ import annotations

import json

import pytest

from cluster import procs
from jobs import exits
from jobs import head as hd
from jobs.__main__ import main
from jobs.config import ConfigError
from tests.test_jobs_head import jobs

MISSING = ImportError("No module named 'aiohttp'")
SMALL_CHECK = ("correctness", "--suite", "nightly", "--ops", "all_reduce_norm", "--tp", "1",
               "--hidden", "7168", "--tokens", "8", "--no-results", "--backend", "emulated")
"""scripts/investigation.sh's check (6 cases), on the emulated backend."""


@pytest.mark.parametrize("error, mode, without", [
    (None, "auto", None),
    (MISSING, "auto", f"ray minimal: {MISSING}"),
    (None, "on", None),
    (None, "off", "--dashboard off"),
    (MISSING, "off", "--dashboard off"),
])
def test_the_dashboard_runs_where_its_packages_import(monkeypatch, error, mode, without):
    monkeypatch.setattr(hd, "dashboard_dependency_error", lambda: error)
    assert hd.decide_dashboard(mode) == without


def test_dashboard_on_without_its_packages_is_refused_before_ray_starts(monkeypatch, tmp_path,
                                                                        capsys):
    monkeypatch.setattr(hd, "dashboard_dependency_error", lambda: MISSING)
    with pytest.raises(ConfigError, match="--dashboard on.*No module named 'aiohttp'"):
        hd.decide_dashboard("on")
    assert main(["head", "start", "--dir", str(tmp_path / "head"), "--dashboard", "on"]) \
        == exits.USAGE
    err = capsys.readouterr().err
    assert "--dashboard on" in err and "No module named 'aiohttp'" in err, err
    assert not (tmp_path / "head").exists()  # nothing written, Ray never started


@pytest.mark.parametrize("command", [["submit", "--", "correctness", "--results", "/tmp/r"],
                                     ["status", "some-job"], ["logs", "some-job"]])
def test_the_job_server_of_a_head_without_the_dashboard_is_refused(tmp_path, monkeypatch,
                                                                   capsys, command):
    """No process behind this state: a refusal that contacted anything
    would say exit 3, not 2."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    (tmp_path / hd.STATE_FILE).write_text(json.dumps({
        "pid": 2 ** 22 + 1, "address": "127.0.0.1:1", "dashboard": None, "agent": None,
        "no_dashboard": f"ray minimal: {MISSING}", "temp_dir": str(tmp_path / "gone")}))
    assert main([command[0], "--dir", str(tmp_path), *command[1:]]) == exits.USAGE
    err = capsys.readouterr().err
    assert (f"the head at {tmp_path} runs without the dashboard (ray minimal: {MISSING}): no "
            f"job server for {command[0]}") in err, err


@pytest.mark.xdist_group("ray-head")
@pytest.mark.timeout(600)
def test_a_head_without_the_dashboard_serves_a_pool_and_refuses_submit(tmp_path, monkeypatch):
    head = tmp_path / "head"
    monkeypatch.setenv("LAMPORT_HEAD_DIR", str(head))  # for every command below
    left: dict[int, int] = {}
    try:
        done = jobs("head", "start", "--dashboard", "off", "--num-cpus", "2", timeout=240)
        assert done.returncode == 0, done.stdout + done.stderr
        assert ("runs without the dashboard and so without a job server (--dashboard off)"
                in done.stdout), done.stdout
        state = json.loads((head / hd.STATE_FILE).read_text())
        assert state["dashboard"] is None and state["no_dashboard"] == "--dashboard off"
        status = jobs("head", "status", timeout=120)
        assert status.returncode == 0 and "no job server (--dashboard off)" in status.stdout
        done = jobs("pool", "start", "--name", "minimal", "--backend", "emulated",
                    "--warm", "1", timeout=240)
        assert done.returncode == 0, done.stdout + done.stderr
        done = jobs(*SMALL_CHECK, "--pool", "minimal", timeout=400)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        assert "6 pass, 0 fail, 0 hang, 0 error, 0 skipped" in done.stdout, done.stdout[-4000:]
        left = {state["pid"]: state["start"], **procs.descendants(state["pid"])}  # pool's too
        done = jobs("submit", "--", *SMALL_CHECK, timeout=120)
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"the head at {head} runs without the dashboard (--dashboard off)" in done.stderr
        done = jobs("pool", "stop", "--name", "minimal", timeout=240)
        assert done.returncode == 0 and "stopped" in done.stdout, done.stdout + done.stderr
        left.update(procs.descendants(state["pid"]))
    finally:
        stopped = jobs("head", "stop", timeout=120)
    assert stopped.returncode == 0 and "stopped the head" in stopped.stdout, stopped.stdout
    assert not (head / hd.STATE_FILE).exists()
    assert left and not [pid for pid, start in left.items() if procs.alive(pid, start)]
    status = jobs("head", "status", timeout=120)
    assert status.returncode == 1 and f"no head recorded in {head}" in status.stdout
