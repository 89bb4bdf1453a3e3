"""Pieces the workloads share: seeded inputs and the all-reduce baselines
(NCCL, torch symmetric memory) that run a payload through an all-reduce
and then the op's torch epilogue."""

from __future__ import annotations

from collections.abc import Callable

import torch

from cluster.measure.workload import Call, RankContext, Spec

BF16 = torch.bfloat16


def generators(ctx: RankContext, spec: Spec) -> tuple[torch.Generator, torch.Generator]:
    """(this rank's own, the one every rank shares): CPU generators seeded by
    ``(seed, rank)`` and by ``seed``."""
    return (torch.Generator().manual_seed(spec.seed * 1009 + ctx.rank),
            torch.Generator().manual_seed(spec.seed))


def randn(shape, g: torch.Generator, device, dtype=BF16, scale: float = 1.0,
          offset: float = 0.0) -> torch.Tensor:
    """``offset + scale * N(0, 1)`` on ``device``, reproducible from the CPU
    generator ``g``: on a CPU device drawn from ``g``; on a GPU drawn there,
    by a generator seeded with one draw from ``g`` (the rotation sets are
    100+ MB at small M: made on the host they cost a profile case ~0.2 s
    per tensor, 1 thread). Ranks drawing from a shared ``g`` get equal
    tensors on GPUs of one model (the Philox stream is the same)."""
    device = torch.device(device)
    if device.type == "cpu":
        return (offset + scale * torch.randn(shape, generator=g)).to(dtype)
    seed = int(torch.randint(0, 2**62, (1,), generator=g))
    on_device = torch.Generator(device=device).manual_seed(seed)
    return (offset + scale * torch.randn(shape, generator=on_device, device=device)).to(dtype)


def host_kernel(ctx: RankContext, spec: Spec, **fields):
    """This rank's fused kernel, built by the op's one builder (the one the
    GPU ranks use, ``OpSpec.build_kernel``) from ``spec``'s fields
    overlaid with ``fields`` (the op's typed params, ``OpSpec.make_params``),
    on ``ctx``'s mailbox and device."""
    from cluster import ops

    op = ops.get(spec.op)
    return op.build_kernel(
        op.make_params({**spec.fields(), **fields}), eps=spec.eps, hidden=spec.hidden,
        capacity=ctx.capacity, budget_ns=spec.budget_ns, mailbox=ctx.mailbox,
        transport=spec.transport, device=ctx.device,
        **({"plant_delay_cycles": spec.plant_delay_cycles} if spec.plant_delay_cycles else {}))


def check_capacity(ctx: RankContext, spec: Spec) -> None:
    if not 1 <= spec.tokens <= ctx.capacity:
        raise ValueError(f"tokens must be in 1..capacity={ctx.capacity}, got {spec.tokens}")


def all_reduce_factor(tp: int) -> float:
    """nccl-tests' bus factor of an all-reduce: 2 (tp - 1) / tp."""
    return 2 * (tp - 1) / tp


def nccl_baseline(ctx: RankContext, shape: tuple[int, int], payload: Callable[[int], torch.Tensor],
                  tail: Callable[[torch.Tensor, int], object]) -> Callable[[], Call]:
    """``unfused``: copy ``payload(i)`` into a buffer, NCCL ``all_reduce`` it
    (its default algorithm; the identity at tp=1), then ``tail(reduced, i)``."""
    def make() -> Call:
        if ctx.tp == 1:
            return Call(lambda i: tail(payload(i), i), {"all_reduce": "identity (tp=1)"})
        import torch.distributed as dist
        buf = torch.empty(shape, dtype=BF16, device=ctx.device)

        def fn(i):
            buf.copy_(payload(i))
            dist.all_reduce(buf)
            return tail(buf, i)
        return Call(fn, {"all_reduce": "nccl"})
    return make


def symm_mem_baseline(ctx: RankContext, shape: tuple[int, int],
                      payload: Callable[[int], torch.Tensor],
                      tail: Callable[[torch.Tensor, int], object]) -> Callable[[], Call]:
    """``symm_mem``: torch symmetric memory ``one_shot_all_reduce`` (unicast;
    multicast stays off) of ``payload(i)`` then ``tail(reduced, i)``; at tp=1
    over a world-size-1 group."""
    def make() -> Call:
        import torch.distributed._symmetric_memory as sm
        name = ctx.group_name()
        buf = sm.empty(*shape, dtype=BF16, device=ctx.device)
        sm.rendezvous(buf, name)

        def fn(i):
            buf.copy_(payload(i))
            return tail(torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", name), i)
        return Call(fn, {"all_reduce": "symm_mem one_shot_all_reduce"})
    return make


def all_reduce_baselines(ctx: RankContext, shape, payload, tail) -> dict[str, Callable[[], Call]]:
    return {"unfused": nccl_baseline(ctx, shape, payload, tail),
            "symm_mem": symm_mem_baseline(ctx, shape, payload, tail)}
