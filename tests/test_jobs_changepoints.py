"""Change points in a case's nightly history (jobs/changepoints.py): the
method on synthetic series, and through ``python -m jobs regress`` against
a synthetic results store (no Ray)."""

import csv
import datetime as dt
import io
import json
import random

import pytest

from jobs import __main__ as cli
from jobs import changepoints as cp
from jobs.results import ResultsWriter, make_row

CASE = dict(op="all_reduce_norm", variant="watchdog", transport="unicast",
            placement="process-per-gpu", backend="gpu", tp=1, hidden=7168, dtype="bfloat16",
            gpu_model="NVIDIA H100 80GB HBM3")
KEY = "profile|all_reduce_norm|watchdog|unicast|process-per-gpu|1|7168|{m}|None|None|" \
      "bfloat16|random|None|None|"


def series(n, *, sd=0.005, seed=0, step_at=None, step=0.0, spike_at=None, spike=0.0):
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        v = 3.0 * (1 + rnd.gauss(0, sd))
        if step_at is not None and i >= step_at:
            v *= 1 + step
        if i == spike_at:
            v *= 1 + spike
        out.append(v)
    return out


@pytest.mark.parametrize("step", [0.10, -0.10, 0.05])
def test_a_step_is_found_where_it_is_with_its_size(step):
    seg = cp.segment(series(20, step_at=12, step=step))
    assert [s.index for s in seg.steps] == [12]
    (s,) = seg.steps
    assert s.confirmed and s.confidence > 0.9999
    assert s.change == pytest.approx(step, abs=0.01)
    assert [(g.start, g.end) for g in seg.segments] == [(0, 12), (12, 20)]


@pytest.mark.parametrize("spike", [0.10, -0.10])
@pytest.mark.parametrize("where", [6, 10, 18])
def test_a_one_night_jump_that_returns_is_not_a_step(spike, where):
    values = series(20, spike_at=where, spike=spike)
    assert cp.segment(values).steps == ()
    # judged night by night, as the nightly would, it never raises an alarm
    assert all(cp.status(values[:t + 1])[0] == "ok" for t in range(5, 20))


def test_the_step_is_flagged_on_its_confirm_th_night_not_before():
    values = series(15, step_at=12, step=0.05)
    assert cp.status(values[:12])[0] == "ok"
    assert cp.status(values[:13])[0] == "ok"       # one night at the new level: not yet
    status, step = cp.status(values[:14])          # two: confirmed (K = 2)
    assert status == "regressed" and step.index == 12
    three = cp.Method(confirm=3)
    assert cp.status(values[:14], three)[0] == "ok"
    assert cp.status(values[:15], three)[0] == "regressed"
    # a step long past (more than `history` nights) no longer flags the night
    long = series(40, step_at=12, step=0.05)
    assert cp.status(long)[0] == "ok" and cp.segment(long).steps[0].index == 12


def test_aa_histories_raise_no_alarm():
    alarms = nights = 0
    for seed in range(20):
        values = series(25, sd=0.01, seed=100 + seed)
        for t in range(5, 25):
            nights += 1
            alarms += cp.status(values[:t + 1])[0] != "ok"
    assert alarms <= 1, (alarms, nights)


def test_method_limits_are_checked():
    from jobs.config import ConfigError
    with pytest.raises(ConfigError, match="--confirm 0: must be in"):
        cp.Method(confirm=0).validate()
    with pytest.raises(ConfigError, match="--alpha 1.5"):
        cp.Method(alpha=1.5).validate()


# ---------------------------------------------------------------- the store
def _night(root, i, medians, commit):
    when = dt.datetime(2026, 11, 1, 2, 0, tzinfo=dt.timezone.utc) + dt.timedelta(days=i)
    writer = ResultsWriter(root, suite="nightly", trigger="nightly")
    writer.append([make_row(started_at=when, finished_at=when, outcome="pass", tokens=m,
                            t_n=200, t_median_us=v, job="profile", git_commit=commit,
                            extra={"case_key": KEY.format(m=m)}, **CASE)
                   for m, v in medians.items()])
    return writer.run_id


def _store(root, *, step_at=10, nights=14, spike_at=None):
    a = series(nights, seed=1, step_at=step_at, step=0.05)
    b = series(nights, seed=2, spike_at=spike_at, spike=0.10)
    return [_night(root, i, {1: a[i], 8: b[i]}, f"{i:02d}" + "c" * 38) for i in range(nights)]


def test_regress_segments_gives_the_commit_range_and_the_bisect_command(tmp_path, capsys):
    runs = _store(tmp_path, spike_at=7)
    assert cli.main(["regress", "--results", str(tmp_path), "--run", runs[-1],
                     "--segments", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    m1 = [r for r in rows if r["M"] == 1]
    assert [r["nights"] for r in m1] == [10, 4]
    assert m1[1]["step"] == pytest.approx(0.05, abs=0.01) and m1[1]["confidence"] > 0.999
    assert (m1[1]["good"], m1[1]["bad"]) == ("09" + "c" * 10, "10" + "c" * 10)
    assert m1[1]["bisect"] == (f"python -m jobs bisect --case '{KEY.format(m=1)}' --good "
                               f"09cccccccccc --bad 10cccccccccc --suite nightly --kind latency "
                               f"--results {tmp_path}")
    assert [r["nights"] for r in rows if r["M"] == 8] == [14]   # the spike is no segment


def test_regress_only_and_csv(tmp_path, capsys):
    runs = _store(tmp_path, step_at=12)
    assert cli.main(["regress", "--results", str(tmp_path), "--run", runs[-1],
                     "--only", "regressed", "--format", "csv"]) == 0  # reported, not failing
    captured = capsys.readouterr()
    rows = list(csv.DictReader(io.StringIO(captured.out)))
    assert [(r["M"], r["status"], r["cp_status"]) for r in rows] == [("1", "ok", "regressed")]
    assert "regression check" in captured.err
    assert cli.main(["regress", "--results", str(tmp_path), "--run", runs[-1],
                     "--only", "improved", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == []


@pytest.mark.parametrize("argv, said", [
    (["--only", "regresed"], "--only 'regresed': each of a comma-separated list of"),
    (["--confirm", "0"], "argument --confirm: '0': must be in [1, 1_000]"),
    (["--format", "xml"], "invalid choice: 'xml'"),
])
def test_bad_flags_are_one_line_and_exit_2(tmp_path, capsys, argv, said):
    runs = _store(tmp_path, nights=3)
    assert cli.main(["regress", "--results", str(tmp_path), "--run", runs[-1], *argv]) == 2
    assert said in capsys.readouterr().err


def test_the_nightly_regression_part_reports_a_step_the_lookback_misses(tmp_path, capsys):
    """A step only change points see is listed with its re-measure command
    but does not fail the night (they report until their false-alarm rate on
    GPU noise is on record)."""
    import types
    from jobs.regression import Rule
    runs = _store(tmp_path, step_at=11, nights=14)   # three nights in: the lookback says ok
    run = types.SimpleNamespace(results=tmp_path, run_id=runs[-1], backend="gpu")
    assert cli._regression_part(run, Rule(), None) == 0
    out = capsys.readouterr().out
    assert "regression: {'ok': 2}; change points: {'regressed': 1, 'ok': 1}; 0 kernel case(s) " \
           "regressed" in out, out
    assert "[step, reported only] all_reduce_norm tp=1 hidden=7168 M=1" in out, out


def test_whether_ruptures_is_there_is_looked_up_not_imported(monkeypatch):
    """Every nightly asks (its regression part); the import costs seconds
    of CPU and is paid only where a series is long enough to split."""
    import importlib.util
    import sys

    monkeypatch.delitem(sys.modules, "ruptures", raising=False)
    assert cp.missing() is None and "ruptures" not in sys.modules
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ruptures" else real(name, *a))
    assert cp.missing() == "ruptures is not installed; pip install 'ruptures>=1.1.10'"
