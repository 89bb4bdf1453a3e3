"""all_reduce_norm and finalize_publish (AllReduceNorm fed a partial, or a
MoE output finalized inside the publish).

Per rotation set: this rank's partial (or its MoE output: every route held,
TP-sharded experts), the residual and outputs; norm weight shared. Check:
residual_out bit-exact, norm_out within
``kernels.reference.numerics.NORM_MAX_ULP`` of
the reference over every rank's inputs (finalize: the exact-FMA finalize
reference, :func:`kernels.reference.moe.all_reduce_norm_finalize`).

``mode="owner"`` (token-sharded, :class:`AllReduceNorm` docstring): the
residual and outputs are this rank's ``ceil(M / tp)`` owned rows, the check
is :func:`kernels.reference.allreduce.owner_all_reduce_norm` (owner = this
rank), and the one baseline is ``one_shot``: the one-shot fused kernel on
the same partials with the full ``[M, hidden]`` residual (the crossover
comparison of ``benchmarks.owner_crossover``).
"""

from __future__ import annotations

import torch

from cluster.measure.graph import rotation_sets
from cluster.measure.workload import Call, RankContext, Spec, Unavailable, Workload
from cluster.measure.workloads.common import (BF16, all_reduce_baselines, all_reduce_factor,
                                              check_capacity, generators, host_kernel, randn)
from kernels.reference.numerics import NORM_MAX_ULP, assert_bit_exact, assert_within_ulp


def _owned(ctx: RankContext, spec: Spec) -> int:
    """Rows of the residual and outputs: M, or the owned ``ceil(M / tp)``."""
    from kernels.lamport.protocol import owner_rows
    return owner_rows(spec.tokens, ctx.tp) if spec.mode == "owner" else spec.tokens


def _check_norm(ctx: RankContext, spec: Spec, payloads, residual, weight, outs) -> None:
    """Set 0's outputs against the one-shot or the owner reference."""
    from kernels.reference.allreduce import all_reduce_norm, owner_all_reduce_norm

    if spec.mode == "owner":
        ref_norm, ref_res = owner_all_reduce_norm(payloads, residual, weight, spec.eps,
                                                  owner=ctx.rank)
    else:
        ref_norm, ref_res = all_reduce_norm(payloads, residual, weight, spec.eps)
    assert_bit_exact(outs[1, 0], ref_res, "residual_out")
    assert_within_ulp(outs[0, 0], ref_norm, NORM_MAX_ULP, "norm_out")


def _one_shot_baseline(ctx: RankContext, spec: Spec, x, sets: int, shared, weight):
    """``one_shot`` (owner-mode cases): the one-shot fused kernel on the same
    inputs ``x(i)`` with a full ``[M, hidden]`` residual of its own."""
    m, h = spec.tokens, spec.hidden
    residuals = randn((sets, m, h), shared, ctx.device)
    outs = torch.empty(2, sets, m, h, dtype=BF16, device=ctx.device)

    def make() -> Call:
        op = host_kernel(ctx, spec, mode="one_shot")
        return Call(lambda i: op(x(i), residuals[i], weight, out=(outs[0, i], outs[1, i])),
                    {"mode": "one_shot"})
    return {"one_shot": make}


def _epilogue(residuals, weight, spec: Spec):
    """The unfused tail: ``(rms_norm(reduced + residual), reduced + residual)``."""
    def tail(reduced, i):
        s = reduced + residuals[i]
        return torch.nn.functional.rms_norm(s, (spec.hidden,), weight, spec.eps), s
    return tail


def all_reduce_norm_workload(ctx: RankContext, spec: Spec) -> Workload:
    check_capacity(ctx, spec)
    m, h, dev, r = spec.tokens, spec.hidden, ctx.device, _owned(ctx, spec)
    set_bytes = (m + 3 * r) * h * 2  # x, residual, norm_out, residual_out
    sets = rotation_sets(spec.rotate_mb, set_bytes)
    mine, shared = generators(ctx, spec)
    xs = randn((sets, m, h), mine, dev)
    residuals = randn((sets, r, h), shared, dev)
    weight = randn((h,), shared, dev, scale=0.1, offset=1.0)
    outs = torch.empty(2, sets, r, h, dtype=BF16, device=dev)

    def fused() -> Call:
        op = host_kernel(ctx, spec)
        if spec.plant_delay_cycles and op.form(xs[0]) != "single":
            raise Unavailable(f"plant_delay_cycles: M={m} runs the {op.form(xs[0])}-kernel "
                              f"form here, and only the single kernel carries a planted delay")
        return Call(lambda i: op(xs[i], residuals[i], weight, out=(outs[0, i], outs[1, i])),
                    {"mode": spec.mode, "form": op.form(xs[0]),
                     "variant": op.variant(xs[0])})

    def check() -> None:
        _check_norm(ctx, spec, ctx.gather(xs[0]), residuals[0], weight, outs)

    if spec.mode == "owner":
        baselines = _one_shot_baseline(ctx, spec, lambda i: xs[i], sets, shared, weight)
    else:
        baselines = all_reduce_baselines(ctx, (m, h), lambda i: xs[i],
                                         _epilogue(residuals, weight, spec))
        from cluster.measure.workloads.flashinfer import flashinfer_baselines
        baselines.update(flashinfer_baselines(ctx, spec, xs, residuals, weight))
    return Workload("all_reduce_norm", sets, set_bytes, m * h * 2, all_reduce_factor(ctx.tp),
                    fused, check, baselines)


def torch_finalize(gemm2, weights, idx, shared_out):
    """The unfused MoE finalize: gather the routed rows, FP32 weighted sum,
    + shared expert, rounded to BF16 ([M, hidden]); -1 routes contribute 0."""
    held = idx >= 0
    rows = gemm2[idx.clamp_min(0).long()]  # [M, K, H]
    w = torch.where(held, weights.float(), torch.zeros_like(weights, dtype=torch.float32))
    routed = (rows.float() * w.unsqueeze(-1)).sum(1)
    return (routed + shared_out.float()).to(BF16)


def finalize_publish_workload(ctx: RankContext, spec: Spec) -> Workload:
    from kernels.moe import MoEOutput, RoutedExperts
    from kernels.reference.moe import MoEPartial, finalize_payloads

    check_capacity(ctx, spec)
    if spec.top_k is None:
        raise ValueError("finalize_publish timing needs top_k in the spec")
    m, h, k, dev, r = spec.tokens, spec.hidden, spec.top_k, ctx.device, _owned(ctx, spec)
    set_bytes = ((m * k + m) + 3 * r) * h * 2  # routed rows, shared, residual, 2 outputs
    sets = rotation_sets(spec.rotate_mb, set_bytes)
    mine, shared = generators(ctx, spec)
    gemm2 = randn((sets, m * k, h), mine, dev)
    weights = torch.rand(sets, m, k, generator=mine).to(dev)
    idx = torch.stack([torch.randperm(m * k, generator=mine) for _ in range(sets)]).to(
        torch.int32).view(sets, m, k).to(dev)
    shared_out = randn((sets, m, h), mine, dev)
    residuals = randn((sets, r, h), shared, dev)
    weight = randn((h,), shared, dev, scale=0.1, offset=1.0)
    outs = torch.empty(2, sets, r, h, dtype=BF16, device=dev)
    moes = [MoEOutput(RoutedExperts(gemm2[i], weights[i], idx[i]), shared_out[i])
            for i in range(sets)]

    def fused() -> Call:
        op = host_kernel(ctx, spec)
        return Call(lambda i: op(moes[i], residuals[i], weight, out=(outs[0, i], outs[1, i])),
                    {"top_k": k, "expert_weights": "float32", "mode": spec.mode,
                     "form": op.form(moes[0]), "variant": op.variant(moes[0])})

    def check() -> None:
        parts = [MoEPartial(*p) for p in zip(ctx.gather(gemm2[0]), ctx.gather(weights[0]),
                                             ctx.gather(idx[0]), ctx.gather(shared_out[0]))]
        _check_norm(ctx, spec, finalize_payloads(parts, fma=True), residuals[0], weight, outs)

    if spec.mode == "owner":
        baselines = _one_shot_baseline(ctx, spec, lambda i: moes[i], sets, shared, weight)
    else:
        baselines = all_reduce_baselines(
            ctx, (m, h), lambda i: torch_finalize(gemm2[i], weights[i], idx[i], shared_out[i]),
            _epilogue(residuals, weight, spec))
    return Workload("finalize_publish", sets, set_bytes, m * h * 2, all_reduce_factor(ctx.tp),
                    fused, check, baselines)
