"""A kernel loaded back from the persistent compile cache computes what the
freshly compiled one does (bit for bit), on the GPU.
    timeout 300 python -m pytest -m gpu tests/gpu/test_compile_cache_gpu.py
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_cache_hit_runs_like_a_fresh_compile(tmp_path, monkeypatch):
    from kernels.all_reduce_norm import AllReduceNorm
    from kernels.compile_cache import entries, stats
    from kernels.lamport import compile as lamport_compile
    from kernels.reference.allreduce import all_reduce_norm
    from kernels.reference.numerics import assert_bit_exact, assert_within_ulp

    monkeypatch.setenv("LAMPORT_COMPILE_CACHE", str(tmp_path))
    monkeypatch.setattr(lamport_compile, "_cache", {})
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(8, 3584, generator=gen).to(torch.bfloat16).cuda()
    residual = torch.randn(8, 3584, generator=gen).to(torch.bfloat16).cuda()
    weight = torch.randn(3584, generator=gen).to(torch.bfloat16).cuda()

    compiled = dict(stats)
    fresh = AllReduceNorm(hidden_size=3584, max_num_tokens=16, eps=1e-6)
    out_fresh = [t.clone() for t in fresh(x, residual, weight)]
    torch.cuda.synchronize()
    assert stats["compiled"] - compiled.get("compiled", 0) >= 2 and entries(tmp_path) >= 2

    monkeypatch.setattr(lamport_compile, "_cache", {})  # a new process, as far as the cache goes
    loaded = dict(stats)
    again = AllReduceNorm(hidden_size=3584, max_num_tokens=16, eps=1e-6)
    out_loaded = again(x, residual, weight)
    torch.cuda.synchronize()
    assert stats["loaded"] - loaded.get("loaded", 0) >= 2
    assert stats["compiled"] == loaded.get("compiled", 0)  # nothing compiled the second time
    for a, b, name in zip(out_fresh, out_loaded, ("norm_out", "residual_out")):
        assert_bit_exact(b, a, f"{name}: loaded vs fresh")
    norm_ref, residual_ref = all_reduce_norm([x.cpu()], residual.cpu(), weight.cpu(), 1e-6)
    assert_bit_exact(out_loaded[1].cpu(), residual_ref, "residual_out vs reference")
    assert_within_ulp(out_loaded[0].cpu(), norm_ref, 1, "norm_out vs reference")


def test_the_compile_checks_builds_serve_the_ranks(tmp_path, monkeypatch):
    """What the compile check compiles (the arch spelled, the watchdog at the
    default case budget) is what a rank at that budget loads: nothing is
    compiled twice on a cold machine."""
    from kernels.all_reduce_norm import AllReduceNorm
    from kernels.compile_cache import resolve_arch, stats
    from kernels.lamport import compile as lamport_compile
    from kernels.lamport.compile_variants import all_reduce_norm_variants
    from kernels.lamport.protocol import DEFAULT_BUDGET_NS

    monkeypatch.setenv("LAMPORT_COMPILE_CACHE", str(tmp_path))
    monkeypatch.setattr(lamport_compile, "_cache", {})
    arch = resolve_arch("")
    for v in all_reduce_norm_variants([2048], [1]):
        if v.mode == "one_shot" and v.transport != "multicast":
            v.compile(arch, str(tmp_path / "ptx" / f"{v.kernel}-{v.budget_ns}"))

    monkeypatch.setattr(lamport_compile, "_cache", {})  # a rank's process
    before = dict(stats)
    AllReduceNorm(hidden_size=2048, max_num_tokens=4, eps=1e-6, budget_ns=DEFAULT_BUDGET_NS)
    assert stats["compiled"] == before.get("compiled", 0), "the rank compiled again"
    assert stats["loaded"] - before.get("loaded", 0) >= 2  # its publish and its consumer
