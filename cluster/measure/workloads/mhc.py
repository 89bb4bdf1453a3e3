"""all_reduce_mhc: AllReduceMHC (Lamport publish + the mHC consumer).

Per rotation set: this rank's partial x, the hc residual streams, post /
comb / pre mixes (FP32) and outputs; norm weight shared. Check: residual
streams bit-exact, layer input within
``kernels.reference.numerics.NORM_MAX_ULP`` of
:func:`kernels.reference.mhc.all_reduce_mhc` with the op's rank lanes (its
reduction order) over every rank's partial.
"""

from __future__ import annotations

import torch

from cluster.measure.graph import rotation_sets
from cluster.measure.workload import Call, RankContext, Spec, Workload
from cluster.measure.workloads.common import (BF16, all_reduce_baselines, all_reduce_factor,
                                              check_capacity, generators, host_kernel, randn)
from kernels.reference.numerics import NORM_MAX_ULP, assert_bit_exact, assert_within_ulp


def torch_mhc(x, residual, post, comb, pre, weight, eps):
    """The unfused mHC path after the all-reduce: post-mix + comb-weighted
    streams (BF16), collapse with pre, RMSNorm; ``(residual_out [M, hc, H],
    layer_input [M, H])``."""
    m, hc, hidden = residual.shape
    mixed = x.float().unsqueeze(1) * post.view(m, hc, 1) + torch.bmm(
        comb.transpose(1, 2), residual.float())
    res_out = mixed.to(BF16)
    collapse = torch.bmm(pre.view(m, 1, hc), res_out.float()).view(m, hidden)
    return res_out, torch.nn.functional.rms_norm(collapse.to(BF16), (hidden,), weight, eps)


def mhc_set_bytes(m: int, hidden: int, hc: int) -> int:
    """Bytes one set occupies: x, residual streams in and out, layer input, mixes."""
    return (2 + 2 * hc) * m * hidden * 2 + (2 * hc + hc * hc) * m * 4


def all_reduce_mhc_workload(ctx: RankContext, spec: Spec) -> Workload:
    from kernels.reference.mhc import all_reduce_mhc

    check_capacity(ctx, spec)
    if not spec.hc:
        raise ValueError("all_reduce_mhc timing needs hc (streams) in the spec")
    m, h, hc, dev = spec.tokens, spec.hidden, spec.hc, ctx.device
    set_bytes = mhc_set_bytes(m, h, hc)
    sets = rotation_sets(spec.rotate_mb, set_bytes)
    mine, shared = generators(ctx, spec)
    xs = randn((sets, m, h), mine, dev)
    residual = randn((sets, m, hc, h), shared, dev)
    post = (2 * torch.rand(sets, m, hc, generator=shared)).to(dev)
    comb = (torch.rand(sets, m, hc, hc, generator=shared) / hc).to(dev)
    pre = torch.rand(sets, m, hc, generator=shared).to(dev)
    weight = randn((h,), shared, dev, scale=0.1, offset=1.0)
    res_out = torch.empty(sets, m, hc, h, dtype=BF16, device=dev)
    layer = torch.empty(sets, m, h, dtype=BF16, device=dev)
    lanes = []  # the fused op's rank_lanes: its reduction order

    def fused() -> Call:
        op = host_kernel(ctx, spec)
        t = op.tuning
        lanes.append(t.rank_lanes)
        return Call(lambda i: op(xs[i], residual[i], post[i], comb[i], pre[i], weight, spec.eps,
                                 out=(res_out[i], layer[i])),
                    {"hc": hc, "tuning": f"{t.cluster_size}x{t.threads}R{t.rank_lanes}"})

    def check() -> None:
        ref_res, ref_layer = all_reduce_mhc(ctx.gather(xs[0]), residual[0], post[0], comb[0],
                                            pre[0], weight, spec.eps, rank_lanes=lanes[-1])
        assert_bit_exact(res_out[0], ref_res, "residual_out")
        assert_within_ulp(layer[0], ref_layer, NORM_MAX_ULP, "layer_input")

    def tail(reduced, i):
        return torch_mhc(reduced, residual[i], post[i], comb[i], pre[i], weight, spec.eps)

    return Workload("all_reduce_mhc", sets, set_bytes, m * h * 2, all_reduce_factor(ctx.tp),
                    fused, check, all_reduce_baselines(ctx, (m, h), lambda i: xs[i], tail))
