"""``finalize_publish``: AllReduceNorm fed a MoE output whose routed top-k
reduction is still open; the finalize (weighted sum of the routed GEMM2 rows
plus the shared expert) runs inside the publish
(:mod:`kernels.lamport.finalize_publish`).

Inputs per rank: a :class:`kernels.reference.moe.MoEPartial` (``[M*top_k,
H]`` GEMM2 rows in permuted order, ``[M, top_k]`` routing weights,
route indices with -1 for experts held elsewhere, a shared-expert partial)
plus residual and norm weight as :mod:`cluster.ops.all_reduce_norm`. Kinds:
``random`` (FP32 weights, about 30 % of routes -1, token 0 holds no route on
rank 0), ``bf16_weights`` (the BF16-weight kernel), ``no_route`` (the last
rank holds no route at all and the last token is routed nowhere: only the
shared expert arrives), ``order_sensitive`` / ``sentinel_pattern`` (one route
of weight 1 carries :mod:`kernels.reference.numerics`' partials, so the
payload is exactly those values, -0.0 sanitized). The emulated publish is
the rank's :func:`kernels.reference.moe.moe_finalize` (exact-FMA
emulation); outputs and bounds as all_reduce_norm
(:func:`kernels.reference.moe.all_reduce_norm_finalize`).
"""

from __future__ import annotations

from cluster.ops import all_reduce_norm as arn
from cluster.ops.spec import Field, OpSpec, positive_int, shared

SPEC = OpSpec(
    name="finalize_publish",
    summary="MoE finalize fused into the Lamport publish, then residual add + RMSNorm",
    collective=True,
    impl=__name__,
    inputs=("random", "bf16_weights", "no_route", "order_sensitive", "sentinel_pattern"),
    fields={"top_k": Field(8, positive_int, "a positive int (routes per token)"),
            "residual": arn.SPEC.fields["residual"], "mode": arn.SPEC.fields["mode"],
            "form": arn.SPEC.fields["form"]},
    reference="kernels.reference.moe:all_reduce_norm_finalize",
    golden="kernels.reference.cases",
    compile_variants="kernels.lamport.compile_variants.finalize_publish_variants",
    baselines=("unfused", "one_shot"),  # one_shot: owner mode's
    faults=arn.COLLECTIVE_FAULTS,
    workload="cluster.measure.workloads.norm.finalize_publish_workload",
    kernel="cluster.ops.finalize_publish.kernel",
)
HELD = 0.7
"""Probability that a route of the random kinds is held by the rank."""


def moe_partials(kind: str, tp: int, tokens: int, hidden: int, top_k: int, seed: int, *,
                 fp32_weights: bool = True) -> list:
    """One :class:`kernels.reference.moe.MoEPartial` per rank (module doc)."""
    import torch

    from kernels.reference.moe import MoEPartial

    wdtype = torch.float32 if fp32_weights else torch.bfloat16
    g = torch.Generator().manual_seed(seed)
    out = []
    if kind in ("order_sensitive", "sentinel_pattern"):
        values = arn.partials(kind, tp, tokens, hidden, seed)
        for r in range(tp):
            idx = torch.full((tokens, top_k), -1, dtype=torch.int32)
            idx[:, 0] = torch.arange(tokens, dtype=torch.int32)
            weights = torch.rand(tokens, top_k, generator=g)
            weights[:, 0] = 1.0
            out.append(MoEPartial(values[r].contiguous(), weights.to(wdtype), idx,
                                  torch.zeros(tokens, hidden, dtype=torch.bfloat16)))
        return out
    if kind not in ("random", "bf16_weights", "no_route"):
        raise ValueError(f"unknown MoE input kind {kind!r}")
    rows = tokens * top_k
    for r in range(tp):
        gemm2 = torch.randn(rows, hidden, generator=g).to(torch.bfloat16)
        weights = torch.rand(tokens, top_k, generator=g).to(wdtype)
        perm = torch.randperm(rows, generator=g).to(torch.int32).view(tokens, top_k)
        keep = torch.rand(tokens, top_k, generator=g) < HELD
        if r == 0:
            keep[0] = False
        if kind == "no_route":
            keep[-1] = False
            if r == tp - 1:
                keep[:] = False
        idx = torch.where(keep, perm, torch.full_like(perm, -1))
        shared = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
        out.append(MoEPartial(gemm2, weights, idx, shared))
    return out


def make_inputs(case, *, tp: int, hidden: int, tokens: int) -> dict:
    residual, weight = arn.residual_and_weight(case, tokens, hidden)
    moes = moe_partials(case.inputs, tp, tokens, hidden, case.params.top_k, case.seed,
                        fp32_weights=case.inputs != "bf16_weights")
    return {"moes": moes, "residual": residual, "norm_weight": weight, "tp": tp}


def payloads(inputs: dict):
    """``[tp, M, H]`` BF16 on the CPU: every rank's finalize payload (exact
    FMA), computed on ``inputs["reference_device"]`` where the caller set one
    (:func:`cluster.cases.case_inputs`: a GPU rank's own device). Bit for bit
    the CPU's result there (``tests/test_reference_moe.py``, its CUDA test),
    and a few milliseconds where the CPU's exact-FMA emulation in FP64 takes
    about 0.3 s a call at tp 8, M 64, top_k 8."""
    from kernels.reference.moe import MoEPartial, finalize_payloads

    def make():
        device = inputs.get("reference_device")
        moes = inputs["moes"]
        if device is not None:
            moes = [MoEPartial(*(None if t is None else t.to(device) for t in
                                 (p.gemm2_permuted, p.expert_weights,
                                  p.expanded_idx_to_permuted_idx, p.shared_output)))
                    for p in moes]
        return finalize_payloads(moes, fma=True).cpu()
    return shared(inputs, "payloads", make)


def payload(case, inputs: dict, rank: int):
    return payloads(inputs)[rank]


def epilogue(case, inputs: dict, reduced, rank: int) -> dict:
    return arn.norm_epilogue(case, inputs, reduced, rank)


def expected(case, inputs: dict, *, tp: int, facts: dict) -> dict:
    return arn.norm_expected(case, payloads(inputs), inputs, facts)


def moe_output(partial, device):
    """A :class:`kernels.moe.MoEOutput` on ``device`` from a reference partial."""
    from kernels.moe import MoEOutput, RoutedExperts

    shared = partial.shared_output
    return MoEOutput(RoutedExperts(partial.gemm2_permuted.to(device),
                                   partial.expert_weights.to(device),
                                   partial.expanded_idx_to_permuted_idx.to(device)),
                     None if shared is None else shared.to(device))


def kernel(params, *, eps: float, **where):
    """``AllReduceNorm(top_k=...)`` (:func:`cluster.ops.all_reduce_norm.norm_kernel`),
    whose publish finalizes a MoE output of ``params.top_k`` routes per
    token; ``mode`` and ``form`` as :func:`cluster.ops.all_reduce_norm.kernel`."""
    return arn.norm_kernel(eps=eps, mode=params.mode, form=params.form, top_k=params.top_k,
                           **where)


class RankKernel(arn.RankKernel):
    """AllReduceNorm(top_k=...) publishing a MoEOutput (the finalize publish)."""

    @staticmethod
    def key(case, budget_ns: int) -> tuple:
        return ("finalize_publish", budget_ns, float(case.eps), int(case.params.top_k),
                case.params.mode, case.params.form)

    def x(self, case, inputs: dict, rank: int, device):
        return moe_output(inputs["moes"][rank], device)


class VirtualKernel(arn.VirtualKernel):
    x = RankKernel.x
