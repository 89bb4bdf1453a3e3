"""The ``flashinfer`` baseline of all_reduce_norm: FlashInfer's
``trtllm_allreduce_fusion`` (a unicast Lamport all-reduce with residual add
and RMSNorm, CUDA), what vLLM and SGLang run on Hopper instead of ours.

Through FlashInfer's public API: ``flashinfer.comm.create_allreduce_fusion_workspace(
backend="trtllm", ...)`` (never "auto", which may pick a multicast path),
created once per TP group (kept in ``RankContext.cache``, over the group's
capacity), and ``flashinfer.comm.allreduce_fusion(..., pattern=
AllReduceFusionPattern.kARResidualRMSNorm, launch_with_pdl=True,
fp32_acc=True, use_oneshot=...)``. Two rows: ``flashinfer_oneshot`` and
``flashinfer_twoshot`` (two-shot only where M > tp: FlashInfer asserts
``token_num > world_size``). Captured in the same graphs, timed the same
way as ours.

Check (set 0, :func:`contract_diff`): its outputs against the torch
reference within the tolerance its arithmetic allows (it may sum in another
order and keep the FP32 reduction through the residual add, where our
contract rounds it to BF16 first; its RMSNorm has its own rsqrt), and the
count of elements that differ from our bit-exact contract goes to the row's
``extra``.

Its ``trtllm_comm`` module is JIT-built with nvcc on first use (minutes);
the cache lives under ``FLASHINFER_WORKSPACE_BASE`` (default here
``/tmp/flashinfer``; README, GPU section).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from cluster.measure.workload import Call, RankContext, Spec, Unavailable

MODES = ("oneshot", "twoshot")
NOT_IMPORTABLE = "flashinfer is not importable here"
NORM_TOLERANCE_ULP = 2
"""FlashInfer's norm_out vs an FP32 RMSNorm of its own residual_out (BF16 ULPs)."""
WORKSPACE_BASE = "/tmp/flashinfer"


def flashinfer_comm():
    """``(flashinfer.comm, version)``; :class:`Unavailable` when not importable."""
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", WORKSPACE_BASE)
    try:
        import flashinfer
        import flashinfer.comm as comm
    except ImportError as err:
        raise Unavailable(f"{NOT_IMPORTABLE} ({type(err).__name__}: {err})"[:300]) from None
    return comm, getattr(flashinfer, "__version__", "unknown")


def contract_diff(norm_out, residual_out, partials, residual, weight, eps: float) -> dict:
    """Compare FlashInfer's ``(norm_out, residual_out)`` [M, H] BF16 with the
    reference over ``partials`` (every rank's, rank order). Tolerances:
    residual_out within one BF16 ULP of sum |partials| (its reduction order,
    and our contract's BF16 rounding of the reduction it may skip) plus one
    ULP of the result (the final rounding); norm_out within :data:`NORM_TOLERANCE_ULP` of an FP32
    RMSNorm of its own residual_out. AssertionError beyond them; else
    ``{"elements", "residual_out_differs", "norm_out_differs",
    "residual_out_max_ulp", "norm_out_max_ulp"}``: elements whose bits
    differ from our bit-exact contract (the reference)."""
    from kernels.reference.allreduce import all_reduce_norm, rms_norm, stack_partials
    from kernels.reference.numerics import bf16_ulp_at, bf16_ulp_distance, bits

    ref_norm, ref_res = all_reduce_norm(partials, residual, weight, eps)
    stacked = stack_partials(partials).to(torch.float64)
    allowed = bf16_ulp_at(stacked.abs().sum(0)) + bf16_ulp_at(ref_res.to(torch.float64).abs())
    err = (residual_out.to(torch.float64) - ref_res.to(torch.float64)).abs()
    bad = ~(err <= allowed)
    if bool(bad.any()):
        i = tuple(int(v) for v in bad.nonzero()[0])
        raise AssertionError(f"flashinfer residual_out: {int(bad.sum())} elements beyond "
                             f"1 ULP of sum|partials| + 1 ULP; first {i}: got "
                             f"{float(residual_out[i])}, reference {float(ref_res[i])}")
    own = bf16_ulp_distance(norm_out, rms_norm(residual_out, weight, eps))
    if not float(own.max()) <= NORM_TOLERANCE_ULP:
        raise AssertionError(f"flashinfer norm_out: {float(own.max())} BF16 ULP from an FP32 "
                             f"RMSNorm of its residual_out (tolerance {NORM_TOLERANCE_ULP})")
    return {"elements": int(ref_res.numel()),
            "residual_out_differs": int((bits(residual_out) != bits(ref_res)).sum()),
            "norm_out_differs": int((bits(norm_out) != bits(ref_norm)).sum()),
            "residual_out_max_ulp": float(bf16_ulp_distance(residual_out, ref_res).max()),
            "norm_out_max_ulp": float(bf16_ulp_distance(norm_out, ref_norm).max())}


def mode_applies(mode: str, tokens: int, tp: int) -> str | None:
    """Why ``mode`` cannot run at (M, tp), or None."""
    if mode not in MODES:
        raise ValueError(f"flashinfer mode must be one of {MODES}, got {mode!r}")
    if tp < 2:
        return ("flashinfer's fused all-reduce needs a TP group of >= 2 ranks; "
                "not measured at tp=1")
    if mode == "twoshot" and not tokens > tp:
        return f"flashinfer two-shot needs M > tp (token_num > world_size): M={tokens}, tp={tp}"
    return None


def _workspace(ctx: RankContext, comm, hidden: int):
    key = ("flashinfer", hidden, ctx.capacity)
    if key not in ctx.cache:
        ctx.cache[key] = comm.create_allreduce_fusion_workspace(
            backend="trtllm", world_size=ctx.tp, rank=ctx.rank, max_token_num=ctx.capacity,
            hidden_dim=hidden, dtype=torch.bfloat16)
    return ctx.cache[key]


def flashinfer_baselines(ctx: RankContext, spec: Spec, xs, residuals,
                         weight) -> dict[str, Callable[[], Call]]:
    """``{"flashinfer_oneshot": make, "flashinfer_twoshot": make}`` over the
    all_reduce_norm workload's sets (``xs`` this rank's partials)."""
    m, h = spec.tokens, spec.hidden

    def maker(mode: str) -> Callable[[], Call]:
        def make() -> Call:
            why = mode_applies(mode, m, ctx.tp)
            if why:
                raise Unavailable(why)
            comm, version = flashinfer_comm()
            ws = _workspace(ctx, comm, h)
            outs = torch.empty(2, xs.shape[0], m, h, dtype=torch.bfloat16, device=ctx.device)
            pattern = comm.AllReduceFusionPattern.kARResidualRMSNorm

            def fn(i):
                comm.allreduce_fusion(input=xs[i], workspace=ws, pattern=pattern,
                                      launch_with_pdl=True, residual_in=residuals[i],
                                      residual_out=outs[1, i], norm_out=outs[0, i],
                                      rms_gamma=weight, rms_eps=spec.eps,
                                      use_oneshot=mode == "oneshot", fp32_acc=True)
            fn(0)
            torch.cuda.synchronize(ctx.device)
            diff = contract_diff(outs[0, 0], outs[1, 0], ctx.gather(xs[0]), residuals[0],
                                 weight, spec.eps)
            return Call(fn, {"flashinfer_version": version, "mode": mode, "backend": "trtllm",
                             "pdl": True, "fp32_acc": True, "contract_diff": diff})
        return make

    return {f"flashinfer_{mode}": maker(mode) for mode in MODES}
