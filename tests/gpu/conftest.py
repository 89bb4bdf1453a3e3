"""GPU tests: streams of virtual ranks need more hardware queues than the
default 8; this must be set before CUDA creates its context. ``cluster``:
a local Ray cluster for the tests that drive rank actors (one per module)."""

import os

import pytest

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()
