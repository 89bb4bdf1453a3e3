"""The planted slowdown (jobs/plant.py): refused anywhere but the
detection-power script's use (one line, exit 2, before Ray, nothing
written); calibrated from the A/A nights; carried by the timing spec to the
kernel builder only for all_reduce_norm's own process. No GPU: the kernel
itself is checked by scripts/ptx_diff.py (docs/results/planted_slowdown_cpu_2026-12-07.md)."""

import argparse
import dataclasses
import datetime as dt

import pytest

from jobs import plant
from jobs.__main__ import build_parser, main
from jobs.config import ConfigError, Filters, load_suite, select, suite_path
from jobs.results import ResultsWriter, make_row

PROFILE = ["profile", "--suite", "nightly", "--ops", "all_reduce_norm", "--tp", "1"]
CASES = [(h, m) for h in (5120, 7168) for m in (1, 8, 16, 64)]


def aa_results(root, nights: int, *, base: float = 2.0, clock: int | None = 1980):
    """``nights`` nightly A/A runs of the 8 tp=1 cases (every night the same
    median, ``base`` us)."""
    start = dt.datetime(2026, 12, 1, 2, 0, tzinfo=dt.timezone.utc)
    for night in range(nights):
        w = ResultsWriter(root, suite="nightly", trigger="nightly")
        w.append([make_row(started_at=start + dt.timedelta(days=night), outcome="pass",
                           job="profile", op="all_reduce_norm", variant="watchdog",
                           transport="unicast", placement="process-per-gpu", backend="gpu",
                           dtype="bfloat16", gpu_model="NVIDIA H100 80GB HBM3", tp=1,
                           hidden=h, tokens=m, t_median_us=base + night * 0.01,
                           sm_clock_mhz_after=clock)
                  for h, m in CASES])
    return root


@pytest.mark.parametrize("argv, said", [
    (["nightly", "--plant-slowdown", "3"], "only `jobs profile` plants a slowdown"),
    (["smoke", "--plant-slowdown", "3"], "`jobs smoke` never does"),
    (["correctness", "--plant-slowdown", "3"], "`jobs correctness` never does"),
    ([*PROFILE, "--plant-slowdown", "3", "--trigger", "nightly"], "needs --trigger adhoc"),
    ([*PROFILE, "--plant-slowdown", "3", "--trigger", "ci"], "needs --trigger adhoc"),
    ([*PROFILE, "--plant-slowdown", "0"], "--plant-slowdown '0': a percentage in (0, 50]"),
    ([*PROFILE, "--plant-slowdown", "50.5"], "a percentage in (0, 50]"),
    ([*PROFILE, "--plant-slowdown", "nan"], "a percentage in (0, 50]"),
    ([*PROFILE, "--plant-slowdown", "3", "--no-results"], "drop --no-results"),
    (["profile", "--suite", "nightly", "--ops", "indexer", "--tp", "1", "--plant-slowdown", "3"],
     "only all_reduce_norm at tp 1"),
    (["profile", "--suite", "nightly", "--ops", "all_reduce_norm", "--tp", "2",
      "--plant-slowdown", "3"], "only all_reduce_norm at tp 1"),
    ([*PROFILE, "--plant-slowdown", "3"], "0 A/A night(s) in --results"),
])
def test_refused_outside_the_scripts_use(argv, said, tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    assert main([*argv, "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--plant-slowdown" in err and said in err, err
    assert not any(results.iterdir())  # nothing written


def test_too_few_aa_nights_or_no_clock(tmp_path, capsys):
    aa_results(tmp_path / "four", 4)
    assert main([*PROFILE, "--plant-slowdown", "3", "--results", str(tmp_path / "four")]) == 2
    assert "4 A/A night(s)" in capsys.readouterr().err
    aa_results(tmp_path / "noclock", 5, clock=None)
    assert main([*PROFILE, "--plant-slowdown", "3", "--results", str(tmp_path / "noclock")]) == 2
    assert "record no SM clock" in capsys.readouterr().err


def test_hidden_from_help():
    assert "plant" not in build_parser(only="profile").format_help()


def plan_of(argv):
    args = build_parser(only="profile").parse_args(argv)
    suite = load_suite(suite_path("nightly"))
    filters = Filters(**{name: getattr(args, name) for name in Filters.FIELDS})
    return args, [(suite, select(suite, ("profile",), filters))]


def test_calibrated_from_the_aa_median(tmp_path):
    root = aa_results(tmp_path / "aa", 7)  # medians 2.00 .. 2.06 us: the median 2.03
    args, plan = plan_of([*PROFILE, "--plant-slowdown", "3", "--results", str(root)])
    plants = plant.calibrate(args, plan)
    assert len(plants) == 8 and set(plants) == {plant.key(c) for c in plan[0][1]}
    # the sweep makes each `auto` placement concrete after the calibration
    # (ClusterView.concretize): the plant is still found for it (on 2026-12-07's
    # first GPU run it was keyed by case.key(), which holds the placement, and
    # no planted night was slowed)
    for c in plan[0][1]:
        concrete = dataclasses.replace(c, placement="process-per-gpu")
        assert concrete.key() != c.key() and plant.key(concrete) in plants
    p = next(iter(plants.values()))
    assert p.aa_median_us == pytest.approx(2.03) and p.aa_nights == 7
    assert p.delay_ns == pytest.approx(0.03 * 2.03 * 1000)
    assert p.delay_cycles == round(0.03 * 2030 * 1.98)  # ns x GHz
    extra = p.extra()
    assert extra["planted_pct"] == 3.0 and extra["plant_delay_cycles"] == p.delay_cycles
    assert "PLANTED SLOWDOWN +3 %" in plant.describe(plants)
    # the nights a planted run writes (trigger adhoc) never calibrate the next one
    w = ResultsWriter(root, suite="nightly", trigger="adhoc")
    w.append([make_row(started_at=dt.datetime(2026, 12, 9, tzinfo=dt.timezone.utc),
                       outcome="pass", job="profile", op="all_reduce_norm", variant="watchdog",
                       transport="unicast", placement="process-per-gpu", backend="gpu",
                       dtype="bfloat16", gpu_model="NVIDIA H100 80GB HBM3", tp=1, hidden=h,
                       tokens=m, t_median_us=9.0, extra=extra) for h, m in CASES])
    assert plant.calibrate(args, plan) == plants
    assert plant.calibrate(argparse.Namespace(plant_slowdown=None), plan) == {}


def test_the_timing_spec_carries_it_to_the_builder(monkeypatch):
    import types

    from cluster import ops
    from cluster.measure.workload import Spec
    from cluster.measure.workloads import common
    from cluster.ops import all_reduce_norm as arn
    from jobs.profile import timing_spec
    _, plan = plan_of(PROFILE)
    case = plan[0][1][0]
    p = plant.Plant(pct=5.0, aa_median_us=2.0, aa_nights=5, sm_clock_mhz=1980.0,
                    delay_ns=100.0, delay_cycles=198)
    assert "plant_delay_cycles" not in timing_spec(case)
    spec = Spec.of(timing_spec(case, p))
    assert spec.plant_delay_cycles == 198 and Spec.of(timing_spec(case)).plant_delay_cycles == 0
    # the workload's one builder call hands it to the kernel's constructor
    # (outside the op's typed params, which a test-only knob is not)
    built = {}
    monkeypatch.setattr(arn, "lamport", lambda cls, **kw: built.update(kw) or "kernel")
    ctx = types.SimpleNamespace(capacity=64, mailbox=None, device=None)
    assert common.host_kernel(ctx, spec) == "kernel" and built["plant_delay_cycles"] == 198
    built.clear()
    common.host_kernel(ctx, Spec.of(timing_spec(case)))
    assert built and "plant_delay_cycles" not in built
    with pytest.raises(ValueError, match="only for all_reduce_norm"):
        Spec.of({**timing_spec(case, p), "op": "indexer"})
    with pytest.raises(ValueError, match="virtual ranks run the two-kernel form"):
        arn.kernel(ops.get("all_reduce_norm").make_params({}), eps=1e-6, plant_delay_cycles=198,
                   tp=2, hidden=7168, capacity=8, budget_ns=0)
    with pytest.raises(ConfigError):
        plant.pct("-1")
