"""Process per GPU with peers: the rank actors keep every GPU visible (torch
symmetric memory tells peers apart by device index) and each rank finds its
own device index from Ray's GPU id; the jobs report a setup failure by its
root cause."""

import pytest

from cluster.backend import actor_env
from cluster.gpu import rank as gpu_rank
from cluster.errors import error_text


def test_only_process_per_gpu_groups_with_peers_see_every_gpu():
    assert actor_env("gpu", placement="process-per-gpu", tp=2) == {gpu_rank.ALL_GPUS_VISIBLE: "1"}
    assert actor_env("gpu", placement="process-per-gpu", tp=1) == {}
    assert actor_env("gpu", placement="shared-gpu", tp=4) == {}
    assert actor_env("emulated", placement="process-per-gpu", tp=4) == {}


@pytest.mark.parametrize("noset, visible, ray_ids, index", [
    (None, "3", ["3"], 0),            # Ray narrowed CUDA_VISIBLE_DEVICES: ours is cuda:0
    ("1", None, ["5"], 5),            # every GPU visible: Ray's id is the index
    ("1", "2,5,7", ["5"], 1),         # a node restricted to some GPUs: position in the list
])
def test_local_device_index(monkeypatch, noset, visible, ray_ids, index):
    import ray
    for name, value in ((gpu_rank.ALL_GPUS_VISIBLE, noset), ("CUDA_VISIBLE_DEVICES", visible)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    monkeypatch.setattr(ray, "get_gpu_ids", lambda: ray_ids)
    assert gpu_rank.local_device_index() == index


def test_local_device_index_refuses_what_it_cannot_map(monkeypatch):
    import ray
    monkeypatch.setenv(gpu_rank.ALL_GPUS_VISIBLE, "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setattr(ray, "get_gpu_ids", lambda: ["4"])
    with pytest.raises(RuntimeError, match="not among CUDA_VISIBLE_DEVICES"):
        gpu_rank.local_device_index()
    monkeypatch.setattr(ray, "get_gpu_ids", lambda: ["0", "1"])
    with pytest.raises(RuntimeError, match="exactly one GPU"):
        gpu_rank.local_device_index()


def test_error_text_is_the_root_cause_on_one_line():
    class Wrapped(Exception):
        def __init__(self, cause):
            super().__init__("ray::RankActor.setup_group() (pid=1)\nTraceback ...")
            self.cause = cause
    err = Wrapped(RuntimeError("rendezvous: detected allocations\nfrom overlapping devices"))
    assert error_text(err) == "RuntimeError: rendezvous: detected allocations from overlapping devices"
    assert len(error_text(ValueError("x" * 1000), limit=50)) == 50
