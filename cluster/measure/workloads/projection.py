"""indexer: the DSA indexer's projection on one GPU (not a collective).

``hidden`` is the projection's K; ``INDEXER_HEADS`` heads, key 128, gate
128. Rotation is over indexer modules (each its own weights) so that the
weights a graph reads span ``rotate_mb``: no call finds its weights in L2.
``fused`` is what :class:`kernels.indexer.stage.IndexerStage` runs in a
planned step at this M (the fused kernel where the arch's fuse rule says
so, else the projection kernel + the torch query epilogue; ``extra.path``
says which); ``stock`` the stock chain (three GEMMs, TF32 off, then
``stock_indexer_query``). Check (set 0): the fused kernel bit-identical to
the projection kernel with the fused tactic + the reference epilogue (key
within 1 BF16 ULP); the two-step path's projection within its bound of the
exact product. ``bytes_moved``: the weight and input bytes one call reads.
"""

from __future__ import annotations

import torch

from cluster.measure.graph import rotation_sets
from cluster.measure.workload import Call, RankContext, Spec, Workload
from cluster.measure.workloads.common import BF16, generators, randn

INDEXER_HEADS = 64


def indexer_workload(ctx: RankContext, spec: Spec) -> Workload:
    from kernels.indexer.layout import DIM, padded_heads
    from cluster import ops
    from kernels.indexer.stage import _fuse, stock_indexer_query
    from kernels.reference.indexer import assert_projection_within_bound, indexer_query
    from kernels.reference.numerics import assert_bit_exact, assert_within_ulp

    torch.backends.cuda.matmul.allow_tf32 = False
    m, k, heads, dev = spec.tokens, spec.hidden, INDEXER_HEADS, ctx.device
    rows = DIM + heads + 128
    weight_bytes = rows * k * 2
    sets = rotation_sets(spec.rotate_mb, weight_bytes)
    op = ops.get(spec.op)
    params = op.make_params({"heads": heads})
    mods, projs = zip(*(op.build_kernel(params, eps=spec.eps, hidden=k, device=dev,
                                        seed=spec.seed * 1009 + i)
                        for i in range(sets)))
    mine, _ = generators(ctx, spec)
    xs = randn((sets, m, k), mine, dev)
    qs = randn((sets, m, heads * DIM), mine, dev)
    scale = mods[0].softmax_scale * heads ** -0.5
    padded = padded_heads(heads)
    fuse = m <= projs[0].fused_max_tokens and _fuse(m, heads, projs[0].arch)
    got = {}

    def fused() -> Call:
        def fn(i):
            p, mod = projs[i], mods[i]
            if fuse:
                out = p.fused(xs[i], qs[i], mod.k_norm, scale, padded)
            else:
                kk, w, gate = p(xs[i])
                out = stock_indexer_query(qs[i], kk, w, mod.k_norm, scale, padded) + (gate,)
            if i == 0:
                got["out"] = out
            return out
        for i in range(1, sets):  # each module's first call eagerly (its occupancy query)
            fn(i)
        return Call(fn, {"path": "fused" if fuse else "two_step", "heads": heads})

    def check() -> None:
        p, mod = projs[0], mods[0]
        if fuse:
            q_out, w_out, key, gate = got["out"]
            key_pre, w_pre, gate_pre = p(xs[0], tactic=p.fused_tactic(m))
            ref_q, ref_w, ref_key = indexer_query(
                qs[0], key_pre, w_pre, mod.k_norm.weight.data, mod.k_norm.bias.data,
                eps=mod.k_norm.eps, scale=scale, padded=padded, ue8m0=True)
            if not torch.equal(q_out.view(torch.uint8), ref_q.view(torch.uint8)):
                n = int((q_out.view(torch.uint8) != ref_q.view(torch.uint8)).sum())
                raise AssertionError(f"q_fp8 differs from projection + reference epilogue in "
                                     f"{n} bytes")
            assert_bit_exact(w_out, ref_w, "head weights")
            assert_bit_exact(gate, gate_pre, "gate")
            assert_within_ulp(key, ref_key, 1, "normed key")
        else:
            x, w = xs[0], p.weight
            kk, wts, gate = p(x)
            table = p.tactic_for(m)
            parts = (("key", kk, w[:p.key]), ("weights", wts, w[p.key:p.key + heads]),
                     ("gate", gate, w[p.key + heads:]))
            for name, out, part in parts:
                assert_projection_within_bound(out, x, part, table, f"projection {name}")

    def stock() -> Call:
        def fn(i):
            kk, w, gate = mods[i].stock_projection(xs[i])
            return stock_indexer_query(qs[i], kk, w, mods[i].k_norm, scale, padded) + (gate,)
        return Call(fn, {"path": "stock"})

    return Workload("indexer", sets, weight_bytes, weight_bytes + m * k * 2, 1.0, fused, check,
                    {"stock": stock}, collective=False)
