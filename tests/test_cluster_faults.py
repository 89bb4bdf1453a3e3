"""cluster.faults.run_fault without a cluster: what it asks of the group."""

import pytest

from cluster.faults import run_fault


class _Recorded(Exception):
    pass


class _RecordingGroup:
    """Stands in for a TPGroup: records the cases run_fault builds and stops
    after the clean follow-up call is asked for."""

    tp, call_timeout_s = 2, 3.0

    def __init__(self):
        self.cases, self.faults = [], []

    def case(self, **fields):
        return fields

    def run(self, case, faults=None):
        self.cases.append(case)
        self.faults.append(faults)
        if len(self.cases) == 2:
            raise _Recorded
        return None


def test_clean_call_after_a_fault_gets_half_the_host_deadline():
    """The follow-up checks recovery; a loaded host must not make it time out
    at the (short) budget the fault itself was measured against."""
    g = _RecordingGroup()
    with pytest.raises(_Recorded):
        run_fault(g, "skip_publish", rank=1, budget_ns=200_000_000)
    faulty, clean = g.cases
    assert faulty["budget_ns"] == 200_000_000 and g.faults[0] == {1: {"kind": "skip_publish"}}
    assert clean["budget_ns"] == 1_500_000_000 and g.faults[1] is None
    assert clean["seed"] == faulty["seed"] + 1


def test_clean_call_keeps_a_budget_already_longer():
    g = _RecordingGroup()
    with pytest.raises(_Recorded):
        run_fault(g, "skip_publish", rank=0, budget_ns=2_000_000_000)
    assert [c["budget_ns"] for c in g.cases] == [2_000_000_000, 2_000_000_000]
