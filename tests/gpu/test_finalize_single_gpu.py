"""The single-kernel MoE-finalize AllReduceNorm (kernels/lamport/finalize_single.py)
on one GPU: bit for bit the two-kernel form's outputs (the finalize publish,
then the norm consumer) with each stage agreement, weight dtype and shared
expert; an out-of-range route; interleaved with the plain forms on one
mailbox; graph replay; the bad stage; tp > 1 on ranks of one process
launched side by side. Run under a process timeout:
    timeout 300 python -m pytest -m gpu tests/gpu/test_finalize_single_gpu.py
"""

from __future__ import annotations

import pytest
import torch

from kernels.reference.numerics import assert_bit_exact, poison_
from tests.gpu.test_finalize_embed_gpu import EPS, check_moe, moe_inputs
from tests.gpu.test_norm_single_gpu import (SIDE_BY_SIDE_BUDGET_NS, SINGLE, SYNCS,
                                           check_bad_stage)

pytestmark = pytest.mark.gpu

BUDGET_NS = 50_000_000  # 50 ms
TOP_K = 8


def op(hidden, *, single=SINGLE, sync="counter", budget_ns=BUDGET_NS, mailbox=None,
       top_k=TOP_K, **kw):
    """A one-rank (or ``mailbox``'s rank) AllReduceNorm whose MoE calls up to
    ``single`` tokens launch the single finalize kernel (0: two kernels)."""
    from kernels.all_reduce_norm import AllReduceNorm
    from kernels.lamport.norm_tuning import NormTuning

    return AllReduceNorm(hidden_size=hidden, max_num_tokens=SINGLE, eps=EPS,
                         budget_ns=budget_ns, mailbox=mailbox, top_k=top_k,
                         norm_tuning=NormTuning(single, sync, single), **kw)


def outputs(residual):
    return poison_(torch.empty_like(residual)), poison_(torch.empty_like(residual))


def same_bits(single, two, xs, residual, weight, what):
    a, b = outputs(residual), outputs(residual)
    single(xs[0], residual, weight, out=a)
    two(xs[0], residual, weight, out=b)
    torch.cuda.synchronize()
    check_moe([a], xs, residual, weight, what, scale=single.routed_scaling_factor)
    assert_bit_exact(a[0], b[0], f"single vs two norm_out {what}")
    assert_bit_exact(a[1], b[1], f"single vs two residual_out {what}")
    for grp in (single, two):
        assert grp.mailbox.is_all_sentinel() and grp.diagnose().ok, what


@pytest.mark.parametrize("hidden", [2560, 5120, 7168])
@pytest.mark.parametrize("sync", SYNCS)
def test_single_finalize_is_the_two_kernel_form_bit_for_bit(hidden, sync):
    single, two = op(hidden, sync=sync), op(hidden, single=0)
    for m in (1, 2, 7, 16, 64):
        for wdtype in (torch.float32, torch.bfloat16):
            for shared in (True, False):
                xs, residual, weight = moe_inputs(1, m, hidden, TOP_K, seed=m, wdtype=wdtype,
                                                  shared=shared)
                assert single.form(xs[0]) == "single" and two.form(xs[0]) == "two"
                assert single.variant(xs[0]) == single.norm_tuning.variant(m, path="finalize")
                same_bits(single, two, xs, residual, weight,
                          f"H={hidden} M={m} {wdtype} shared={shared}")


def test_tunings_and_scaling_keep_the_bits():
    """Prefetch groups, the shared expert before the wait and a routed
    scaling factor, top_k 1 and 6: each single build against its two."""
    from kernels.lamport.finalize_publish import FinalizeTuning

    hidden = 4096
    for top_k, tuning, scale in ((6, FinalizeTuning(prefetch_group=4), 2.5),
                                 (1, FinalizeTuning(load_shared_before_pdl=True), 1.0),
                                 (8, FinalizeTuning(prefetch_group=1), 0.5)):
        kw = dict(top_k=top_k, finalize_tuning=tuning, routed_scaling_factor=scale)
        single, two = op(hidden, **kw), op(hidden, single=0, **kw)
        for m in (1, 9, 33):
            xs, residual, weight = moe_inputs(1, m, hidden, top_k, seed=40 + m)
            same_bits(single, two, xs, residual, weight, f"top_k={top_k} {tuning} s={scale}")


def test_an_out_of_range_route_is_nan_in_both_forms():
    hidden, m = 2048, 4
    single, two = op(hidden), op(hidden, single=0)
    xs, residual, weight = moe_inputs(1, m, hidden, TOP_K, seed=11)
    xs[0].routed.expanded_idx_to_permuted_idx[2, 3] = m * TOP_K  # one past the last row
    a, b = outputs(residual), outputs(residual)
    single(xs[0], residual, weight, out=a)
    two(xs[0], residual, weight, out=b)
    torch.cuda.synchronize()
    for out in (a, b):
        assert torch.isnan(out[1][2].float()).all(), "the bad route's token is not NaN"
        assert not torch.isnan(out[1][[0, 1, 3]].float()).any()
    for x, y in zip(a, b):  # NaN rows included (assert_bit_exact refuses any NaN)
        assert torch.equal(x.view(torch.int16), y.view(torch.int16)), "single vs two bits"
    assert single.mailbox.is_all_sentinel() and single.diagnose().ok


def test_an_input_aligned_for_the_publish_but_not_for_the_single_kernel_is_refused():
    """The default finalize publish loads 8-byte fragments, the single kernel
    16-byte ones: rows 8 bytes off a 16-byte boundary pass the first and are
    refused, naming the tensor, before the second is launched."""
    from kernels.all_reduce_norm import MoEOutput, RoutedExperts

    hidden, m = 2048, 4
    single, two = op(hidden), op(hidden, single=0)
    xs, residual, weight = moe_inputs(1, m, hidden, TOP_K, seed=12)
    r = xs[0].routed
    rows = torch.empty(r.gemm2_permuted.numel() + 4, dtype=torch.bfloat16, device="cuda")
    shifted = rows[4:].view_as(r.gemm2_permuted)  # 8 bytes past the allocation's start
    shifted.copy_(r.gemm2_permuted)
    moe = MoEOutput(RoutedExperts(shifted, r.expert_weights, r.expanded_idx_to_permuted_idx),
                    xs[0].shared_output)
    two(moe, residual, weight, out=outputs(residual))
    with pytest.raises(ValueError, match=r"x\.routed\.gemm2_permuted.*16"):
        single(moe, residual, weight, out=outputs(residual))
    torch.cuda.synchronize()
    assert single.mailbox.is_all_sentinel() and single.diagnose().ok


def test_finalize_and_plain_forms_interleave_on_one_mailbox_without_host_sync():
    """MoE and plain calls of single and two-kernel instances on one mailbox."""
    from tests.gpu.test_all_reduce_norm_gpu import check, inputs

    hidden, calls = 4096, [4, 32, 1, 17, 16, 64, 3, 9]
    first = op(hidden, sync="cluster")
    ops = [first, op(hidden, sync="none", mailbox=first.mailbox),
           op(hidden, single=0, mailbox=first.mailbox)]
    cases, outs, variants = [], [], []
    for i, m in enumerate(calls):
        grp = ops[i % len(ops)]
        moe = i % 2 == 0
        case = moe_inputs(1, m, hidden, TOP_K, seed=200 + i) if moe else \
            inputs(1, m, hidden, seed=200 + i)
        xs, residual, weight = case
        cases.append((moe, case))
        outs.append(outputs(residual))
        variants.append(grp.variant(xs[0]))
        grp(xs[0], residual, weight, out=outs[-1])
    torch.cuda.synchronize()
    assert variants == ["single+cluster", "single+nosync", "two", "single",
                        "single+nosync", "two", "single+cluster", "single+nosync"], variants
    for m, (moe, (xs, residual, weight)), out in zip(calls, cases, outs):
        if moe:
            check_moe([out], xs, residual, weight, f"interleaved MoE M={m}")
        else:
            check([out], xs, residual, weight, f"interleaved M={m}")
    n = len(calls)
    assert first.mailbox.stage_state.tolist() == [(n - 1) % 3, n % 3, 0]
    assert first.mailbox.is_all_sentinel() and first.diagnose().ok


@pytest.mark.parametrize("sync", SYNCS)
def test_single_finalize_graph_replay_matches_eager(sync):
    hidden, m = 5120, 8
    grp = op(hidden, budget_ns=0, sync=sync)
    xs, residual, weight = moe_inputs(1, m, hidden, TOP_K, seed=3)
    x = xs[0]
    out = outputs(residual)
    grp(x, residual, weight, out=out)  # warm before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grp(x, residual, weight, out=out)
    for seed in (4, 5, 6):
        fresh, _, _ = moe_inputs(1, m, hidden, TOP_K, seed=seed)
        for mine, new in zip(x.tensors(), fresh[0].tensors()):
            mine.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        check_moe([out], fresh, residual, weight, f"replay seed {seed}")
    assert grp.mailbox.is_all_sentinel()


@pytest.mark.parametrize("sync", SYNCS)
def test_bad_stage_stores_nothing_and_fails_fast(sync):
    hidden, m = 2560, 5
    grp = op(hidden, sync=sync)
    xs, residual, weight = moe_inputs(1, m, hidden, TOP_K, seed=9)

    def run():
        out = outputs(residual)
        grp(xs[0], residual, weight, out=out)
        return out
    check_bad_stage(grp, run, lambda out: out,
                    lambda out: check_moe([out], xs, residual, weight, "after recover"))


@pytest.mark.parametrize("sync", ["counter", "cluster"])
@pytest.mark.parametrize("tp", [2, 4])
def test_ranks_side_by_side_on_their_own_streams(tp, sync):
    from kernels.lamport.mailbox import Mailbox

    hidden = 5120
    boxes = Mailbox.virtual_ranks(tp=tp, capacity=SINGLE, hidden=hidden)
    ranks = [op(hidden, mailbox=b, sync=sync, budget_ns=SIDE_BY_SIDE_BUDGET_NS) for b in boxes]
    streams = [torch.cuda.Stream() for _ in range(tp)]
    for m in (1, 16, 7):
        xs, residual, weight = moe_inputs(tp, m, hidden, TOP_K, seed=tp * 10 + m)
        outs = [outputs(residual) for _ in range(tp)]
        for rank, stream in zip(ranks, streams):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                rank(xs[rank.rank], residual, weight, out=outs[rank.rank])
        torch.cuda.synchronize()
        for rank in ranks:
            assert rank.errors().count == 0, rank.errors()
        check_moe(outs, xs, residual, weight, f"tp={tp} side by side M={m}")
    assert all(b.is_all_sentinel() for b in boxes)
