"""Timed calls on the ranks of a process-per-GPU TP group (the profile job
at tp > 1; :meth:`cluster.gpu.rank.GpuRank.time_case` calls it).

:func:`time_rank` runs on every rank of the group at once (the group calls
it on all actors together). Per implementation it captures one CUDA graph of
``calls`` back-to-back calls over rotating input sets (spanning
``rotate_mb`` on each rank), then replays it ``replays`` times; before each
replay the ranks meet at an NCCL barrier and synchronize, so the replays
start within a barrier's skew of each other and the driver takes, per
iteration, the max over ranks (:func:`max_over_ranks`, nccl-tests'
convention). The first call of each (compile, NCCL/symmetric-memory set-up)
is timed apart as ``compile_s``.

Ops (``spec["op"]``) and implementations:

- ``all_reduce_norm``: ``fused`` AllReduceNorm (Lamport publish + norm) on
  the group's mailbox; ``unfused`` NCCL ``all_reduce`` (its default
  algorithm) + add + RMSNorm; ``symm_mem`` torch symmetric memory
  ``one_shot_all_reduce`` (unicast: multicast stays off) + add + RMSNorm.
- ``all_reduce_mhc`` (``spec["hc"]`` streams): ``fused`` AllReduceMHC on the
  group's mailbox; ``unfused`` / ``symm_mem`` the same all-reduces followed
  by the torch mHC path (post-mix + comb-weighted streams, collapse,
  RMSNorm: :func:`benchmarks.all_reduce_mhc.torch_mhc`).

NCCL and symmetric-memory calls are captured inside the graphs (each runs
eagerly first, so their communicators exist before capture).

Inputs: each rank its own BF16 partial (generator seeded by seed and rank),
everything replicated across TP (residual, mixes, norm weight) the same on
every rank. Before timing, the fused op's outputs of the first set are
checked against the torch reference fed with every rank's partial
(all-gathered): residual bit-exact, normalized output within
``cluster.cases.NORM_MAX_ULP``; a mismatch raises AssertionError (the row is
then ``fail``, not a timing).

Returns ``{"rank": r, "impls": {name: {"times_us": [...], "compile_s": s}
| {"skipped": why}}}``; ``times_us`` are per-call microseconds of each
replay (replay time / calls).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

SPEC = ("op", "hidden", "tokens", "calls", "replays", "rotate_mb", "eps", "baselines", "seed")
TIMED_OPS = ("all_reduce_norm", "all_reduce_mhc")


@dataclass
class Workload:
    """One op's rotating inputs on one rank. ``fused(op)`` -> per-set call of
    the fused op; ``check(partials)`` compares the fused outputs of set 0
    with the reference over every rank's set-0 partial; ``tail(reduced, i)``
    is the torch work after an all-reduce (the unfused baselines)."""
    sets: int
    x: object  # [sets, M, hidden] BF16, this rank's partials
    fused: Callable[[object], Callable[[int], object]]
    check: Callable[[list], None]
    tail: Callable[[object, int], object]


def set_bytes(op: str, m: int, hidden: int, hc: int = 1) -> int:
    """Bytes one rotation set occupies on a rank (inputs and outputs)."""
    if op == "all_reduce_norm":
        return 4 * m * hidden * 2  # x, residual, norm_out, residual_out
    return (2 + 2 * hc) * m * hidden * 2 + (2 * hc + hc * hc) * m * 4


def norm_workload(*, m, hidden, eps, device, sets, mine, shared) -> Workload:
    import torch

    from cluster.cases import NORM_MAX_ULP
    from kernels.reference.allreduce import all_reduce_norm
    from kernels.reference.numerics import assert_bit_exact, assert_within_ulp

    bf16 = torch.bfloat16
    xs = torch.randn(sets, m, hidden, generator=mine).to(bf16).to(device)
    residuals = torch.randn(sets, m, hidden, generator=shared).to(bf16).to(device)
    weight = (1 + 0.1 * torch.randn(hidden, generator=shared)).to(bf16).to(device)
    outs = torch.empty(2, sets, m, hidden, dtype=bf16, device=device)

    def fused(op):
        return lambda i: op(xs[i], residuals[i], weight, out=(outs[0, i], outs[1, i]))

    def check(partials):
        ref_norm, ref_res = all_reduce_norm(partials, residuals[0], weight, eps)
        assert_bit_exact(outs[1, 0], ref_res, "residual_out")
        assert_within_ulp(outs[0, 0], ref_norm, NORM_MAX_ULP, "norm_out")

    def tail(reduced, i):
        s = reduced + residuals[i]
        return torch.nn.functional.rms_norm(s, (hidden,), weight, eps), s

    return Workload(sets, xs, fused, check, tail)


def mhc_workload(*, m, hidden, hc, eps, device, sets, mine, shared) -> Workload:
    import torch

    from benchmarks.all_reduce_mhc import torch_mhc
    from cluster.cases import NORM_MAX_ULP
    from kernels.reference.mhc import all_reduce_mhc
    from kernels.reference.numerics import assert_bit_exact, assert_within_ulp

    bf16 = torch.bfloat16
    xs = torch.randn(sets, m, hidden, generator=mine).to(bf16).to(device)
    residual = torch.randn(sets, m, hc, hidden, generator=shared).to(bf16).to(device)
    post = (2 * torch.rand(sets, m, hc, generator=shared)).to(device)
    comb = (torch.rand(sets, m, hc, hc, generator=shared) / hc).to(device)
    pre = torch.rand(sets, m, hc, generator=shared).to(device)
    weight = (1 + 0.1 * torch.randn(hidden, generator=shared)).to(bf16).to(device)
    res_out = torch.empty(sets, m, hc, hidden, dtype=bf16, device=device)
    layer = torch.empty(sets, m, hidden, dtype=bf16, device=device)
    lanes = []  # the fused op's rank_lanes: its reduction order

    def fused(op):
        lanes.append(op.tuning.rank_lanes)
        return lambda i: op(xs[i], residual[i], post[i], comb[i], pre[i], weight, eps,
                            out=(res_out[i], layer[i]))

    def check(partials):
        ref_res, ref_layer = all_reduce_mhc(partials, residual[0], post[0], comb[0], pre[0],
                                            weight, eps, rank_lanes=lanes[-1])
        assert_bit_exact(res_out[0], ref_res, "residual_out")
        assert_within_ulp(layer[0], ref_layer, NORM_MAX_ULP, "layer_input")

    def tail(reduced, i):
        return torch_mhc(reduced, residual[i], post[i], comb[i], pre[i], weight, eps)

    return Workload(sets, xs, fused, check, tail)


def time_rank(*, rank: int, tp: int, device, fused_op, spec: Mapping) -> dict:
    """See the module docstring. ``fused_op``: this rank's AllReduceNorm or
    AllReduceMHC on the group's mailbox (built for ``spec``'s op, tokens <=
    its capacity). ``spec``: :data:`SPEC` (+ ``hc`` for all_reduce_mhc)."""
    import torch
    import torch.distributed as dist

    from benchmarks.timing import rotating, rotation_sets, time_graph
    from jobs.profiling import nvtx_range

    missing = [k for k in SPEC if k not in spec]
    if missing:
        raise ValueError(f"timing spec lacks {missing}")
    op = spec["op"]
    if op not in TIMED_OPS:
        raise ValueError(f"no timing for op {op!r}; timed: {list(TIMED_OPS)}")
    hidden, m, eps = int(spec["hidden"]), int(spec["tokens"]), float(spec["eps"])
    hc = int(spec.get("hc") or 1)
    sets = rotation_sets(spec["rotate_mb"], set_bytes(op, m, hidden, hc))
    calls = max(int(spec["calls"]), sets)
    mine = torch.Generator().manual_seed(int(spec["seed"]) * 1009 + rank)
    shared = torch.Generator().manual_seed(int(spec["seed"]))
    common = dict(m=m, hidden=hidden, eps=eps, device=device, sets=sets, mine=mine,
                  shared=shared)
    work = (norm_workload(**common) if op == "all_reduce_norm"
            else mhc_workload(hc=hc, **common))
    label = f"tp={tp} hidden={hidden} M={m}"

    def barrier() -> None:
        dist.barrier(device_ids=[device.index])
        torch.cuda.synchronize(device)

    def timed(name: str, make: Callable[[], Callable[[int], object]]) -> dict:
        barrier()
        with nvtx_range(f"{op}/{name} {label} compile", m):
            t0 = time.perf_counter()
            fn = make()
            fn(0)
            torch.cuda.synchronize(device)
            compile_s = time.perf_counter() - t0
        barrier()
        with nvtx_range(f"{op}/{name} {label}", m):
            times = time_graph(rotating(fn, sets), calls, int(spec["replays"]),
                               before_replay=barrier)
        return {"times_us": times, "compile_s": compile_s}

    def fused():
        call = work.fused(fused_op)
        call(0)
        torch.cuda.synchronize(device)
        partials = [torch.empty_like(work.x[0]) for _ in range(tp)]
        dist.all_gather(partials, work.x[0].contiguous())
        try:
            work.check(partials)
            failed = None
        except AssertionError as err:
            failed = err
        # Every rank stops together: a rank timing on alone would wait at
        # the next barrier for peers that have already raised.
        bad = torch.tensor([int(failed is not None)], device=device)
        dist.all_reduce(bad)
        if failed is not None:
            raise failed
        if int(bad.item()):
            raise AssertionError(f"rank {rank}: the fused op's outputs are wrong on "
                                 f"{int(bad.item())} other rank(s) of the group")
        return call

    def unfused():
        buf = torch.empty(m, hidden, dtype=torch.bfloat16, device=device)

        def call(i):
            buf.copy_(work.x[i])
            dist.all_reduce(buf)
            return work.tail(buf, i)
        return call

    def symm_mem():
        import torch.distributed._symmetric_memory as sm
        group_name = dist.group.WORLD.group_name
        buf = sm.empty(m, hidden, dtype=torch.bfloat16, device=device)
        sm.rendezvous(buf, group_name)

        def call(i):
            buf.copy_(work.x[i])
            return work.tail(torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", group_name), i)
        return call

    impls: dict[str, dict] = {"fused": timed("fused", fused)}
    for name, make in (("unfused", unfused), ("symm_mem", symm_mem)):
        if name not in spec["baselines"]:
            continue
        try:
            impls[name] = timed(name, make)
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
