"""correctness.html: per op, a matrix of the latest run's correctness rows
(the correctness job's; fault, profile, compile and self-check rows have
pages of their own) — rows backend · transport · tp, columns tokens — each
cell coloured by its worst outcome and linking to its rows on
details-<op>.html (every row of the op: ULP, mismatches, reason, repro).
Every registered op (cluster.ops) is listed: one without rows in the run is
named as such, and an op that is not a collective says so."""

from __future__ import annotations

from cluster import ops as registry
from dashboards import html as h
from dashboards import palette
from dashboards.model import (OUTCOME_SEVERITY, Row, case_label, extra_of, group, slug, sort_key,
                              trace_href, worst_outcome)
from dashboards.pages import Site, details_href, no_results
from jobs.results import row_job

ROW_FIELDS = ("backend", "transport", "tp")


def render(site: Site) -> dict[str, str]:
    run = site.results.latest
    pages: dict[str, str] = {}
    if run is None:
        pages["correctness.html"] = site.page("Correctness", "correctness.html", no_results(site))
        return pages
    by_op = group(run.rows, "op")
    traced = traces_by_op(site, run)
    sections = []
    for op in sorted({k[0] for k in by_op} | set(traced), key=sort_key):
        rows = by_op.get((op,), [])
        checked = [r for r in rows if row_job(r) == "correctness"]
        if checked:
            sections.append(_matrix(op, checked))
        pages[f"details-{slug(op)}.html"] = _details_page(site, run, op, rows,
                                                          traced.get(op, []))
    absent = [op for op in registry.names()
              if not any(row_job(r) == "correctness" for r in by_op.get((op,), ()))]
    if absent and sections:
        sections.append(h.section("Ops without correctness rows in this run", h.tag(
            "p", "registered ops the run did not check: " + ", ".join(absent), cls="note")))
    legend = h.tag("div", h.join(
        h.Markup(h.badge(o) + " ") for o in palette.OUTCOME_COLOURS), cls="legend-row")
    body = h.join([
        h.tag("p", "Latest run only. Each cell: passed/run cases at that backend, transport, "
              "tp and token count (all variants, hidden sizes and dtypes together), coloured "
              "by its worst outcome (skipped cases are counted apart); click a cell for its "
              "rows.", cls="note"),
        legend, *(sections or [h.no_data("no correctness rows in the latest run.")])])
    sub = h.join(["Run ", h.tag("code", run.run_id), f" · {run.trigger} · {h.fmt(run.started_at)}"])
    pages["correctness.html"] = site.page("Correctness", "correctness.html", body, subtitle=sub)
    return pages


def _matrix(op: str, rows: list[Row]) -> h.Markup:
    tokens = sorted({r.get("tokens") for r in rows}, key=sort_key)
    cells = group(rows, *ROW_FIELDS, "tokens")
    row_keys = sorted({k[:-1] for k in cells}, key=lambda k: tuple(sort_key(v) for v in k))
    head = h.join([h.tag("th", "backend · transport · tp", cls="rowh"),
                   *(h.tag("th", f"tokens {h.fmt(t)}" if t is not None else "no token count",
                           cls="num") for t in tokens)])
    body = []
    for key in row_keys:
        label = " · ".join(h.fmt(v) if n != "tp" else f"tp={v}"
                           for n, v in zip(ROW_FIELDS, key) if v is not None) or "—"
        tds = [h.tag("th", label, cls="rowh")]
        for t in tokens:
            members = cells.get((*key, t))
            if not members:
                tds.append(h.tag("td", "", cls="cell empty"))
                continue
            ran = [r for r in members if r["outcome"] != "skipped"]
            worst = worst_outcome(ran or members)  # skipped only colours an all-skipped cell
            target = min(ran or members, key=lambda r: (OUTCOME_SEVERITY.get(r["outcome"], -1),
                                                        r["_index"]))
            passed = sum(r["outcome"] == "pass" for r in members)
            n_skipped = len(members) - len(ran)
            ulps = [r["max_ulp"] for r in members if r.get("max_ulp") is not None]
            bad = sum(r.get("mismatches") or 0 for r in members)
            tip = (f"{op} {label} tokens={h.fmt(t)}: {passed}/{len(ran)} passed, "
                   f"{n_skipped} skipped, worst {worst}; max ULP "
                   f"{h.fmt(max(ulps)) if ulps else '—'}; mismatches {bad}")
            if not ran:
                text = f"skipped {n_skipped}"
            else:
                text = f"{passed}/{len(ran)}" if worst == "pass" else f"{worst} {passed}/{len(ran)}"
                text += f" +{n_skipped} skip" if n_skipped else ""
            link = h.link(details_href(target), text, cls=f"o-{worst}", title=tip)
            tds.append(h.tag("td", link, cls="cell", data_outcome=worst, data_cases=len(members),
                             style=f"background:{palette.outcome_colour(worst)}"))
        body.append(h.tag("tr", h.join(tds)))
    table = h.tag("table", h.Markup(f"<thead><tr>{head}</tr></thead><tbody>{h.join(body)}</tbody>"),
                  cls="data matrix", data_op=op)
    local = any(extra_of(r).get("collective") is False for r in rows)
    note = ("not a collective: it runs on each rank actor's GPU on its own (no Lamport exchange)"
            if local else None)
    return h.section(h.op_chip(op, f"details-{slug(op)}.html"), table, id=f"op-{slug(op)}",
                     note=note)


def op_fields(row: Row) -> str | None:
    """The row's op fields that are no column of their own (finalize, heads,
    path, ...: the op's declaration in cluster.ops), as ``name=value``."""
    try:
        declared = registry.get(row["op"]).fields
    except ValueError:
        return None
    extra = extra_of(row)
    parts = [f"{k}={extra[k]}" for k in declared if k in extra and k not in ("top_k", "hc")]
    return " ".join(parts) or None


#: (header, field or None for computed, numeric) of the details table.
DETAIL_COLUMNS = [
    ("outcome", None, False), ("job", "job", False), ("latency", None, False),
    ("variant", "variant", False),
    ("backend", "backend", False), ("transport", "transport", False),
    ("placement", "placement", False), ("tp", "tp", True), ("hidden", "hidden", True),
    ("tokens", "tokens", True), ("top_k", "top_k", True), ("hc", "hc", True),
    ("op fields", "op_fields", False),
    ("dtype", "dtype", False), ("max ULP", "max_ulp", True), ("max abs err", "max_abs_err", True),
    ("mismatches", "mismatches", True), ("elements", "elements", True),
    ("median µs", "t_median_us", True), ("baseline µs", "baseline_median_us", True),
    ("ratio", "ratio", True), ("reason", None, False), ("reproduce", "repro_command", False),
    ("trace", None, False),
]
IDENTITY = {"variant", "backend", "transport", "placement", "tp", "hidden", "tokens", "top_k",
            "hc", "dtype", "op_fields"}


def _cell(site: Site, r: Row, header: str, field: str | None):
    if header == "outcome":
        return h.badge(r["outcome"])
    if header == "latency":
        return h.status_badge(site.status(r))
    if header == "job":
        return row_job(r)
    if header == "trace":
        href = trace_href(r)
        return h.link(href, "trace", title="every rank of the TP group on one timeline: open "
                      "in https://ui.perfetto.dev or chrome://tracing") if href else "—"
    if header == "reason":
        return h.tag("div", r.get("diagnosis") or r.get("reason") or "—", cls="reason")
    if field in ("t_median_us", "baseline_median_us"):
        return h.us(r.get(field))
    if field == "ratio":
        return h.ratio(r.get(field))
    if field == "repro_command":
        return h.repro(r.get(field))
    if field == "op_fields":
        return op_fields(r)
    return r.get(field)


def traces_by_op(site: Site, shown) -> dict[str, list[Row]]:
    """Per op, one row for each merged trace (``python -m jobs trace``) of a
    run other than ``shown`` (the run the details tables show, whose rows
    link theirs), newest run first: an ad-hoc trace stays linked after the
    next nightly."""
    seen, out = set(), {}
    for r in sorted(site.results.rows, key=lambda r: r["started_at"], reverse=True):
        href = trace_href(r)
        if href and r["run_id"] != shown.run_id and (r["run_id"], href) not in seen:
            seen.add((r["run_id"], href))
            out.setdefault(r["op"], []).append(r)
    return out


def _traces_section(traced: list[Row]) -> h.Markup | str:
    if not traced:
        return ""
    rows = [[h.tag("code", r["run_id"], cls="run"), r["trigger"], h.fmt(r["started_at"]),
             case_label(r), h.link(trace_href(r), "trace", title="every rank of the TP group on "
                                   "one timeline: open in https://ui.perfetto.dev")]
            for r in traced]
    return h.section("Traces of other runs", h.table(["run", "trigger", "started", "case",
                                                      "trace"], rows, id="traces"),
                     note="Merged rank traces (python -m jobs trace) of runs other than the "
                          "one above, newest first; the site keeps a copy of each.")


def _hashable(value):
    """``value`` as a set member (``extra.job`` may be any JSON: a list as a tuple)."""
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    return value if not isinstance(value, dict) else str(value)


def _details_page(site: Site, run, op: str, rows: list[Row], traced: list[Row]) -> str:
    ordered = sorted(rows, key=lambda r: (OUTCOME_SEVERITY.get(r["outcome"], -1),
                                          tuple(sort_key(r.get(n)) for n in
                                                ("backend", "transport", "tp", "tokens",
                                                 "hidden", "variant"))))
    # Columns empty in every row are left out; case fields with one value in
    # every row are said once above the table instead.
    columns, constant = [], []
    for header, field, numeric in DETAIL_COLUMNS:
        values = ({_hashable(row_job(r)) for r in rows} if field == "job" else
                  {op_fields(r) for r in rows} if field == "op_fields" else
                  {r.get(field) for r in rows} if field else {1})
        if field and field != "repro_command" and values == {None}:
            continue
        if header == "trace" and not any(trace_href(r) for r in rows):
            continue
        if (field in IDENTITY or field == "job") and len(values) == 1:
            constant.append(f"{header} {h.fmt(next(iter(values)))}")
            continue
        columns.append((header, field, numeric))
    table = h.table([c[0] for c in columns],
                    [[_cell(site, r, c[0], c[1]) for c in columns] for r in ordered],
                    row_ids=[f"r{r['_index']}" for r in ordered],
                    numeric=[i for i, c in enumerate(columns) if c[2]], cls="compact details",
                    id="details")
    note = "every row: " + " · ".join(constant) if constant else None
    body = h.join([
        h.tag("p", h.join([h.link(f"correctness.html#op-{slug(op)}", "← matrix"),
                           " · worst first · the highlighted row is the one a matrix cell "
                           "linked to"]), cls="note"),
        h.section(h.join([h.op_chip(op), f" — {len(rows)} case(s)"]), table, note=note),
        _traces_section(traced)])
    sub = h.join(["Run ", h.tag("code", run.run_id), f" · {run.trigger} · {h.fmt(run.started_at)}"])
    return site.page(f"Details: {op}", "correctness.html", body, subtitle=sub)


__all__ = ["render", "case_label"]
