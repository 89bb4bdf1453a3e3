"""HTML building blocks: escaping, the page frame, tables, badges, charts.

Every value that comes from the results goes through ``esc`` (or ``cell``),
so text in the data can never become markup. Only ``Markup`` strings (made
here from escaped parts) pass through unescaped. Chart specs are embedded as
JSON in ``<script type="application/json">`` blocks with ``<``, ``>`` and
``&`` written as ``\\u003c`` etc., and every trace name, hover text and title
taken from the data is escaped too (plotly renders a subset of HTML in them).
"""

from __future__ import annotations

import datetime as dt
import html
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

from dashboards import palette

#: (file, title) of the top-level pages, in navigation order.
NAV = (
    ("index.html", "Overview"),
    ("trends.html", "Trends"),
    ("latency.html", "Latency"),
    ("correctness.html", "Correctness"),
    ("faults.html", "Faults & hangs"),
    ("stragglers.html", "Stragglers"),
    ("environment.html", "Environment"),
    ("compare.html", "Compare runs"),
)


class Markup(str):
    """A string that is already safe HTML."""


def esc(value: Any) -> Markup:
    """``value`` as escaped HTML text (``Markup`` passes through)."""
    if isinstance(value, Markup):
        return value
    return Markup(html.escape(fmt(value), quote=True))


def join(parts: Iterable[Any], sep: str = "") -> Markup:
    return Markup(sep.join(esc(p) for p in parts))


BIG = 1e15
"""From this magnitude on, a float is shown with an exponent (1e+308, not
309 digits)."""


def fmt(value: Any) -> str:
    """Plain-text form of a value for tables; total over floats: ``NaN``,
    ``inf`` and ``-inf`` as such, magnitudes from ``BIG`` on and below 0.01
    with an exponent."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if abs(value) >= BIG:
            return f"{value:.3g}"
        if value == int(value) or abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}" if abs(value) < 0.01 else f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10000 else str(value)
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt(v) for v in value) if value else "—"
    return str(value)


def us(value: float | None) -> str:
    """A latency in µs for a table cell (not finite or from ``BIG`` on: as ``fmt``)."""
    if value is None:
        return "—"
    if not math.isfinite(value) or abs(value) >= BIG:
        return fmt(float(value))
    return f"{value:,.1f}" if value >= 100 else f"{value:.2f}"


def ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def pct(value: float | None) -> str:
    return "—" if value is None else f"{value:+.1%}"


def tag(name: str, content: Any = "", **attrs: Any) -> Markup:
    """``<name attrs>content</name>``; attribute values are escaped, ``cls``
    means ``class`` and ``data_x`` means ``data-x``; None values are left out."""
    parts = [name]
    for key, value in attrs.items():
        if value is None or value is False:
            continue
        key = "class" if key == "cls" else key.replace("_", "-")
        parts.append(key if value is True else f'{key}="{esc(value)}"')
    return Markup(f"<{' '.join(parts)}>{esc(content)}</{name}>")


def link(href: str, text: Any, **attrs: Any) -> Markup:
    return tag("a", text, href=href, **attrs)


def badge(outcome: str) -> Markup:
    return tag("span", outcome, cls=f"badge o-{_css_word(outcome)}")


def status_badge(status: str) -> Markup:
    return tag("span", status, cls=f"badge s-{_css_word(status)}")


def op_chip(op: str, href: str | None = None) -> Markup:
    dot = Markup(f'<span class="dot" style="background:{palette.op_colour(op)}"></span>')
    text = Markup(dot + esc(op))
    return tag("a", text, href=href, cls="op") if href else tag("span", text, cls="op")


def _css_word(text: str) -> str:
    return "".join(c if c.isalnum() or c == "-" else "_" for c in text)


def table(headers: Sequence[Any], rows: Iterable[Sequence[Any]], *, cls: str = "",
          empty: str = "no rows", empty_is_good: bool = False,
          row_ids: Sequence[str | None] | None = None,
          numeric: Sequence[int] = (), **attrs: Any) -> Markup:
    """A table; cells are escaped unless ``Markup``. ``numeric`` columns are
    right-aligned. Click a header to sort (``dashboard.js``)."""
    rows = list(rows)
    if not rows:
        return all_clear(empty) if empty_is_good else no_data(empty)
    head = join(tag("th", h, cls="num" if i in numeric else None) for i, h in enumerate(headers))
    body = []
    for n, row in enumerate(rows):
        cells = join(tag("td", v, cls="num" if i in numeric else None) for i, v in enumerate(row))
        rid = row_ids[n] if row_ids else None
        body.append(tag("tr", cells, id=rid))
    return tag("table", Markup(f"<thead><tr>{head}</tr></thead><tbody>{join(body)}</tbody>"),
               cls=f"data sortable {cls}".strip(), **attrs)


def topology(text: str | None) -> Markup:
    """A results ``topology`` value for people: its one-line summary
    (:func:`cluster.topology.brief`) with the recorded JSON folded away
    behind a disclosure."""
    if not text:
        return esc(None)
    try:
        pretty = json.dumps(json.loads(text), indent=1, sort_keys=True)
    except json.JSONDecodeError:
        return esc(text)
    return Markup(tag("details", join([tag("summary", topology_brief(text)),
                                       tag("pre", pretty, cls="json")]), cls="topology"))


def topology_brief(text: str | None) -> str:
    """:func:`cluster.topology.brief` of a results ``topology`` value; a
    value of a shape it does not read (hand-written JSON, another writer's)
    as its own text."""
    from cluster.topology import brief
    try:
        return brief(text)
    except (AttributeError, TypeError, ValueError, KeyError):
        return str(text)


def repro(command: str | None) -> Markup:
    """A repro command as copyable code with a copy button (dashboard.js)."""
    if not command:
        return esc(None)
    return Markup(tag("div", join([tag("code", command, cls="repro"),
                                   tag("button", "copy", type="button", cls="copy",
                                       title="copy the command")]), cls="repro"))


def no_data(message: str) -> Markup:
    return tag("p", join([Markup("<strong>No data.</strong> "), message]), cls="no-data")


def all_clear(message: str) -> Markup:
    return tag("p", join([Markup("<strong>All clear.</strong> "), message]), cls="all-clear")


def section(title: Any, *content: Any, id: str | None = None, note: Any = None) -> Markup:
    parts = [tag("h2", title)]
    if note:
        parts.append(tag("p", note, cls="note"))
    parts.extend(esc(c) for c in content)
    return tag("section", join(parts), id=id)


def cards(items: Sequence[tuple[str, Any, str]]) -> Markup:
    """Big number cards: (label, value, css class) each."""
    return tag("div", join(
        tag("div", Markup(tag("div", value, cls="value") + tag("div", label, cls="label")),
            cls=f"card {cls}", data_count=label) for label, value, cls in items), cls="cards")


def finite(obj: Any) -> Any:
    """``obj`` with every float that JSON cannot hold (NaN, plus or minus
    infinity) as None: plotly draws a gap there, the compare page a dash."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def safe_json(obj: Any) -> str:
    """``obj`` as strict JSON (non-finite floats as null, :func:`finite`)
    that is safe inside a ``<script>`` element."""
    text = json.dumps(finite(obj), separators=(",", ":"), allow_nan=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def chart(chart_id: str, data: list[dict], layout: dict, *, height: int = 360) -> Markup:
    """A plotly chart rendered by ``assets/dashboard.js`` from an embedded JSON
    spec. Pass trace names and texts through ``plot_text`` first."""
    base = {
        "height": height, "margin": {"l": 60, "r": 20, "t": 36, "b": 48},
        "font": {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12},
        "paper_bgcolor": "#ffffff", "plot_bgcolor": "#ffffff",
        "hovermode": "closest", "legend": {"orientation": "h", "y": -0.2},
        "xaxis": {"gridcolor": "#eceff1", "zeroline": False},
        "yaxis": {"gridcolor": "#eceff1", "zeroline": False},
    }
    for key, value in layout.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    spec = {"data": data, "layout": base}
    div = tag("div", "", cls="chart", id=chart_id, data_series=len(data),
              data_points=sum(len(t.get("x") or t.get("y") or ()) for t in data),
              style=f"height:{height}px")
    script = Markup(f'<script type="application/json" id="{esc(chart_id)}-spec">'
                    f"{safe_json(spec)}</script>")
    return Markup(div + script)


def log_ticks(values: Iterable[float]) -> dict:
    """Range, tick values and labels for a log axis over ``values``: 1, 2, 5
    of each decade (1, 1.5, 2, 3, ... 8 where that leaves fewer than three
    on the axis), each labelled with its value ("20", not plotly's "2" for
    the second tick of a decade). Empty for no positive finite value; over
    more than ``MAX_DECADES`` decades, one tick per decade step."""
    vals = [min(max(v, 1e-300), 1e300)  # so that every tick below is a float
            for v in values if isinstance(v, (int, float)) and 0 < v < math.inf]
    if not vals:
        return {}
    scale = math.log10(1.25)
    lo_log, hi_log = math.log10(min(vals)) - scale, math.log10(max(vals)) + scale
    first, last = math.floor(lo_log), math.ceil(hi_log)
    if last - first > MAX_DECADES:  # 1e-300 .. 1e300: a tick every few decades
        step = math.ceil((last - first) / MAX_DECADES)
        inside = [10.0 ** e for e in range(first + 1, last, step)]
    else:
        lo, hi = 10.0 ** lo_log, 10.0 ** hi_log
        for mantissas in ((1, 2, 5), (1, 1.5, 2, 3, 4, 5, 6, 7, 8)):
            inside = [m * 10.0 ** e for e in range(first, last + 1) for m in mantissas
                      if lo <= m * 10.0 ** e <= hi]
            if len(inside) >= 3:
                break
    return {"range": [lo_log, hi_log], "tickmode": "array", "tickvals": inside,
            "ticktext": [fmt(float(t)) if t >= 1000 else f"{t:.3g}" for t in inside]}


MAX_DECADES = 12


def plot_text(value: Any) -> str:
    """Text from the data for a plotly name/hover/title (escaped: plotly reads
    a subset of HTML there)."""
    return html.escape(fmt(value), quote=True)


def page(title: str, current: str, body: Any, *, built: str, charts: bool = False,
         subtitle: Any = None) -> str:
    """A whole page. ``current`` is the NAV file highlighted."""
    nav = join(link(href, name, cls="active" if href == current else None) for href, name in NAV)
    head_scripts = Markup('<script src="assets/plotly.min.js"></script>') if charts else ""
    sub = tag("p", subtitle, cls="subtitle") if subtitle else ""
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · lamport-lab</title>"
        '<link rel="icon" href="data:,">'
        '<link rel="stylesheet" href="assets/dashboard.css">'
        f"{head_scripts}</head><body>"
        f'<header class="top"><a class="brand" href="index.html">lamport-lab</a>'
        f"<nav>{nav}</nav><span class=\"built\">{esc(built)}</span></header>"
        f"<main><h1>{esc(title)}</h1>{sub}{esc(body)}</main>"
        '<script src="assets/dashboard.js"></script></body></html>\n'
    )
