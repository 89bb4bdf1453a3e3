"""``all_reduce_norm``: Lamport all-reduce + residual add + RMSNorm
(:class:`kernels.lamport.all_reduce_norm.AllReduceNorm`).

Inputs: every rank's BF16 partial ``[M, H]`` (``random`` normals,
``order_sensitive`` 2^24/+1/-2^24 across ranks, ``sentinel_pattern`` -0.0
and negative subnormals: :mod:`kernels.reference.numerics`), a residual
(``residual = "zeros"`` makes residual_out the BF16 sum bit for bit, so a
GPU consumer that does not output the sum still shows it) and a norm
weight, all from the case's seed. Outputs: ``sum`` and ``residual`` bit for
bit against the FP32 rank-ordered reference, ``norm`` within 1 BF16 ULP
(:func:`kernels.reference.allreduce.all_reduce_norm`).

``mode``: ``one_shot`` (every rank gets every token) or ``owner`` (the
token-sharded reduce-scatter, :class:`AllReduceNorm` docstring): rank r's
residual and outputs are its owned rows ``[ceil(M / tp), H]`` (row j = token
j * tp + r) and the reference is the one-shot reference's rows for them
(:func:`kernels.reference.allreduce.owner_view`; the rank comes with the
check as ``facts["rank"]``).
"""

from __future__ import annotations

from cluster.ops.kernel import lamport
from cluster.ops.spec import Field, OpSpec, shared
from kernels.lamport.norm_tuning import FORMS
from kernels.lamport.protocol import MODES

SPEC = OpSpec(
    name="all_reduce_norm",
    summary="TP all-reduce + residual add + RMSNorm (AllReduceNorm)",
    collective=True,
    impl=__name__,
    inputs=("random", "order_sensitive", "sentinel_pattern"),
    fields={"residual": Field("random", ("random", "zeros"),
                              "zeros: residual_out is BF16(sum) bit for bit"),
            "mode": Field("one_shot", MODES, "one_shot (all-reduce) or owner (reduce-scatter)",
                          kernel_only=True),
            "form": Field("auto", FORMS, "auto: the form table (kernels.lamport.norm_tuning); "
                          "two / single / single+cluster / single+nosync: force one "
                          "(ranks of their own process only)",
                          kernel_only=True)},
    reference="kernels.reference.allreduce:all_reduce_norm",
    golden="kernels.reference.cases",
    compile_variants="kernels.lamport.compile_variants.all_reduce_norm_variants",
    baselines=("unfused", "symm_mem", "flashinfer", "one_shot"),  # one_shot: owner mode's
    faults=("skip_publish", "late_within_budget", "late_beyond_budget", "token_count_differs",
            "stage_out_of_bounds", "stage_stale", "negative_zero_payload", "unsanitized_lane",
            "dirty_mailbox", "stuck_rank"),
    workload="cluster.measure.workloads.norm.all_reduce_norm_workload",
    kernel="cluster.ops.all_reduce_norm.kernel",
)
COLLECTIVE_FAULTS = SPEC.faults
"""Every fault kind of the fault table (docs/design.md, The fault table): each applies to any op that
publishes into a Lamport mailbox (the protocol is the same)."""


def partials(kind: str, tp: int, tokens: int, hidden: int, seed: int):
    """``[tp, M, H]`` BF16 partials of one of the three generic input kinds."""
    from kernels.reference import numerics

    if kind == "order_sensitive":
        return numerics.order_sensitive_partials(tp, tokens, hidden)
    if kind == "sentinel_pattern":
        return numerics.sentinel_pattern_partials(tp, tokens, hidden, seed=seed)
    if kind == "random":
        return numerics.random_partials(tp, tokens, hidden, seed=seed)
    raise ValueError(f"unknown partials kind {kind!r}; known: random, order_sensitive, "
                     f"sentinel_pattern")


def residual_and_weight(case, tokens: int, hidden: int):
    """``(residual [M, H], norm_weight [H])`` BF16 from seed + 1 (``case``'s
    op declares ``residual``)."""
    import torch

    g = torch.Generator().manual_seed(case.seed + 1)
    residual = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    if case.params.residual == "zeros":
        residual = torch.zeros_like(residual)
    weight = (torch.randn(hidden, generator=g) * 0.5 + 1).to(torch.bfloat16)
    return residual, weight


def make_inputs(case, *, tp: int, hidden: int, tokens: int) -> dict:
    residual, weight = residual_and_weight(case, tokens, hidden)
    return {"partials": partials(case.inputs, tp, tokens, hidden, case.seed),
            "residual": residual, "norm_weight": weight, "tp": tp}


def rows_of(case, t, tp: int, rank: int):
    """Rank ``rank``'s rows of a token-indexed ``[M, ...]`` tensor: all of
    them (one-shot) or its owned ``ceil(M / tp)`` rows (owner mode; ``case``'s
    op declares ``mode``)."""
    if case.params.mode != "owner":
        return t
    from kernels.reference.allreduce import owner_view
    return owner_view(t, tp, rank)


def payload(case, inputs: dict, rank: int):
    return inputs["partials"][rank]


def norm_epilogue(case, inputs: dict, reduced, rank: int) -> dict:
    """``sum``, ``residual`` and ``norm`` from the reduced BF16 sum (owner
    mode: this rank's owned rows of it)."""
    from kernels.reference.allreduce import add_residual, rms_norm

    residual_out = add_residual(reduced, rows_of(case, inputs["residual"], inputs["tp"], rank))
    return {"sum": reduced, "residual": residual_out,
            "norm": rms_norm(residual_out, inputs["norm_weight"], case.eps)}


def epilogue(case, inputs: dict, reduced, rank: int) -> dict:
    return norm_epilogue(case, inputs, reduced, rank)


def norm_expected(case, payloads, inputs: dict, facts: dict) -> dict:
    """The one-shot reference, or in owner mode its rows of ``facts["rank"]``."""
    from kernels.reference.allreduce import all_reduce_norm, all_reduce_sum

    def reference() -> dict:
        norm_ref, residual_ref = all_reduce_norm(payloads, inputs["residual"],
                                                 inputs["norm_weight"], case.eps)
        return {"sum": (all_reduce_sum(payloads), 0), "residual": (residual_ref, 0),
                "norm": (norm_ref, 1)}
    out = shared(inputs, "norm_reference", reference)
    if case.params.mode == "owner":
        if "rank" not in facts:
            raise ValueError("owner mode: the reference needs the checked rank (facts['rank'])")
        out = {k: (rows_of(case, ref, inputs["tp"], facts["rank"]), bound)
               for k, (ref, bound) in out.items()}
    return out


def expected(case, inputs: dict, *, tp: int, facts: dict) -> dict:
    return norm_expected(case, inputs["partials"], inputs, facts)


def kernel(params, *, eps: float, **where):
    """``AllReduceNorm`` (one rank) or its ``VirtualRanks`` (``tp`` ranks), the
    builder contract of :mod:`cluster.ops.kernel`: ``mode`` and ``form`` from
    ``params`` (:func:`norm_kernel`)."""
    return norm_kernel(eps=eps, mode=params.mode, form=params.form, **where)


def norm_kernel(*, eps: float, mode: str = "one_shot", form: str = "auto",
                top_k: int | None = None, plant_delay_cycles: int = 0, **where):
    """The ``AllReduceNorm`` construction the builders of this op,
    :mod:`cluster.ops.finalize_publish` and :mod:`cluster.ops.embed_norm`
    share: any ``form`` but ``auto`` forces the one-shot form and its stage
    agreement (:func:`kernels.lamport.norm_tuning.forced`; virtual ranks
    always run two kernels, so a single form there is a ValueError);
    ``top_k`` (routes per token) makes the publish a MoE finalize;
    ``plant_delay_cycles`` (a timing spec's, test-only: :mod:`jobs.plant`)
    slows the single kernel on purpose, one rank of its own process only."""
    from kernels.lamport.all_reduce_norm import AllReduceNorm
    from kernels.lamport.norm_tuning import forced

    tuning = forced(form)
    options = {}
    if where.get("tp") is not None:
        if form.startswith("single"):
            raise ValueError(f"form = {form!r}: tp = {where['tp']} virtual ranks run the "
                             f"two-kernel form only (kernels.lamport.norm_single)")
    elif tuning is not None:
        options["norm_tuning"] = tuning
    if plant_delay_cycles:
        if where.get("tp") is not None:
            raise ValueError(f"plant_delay_cycles: tp = {where['tp']} virtual ranks run the "
                             f"two-kernel form, which carries no planted delay")
        options["plant_delay_cycles"] = int(plant_delay_cycles)
    return lamport(AllReduceNorm, eps=float(eps), mode=mode, top_k=top_k, **where, **options)


class RankKernel:
    """One rank's AllReduceNorm on a GPU mailbox (driven by :class:`cluster.gpu.rank.GpuRank`)."""

    def __init__(self, mailbox, *, hidden: int, capacity: int, transport: str,
                 budget_ns: int, case) -> None:
        from cluster import ops

        self.kernel = ops.get(case.op).build_kernel(
            case.params, eps=case.eps, hidden=hidden, capacity=capacity, budget_ns=budget_ns,
            mailbox=mailbox, transport=transport)
        self.hidden = hidden

    @staticmethod
    def key(case, budget_ns: int) -> tuple:
        return ("all_reduce_norm", budget_ns, float(case.eps), case.params.mode,
                case.params.form)

    def x(self, case, inputs: dict, rank: int, device):
        return inputs["partials"][rank].contiguous().to(device)

    def load(self, case, inputs: dict, rank: int, device) -> None:
        import torch

        from kernels.reference.numerics import poison_

        self.case = case
        self.xd = self.x(case, inputs, rank, device)
        self.residual = rows_of(case, inputs["residual"], inputs["tp"], rank).to(device)
        self.weight = inputs["norm_weight"].to(device)
        self.out = (poison_(torch.empty_like(self.residual)),
                    poison_(torch.empty_like(self.residual)))
        self.tokens = self.kernel.validate(self.xd, self.residual, self.weight, self.out)

    def call(self) -> None:
        """The whole call as a caller makes it (``AllReduceNorm.__call__``:
        the form its table picks); the rank splits publish and consume only
        for the faults that need it (``cluster.gpu.rank.SPLIT_FAULTS``)."""
        self.kernel(self.xd, self.residual, self.weight, out=self.out)

    def publish(self) -> None:
        self.kernel.publish(self.xd)

    def consume(self) -> None:
        self.kernel.consume(self.residual, self.weight, self.out, tokens=self.tokens)

    def outputs(self) -> dict:
        from cluster.bits import bits_from_bf16

        norm, residual = (bits_from_bf16(t.cpu()) for t in self.out)
        zeros = self.case.params.residual == "zeros"
        return {"sum": residual.copy() if zeros else None, "residual": residual, "norm": norm}

    def facts(self) -> dict:
        return {}


class VirtualKernel:
    """tp AllReduceNorm ranks in one process (VirtualRanks) over static
    buffers, capturable in a CUDA graph (driven by :mod:`cluster.gpu.virtual`)."""

    def __init__(self, *, tp: int, hidden: int, capacity: int, budget_ns: int, case) -> None:
        from cluster import ops

        self.group = ops.get(case.op).build_kernel(case.params, eps=case.eps, tp=tp,
                                                   hidden=hidden, capacity=capacity,
                                                   budget_ns=budget_ns)
        self.tp, self.hidden, self.buffers = tp, hidden, None

    def load(self, case, inputs: dict, tokens: int) -> None:
        import torch

        from kernels.reference.numerics import poison_

        self.case = case
        dev = self.group.device
        xs = [self.x(case, inputs, r, dev) for r in range(self.tp)]
        residuals = [rows_of(case, inputs["residual"], self.tp, r) for r in range(self.tp)]
        if self.buffers is None or self.buffers["shapes"] != shapes(xs):
            self.buffers = {"shapes": shapes(xs), "xs": xs,
                            "residuals": [res.to(dev) for res in residuals],
                            "weight": inputs["norm_weight"].to(dev),
                            "outs": [(torch.empty_like(res, device=dev),
                                      torch.empty_like(res, device=dev)) for res in residuals]}
        b = self.buffers
        for r in range(self.tp):
            copy_into(b["xs"][r], xs[r])
            b["residuals"][r].copy_(residuals[r])
        b["weight"].copy_(inputs["norm_weight"])
        for pair in b["outs"]:
            for t in pair:
                poison_(t)

    x = RankKernel.x

    def __call__(self) -> None:
        b = self.buffers
        self.group(b["xs"], b["residuals"], b["weight"], outs=b["outs"])

    def outputs(self, rank: int) -> dict:
        from cluster.bits import bits_from_bf16

        norm, residual = (bits_from_bf16(t.cpu()) for t in self.buffers["outs"][rank])
        zeros = self.case.params.residual == "zeros"
        return {"sum": residual.copy() if zeros else None, "residual": residual, "norm": norm}

    def facts(self) -> dict:
        return {}


def shapes(value) -> tuple:
    """The shapes of every tensor in ``value`` (a tensor, a dataclass of
    tensors such as MoEOutput, or a sequence of those), None for None."""
    import dataclasses

    if isinstance(value, (list, tuple)):
        return tuple(shapes(v) for v in value)
    if dataclasses.is_dataclass(value):
        return tuple(shapes(getattr(value, f.name)) for f in dataclasses.fields(value))
    return None if value is None else tuple(value.shape)


def copy_into(static, value) -> None:
    """Copy ``value`` into the static buffer of the same structure and
    shapes (:func:`shapes`): a tensor or a dataclass of tensors."""
    import dataclasses

    if dataclasses.is_dataclass(static):
        for f in dataclasses.fields(static):
            copy_into(getattr(static, f.name), getattr(value, f.name))
    elif static is not None:
        static.copy_(value)
