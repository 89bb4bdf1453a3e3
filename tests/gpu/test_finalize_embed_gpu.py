"""AllReduceNorm with a MoE output (finalize fused into the publish) and the
embedding publish + embed-norm, on one GPU with virtual ranks.

Run under a process timeout; the watchdog tests run first (a broken publish
then times out instead of hanging a plain consumer):
    timeout 400 python -m pytest -m gpu tests/gpu/test_finalize_embed_gpu.py
"""

from __future__ import annotations

import functools
import time

import pytest

import torch

from kernels.reference.allreduce import all_reduce_norm, all_reduce_sum, rms_norm
from kernels.reference.embed import embed_norm as ref_embed_norm
from kernels.reference.moe import finalize_payloads
from kernels.reference.numerics import (assert_all_written, assert_bit_exact,
                                        assert_within_ulp, bits, poison_)
from tests.gpu import sweep

pytestmark = pytest.mark.gpu

EPS = 1e-6
CAPACITY = 64
TPS = (1, 2, 4, 8)
HIDDENS = (4096, 5120, 7168)
TOKENS = (1, 7, 16, 64)
TOP_KS = (1, 6, 8)
BUDGET_NS = 50_000_000  # 50 ms
VOCAB_PER_RANK = 50


@functools.lru_cache(maxsize=None)
def group(tp: int, hidden: int, top_k: int = 8, budget_ns: int = 0, scale: float = 1.0,
          tuning=None):
    from kernels.all_reduce_norm import AllReduceNorm

    grp = AllReduceNorm.virtual_ranks(tp=tp, hidden_size=hidden, max_num_tokens=CAPACITY,
                                      eps=EPS, budget_ns=budget_ns, top_k=top_k,
                                      routed_scaling_factor=scale, finalize_tuning=tuning)
    shards = make_shards(tp, hidden)
    grp.prepare_embedding([w for w, _, _ in shards], [s for _, s, _ in shards],
                          [r for _, _, r in shards])
    grp.shards = shards
    return grp


def make_shards(tp, hidden, seed=5):
    """Rank r owns ids [r*V, (r+1)*V); rank 0's tensor has 3 extra padding
    rows (ids V..V+2 belong to rank 1: using them would be a wrong answer)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    for r in range(tp):
        alloc = VOCAB_PER_RANK + (3 if r == 0 else 0)
        w = torch.randn(alloc, hidden, generator=g, device="cuda").to(torch.bfloat16)
        w[:, ::97] = -0.0  # sanitized to +0.0 by the publish
        out.append((w, r * VOCAB_PER_RANK, VOCAB_PER_RANK))
    return out


# ---------------------------------------------------------------- inputs
def moe_inputs(tp, m, hidden, top_k, seed, wdtype=torch.float32, held=0.7, shared=True):
    """One MoEOutput per rank, generated on the GPU (no host sync): the
    routed rows are a permutation of m*top_k GEMM2 rows, each route held
    with probability ``held`` (else -1); token 0 holds no route on rank 0."""
    from kernels.all_reduce_norm import MoEOutput, RoutedExperts

    g = torch.Generator(device="cuda").manual_seed(seed)
    outs = []
    for r in range(tp):
        rows = m * top_k
        gemm2 = torch.randn(rows, hidden, generator=g, device="cuda").to(torch.bfloat16)
        weights = torch.rand(m, top_k, generator=g, device="cuda").to(wdtype)
        perm = torch.randperm(rows, generator=g, device="cuda").to(torch.int32).view(m, top_k)
        keep = torch.rand(m, top_k, generator=g, device="cuda") < held
        if r == 0:
            keep[0] = False
        idx = torch.where(keep, perm, torch.full_like(perm, -1))
        sh = (torch.randn(m, hidden, generator=g, device="cuda").to(torch.bfloat16)
              if shared else None)
        outs.append(MoEOutput(RoutedExperts(gemm2, weights, idx), sh))
    residual = torch.randn(m, hidden, generator=g, device="cuda").to(torch.bfloat16)
    weight = (1 + 0.1 * torch.randn(hidden, generator=g, device="cuda")).to(torch.bfloat16)
    return outs, residual, weight


def embed_inputs(tp, m, hidden, seed):
    """ids at every shard's edges (start, start + rows - 1), id 0, an id no
    rank owns, and randoms; position 0 on the first token and every 5th."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    vocab = tp * VOCAB_PER_RANK
    edges = [e for r in range(tp) for e in (r * VOCAB_PER_RANK, (r + 1) * VOCAB_PER_RANK - 1)]
    fixed = torch.tensor(edges + [0, vocab + 7], dtype=torch.int32, device="cuda")
    ids = torch.randint(0, vocab, (m,), generator=g, device="cuda", dtype=torch.int32)
    n = min(m, fixed.numel())
    ids[:n] = fixed[torch.randperm(fixed.numel(), generator=g, device="cuda")[:n]]
    positions = torch.randint(1, 4096, (m,), generator=g, device="cuda", dtype=torch.int64)
    positions[::5] = 0
    previous = torch.randn(m, hidden, generator=g, device="cuda").to(torch.bfloat16)
    enorm = (1 + 0.1 * torch.randn(hidden, generator=g, device="cuda")).to(torch.bfloat16)
    hnorm = (1 + 0.1 * torch.randn(hidden, generator=g, device="cuda")).to(torch.bfloat16)
    return ids, positions, previous, enorm, hnorm


# ---------------------------------------------------------------- runs and checks
def run_moe(grp, xs, residual, weight, **kw):
    residuals = [residual.clone() for _ in xs]
    outs = [(poison_(torch.empty_like(residual)), poison_(torch.empty_like(residual)))
            for _ in xs]
    grp(xs, residuals, weight, outs=outs, **kw)
    return outs


def run_embed(grp, ids, positions, previous, enorm, hnorm, **kw):
    outs = [poison_(torch.empty(ids.shape[0], 2 * grp.hidden_size, dtype=torch.bfloat16,
                                device="cuda")) for _ in range(grp.tp)]
    grp.embed_norm(ids, positions, previous, [w for w, _, _ in grp.shards], enorm, hnorm,
                   outs=outs, **kw)
    return outs


def check_moe(outs, xs, residual, weight, what, scale=1.0):
    """residual_out bit-exact against the exact-FMA reference
    (kernels.reference.moe, fma=True) all-reduced in rank order; norm_out
    within 1 ULP of an FP32 RMSNorm of the produced residual_out and of the
    end-to-end reference."""
    payloads = finalize_payloads([x.to_partial() for x in xs], routed_scaling_factor=scale,
                                 fma=True)
    ref_norm, ref_res = all_reduce_norm(payloads, residual, weight, EPS)
    for rank, (norm_out, res_out) in enumerate(outs):
        assert_all_written(norm_out, f"{what} rank {rank} norm_out")
        assert_all_written(res_out, f"{what} rank {rank} residual_out")
        assert_bit_exact(res_out, ref_res, f"{what} rank {rank} residual_out")
        assert_within_ulp(norm_out, rms_norm(res_out, weight, EPS), 1,
                          f"{what} rank {rank} norm_out vs rms_norm(residual_out)")
        assert_within_ulp(norm_out, ref_norm, 1, f"{what} rank {rank} norm_out")
    return payloads


def check_embed(outs, grp, ids, positions, previous, enorm, hnorm, what):
    shards = [(w[:rows], start) for w, start, rows in grp.shards]
    ref = ref_embed_norm(ids, positions, previous, shards, enorm, hnorm, EPS)
    h = grp.hidden_size
    for rank, out in enumerate(outs):
        assert_all_written(out, f"{what} rank {rank} out")
        assert_within_ulp(out[:, :h], ref[:, :h], 1, f"{what} rank {rank} enorm(embedding)")
        assert_within_ulp(out[:, h:], ref[:, h:], 1, f"{what} rank {rank} hnorm(previous)")
        zero = (positions == 0)
        assert bool((out[zero, :h] == 0).all()), f"{what}: embedding not zeroed at position 0"


def assert_clean(grp, what):
    assert grp.is_all_sentinel(), f"{what}: mailbox not all sentinel"
    d = grp.diagnose()
    assert d.ok, f"{what}: {d.summary()}"


# --------------------------------------------------------------- watchdog first
@pytest.mark.parametrize("tp", TPS)
def test_watchdog_variant_smoke(tp):
    """Every kind of call on the watchdog consumer first: a protocol bug in
    a new publish times out here instead of hanging a plain consumer."""
    hidden = 5120
    grp = group(tp, hidden, 8, BUDGET_NS)
    for i, m in enumerate((1, 7, CAPACITY)):
        for wdtype in (torch.float32, torch.bfloat16):
            xs, residual, weight = moe_inputs(tp, m, hidden, 8, seed=i, wdtype=wdtype)
            outs = run_moe(grp, xs, residual, weight)
            torch.cuda.synchronize()
            assert_clean(grp, f"watchdog smoke tp={tp} M={m} {wdtype}")
            check_moe(outs, xs, residual, weight, f"watchdog smoke tp={tp} M={m}")
        e = embed_inputs(tp, m, hidden, seed=i)
        outs = run_embed(grp, *e)
        torch.cuda.synchronize()
        assert_clean(grp, f"watchdog smoke embed tp={tp} M={m}")
        check_embed(outs, grp, *e, f"watchdog smoke embed tp={tp} M={m}")


def test_embed_norm_watchdog_names_the_rank_that_skipped():
    tp, hidden, m = 4, 4096, 16
    grp = group(tp, hidden, 8, BUDGET_NS)
    grp.recover()
    e = embed_inputs(tp, m, hidden, seed=21)
    check_embed(run_embed(grp, *e), grp, *e, "before fault")
    torch.cuda.synchronize()
    assert_clean(grp, "before fault")
    t0 = time.perf_counter()
    outs = run_embed(grp, *e, skip_publish=(2,))
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    d = grp.diagnose()
    print(f"\nembed-norm watchdog: budget {BUDGET_NS / 1e6:.0f} ms, skipped-publish call "
          f"returned in {elapsed * 1e3:.1f} ms; diagnosis: {d.summary()}; records per rank: "
          f"{[x.count for x in grp.errors()]}")
    assert elapsed < 10 * BUDGET_NS / 1e9 + 1.0
    assert d.missing_ranks == {2} and d.stale_ranks == {2}, d.summary()
    assert "missing ranks: {2}" in d.summary()
    ids, positions, previous, enorm, hnorm = e
    ref = ref_embed_norm(ids, positions, previous,
                         [(w[:r], s) for w, s, r in grp.shards], enorm, hnorm, EPS)
    for rank, out in enumerate(outs):
        assert_all_written(out, f"timeout rank {rank}")
        assert torch.isnan(out[:, :hidden].float()).all(), "timed-out embedding must be NaN"
        assert_within_ulp(out[:, hidden:], ref[:, hidden:], 1, "hnorm half after a timeout")
    grp.recover()
    assert_clean(grp, "after recover")
    xs, residual, weight = moe_inputs(tp, m, hidden, 8, seed=22)
    check_moe(run_moe(grp, xs, residual, weight), xs, residual, weight, "finalize after recover")
    check_embed(run_embed(grp, *e), grp, *e, "embed after recover")
    torch.cuda.synchronize()
    assert_clean(grp, "after recover")


# --------------------------------------------------------------- contract sweep
@sweep.parametrize("tp, hidden", TPS, HIDDENS, default=lambda tp, hidden: hidden == 7168)
def test_contract(tp, hidden):
    """tp x hidden x top_k {1, 6, 8} x tokens {1, 7, 16, 64} x FP32/BF16
    weights (with -1 routes) for the finalize, tokens x shard-edge ids for
    the embedding."""
    for top_k in TOP_KS:
        grp = group(tp, hidden, top_k)
        for i, m in enumerate(TOKENS):
            for wdtype in (torch.float32, torch.bfloat16):
                what = f"tp={tp} H={hidden} top_k={top_k} M={m} {wdtype}"
                xs, residual, weight = moe_inputs(tp, m, hidden, top_k,
                                                  seed=1000 * tp + 10 * top_k + i,
                                                  wdtype=wdtype)
                outs = run_moe(grp, xs, residual, weight)
                torch.cuda.synchronize()
                check_moe(outs, xs, residual, weight, what)
                assert grp.is_all_sentinel(), f"{what}: mailbox not all sentinel"
            if top_k == 8:
                e = embed_inputs(tp, m, hidden, seed=i)
                outs = run_embed(grp, *e)
                torch.cuda.synchronize()
                check_embed(outs, grp, *e, f"embed tp={tp} H={hidden} M={m}")
                assert grp.is_all_sentinel(), f"embed tp={tp} H={hidden} M={m}: not sentinel"
        assert grp.diagnose().ok


def test_fma_reference_matters():
    """The exact-FMA reference is what the kernel computes; a separately
    rounded multiply-add reference is not (on these inputs)."""
    tp, hidden, m, top_k = 1, 7168, 64, 8
    grp = group(tp, hidden, top_k)
    xs, residual, _ = moe_inputs(tp, m, hidden, top_k, seed=77, held=1.0)
    zero = torch.zeros_like(residual)
    weight = torch.ones(hidden, dtype=torch.bfloat16, device="cuda")
    outs = run_moe(grp, xs, zero, weight)
    torch.cuda.synchronize()
    fma = finalize_payloads([x.to_partial() for x in xs], fma=True)[0]
    no_fma = finalize_payloads([x.to_partial() for x in xs], fma=False)[0]
    got = outs[0][1]
    same = (bits(got) == bits(fma)) | ((got == 0) & (fma == 0))
    assert bool(same.all())
    differ = int((bits(no_fma) != bits(fma)).sum())
    print(f"\nfma=True reference bit-exact; fma=False reference differs in {differ} of "
          f"{fma.numel()} payload elements")


@pytest.mark.parametrize("tuning_args", [
    dict(elements_per_thread=8),
    dict(elements_per_thread=4, prefetch_group=1),
    dict(elements_per_thread=8, prefetch_group=3, load_shared_before_pdl=True),
    dict(elements_per_thread=4, load_shared_before_pdl=True),
])
def test_tunings_scaling_and_no_shared_expert(tuning_args):
    from kernels.all_reduce_norm import FinalizeTuning

    tp, hidden = 2, 7168
    for top_k, scale in ((8, 2.5), (6, 1.0)):
        grp = group(tp, hidden, top_k, 0, scale, FinalizeTuning(**tuning_args))
        for m in (1, 16, CAPACITY):
            for wdtype in (torch.float32, torch.bfloat16):
                for shared in (True, False):
                    what = f"{tuning_args} top_k={top_k} scale={scale} M={m} {wdtype} shared={shared}"
                    xs, residual, weight = moe_inputs(tp, m, hidden, top_k, seed=m,
                                                      wdtype=wdtype, shared=shared)
                    outs = run_moe(grp, xs, residual, weight)
                    torch.cuda.synchronize()
                    check_moe(outs, xs, residual, weight, what, scale=scale)
                    assert grp.is_all_sentinel(), what


# --------------------------------------------------------------- no host sync
@pytest.mark.parametrize("tp", [2, 8])
def test_mixed_calls_without_host_sync(tp):
    """120 calls on one instance, plain / finalize FP32 / embed / finalize
    BF16 interleaved with varying token counts, no host sync in between;
    residual_out fed back as the next residual."""
    hidden, calls = 4096, 120
    grp = group(tp, hidden, 8)
    pattern = (27, 11, 64, 1, 16, 7, 2)
    g = torch.Generator(device="cuda").manual_seed(9)
    weight = (1 + 0.1 * torch.randn(hidden, generator=g, device="cuda")).to(torch.bfloat16)
    residual = torch.randn(CAPACITY, hidden, generator=g, device="cuda").to(torch.bfloat16)
    history = []
    for call in range(calls):
        m = pattern[call % len(pattern)]
        kind = ("plain", "moe32", "embed", "moe16")[call % 4]
        if kind == "embed":
            e = embed_inputs(tp, m, hidden, seed=call)
            outs = [torch.empty(m, 2 * hidden, dtype=torch.bfloat16, device="cuda")
                    for _ in range(tp)]
            grp.embed_norm(*e[:3], [w for w, _, _ in grp.shards], *e[3:], outs=outs)
            history.append((kind, e, outs))
            continue
        if kind == "plain":
            xs = [torch.randn(m, hidden, generator=g, device="cuda").to(torch.bfloat16)
                  for _ in range(tp)]
        else:
            xs, _, _ = moe_inputs(tp, m, hidden, 8, seed=call,
                                  wdtype=torch.float32 if kind == "moe32" else torch.bfloat16)
        res_in = residual[:m].contiguous()
        outs = [(torch.empty(m, hidden, dtype=torch.bfloat16, device="cuda"),
                 torch.empty(m, hidden, dtype=torch.bfloat16, device="cuda"))
                for _ in range(tp)]
        grp(xs, [res_in] * tp, weight, outs=outs)
        history.append((kind, (xs, res_in), outs))
        residual = torch.cat([outs[0][1], residual[m:]]) if m < CAPACITY else outs[0][1]
    torch.cuda.synchronize()
    for call, (kind, args, outs) in enumerate(history):
        if kind == "embed":
            check_embed(outs, grp, *args, f"call {call} embed")
        elif kind == "plain":
            xs, res_in = args
            ref_norm, ref_res = all_reduce_norm(xs, res_in, weight, EPS)
            for rank, (n, r) in enumerate(outs):
                assert_bit_exact(r, ref_res, f"call {call} plain rank {rank} residual_out")
                assert_within_ulp(n, ref_norm, 1, f"call {call} plain rank {rank} norm_out")
        else:
            xs, res_in = args
            check_moe(outs, xs, res_in, weight, f"call {call} {kind}")
    assert_clean(grp, f"after {calls} mixed calls")
    stages = {tuple(r.mailbox.stage_state.tolist()) for r in grp.ranks}
    assert len(stages) == 1, stages


# --------------------------------------------------------------- CUDA graphs
def test_cuda_graph_replay_with_new_data():
    """One graph holding a finalize call and an embed call (and a plain one);
    replays with new data equal eager calls bit for bit and the references."""
    tp, hidden, m, top_k = 4, 5120, 16, 8
    grp = group(tp, hidden, top_k)
    xs, residual, weight = moe_inputs(tp, m, hidden, top_k, seed=3)
    e = embed_inputs(tp, m, hidden, seed=3)
    plain = [torch.randn(m, hidden, device="cuda").to(torch.bfloat16) for _ in range(tp)]
    s_res = [residual.clone() for _ in range(tp)]
    s_moe_out = [(torch.empty_like(residual), torch.empty_like(residual)) for _ in range(tp)]
    s_plain_out = [(torch.empty_like(residual), torch.empty_like(residual)) for _ in range(tp)]
    s_emb_out = [torch.empty(m, 2 * hidden, dtype=torch.bfloat16, device="cuda")
                 for _ in range(tp)]
    weights = [w for w, _, _ in grp.shards]

    def step():
        grp(xs, s_res, weight, outs=s_moe_out)
        grp.embed_norm(*e[:3], weights, *e[3:], outs=s_emb_out)
        grp(plain, s_res, weight, outs=s_plain_out)

    step()  # warm-up (module load)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed in range(30, 35):
        new_xs, new_res, _ = moe_inputs(tp, m, hidden, top_k, seed=seed,
                                        wdtype=torch.float32)
        for s, n in zip(xs, new_xs):
            for a, b in zip(s.tensors(), n.tensors()):
                a.copy_(b)
        for s in s_res:
            s.copy_(new_res)
        for a, b in zip(e, embed_inputs(tp, m, hidden, seed=seed)):
            a.copy_(b)
        for p in plain:
            p.copy_(torch.randn_like(p, dtype=torch.float32).to(torch.bfloat16))
        for t in [*(o for pr in s_moe_out + s_plain_out for o in pr), *s_emb_out]:
            poison_(t)
        graph.replay()
        torch.cuda.synchronize()
        eager_moe = run_moe(grp, xs, new_res, weight)
        eager_emb = run_embed(grp, *e)
        torch.cuda.synchronize()
        for rank in range(tp):
            assert_bit_exact(s_moe_out[rank][0], eager_moe[rank][0], f"graph moe norm {rank}")
            assert_bit_exact(s_moe_out[rank][1], eager_moe[rank][1], f"graph moe res {rank}")
            assert_bit_exact(s_emb_out[rank], eager_emb[rank], f"graph embed rank {rank}")
        check_moe(s_moe_out, xs, new_res, weight, f"graph seed {seed}")
        check_embed(s_emb_out, grp, *e, f"graph embed seed {seed}")
        ref_norm, ref_res = all_reduce_norm(plain, new_res, weight, EPS)
        for n, r in s_plain_out:
            assert_bit_exact(r, ref_res, f"graph plain seed {seed}")
        assert_clean(grp, f"graph seed {seed}")


# --------------------------------------------------------------- single rank API
def test_single_rank_api():
    from kernels.all_reduce_norm import AllReduceNorm

    hidden, m = 7168, 8
    op = AllReduceNorm(hidden_size=hidden, max_num_tokens=CAPACITY, eps=EPS, top_k=6)
    xs, residual, weight = moe_inputs(1, m, hidden, 6, seed=8, wdtype=torch.bfloat16)
    norm_out, res_out = op(xs[0], residual, weight)
    torch.cuda.synchronize()
    check_moe([(norm_out, res_out)], xs, residual, weight, "tp=1 __call__(MoEOutput)")
    (w, start, rows), = make_shards(1, hidden)
    op.prepare_embedding(w, start, rows)
    ids, positions, previous, enorm, hnorm = embed_inputs(1, m, hidden, seed=8)
    out = op.embed_norm(ids, positions, previous, w, enorm, hnorm)
    torch.cuda.synchronize()
    ref = ref_embed_norm(ids, positions, previous, [(w[:rows], start)], enorm, hnorm, EPS)
    assert_within_ulp(out, ref, 1, "tp=1 embed_norm")
    assert op.mailbox.is_all_sentinel()
    with pytest.raises(ValueError, match=r"expert_weights must have shape \[\*, top_k=6\]"):
        bad, _, _ = moe_inputs(1, m, hidden, 8, seed=1)
        op(bad[0], residual, weight)
    with pytest.raises(ValueError, match="was not prepared"):
        op.embed_norm(ids, positions, previous, w.clone(), enorm, hnorm)
    with pytest.raises(ValueError, match="positions must be torch.int64"):
        op.embed_norm(ids, positions.int(), previous, w, enorm, hnorm)
    assert op.mailbox.is_all_sentinel() and op.diagnose().ok
    # all-reduce of a single rank: the sum is the payload itself
    assert bool((all_reduce_sum([res_out]) == res_out).all())
