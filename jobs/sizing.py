"""How much memory a case needs, estimated before anything is allocated.

A TP group's cases share one mailbox sized for their largest M (the
capacity), so the estimate is per group key (``Case.group_key``):

- mailbox, per rank: ``[3, tp, capacity, hidden]`` BF16 (``mailbox_shape``)
  plus its header page;
- inputs and outputs, per rank: every rank regenerates the group's partials
  ``[tp, M, hidden]`` BF16, the residual and three outputs ``[M, hidden]``
  BF16, and the reference's FP32 sum ``[tp, M, hidden]``;
- per node: all ``tp`` ranks of an emulated group share one host's
  shared memory (STRICT_PACK), as do those of a shared-GPU or virtual-rank
  group on one GPU's device memory; a process-per-GPU rank holds its own
  GPU, so the per-node figure there is per device.

A group over the ceiling is refused (ConfigError, exit 2) before Ray
starts. The ceiling, in GiB per node: ``--memory-limit-gb``, else
LAMPORT_MEMORY_LIMIT_GB, else the suite's ``memory_limit_gb``, else half of
this machine's smaller of RAM and ``/dev/shm`` (:func:`default_limit_bytes`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
from collections.abc import Iterable

from jobs.config import Case, ConfigError
from kernels.lamport.protocol import mailbox_shape

GIB = 1 << 30
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
        return (f"{c.op} tp={c.tp} hidden={c.hidden} capacity={self.capacity} "
                f"(placement {c.placement}): mailbox [3, {c.tp}, {self.capacity}, {c.hidden}] "
                f"BF16 = {self.mailbox_per_rank / GIB:.3g} GiB and inputs/outputs "
                f"{self.io_per_rank / GIB:.3g} GiB per rank, {self.per_node / GIB:.3g} GiB per "
                f"node ({self.ranks_per_node} rank(s) on one node's "
                f"{'device' if c.placement in _DEVICE else 'shared'} memory)")


_DEVICE = ("process-per-gpu", "shared-gpu", "virtual-ranks")


def estimate(cases: Iterable[Case]) -> list[Estimate]:
    """One Estimate per TP group of ``cases``, largest per-node first."""
    groups: dict[tuple, Case] = {}
    for case in cases:
        key = (case.job, *case.group_key)
        if key not in groups or case.tokens > groups[key].tokens:
            groups[key] = case
    out = []
    for case in groups.values():
        capacity, tp, hidden = case.tokens, case.tp, case.hidden
        mailbox = HEADER_BYTES + math.prod(mailbox_shape(tp, capacity, hidden)) * BF16
        elements = capacity * hidden
        io = (tp + 4) * elements * BF16 + tp * elements * FP32
        out.append(Estimate(case=case, capacity=capacity, mailbox_per_rank=mailbox,
                            io_per_rank=io,
                            ranks_per_node=1 if case.placement == "process-per-gpu" else tp))
    return sorted(out, key=lambda e: -e.per_node)


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
            value = float(env)
        except ValueError:
            value = float("nan")
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{ENV}={env!r} must be a positive finite number of GiB")
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
