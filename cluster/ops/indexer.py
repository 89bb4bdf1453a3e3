"""``indexer``: the DSA indexer's projection (key, head weights, kpool gate),
the fused kernel (projection + query epilogue) and the ``IndexerStage``
dispatch (:mod:`kernels.indexer`). Not a collective: no Lamport exchange,
so the emulated backend cannot carry it; on GPUs it runs on each rank
actor's GPU on its own, and its rows say ``collective=false``.

Inputs: ``x`` ``[M, K]`` BF16 (``K`` = the case's hidden), ``q`` ``[M, heads *
128]`` BF16 with an all-zero head on token 1 (the amax floor), ``qr`` ``[M,
64]`` for the stage; the module's weights from a generator seeded by
``K + heads``. ``path``:

- ``projection``: the table's tactic; key, head weights and gate within
  :func:`kernels.reference.indexer.projection_error_bound` of the exact
  FP64 product;
- ``fused`` (M <= the fused kernel's limit): q FP8 bytes, scaled head
  weights and gate bit for bit against the projection kernel with the fused
  tactic plus :func:`kernels.reference.indexer.indexer_query`, normed key
  within 1 BF16 ULP (docs/design.md, Numerical contract: the fused kernel equals the projection
  kernel with the same tactic bit for bit);
- ``stage``: ``Indexer.forward`` inside a planned step (the stage picks the
  fused or two-step path) against the stock forward: gate within 1.5 BF16
  ULP of ``sum |x w|`` (tests/gpu/test_indexer_gpu.py's bound).
"""

from __future__ import annotations

from cluster.ops.spec import Field, OpSpec

SPEC = OpSpec(
    name="indexer",
    summary="DSA indexer projection / fused projection + query epilogue / IndexerStage dispatch",
    collective=False,
    impl=__name__,
    inputs=("random",),
    fields={"heads": Field(64, (32, 64), "indexer heads"),
            "path": Field("fused", ("projection", "fused", "stage"), "which indexer path")},
    reference="kernels.reference.indexer:indexer_fused",
    golden="kernels.reference.cases",
    compile_variants="kernels.indexer.checks.indexer_variants",
    baselines=("stock",),
    faults=(),
    workload="cluster.measure.workloads.projection.indexer_workload",
    kernel="cluster.ops.indexer.kernel",
    needs_gpu="needs a GPU: not a collective; runs on each rank actor's GPU",
    virtual_ranks=False,
)
Q_LORA_RANK = 64
SUM_ULP_BOUND = 1.5
"""Stage gate vs the stock forward, in BF16 ULPs of sum |x w|."""


def make_inputs(case, *, tp: int, hidden: int, tokens: int) -> dict:
    import torch

    from kernels.indexer.layout import DIM

    heads = int(case.params.heads)
    g = torch.Generator().manual_seed(case.seed * 1000 + tokens)
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    q = (2 * torch.randn(tokens, heads * DIM, generator=g)).to(torch.bfloat16)
    if tokens > 1:
        q[1, :DIM] = 0
    qr = torch.randn(tokens, Q_LORA_RANK, generator=g).to(torch.bfloat16)
    return {"x": x, "q": q, "qr": qr}


def expected(case, inputs: dict, *, tp: int, facts: dict) -> dict:
    raise ValueError("the indexer's check needs the GPU module's weights: the rank checks "
                     "(cluster.ops.indexer.RankKernel.check)")


def _entry(mismatches: int, elements: int, max_ulp: float, nan: bool, bound) -> dict:
    return {"elements": int(elements), "mismatches": int(mismatches), "max_ulp": float(max_ulp),
            "nan": bool(nan), "bound_ulp": bound, "ok": mismatches == 0 and not nan}


def _exact(got, ref) -> dict:
    from kernels.reference.numerics import bits

    same = bits(got) == bits(ref)
    nan = bool(torch_isnan(got))
    return _entry(int((~same).sum()), got.numel(), 0.0 if bool(same.all()) else float("inf"),
                  nan, 0)


def torch_isnan(t) -> bool:
    import torch

    return bool(torch.isnan(t.float()).any()) if t.is_floating_point() else False


def kernel(params, *, hidden: int, eps: float | None = None, capacity: int = 0,
           budget_ns: int = 0, tp: int | None = None, mailbox=None, transport: str = "unicast", device=None,
           seed: int | None = None):
    """``(Indexer, IndexerProjection)`` on one GPU, the builder contract of
    :mod:`cluster.ops.kernel`: ``hidden`` is the projection's K, ``heads``
    comes from ``params``, the weights from ``seed`` (default ``hidden +
    heads``); on ``device``, else the mailbox's, else the current CUDA
    device. Not a collective: no ``tp`` (ValueError), and eps, the capacity,
    budget and transport do not apply."""
    import torch

    from kernels.indexer.projection import IndexerProjection
    from kernels.indexer.stage import Indexer

    if tp is not None:
        raise ValueError(f"indexer: not a collective, so no tp ranks in one process; "
                         f"got tp = {tp}")
    heads = int(params.heads)
    if device is None:
        device = mailbox.device if mailbox is not None else torch.device("cuda")
    seed = hidden + heads if seed is None else seed
    module = Indexer(hidden=hidden, q_lora_rank=Q_LORA_RANK, heads=heads, device=device,
                     generator=torch.Generator().manual_seed(seed))
    return module, IndexerProjection(module)


class RankKernel:
    """The indexer on this rank's GPU (the mailbox is not used)."""

    def __init__(self, mailbox, *, hidden: int, capacity: int, transport: str,
                 budget_ns: int, case) -> None:
        self.indexer, self.projection = SPEC.build_kernel(
            case.params, eps=case.eps, hidden=hidden, capacity=capacity, budget_ns=budget_ns,
            mailbox=mailbox, transport=transport)
        self.path, self.device = case.params.path, self.projection.device

    @staticmethod
    def key(case, budget_ns: int) -> tuple:
        return ("indexer", int(case.params.heads), case.params.path)

    def load(self, case, inputs: dict, rank: int, device) -> None:
        self.x, self.q, self.qr = (inputs[k].to(device) for k in ("x", "q", "qr"))
        m = self.x.shape[0]
        if self.path == "fused" and m > self.projection.fused_max_tokens:
            raise ValueError(f"indexer path fused: tokens = {m} exceeds the fused kernel's "
                             f"limit {self.projection.fused_max_tokens}")
        self.projection.validate(self.x)
        self.result = None

    def publish(self) -> None:
        """Not a collective: nothing to publish."""

    def consume(self) -> None:
        """Run the path (projection, fused or stage) on this GPU."""
        from kernels.indexer.layout import padded_heads
        from kernels.indexer.stage import IndexerStage, planned_step

        ind, proj = self.indexer, self.projection
        if self.path == "projection":
            self.result = proj(self.x)
        elif self.path == "fused":
            scale = ind.softmax_scale * ind.n_head ** -0.5
            self.padded = padded_heads(ind.n_head)
            self.pre = proj(self.x, tactic=proj.fused_tactic(self.x.shape[0]))
            self.result = proj.fused(self.x, self.q, ind.k_norm, scale, self.padded)
            self.scale = scale
        else:
            stock = ind.forward(self.x, self.qr)
            stage = IndexerStage(ind)
            try:
                with planned_step():
                    got = ind.forward(self.x, self.qr)
            finally:
                stage.uninstall()
            self.result = (got, stock)

    def outputs(self) -> dict:
        """Bits of every output (what the rows count); the check is :meth:`check`."""
        from cluster.bits import tensor_bits

        if self.path == "stage":
            got = self.result[0]
            return {"gate_score": tensor_bits(got["gate_score"])}
        names = (("key", "weights", "gate") if self.path == "projection"
                 else ("q_fp8", "weights", "key", "gate"))
        return {n: tensor_bits(t) for n, t in zip(names, self.result)}

    def check(self) -> dict:
        """The path's contract (module docstring), in cluster.cases.compare's format."""
        import torch

        from kernels.reference.indexer import indexer_query, projection_error_bound
        from kernels.reference.numerics import Comparison, ulp_in_sum_abs

        torch.cuda.synchronize(self.device)
        proj, x = self.projection, self.x
        w = proj.weight
        parts = {"key": w[:proj.key], "weights": w[proj.key:proj.key + proj.heads],
                 "gate": w[proj.key + proj.heads:]}
        report: dict = {"ok": True}
        if self.path == "projection":
            tactic = proj.tactic_for(x.shape[0])
            for name, got in zip(("key", "weights", "gate"), self.result):
                exact = x.double() @ parts[name].double().T
                allowed = projection_error_bound(x, parts[name], tactic)
                if got.dtype == torch.bfloat16:  # plus the output's own rounding
                    allowed = allowed + 0.5 * _ulp(exact)
                bad = ~((got.double() - exact).abs() <= allowed)
                report[name] = _entry(int(bad.sum()), got.numel(),
                                      0.0, torch_isnan(got), "projection_error_bound")
        elif self.path == "fused":
            ind = self.indexer
            key_pre, w_pre, gate_pre = self.pre
            ref_q, ref_w, ref_key = indexer_query(
                self.q, key_pre, w_pre, ind.k_norm.weight.data, ind.k_norm.bias.data,
                eps=ind.k_norm.eps, scale=self.scale, padded=self.padded,
                weights_dtype=torch.float32, ue8m0=True)
            q_out, w_out, key, gate = self.result
            report["q_fp8"] = _exact(q_out, ref_q)
            report["weights"] = _exact(w_out, ref_w)
            report["gate"] = _exact(gate, gate_pre)
            cmp = Comparison(key, ref_key)
            report["key"] = _entry(0 if cmp.max_ulp <= 1 else cmp.mismatches, key.numel(),
                                   cmp.max_ulp, torch_isnan(key), 1)
        else:
            got, stock = self.result
            g, s = got["gate_score"], stock["gate_score"].detach()
            sum_abs = x.double().abs() @ parts["gate"].double().abs().T
            ulps = ulp_in_sum_abs(g, s, sum_abs)
            bad = ~(ulps <= SUM_ULP_BOUND)
            report["gate_score"] = _entry(int(bad.sum()), g.numel(), float(ulps.max()),
                                          torch_isnan(g), SUM_ULP_BOUND)
        for name, entry in report.items():
            if name != "ok":
                report["ok"] &= entry["ok"]
        return report

    def facts(self) -> dict:
        return {"collective": False}


def _ulp(values):
    from kernels.reference.numerics import bf16_ulp_at

    return bf16_ulp_at(values.abs())
