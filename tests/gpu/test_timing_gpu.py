"""The measurement harness (cluster.measure) on GPUs: the profile job's
timed call on the ranks of a group (``GpuRank.time_case``).

- One GPU, no Ray: a :class:`~cluster.gpu.GpuRank` set up as the only rank
  of a process-per-GPU group (NCCL + torch symmetric memory, world size 1)
  times every collective op's workload (all_reduce_norm, finalize_publish,
  embed_norm, all_reduce_mhc) with the NCCL and symmetric-memory baselines
  captured in CUDA graphs, the same code path each rank of a multi-GPU
  group runs (barrier before every replay included); FlashInfer is a skip
  there (it needs a TP group of >= 2).
- Several GPUs (``multigpu``, Ray): a tp=2 process-per-GPU group, every rank
  timing at once, FlashInfer one-shot and two-shot timed where it is
  importable (else skipped with that reason).

Run under a process timeout:
    timeout 900 python -m pytest -m gpu -v -s tests/gpu/test_timing_gpu.py
Medians printed here are sanity output, not results (the profile job and
the benchmarks record those).
"""

from __future__ import annotations

import socket

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

HIDDEN, CAPACITY, TOKENS, REPLAYS = 5120, 16, 8, 30
OPS = ("all_reduce_norm", "finalize_publish", "embed_norm", "all_reduce_mhc")


def spec(op: str) -> dict:
    return {"op": op, "hidden": HIDDEN, "tokens": TOKENS, "hc": 4 if op == "all_reduce_mhc" else None,
            "top_k": 8 if op == "finalize_publish" else None,
            "calls": 20, "replays": REPLAYS, "rotate_mb": 16, "eps": 1e-6,
            "budget_ns": 1_000_000_000, "seed": TOKENS,
            "baselines": ["unfused", "symm_mem", "flashinfer"]}


def flashinfer_importable() -> bool:
    try:
        import flashinfer.comm  # noqa: F401
        return True
    except ImportError:
        return False


def check_timings(per_rank: list[dict], tp: int, op: str, label: str) -> None:
    assert [r["rank"] for r in per_rank] == list(range(tp))
    fi_timed = op == "all_reduce_norm" and tp > 1 and flashinfer_importable()
    timed = ["fused", "unfused", "symm_mem"] + (
        ["flashinfer_oneshot", "flashinfer_twoshot"] if fi_timed else [])  # M=8 > tp=2
    for r in per_rank:
        impls = r["impls"]
        if op != "all_reduce_norm":
            assert "has no flashinfer baseline" in impls["flashinfer"]["skipped"]
        elif tp == 1:
            for mode in ("oneshot", "twoshot"):
                assert "skipped" in impls[f"flashinfer_{mode}"]
        elif fi_timed:
            extra = impls["flashinfer_oneshot"]["extra"]
            assert extra["mode"] == "oneshot" and extra["contract_diff"]["elements"] > 0
        else:
            assert impls["flashinfer_oneshot"]["skipped"].startswith(
                "flashinfer is not importable here")
        for name in timed:
            times = impls[name]["times_us"]
            assert len(times) == REPLAYS and all(0.5 < t < 1000 for t in times), (name, times)
            assert impls[name]["compile_s"] > 0
        assert r["bytes_moved"] == TOKENS * HIDDEN * 2 and r["sets"] >= 2
    print(f"\n{label} medians (us):",
          {n: [round(float(np.median(r["impls"][n]["times_us"])), 2) for r in per_rank]
           for n in timed})


@pytest.fixture(scope="module")
def lone_rank():
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from cluster.gpu import GpuRank
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rank = GpuRank()
    rank.setup(group_id="timing", rank=0, tp=1, capacity=CAPACITY, hidden=HIDDEN, timeout_s=120,
               options={"master_addr": "127.0.0.1", "master_port": port,
                        "placement": "process-per-gpu"})
    yield rank
    rank.close()


@pytest.mark.parametrize("op", OPS)
def test_time_case_as_the_only_rank_of_a_process_per_gpu_group(lone_rank, op):
    check_timings([lone_rank.time_case(spec(op))], 1, op,
                  f"{op} tp=1 (process-per-GPU group of one)")
    state = lone_rank.state()
    assert state["check"]["non_sentinel"] == 0, state  # the timed graphs left the mailbox clean


def test_time_case_refuses_bad_specs(lone_rank):
    with pytest.raises(ValueError, match=r"unknown op 'nonesuch'; known: \["):
        lone_rank.time_case({**spec("all_reduce_norm"), "op": "nonesuch"})
    with pytest.raises(ValueError, match=r"tokens must be in 1..capacity=16, got 17"):
        lone_rank.time_case({**spec("all_reduce_norm"), "tokens": 17})


@pytest.mark.multigpu
@pytest.mark.parametrize("op", OPS)
def test_process_per_gpu_group_times_every_rank_at_once(op):
    import torch
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    ray = pytest.importorskip("ray")
    from cluster.group import TPGroup
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", include_dashboard=False, log_to_driver=False)
    try:
        with TPGroup(tp=2, hidden=HIDDEN, capacity=CAPACITY, backend="gpu", gpus_per_rank=1,
                     call_timeout_s=10.0, setup_timeout_s=120) as g:
            per_rank = g.time(spec(op), timeout_s=600)  # FlashInfer JIT-builds its module first (minutes)
        check_timings(per_rank, 2, op, f"{op} tp=2 process per GPU")
    finally:
        if started:
            ray.shutdown()


def test_a_replay_floor_makes_replays_last_that_long():
    """cluster.measure.graph.fit_calls on one GPU: a graph of short calls is
    lengthened until one replay lasts at least the floor."""
    import torch

    from cluster.measure.graph import fit_calls, rotating, time_graph

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; none is present")
    buf = torch.zeros(1024, device="cuda")
    fn = rotating(lambda i: buf.add_(1.0), 4)
    # 500 us: within MAX_FLOOR_FACTOR x 8 calls of a ~0.85 us add (800 calls,
    # ~680 us on an H200; a 2 ms floor is out of the cap's reach)
    calls = fit_calls(fn, 8, 4, 500.0, agree=lambda us: us)
    assert calls > 8 and calls % 4 == 0
    per_call = float(np.median(time_graph(fn, calls, 5)))
    assert per_call * calls >= 0.5 * 500.0, (calls, per_call)  # a mechanism check, loose


def test_workload_inputs_are_drawn_on_the_gpu_reproducibly():
    """The rotation sets are drawn on the device (not made on the host and
    copied), from a generator seeded by the CPU generator: the same seed
    gives the same tensor (what ranks sharing a generator rely on)."""
    import torch

    from cluster.measure.workloads.common import randn
    dev = torch.device("cuda", 0)
    a = randn((64, 7168), torch.Generator().manual_seed(5), dev, scale=0.1, offset=1.0)
    b = randn((64, 7168), torch.Generator().manual_seed(5), dev, scale=0.1, offset=1.0)
    c = randn((64, 7168), torch.Generator().manual_seed(6), dev, scale=0.1, offset=1.0)
    assert a.device == dev and a.dtype == torch.bfloat16
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert abs(a.float().mean().item() - 1.0) < 0.01 and abs(a.float().std().item() - 0.1) < 0.01
