"""Detection power (jobs/power.py) on CPU: a synthetic noisy nightly history
in a results store stands for the GPU's recorded nights (fixed seeds)."""

import datetime as dt
import json
import random

import pytest

from jobs import power
from jobs.results import ResultsWriter, make_row

CASE = dict(op="all_reduce_norm", variant="watchdog", transport="unicast",
            placement="process-per-gpu", backend="gpu", hidden=7168, dtype="bfloat16",
            gpu_model="NVIDIA H100 80GB HBM3", job="profile")


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """10 A/A nights of 4 cases, 0.5 % noise (the issue's H100: 0.25-1 %)."""
    root = tmp_path_factory.mktemp("aa")
    rnd = random.Random(3)
    start = dt.datetime(2026, 12, 1, 2, 0, tzinfo=dt.timezone.utc)
    for night in range(10):
        when = start + dt.timedelta(days=night)
        w = ResultsWriter(root, suite="nightly", trigger="nightly")
        w.append([make_row(started_at=when, outcome="pass", tp=tp, tokens=m,
                           t_median_us=base * (1 + rnd.gauss(0, 0.005)), **CASE)
                  for tp, m, base in ((1, 1, 2.2), (1, 8, 2.6), (2, 1, 3.1), (2, 8, 3.9))])
    return root


def test_power_on_injected_noise_and_aa(history):
    report = power.analyse(history, trials=24, steps=(0.03, 0.10), seed=1)
    assert report["cases"] == 4 and report["nights"] == 10
    assert 0.002 < report["noise_median"] < 0.01
    inj = report["injected"]
    cpm, look = inj["power"][0.10]["change points"], inj["power"][0.10]["lookback"]
    assert cpm[0] == 0.0 and cpm[1] == 1.0 and cpm[2] == 1.0   # K = 2: on the 2nd night
    assert look[0] == 1.0                                      # the lookback: the 1st
    assert inj["power"][0.03]["change points"][2] >= 0.8
    assert inj["power"][0.03]["lookback"] == [0.0, 0.0, 0.0]   # under its 5 % floor
    # a one-night +-10 % jump: the lookback flags it, change points never
    assert inj["spikes"]["change points"] == 0.0 and inj["spikes"]["lookback"] == 1.0
    aa = inj["aa"]["change points"]
    assert aa["regressed"] == 0 and aa["nights"] == 24 * (10 + power.AA_NIGHTS - 5)
    assert power.upper_per_1k(aa, "regressed") == pytest.approx(1000 * 2.9957 / aa["nights"],
                                                                rel=1e-3)
    rec = report["recorded_aa"]["change points"]
    assert rec["nights"] == 4 * 5 and rec["any"] == 0
    met = dict(power.targets(report))
    assert any(text.startswith("a one-night") for text in met)


def test_filters_cli_and_formats(history, capsys):
    assert power.main(["--results", str(history), "--tp", "2", "--trials", "6",
                       "--steps", "0.05", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cases"] == 2 and list(report["injected"]["power"]) == ["0.05"]
    assert power.main(["--results", str(history), "--trials", "4", "--steps", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "recorded A/A" in out and "injected on recorded noise (4 trials)" in out
    assert "targets (issue 66)" in out
    assert power.main(["--results", str(history), "--steps", "x"]) == 2
    assert "--steps 'x'" in capsys.readouterr().err
    assert power.main(["--results", str(history), "--ops", "indexer"]) == 1
    assert power.main(["--results", str(history), "--confirm", "0"]) == 2
    assert "--confirm 0: must be in [1, 1_000]" in capsys.readouterr().err
    assert power.main(["--results", str(history), "--trials", "3", "--steps", "0.1",
                       "--confirm", "3", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "confirmed by 3 consecutive nights" in report["rules"]["change points"]
    assert report["injected"]["power"]["0.1"]["change points"][:2] == [0.0, 0.0]


PLANTED = (1.0, 3.0, 5.0, 10.0)


@pytest.fixture(scope="module")
def planted_history(tmp_path_factory):
    """10 A/A nights of 4 tp=1 cases (0.3 % noise), then as the script
    records them: 3 planted nights at each of +1, +3, +5, +10 % (trigger
    adhoc, every row marked extra.planted_pct), the +3 % one on 2 nights only
    for one case (a night cut short)."""
    root = tmp_path_factory.mktemp("planted")
    rnd = random.Random(5)
    start = dt.datetime(2026, 12, 1, 2, 0, tzinfo=dt.timezone.utc)
    cases = ((5120, 1, 1.8), (5120, 8, 2.0), (7168, 1, 2.2), (7168, 8, 2.6))
    n = 0
    for night in range(10):
        w = ResultsWriter(root, suite="nightly", trigger="nightly")
        w.append([make_row(started_at=start + dt.timedelta(hours=n), outcome="pass", tp=1,
                           tokens=m, t_median_us=base * (1 + rnd.gauss(0, 0.003)),
                           sm_clock_mhz_after=1980, **{**CASE, "hidden": h})
                  for h, m, base in cases])
        n += 1
    for pct in PLANTED:
        for night in range(3):
            w = ResultsWriter(root, suite="nightly", trigger="adhoc")
            w.append([make_row(started_at=start + dt.timedelta(hours=n), outcome="pass", tp=1,
                               tokens=m, t_median_us=base * (1 + pct / 100)
                               * (1 + rnd.gauss(0, 0.003)),
                               extra={"planted_pct": pct, "plant_delay_ns": pct * base * 10},
                               **{**CASE, "hidden": h})
                      for h, m, base in cases if not (pct == 3.0 and night == 2 and m == 8
                                                      and h == 7168)])
            n += 1
    return root


def test_planted_on_the_gpu_report(planted_history, capsys):
    report = power.analyse(planted_history, trials=4, steps=(0.05,), seed=1)
    # the planted nights are no nightly history: 10 A/A nights a case, no alarm
    assert report["nights"] == 10 and report["cases"] == 4
    assert report["recorded_aa"]["change points"]["any"] == 0
    got = report["planted"]
    assert list(got) == list(PLANTED)
    for pct in PLANTED:
        assert got[pct]["cases"] == 4
        assert got[pct]["measured_median"] == pytest.approx(pct / 100, abs=0.004)
        assert got[pct]["measured_min"] <= got[pct]["measured_median"] <= got[pct]["measured_max"]
    # +10 %: the lookback on the first planted night, change points (K = 2) on the 2nd
    assert got[10.0]["power"]["lookback"] == [1.0, 1.0, 1.0]
    assert got[10.0]["power"]["change points"] == [0.0, 1.0, 1.0]
    # +1 %: under every threshold; +3 %: under the lookback's 5 % floor
    assert got[1.0]["power"]["change points"] == [0.0, 0.0, 0.0]
    assert got[3.0]["power"]["lookback"] == [0.0, 0.0, 0.0]
    # within 3 nights is judged over the 3 cases that have a 3rd +3 % night
    assert sum(c["nights"] == 3 for c in got[3.0]["per_case"]) == 3
    first = [c["first"]["change points"] for c in got[3.0]["per_case"]]
    assert got[3.0]["power"]["change points"][1] == sum(f == 2 for f in first) / 4
    met = [text for text, _ in power.targets(report) if text.startswith("planted")]
    assert len(met) == 2 and "over 4 cases" in met[0]
    power.show(report, "md")
    out = capsys.readouterr().out
    assert "planted on the GPU" in out and "| +10% | 4 |" in out
