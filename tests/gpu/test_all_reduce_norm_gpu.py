"""AllReduceNorm on one GPU with virtual ranks (tp ranks, one stream each).

Run under a process timeout: a plain consumer whose data never arrives
spins forever. The watchdog tests run first.
    timeout 500 python -m pytest -m gpu tests/gpu/test_all_reduce_norm_gpu.py
"""

from __future__ import annotations

import functools
import time

import pytest
import torch

from kernels.reference.allreduce import all_reduce_norm, all_reduce_sum, rms_norm
from kernels.reference.numerics import (assert_all_written, assert_bit_exact,
                                        assert_within_ulp, bits, poison_,
                                        order_sensitive_partials, random_partials,
                                        sentinel_pattern_partials)

pytestmark = pytest.mark.gpu

EPS = 1e-6
CAPACITY = 96
TPS = (1, 2, 4, 8)
HIDDENS = (2560, 4096, 5120, 7168, 8192)
TOKENS = (1, 2, 7, 16, 64, CAPACITY)
BUDGET_NS = 50_000_000  # 50 ms


@functools.lru_cache(maxsize=None)
def group(tp: int, hidden: int, budget_ns: int = 0, capacity: int = CAPACITY):
    from kernels.all_reduce_norm import AllReduceNorm

    return AllReduceNorm.virtual_ranks(tp=tp, hidden_size=hidden, max_num_tokens=capacity,
                                       eps=EPS, budget_ns=budget_ns)


def inputs(tp, m, hidden, seed, kind="random"):
    if kind == "random":
        xs = random_partials(tp, m, hidden, seed=seed, device="cuda")
    elif kind == "order":
        xs = order_sensitive_partials(tp, m, hidden, device="cuda")
    else:
        xs = sentinel_pattern_partials(tp, m, hidden, seed=seed, device="cuda")
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    residual = torch.randn(m, hidden, generator=g).to(torch.bfloat16).cuda()
    weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(torch.bfloat16).cuda()
    return [x.contiguous() for x in xs], residual, weight


def run(grp, xs, residual, weight, **kw):
    tp = len(xs)
    residuals = [residual.clone() for _ in range(tp)]
    outs = [(poison_(torch.empty_like(residual)), poison_(torch.empty_like(residual)))
            for _ in range(tp)]
    grp(xs, residuals, weight, outs=outs, **kw)
    return outs


def check(outs, xs, residual, weight, what):
    ref_norm, ref_res = all_reduce_norm(xs, residual, weight, EPS)
    for rank, (norm_out, res_out) in enumerate(outs):
        assert_all_written(norm_out, f"{what} rank {rank} norm_out")
        assert_all_written(res_out, f"{what} rank {rank} residual_out")
        assert_bit_exact(res_out, ref_res, f"{what} rank {rank} residual_out")
        # Stage by stage: the norm of the produced pre-norm values ...
        assert_within_ulp(norm_out, rms_norm(res_out, weight, EPS), 1,
                          f"{what} rank {rank} norm_out vs rms_norm(residual_out)")
        # ... and end to end.
        assert_within_ulp(norm_out, ref_norm, 1, f"{what} rank {rank} norm_out")


# --------------------------------------------------------------- watchdog first
def test_watchdog_names_the_rank_that_skipped_then_recovers():
    tp, hidden, m = 4, 4096, 16
    grp = group(tp, hidden, BUDGET_NS)
    xs, residual, weight = inputs(tp, m, hidden, seed=11)
    check(run(grp, xs, residual, weight), xs, residual, weight, "before fault")
    assert grp.diagnose().ok
    t0 = time.perf_counter()
    outs = run(grp, xs, residual, weight, skip_publish=(2,))
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    assert elapsed < 10 * BUDGET_NS / 1e9 + 1.0, f"watchdog call took {elapsed:.3f} s"
    d = grp.diagnose()
    print(f"\nwatchdog: budget {BUDGET_NS / 1e6:.0f} ms, skipped-publish call returned "
          f"in {elapsed * 1e3:.1f} ms; diagnosis: {d.summary()}; records per rank: "
          f"{[e.count for e in grp.errors()]}")
    assert d.missing_ranks == {2}, d.summary()
    assert d.stale_ranks == {2}, d.summary()
    assert "missing ranks: {2}" in d.summary()
    errors = grp.errors()
    for e in errors:
        assert e.count > 0 and e.records, e
    for rank, (norm_out, res_out) in enumerate(outs):
        assert_all_written(norm_out, f"timeout rank {rank} norm_out")
        assert torch.isnan(norm_out.float()).all(), "a timed-out token's norm must be NaN"
    assert not grp.is_all_sentinel(), "late/unconsumed writes expected before recover()"
    grp.recover()
    assert grp.is_all_sentinel() and grp.diagnose().ok
    xs, residual, weight = inputs(tp, m, hidden, seed=12)
    check(run(grp, xs, residual, weight), xs, residual, weight, "after recover")
    torch.cuda.synchronize()
    assert grp.is_all_sentinel()


def test_corrupt_stage_is_flagged_without_wild_stores():
    tp, hidden, m = 2, 2560, 4
    grp = group(tp, hidden, BUDGET_NS)
    grp.recover()
    xs, residual, weight = inputs(tp, m, hidden, seed=31)
    grp.ranks[1].mailbox.stage_state[1] = 7  # NEXT_STAGE out of range
    outs = run(grp, xs, residual, weight)
    torch.cuda.synchronize()
    d = grp.diagnose()
    print(f"\ncorrupt stage: {d.summary()}")
    assert d.bad_stage_ranks == {1} and d.kind == "bad_stage", d.summary()
    assert "stage_state corrupt on rank 1" in d.summary()
    assert grp.ranks[1].mailbox.stage_state.tolist()[0] == 7
    for r in grp.ranks:  # rank 1 stored nothing anywhere
        plane = r.mailbox.buffer[:, 1].view(torch.int16)
        assert bool((plane == -32768).all()), f"rank 1 wrote into rank {r.rank}'s mailbox"
    assert torch.isnan(outs[1][0].float()).all() and torch.isnan(outs[1][1].float()).all()
    grp.recover()
    check(run(grp, xs, residual, weight), xs, residual, weight, "after corrupt-stage recover")
    torch.cuda.synchronize()
    assert grp.is_all_sentinel() and grp.diagnose().ok


def test_unsanitized_lane_is_reported_apart_from_missing():
    hidden, m = 2560, 3
    grp = group(1, hidden, BUDGET_NS)
    grp.recover()
    xs, residual, weight = inputs(1, m, hidden, seed=41)
    stage = grp.ranks[0].mailbox.stage_state.tolist()[0]
    payload = xs[0].clone()
    payload[payload == 0] = 1.0
    payload[1, 11] = -0.0  # token 1, fragment 1: one sentinel lane, seven written
    grp.ranks[0].mailbox.buffer[stage, 0, :m].copy_(payload)
    outs = run(grp, xs, residual, weight, skip_publish=(0,))
    torch.cuda.synchronize()
    d = grp.diagnose()
    print(f"\nunsanitized: {d.summary()}")
    assert d.unsanitized_ranks == {0} and not d.missing_ranks, d.summary()
    (rec,) = grp.errors()[0].records
    assert (rec.token, rec.source, rec.fragment) == (1, 0, 1) and not rec.missing
    assert torch.isnan(outs[0][0][1].float()).all()
    assert not torch.isnan(outs[0][0][0].float()).any()
    grp.recover()


@pytest.mark.parametrize("kind", ["sentinel", "order"])
def test_sentinel_like_payload_and_order(kind):
    tp, hidden = 4, 5120
    grp = group(tp, hidden, BUDGET_NS)
    for m in (1, 7, CAPACITY):
        xs, residual, weight = inputs(tp, m, hidden, seed=m, kind=kind)
        outs = run(grp, xs, residual, weight)
        torch.cuda.synchronize()
        assert grp.diagnose().ok, grp.diagnose().summary()
        check(outs, xs, residual, weight, f"{kind} M={m}")
        assert grp.is_all_sentinel()
        # Zero residual: residual_out is the sum itself (up to the sign of zero).
        zero = torch.zeros_like(residual)
        outs = run(grp, xs, zero, weight)
        expected = all_reduce_sum(xs)
        got = outs[0][1]
        same = (bits(got) == bits(expected)) | ((got == 0) & (expected == 0))
        assert bool(same.all()), f"{kind} M={m}: sum mismatch"
        if kind == "order":  # the check can see a wrong rank order
            swapped = all_reduce_sum(xs, order=list(reversed(range(tp))))
            assert not torch.equal(bits(swapped), bits(expected))


# --------------------------------------------------------------- contract sweep
@pytest.mark.parametrize("hidden", HIDDENS)
@pytest.mark.parametrize("tp", TPS)
def test_contract(tp, hidden):
    grp = group(tp, hidden)
    for i, m in enumerate(TOKENS):
        xs, residual, weight = inputs(tp, m, hidden, seed=100 * tp + i)
        outs = run(grp, xs, residual, weight)
        torch.cuda.synchronize()
        check(outs, xs, residual, weight, f"tp={tp} H={hidden} M={m}")
        assert grp.is_all_sentinel(), f"tp={tp} H={hidden} M={m}: mailbox not all sentinel"


def test_hidden_3584_partial_publish_cta():
    tp, hidden = 2, 3584
    grp = group(tp, hidden)
    for m in (1, 7, CAPACITY):
        xs, residual, weight = inputs(tp, m, hidden, seed=m)
        outs = run(grp, xs, residual, weight)
        torch.cuda.synchronize()
        check(outs, xs, residual, weight, f"H=3584 M={m}")
        assert grp.is_all_sentinel()


# --------------------------------------------------------------- no host sync
@pytest.mark.parametrize("tp", [2, 8])
def test_many_calls_without_host_sync(tp):
    hidden, calls = 4096, 120
    grp = group(tp, hidden)
    pattern = (27, 11, 24, CAPACITY, 1, 64, 2)
    g = torch.Generator(device="cpu").manual_seed(7)
    weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(torch.bfloat16).cuda()
    residual = torch.randn(CAPACITY, hidden, generator=g).to(torch.bfloat16).cuda()
    residuals = [residual.clone() for _ in range(tp)]
    history = []
    for call in range(calls):
        m = pattern[call % len(pattern)]
        xs = [x.contiguous() for x in random_partials(tp, m, hidden, seed=call, device="cuda")]
        res_in = [r[:m].contiguous() if r.shape[0] != m else r for r in residuals]
        outs = [(torch.empty(m, hidden, dtype=torch.bfloat16, device="cuda"),
                 torch.empty(m, hidden, dtype=torch.bfloat16, device="cuda")) for _ in range(tp)]
        grp(xs, res_in, weight, outs=outs)
        history.append((xs, res_in, outs))
        # Feed residual_out back (padded to capacity with the old tail).
        residuals = [torch.cat([o[1], r[m:]]) if m < CAPACITY else o[1]
                     for o, r in zip(outs, residuals)]
    torch.cuda.synchronize()
    for call, (xs, res_in, outs) in enumerate(history):
        check(outs, xs, res_in[0], weight, f"call {call}")
    assert grp.is_all_sentinel()
    stages = {tuple(r.mailbox.stage_state.tolist()) for r in grp.ranks}
    assert len(stages) == 1, stages


# --------------------------------------------------------------- CUDA graphs
def test_cuda_graph_replay_matches_eager():
    tp, hidden, m = 4, 5120, 16
    grp = group(tp, hidden)
    xs, residual, weight = inputs(tp, m, hidden, seed=3)
    static_x = [x.clone() for x in xs]
    static_res = [residual.clone() for _ in range(tp)]
    static_out = [(torch.empty_like(residual), torch.empty_like(residual)) for _ in range(tp)]
    grp(static_x, static_res, weight, outs=static_out)  # warm-up (module load)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grp(static_x, static_res, weight, outs=static_out)
    for seed in range(20, 26):
        new_x, new_res, _ = inputs(tp, m, hidden, seed=seed)
        for s, n in zip(static_x, new_x):
            s.copy_(n)
        for s in static_res:
            s.copy_(new_res)
        for a, b in static_out:
            poison_(a), poison_(b)
        graph.replay()
        torch.cuda.synchronize()
        eager = run(grp, new_x, new_res, weight)
        torch.cuda.synchronize()
        for rank in range(tp):
            assert_bit_exact(static_out[rank][0], eager[rank][0], f"graph norm_out rank {rank}")
            assert_bit_exact(static_out[rank][1], eager[rank][1], f"graph residual_out rank {rank}")
        check(static_out, new_x, new_res, weight, f"graph seed {seed}")
        assert grp.is_all_sentinel()


def test_single_rank_call_api():
    from kernels.all_reduce_norm import AllReduceNorm

    op = AllReduceNorm(hidden_size=5120, max_num_tokens=64, eps=EPS)
    xs, residual, weight = inputs(1, 8, 5120, seed=5)
    norm_out, res_out = op(xs[0], residual, weight)
    torch.cuda.synchronize()
    check([(norm_out, res_out)], xs, residual, weight, "tp=1 __call__")
    with pytest.raises(ValueError, match="x.shape"):
        op(torch.empty(65, 5120, dtype=torch.bfloat16, device="cuda"),
           torch.empty(65, 5120, dtype=torch.bfloat16, device="cuda"), weight)


def test_symmetric_memory_group_of_one():
    """The process-group placement (torch symmetric memory) with world size 1."""
    import os
    import socket

    import torch.distributed as dist

    from kernels.all_reduce_norm import AllReduceNorm

    created = False
    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("nccl", rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
        created = True
    try:
        op = AllReduceNorm(hidden_size=4096, max_num_tokens=32, eps=EPS,
                           group=dist.group.WORLD, budget_ns=BUDGET_NS)
        assert op.tp == 1 and op.rank == 0
        for m in (1, 32, 5):
            xs, residual, weight = inputs(1, m, 4096, seed=m)
            out = (poison_(torch.empty_like(residual)), poison_(torch.empty_like(residual)))
            op(xs[0], residual, weight, out=out)
            torch.cuda.synchronize()
            check([out], xs, residual, weight, f"symmetric M={m}")
            assert op.mailbox.is_all_sentinel()
        assert op.diagnose().ok
        op.recover()
    finally:
        if created:
            dist.destroy_process_group()
