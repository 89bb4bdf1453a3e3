"""The single-kernel AllReduceNorm (kernels/lamport/norm_single.py) on one
GPU: bit for bit the two-kernel form's outputs with each stage agreement
(the arrival counter, the grid as one cluster with the cluster barrier,
none at tp = 1), the forms and agreements interleaved on one mailbox, graph
replay, the bad-stage and watchdog paths, and tp > 1 on
ranks of one process launched side by side (small grids, each on its own
stream; the watchdog turns a rank that never runs into a failure, not a
hang). Run under a process timeout:
    timeout 300 python -m pytest -m gpu tests/gpu/test_norm_single_gpu.py
"""

from __future__ import annotations

import pytest
import torch

from kernels.lamport.protocol import DEFAULT_BUDGET_NS
from kernels.reference.numerics import assert_bit_exact, poison_

from tests.gpu.test_all_reduce_norm_gpu import EPS, check, inputs

pytestmark = pytest.mark.gpu

BUDGET_NS = 50_000_000  # 50 ms
SIDE_BY_SIDE_BUDGET_NS = DEFAULT_BUDGET_NS
"""Ranks of one process launched one after another from the host: a rank's
grid spins from its launch until the last peer's is launched, which under a
loaded host (the GPU suite's lanes) took longer than 50 ms once."""
SINGLE = 64


SYNCS = ["counter", "cluster", "none"]


def op(hidden, *, single=SINGLE, sync="counter", capacity=SINGLE, budget_ns=BUDGET_NS,
       mailbox=None):
    from kernels.all_reduce_norm import AllReduceNorm
    from kernels.lamport.norm_tuning import NormTuning

    return AllReduceNorm(hidden_size=hidden, max_num_tokens=capacity, eps=EPS,
                         budget_ns=budget_ns, mailbox=mailbox,
                         norm_tuning=NormTuning(single, sync))


def outputs(residual):
    return poison_(torch.empty_like(residual)), poison_(torch.empty_like(residual))


@pytest.mark.parametrize("hidden", [2560, 3584, 5120, 7168, 8192])
@pytest.mark.parametrize("sync", SYNCS)
def test_single_kernel_is_the_two_kernel_form_bit_for_bit(hidden, sync):
    single, two = op(hidden, sync=sync), op(hidden, single=0)
    for m in (1, 2, 7, 16, 64):
        xs, residual, weight = inputs(1, m, hidden, seed=m)
        assert single.form(xs[0]) == "single" and two.form(xs[0]) == "two"
        assert single.variant(xs[0]) == single.norm_tuning.variant(m)
        a, b = outputs(residual), outputs(residual)
        single(xs[0], residual, weight, out=a)
        two(xs[0], residual, weight, out=b)
        torch.cuda.synchronize()
        check([a], xs, residual, weight, f"single H={hidden} M={m}")
        assert_bit_exact(a[0], b[0], f"single vs two norm_out H={hidden} M={m}")
        assert_bit_exact(a[1], b[1], f"single vs two residual_out H={hidden} M={m}")
        assert single.mailbox.is_all_sentinel() and single.diagnose().ok
    active, nxt, arrivals = single.mailbox.stage_state.tolist()
    assert (active, nxt, arrivals) == (4 % 3, 5 % 3, 0)


def test_the_forms_and_agreements_interleave_on_one_mailbox_without_host_sync():
    """Calls of four instances on one mailbox, in turn: the counter, the
    cluster barrier (the counter above 16 tokens), none, two kernels."""
    hidden, calls = 4096, [4, 32, 1, 17, 16, 64, 3, 16, 40, 2, 8, 9]
    first = op(hidden, sync="counter")
    ops = [first, op(hidden, sync="cluster", mailbox=first.mailbox),
           op(hidden, sync="none", mailbox=first.mailbox),
           op(hidden, single=0, mailbox=first.mailbox)]
    cases = [inputs(1, m, hidden, seed=100 + i) for i, m in enumerate(calls)]
    outs, variants = [], []
    for i, (xs, residual, weight) in enumerate(cases):
        grp = ops[i % len(ops)]
        outs.append(outputs(residual))
        variants.append(grp.variant(xs[0]))
        grp(xs[0], residual, weight, out=outs[-1])
    torch.cuda.synchronize()
    assert variants == ["single", "single", "single+nosync", "two", "single",
                        "single", "single+nosync", "two", "single", "single+cluster",
                        "single+nosync", "two"]
    for m, (xs, residual, weight), out in zip(calls, cases, outs):
        check([out], xs, residual, weight, f"interleaved M={m}")
    n = len(calls)
    assert first.mailbox.stage_state.tolist() == [(n - 1) % 3, n % 3, 0]
    assert first.mailbox.is_all_sentinel() and first.diagnose().ok


@pytest.mark.parametrize("sync", SYNCS)
def test_single_kernel_graph_replay_matches_eager(sync):
    hidden, m = 5120, 8
    grp = op(hidden, budget_ns=0, sync=sync)
    xs, residual, weight = inputs(1, m, hidden, seed=3)
    x = xs[0].clone()
    out = outputs(residual)
    grp(x, residual, weight, out=out)  # compile and warm before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grp(x, residual, weight, out=out)
    for seed in (4, 5, 6):
        fresh, _, _ = inputs(1, m, hidden, seed=seed)
        x.copy_(fresh[0])
        graph.replay()
        torch.cuda.synchronize()
        check([out], [fresh[0]], residual, weight, f"replay seed {seed}")
    assert grp.mailbox.is_all_sentinel()


def check_bad_stage(op, run, failed, check_after) -> None:
    """NEXT_STAGE out of range on ``op``'s mailbox: ``run()`` stores
    nothing, names rank 0's bad stage, leaves the stage alone and writes
    NaN where ``failed(out)`` looks; after ``recover()`` a call is right
    again (``check_after(out)``). Shared by every single-kernel form."""
    op.mailbox.stage_state[1] = 7
    out = run()
    torch.cuda.synchronize()
    d = op.diagnose()
    assert d.kind == "bad_stage" and d.bad_stage_ranks == {0}, d.summary()
    assert op.mailbox.stage_state.tolist() == [7, 7, 0]
    assert op.mailbox.is_all_sentinel(), "a bad stage stored into the mailbox"
    assert all(torch.isnan(t.float()).all() for t in failed(out)), "no NaN where it failed"
    op.recover()
    out = run()
    torch.cuda.synchronize()
    check_after(out)


@pytest.mark.parametrize("sync", SYNCS)
def test_bad_stage_stores_nothing_and_fails_fast(sync):
    hidden, m = 2560, 5
    grp = op(hidden, sync=sync)
    xs, residual, weight = inputs(1, m, hidden, seed=9)

    def run():
        out = outputs(residual)
        grp(xs[0], residual, weight, out=out)
        return out
    check_bad_stage(grp, run, lambda out: out,
                    lambda out: check([out], xs, residual, weight, "after recover"))


def test_a_peer_that_never_runs_times_out_and_is_named():
    """Rank 0 of a tp=2 group alone: its single kernel publishes and then
    spins on rank 1's slots until the watchdog gives them up."""
    from kernels.lamport.mailbox import Mailbox

    hidden, m = 2048, 3
    boxes = Mailbox.virtual_ranks(tp=2, capacity=SINGLE, hidden=hidden)
    lone = op(hidden, mailbox=boxes[0])
    xs, residual, weight = inputs(2, m, hidden, seed=21)
    out = outputs(residual)
    lone(xs[0], residual, weight, out=out)
    torch.cuda.synchronize()
    errors = lone.errors()
    assert errors.missing_mask == 0b10 and errors.count == m * hidden // 8, errors
    assert torch.isnan(out[0].float()).all() and torch.isnan(out[1].float()).all()
    # It still published: rank 1's mailbox holds rank 0's rows.
    published = boxes[1].buffer[0, 0, :m]
    assert_bit_exact(published, torch.where(xs[0] == 0, torch.zeros_like(xs[0]), xs[0]),
                     "rank 0's publish into rank 1's mailbox")


@pytest.mark.parametrize("sync", ["counter", "cluster"])
@pytest.mark.parametrize("tp", [2, 4])
def test_ranks_side_by_side_on_their_own_streams(tp, sync):
    from kernels.lamport.mailbox import Mailbox

    hidden = 5120
    boxes = Mailbox.virtual_ranks(tp=tp, capacity=SINGLE, hidden=hidden)
    ranks = [op(hidden, mailbox=b, sync=sync, budget_ns=SIDE_BY_SIDE_BUDGET_NS) for b in boxes]
    streams = [torch.cuda.Stream() for _ in range(tp)]
    for m in (1, 16, 7):
        xs, residual, weight = inputs(tp, m, hidden, seed=tp * 10 + m)
        outs = [outputs(residual) for _ in range(tp)]
        for rank, stream in zip(ranks, streams):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                rank(xs[rank.rank], residual, weight, out=outs[rank.rank])
        torch.cuda.synchronize()
        for rank in ranks:
            assert rank.errors().count == 0, rank.errors()
        check(outs, xs, residual, weight, f"tp={tp} side by side M={m}")
    assert all(b.is_all_sentinel() for b in boxes)


def test_a_gpu_rank_s_call_runs_the_form_its_table_picks():
    """The correctness job's rank (cluster/gpu/rank.py) calls the op as a
    caller does, so at tp=1, hidden 5120, M <= 64 on the H200 it checks the
    single kernel; a split fault still launches publish and consumer apart."""
    from cluster.cases import make_case
    from cluster.ops.all_reduce_norm import RankKernel, make_inputs
    from kernels.lamport.mailbox import Mailbox
    from kernels.lamport.norm_tuning import norm_tuning

    hidden, m = 5120, 4
    (box,) = Mailbox.virtual_ranks(tp=1, capacity=SINGLE, hidden=hidden)
    case = make_case(capacity=SINGLE, op="all_reduce_norm", tokens=m, inputs="random", seed=7,
                     eps=EPS, budget_ns=BUDGET_NS)
    rank = RankKernel(box, hidden=hidden, capacity=SINGLE, transport="unicast",
                      budget_ns=BUDGET_NS, case=case)
    inputs = make_inputs(case, tp=1, hidden=hidden, tokens=m)
    rank.load(case, inputs, 0, "cuda")
    want = norm_tuning(hidden=hidden, tp=1).form(m)
    assert rank.kernel.form(rank.xd) == want
    assert rank.kernel.variant(rank.xd) == norm_tuning(hidden=hidden, tp=1).variant(m)
    for split in (False, True):
        rank.load(case, inputs, 0, "cuda")
        if split:
            rank.publish()
            rank.consume()
        else:
            rank.call()
        torch.cuda.synchronize()
        xs = [inputs["partials"][0].cuda()]
        check([rank.out], xs, inputs["residual"].cuda(), inputs["norm_weight"].cuda(),
              f"rank call ({'split' if split else want})")
        assert box.is_all_sentinel() and box.read_errors().ok
