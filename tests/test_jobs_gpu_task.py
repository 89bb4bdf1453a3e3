"""jobs.session.gpu_task, the one way a job runs work on one GPU (the profile
measurement, a virtual-ranks group): result, hang past the deadline (the
task's process is ended), wrong answer, error. On a CPU-only machine the
local Ray cluster declares one logical GPU; nothing touches CUDA."""

import sys
import time

import pytest

ray = pytest.importorskip("ray")

from jobs.session import gpu_task  # noqa: E402
from tests.ray_local import local_ray_cluster  # noqa: E402

pytestmark = pytest.mark.xdist_group("ray")  # starts Ray clusters: one at a time (conftest)


def echo(spec):
    return {"got": spec, "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}


def sleeps(spec):
    time.sleep(spec["s"])


def wrong(spec):
    assert spec["x"] == 1, "outputs outside the contract"


def broken(spec):
    raise ValueError(f"bad spec {spec}")


@pytest.fixture(scope="module")
def one_gpu():
    with local_ray_cluster(num_cpus=2, num_gpus=1):
        # the workers cannot import this test module by name: ship its functions
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        yield


def test_result_hang_fail_and_error(one_gpu):
    out, failed = gpu_task(echo, {"a": 1}, 60)
    assert failed is None and out["got"] == {"a": 1} and len(out["gpu_ids"]) == 1
    t0 = time.monotonic()
    out, failed = gpu_task(sleeps, {"s": 60}, 2)
    assert out is None and failed[0] == "hang" and time.monotonic() - t0 < 30
    kind, why = gpu_task(wrong, {"x": 2}, 60)[1]
    assert kind == "fail" and why.startswith("AssertionError: outputs outside the contract")
    kind, why = gpu_task(broken, {"x": 3}, 60)[1]
    assert kind == "error" and why == "ValueError: bad spec {'x': 3}"
    # the hung task's process was ended: its GPU is free for the next task
    assert gpu_task(echo, {}, 60)[1] is None
