"""``embed_norm``: the vocab-parallel embedding publish and the MTP layer's
``[enorm(embedding), hnorm(previous)]`` (``AllReduceNorm.embed_norm``).

Rank r owns token ids ``[r * VOCAB_PER_RANK, (r + 1) * VOCAB_PER_RANK)`` of
a BF16 table (every 7th column -0.0, which the publish sanitizes) and
publishes, per token, its row or zeros: exactly one rank owns each id, so
the reduced sum is that row bit for bit. Kinds: ``random`` (ids drawn from
the vocabulary, the first ones at every shard's edges, id 0 and an id no
rank owns; position 0 on the first token and every 5th), ``shard_edges``
(only edge ids and the unowned id), ``sentinel_pattern`` (table rows of
-0.0 and negative subnormals). Outputs: ``sum`` (the reduced embedding,
emulated only: the GPU consumer does not output it) bit for bit,
``embedding`` (``enorm`` half, zero at position 0) and ``hidden`` (the
``hnorm`` half) within 1 BF16 ULP (:func:`kernels.reference.embed.embed_norm`).
"""

from __future__ import annotations

from cluster.ops import all_reduce_norm as arn
from cluster.ops.spec import OpSpec, shared

SPEC = OpSpec(
    name="embed_norm",
    summary="vocab-parallel embedding publish + [enorm(embedding), hnorm(previous)]",
    collective=True,
    impl=__name__,
    inputs=("random", "shard_edges", "sentinel_pattern"),
    fields={"form": arn.SPEC.fields["form"]},
    reference="kernels.reference.embed:embed_norm",
    golden="kernels.reference.cases",
    compile_variants="kernels.lamport.compile_variants.embed_norm_variants",
    baselines=("unfused",),
    faults=arn.COLLECTIVE_FAULTS,
    workload="cluster.measure.workloads.embed.embed_norm_workload",
    kernel="cluster.ops.embed_norm.kernel",
)
VOCAB_PER_RANK = 16


def make_inputs(case, *, tp: int, hidden: int, tokens: int) -> dict:
    import torch

    from kernels.reference import numerics

    seed, kind = case.seed, case.inputs
    g = torch.Generator().manual_seed(seed)
    v = VOCAB_PER_RANK
    if kind == "sentinel_pattern":
        tables = list(numerics.sentinel_pattern_partials(tp, v, hidden, seed=seed))
    else:
        tables = [torch.randn(v, hidden, generator=g).to(torch.bfloat16) for _ in range(tp)]
        for t in tables:
            t[:, ::7] = -0.0
    edges = [e for r in range(tp) for e in (r * v, (r + 1) * v - 1)] + [0, tp * v + 7]
    fixed = torch.tensor(edges, dtype=torch.int32)
    if kind == "shard_edges":
        ids = fixed[torch.randint(0, fixed.numel(), (tokens,), generator=g)]
    else:
        ids = torch.randint(0, tp * v, (tokens,), generator=g, dtype=torch.int32)
        n = min(tokens, fixed.numel())
        ids[:n] = fixed[torch.randperm(fixed.numel(), generator=g)[:n]]
    positions = torch.randint(1, 4096, (tokens,), generator=g, dtype=torch.int64)
    positions[::5] = 0
    previous = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    enorm = (1 + 0.1 * torch.randn(hidden, generator=g)).to(torch.bfloat16)
    hnorm = (1 + 0.1 * torch.randn(hidden, generator=g)).to(torch.bfloat16)
    return {"tables": [t.contiguous() for t in tables], "ids": ids.to(torch.int32),
            "positions": positions, "previous": previous, "enorm": enorm, "hnorm": hnorm}


def payload(case, inputs: dict, rank: int):
    from kernels.reference.embed import embedding_payload

    return embedding_payload(inputs["ids"], inputs["tables"][rank], rank * VOCAB_PER_RANK)


def epilogue(case, inputs: dict, reduced, rank: int) -> dict:
    import torch

    from kernels.reference.allreduce import rms_norm

    zero = (inputs["positions"] == 0)[:, None]
    embedding = torch.where(zero, torch.zeros_like(reduced), reduced)
    return {"sum": reduced, "embedding": rms_norm(embedding, inputs["enorm"], case.eps),
            "hidden": rms_norm(inputs["previous"], inputs["hnorm"], case.eps)}


def expected(case, inputs: dict, *, tp: int, facts: dict) -> dict:
    from kernels.reference.allreduce import all_reduce_sum
    from kernels.reference.embed import embed_norm, embedding_payload

    def reference() -> dict:
        shards = [(t, r * VOCAB_PER_RANK) for r, t in enumerate(inputs["tables"])]
        out = embed_norm(inputs["ids"], inputs["positions"], inputs["previous"], shards,
                         inputs["enorm"], inputs["hnorm"], case.eps)
        h = out.shape[1] // 2
        reduced = all_reduce_sum([embedding_payload(inputs["ids"], w, s) for w, s in shards])
        return {"sum": (reduced, 0), "embedding": (out[:, :h].contiguous(), 1),
                "hidden": (out[:, h:].contiguous(), 1)}
    return shared(inputs, "embed_reference", reference)


def kernel(params, *, eps: float, **where):
    """The embedding publish is ``AllReduceNorm``'s
    (:func:`cluster.ops.all_reduce_norm.norm_kernel`), one-shot, its ``form``
    from ``params``: the builder contract of :mod:`cluster.ops.kernel`."""
    return arn.norm_kernel(eps=eps, form=params.form, **where)


def _split(out):
    from cluster.bits import bits_from_bf16

    h = out.shape[1] // 2
    return {"sum": None, "embedding": bits_from_bf16(out[:, :h].cpu()),
            "hidden": bits_from_bf16(out[:, h:].cpu())}


class RankKernel:
    """One rank's AllReduceNorm embedding path; its shard lives in one
    persistent buffer registered once (prepare_embedding compiles)."""

    def __init__(self, mailbox, *, hidden: int, capacity: int, transport: str,
                 budget_ns: int, case) -> None:
        import torch

        self.kernel = SPEC.build_kernel(case.params, eps=case.eps, hidden=hidden,
                                        capacity=capacity, budget_ns=budget_ns, mailbox=mailbox,
                                        transport=transport)
        self.table = torch.empty(VOCAB_PER_RANK, hidden, dtype=torch.bfloat16,
                                 device=mailbox.device)
        self.kernel.prepare_embedding(self.table, mailbox.rank * VOCAB_PER_RANK)
        self.hidden = hidden

    @staticmethod
    def key(case, budget_ns: int) -> tuple:
        return ("embed_norm", budget_ns, float(case.eps), case.params.form)

    def load(self, case, inputs: dict, rank: int, device) -> None:
        import torch

        from kernels.reference.numerics import poison_

        self.table.copy_(inputs["tables"][rank])
        self.args = [inputs[k].to(device) for k in ("ids", "positions", "previous", "enorm",
                                                    "hnorm")]
        m = self.args[0].shape[0]
        self.out = poison_(torch.empty(m, 2 * self.hidden, dtype=torch.bfloat16, device=device))
        ids, positions, previous, enorm, hnorm = self.args
        self.kernel.validate_embedding(ids, positions, previous, self.table, enorm, hnorm,
                                       self.out)

    def call(self) -> None:
        """The whole call as a caller makes it (``AllReduceNorm.embed_norm``:
        the form its table picks); the rank splits publish and consume only
        for the faults that need it."""
        ids, positions, previous, enorm, hnorm = self.args
        self.kernel.embed_norm(ids, positions, previous, self.table, enorm, hnorm, out=self.out)

    def publish(self) -> None:
        self.kernel.publish_embedding(self.args[0], self.table)

    def consume(self) -> None:
        _, positions, previous, enorm, hnorm = self.args
        self.kernel.consume_embedding(positions, previous, self.table, enorm, hnorm, self.out)

    def outputs(self) -> dict:
        return _split(self.out)

    def facts(self) -> dict:
        return {}


class VirtualKernel:
    """tp ranks' embedding path in one process (VirtualRanks.embed_norm)."""

    def __init__(self, *, tp: int, hidden: int, capacity: int, budget_ns: int, case) -> None:
        import torch

        self.group = SPEC.build_kernel(case.params, eps=case.eps, tp=tp, hidden=hidden,
                                       capacity=capacity, budget_ns=budget_ns)
        dev = self.group.device
        self.tables = [torch.empty(VOCAB_PER_RANK, hidden, dtype=torch.bfloat16, device=dev)
                       for _ in range(tp)]
        self.group.prepare_embedding(self.tables, [r * VOCAB_PER_RANK for r in range(tp)])
        self.tp, self.hidden, self.args = tp, hidden, None

    def load(self, case, inputs: dict, tokens: int) -> None:
        import torch

        from kernels.reference.numerics import poison_

        dev = self.group.device
        for t, src in zip(self.tables, inputs["tables"]):
            t.copy_(src)
        new = [inputs[k].to(dev) for k in ("ids", "positions", "previous", "enorm", "hnorm")]
        if self.args is None or self.args[0].shape[0] != tokens:
            self.args = new
            self.outs = [torch.empty(tokens, 2 * self.hidden, dtype=torch.bfloat16, device=dev)
                         for _ in range(self.tp)]
        else:
            for static, value in zip(self.args, new):
                static.copy_(value)
        for o in self.outs:
            poison_(o)

    def __call__(self) -> None:
        ids, positions, previous, enorm, hnorm = self.args
        self.group.embed_norm(ids, positions, previous, self.tables, enorm, hnorm, outs=self.outs)

    def outputs(self, rank: int) -> dict:
        return _split(self.outs[rank])

    def facts(self) -> dict:
        return {}
