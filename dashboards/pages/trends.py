"""trends.html (every timed case's status) and trends-<op>.html (one chart per
case): median latency over the nightly runs, the baseline beside it, the p99
dotted, regressions marked."""

from __future__ import annotations

from dashboards import html as h
from dashboards import palette
from dashboards.model import Row, case_label, group, slug, sort_key
from dashboards.pages import Site, trend_href
from dashboards.regression import DEFAULT_RULE, segments_all

RULE_NOTE = (f"Rule (jobs/regression.py): {DEFAULT_RULE.describe()}; fewer earlier nightly "
             "results: insufficient history. Baselines (variant baseline:*) are judged too but "
             "never count as a regression.")
CP_NOTE = ("Change points (jobs/changepoints.py): each case's nightly history split into "
           "segments (drawn as horizontal segment means); a step is marked with its size where "
           "it is significant against the history's noise and confirmed by consecutive nights; "
           "python -m jobs regress --segments lists them with their commit ranges.")
STATUS_ORDER = {"regressed": 0, "improved": 1, "ok": 2, "insufficient-history": 3, "no-timing": 4}


FILTERS = (("all", ""), ("regressed or improved", "regressed,improved"),
           ("regressed", "regressed"), ("improved", "improved"))


def status_filter(table_id: str, cols: tuple[int, ...]) -> h.Markup:
    """A select that shows only the rows of table ``table_id`` whose cell in
    one of ``cols`` reads one of the chosen statuses (dashboard.js)."""
    options = h.join(h.tag("option", label, value=value) for label, value in FILTERS)
    return h.tag("label", h.join(["show: ", h.tag(
        "select", options, cls="status-filter", data_table=table_id,
        data_cols=",".join(map(str, cols)))]), cls="filter")


def nightly_timed(site: Site) -> list[Row]:
    return [r for r in site.results.rows
            if r["trigger"] == "nightly" and r.get("t_median_us") is not None]


def render(site: Site) -> dict[str, str]:
    rows = nightly_timed(site)
    pages: dict[str, str] = {}
    if not rows:
        msg = ("no nightly rows with a latency (t_median_us) yet; trends start with the first "
               "nightly profile run." if site.results.rows else
               f"no results rows under {site.results.root}.")
        pages["trends.html"] = site.page("Trends", "trends.html", h.no_data(msg))
        return pages
    segs = segments_all(site.results)
    by_case = group(rows, "_case")
    summary = []
    for (cid,), case_rows in by_case.items():
        last = case_rows[-1]
        v = site.verdicts[last["_index"]]
        summary.append((STATUS_ORDER.get(v.status, 9), last, v, len(case_rows)))
    summary.sort(key=lambda s: (s[0], s[1]["op"], case_label(s[1])))
    latest = site.results.latest
    in_latest = {r["_case"]: r["outcome"] for r in latest.rows}
    table_rows = [[h.status_badge(v.status), _cp_cell(segs, r["_case"]),
                   h.op_chip(r["op"], f"trends-{slug(r['op'])}.html"),
                   h.link(trend_href(r), case_label(r)),
                   h.badge(in_latest[r["_case"]]) if r["_case"] in in_latest else "absent",
                   n, h.fmt(r["started_at"]),
                   h.us(r["t_median_us"]), h.us(v.mean), h.us(v.threshold),
                   h.us(r.get("baseline_median_us")), h.ratio(r.get("ratio"))]
                  for _, r, v, n in summary]
    table = h.table(["status", "change points", "op", "case", "latest run", "nightly runs",
                     "last timed", "last median µs", "history mean µs", "flag above µs",
                     "baseline µs", "ratio"], table_rows, numeric=range(5, 12), id="trend-cases")
    ops = sorted({r["op"] for r in rows}, key=sort_key)
    op_links = h.join([h.op_chip(op, f"trends-{slug(op)}.html") for op in ops], "  ")
    counts = {s: sum(1 for x in summary if x[2].status == s) for s in STATUS_ORDER}
    body = h.join([
        h.tag("p", RULE_NOTE + " Status is that of the case's last timed nightly run; "
              "'latest run' is its outcome in the latest run. " + (
                  CP_NOTE if segs is not None else
                  "Change points: not computed (ruptures is not installed)."), cls="note"),
        h.section("Per op", h.tag("div", op_links, cls="legend-row")),
        h.section(f"Cases: {counts['regressed']} regressed, {counts['improved']} improved, "
                  f"{counts['ok']} ok, {counts['insufficient-history']} insufficient history",
                  status_filter("trend-cases", (0, 1)), table),
    ])
    pages["trends.html"] = site.page("Trends", "trends.html", body)
    for op in ops:
        pages[f"trends-{slug(op)}.html"] = _op_page(site, op, [r for r in rows if r["op"] == op],
                                                    segs)
    return pages


def _cp_cell(segs, cid: str):
    """The newest night's change-point status and the last step's size."""
    if segs is None or cid not in segs:
        return "—"
    cs = segs[cid]
    steps = cs.segmentation.steps
    last = (f" (last step {steps[-1].change:+.1%})" if steps else "")
    return h.join([h.status_badge(cs.status), last])


def segment_traces(cs, when: dict[str, str] | None = None) -> list[dict]:
    """A case's segments as horizontal lines at each segment's mean, and its
    steps as markers labelled with their size and confidence; ``when``: the x
    of each run id (default: the run's start)."""
    if cs is None:
        return []
    when = when or {}
    x = [when.get(rid) or start.isoformat() for start, rid, _ in cs.nights]
    traces = []
    for i, sg in enumerate(cs.segmentation.segments):
        last = sg.end - 1
        traces.append({"type": "scatter", "mode": "lines", "name": "segment mean",
                       "legendgroup": "segments", "showlegend": i == 0,
                       "x": [x[sg.start], x[last]], "y": [sg.mean_us, sg.mean_us],
                       "line": {"color": palette.BASELINE_COLOUR, "width": 3},
                       "hovertemplate": f"segment {i}: mean %{{y:.3f}} µs over "
                                        f"{sg.end - sg.start} night(s)<extra></extra>"})
    steps = cs.segmentation.steps
    if steps:
        traces.append({
            "type": "scatter", "mode": "markers+text", "name": "step",
            "x": [x[s.index] for s in steps], "y": [s.after_us for s in steps],
            "text": [f"{s.change:+.1%}" + ("" if s.confirmed else " (pending)") for s in steps],
            "textposition": "top center",
            "customdata": [round(s.confidence, 6) for s in steps],
            "marker": {"color": [palette.REGRESSION_MARKER if s.change > 0 else
                                 palette.BASELINE_COLOUR for s in steps],
                       "size": 12, "symbol": "diamond"},
            "hovertemplate": "step %{text} (confidence %{customdata})<extra></extra>"})
    return traces


def trend_traces(site: Site, case_rows: list[Row], segments=None) -> list[dict]:
    """The traces of one case's chart: median, p99 (if any), baseline (if any),
    regressed points (if any), the change-point segments and steps (if
    ``segments``, a :class:`dashboards.regression.CaseSegments`)."""
    op = case_rows[0]["op"]
    colour = palette.op_colour(op)
    x = [r["started_at"].isoformat() for r in case_rows]
    hover = [h.plot_text(f"run {r['run_id']} · commit {(r.get('git_commit') or '—')[:10]}")
             for r in case_rows]
    traces = [{"type": "scatter", "mode": "lines+markers", "name": "median", "x": x,
               "y": [r["t_median_us"] for r in case_rows], "text": hover,
               "line": {"color": colour, "width": 2}, "marker": {"color": colour, "size": 6},
               "hovertemplate": "%{text}<br>median %{y:.2f} µs<extra></extra>"}]
    p99 = [r for r in case_rows if r.get("t_p99_us") is not None]
    if p99:
        traces.append({"type": "scatter", "mode": "lines", "name": "p99",
                       "x": [r["started_at"].isoformat() for r in p99],
                       "y": [r["t_p99_us"] for r in p99],
                       "line": {"color": palette.shade(colour, 2, 3), "width": 1, "dash": "dot"},
                       "hovertemplate": "p99 %{y:.2f} µs<extra></extra>"})
    base = [r for r in case_rows if r.get("baseline_median_us") is not None]
    if base:
        traces.append({"type": "scatter", "mode": "lines", "name": h.plot_text(
                           "baseline: " + (base[-1].get("baseline") or "?")),
                       "x": [r["started_at"].isoformat() for r in base],
                       "y": [r["baseline_median_us"] for r in base],
                       "line": {"color": palette.BASELINE_COLOUR, "width": 1.5, "dash": "dash"},
                       "hovertemplate": "baseline %{y:.2f} µs<extra></extra>"})
    bad = [r for r in case_rows if site.status(r) == "regressed"]
    if bad:
        traces.append({"type": "scatter", "mode": "markers", "name": "regressed",
                       "x": [r["started_at"].isoformat() for r in bad],
                       "y": [r["t_median_us"] for r in bad],
                       "marker": {"color": palette.REGRESSION_MARKER, "size": 14,
                                  "symbol": "x-thin-open", "line": {"width": 3,
                                                                    "color": palette.REGRESSION_MARKER}},
                       "hovertemplate": "REGRESSED %{y:.2f} µs<extra></extra>"})
    return traces + segment_traces(segments, dict(zip((r["run_id"] for r in case_rows), x)))


def _op_page(site: Site, op: str, rows: list[Row], segs=None) -> str:
    by_case = group(rows, "_case")
    order = sorted(by_case, key=lambda k: (STATUS_ORDER.get(site.status(by_case[k][-1]), 9),
                                          case_label(by_case[k][-1])))
    boxes = []
    for (cid,) in order:
        case_rows = by_case[(cid,)]
        last = case_rows[-1]
        status = site.status(last)
        chart = h.chart(f"trend-{cid}", trend_traces(site, case_rows,
                                                     (segs or {}).get(cid)), {
            "margin": {"l": 56, "r": 10, "t": 8, "b": 30},
            "yaxis": {"title": {"text": "µs"}, "rangemode": "tozero"},
            "xaxis": {"type": "date"}, "legend": {"orientation": "h", "y": 1.12, "x": 0},
            "showlegend": True}, height=250)
        title = h.join([h.status_badge(status), " ", case_label(last)])
        boxes.append(h.tag("div", h.Markup(h.tag("h3", title) + chart), cls="chart-box", id=cid))
    body = h.join([
        h.tag("p", h.join([h.link("trends.html", "← all cases"), " · ", RULE_NOTE,
                           " ", CP_NOTE if segs is not None else ""]), cls="note"),
        h.section(h.join([h.op_chip(op), f" — {len(by_case)} case(s) over nightly runs"]),
                  h.tag("div", h.join(boxes), cls="grid2"))])
    return site.page(f"Trends: {op}", "trends.html", body, charts=True)
