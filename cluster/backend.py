"""The seam between a rank actor and what executes the protocol.

A rank actor (:mod:`cluster.actors`) is a thin executor: it owns one
:class:`RankBackend` and forwards to it. ``"emulated"`` runs the Lamport
protocol in numpy over host shared memory (:mod:`cluster.emulated`);
``"gpu"`` runs the CuTe DSL kernels (every op's ``RankKernel`` from
:mod:`cluster.ops`) on a symmetric-memory or CUDA IPC mailbox
(:mod:`cluster.gpu`). Both run whichever op the case names. Any other name
is a ValueError naming the registered ones.

A backend module exports ``Backend``, ``release_rank(group_id, rank)``,
optionally ``actor_env(placement=, tp=)`` (environment variables its rank
actors need), optionally ``UNSUPPORTED_FAULTS`` (fault kind -> why its expected outcome
cannot happen there; the fault campaign skips those with the reason) and optionally
``SUSPECT_AFTER_A_KILL`` (placements whose ranks that survived a killed
peer must not serve another group: :func:`suspect_after_a_kill`) and
optionally ``NEEDS_RENDEZVOUS = True``: then the TP group asks rank 0's
actor for an address and a free port (as Ray Train does) and passes
``master_addr`` / ``master_port`` with the placement in ``setup``'s
``options``.

A backend module may export ``HostHalf``: then the driver makes part of
every call (:class:`cluster.emulated.host.HostHalf`, the emulated
backend's): ``HostHalf(case, faults, tp=, hidden=)`` per call,
``.payload(rank)`` passed as ``run_case(case, payload)``, and
``.finish(result)`` making the rank's ``outputs`` and ``check`` from what
it returned (``sum_bits``: the reduced sum) before the group diagnoses.

A ``Backend`` may offer ``warm_group()``: form and leave a group of one,
so that a process's one-time costs of a group are paid in a pooled
worker's warm-up (``RankActor.warm``) and not by its first real group;
it returns the seconds that took (the gpu backend's: NCCL and symmetric
memory, first used).

Result contract of :meth:`RankBackend.run_case` (a plain dict):

``rank``, ``seq``, ``tokens``        who ran which call with how many tokens
``expected_stage``                   calls since the last reset, modulo 3
``published_stage``                  stage the publish wrote, None if it did not
``consumed_stage``                   ACTIVE_STAGE the consumer read
``bad_stage``                        out-of-range stage value seen, else None
``missing_sources``, ``partial_sources``  sources with a fragment all / partly
                                     sentinel at the deadline (sorted lists)
``headers``                          per source, the (seq, M) header seen, or None
``records``, ``record_count``        watchdog records [token, source, fragment,
                                     stage, [4 x u32]] (capped) and their total
``header_mismatch``                  a header differed from the rank's own
``mailbox_clean``                    own mailbox all sentinel after the call
``mailbox_dirt`` (optional)          when not: where (stage, source, rows,
                                     header seq and M), for the reason
``outputs``                          (a backend without a host half; else
                                     ``sum_bits``, the BF16 reduced sum)
                                     the op's outputs by name (cluster.ops: e.g.
                                     ``sum``, ``residual``, ``norm`` for
                                     all_reduce_norm) as bit arrays (NaN where
                                     not computed)
``publish_ns``, ``consume_ns``       wall time of the two phases
``publish_start_ns`` (optional)      ``time.monotonic_ns()`` as the publish began
                                     (the mark ``publish_ns`` counts from;
                                     :mod:`cluster.stragglers`)
``host_ns`` (optional)               the call's host time by phase
                                     (:mod:`cluster.phases`: inputs, load,
                                     call, readback, check), ns
``check`` (optional)                 cluster.cases.check_outputs made on the rank
                                     (the group then uses it instead of checking
                                     on the driver)
``collective`` (optional)            False for an op that is no collective (the
                                     indexer): the protocol fields then say that
                                     nothing was published or awaited

A rank actor also offers ``run_cases(batch)`` (cluster.actors): the calls
of a batch in order in one Ray call, each result streamed back as its call
ends, stopping after the first result that is not :func:`rank_clean`. A
backend may offer ``plan(case)``: told the batch's next call while it runs
the current one, it makes that call's inputs and reference on a helper
thread (:mod:`cluster.ahead`; the gpu backend does).

An output may be None where the backend cannot observe it (the GPU consumers
do not write the reduced sum; all_reduce_norm shows it with a zero
residual); the check then reports it as not observed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from cluster.cases import Case

BACKENDS = {"emulated": "cluster.emulated", "gpu": "cluster.gpu"}
"""Backend name -> module exporting ``Backend`` (a RankBackend class) and
``release_rank(group_id, rank)`` (frees what a rank that died without
close() left on its node)."""


class RankBackend(Protocol):
    """One rank of one TP group. Calls on one backend never overlap."""

    def setup(self, *, group_id: str, rank: int, tp: int, capacity: int, hidden: int,
              timeout_s: float, options: dict | None = None) -> dict:
        """Join the group (rendezvous with the peers, bounded by ``timeout_s``),
        check the own mailbox, scrub it if dirty; returns ``{"rank", "start_check"}``
        with the MailboxCheck as found (a dict). ``options``: backend specific
        (gpu: master_addr, master_port, placement, transport); unknown names
        are a ValueError."""

    def prepare(self, case: Case) -> dict:
        """Build (compile) what ``case`` needs before any rank's call starts;
        the group calls it on every rank once per new (budget_ns, eps)."""

    def run_case(self, case: Case) -> dict:
        """One call of ``case.op`` (publish + watchdog consume + epilogue
        for a collective), with ``case.fault`` (None or an injection
        dict, cluster.faults) applied."""

    def recover(self) -> dict:
        """Quiesce (nothing of this rank in flight), refill the sentinel, reset
        the stage state and the call count; returns the MailboxCheck as found."""

    def scrub(self) -> dict:
        """Check the own mailbox and scrub it if dirty; returns the check."""

    def state(self) -> dict:
        """The own mailbox's check and the call count, for tests and reports."""

    def close(self) -> dict:
        """Leave the group: release the mailbox and what the group set up,
        leaving the process ready for another :meth:`setup` (a pooled
        worker, cluster.pool); idempotent. Returns ``{"reusable": bool,
        "why": str}``: False when the process must not serve another group
        (a device error that stays with it)."""


def host_half(name: str):
    """The backend's ``HostHalf`` class (the module docstring), or None."""
    return getattr(importlib.import_module(BACKENDS[require_backend(name)]), "HostHalf", None)


def suspect_after_a_kill(name: str, placement: str) -> bool:
    """Whether, on backend ``name``, the ranks of a ``placement`` group that
    survived a killed peer hold something only their exit frees (the
    backend module's optional ``SUSPECT_AFTER_A_KILL``: placements), so a
    worker pool must not reuse them."""
    module = importlib.import_module(BACKENDS[require_backend(name)])
    return placement in getattr(module, "SUSPECT_AFTER_A_KILL", ())


def rank_clean(result: dict) -> bool:
    """Whether one rank's ``run_case`` result shows nothing wrong on that
    rank (no watchdog record, missing or partial source, bad stage, header
    mismatch, unclean mailbox or failed check). Not clean implies the group
    call does not pass; clean on every rank does not imply it passes."""
    check = result.get("check")
    return bool(result.get("mailbox_clean") and not result.get("record_count")
                and not result.get("records") and result.get("bad_stage") is None
                and not result.get("missing_sources") and not result.get("partial_sources")
                and not result.get("header_mismatch") and (check is None or check.get("ok")))


def require_backend(name: str) -> str:
    """``name`` if it is a registered backend, else ValueError naming it."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; available: {sorted(BACKENDS)}")
    return name


def make_backend(name: str) -> RankBackend:
    """A new, not yet set up backend instance of the named kind."""
    return importlib.import_module(BACKENDS[require_backend(name)]).Backend()


def unsupported_faults(name: str) -> dict[str, str]:
    """Fault kinds (cluster.faults) whose expected outcome the backend cannot
    produce, each with why (its module's ``UNSUPPORTED_FAULTS``, default none)."""
    module = importlib.import_module(BACKENDS[require_backend(name)])
    return dict(getattr(module, "UNSUPPORTED_FAULTS", {}))


def actor_env(name: str, *, placement: str, tp: int) -> dict[str, str]:
    """Environment variables a rank actor of this backend needs for
    ``placement`` at ``tp`` (its module's ``actor_env``, default none)."""
    module = importlib.import_module(BACKENDS[require_backend(name)])
    hook = getattr(module, "actor_env", None)
    return dict(hook(placement=placement, tp=tp)) if hook else {}


def needs_rendezvous(name: str) -> bool:
    """Whether the backend's setup needs ``master_addr`` / ``master_port``."""
    module = importlib.import_module(BACKENDS[require_backend(name)])
    return bool(getattr(module, "NEEDS_RENDEZVOUS", False))


def release_rank(name: str, *, group_id: str, rank: int) -> None:
    """Free what rank ``rank`` of group ``group_id`` left on this node when
    its process died without close(); a no-op for what is already gone."""
    importlib.import_module(BACKENDS[require_backend(name)]).release_rank(group_id, rank)
