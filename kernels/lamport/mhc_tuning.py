"""How the mHC consumer (:mod:`kernels.lamport.mhc`) is launched: one table,
keyed by ``(hidden, tp, arch)``, with a default rule for every other shape.

A tuning is data only (a frozen dataclass, part of the compile-cache key):

- ``cluster_size``: CTAs a token (1..8, the portable cluster limit); they
  split the token's ``hidden / 8`` fragments and reduce the sum of squares
  through distributed shared memory;
- ``threads``: threads a CTA (a whole number of warps, <= 1024);
- ``rank_lanes``: 1, 2, 4 or 8 adjacent threads share the poll of one
  fragment's tp source ranks (lane ``l`` polls ranks ``l, l + R, ...``) and
  combine their partial sums with a butterfly; it must divide tp.

A CTA covers ``threads / rank_lanes`` fragments a trip, the cluster
``cluster_size`` times that; a token takes ``ceil(fragments / that)`` trips
(at most :data:`MAX_TRIPS`, since every trip keeps its residual streams in
registers).

Provenance (``source``, not part of the key):
- ``seed``: the seed's launch (FlashInfer's ``LL_ALL_REDUCE_GB300_TP{4,8}_H5120``
  presets): hidden 5120, a cluster of 5 x 128 threads, rank_lanes 1, 640
  fragments in one fully used trip;
- ``measured``: hidden 7168 / 8192 at tp=1 on the H200 (sm_90a), the
  one-full-trip rule (7 x 128 = 896 fragments, 8 x 128 = 1024) confirmed by
  ``python -m benchmarks.all_reduce_mhc --sweep --hidden 7168`` / ``8192``
  over every valid cluster size x threads (2026-11-29,
  docs/results/all_reduce_mhc_h200_2026-11-29.md): fastest at M 1, 16 and 64
  for 7168 and at M 1 and 16 for 8192; at 8192 and M=64 a 2 x 512 cluster
  was 1.7% faster (5.96 vs 6.06 us), too little to trade the decode sizes
  for. The same sweep confirmed the seed's 5 x 128 at 5120, tp=1. The sm_100a
  entries copy the H200 choice unmeasured;
- rank_lanes at tp > 1 stays the seed's 1. The sweep at tp 2 / 4 / 8
  (``--sweep --sweep-tp 8,4,2``, virtual ranks on one H200: relative only,
  section 6 of the results page) confirms it at tp=2 (every M) and for 5120
  at tp=8 (M 16, 64); rank lanes 2 won two cells there (5120 at tp=4:
  5 x 128 R2, 7-19% less time; 7168 at tp=8, M <= 16: 7 x 256 R2, up to
  2.2x), left for the real-NVLink timing (issue 10) to decide: a change of
  rank_lanes changes the reduction order the outputs are bit-exact to;
- ``default``: :func:`default_tuning` for any other shape.
"""

from __future__ import annotations

import dataclasses
import math
import os

from kernels.validation import require_tp

from .protocol import MAX_THREADS, VEC_BF16, WARP_SIZE

RANK_LANES = (1, 2, 4, 8)
MAX_CLUSTER = 8
"""The portable cluster size limit (16 needs a non-portable opt-in)."""
MAX_TRIPS = 8
"""Trips a token at most: each keeps ``hc + 2`` fragments in registers."""
ARCHS = ("sm_90a", "sm_100a")
DEFAULT_THREADS = 128


@dataclasses.dataclass(frozen=True)
class MHCTuning:
    cluster_size: int
    threads: int = DEFAULT_THREADS
    rank_lanes: int = 1
    source: str = dataclasses.field(default="explicit", compare=False)

    def validate(self, *, hidden: int, tp: int) -> None:
        """ValueError naming the field and the values when this tuning cannot
        run ``hidden`` at ``tp``."""
        check_geometry(hidden=hidden, tp=tp, cluster_size=self.cluster_size,
                       threads=self.threads, rank_lanes=self.rank_lanes)

    def trips(self, hidden: int) -> int:
        return trips_for(hidden, self.cluster_size, self.threads, self.rank_lanes)


def trips_for(hidden: int, cluster_size: int, threads: int, rank_lanes: int) -> int:
    fragments = hidden // VEC_BF16
    return math.ceil(fragments / (cluster_size * (threads // rank_lanes)))


def check_geometry(*, hidden: int, tp: int, cluster_size: int, threads: int,
                   rank_lanes: int) -> None:
    """Every constraint of the consumer's launch geometry (ValueError naming
    the argument and the values)."""
    if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden <= 0 \
            or hidden % VEC_BF16:
        raise ValueError(f"hidden_size must be a positive multiple of {VEC_BF16}, got {hidden}")
    require_tp("tp", tp)
    if rank_lanes not in RANK_LANES:
        raise ValueError(f"rank_lanes must be one of {list(RANK_LANES)}, got {rank_lanes}")
    if tp % rank_lanes:
        raise ValueError(f"rank_lanes={rank_lanes} must divide tp={tp}")
    if not isinstance(threads, int) or threads <= 0 or threads % WARP_SIZE \
            or threads > MAX_THREADS:
        raise ValueError(f"threads must be a positive multiple of {WARP_SIZE} <= {MAX_THREADS}, "
                         f"got {threads}")
    if not isinstance(cluster_size, int) or not 1 <= cluster_size <= MAX_CLUSTER:
        raise ValueError(f"cluster_size must be in [1, {MAX_CLUSTER}], got {cluster_size}")
    trips = trips_for(hidden, cluster_size, threads, rank_lanes)
    if trips > MAX_TRIPS:
        raise ValueError(
            f"hidden_size={hidden} needs {trips} trips with cluster_size={cluster_size}, "
            f"threads={threads}, rank_lanes={rank_lanes} (at most {MAX_TRIPS}): use more "
            f"CTAs or threads")


def default_tuning(hidden: int, tp: int) -> MHCTuning:
    """One trip where the cluster allows it: 128 threads a CTA (fewer for a
    tiny hidden), as many CTAs (<= 8) as cover the fragments, then more
    threads a CTA; rank_lanes 1 (the seed's)."""
    # hidden and tp themselves (the largest geometry bounds the trips)
    check_geometry(hidden=hidden, tp=tp, cluster_size=MAX_CLUSTER, threads=MAX_THREADS,
                   rank_lanes=1)
    fragments = hidden // VEC_BF16
    threads = min(DEFAULT_THREADS, WARP_SIZE * math.ceil(fragments / WARP_SIZE))
    cluster = min(MAX_CLUSTER, math.ceil(fragments / threads))
    if cluster * threads < fragments:
        threads = min(MAX_THREADS,
                      WARP_SIZE * math.ceil(fragments / (MAX_CLUSTER * WARP_SIZE)))
    tuning = MHCTuning(cluster_size=cluster, threads=threads, rank_lanes=1, source="default")
    tuning.validate(hidden=hidden, tp=tp)
    return tuning


_SEED = "seed"
_MEASURED = "measured"

TABLE: dict[tuple[int, int, str], MHCTuning] = {}
"""``(hidden, tp, arch) -> MHCTuning``; see the module docstring."""
for _arch in ARCHS:
    for _tp in (1, 2, 4, 8):
        TABLE[5120, _tp, _arch] = MHCTuning(cluster_size=5, threads=128, rank_lanes=1,
                                            source=_SEED)
    TABLE[7168, 1, _arch] = MHCTuning(cluster_size=7, threads=128, rank_lanes=1,
                                      source=_MEASURED)
    TABLE[8192, 1, _arch] = MHCTuning(cluster_size=8, threads=128, rank_lanes=1,
                                      source=_MEASURED)
del _arch, _tp


def current_arch() -> str:
    """``CUTE_DSL_ARCH`` if set, else the current CUDA device's
    ``sm_XYa``, else "" (unknown: the table's arch-free default applies)."""
    arch = os.environ.get("CUTE_DSL_ARCH", "")
    if arch:
        return arch
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return f"sm_{major}{minor}a"
    except Exception:  # noqa: BLE001 - no torch / no driver: unknown arch
        pass
    return ""


def tuning_for(hidden: int, tp: int, arch: str | None = None) -> MHCTuning:
    """The table's entry for ``(hidden, tp, arch)`` (``arch`` None: the current
    one), else :func:`default_tuning`; validated for ``hidden`` and ``tp``."""
    arch = current_arch() if arch is None else arch
    tuning = TABLE.get((hidden, tp, arch))
    if tuning is None:
        return default_tuning(hidden, tp)
    tuning.validate(hidden=hidden, tp=tp)
    return tuning
