"""The indexer kernels on a GPU: the projection kernel within its stated bound
of the exact product and of cuBLAS (TF32 off), the fused kernel bit-identical
to the projection kernel with the same tactic (16 warps, no K split) plus the
reference query epilogue, every output written, padding zero, CUDA graph
replay, the stage's path selection, the key cluster's schedulability.

Bounds stated (and asserted):
- projection vs the exact dot product: ``projection_error_bound(tactic)``;
- projection vs cuBLAS (TF32 and reduced-precision split-K off):
  ``bound(tactic) + bound(any order)`` in units of ``sum |x w|`` plus half a
  BF16 ULP each side for key and gate, which is within ``SUM_ULP_BOUND`` =
  1.5 BF16 ULP of ``sum |x w|`` for K <= 7168 (ULPs of the result are
  meaningless for near-cancelling rows); head weights (FP32) within the
  bound itself;
- fused vs projection(the variant's tactic: 16 warps and no split, or 1
  warp and 16 CTAs for split-K) + reference epilogue: q FP8 bits, scaled
  head weights bits and gate bits equal; normed key within 1 BF16 ULP (the
  kernel's rsqrt is approximate); for every fused variant of
  ``FUSED_CANDIDATES``;
- the no-exchange timing probes (``TIMING_PROBES``): every output their
  spread candidate's bit for bit but the key, which is the projection's
  un-normed key bit for bit;
- fused normed key vs the stock chain: within ``2 ULP + 2 rstd |w| d``,
  ``d`` the largest pre-norm key difference of the token.
"""

from __future__ import annotations

import dataclasses

import pytest

import torch

from kernels.indexer.layout import DIM, FUSED_CANDIDATES, TIMING_PROBES, Tactic, padded_heads
from kernels.reference.indexer import (assert_projection_within_bound, hadamard_transform,
                                       indexer_query, projection_error_bound, quantize_fp8)
from kernels.reference.numerics import (assert_all_written, assert_bit_exact,
                                        assert_within_ulp, bf16_ulp_at, bf16_ulp_distance,
                                        poison_, ulp_in_sum_abs)
from tests.gpu import sweep

pytestmark = pytest.mark.gpu

KS = (4096, 7168)
HEADS = (32, 64)
TOKENS = (1, 2, 3, 8, 16, 17, 32, 64)


@pytest.fixture(scope="module", autouse=True)
def _tf32_off():
    """cuBLAS with TF32 off and FP32 split-K reductions (torch's default lets
    BF16 GEMMs reduce split-K partials in reduced precision)."""
    m = torch.backends.cuda.matmul
    old = m.allow_tf32, m.allow_bf16_reduced_precision_reduction
    m.allow_tf32 = False
    m.allow_bf16_reduced_precision_reduction = False
    yield
    m.allow_tf32, m.allow_bf16_reduced_precision_reduction = old


_MODULES: dict = {}


def setup(k: int, heads: int):
    """(Indexer, IndexerProjection) for (K, heads), built once."""
    from kernels.indexer.projection import IndexerProjection
    from kernels.indexer.stage import Indexer

    if (k, heads) not in _MODULES:
        ind = Indexer(hidden=k, q_lora_rank=64, heads=heads, device="cuda",
                      generator=torch.Generator().manual_seed(k + heads))
        _MODULES[(k, heads)] = (ind, IndexerProjection(ind))
    return _MODULES[(k, heads)]


def inputs(m: int, k: int, heads: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed * 1000 + m)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16).cuda()
    q = (2 * torch.randn(m, heads * DIM, generator=g)).to(torch.bfloat16).cuda()
    if m > 1:
        q[1, :DIM] = 0  # an all-zero head: the amax floor sets its scale
    return x, q


def poisoned_projection_out(m, proj):
    return tuple(poison_(torch.empty(s, dtype=d, device="cuda")) for s, d in (
        ((m, proj.key), torch.bfloat16), ((m, proj.heads), torch.float32),
        ((m, proj.gate), torch.bfloat16)))


def poisoned_fused_out(m, proj, padded, dtype):
    q_out = torch.empty((m, padded, DIM), dtype=torch.float8_e4m3fn, device="cuda")
    q_out.view(torch.uint8).fill_(0xFF)  # e4m3fn NaN: never a kernel result
    rest = tuple(poison_(torch.empty(s, dtype=d, device="cuda")) for s, d in (
        ((m, padded), dtype), ((m, proj.key), torch.bfloat16), ((m, proj.gate), torch.bfloat16)))
    return (q_out,) + rest


#: Key and gate vs the stock GEMMs, in BF16 ULPs of sum |x w| (docs/design.md, Numerical contract: the
#: bound for sums whose order differs): both FP32 sums are within
#: (gamma_30 + gamma_K) sum|xw| < 0.12 ULP(sum|xw|) of the exact value for
#: K <= 7168, plus half a BF16 ULP of the result (<= sum|xw|) each side.
SUM_ULP_BOUND = 1.5


def within_sum_ulp(got, want, x, w, what):
    sum_abs = x.double().abs() @ w.double().abs().T
    ulps = ulp_in_sum_abs(got, want, sum_abs)
    print(f" {what}: max {float(ulps.max()):.3f} ULP of sum|xw|,"
          f" {float(bf16_ulp_distance(got, want).max()):.0f} ULP of the result", end="")
    assert float(ulps.max()) <= SUM_ULP_BOUND, f"{what}: {float(ulps.max())} ULP of sum|xw|"


def parts(proj):
    w = proj.weight
    return (w[:proj.key], w[proj.key:proj.key + proj.heads], w[proj.key + proj.heads:])


@sweep.parametrize("k, heads, tokens", KS, HEADS, TOKENS,
                   default=lambda k, heads, tokens: (k, heads) == (7168, 64) and tokens in (1, 17, 64)
                   or (k, heads, tokens) == (4096, 32, 16))
def test_projection_bounds_and_fused_bit_identity(k, heads, tokens):
    ind, proj = setup(k, heads)
    x, q = inputs(tokens, k, heads)
    table = proj.tactic_for(tokens)
    # 1. the projection with the table's tactic: every output written, within
    # its bound of the exact product and of cuBLAS (TF32 off).
    out = proj(x, out=poisoned_projection_out(tokens, proj))
    stock = ind.stock_projection(x)
    torch.cuda.synchronize()
    for name, got, want, w in zip(("key", "weights", "gate"), out, stock, parts(proj)):
        assert_all_written(got, f"projection {name}")
        assert_projection_within_bound(got, x, w, table, f"projection {name} ({table})")
        allowed = projection_error_bound(x, w, table) + projection_error_bound(x, w, None)
        if got.dtype == torch.bfloat16:
            allowed = allowed + bf16_ulp_at(want.double().abs() + allowed)
            within_sum_ulp(got, want, x, w, f"projection {name} vs cuBLAS")
        diff = (got.double() - want.double()).abs()
        assert bool((diff <= allowed).all()), f"{name} vs cuBLAS beyond the bound: {diff.max()}"

    # 2. the fused kernel vs the projection kernel with the fused tactic.
    if tokens > proj.fused_max_tokens:
        return
    pre = {t: proj(x, tactic=t) for t in {v.tactic(proj.key) for v in FUSED_CANDIDATES}}
    padded = padded_heads(heads)
    scale = ind.softmax_scale * heads ** -0.5
    cases = [(dtype, variant) for dtype in ((torch.float32, torch.bfloat16) if k == 7168
                                             else (torch.float32,))
             for variant in FUSED_CANDIDATES if variant.runs(tokens)]
    for dtype, variant in cases:
        skip = variant.name
        key_pre, w_pre, gate_pre = pre[variant.tactic(proj.key)]
        fused = proj.fused(x, q, ind.k_norm, scale, padded, dtype, variant=variant,
                           out=poisoned_fused_out(tokens, proj, padded, dtype))
        torch.cuda.synchronize()
        q_out, w_out, key, gate = fused
        assert not bool((q_out.view(torch.uint8) == 0xFF).any()), "q_fp8 not fully written"
        for name, t in (("weights", w_out), ("key", key), ("gate", gate)):
            assert_all_written(t, f"fused {name}")
        ref_q, ref_w, ref_key = indexer_query(
            q, key_pre, w_pre, ind.k_norm.weight.data, ind.k_norm.bias.data,
            eps=ind.k_norm.eps, scale=scale, padded=padded, weights_dtype=dtype, ue8m0=True)
        assert torch.equal(q_out.view(torch.uint8), ref_q.view(torch.uint8)), (
            f"q_fp8 ({skip}) differs from the reference in "
            f"{int((q_out.view(torch.uint8) != ref_q.view(torch.uint8)).sum())} bytes")
        assert_bit_exact(w_out, ref_w, f"fused head weights ({dtype}, {skip})")
        assert_bit_exact(gate, gate_pre, f"fused gate vs projection gate ({skip})")
        assert_within_ulp(key, ref_key, 1, f"fused key vs reference LayerNorm ({skip})")
        assert not bool(q_out[:, heads:].view(torch.uint8).any()), "q padding not zero"
        assert not bool(w_out[:, heads:].view(torch.int16 if dtype == torch.bfloat16
                                              else torch.int32).any()), "weight padding not +0"


@pytest.mark.parametrize("tokens", (1, 8, 16))
@pytest.mark.parametrize("heads", HEADS)
def test_fused_vs_stock_chain(heads, tokens):
    from kernels.indexer.stage import stock_indexer_query

    k = 7168
    ind, proj = setup(k, heads)
    x, q = inputs(tokens, k, heads, seed=1)
    scale = ind.softmax_scale * heads ** -0.5
    padded = padded_heads(heads)
    q_out, w_out, key, gate = proj.fused(x, q, ind.k_norm, scale, padded)
    tactic = proj.fused_tactic(tokens)
    k_stock, w_stock, g_stock = ind.stock_projection(x)
    sq, sw, skey = stock_indexer_query(q, k_stock, w_stock, ind.k_norm, scale, padded)
    torch.cuda.synchronize()
    within_sum_ulp(gate, g_stock, x, parts(proj)[2], "fused gate vs stock")
    # Head weights: relative to sum |x w| of the row, times the q scale.
    w = parts(proj)[1]
    q_scale = quantize_fp8(hadamard_transform(q.view(tokens, heads, DIM)), ue8m0=True)[1]
    q_scale = q_scale[..., 0].double()
    allowed = (projection_error_bound(x, w, tactic) + projection_error_bound(x, w, None)
               + 4 * 2.0**-24 * (x.double().abs() @ w.double().abs().T)) * q_scale * scale
    diff = (w_out[:, :heads].double() - sw[:, :heads].double()).abs()
    assert bool((diff <= allowed).all()), f"head weights vs stock: {diff.max()} > bound"
    # Normed key: its own rounding plus the pre-norm difference through the norm.
    key_pre = proj(x, tactic=tactic)[0]
    d = (key_pre.double() - k_stock.double()).abs().amax(dim=1, keepdim=True)
    v = k_stock.double()
    rstd = torch.rsqrt(v.var(dim=1, unbiased=False, keepdim=True) + ind.k_norm.eps)
    allowed = (2 * bf16_ulp_at(skey.double().abs()) + 2 * rstd * ind.k_norm.weight.double().abs() * d)
    diff = (key.double() - skey.double()).abs()
    assert bool((diff <= allowed).all()), f"normed key vs stock: {diff.max()}"
    assert torch.equal(q_out.view(torch.uint8)[:, heads:], sq.view(torch.uint8)[:, heads:])


@pytest.mark.parametrize("tokens", (1, 16))
def test_projection_launched_first_writes_the_same_bits(tokens):
    """``early_launch`` moves ``launch_dependents`` only: the same bits, each
    call in a graph of two back to back (the next one launched early)."""
    ind, proj = setup(7168, 64)
    x, _ = inputs(tokens, 7168, 64, seed=5)
    for tactic in (Tactic(16, 1), Tactic(2, 16)):
        want = proj(x, tactic=tactic)
        outs = [poisoned_projection_out(tokens, proj) for _ in range(2)]
        proj(x, tactic=tactic, early_launch=True, out=outs[0])  # compile, load
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for out in outs:
                proj(x, tactic=tactic, early_launch=True, out=out)
        for out in outs:
            for t in out:
                poison_(t)
        graph.replay()
        torch.cuda.synchronize()
        for out in outs:
            for name, got, ref in zip(("key", "weights", "gate"), out, want):
                assert_bit_exact(got, ref, f"projection {name} ({tactic}, launched first)")


@pytest.mark.parametrize("variant", FUSED_CANDIDATES, ids=lambda v: v.name)
def test_graph_replay_matches_eager(variant):
    k, heads, tokens = 7168, 64, 4
    ind, proj = setup(k, heads)
    x, q = inputs(tokens, k, heads, seed=2)
    scale = ind.softmax_scale * heads ** -0.5
    padded = padded_heads(heads)
    fused_out = poisoned_fused_out(tokens, proj, padded, torch.float32)
    proj_out = poisoned_projection_out(tokens, proj)
    proj.fused(x, q, ind.k_norm, scale, padded, out=fused_out, variant=variant)  # compile, load
    proj(x, out=proj_out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        proj.fused(x, q, ind.k_norm, scale, padded, out=fused_out, variant=variant)
        proj(x, out=proj_out)
    for seed in (3, 4):
        x2, q2 = inputs(tokens, k, heads, seed=seed)
        x.copy_(x2)
        q.copy_(q2)
        for t in fused_out[1:] + proj_out:
            poison_(t)
        graph.replay()
        torch.cuda.synchronize()
        eager_f = proj.fused(x, q, ind.k_norm, scale, padded, variant=variant)
        eager_p = proj(x)
        torch.cuda.synchronize()
        for a, b in zip(fused_out + proj_out, eager_f + eager_p):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("probe", TIMING_PROBES, ids=lambda v: v.name)
def test_no_exchange_probe_times_the_spread_grid_with_the_un_normed_key(probe):
    """The timing probe writes what its spread candidate writes but the key,
    which is the projection's un-normed key bit for bit (no mailbox, no
    reducer), and leaves the mailbox at its sentinel."""
    from kernels.indexer.layout import MAILBOX_SENTINEL

    k, heads, tokens = 7168, 64, 16
    ind, proj = setup(k, heads)
    x, q = inputs(tokens, k, heads, seed=6)
    scale = ind.softmax_scale * heads ** -0.5
    padded = padded_heads(heads)
    candidate = dataclasses.replace(probe, exchange=True)
    got = proj.fused(x, q, ind.k_norm, scale, padded, variant=probe,
                     out=poisoned_fused_out(tokens, proj, padded, torch.float32))
    torch.cuda.synchronize()
    assert bool((proj.key_mailbox == MAILBOX_SENTINEL - (1 << 32)).all())
    want = proj.fused(x, q, ind.k_norm, scale, padded, variant=candidate)
    raw_key = proj(x, tactic=probe.tactic(proj.key))[0]
    torch.cuda.synchronize()
    for name, a, b in zip(("q_fp8", "weights", "gate"), got[:2] + got[3:], want[:2] + want[3:]):
        assert_bit_exact(a.view(torch.uint8), b.view(torch.uint8), f"{probe.name} {name}")
    assert_bit_exact(got[2], raw_key, f"{probe.name} key vs the projection's un-normed key")


def test_stage_paths():
    from kernels.indexer.stage import IndexerStage, _fuse, planned_step

    k, heads = 7168, 64
    ind, proj = setup(k, heads)
    stage = IndexerStage(ind)
    calls = []
    fused = stage.projection.fused
    stage.projection.fused = lambda *a, **kw: calls.append("fused") or fused(*a, **kw)
    try:
        for tokens in (1, 16, 17, 64, 65):
            path = "fused" if _fuse(tokens, heads, proj.arch) else "two-step"
            x, _ = inputs(tokens, k, heads, seed=5)
            qr = torch.randn(tokens, 64, generator=torch.Generator().manual_seed(tokens)).to(
                torch.bfloat16).cuda()
            calls.clear()
            stock = ind.forward(x, qr)  # outside a planned step: the stock forward
            assert calls == []
            with planned_step():
                got = ind.forward(x, qr)
            assert calls == (["fused"] if path == "fused" else [])
            torch.cuda.synchronize()
            within_sum_ulp(got["gate_score"], stock["gate_score"].detach(), x, parts(proj)[2],
                           f"stage gate {tokens} ({path})")
            assert got["q_fp8"].shape == stock["q_fp8"].shape == (tokens, 64, DIM)
            assert got["weights"].shape == stock["weights"].shape == (tokens, 64)
    finally:
        stage.uninstall()


def test_key_cluster_is_schedulable():
    k, heads = 7168, 64
    ind, proj = setup(k, heads)
    x, q = inputs(1, k, heads)
    proj.fused(x, q, ind.k_norm, 0.01, 64)
    torch.cuda.synchronize()
    occupancy = {c: n for c, n in proj.cluster_occupancy.items() if not isinstance(c, tuple)}
    errors = {c: n for c, n in proj.cluster_occupancy.items() if isinstance(c, tuple)}
    print(f"\nkey cluster (16 CTAs x 512 threads): max active clusters {occupancy}; {errors}")
    assert occupancy and all(n is not None and n >= 1 for n in occupancy.values()), errors
