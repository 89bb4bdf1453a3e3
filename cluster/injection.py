"""Rank-side fault injections: what one rank does wrong in one call.

An injection is a plain dict ``{"kind": ..., **params}`` sent with the case
to one rank (``case.fault``, :class:`cluster.cases.Case`); every backend applies the same vocabulary.
The fault campaign (:mod:`cluster.faults`) maps the fault table (docs/design.md) onto
these.

=====================  ==============  ==========================================
kind                   params          the rank ...
=====================  ==============  ==========================================
``skip_publish``       -               does not publish (still consumes)
``delay_publish``      ``delay_ns``    sleeps before publishing
``tokens_delta``       ``delta``       publishes and consumes M + delta tokens
``set_next_stage``     ``value``       overwrites NEXT_STAGE before publishing
``shift_next_stage``   ``by``          NEXT_STAGE := (NEXT_STAGE + by) % 3
``unsanitized_lane``   ``token``,      publishes that lane as -0.0, bypassing
                       ``column``      sanitize
``die_after_publish``  -               publishes, then its process exits
``hang``               -               never publishes nor returns (a kernel
                                       spinning without a watchdog)
=====================  ==============  ==========================================
"""

from __future__ import annotations

from collections.abc import Mapping

INJECTIONS = {
    "skip_publish": (),
    "delay_publish": ("delay_ns",),
    "tokens_delta": ("delta",),
    "set_next_stage": ("value",),
    "shift_next_stage": ("by",),
    "unsanitized_lane": ("token", "column"),
    "die_after_publish": (),
    "hang": (),
}


def validate_injection(injection: Mapping | None) -> dict | None:
    """The injection as a plain dict (None stays None); ValueError names an
    unknown kind or a missing / unknown parameter."""
    if injection is None:
        return None
    kind = injection.get("kind")
    if kind not in INJECTIONS:
        raise ValueError(f"unknown fault injection {kind!r}; known: {sorted(INJECTIONS)}")
    params = set(injection) - {"kind"}
    if params != set(INJECTIONS[kind]):
        raise ValueError(f"injection {kind!r} takes parameters {sorted(INJECTIONS[kind])}, "
                         f"got {sorted(params)}")
    return dict(injection)


def rank_tokens(tokens: int, injection: Mapping | None) -> int:
    """The M a rank publishes and consumes in a call of ``tokens`` tokens
    under ``injection`` (validated: :func:`validate_injection`): ``tokens``,
    moved by a ``tokens_delta`` injection's delta."""
    injection = validate_injection(injection) or {"kind": None}
    return tokens + (injection["delta"] if injection["kind"] == "tokens_delta" else 0)
