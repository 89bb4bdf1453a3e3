"""What ``python -m jobs compile-check`` compiles: the defaults of its
selection (arches, hidden sizes, tp values), a suite's ``[compile_check]``
selection with the command line's choices over it (:func:`choose`), the ops
that have compile variants (every registered op whose declaration names a
provider, ``OpSpec.compile_variants``), the check of a selection before
anything runs, and the variants of a selection.

Apart from the command (:mod:`jobs.compile_check`) so that the suite loader
(:mod:`jobs.config`) can check a ``[compile_check]`` section without
importing the command (which imports the loader).
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_ARCHS = ("sm_90a", "sm_100a")
DEFAULT_HIDDEN = (2048, 2560, 3584, 4096, 5120, 7168, 8192)
DEFAULT_TP = (1, 2, 4, 8)


def choose(section: dict | None, *, arch: Sequence[str] | None, ops: Sequence[str] | None,
           hidden: Sequence[int] | None, tp: Sequence[int] | None) -> dict:
    """The selection ``{"arch", "ops", "hidden", "tp"}`` a compile check
    runs: each value given on the command line (not None), else the suite's
    ``[compile_check]`` one (``section``, as :func:`jobs.config.load_suite`
    reads it; None: no suite), else the default (every arch, registered op,
    hidden size and tp); ``ops`` empty in a suite means every op."""
    section = section or {}
    return {"arch": list(arch if arch is not None else section.get("arch") or DEFAULT_ARCHS),
            "ops": list(ops if ops is not None else section.get("ops") or registered_ops()),
            "hidden": list(hidden if hidden is not None
                           else section.get("hidden") or DEFAULT_HIDDEN),
            "tp": list(tp if tp is not None else section.get("tp") or DEFAULT_TP)}


def registered_ops() -> list[str]:
    """The ops with compile variants, in the op registry's order (cluster.ops)."""
    from cluster import ops
    return list(ops.compiled())


def check_selection(ops: Sequence[str] | None, hiddens: Sequence[int],
                    tps: Sequence[int]) -> None:
    """ValueError/TypeError naming the first op without compile variants,
    the first hidden size the Lamport consumers do not take
    (:func:`kernels.validation.norm_threads`) or the first tp not in
    ``TP_SIZES``: what the suite loader and the command line check before
    anything is written or compiled."""
    from kernels.validation import norm_threads, require_tp
    known = registered_ops()
    for op in ops or ():
        if op not in known:
            raise ValueError(f"ops: unknown op {op!r} (no compile variants); registered: "
                             f"{known}")
    for hidden in hiddens:
        norm_threads(hidden, "hidden")
    for tp in tps:
        require_tp("tp", tp)


def variants(ops: Sequence[str], hiddens: Sequence[int], tps: Sequence[int]) -> list:
    """Every :class:`kernels.ptx_checks.Variant` of ``ops`` (checked names),
    op by op, in each provider's order; a provider's ValueError (a hidden
    size its kernel does not take) propagates."""
    from cluster import ops as registry
    return [v for op in ops for v in registry.get(op).variants(hiddens, tps)]
