"""The one palette: a colour per op and per outcome, the same on every page.

Known ops have fixed colours; any other op gets a colour picked from the
spare list by a stable hash of its name, so it too keeps one colour across
pages and builds. Outcome colours follow the usual reading: green passes,
red fails, purple hangs.
"""

from __future__ import annotations

import hashlib

#: Fixed op colours (colour-blind-friendly, Okabe-Ito and Tableau hues).
OP_COLOURS: dict[str, str] = {
    "all_reduce_norm": "#0072B2",
    "all_reduce_mhc": "#E69F00",
    "finalize_publish": "#009E73",
    "embed_norm": "#CC79A7",
    "indexer": "#56B4E9",
    "indexer_projection": "#8C564B",
    "indexer_fused": "#7F7F7F",
    "moe_finalize": "#BCBD22",
}
_SPARE = ("#1F77B4", "#FF7F0E", "#2CA02C", "#9467BD", "#17BECF", "#D62728",
          "#E377C2", "#393B79", "#637939", "#8C6D31", "#843C39", "#7B4173")

OUTCOME_COLOURS: dict[str, str] = {
    "pass": "#2E9E4F",
    "fail": "#D62728",
    "hang": "#8E44AD",
    "error": "#B03A2E",
    "skipped": "#9AA0A6",
}
#: Regression status colours (see dashboards.regression).
STATUS_COLOURS: dict[str, str] = {
    "regressed": "#E8590C",
    "ok": "#2E9E4F",
    "improved": "#1971C2",
    "insufficient-history": "#9AA0A6",
    "no-timing": "#C8CCD0",
}
BASELINE_COLOUR = "#555555"
REGRESSION_MARKER = "#E8590C"


def op_colour(op: str) -> str:
    """The colour of ``op`` on every page."""
    if op in OP_COLOURS:
        return OP_COLOURS[op]
    digest = hashlib.sha1(op.encode("utf-8", "replace")).digest()
    return _SPARE[digest[0] % len(_SPARE)]


def outcome_colour(outcome: str) -> str:
    return OUTCOME_COLOURS.get(outcome, "#444444")


def shade(colour: str, index: int, count: int) -> str:
    """``colour`` lightened for series ``index`` of ``count`` of one op, so the
    series stay in the op's hue (index 0 is the op colour itself)."""
    if count <= 1 or index <= 0:
        return colour
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    f = 0.55 * index / (count - 1)  # up to 55 % of the way to white
    r, g, b = (round(c + (255 - c) * f) for c in (r, g, b))
    return f"#{r:02X}{g:02X}{b:02X}"
