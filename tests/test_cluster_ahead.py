"""cluster.ahead: the next planned call's host work on a helper thread, and
the rank actor's batch telling its backend each call ahead (cluster.actors)."""

from __future__ import annotations

import threading

import pytest

from cluster.ahead import Ahead


def test_a_planned_case_is_made_on_the_helper_thread_while_the_caller_goes_on():
    caller_went_on = threading.Event()
    made_on = []

    def make(case):
        made_on.append(threading.get_ident())
        # plan() must return before this runs to the end: the caller sets the event
        return {"seed": case["seed"], "overlapped": caller_went_on.wait(timeout=30)}

    ahead = Ahead(make)
    ahead.plan({"seed": 1})
    caller_went_on.set()
    assert ahead.take({"seed": 1}) == {"seed": 1, "overlapped": True}
    assert made_on and made_on[0] != threading.get_ident()
    ahead.close()


def test_take_returns_none_for_an_unplanned_case_and_drops_the_ones_it_skips():
    calls = []
    ahead = Ahead(lambda case: calls.append(case["seed"]) or case["seed"] * 10)
    ahead.plan({"seed": 1})
    ahead.plan({"seed": 1})  # equal: made once
    ahead.plan({"seed": 2})
    assert ahead.take({"seed": 3}) is None
    assert ahead.take({"seed": 2}) == 20
    assert ahead.take({"seed": 1}) is None  # skipped over by the take of seed 2: dropped
    ahead.idle()
    assert calls == [1, 2]
    ahead.close()


def test_a_plan_may_name_its_own_work():
    ahead = Ahead()
    ahead.plan({"seed": 4}, lambda case: ("other", case["seed"]))
    assert ahead.take({"seed": 4}) == ("other", 4)
    ahead.close()


def test_the_work_s_exception_is_raised_by_take():
    def make(case):
        raise ValueError(f"seed {case['seed']} is bad")

    ahead = Ahead(make)
    ahead.plan({"seed": 5})
    with pytest.raises(ValueError, match="seed 5 is bad"):
        ahead.take({"seed": 5})
    ahead.close()


def test_close_ends_the_helper_thread():
    ahead = Ahead(lambda case: case)
    ahead.plan({"seed": 1})
    assert any(t.name.startswith("ahead") for t in threading.enumerate())
    ahead.close()
    ahead.close()  # idempotent
    assert not any(t.name.startswith("ahead") for t in threading.enumerate())
    assert ahead.take({"seed": 1}) is None


class _Backend:
    """Records the order of plan() and run_case() calls of a batch."""

    def __init__(self, dirty_at: int | None = None) -> None:
        self.events: list[tuple[str, int]] = []
        self.dirty_at = dirty_at

    def plan(self, case) -> None:
        self.events.append(("plan", case.seq))

    def run_case(self, case) -> dict:
        self.events.append(("run", case.seq))
        return {"rank": 0, "outputs": {}, "mailbox_clean": case.seq != self.dirty_at,
                "check": {"ok": True}}


def _batch(*seqs):
    from cluster.cases import make_case
    return [make_case(capacity=1, tokens=1).replace(seq=s) for s in seqs]


def _actor(backend):
    ray = pytest.importorskip("ray")
    from cluster.actors import RankActor

    cls = RankActor.__ray_metadata__.modified_class
    actor = cls.__new__(cls)
    actor._backend, actor._tracer, actor._shape = backend, None, {"tp": 1, "hidden": 8}
    assert ray is not None
    return actor


def test_the_rank_actor_tells_its_backend_each_call_before_running_the_one_ahead_of_it():
    backend = _Backend()
    results = list(_actor(backend).run_cases(_batch(1, 2, 3)))
    assert len(results) == 3
    runs = [i for i, (what, _) in enumerate(backend.events) if what == "run"]
    for n, at in enumerate(runs):
        planned = {seq for what, seq in backend.events[:at] if what == "plan"}
        assert {s for s in (1, 2, 3) if s <= n + 2} <= planned, backend.events


def test_a_batch_that_stops_early_runs_nothing_it_planned_beyond():
    backend = _Backend(dirty_at=2)
    results = list(_actor(backend).run_cases(_batch(1, 2, 3)))
    assert len(results) == 2
    assert [seq for what, seq in backend.events if what == "run"] == [1, 2]
