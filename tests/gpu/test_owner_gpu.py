"""Owner mode (``AllReduceNorm(mode="owner")``: reduce-scatter + residual add +
RMSNorm) on the GPU: virtual ranks at tp 1, 2, 4, 8 on one GPU, and a tp=2
process-per-GPU group where two GPUs are present (``multigpu``).

Owner ``o`` gets ``[ceil(M / tp), hidden]`` rows, row ``j`` = token ``j * tp
+ o``; each is checked against :func:`kernels.reference.allreduce.
owner_all_reduce_norm` (the one-shot reference's rows for the owned tokens):
residual_out bit-exact, norm_out within 1 ULP of an FP32 RMSNorm of the
produced residual_out and of the end-to-end reference, every output element
written (poisoned before each call), the mailbox all sentinel afterwards.

Every group here uses the watchdog consumer, so a protocol bug is a
diagnosed timeout, not a hang; still run the file under a process timeout:
    timeout 600 python -m pytest -m gpu -x -q tests/gpu/test_owner_gpu.py
"""

from __future__ import annotations

import functools
import os
import time

import pytest

import torch

from kernels.lamport.protocol import owned_tokens, owner_rows
from kernels.reference.allreduce import owner_all_reduce_norm, owner_view, rms_norm
from kernels.reference.moe import finalize_payloads
from kernels.reference.numerics import (assert_all_written, assert_bit_exact,
                                        assert_within_ulp, bits, poison_)
from test_all_reduce_norm_gpu import inputs  # tests/gpu is on sys.path under pytest
from test_finalize_embed_gpu import moe_inputs as finalize_moe_inputs
from tests.gpu import sweep

pytestmark = pytest.mark.gpu

EPS = 1e-6
CAPACITY = 300  # not a multiple of any tp; owner capacity 300, 150, 75, 38
TPS = (1, 2, 4, 8)
HIDDENS = (2560, 5120, 7168)
TOKENS = (1, 2, 7, 16, 64, 256, CAPACITY)
BUDGET_NS = 200_000_000  # 200 ms


@functools.lru_cache(maxsize=None)
def group(tp: int, hidden: int, top_k: int | None = None, tuning=None,
          budget_ns: int = BUDGET_NS):
    from kernels.all_reduce_norm import AllReduceNorm

    return AllReduceNorm.virtual_ranks(tp=tp, hidden_size=hidden, max_num_tokens=CAPACITY,
                                       eps=EPS, budget_ns=budget_ns, mode="owner",
                                       top_k=top_k, finalize_tuning=tuning)


def partials(tp, m, hidden, seed, kind="random"):
    """Every rank's ``[M, hidden]`` partial (random, order-sensitive or
    sentinel-pattern), as the one-shot GPU tests make them."""
    return inputs(tp, m, hidden, seed, kind)[0]


def shared_inputs(m, hidden, seed):
    """The full-M residual (each owner passes its rows) and the norm weight."""
    return inputs(1, m, hidden, seed)[1:]


def run(grp, xs, residual, weight, **kw):
    """One call of every rank: owner r passes ``owner_view(residual, tp, r)``;
    returns every rank's poisoned-then-written ``(norm_out, residual_out)``."""
    tp = grp.tp
    rows = owner_rows(residual.shape[0], tp)
    residuals = [owner_view(residual, tp, r).contiguous() for r in range(tp)]
    outs = [tuple(poison_(torch.empty(rows, residual.shape[1], dtype=torch.bfloat16,
                                      device="cuda")) for _ in range(2)) for _ in range(tp)]
    grp(xs, residuals, weight, outs=outs, **kw)
    return outs


def check(outs, payloads, residual, weight, what):
    """Every owner's rows against the owner reference (see the module
    docstring); ``payloads``: every rank's BF16 contribution [tp, M, H]."""
    tp = len(outs)
    m = residual.shape[0]
    for rank, (norm_out, res_out) in enumerate(outs):
        w = f"{what} owner {rank}"
        ref_norm, ref_res = owner_all_reduce_norm(payloads, owner_view(residual, tp, rank),
                                                  weight, EPS, owner=rank)
        assert_all_written(norm_out, f"{w} norm_out")
        assert_all_written(res_out, f"{w} residual_out")
        assert_bit_exact(res_out, ref_res, f"{w} residual_out")
        assert_within_ulp(norm_out, rms_norm(res_out, weight, EPS), 1,
                          f"{w} norm_out vs rms_norm(residual_out)")
        assert_within_ulp(norm_out, ref_norm, 1, f"{w} norm_out")
        count = len(owned_tokens(m, tp, rank))
        assert not bits(res_out[count:]).any() and not bits(norm_out[count:]).any(), \
            f"{w}: rows holding no token must be +0.0"


def assert_clean(grp, what):
    d = grp.diagnose()
    assert d.ok, f"{what}: {d.summary()}"
    assert grp.is_all_sentinel(), f"{what}: mailbox not all sentinel"


# --------------------------------------------------------------- watchdog smoke first
@pytest.mark.parametrize("tp", TPS)
def test_watchdog_smoke(tp):
    """A few calls per tp first: a broken publish or consumer times out here
    (diagnosed) before the sweeps."""
    hidden = 5120
    grp = group(tp, hidden)
    for i, m in enumerate((1, 7, CAPACITY)):
        xs = partials(tp, m, hidden, seed=i)
        residual, weight = shared_inputs(m, hidden, seed=i)
        outs = run(grp, xs, residual, weight)
        torch.cuda.synchronize()
        assert_clean(grp, f"smoke tp={tp} M={m}")
        check(outs, xs, residual, weight, f"smoke tp={tp} M={m}")


@pytest.mark.parametrize("tp, m", [(4, 16), (8, 3), (2, 7)])
def test_skipped_publish_is_diagnosed_then_recovers(tp, m):
    """A rank that skips its publish: every owner's spin on it gives up at
    the budget, the diagnosis names it (missing and stale), its rows are NaN;
    after recover() the next call is bit-exact. (8, 3): M < tp, so owners 3..7
    own no token and wait only on the padding row 0 every rank publishes."""
    hidden = 4096
    grp = group(tp, hidden)
    grp.recover()
    skip = tp - 2 if tp > 2 else 1
    xs = partials(tp, m, hidden, seed=11)
    residual, weight = shared_inputs(m, hidden, seed=11)
    check(run(grp, xs, residual, weight), xs, residual, weight, "before fault")
    t0 = time.perf_counter()
    outs = run(grp, xs, residual, weight, skip_publish=(skip,))
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    d = grp.diagnose()
    print(f"\nowner watchdog tp={tp} M={m}: budget {BUDGET_NS / 1e6:.0f} ms, skipped-publish "
          f"call returned in {elapsed * 1e3:.1f} ms; diagnosis: {d.summary()}; records per "
          f"rank: {[e.count for e in grp.errors()]}")
    assert elapsed < 10 * BUDGET_NS / 1e9 + 1.0, f"watchdog call took {elapsed:.3f} s"
    assert d.missing_ranks == {skip} and d.stale_ranks == {skip}, d.summary()
    assert f"missing ranks: {{{skip}}}" in d.summary()
    for rank, (norm_out, res_out) in enumerate(outs):
        assert_all_written(norm_out, f"timeout owner {rank} norm_out")
        count = len(owned_tokens(m, tp, rank))
        if count:
            assert torch.isnan(norm_out[:count].float()).all(), \
                f"owner {rank}: a timed-out token's norm must be NaN"
    for e in grp.errors():
        for rec in e.records:  # records carry token ids, not owned rows
            assert rec.token % tp == e.rank and rec.token < max(m, tp), rec
    grp.recover()
    assert_clean(grp, "after recover")
    xs = partials(tp, m, hidden, seed=12)
    check(run(grp, xs, residual, weight), xs, residual, weight, "after recover")
    torch.cuda.synchronize()
    assert_clean(grp, "after recover")


def test_corrupt_stage_is_flagged_without_wild_stores():
    tp, hidden, m = 2, 2560, 5
    grp = group(tp, hidden)
    grp.recover()
    xs = partials(tp, m, hidden, seed=31)
    residual, weight = shared_inputs(m, hidden, seed=31)
    grp.ranks[1].mailbox.stage_state[1] = 7  # NEXT_STAGE out of range
    outs = run(grp, xs, residual, weight)
    torch.cuda.synchronize()
    d = grp.diagnose()
    assert d.bad_stage_ranks == {1} and d.kind == "bad_stage", d.summary()
    assert "stage_state corrupt on rank 1" in d.summary()
    for r in grp.ranks:  # rank 1 stored nothing anywhere
        plane = r.mailbox.buffer[:, 1].view(torch.int16)
        assert bool((plane == -32768).all()), f"rank 1 wrote into rank {r.rank}'s mailbox"
    assert torch.isnan(outs[1][0].float()).all()
    grp.recover()
    check(run(grp, xs, residual, weight), xs, residual, weight, "after corrupt-stage recover")
    torch.cuda.synchronize()
    assert_clean(grp, "after corrupt-stage recover")


# --------------------------------------------------------------- contract sweep
@sweep.parametrize("tp, hidden", TPS, HIDDENS, default=lambda tp, hidden: hidden == 7168)
def test_contract(tp, hidden):
    grp = group(tp, hidden)
    for i, m in enumerate(TOKENS):
        for kind in ("random", "order", "sentinel") if m in (7, CAPACITY) else ("random",):
            what = f"tp={tp} H={hidden} M={m} {kind}"
            xs = partials(tp, m, hidden, seed=100 * tp + i, kind=kind)
            residual, weight = shared_inputs(m, hidden, seed=i)
            outs = run(grp, xs, residual, weight)
            torch.cuda.synchronize()
            assert_clean(grp, what)
            check(outs, xs, residual, weight, what)


# --------------------------------------------------------------- MoE finalize
def moe_inputs(tp, m, hidden, top_k, seed, wdtype=torch.float32, held=0.7, shared=True):
    """One MoEOutput per rank, as the one-shot finalize GPU tests make them."""
    return finalize_moe_inputs(tp, m, hidden, top_k, seed, wdtype, held, shared)[0]


TUNINGS = (
    dict(elements_per_thread=4),
    dict(elements_per_thread=8),
    dict(elements_per_thread=4, load_shared_before_pdl=True, prefetch_group=1),
    dict(elements_per_thread=8, load_shared_before_pdl=True),
)


@sweep.parametrize("tp, tuning_args",
                   [(tp, t) for tp in TPS for t in TUNINGS if tp in (2, 8) or t is TUNINGS[0]],
                   default=lambda tp, tuning_args: tp in (2, 8) and tuning_args is TUNINGS[0])
def test_finalize_owner(tp, tuning_args):
    """The owner finalize publish: 8/16-byte fragments, FP32/BF16 weights,
    shared expert before/after the wait or absent, top_k 1 and 8, M below
    and above tp; residual_out bit-exact against the exact-FMA payloads."""
    from kernels.all_reduce_norm import FinalizeTuning

    hidden = 7168
    for top_k in (1, 8):
        tuning = FinalizeTuning(**tuning_args)
        grp = group(tp, hidden, top_k, tuning)
        for m in (1, 7, 64, CAPACITY):
            for wdtype in (torch.float32, torch.bfloat16):
                for shared in (True, False):
                    what = f"{tuning_args} tp={tp} top_k={top_k} M={m} {wdtype} shared={shared}"
                    xs = moe_inputs(tp, m, hidden, top_k, seed=m + top_k, wdtype=wdtype,
                                    shared=shared)
                    residual, weight = shared_inputs(m, hidden, seed=m)
                    outs = run(grp, xs, residual, weight)
                    torch.cuda.synchronize()
                    assert_clean(grp, what)
                    payloads = finalize_payloads([x.to_partial() for x in xs], fma=True)
                    check(outs, payloads, residual, weight, what)


# --------------------------------------------------------------- no host sync
@pytest.mark.parametrize("tp", [2, 8])
def test_many_calls_without_host_sync(tp):
    """120 calls with varying M (below, at and above tp; plain and finalize
    interleaved), no host sync between them; each owner's residual_out rows
    feed its next residual."""
    hidden, calls, top_k = 4096, 120, 8
    grp = group(tp, hidden, top_k)
    pattern = (27, 11, 1, CAPACITY, 3, 64, 2, 8)
    g = torch.Generator(device="cpu").manual_seed(7)
    weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(torch.bfloat16).cuda()
    full = torch.randn(CAPACITY, hidden, generator=g).to(torch.bfloat16).cuda()
    state = [owner_view(full, tp, r).contiguous() for r in range(tp)]  # each owner's rows
    history = []
    for call in range(calls):
        m = pattern[call % len(pattern)]
        rows = owner_rows(m, tp)
        if call % 2:
            xs = moe_inputs(tp, m, hidden, top_k, seed=call,
                            wdtype=torch.float32 if call % 4 == 1 else torch.bfloat16)
        else:
            xs = partials(tp, m, hidden, seed=call)
        res_in = [s[:rows].clone() for s in state]
        outs = [(torch.empty(rows, hidden, dtype=torch.bfloat16, device="cuda"),
                 torch.empty(rows, hidden, dtype=torch.bfloat16, device="cuda"))
                for _ in range(tp)]
        grp(xs, res_in, weight, outs=outs)
        history.append((xs, res_in, outs, m))
        state = [torch.cat([o[1], s[rows:]]) for o, s in zip(outs, state)]
    torch.cuda.synchronize()
    for call, (xs, res_in, outs, m) in enumerate(history):
        payloads = (finalize_payloads([x.to_partial() for x in xs], fma=True)
                    if call % 2 else xs)
        for rank, (norm_out, res_out) in enumerate(outs):
            ref_norm, ref_res = owner_all_reduce_norm(payloads, res_in[rank], weight, EPS,
                                                      owner=rank)
            count = len(owned_tokens(m, tp, rank))
            # rows past the owner's tokens: residual not read, +0.0 out
            assert_bit_exact(res_out[:count], ref_res[:count], f"call {call} owner {rank}")
            assert not bits(res_out[count:]).any(), f"call {call} owner {rank} padding"
            assert_within_ulp(norm_out[:count], ref_norm[:count], 1,
                              f"call {call} owner {rank} norm_out")
    assert_clean(grp, f"after {calls} calls")
    stages = {tuple(r.mailbox.stage_state.tolist()) for r in grp.ranks}
    assert len(stages) == 1, stages


# --------------------------------------------------------------- CUDA graphs
def test_cuda_graph_replay_matches_eager():
    """One graph holding an M=16 plain call, an M=3 (< tp) plain call and an
    M=16 finalize call; replays with new data equal eager calls bit for bit
    and the reference."""
    tp, hidden, top_k = 4, 5120, 8
    grp = group(tp, hidden, top_k)
    ms = (16, 3)
    plain = {m: partials(tp, m, hidden, seed=m) for m in ms}
    moe = moe_inputs(tp, 16, hidden, top_k, seed=5)
    res = {m: shared_inputs(m, hidden, seed=m)[0] for m in ms}
    weight = shared_inputs(1, hidden, seed=0)[1]
    s_res = {m: [owner_view(res[m], tp, r).contiguous() for r in range(tp)] for m in ms}
    outs = {key: [(torch.empty(owner_rows(m, tp), hidden, dtype=torch.bfloat16, device="cuda"),
                   torch.empty(owner_rows(m, tp), hidden, dtype=torch.bfloat16, device="cuda"))
                  for _ in range(tp)] for key, m in (("p16", 16), ("p3", 3), ("moe", 16))}

    def step():
        grp(plain[16], s_res[16], weight, outs=outs["p16"])
        grp(plain[3], s_res[3], weight, outs=outs["p3"])
        grp(moe, s_res[16], weight, outs=outs["moe"])

    step()  # warm-up (module load)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed in range(20, 25):
        for m in ms:
            for s, n in zip(plain[m], partials(tp, m, hidden, seed=seed + m)):
                s.copy_(n)
            new_res = shared_inputs(m, hidden, seed=seed + m)[0]
            res[m].copy_(new_res)
            for r in range(tp):
                s_res[m][r].copy_(owner_view(new_res, tp, r))
        for s, n in zip(moe, moe_inputs(tp, 16, hidden, top_k, seed=seed)):
            for a, b in zip(s.tensors(), n.tensors()):
                a.copy_(b)
        for pairs in outs.values():
            for a, b in pairs:
                poison_(a), poison_(b)
        graph.replay()
        torch.cuda.synchronize()
        assert_clean(grp, f"graph seed {seed}")
        for key, xs, m in (("p16", plain[16], 16), ("p3", plain[3], 3), ("moe", moe, 16)):
            eager = run(grp, xs, res[m], weight)
            torch.cuda.synchronize()
            for rank in range(tp):
                assert_bit_exact(outs[key][rank][0], eager[rank][0], f"graph {key} norm {rank}")
                assert_bit_exact(outs[key][rank][1], eager[rank][1], f"graph {key} res {rank}")
            payloads = (finalize_payloads([x.to_partial() for x in xs], fma=True)
                        if key == "moe" else xs)
            check(outs[key], payloads, res[m], weight, f"graph {key} seed {seed}")
        assert_clean(grp, f"graph seed {seed} + eager")


# --------------------------------------------------------------- API
def test_api_refusals_and_tp1_call():
    from kernels.all_reduce_norm import AllReduceNorm

    op = AllReduceNorm(hidden_size=5120, max_num_tokens=64, eps=EPS, mode="owner",
                       budget_ns=BUDGET_NS)
    assert op.mailbox.capacity == 64  # tp=1: owner capacity = capacity
    xs = partials(1, 8, 5120, seed=5)
    residual, weight = shared_inputs(8, 5120, seed=5)
    norm_out, res_out = op(xs[0], residual, weight)
    torch.cuda.synchronize()
    check([(norm_out, res_out)], xs, residual, weight, "tp=1 owner __call__")
    with pytest.raises(ValueError, match="embedding path is one-shot only"):
        op.prepare_embedding(torch.zeros(4, 5120, dtype=torch.bfloat16, device="cuda"), 0)
    grp = group(4, 5120)
    assert grp.ranks[0].mailbox.capacity == 75  # ceil(300 / 4)
    xs = partials(4, 9, 5120, seed=1)
    residual, weight = shared_inputs(9, 5120, seed=1)
    with pytest.raises(ValueError, match=r"residual must have shape \[3, 5120\]"):
        grp(xs, [residual] * 4, weight)
    assert op.diagnose().ok and op.mailbox.is_all_sentinel()


# --------------------------------------------------------------- profile workload
@pytest.mark.parametrize("op", ["all_reduce_norm", "finalize_publish"])
def test_profile_workload_times_owner_against_one_shot(op):
    """The profile job's timed call (cluster.measure) on one GPU with
    mode="owner": the owner kernel checked against the owner reference, then
    timed with the one-shot kernel as its baseline (at tp=1 the two do the
    same work; the crossover needs benchmarks.owner_crossover on 2 GPUs)."""
    from cluster.measure.timing import measure_tp1

    out = measure_tp1({"op": op, "hidden": 5120, "tokens": 16, "calls": 20, "replays": 20,
                       "rotate_mb": 8, "eps": EPS, "baselines": ["one_shot"], "seed": 1,
                       "budget_ns": BUDGET_NS, "mode": "owner",
                       "top_k": 8 if op == "finalize_publish" else None})
    for name in ("fused", "one_shot"):
        times = out["impls"][name]["times_us"]
        assert len(times) == 20 and all(0.5 < t < 1000 for t in times), (name, times)
    assert out["impls"]["fused"]["extra"]["mode"] == "owner"
    assert out["impls"]["one_shot"]["extra"]["mode"] == "one_shot"


# --------------------------------------------------------------- tp=2, process per GPU
MGPU_DEADLINE_S = 240
"""The tp=2 process-per-GPU test gives up (and ends its ranks) after this."""


def _rank_main(rank: int, world: int, port: int, result_dir: str) -> None:
    """One process per GPU: a symmetric-memory group, owner mode, the
    watchdog consumer; checks every call against the owner reference. Each
    step is appended to ``rank<r>.log`` (read back when the test times out);
    the last line is ``ok`` or the failure."""
    import torch.distributed as dist

    from kernels.all_reduce_norm import AllReduceNorm

    log = open(os.path.join(result_dir, f"rank{rank}.log"), "a", buffering=1)
    t0 = time.perf_counter()

    def step(text):
        log.write(f"{time.perf_counter() - t0:7.1f}s {text}\n")

    status = "ok"
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=world,
                                device_id=torch.device("cuda", rank))
        step("process group up")
        hidden = 7168
        op = AllReduceNorm(hidden_size=hidden, max_num_tokens=CAPACITY, eps=EPS,
                           group=dist.group.WORLD, mode="owner", budget_ns=BUDGET_NS)
        step("AllReduceNorm(mode='owner') built (mailbox rendezvous, compiles)")
        for i, m in enumerate(TOKENS):
            for kind in ("random", "order", "sentinel") if m in (7, CAPACITY) else ("random",):
                what = f"rank {rank} M={m} {kind}"
                xs = partials(world, m, hidden, seed=i, kind=kind)  # every rank's partials
                residual, weight = shared_inputs(m, hidden, seed=i)
                rows = owner_rows(m, world)
                out = tuple(poison_(torch.empty(rows, hidden, dtype=torch.bfloat16,
                                                device="cuda")) for _ in range(2))
                op(xs[rank], owner_view(residual, world, rank).contiguous(), weight, out=out)
                torch.cuda.synchronize()
                op.check()  # collective: LamportTimeout naming the missing ranks
                try:
                    ref_norm, ref_res = owner_all_reduce_norm(
                        xs, owner_view(residual, world, rank), weight, EPS, owner=rank)
                    assert_bit_exact(out[1], ref_res, f"{what} residual_out")
                    assert_within_ulp(out[0], ref_norm, 1, f"{what} norm_out")
                    assert op.mailbox.is_all_sentinel(), f"{what}: mailbox not all sentinel"
                except AssertionError as err:
                    status = f"rank {rank}: {err}"[:2000]
                # Every rank stops together (a rank going on alone would wait
                # in the next collective for a peer that has left).
                bad = torch.tensor([int(status != "ok")], device="cuda")
                dist.all_reduce(bad)
                if int(bad.item()):
                    raise AssertionError(status if status != "ok" else "a peer failed")
                step(f"{what} ok")
        dist.barrier()
    except BaseException as err:  # noqa: BLE001 - reported to the test through the log
        if status == "ok":
            status = f"rank {rank}: {type(err).__name__}: {err}"[:2000]
    finally:
        step(status)
        log.close()
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.multigpu
def test_process_per_gpu_tp2(tmp_path):
    """Owner mode on a real tp=2 group (one process per GPU, symmetric
    memory): M in {1, 2, 7, 16, 64, 256, capacity}, three input kinds at
    M = 7 and capacity. Bounded: after MGPU_DEADLINE_S the ranks are ended
    and the test fails with each rank's progress log."""
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, found {torch.cuda.device_count()}")
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.start_processes(_rank_main, args=(2, port, str(tmp_path)), nprocs=2, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + MGPU_DEADLINE_S
    done = False
    while not done and time.monotonic() < deadline:
        done = ctx.join(timeout=5)
    logs = {r: (tmp_path / f"rank{r}.log").read_text() if (tmp_path / f"rank{r}.log").exists()
            else "(no log)" for r in range(2)}
    if not done:
        for p in ctx.processes:
            p.kill()
        pytest.fail(f"tp=2 owner group still running after {MGPU_DEADLINE_S} s; progress:\n"
                    + "\n".join(f"rank {r}:\n{text[-1500:]}" for r, text in logs.items()))
    print("\n" + "\n".join(f"rank {r}:\n{text}" for r, text in logs.items()))
    last = [text.strip().splitlines()[-1].split(maxsplit=1)[-1] if text.strip() else ""
            for text in logs.values()]
    assert last == ["ok", "ok"], logs
