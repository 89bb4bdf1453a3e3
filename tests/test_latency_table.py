"""scripts/gpu/latency_table.py's per-rank table (CPU): the rows a TP group
timed, each rank's median and their spread."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu" / "latency_table.py"


def _module():
    spec = importlib.util.spec_from_file_location("latency_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(tp, tokens, impl, calls, medians, median, mode="one_shot"):
    return {"op": "all_reduce_norm", "tp": tp, "hidden": 7168, "tokens": tokens,
            "t_median_us": median,
            "extra": json.dumps({"impl": impl, "mode": mode, "calls_per_graph": calls,
                                 "rank_median_us": medians})}


def test_rank_table_shows_each_rank_and_the_spread():
    lines = _module().rank_table([
        _row(2, 64, "fused", 50, [8.57, 7.08], 8.57),
        _row(2, 1, "flashinfer_oneshot", 2195, [5.29, 5.30], 5.30),
        _row(2, 16, "fused", 220, [4.67, 4.37], 4.68, mode="owner"),
        _row(1, 1, "fused", 3072, [3.1], 3.1),            # tp=1: no spread to show
        _row(2, 8, "symm_mem", 50, [1.0, 2.0], None),     # not timed
    ])
    assert lines[2:] == [
        "| all_reduce_norm | 2 | 7168 | 1 | flashinfer_oneshot | 2195 | 5.29 / 5.30 | 0.01 | 5.30 |",
        "| all_reduce_norm | 2 | 7168 | 16 | fused (owner) | 220 | 4.67 / 4.37 | 0.30 | 4.68 |",
        "| all_reduce_norm | 2 | 7168 | 64 | fused | 50 | 8.57 / 7.08 | 1.49 | 8.57 |",
    ]


def test_profile_time_splits_case_wall_into_replays_build_and_rest():
    import datetime as dt
    spec = importlib.util.spec_from_file_location(
        "profile_time", SCRIPT.with_name("profile_time.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    t0 = dt.datetime(2026, 11, 30, 20, 0, tzinfo=dt.timezone.utc)

    def row(impl, median, calls, compile_s, end_s, start=t0, tokens=1):
        return {"job": "profile", "op": "all_reduce_norm", "tp": 1, "placement": "process-per-gpu",
                "hidden": 7168, "tokens": tokens, "started_at": start, "t_n": 200,
                "t_median_us": median, "finished_at": start + dt.timedelta(seconds=end_s),
                "extra": json.dumps({"impl": impl, "calls_per_graph": calls,
                                     "compile_s": compile_s})}
    later = t0 + dt.timedelta(seconds=30)
    table = module.case_times([
        row("fused", 3.0, 1000, 4.0, 10.0), row("unfused", 7.0, 1000, 1.0, 12.0),
        row("fused", 4.0, 50, 0.5, 3.0, start=later, tokens=64),
        {"job": "correctness", "t_n": None},
    ])
    (n, wall, timed, build), = table.values()
    assert n == 2 and wall == 15.0
    assert timed == pytest.approx((3.0 + 7.0) * 1e-6 * 200 * 1000 + 4.0 * 1e-6 * 200 * 50)
    assert build == 5.5


def test_case_time_sums_fault_kinds_and_correctness_cells():
    import datetime as dt
    spec = importlib.util.spec_from_file_location("case_time", SCRIPT.with_name("case_time.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    t0 = dt.datetime(2026, 11, 30, 20, 0, tzinfo=dt.timezone.utc)

    def row(job, s, outcome="pass", kind=None, **extra):
        return {"job": job, "op": "all_reduce_norm", "tp": 2, "placement": "shared-gpu",
                "outcome": outcome, "fault_kind": kind, "started_at": t0,
                "finished_at": t0 + dt.timedelta(seconds=s), "extra": json.dumps(extra)}
    rows = [row("faults", 3.0, kind="late_beyond_budget", rebuilt=False, prepare_s=2.5),
            row("faults", 0.5, kind="late_beyond_budget", rebuilt=False),
            row("faults", 11.0, kind="stuck_rank", rebuilt=True),
            row("faults", 0.0, outcome="skipped", kind="dirty_mailbox"),
            row("correctness", 0.25, phases_s={"inputs": 0.25, "check": 0.125}),
            row("correctness", 0.5, phases_s={"inputs": 0.5}), row("profile", 9.0)]
    faults, (n, total) = module.fault_table(rows)
    assert faults == [["late_beyond_budget", 2, 3.5, 3.0, 0, 1], ["stuck_rank", 1, 11.0, 11.0, 1, 0]]
    assert (n, total) == (2, 3.5)  # the rebuilding kind left out, the skipped row too
    # phases summed over the cell's rows, in cluster.phases.PHASES order, None where none recorded
    assert module.correctness_table(rows) == [["all_reduce_norm", 2, "shared-gpu", 2, 0.75,
                                               0.75, None, None, None, 0.125, None]]
    old = module.fault_table([{**r, "extra": "{}"} for r in rows])[0]  # rows before extra.rebuilt
    assert old[0][4:] == [None, None]


def test_case_time_spans_one_line_per_group_from_the_first_case():
    import datetime as dt
    spec = importlib.util.spec_from_file_location("case_time", SCRIPT.with_name("case_time.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    t0 = dt.datetime(2026, 12, 1, 3, 0, tzinfo=dt.timezone.utc)

    def row(start, end, group, mode, placement="shared-gpu", **extra):
        return {"job": "correctness", "op": "all_reduce_norm", "tp": 2, "hidden": 1024,
                "placement": placement, "outcome": "pass",
                "started_at": t0 + dt.timedelta(seconds=start),
                "finished_at": t0 + dt.timedelta(seconds=end),
                "extra": json.dumps({"group_id": group, "mode": mode, **extra} if group
                                    else {"mode": mode, **extra})}
    rows = [row(10.0, 12.0, "b", "owner"),
            row(2.0, 3.0, "a", "one_shot", group_build_s=6.5, group_lease_s=1.25),
            row(3.0, 4.5, "a", "owner", group_build_s=6.5, group_lease_s=1.25),
            row(12.0, 16.0, None, "one_shot", "virtual-ranks", task_start_s=1.5, imports_s=2.0),
            {"job": "profile", "outcome": "pass"}]
    assert module.group_spans(rows) == [
        [0.0, 2.5, "all_reduce_norm", "shared-gpu", 2, 1024, 2, "one_shot,owner", 6.5, 1.25],
        [8.0, 10.0, "all_reduce_norm", "shared-gpu", 2, 1024, 1, "owner", None, None],
        [10.0, 14.0, "all_reduce_norm", "virtual-ranks", 2, 1024, 1, "one_shot", 3.5, None]]
    # the timeline: well-formed SVG, a bar a group in its placement's colour,
    # a build bar where there is a build, a lease bar where there is a lease
    import xml.etree.ElementTree as ET
    svg = ET.fromstring(module.spans_svg(module.group_spans(rows), "t"))
    fills = [r.get("fill") for r in svg.iter("{http://www.w3.org/2000/svg}rect")]
    colours = module.PLACEMENT_COLOURS
    assert fills.count(colours["shared-gpu"]) == 2 + 1  # two bars, one legend swatch
    assert fills.count(colours["virtual-ranks"]) == 1 + 1
    assert fills.count("#c8c8c8") == 2 + 1 and fills.count("#8c8c8c") == 1 + 1
