"""The frozen heap: cluster.procs.settle_heap (a pooled worker's imports and
kernels, skipped by later collections) and jobs.embedded.shutdown_ray (Ray's
shutdown with the heap frozen, thawed after)."""

from __future__ import annotations

import gc
import weakref

import pytest

from cluster.procs import settle_heap


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


@pytest.fixture(autouse=True)
def _thawed():
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_settle_heap_collects_garbage_first_and_freezes_only_what_is_live():
    garbage = _Node()
    dead = weakref.ref(garbage)
    live = _Node()
    del garbage
    frozen = settle_heap()
    assert dead() is None, "garbage was frozen instead of collected"
    # Frozen objects are still freed when their count falls to zero, by any
    # thread (the xdist worker's own): the count can only have fallen since.
    assert 0 < gc.get_freeze_count() <= frozen
    assert not gc.is_tracked(live) or live.me is live  # still there, now frozen
    # what is made after the freeze is still collected
    later = _Node()
    gone = weakref.ref(later)
    del later
    gc.collect()
    assert gone() is None
    # and a full collection no longer walks the frozen objects
    assert len(gc.get_objects()) < frozen


def test_shutdown_ray_freezes_the_heap_for_the_shutdown_and_thaws_it_after(monkeypatch):
    import ray
    seen = []
    monkeypatch.setattr(ray, "shutdown", lambda: seen.append(gc.get_freeze_count()))
    from jobs.embedded import shutdown_ray
    shutdown_ray()
    assert seen and seen[0] > 0 and gc.get_freeze_count() == 0

    def fails():
        raise RuntimeError("shutdown failed")
    monkeypatch.setattr(ray, "shutdown", fails)
    with pytest.raises(RuntimeError, match="shutdown failed"):
        shutdown_ray()
    assert gc.get_freeze_count() == 0
