"""Reference for ``AllReduceNorm.embed_norm``: the vocab-parallel embedding
publish and the MTP layer's ``[enorm(embedding), hnorm(previous)]``.

Each rank owns the embedding rows of token ids ``[start, start + rows)`` and
publishes, per token, its row or zeros (a -0.0 in a row is sanitized to +0.0,
which cannot change a sum that starts from +0.0). Exactly one rank owns each
id, so the all-reduced sum is that row, bit for bit. The embedding is zeroed
where ``positions == 0``; both halves are RMS-normalized as in
:func:`kernels.reference.allreduce.rms_norm`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernels.reference.allreduce import all_reduce_sum, rms_norm
from kernels.reference.numerics import sanitize_negative_zero
from kernels.validation import require_multiple, require_tensor


def check_shards(shards: Sequence[tuple[torch.Tensor, int]], hidden: int | None = None) -> int:
    """Validate ``[(weight [rows, H] BF16, start), ...]`` (one per rank): same
    hidden, non-overlapping id ranges. Returns hidden."""
    if not shards:
        raise ValueError("shards must hold one (weight, start) per rank, got none")
    spans = []
    for r, (weight, start) in enumerate(shards):
        require_tensor(f"shards[{r}].weight", weight, dtype=torch.bfloat16, shape=(None, hidden))
        hidden = weight.shape[1]
        if start < 0:
            raise ValueError(f"shards[{r}].start must be >= 0, got {start}")
        spans.append((start, start + weight.shape[0], r))
    require_multiple("hidden size", hidden, 8)
    spans.sort()
    for (s0, e0, r0), (s1, _, r1) in zip(spans, spans[1:]):
        if s1 < e0:
            raise ValueError(f"shards {r0} [{s0}, {e0}) and {r1} [{s1}, ...) overlap: "
                             "each token id must be owned by exactly one rank")
    return hidden


def embedding_payload(ids: torch.Tensor, weight: torch.Tensor, start: int) -> torch.Tensor:
    """One rank's published ``[M, H]`` BF16: its row of each id it owns (with
    -0.0 sanitized to +0.0), zeros elsewhere."""
    require_tensor("ids", ids, dtype=torch.int32, shape=(None,))
    rows = weight.shape[0]
    local = ids.long() - start
    owned = (local >= 0) & (local < rows)
    gathered = weight[local.clamp(0, max(rows - 1, 0))]
    gathered = sanitize_negative_zero(gathered)
    return torch.where(owned[:, None], gathered, torch.zeros_like(gathered))


def embed_norm(ids: torch.Tensor, positions: torch.Tensor, previous: torch.Tensor,
               shards: Sequence[tuple[torch.Tensor, int]], enorm: torch.Tensor,
               hnorm: torch.Tensor, eps: float,
               order: Sequence[int] | None = None) -> torch.Tensor:
    """``[M, 2H]`` BF16 ``[enorm(embedding), hnorm(previous)]``.

    Args:
        ids: [M] int32 token ids.
        positions: [M] int64 positions; the embedding is zeroed where 0.
        previous: [M, H] BF16 hidden state of the previous layer.
        shards: per rank, ``(weight [rows, H] BF16, start)``.
        enorm, hnorm: [H] BF16 RMSNorm weights.
    """
    hidden = check_shards(shards)
    require_tensor("ids", ids, dtype=torch.int32, shape=(None,))
    m = ids.shape[0]
    if m < 1:
        raise ValueError("ids must hold at least one token")
    require_tensor("positions", positions, dtype=torch.int64, shape=(m,))
    require_tensor("previous", previous, dtype=torch.bfloat16, shape=(m, hidden))
    require_tensor("enorm", enorm, dtype=torch.bfloat16, shape=(hidden,))
    require_tensor("hnorm", hnorm, dtype=torch.bfloat16, shape=(hidden,))
    partials = [embedding_payload(ids, w, s) for w, s in shards]
    embedding = all_reduce_sum(partials, order)
    embedding = torch.where((positions == 0)[:, None], torch.zeros_like(embedding), embedding)
    return torch.cat([rms_norm(embedding, enorm, eps), rms_norm(previous, hnorm, eps)], dim=-1)
