"""The Lamport mailbox protocol: constants and the slot index, in one place.

Every rank owns a mailbox, a BF16 tensor ``[LAMPORT_GENERATIONS, tp,
capacity, hidden]``, and a ``stage_state`` int32[3] holding
``[ACTIVE_STAGE, NEXT_STAGE, ARRIVALS]``. Every mailbox element starts as the
sentinel, BF16 negative zero (bits ``0x8000``); a 16-byte fragment of 8 BF16
is the unit of transfer.

Publish (rank ``r``, token ``t``; one kernel, after ``griddepcontrol.wait``):
  1. read ``stage = NEXT_STAGE``; if ``stage >= LAMPORT_GENERATIONS`` the
     state is corrupt: store nothing through the peer table, set the error
     flag and write the bad value to ACTIVE_STAGE (so the local consumer
     fails fast instead of spinning on a stale generation);
  2. replace every -0.0 lane of the payload by +0.0 (sanitize), so that no
     payload lane can look like the sentinel;
  3. store each fragment of row ``t`` into slot ``(stage, r, t, column)`` of
     every rank's mailbox: one ``multimem.st`` to the multicast address
     (transport ``multicast``) or one ``st.relaxed.sys`` per peer through a
     device table of peer base addresses (transport ``unicast``); the MoE
     finalize publish may store a fragment as two independent 8-byte halves
     (the consumer's per-lane test waits for both; see
     :mod:`kernels.lamport.finalize_publish`);
  4. block 0 thread 0 writes ``ACTIVE_STAGE = stage``.
  Each lane carries its own "arrived" bit (it is not 0x8000), so the payload
  needs no release fence.

Consume (one CTA a token on every rank, after ``griddepcontrol.wait``):
  1. volatile-load ``stage = ACTIVE_STAGE`` (bounds-checked as above);
  2. for source rank 0..tp-1 in order, spin on 16-byte volatile loads of
     slot ``(stage, source, t, column)`` until no lane is 0x8000, and add the
     fragment into an FP32 accumulator that starts at +0.0 (the AllReduceNorm
     consumer issues the first load of every source together with step 1,
     at the stage NEXT_STAGE held before the wait, and spins only where that
     load holds a sentinel lane or was made at another stage: the same
     values, one memory round trip instead of 1 + tp);
  3. token 0 thread 0 writes ``NEXT_STAGE = (stage + 1) % 3``, then every
     thread triggers dependents (PDL);
  4. write the sentinel back into every slot it read;
  5. the fused epilogue (round the sum once to BF16, + residual, RMSNorm).

Single-kernel form (:mod:`kernels.lamport.norm_single`; one-shot, for
ranks in processes of their own): one CTA a token publishes its row and
then consumes it, in one launch. Every CTA takes ``stage = NEXT_STAGE``
after ``griddepcontrol.wait`` and publishes and consumes at that stage (no
ACTIVE_STAGE round trip). No CTA may advance NEXT_STAGE while another may
still read it and act on its value; how the CTAs agree on that is the
launch's ``sync`` (:data:`SINGLE_SYNCS`): ``counter``: thread 0 of each CTA,
after the CTA's barrier, adds 1 to ARRIVALS (acq_rel) and the CTA whose add
returned ``M - 1`` is the last; ``cluster``: the grid is one cluster (M <=
16), every thread arrives on the cluster barrier (release) after its stage
load and CTA 0's thread 0 waits on it (acquire) after its own barrier;
``none`` (tp = 1, unicast only): CTA 0 advances after its own barrier and
no one waits, because there a CTA's stage decides nothing but its validity
(no slot is written or read: the own fragment comes from registers), and a
late CTA that reads the advanced stage reads a valid one. The advancing
CTA writes ``ACTIVE_STAGE = stage``, ``NEXT_STAGE = (stage + 1) % 3``
(unchanged for a bad stage) and, with ``counter``, ``ARRIVALS = 0`` (at M =
1 the one CTA writes them after its barrier, with no add). With unicast a rank's own
fragment is summed from registers (its own slot stays sentinel). The slots, the stage sequence and the
sentinel write-back are the two-kernel form's, so ranks (and calls) of the
two forms interoperate on one mailbox. A CTA spins on its peers' CTA of the
same token, so the form is used only where every CTA of the grid is
resident at once (small M) and never on virtual ranks (tp ranks on one
GPU, where a rank's grid may wait behind a peer's).

Why three generations: rank A may publish call N+1 (stage s+1) as soon as
its own consumer of call N finished, i.e. once every rank published call N;
rank B may still be reading and resetting stage s of call N, but stage s+1
was last used by call N-2, which B finished before it published call N. A
fourth use of a stage (call N+3) cannot start before every rank consumed
call N+1, by the same argument. Hence: calls on one mailbox must not overlap
beyond this pipelining, and every rank must make the same sequence of calls
with the same token count (the slots read are exactly the slots written).
"""

from __future__ import annotations

LAMPORT_GENERATIONS = 3
"""Number of mailbox generations (stages) that rotate."""

ACTIVE_STAGE = 0
"""Index in ``stage_state`` of the stage the last publish wrote."""

NEXT_STAGE = 1
"""Index in ``stage_state`` of the stage the next publish writes."""

ARRIVALS = 2
"""Index in ``stage_state`` of the single-kernel form's arrival counter
(0 between calls; see "Single-kernel form" above)."""

SINGLE_SYNCS = ("counter", "cluster", "none")
"""How the single kernel's CTAs agree on the stage advance (above); the
kernel takes the index."""

STAGE_STATE_WORDS = 3
"""Length of ``stage_state`` (int32): ACTIVE_STAGE, NEXT_STAGE, ARRIVALS."""

SENTINEL_BF16 = 0x8000
"""BF16 negative zero: an empty mailbox lane."""

SENTINEL_WORD = 0x80008000
"""Two sentinel lanes packed in one 32-bit word."""

SENTINEL_INT16 = -32768
"""The sentinel as a signed int16 (for ``tensor.view(torch.int16).fill_``)."""

VEC_BF16 = 8
"""BF16 elements per 16-byte fragment."""

FRAGMENT_BYTES = 16
WARP_SIZE = 32
MAX_THREADS = 1024

# Error buffer (int32) layout, shared by publish and the watchdog consumer.
ERR_COUNT = 0
"""Number of timeout records appended (may exceed the buffer capacity)."""
ERR_MISSING_MASK = 1
"""Bit s set: some fragment of source rank s never arrived (all sentinel)."""
ERR_BAD_STAGE = 2
"""Non-zero: a stage index >= LAMPORT_GENERATIONS was read (value + 1 of the
last bad stage seen)."""
ERR_UNSANITIZED_MASK = 3
"""Bit s set: a fragment of source s arrived with some but not all lanes set
(an unsanitized -0.0 in the payload)."""
ERR_HEADER_WORDS = 4
ERR_RECORD_WORDS = 8
"""One record: token, source rank, fragment index, stage, 4 words seen."""
ERR_DEFAULT_RECORDS = 256

DEFAULT_BUDGET_NS = 2_000_000_000
"""The consumer watchdog's budget, in ns, where a case names none (2 s) and
the budget of the compile check's watchdog builds. The budget is compiled
in, so with one value for both the compile check builds the very kernels
that correctness ranks at the default then load from the compile cache."""


def slot_index(stage, tp, source, capacity, token, hidden, column):
    """Element index of ``(stage, source, token, column)`` in a flat mailbox.

    Plain arithmetic, so the same function serves host code (Python ints)
    and ``@cute.jit`` code (DSL integers; pass Int64 values to avoid 32-bit
    overflow on large mailboxes).
    """
    return ((stage * tp + source) * capacity + token) * hidden + column


# ---------------------------------------------------------------- owner mode
# Owner mode (the seed finalize publish's ``owner_capacity``; a reduce-scatter):
# token ``t`` is owned by rank ``t % tp``; rank ``r`` sends its row ``t`` only
# to that owner, into slot ``(stage, r, t // tp, column)`` of the owner's
# mailbox ``[LAMPORT_GENERATIONS, tp, owner_capacity, hidden]`` (the peer's
# base address read from the peer table at index ``t % tp``). Each rank sends
# each token once instead of tp times; it is unicast by nature (every token
# has one destination), so there is no multicast owner publish.
#
# Owner ``o`` computes the rows of the tokens it owns: its row ``j`` is token
# ``j * tp + o``. Every owner has ``ceil(M / tp)`` output rows; where
# ``j * tp + o >= M`` (the last row of the owners ``o >= M % tp`` when tp does
# not divide M, and row 0 of every owner ``o >= M`` when M < tp) the row holds
# no token and is written as +0.0.
#
# Rotation (why padding tokens are published): the three-generation argument
# of the module docstring needs every rank's consumer to wait for every
# rank's publish of each call. With M >= tp every owner owns a token and so
# hears from every source. With M < tp the owners ``o >= M`` would own
# nothing and could run ahead by more than two calls; so every publish covers
# ``max(M, tp)`` tokens, the tokens ``M .. tp-1`` carrying +0.0, and every
# owner's row 0 is always published and consumed.


MODES = ("one_shot", "owner")
"""``one_shot``: every rank sends every token to every rank (all-reduce);
``owner``: every token goes to its owner only (reduce-scatter)."""


def owner_capacity(capacity: int, tp: int) -> int:
    """Rows a source rank may fill in an owner's mailbox: ``ceil(capacity /
    tp)`` (at least 1). ValueError naming the values when either is < 1."""
    if capacity < 1 or tp < 1:
        raise ValueError(f"owner_capacity needs capacity >= 1 and tp >= 1, got "
                         f"capacity={capacity}, tp={tp}")
    return -(-capacity // tp)


def owner_slot_index(stage, tp, source, owner_capacity, token, hidden, column):
    """Element index of token ``token``'s fragment from ``source`` in its
    owner's (rank ``token % tp``) flat mailbox: slot ``(stage, source, token //
    tp, column)`` of ``[LAMPORT_GENERATIONS, tp, owner_capacity, hidden]``.
    Plain arithmetic like :func:`slot_index` (host ints or DSL integers)."""
    return slot_index(stage, tp, source, owner_capacity, token // tp, hidden, column)


def owner_rows(m: int, tp: int) -> int:
    """Output rows of every owner for an M-token call: ``ceil(M / tp)``."""
    return -(-m // tp)


def owner_published_tokens(m: int, tp: int) -> int:
    """Tokens each rank's owner-mode publish stores: ``max(M, tp)`` (see the
    rotation note above)."""
    return max(m, tp)


def owned_tokens(m: int, tp: int, owner: int) -> range:
    """Token ids owner ``owner`` computes, in row order: row ``j`` is token
    ``j * tp + owner``."""
    return range(owner, m, tp)


def mailbox_shape(tp: int, capacity: int, hidden: int) -> tuple[int, int, int, int]:
    return (LAMPORT_GENERATIONS, tp, capacity, hidden)


def error_buffer_words(records: int = ERR_DEFAULT_RECORDS) -> int:
    return ERR_HEADER_WORDS + ERR_RECORD_WORDS * records
