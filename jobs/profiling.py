"""GPU-side measurement for the profile job (runs inside a Ray task that
holds one GPU; imports CUDA only when called).

``measure_tp1(spec)`` times, in one process on one GPU and in the same run:

- ``fused``: ``AllReduceNorm`` (Lamport publish + norm, plain or watchdog
  consumer) at tp=1;
- ``unfused``: the single-rank equivalent of NCCL all_reduce + add +
  RMSNorm (at tp=1 the all-reduce is the identity: ``x + residual`` then
  ``torch.nn.functional.rms_norm``);
- ``symm_mem``: torch symmetric memory ``one_shot_all_reduce`` over a
  1-rank group + add + RMSNorm, where this torch provides it;
- ``flashinfer``: recorded as skipped with the reason (not importable, or
  its fused all-reduce needs a tp >= 2 group).

Timing: each implementation is captured in one CUDA graph of ``calls``
back-to-back calls over rotating input sets (``benchmarks.all_reduce_norm``,
inputs spanning ``rotate_mb``), replayed ``replays`` times, each replay
timed with CUDA events; an iteration is replay time / calls. The first
call (compile + load) is timed apart as ``compile_s``. Every timed region
is an NVTX range in the ``lamport-lab`` domain named
``<op>/<impl> tp=.. hidden=.. M=..`` with M as its payload, so
``ncu --nvtx --nvtx-include "lamport-lab@all_reduce_norm/fused*"`` selects
it.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

NVTX_DOMAIN = "lamport-lab"


def stats(times_us: list[float]) -> dict[str, float]:
    """Results timing columns from per-iteration times (us)."""
    ordered = sorted(times_us)
    n = len(ordered)

    def pct(q: float) -> float:
        return ordered[min(n - 1, max(0, round(q * (n - 1))))]

    return {"t_n": n, "t_min_us": ordered[0], "t_median_us": statistics.median(ordered),
            "t_mean_us": statistics.fmean(ordered), "t_p90_us": pct(0.90),
            "t_p99_us": pct(0.99), "t_stdev_us": statistics.stdev(ordered) if n > 1 else 0.0}


def gpu_state() -> dict[str, int | None]:
    """SM / memory clocks and temperature of the current GPU via NVML (None
    where nvidia-ml-py is absent)."""
    try:
        import pynvml
        import torch
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return {"sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
                "temp_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)}
    except Exception:
        return {"sm_clock_mhz": None, "mem_clock_mhz": None, "temp_c": None}


def nvtx_range(name: str, payload: int):
    """An NVTX range in the project's domain with M as its payload."""
    import nvtx
    return nvtx.annotate(name, domain=NVTX_DOMAIN, payload=payload)


def measure_tp1(spec: dict[str, Any]) -> dict[str, Any]:
    """See the module docstring. ``spec``: op, variant, hidden, tokens,
    calls, replays, watchdog_ns, rotate_mb, eps, baselines. Returns
    ``{"impls": {name: {"times_us": [...], "compile_s": s} | {"skipped": why}},
    "before": gpu_state, "after": gpu_state, "device": name}``."""
    import torch

    from benchmarks.timing import rotating, rotation_sets, time_graph
    from kernels.all_reduce_norm import AllReduceNorm
    from kernels.reference.allreduce import all_reduce_norm
    from kernels.reference.numerics import assert_bit_exact, assert_within_ulp

    hidden, m, eps = spec["hidden"], spec["tokens"], spec.get("eps", 1e-6)
    calls, replays = spec["calls"], spec["replays"]
    label = f"tp=1 hidden={hidden} M={m}"
    g = torch.Generator(device="cpu").manual_seed(m)
    set_bytes = 4 * m * hidden * 2
    sets = rotation_sets(spec["rotate_mb"], set_bytes)
    calls = max(calls, sets)
    xs = torch.randn(sets, m, hidden, generator=g).to(torch.bfloat16).cuda()
    residuals = torch.randn(sets, m, hidden, generator=g).to(torch.bfloat16).cuda()
    weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(torch.bfloat16).cuda()
    outs = torch.empty(2, sets, m, hidden, dtype=torch.bfloat16, device="cuda")

    def rotate(call):  # call(x, residual, out) over the input sets
        return rotating(lambda i: call(xs[i], residuals[i], (outs[0, i], outs[1, i])), sets)

    impls: dict[str, dict] = {}
    before = gpu_state()

    def timed(name, make):
        """make() -> per-call fn (the first call, compile included, timed apart)."""
        with nvtx_range(f"{spec['op']}/{name} {label} compile", m):
            t0 = time.perf_counter()
            fn = make()
            rotate(fn)()
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
        with nvtx_range(f"{spec['op']}/{name} {label}", m):
            times = time_graph(rotate(fn), calls, replays)
        impls[name] = {"times_us": times, "compile_s": compile_s}

    wd = spec["watchdog_ns"] if spec["variant"] == "watchdog" else 0

    def fused():
        op = AllReduceNorm(hidden_size=hidden, max_num_tokens=m, eps=eps, watchdog_ns=wd)
        op(xs[0], residuals[0], weight, out=(outs[0, 0], outs[1, 0]))
        torch.cuda.synchronize()
        ref_norm, ref_res = all_reduce_norm([xs[0]], residuals[0], weight, eps)
        assert_bit_exact(outs[1, 0], ref_res, "residual_out")
        assert_within_ulp(outs[0, 0], ref_norm, 1, "norm_out")
        return lambda x, r, o: op(x, r, weight, out=o)

    timed("fused", fused)
    if "unfused" in spec["baselines"]:
        def unfused():
            def call(x, residual, out):
                s = x + residual
                return torch.nn.functional.rms_norm(s, (hidden,), weight, eps), s
            return call
        timed("unfused", unfused)
    if "symm_mem" in spec["baselines"]:
        try:
            timed("symm_mem", lambda: _symm_mem_call(m, hidden, weight, eps))
        except Exception as err:
            impls["symm_mem"] = {"skipped": f"torch symmetric memory one_shot_all_reduce "
                                            f"unavailable: {type(err).__name__}: {err}"}
    if "flashinfer" in spec["baselines"]:
        try:
            import flashinfer.comm  # noqa: F401
            impls["flashinfer"] = {"skipped": "flashinfer is importable but its fused "
                                              "all-reduce needs a tp >= 2 group; not measured at tp=1"}
        except ImportError:
            impls["flashinfer"] = {"skipped": "flashinfer is not importable here"}
    return {"impls": impls, "before": before, "after": gpu_state(),
            "device": torch.cuda.get_device_name()}


def _symm_mem_call(m: int, hidden: int, weight, eps: float):
    """A 1-rank process group with a symmetric buffer; returns the per-call
    fn: copy in, one_shot_all_reduce, add, RMSNorm."""
    import os
    import socket

    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(port))
        dist.init_process_group("nccl", rank=0, world_size=1)
    group_name = dist.group.WORLD.group_name
    buf = symm_mem.empty(m, hidden, dtype=torch.bfloat16, device="cuda")
    symm_mem.rendezvous(buf, group_name)

    def call(x, residual, out):
        buf.copy_(x)
        s = torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", group_name) + residual
        return torch.nn.functional.rms_norm(s, (hidden,), weight, eps), s
    return call
