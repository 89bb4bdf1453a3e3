"""embed_norm: the vocab-parallel embedding publish + the enorm / hnorm
consumer (``AllReduceNorm.embed_norm``, the MTP draft's input).

Each rank owns ``VOCAB_ROWS`` rows of the vocabulary (ids ``[rank * V,
(rank + 1) * V)``), one table for every set (a real shard is larger; rows are
picked at random, so the gathered rows do not sit in L2). Per rotation set:
ids (shared; some at shard edges, one no rank owns), positions (shared;
position 0 every 5th token), the previous hidden state and the output
``[M, 2 * hidden]``. Check against :func:`kernels.reference.embed.embed_norm`
over every rank's shard: both halves within ``NORM_MAX_ULP``, the embedding
zero at position 0.
"""

from __future__ import annotations

import torch

from cluster.measure.graph import rotation_sets
from cluster.measure.workload import Call, RankContext, Spec, Workload
from cluster.measure.workloads.common import (BF16, all_reduce_baselines, all_reduce_factor,
                                              check_capacity, generators, host_kernel, randn)
from kernels.reference.numerics import NORM_MAX_ULP, assert_within_ulp

VOCAB_ROWS = 4096
"""Rows of the vocabulary each rank owns in the timed workload."""


def embed_ids(sets: int, m: int, tp: int, g: torch.Generator) -> torch.Tensor:
    """``[sets, M]`` int32 ids: random over every shard, the first tokens of
    each set at the shard edges and one id past the vocabulary."""
    vocab = tp * VOCAB_ROWS
    ids = torch.randint(0, vocab, (sets, m), generator=g, dtype=torch.int32)
    edges = [e for r in range(tp) for e in (r * VOCAB_ROWS, (r + 1) * VOCAB_ROWS - 1)] + [vocab + 7]
    n = min(m, len(edges))
    ids[:, :n] = torch.tensor(edges[:n], dtype=torch.int32)
    return ids


def embed_norm_workload(ctx: RankContext, spec: Spec) -> Workload:
    from kernels.reference.embed import embed_norm

    check_capacity(ctx, spec)
    m, h, dev, tp = spec.tokens, spec.hidden, ctx.device, ctx.tp
    set_bytes = m * (4 + 8) + m * h * 2 * 2 + m * 2 * h * 2  # ids, positions, previous, rows, out
    sets = rotation_sets(spec.rotate_mb, set_bytes)
    mine, shared = generators(ctx, spec)
    table = randn((VOCAB_ROWS, h), mine, dev)
    start = ctx.rank * VOCAB_ROWS
    ids = embed_ids(sets, m, tp, shared).to(dev)
    positions = torch.randint(1, 4096, (sets, m), generator=shared, dtype=torch.int64)
    positions[:, ::5] = 0
    positions = positions.to(dev)
    previous = randn((sets, m, h), shared, dev)
    enorm = randn((h,), shared, dev, scale=0.1, offset=1.0)
    hnorm = randn((h,), shared, dev, scale=0.1, offset=1.0)
    outs = torch.empty(sets, m, 2 * h, dtype=BF16, device=dev)

    def fused() -> Call:
        op = host_kernel(ctx, spec)
        op.prepare_embedding(table, start, VOCAB_ROWS)
        return Call(lambda i: op.embed_norm(ids[i], positions[i], previous[i], table, enorm,
                                            hnorm, out=outs[i]),
                    {"vocab_rows_per_rank": VOCAB_ROWS, "form": op.embed_form(ids[0]),
                     "variant": op.embed_variant(ids[0])})

    def check() -> None:
        shards = [(w, r * VOCAB_ROWS) for r, w in enumerate(ctx.gather(table))]
        ref = embed_norm(ids[0], positions[0], previous[0], shards, enorm, hnorm, spec.eps)
        assert_within_ulp(outs[0, :, :h], ref[:, :h], NORM_MAX_ULP, "enorm(embedding)")
        assert_within_ulp(outs[0, :, h:], ref[:, h:], NORM_MAX_ULP, "hnorm(previous)")
        if bool((outs[0, positions[0] == 0, :h] != 0).any()):
            raise AssertionError("embedding not zeroed at position 0")

    def payload(i):
        local = ids[i].long() - start
        owned = (local >= 0) & (local < VOCAB_ROWS)
        rows = table[local.clamp(0, VOCAB_ROWS - 1)]
        return torch.where(owned[:, None], rows, torch.zeros_like(rows))

    def tail(reduced, i):
        emb = torch.where((positions[i] == 0)[:, None], torch.zeros_like(reduced), reduced)
        return torch.cat([torch.nn.functional.rms_norm(emb, (h,), enorm, spec.eps),
                          torch.nn.functional.rms_norm(previous[i], (h,), hnorm, spec.eps)], -1)

    return Workload("embed_norm", sets, set_bytes, m * h * 2, all_reduce_factor(tp), fused,
                    check, all_reduce_baselines(ctx, (m, h), payload, tail))
