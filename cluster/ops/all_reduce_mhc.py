"""``all_reduce_mhc``: Lamport all-reduce fused with DSV4.1's mHC post-mix of
``hc`` residual streams, their collapse and RMSNorm
(:class:`kernels.lamport.all_reduce_mhc.AllReduceMHC`); with
``finalize = true`` the payload is a MoE output finalized inside the
publish (:meth:`AllReduceMHC.finalize`: FP32 weights, shared expert).

Inputs: every rank's partial as :mod:`cluster.ops.all_reduce_norm` (or, with
finalize, a MoE partial as :mod:`cluster.ops.finalize_publish`), the
``[M, hc, H]`` residual streams (``sentinel_pattern`` fills them with -0.0
and negative subnormals too: no flush to zero anywhere), post ``[M, hc]``
and pre ``[M, hc]`` FP32, comb ``[M, hc, hc]`` FP32 of both signs, a norm
weight. Outputs: ``sum`` (emulated only) and ``residual_out`` ``[M, hc, H]``
bit for bit against the exact-FMA reference, ``layer_input`` within 1 BF16
ULP (:func:`kernels.reference.mhc.all_reduce_mhc` / ``finalize``; the rank
lanes of the GPU kernel's tuning decide the reduction order, a fact the
rank reports).
"""

from __future__ import annotations

from cluster.ops import all_reduce_norm as arn
from cluster.ops import finalize_publish as fin
from cluster.ops.kernel import lamport
from cluster.ops.spec import Field, OpSpec, positive_int, shared

MAX_HC = 8
"""kernels.lamport.mhc.MAX_HC (repeated here: the registry imports no kernels)."""
DEFAULT_TOP_K = 8
"""The finalize's routes per token when the case gives none."""


def top_k(params) -> int | None:
    """Routes per token of the finalize publish (``params``: this op's
    :attr:`OpSpec.params`), None without finalize."""
    return int(params.top_k or DEFAULT_TOP_K) if params.finalize else None

SPEC = OpSpec(
    name="all_reduce_mhc",
    summary="TP all-reduce + mHC post-mix + collapse + RMSNorm (AllReduceMHC), "
            "optionally with the MoE finalize in the publish",
    collective=True,
    impl=__name__,
    inputs=("random", "order_sensitive", "sentinel_pattern"),
    fields={"hc": Field(4, lambda v: positive_int(v) and v <= MAX_HC,
                        f"an int in 1..{MAX_HC} (residual streams)"),
            "finalize": Field(False, (False, True), "the MoE finalize in the publish"),
            "top_k": Field(None, lambda v: v is None or positive_int(v),
                           f"a positive int (finalize routes per token; default "
                           f"{DEFAULT_TOP_K} with finalize)")},
    reference="kernels.reference.mhc:all_reduce_mhc",
    golden="kernels.reference.cases",
    compile_variants="kernels.lamport.mhc_checks.mhc_variants",
    baselines=("unfused", "symm_mem"),
    faults=arn.COLLECTIVE_FAULTS,
    workload="cluster.measure.workloads.mhc.all_reduce_mhc_workload",
    kernel="cluster.ops.all_reduce_mhc.kernel",
)


def make_inputs(case, *, tp: int, hidden: int, tokens: int) -> dict:
    import torch

    from kernels.reference import numerics

    seed, kind, hc = case.seed, case.inputs, case.params.hc
    g = torch.Generator().manual_seed(seed + 1)
    if kind == "sentinel_pattern":
        residual = numerics.sentinel_pattern_partials(1, tokens * hc, hidden, seed=seed + 2)
        residual = residual.view(tokens, hc, hidden).contiguous()
    else:
        residual = torch.randn(tokens, hc, hidden, generator=g).to(torch.bfloat16)
    inputs = {"residual": residual,
              "post": 2 * torch.rand(tokens, hc, generator=g) - 0.5,
              "comb": torch.randn(tokens, hc, hc, generator=g),
              "pre": torch.rand(tokens, hc, generator=g) + 0.1,
              "norm_weight": (1 + 0.1 * torch.randn(hidden, generator=g)).to(torch.bfloat16)}
    if case.params.finalize:
        inputs["moes"] = fin.moe_partials(kind, tp, tokens, hidden, top_k(case.params), seed)
    else:
        inputs["partials"] = arn.partials(kind, tp, tokens, hidden, seed)
    return inputs


def payloads(case, inputs: dict):
    return fin.payloads(inputs) if case.params.finalize else inputs["partials"]


def payload(case, inputs: dict, rank: int):
    return payloads(case, inputs)[rank]


def epilogue(case, inputs: dict, reduced, rank: int) -> dict:
    from kernels.reference.allreduce import rms_norm
    from kernels.reference.mhc import mhc_post_collapse

    residual_out, prenorm = mhc_post_collapse(reduced, inputs["residual"], inputs["post"],
                                              inputs["comb"], inputs["pre"])
    return {"sum": reduced, "residual_out": residual_out,
            "layer_input": rms_norm(prenorm, inputs["norm_weight"], case.eps)}


def expected(case, inputs: dict, *, tp: int, facts: dict) -> dict:
    from kernels.reference.mhc import all_reduce_mhc, reduce_ranks

    lanes = int(facts.get("rank_lanes", 1))

    def reference() -> dict:
        sent = payloads(case, inputs)
        residual_out, layer_input = all_reduce_mhc(
            sent, inputs["residual"], inputs["post"], inputs["comb"], inputs["pre"],
            inputs["norm_weight"], case.eps, rank_lanes=lanes)
        return {"sum": (reduce_ranks(sent, rank_lanes=lanes), 0),
                "residual_out": (residual_out, 0), "layer_input": (layer_input, 1)}
    return shared(inputs, ("mhc_reference", lanes), reference)


def _mix(inputs: dict, device) -> list:
    return [inputs[k].to(device) for k in ("residual", "post", "comb", "pre", "norm_weight")]


def _outs(tokens: int, hc: int, hidden: int, device):
    import torch

    from kernels.reference.numerics import poison_

    return (poison_(torch.empty(tokens, hc, hidden, dtype=torch.bfloat16, device=device)),
            poison_(torch.empty(tokens, hidden, dtype=torch.bfloat16, device=device)))


def _bits(out) -> dict:
    from cluster.bits import bits_from_bf16

    return {"sum": None, "residual_out": bits_from_bf16(out[0].cpu()),
            "layer_input": bits_from_bf16(out[1].cpu())}


def kernel(params, *, eps: float, **where):
    """``AllReduceMHC`` (one rank) or its ``MHCVirtualRanks`` (``tp`` ranks),
    the builder contract of :mod:`cluster.ops.kernel`: ``hc`` from
    ``params``, and ``top_k`` where ``finalize`` is set (:func:`top_k`);
    ``tuning`` may come as an option (the default: the op's tuning table).
    ``eps`` is not the kernel's: its calls take it."""
    from kernels.lamport.all_reduce_mhc import AllReduceMHC

    return lamport(AllReduceMHC, hc_mult=int(params.hc), top_k=top_k(params), **where)


class RankKernel:
    """One rank's AllReduceMHC (``__call__`` or ``finalize``) on a GPU mailbox."""

    def __init__(self, mailbox, *, hidden: int, capacity: int, transport: str,
                 budget_ns: int, case) -> None:
        self.finalize = bool(case.params.finalize)
        self.kernel = SPEC.build_kernel(case.params, eps=case.eps, hidden=hidden,
                                        capacity=capacity, budget_ns=budget_ns, mailbox=mailbox,
                                        transport=transport)
        self.hidden, self.hc = hidden, int(case.params.hc)

    @staticmethod
    def key(case, budget_ns: int) -> tuple:
        return ("all_reduce_mhc", budget_ns, int(case.params.hc), top_k(case.params))

    def load(self, case, inputs: dict, rank: int, device) -> None:
        tokens = inputs["residual"].shape[0]
        self.mix = _mix(inputs, device)
        self.eps = float(case.eps)
        self.out = _outs(tokens, self.hc, self.hidden, device)
        if self.finalize:
            self.moe = fin.moe_output(inputs["moes"][rank], device)
            r = self.moe.routed
            self.kernel.validate_finalize(r.gemm2_permuted, r.expert_weights,
                                          r.expanded_idx_to_permuted_idx,
                                          self.moe.shared_output, *self.mix, self.eps, self.out)
        else:
            self.x = inputs["partials"][rank].contiguous().to(device)
            self.kernel.validate(self.x, *self.mix, self.eps, self.out)

    def publish(self) -> None:
        if self.finalize:
            r = self.moe.routed
            self.kernel.publish_finalize(r.gemm2_permuted, r.expert_weights,
                                         r.expanded_idx_to_permuted_idx, self.moe.shared_output)
        else:
            self.kernel.publish(self.x)

    def consume(self) -> None:
        self.kernel.consume(*self.mix, self.eps, self.out)

    def outputs(self) -> dict:
        return _bits(self.out)

    def facts(self) -> dict:
        return {"rank_lanes": int(self.kernel.tuning.rank_lanes)}


class VirtualKernel:
    """tp AllReduceMHC ranks in one process (MHCVirtualRanks) over static buffers."""

    def __init__(self, *, tp: int, hidden: int, capacity: int, budget_ns: int, case) -> None:
        self.finalize = bool(case.params.finalize)
        self.group = SPEC.build_kernel(case.params, eps=case.eps, tp=tp, hidden=hidden,
                                       capacity=capacity, budget_ns=budget_ns)
        self.tp, self.hidden, self.hc, self.buffers = tp, hidden, int(case.params.hc), None

    def load(self, case, inputs: dict, tokens: int) -> None:
        from kernels.reference.numerics import poison_

        dev = self.group.device
        self.eps = float(case.eps)
        if self.finalize:
            xs = [fin.moe_output(p, dev) for p in inputs["moes"]]
        else:
            xs = [p.contiguous().to(dev) for p in inputs["partials"]]
        new = {"xs": xs, "mix": _mix(inputs, dev)}
        if self.buffers is None or self.buffers["shapes"] != arn.shapes(xs):
            self.buffers = {"shapes": arn.shapes(xs), **new,
                            "outs": [_outs(tokens, self.hc, self.hidden, dev)
                                     for _ in range(self.tp)]}
        else:
            for r in range(self.tp):
                arn.copy_into(self.buffers["xs"][r], xs[r])
            for static, value in zip(self.buffers["mix"], new["mix"]):
                static.copy_(value)
        for pair in self.buffers["outs"]:
            for t in pair:
                poison_(t)

    def __call__(self) -> None:
        b = self.buffers
        call = self.group.finalize if self.finalize else self.group
        call(b["xs"], *b["mix"], self.eps, outs=b["outs"])

    def outputs(self, rank: int) -> dict:
        return _bits(self.buffers["outs"][rank])

    def facts(self) -> dict:
        return {"rank_lanes": int(self.group.tuning.rank_lanes)}
