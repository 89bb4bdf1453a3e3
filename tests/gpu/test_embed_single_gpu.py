"""The single-kernel embedding (kernels/lamport/embed_single.py) on one GPU:
bit for bit the two-kernel form's output (the embedding publish, then the
embed-norm consumer) with each stage agreement, ids at every shard edge and
one no rank owns, position 0; interleaved with the plain forms on one
mailbox; graph replay; the bad stage; tp > 1 on ranks of one process
launched side by side. Run under a process timeout:
    timeout 300 python -m pytest -m gpu tests/gpu/test_embed_single_gpu.py
"""

from __future__ import annotations

import pytest
import torch

from kernels.reference.numerics import poison_
from tests.gpu.test_finalize_embed_gpu import EPS, check_embed, embed_inputs, make_shards
from tests.gpu.test_norm_single_gpu import (SIDE_BY_SIDE_BUDGET_NS, SINGLE, SYNCS,
                                           check_bad_stage)

pytestmark = pytest.mark.gpu

BUDGET_NS = 50_000_000  # 50 ms


class Rank:
    """One rank's AllReduceNorm with its embedding shard registered; its
    embedding calls up to ``single`` tokens launch the single kernel."""

    def __init__(self, hidden, *, single=SINGLE, sync="counter", budget_ns=BUDGET_NS,
                 mailbox=None, tp=1):
        from kernels.all_reduce_norm import AllReduceNorm
        from kernels.lamport.norm_tuning import NormTuning

        self.op = AllReduceNorm(hidden_size=hidden, max_num_tokens=SINGLE, eps=EPS,
                                budget_ns=budget_ns, mailbox=mailbox,
                                norm_tuning=NormTuning(single, sync, 0, single))
        self.shards = make_shards(tp, hidden)
        self.weight, start, rows = self.shards[self.op.rank]
        self.op.prepare_embedding(self.weight, start, rows)
        self.hidden_size = hidden

    def __call__(self, ids, positions, previous, enorm, hnorm):
        out = poison_(torch.empty(ids.shape[0], 2 * self.hidden_size, dtype=torch.bfloat16,
                                  device="cuda"))
        self.op.embed_norm(ids, positions, previous, self.weight, enorm, hnorm, out=out)
        return out


def bits(t):
    return t.view(torch.int16)


@pytest.mark.parametrize("hidden", [2560, 5120, 7168])
@pytest.mark.parametrize("sync", SYNCS)
def test_single_embedding_is_the_two_kernel_form_bit_for_bit(hidden, sync):
    single, two = Rank(hidden, sync=sync), Rank(hidden, single=0)
    for m in (1, 2, 7, 16, 64):
        e = embed_inputs(1, m, hidden, seed=m)
        assert single.op.embed_form(e[0]) == "single" and two.op.embed_form(e[0]) == "two"
        assert single.op.embed_variant(e[0]) == single.op.norm_tuning.variant(m, path="embed")
        a, b = single(*e), two(*e)
        torch.cuda.synchronize()
        check_embed([a], single, *e, f"single H={hidden} M={m}")
        assert torch.equal(bits(a), bits(b)), f"single vs two H={hidden} M={m}"
        for r in (single, two):
            assert r.op.mailbox.is_all_sentinel() and r.op.diagnose().ok


def test_embedding_and_plain_forms_interleave_on_one_mailbox_without_host_sync():
    from tests.gpu.test_all_reduce_norm_gpu import check, inputs

    hidden, calls = 4096, [4, 32, 1, 17, 16, 64, 3, 9]
    first = Rank(hidden, sync="cluster")
    ranks = [first, Rank(hidden, sync="none", mailbox=first.op.mailbox),
             Rank(hidden, single=0, mailbox=first.op.mailbox)]
    done = []
    for i, m in enumerate(calls):
        r = ranks[i % len(ranks)]
        if i % 2 == 0:
            e = embed_inputs(1, m, hidden, seed=300 + i)
            done.append(("embed", r, e, r(*e), r.op.embed_variant(e[0])))
        else:
            xs, residual, weight = inputs(1, m, hidden, seed=300 + i)
            out = poison_(torch.empty_like(residual)), poison_(torch.empty_like(residual))
            r.op(xs[0], residual, weight, out=out)
            done.append(("plain", r, (xs, residual, weight), out, r.op.variant(xs[0])))
    torch.cuda.synchronize()
    assert [d[-1] for d in done] == ["single+cluster", "single+nosync", "two", "single",
                                     "single+nosync", "two", "single+cluster",
                                     "single+nosync"]
    for m, (kind, r, args, out, _) in zip(calls, done):
        if kind == "embed":
            check_embed([out], r, *args, f"interleaved embed M={m}")
        else:
            check([out], *args, f"interleaved M={m}")
    n = len(calls)
    assert first.op.mailbox.stage_state.tolist() == [(n - 1) % 3, n % 3, 0]
    assert first.op.mailbox.is_all_sentinel() and first.op.diagnose().ok


@pytest.mark.parametrize("sync", SYNCS)
def test_single_embedding_graph_replay_matches_eager(sync):
    hidden, m = 5120, 8
    r = Rank(hidden, budget_ns=0, sync=sync)
    e = embed_inputs(1, m, hidden, seed=3)
    out = poison_(torch.empty(m, 2 * hidden, dtype=torch.bfloat16, device="cuda"))
    r.op.embed_norm(*e[:3], r.weight, *e[3:], out=out)  # warm before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        r.op.embed_norm(*e[:3], r.weight, *e[3:], out=out)
    for seed in (4, 5, 6):
        fresh = embed_inputs(1, m, hidden, seed=seed)
        for mine, new in zip(e, fresh):
            mine.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        check_embed([out], r, *e, f"replay seed {seed}")
    assert r.op.mailbox.is_all_sentinel()


@pytest.mark.parametrize("sync", SYNCS)
def test_bad_stage_stores_nothing_and_fails_fast(sync):
    hidden, m = 2560, 5
    r = Rank(hidden, sync=sync)
    e = embed_inputs(1, m, hidden, seed=9)
    check_bad_stage(r.op, lambda: r(*e), lambda out: [out[:, :hidden]],
                    lambda out: check_embed([out], r, *e, "after recover"))


@pytest.mark.parametrize("sync", ["counter", "cluster"])
@pytest.mark.parametrize("tp", [2, 4])
def test_ranks_side_by_side_on_their_own_streams(tp, sync):
    from kernels.lamport.mailbox import Mailbox

    hidden = 5120
    boxes = Mailbox.virtual_ranks(tp=tp, capacity=SINGLE, hidden=hidden)
    ranks = [Rank(hidden, mailbox=b, sync=sync, tp=tp, budget_ns=SIDE_BY_SIDE_BUDGET_NS)
             for b in boxes]
    streams = [torch.cuda.Stream() for _ in range(tp)]
    for m in (1, 16, 7):
        e = embed_inputs(tp, m, hidden, seed=tp * 10 + m)
        outs = [poison_(torch.empty(m, 2 * hidden, dtype=torch.bfloat16, device="cuda"))
                for _ in range(tp)]
        for r, stream in zip(ranks, streams):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                r.op.embed_norm(*e[:3], r.weight, *e[3:], out=outs[r.op.rank])
        torch.cuda.synchronize()
        for r in ranks:
            assert r.op.errors().count == 0, r.op.errors()
        check_embed(outs, ranks[0], *e, f"tp={tp} side by side M={m}")
    assert all(b.is_all_sentinel() for b in boxes)
