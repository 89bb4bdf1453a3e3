"""How much memory a case needs, estimated before anything is allocated.

A TP group's cases share one mailbox sized for their largest M (the
capacity), so the estimate is per group key (``Case.group_key``), from the
case with the most bytes:

- mailbox, per rank: ``[3, tp, capacity, hidden]`` BF16 (``mailbox_shape``)
  plus its header page;
- inputs and outputs, per rank: every rank regenerates the group's partials
  ``[tp, M, hidden]`` BF16, the residual and three outputs ``[M, hidden]``
  BF16, and the reference's FP32 sum ``[tp, M, hidden]``; with a MoE
  finalize (``top_k`` routes a token: finalize_publish, all_reduce_mhc with
  finalize) every rank's ``[M * top_k, hidden]`` BF16 rows and their FP32
  products in the reference, for all tp ranks; with mHC (``hc`` streams) the
  ``[M, hc, hidden]`` residual streams in and out (BF16) and their FP32
  reference; for the profile, its input rotation (``rotate_mb``);
- per node: all ``tp`` ranks of an emulated group share one host's
  shared memory (STRICT_PACK), as do those of a shared-GPU or virtual-rank
  group on one GPU's device memory; a process-per-GPU rank holds its own
  GPU, so the per-node figure there is per device (so for the profile,
  which times only process-per-GPU groups).

A group over the ceiling is refused (ConfigError, exit 2) before Ray
starts. The ceiling, in GiB per node: ``--memory-limit-gb``, else
LAMPORT_MEMORY_LIMIT_GB, else the suite's ``memory_limit_gb``, else half of
this machine's smaller of RAM and ``/dev/shm`` (:func:`default_limit_bytes`).
Time is bounded by the fields that multiply calls (``repeats``, ``calls``,
``replays``), each within :data:`jobs.limits.LIMITS`, and every call by its
host deadline (``timeout_s``, also bounded there).
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
from collections.abc import Iterable

from cluster.placement import Placement
from jobs.config import Case, ConfigError
from jobs.limits import LIMITS
from kernels.lamport.protocol import mailbox_shape

GIB = 1 << 30
MIB = 1 << 20
ENV = "LAMPORT_MEMORY_LIMIT_GB"
BF16, FP32 = 2, 4
HEADER_BYTES = 4096
"""A mailbox's meta, stage state and headers, rounded up to a page."""


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Bytes one TP group needs."""
    case: Case
    """The group's case with the largest M (its label names the group)."""
    capacity: int
    mailbox_per_rank: int
    io_per_rank: int
    ranks_per_node: int

    @property
    def per_rank(self) -> int:
        return self.mailbox_per_rank + self.io_per_rank

    @property
    def per_node(self) -> int:
        return self.ranks_per_node * self.per_rank

    def describe(self) -> str:
        c = self.case
        scale = "".join(f" {k}={v}" for k, v in (("top_k", _routes(c)), ("hc", c.hc)) if v)
        return (f"{c.job} {c.op} tp={c.tp} hidden={c.hidden} capacity={self.capacity}{scale} "
                f"(placement {c.placement}): mailbox [3, {c.tp}, {self.capacity}, {c.hidden}] "
                f"BF16 = {self.mailbox_per_rank / GIB:.3g} GiB and inputs/outputs "
                f"{self.io_per_rank / GIB:.3g} GiB per rank, {self.per_node / GIB:.3g} GiB per "
                f"node ({self.ranks_per_node} rank(s) on one node's "
                f"{'device' if c.placement in _DEVICE else 'shared'} memory)")


_DEVICE = (Placement.PROCESS_PER_GPU, Placement.SHARED_GPU, Placement.VIRTUAL_RANKS)


def estimate(cases: Iterable[Case]) -> list[Estimate]:
    """One Estimate per TP group of ``cases``, largest per-node first."""
    groups: dict[tuple, list[Case]] = {}
    for case in cases:
        groups.setdefault((case.job, *case.group_key), []).append(case)
    out = []
    for members in groups.values():
        capacity = max(c.tokens for c in members)
        case = max(members, key=lambda c: (_io_bytes(c, capacity), c.tokens))
        tp, hidden = case.tp, case.hidden
        mailbox = HEADER_BYTES + math.prod(mailbox_shape(tp, capacity, hidden)) * BF16
        out.append(Estimate(case=case, capacity=capacity, mailbox_per_rank=mailbox,
                            io_per_rank=_io_bytes(case, capacity),
                            ranks_per_node=1 if _own_device(case) else tp))
    return sorted(out, key=lambda e: -e.per_node)


def _io_bytes(case: Case, tokens: int) -> int:
    """Inputs, outputs and reference intermediates of one rank for M = ``tokens``."""
    tp, elements = case.tp, tokens * case.hidden
    io = (tp + 4) * elements * BF16 + tp * elements * FP32
    routes = _routes(case)
    io += tp * routes * elements * (BF16 + FP32)  # every rank's MoE rows, FP32 products
    if case.hc:
        io += case.hc * elements * (2 * BF16 + FP32)  # streams in and out, FP32 reference
    if case.job == "profile":
        io += int(case.param("rotate_mb") * MIB)
    return io


def _own_device(case: Case) -> bool:
    """Whether each rank of the case's group holds a device of its own: a
    process-per-GPU placement, and the profile (it times only there; its
    other placements are skipped rows)."""
    return case.placement == Placement.PROCESS_PER_GPU or case.job == "profile"


def _routes(case: Case) -> int:
    """Routes a token of the case's MoE finalize (0: none)."""
    from cluster import ops
    if "top_k" not in ops.get(case.op).fields:
        return 0
    if case.op == "all_reduce_mhc":
        from cluster.ops.all_reduce_mhc import SPEC, top_k
        return top_k(SPEC.make_params({**case.op_fields(), "top_k": case.top_k})) or 0
    return case.top_k or 0


def default_limit_bytes() -> int:
    """Half of the smaller of this machine's RAM and its ``/dev/shm``."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        shm = shutil.disk_usage("/dev/shm").total
    except OSError:
        shm = ram
    return min(ram, shm) // 2


def limit_bytes(cli_gb: float | None, suite_gb: float | None) -> tuple[int, str]:
    """(the ceiling in bytes, where it came from)."""
    if cli_gb is not None:
        return int(cli_gb * GIB), "--memory-limit-gb"
    env = os.environ.get(ENV)
    if env:
        try:
            value = LIMITS["memory_limit_gb"].check(float(env))
        except (TypeError, ValueError) as err:
            what = err if "must" in str(err) else "must be a number of GiB"
            raise ConfigError(f"{ENV}={env!r}: {what}") from None
        return int(value * GIB), ENV
    if suite_gb is not None:
        return int(suite_gb * GIB), "the suite's memory_limit_gb"
    return default_limit_bytes(), "half of this machine's smaller of RAM and /dev/shm"


def check(cases: Iterable[Case], *, cli_gb: float | None = None,
          suite_gb: float | None = None) -> list[Estimate]:
    """The estimates; ConfigError naming the first group over the ceiling."""
    estimates = estimate(cases)
    if not estimates:
        return estimates
    ceiling, source = limit_bytes(cli_gb, suite_gb)
    worst = estimates[0]
    if worst.per_node > ceiling:
        raise ConfigError(f"{worst.describe()} is over the memory ceiling of "
                          f"{ceiling / GIB:.3g} GiB per node ({source}); lower tokens, hidden "
                          f"or tp, or raise --memory-limit-gb / {ENV} / memory_limit_gb")
    return estimates
