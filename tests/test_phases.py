"""cluster.phases: a call's host time by phase, the slowest rank's, summed."""

import pytest

from cluster import phases


def test_a_clock_times_consecutive_phases_and_refuses_an_unknown_one():
    clock = phases.PhaseClock()
    clock.mark("inputs")
    sum(range(200_000))
    clock.mark("check")
    clock.mark("inputs")  # a phase met twice adds up
    assert list(clock.ns) == ["inputs", "check"]
    assert clock.ns["check"] > 0 and all(v >= 0 for v in clock.ns.values())
    with pytest.raises(ValueError, match=r"phase must be one of .*got 'compile'"):
        clock.mark("compile")


def test_a_call_takes_the_slowest_rank_of_each_phase_and_totals_grow():
    call = phases.slowest([{"inputs": 2_000_000, "check": 5_000_000},
                           None, {"inputs": 3_000_000, "call": 1_000_000}])
    assert call == {"inputs": 0.003, "check": 0.005, "call": 0.001}
    total = phases.add({}, call)
    before = dict(total)
    phases.add(total, {"check": 0.5})
    assert phases.since(before, total) == pytest.approx({"check": 0.5})
    assert list(phases.rounded(total)) == ["inputs", "call", "check"]  # PHASES order
    assert phases.describe({"check": 0.505, "inputs": 0.003}) == "inputs 0.0 s, check 0.5 s"
