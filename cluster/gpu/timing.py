"""Timed calls on the ranks of a process-per-GPU TP group (the profile job
at tp > 1). DRAFT: written without GPU time; never run (see the module's
tests in tests/gpu/test_cluster_gpu.py::test_process_per_gpu_timing, marked
multigpu).

:func:`time_rank` runs on every rank of the group at once (the group calls
it on all actors together). Per implementation it captures one CUDA graph of
``calls`` back-to-back calls over rotating input sets (spanning
``rotate_mb``), then replays it ``replays`` times; before each replay the
ranks meet at an NCCL barrier and synchronize, so the replays start within a
barrier's skew of each other and the driver can take, per iteration, the max
over ranks (nccl-tests' convention). Implementations:

- ``fused``: AllReduceNorm (Lamport publish + norm) on the group's mailbox;
- ``unfused``: NCCL ``all_reduce`` (its default algorithm) + add + RMSNorm,
  captured in the graph;
- ``symm_mem``: torch symmetric memory ``one_shot_all_reduce`` + add +
  RMSNorm (unicast: multicast stays off).

Inputs: each rank its own partial (seeded by rank), the same residual and
norm weight on every rank. The fused op is checked against the reference on
the first set before timing (residual bit-exact, norm within 1 ULP), like the
tp=1 measurement. Returns ``{"impls": {name: {"times_us": [...], "compile_s"}
| {"skipped": why}}}``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

SPEC = ("hidden", "tokens", "calls", "replays", "rotate_mb", "eps", "baselines", "seed")


def time_rank(*, rank: int, tp: int, device, fused_op, spec: Mapping) -> dict:
    import torch
    import torch.distributed as dist

    from benchmarks.timing import rotating, rotation_sets, time_graph
    from cluster.cases import NORM_MAX_ULP
    from kernels.reference import numerics

    missing = [k for k in SPEC if k not in spec]
    if missing:
        raise ValueError(f"timing spec lacks {missing}")
    hidden, m, eps = int(spec["hidden"]), int(spec["tokens"]), float(spec["eps"])
    bf16 = torch.bfloat16
    sets = rotation_sets(spec["rotate_mb"], 4 * m * hidden * 2)
    calls = max(int(spec["calls"]), sets)
    mine = torch.Generator().manual_seed(int(spec["seed"]) * 1009 + rank)
    shared = torch.Generator().manual_seed(int(spec["seed"]))
    xs = torch.randn(sets, m, hidden, generator=mine).to(bf16).to(device)
    residuals = torch.randn(sets, m, hidden, generator=shared).to(bf16).to(device)
    weight = (1 + 0.1 * torch.randn(hidden, generator=shared)).to(bf16).to(device)
    outs = torch.empty(2, sets, m, hidden, dtype=bf16, device=device)

    def barrier() -> None:
        dist.barrier(device_ids=[device.index])
        torch.cuda.synchronize(device)

    def timed(make: Callable[[], Callable[[int], object]]) -> dict:
        barrier()
        t0 = time.perf_counter()
        fn = make()
        fn(0)
        torch.cuda.synchronize(device)
        compile_s = time.perf_counter() - t0
        barrier()
        times = time_graph(rotating(fn, sets), calls, int(spec["replays"]), before_replay=barrier)
        return {"times_us": times, "compile_s": compile_s}

    def fused():
        fused_op(xs[0], residuals[0], weight, out=(outs[0, 0], outs[1, 0]))
        torch.cuda.synchronize(device)
        gathered = [torch.empty_like(xs[0]) for _ in range(tp)]
        dist.all_gather(gathered, xs[0])
        from kernels.reference.allreduce import all_reduce_norm
        ref_norm, ref_res = all_reduce_norm([g.cpu() for g in gathered], residuals[0].cpu(),
                                            weight.cpu(), eps)
        numerics.assert_bit_exact(outs[1, 0].cpu(), ref_res, "residual_out")
        numerics.assert_within_ulp(outs[0, 0].cpu(), ref_norm, NORM_MAX_ULP, "norm_out")
        return lambda i: fused_op(xs[i], residuals[i], weight, out=(outs[0, i], outs[1, i]))

    def unfused():
        buf = torch.empty(m, hidden, dtype=bf16, device=device)

        def call(i):
            buf.copy_(xs[i])
            dist.all_reduce(buf)
            s = buf + residuals[i]
            return torch.nn.functional.rms_norm(s, (hidden,), weight, eps), s
        return call

    def symm_mem():
        import torch.distributed._symmetric_memory as sm
        group_name = dist.group.WORLD.group_name
        buf = sm.empty(m, hidden, dtype=bf16, device=device)
        sm.rendezvous(buf, group_name)

        def call(i):
            buf.copy_(xs[i])
            s = torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", group_name) + residuals[i]
            return torch.nn.functional.rms_norm(s, (hidden,), weight, eps), s
        return call

    impls: dict[str, dict] = {"fused": timed(fused)}
    for name, make in (("unfused", unfused), ("symm_mem", symm_mem)):
        if name not in spec["baselines"]:
            continue
        try:
            impls[name] = timed(make)
        except Exception as err:  # noqa: BLE001 - a baseline this torch lacks is a skip
            impls[name] = {"skipped": f"{name} unavailable: {type(err).__name__}: {err}"[:300]}
    if "flashinfer" in spec["baselines"]:
        try:
            import flashinfer.comm  # noqa: F401
            impls["flashinfer"] = {"skipped": "flashinfer importable; its fused all-reduce is "
                                              "not wired into this timing yet"}
        except ImportError:
            impls["flashinfer"] = {"skipped": "flashinfer is not importable here"}
    return {"rank": rank, "impls": impls}


def max_over_ranks(per_rank: list[list[float]]) -> list[float]:
    """Per iteration, the slowest rank's time (every rank timed the same
    number of replays, each started after a barrier)."""
    counts = {len(t) for t in per_rank}
    if len(counts) != 1:
        raise ValueError(f"ranks timed different replay counts: {sorted(counts)}")
    return [max(ts) for ts in zip(*per_rank)]
