"""The GPU rank's result fields from the kernels' error buffer.

The watchdog consumer leaves, per rank, an error buffer (records, the
missing / unsanitized source masks, the bad-stage flag) and the stage state;
:class:`kernels.lamport.mailbox.RankErrors` decodes them. This turns one
decoded buffer plus the host's stage facts into the fields of the backend
result contract (cluster.backend), so :class:`kernels.lamport.diagnosis.RankReport`
and :func:`kernels.lamport.diagnosis.diagnose` make the group view for the GPU path
exactly as for the emulated one. Pure (no CUDA).
"""

from __future__ import annotations

from kernels.lamport.mailbox import RankErrors
from kernels.lamport.protocol import LAMPORT_GENERATIONS


def mask_ranks(mask: int) -> list[int]:
    return [i for i in range(32) if mask >> i & 1]


def result_fields(errors: RankErrors, *, seq: int, tokens: int, expected_stage: int,
                  next_stage_before: int, published: bool) -> dict:
    """Result fields of one call. ``errors``: the rank's decoded error buffer
    and stage state after the call; ``next_stage_before``: NEXT_STAGE as the
    host read it just before the publish (after any injection);
    ``published``: whether the publish was launched.

    - published_stage: the stage the publish wrote, None when it was not
      launched or its bounds check refused (NEXT_STAGE >= 3);
    - consumed_stage: ACTIVE_STAGE after the call, which the consumer read
      (the consumer never writes it);
    - headers: the GPU kernels publish no (seq, M) header, so none; the
      token counts each rank reports still let the group view name a
      token-count mismatch.
    """
    in_bounds = 0 <= next_stage_before < LAMPORT_GENERATIONS
    return {
        "rank": errors.rank, "seq": int(seq), "tokens": int(tokens),
        "expected_stage": int(expected_stage),
        "published_stage": int(next_stage_before) if published and in_bounds else None,
        "consumed_stage": int(errors.active_stage),
        "bad_stage": errors.bad_stage,
        "missing_sources": mask_ranks(errors.missing_mask),
        "partial_sources": mask_ranks(errors.unsanitized_mask),
        "headers": [],
        "records": [[r.token, r.source, r.fragment, r.stage, list(r.words)]
                    for r in errors.records],
        "record_count": int(errors.count),
        "header_mismatch": False,
    }
