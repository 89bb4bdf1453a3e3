"""The kernel-builder contract (``OpSpec.kernel``): the one place an op's host
kernel is constructed, for every placement that runs it.

A builder is ``build(params, *, eps, hidden, capacity, budget_ns, tp=None,
mailbox=None, transport="unicast", device=None, **options)``:

- ``params``: the op's own case fields, its typed
  :attr:`cluster.ops.spec.OpSpec.params` value (a case's ``case.params``,
  or :meth:`OpSpec.make_params` of a timing spec's
  :meth:`cluster.measure.workload.Spec.fields`);
- ``eps``: the RMSNorm epsilon (``case.eps``; a builder whose kernel takes
  it per call, or not at all, ignores it);
- ``hidden`` (elements), ``capacity`` (tokens the mailbox holds),
  ``budget_ns`` (the watchdog budget, integer nanoseconds, 0: none);
- ``tp`` None: one rank on ``mailbox`` (the process-per-GPU and shared-GPU
  placements, :class:`cluster.gpu.rank.GpuRank`, and the timed workloads);
  ``tp`` an int: ``tp`` ranks in one process with their own mailboxes (the
  virtual-ranks placement, :mod:`cluster.gpu.virtual`);
- ``options``: what one builder alone takes (named in its docstring).

Its callers are the op's ``RankKernel`` and ``VirtualKernel`` (how a rank or
a virtual group drives the kernel on a case's inputs) and its timed
workload, so the three always build the same kernel from the same fields.
"""

from __future__ import annotations

from typing import Any


def lamport(cls: type, *, hidden: int, capacity: int, budget_ns: int, tp: int | None = None,
            mailbox=None, transport: str = "unicast", device=None, **options: Any):
    """A Lamport host class (``AllReduceNorm``, ``AllReduceMHC``) for one rank
    on ``mailbox``, or ``cls.virtual_ranks`` for ``tp`` ranks in one process.
    ``options`` are the class's own (eps, mode, top_k, hc_mult, ...).
    ValueError, before anything is allocated, when both ``tp`` and
    ``mailbox`` are given (virtual ranks make their own mailboxes)."""
    common = dict(hidden_size=hidden, max_num_tokens=capacity, budget_ns=budget_ns,
                  transport=transport, device=device, **options)
    if tp is None:
        return cls(mailbox=mailbox, **common)
    if mailbox is not None:
        raise ValueError(f"{cls.__name__}: tp = {tp} ranks in one process make their own "
                         f"mailboxes; got a mailbox too")
    return cls.virtual_ranks(tp=tp, **common)
