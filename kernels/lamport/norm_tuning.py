"""Which form of the one-shot AllReduceNorm a call launches: one table,
keyed by ``(arch, hidden, tp)``, each entry a token range for the
single-kernel form (:mod:`kernels.lamport.norm_single`) and how its CTAs
agree on the stage advance; every other call launches the two-kernel form
(publish, then the PDL-chained consumer).

A tuning is data only (a frozen dataclass):
- ``single_max_tokens`` is the largest M that launches the single kernel
  (0: never). It also bounds the grid the single kernel may launch: every
  CTA of it must be resident at once (a CTA spins on its peers' CTA of the
  same token), which :data:`SINGLE_MAX_TOKENS` keeps far inside one H200's
  residency (132 SMs, at least two CTAs of <= 1024 threads each).
- ``finalize_max_tokens`` and ``embed_max_tokens`` are the same bound for a
  MoE output's call and the embedding's (:data:`PATHS`).
- ``sync`` is the agreement (:data:`kernels.lamport.protocol.SINGLE_SYNCS`):
  ``counter`` (the arrival counter), ``cluster`` (the grid launched as one
  cluster with the cluster barrier, from 2 to :data:`CLUSTER_MAX_TOKENS`
  tokens; the counter beyond), ``none`` (no CTA waits for another: tp = 1
  and unicast only, :func:`check_sync`).

The form never applies to virtual ranks (tp ranks on one GPU) nor to owner
mode, whatever the table says; a MoE output's call launches the single
finalize kernel only where its CTA has a thread a route (``top_k <= hidden /
8``) (:class:`kernels.lamport.all_reduce_norm.AllReduceNorm`).

Provenance (``source``, not part of the choice):
- ``measured``: tp=1 on the H200 (sm_90a), hidden 5120 and 7168,
  ``python -m benchmarks.all_reduce_norm --forms`` (the forms, each
  agreement and torch side by side in one run, graph replay, rotating
  inputs): the single kernel is faster than two kernels at every M of
  1..64, and ``none`` the fastest agreement at every M (docs/results/, the
  AllReduceNorm forms pages);
- ``default``: every other (arch, hidden, tp) keeps the two-kernel form
  until a run on that shape says otherwise: at tp > 1 the forms have not
  been timed over NVLink side by side.
"""

from __future__ import annotations

import dataclasses

from kernels.validation import require_choice, require_int

from .protocol import SINGLE_SYNCS

SINGLE_MAX_TOKENS = 64
"""The largest M any tuning may give the single kernel (the residency bound)."""
CLUSTER_MAX_TOKENS = 16
"""The largest cluster Hopper launches (above 8 a non-portable size, which
the DSL's kernels allow): the largest M the single kernel runs as one
cluster."""
PATHS = ("plain", "finalize", "embed")
"""The calls a tuning bounds apart: a plain partial's, a MoE output's
(:mod:`kernels.lamport.finalize_single`) and the embedding's
(:mod:`kernels.lamport.embed_single`); their single kernels cost
differently (the finalize loads the routed rows)."""
_BOUNDS = {"plain": "single_max_tokens", "finalize": "finalize_max_tokens",
           "embed": "embed_max_tokens"}
VARIANTS = {"counter": "single", "cluster": "single+cluster", "none": "single+nosync"}
"""The name of the single kernel with each agreement, in the profile rows
and the op's ``form`` field."""


@dataclasses.dataclass(frozen=True)
class NormTuning:
    single_max_tokens: int = 0
    sync: str = "counter"
    finalize_max_tokens: int = 0
    embed_max_tokens: int = 0
    source: str = dataclasses.field(default="explicit", compare=False)

    def validate(self) -> None:
        for path in PATHS:
            require_int(_BOUNDS[path], self.max_tokens(path), low=0, high=SINGLE_MAX_TOKENS)
        require_choice("sync", self.sync, SINGLE_SYNCS)

    def max_tokens(self, path: str = "plain") -> int:
        """The largest M of a ``path`` call (:data:`PATHS`) that launches
        the single kernel (0: never)."""
        return getattr(self, _BOUNDS[require_choice("path", path, PATHS)])

    @property
    def any_single(self) -> bool:
        """Whether any call may launch a single kernel."""
        return any(self.max_tokens(path) for path in PATHS)

    def form(self, tokens: int, *, path: str = "plain") -> str:
        """``"single"`` or ``"two"``: the form a ``tokens``-token call on
        ``path`` launches."""
        return "single" if 1 <= tokens <= self.max_tokens(path) else "two"

    def launch_sync(self, tokens: int) -> tuple[str, int]:
        """(the agreement, the cluster size) of a ``tokens``-token single
        kernel: ``cluster`` only from 2 to :data:`CLUSTER_MAX_TOKENS`
        tokens (a grid of one CTA waits for no one; the counter beyond)."""
        if self.sync == "cluster":
            return ("cluster", tokens) if 2 <= tokens <= CLUSTER_MAX_TOKENS else ("counter", 1)
        return self.sync, 1

    def variant(self, tokens: int, *, path: str = "plain") -> str:
        """What a ``tokens``-token call on ``path`` launches, as the profile
        rows name it: ``two``, or the single kernel with its agreement
        (:data:`VARIANTS`)."""
        if self.form(tokens, path=path) == "two":
            return "two"
        return VARIANTS[self.launch_sync(tokens)[0]]


def check_sync(tuning: NormTuning, *, tp: int, transport: str) -> None:
    """``sync = none`` only at tp = 1 with unicast, where a CTA's stage
    decides nothing but its validity (:mod:`kernels.lamport.protocol`,
    "Single-kernel form"); ValueError naming the tuning otherwise."""
    if tuning.sync == "none" and tuning.any_single and (tp != 1 or transport != "unicast"):
        raise ValueError(f"norm_tuning={tuning!r}: sync='none' needs tp = 1 and unicast "
                         f"(a CTA that read an advanced stage would publish or read the "
                         f"wrong slots); this instance has tp={tp}, transport={transport!r}")


TABLE: dict[tuple[str, int, int], NormTuning] = {
    ("sm_90a", 5120, 1): NormTuning(64, "none", embed_max_tokens=64, source="measured"),
    ("sm_90a", 7168, 1): NormTuning(64, "none", embed_max_tokens=64, source="measured"),
}

DEFAULT = NormTuning(0, source="default")

FORMS = ("auto", "two", *VARIANTS.values())
"""What a caller may ask for: ``auto`` the table's choice, ``two`` never
the single kernel, ``single`` / ``single+cluster`` / ``single+nosync`` the
single kernel up to :data:`SINGLE_MAX_TOKENS` tokens with that agreement."""


def forced(form: str) -> NormTuning | None:
    """The tuning that forces ``form`` (None for ``auto``: the table's);
    ValueError naming the value otherwise."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {list(FORMS)}, got {form!r}")
    if form == "auto":
        return None
    if form == "two":
        return NormTuning(0, source="forced two")
    sync = next(s for s, name in VARIANTS.items() if name == form)
    return NormTuning(SINGLE_MAX_TOKENS, sync, SINGLE_MAX_TOKENS, SINGLE_MAX_TOKENS,
                      source=f"forced {form}")


def norm_tuning(*, hidden: int, tp: int, arch: str | None = None) -> NormTuning:
    """The table's entry for ``(arch, hidden, tp)`` (``arch`` None: the
    current one, :func:`kernels.lamport.mhc_tuning.current_arch`), else
    :data:`DEFAULT`."""
    if arch is None:
        from .mhc_tuning import current_arch
        arch = current_arch()
    return TABLE.get((arch, hidden, tp), DEFAULT)
