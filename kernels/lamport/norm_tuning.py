"""Which form of the one-shot AllReduceNorm a call launches: one table,
keyed by ``(arch, hidden, tp)``, each entry a token range for the
single-kernel form (:mod:`kernels.lamport.norm_single`); every other call
launches the two-kernel form (publish, then the PDL-chained consumer).

A tuning is data only (a frozen dataclass). ``single_max_tokens`` is the
largest M that launches the single kernel (0: never). It also bounds the
grid the single kernel may launch: every CTA of it must be resident at
once (a CTA spins on its peers' CTA of the same token), which
:data:`SINGLE_MAX_TOKENS` keeps far inside one H200's residency (132 SMs,
at least two CTAs of <= 1024 threads each).

The form never applies to virtual ranks (tp ranks on one GPU) nor to owner
mode, the MoE finalize publish or the embedding path, whatever the table
says (:class:`kernels.lamport.all_reduce_norm.AllReduceNorm`).

Provenance (``source``, not part of the choice):
- ``measured``: tp=1 on the H200 (sm_90a), hidden 5120 and 7168,
  ``python -m benchmarks.all_reduce_norm --forms`` (both forms and torch
  side by side in one run, graph replay, rotating inputs): the single
  kernel is faster at every M of 1..64 (docs/results/, the AllReduceNorm
  forms page);
- ``default``: every other (arch, hidden, tp) keeps the two-kernel form
  until a run on that shape says otherwise: at tp > 1 the two forms have
  not been timed over NVLink side by side.
"""

from __future__ import annotations

import dataclasses

from kernels.validation import require_int

SINGLE_MAX_TOKENS = 64
"""The largest M any tuning may give the single kernel (the residency bound)."""


@dataclasses.dataclass(frozen=True)
class NormTuning:
    single_max_tokens: int = 0
    source: str = dataclasses.field(default="explicit", compare=False)

    def validate(self) -> None:
        require_int("single_max_tokens", self.single_max_tokens, low=0,
                    high=SINGLE_MAX_TOKENS)

    def form(self, tokens: int) -> str:
        """``"single"`` or ``"two"``: the form a ``tokens``-token call launches."""
        return "single" if 1 <= tokens <= self.single_max_tokens else "two"


TABLE: dict[tuple[str, int, int], NormTuning] = {
    ("sm_90a", 5120, 1): NormTuning(64, source="measured"),
    ("sm_90a", 7168, 1): NormTuning(64, source="measured"),
}

DEFAULT = NormTuning(0, source="default")

FORMS = ("auto", "single", "two")
"""What a caller may ask for: ``auto`` the table's choice, ``single`` the
single kernel up to :data:`SINGLE_MAX_TOKENS` tokens, ``two`` never."""


def forced(form: str) -> NormTuning | None:
    """The tuning that forces ``form`` (None for ``auto``: the table's);
    ValueError naming the value otherwise."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {list(FORMS)}, got {form!r}")
    if form == "auto":
        return None
    return NormTuning(SINGLE_MAX_TOKENS if form == "single" else 0, source=f"forced {form}")


def norm_tuning(*, hidden: int, tp: int, arch: str | None = None) -> NormTuning:
    """The table's entry for ``(arch, hidden, tp)`` (``arch`` None: the
    current one, :func:`kernels.lamport.mhc_tuning.current_arch`), else
    :data:`DEFAULT`."""
    if arch is None:
        from .mhc_tuning import current_arch
        arch = current_arch()
    return TABLE.get((arch, hidden, tp), DEFAULT)
