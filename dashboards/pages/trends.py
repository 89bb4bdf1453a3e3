"""trends.html (every timed case's status) and trends-<op>.html (one chart per
case): median latency over the nightly runs, the baseline beside it, the p99
dotted, regressions marked."""

from __future__ import annotations

from dashboards import html as h
from dashboards import palette
from dashboards.model import Row, case_label, group, slug, sort_key
from dashboards.pages import Site, trend_href
from dashboards.regression import DEFAULT_RULE

RULE_NOTE = (f"Rule (jobs/regression.py): {DEFAULT_RULE.describe()}; fewer earlier nightly "
             "results: insufficient history. Baselines (variant baseline:*) are judged too but "
             "never count as a regression.")
STATUS_ORDER = {"regressed": 0, "improved": 1, "ok": 2, "insufficient-history": 3, "no-timing": 4}


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
    by_case = group(rows, "_case")
    summary = []
    for (cid,), case_rows in by_case.items():
        last = case_rows[-1]
        v = site.verdicts[last["_index"]]
        summary.append((STATUS_ORDER.get(v.status, 9), last, v, len(case_rows)))
    summary.sort(key=lambda s: (s[0], s[1]["op"], case_label(s[1])))
    latest = site.results.latest
    in_latest = {r["_case"]: r["outcome"] for r in latest.rows}
    table_rows = [[h.status_badge(v.status), h.op_chip(r["op"], f"trends-{slug(r['op'])}.html"),
                   h.link(trend_href(r), case_label(r)),
                   h.badge(in_latest[r["_case"]]) if r["_case"] in in_latest else "absent",
                   n, h.fmt(r["started_at"]),
                   h.us(r["t_median_us"]), h.us(v.mean), h.us(v.threshold),
                   h.us(r.get("baseline_median_us")), h.ratio(r.get("ratio"))]
                  for _, r, v, n in summary]
    table = h.table(["status", "op", "case", "latest run", "nightly runs", "last timed",
                     "last median µs", "history mean µs", "flag above µs", "baseline µs",
                     "ratio"], table_rows, numeric=range(4, 11), id="trend-cases")
    ops = sorted({r["op"] for r in rows}, key=sort_key)
    op_links = h.join([h.op_chip(op, f"trends-{slug(op)}.html") for op in ops], "  ")
    counts = {s: sum(1 for x in summary if x[2].status == s) for s in STATUS_ORDER}
    body = h.join([
        h.tag("p", RULE_NOTE + " Status is that of the case's last timed nightly run; "
              "'latest run' is its outcome in the latest run.", cls="note"),
        h.section("Per op", h.tag("div", op_links, cls="legend-row")),
        h.section(f"Cases: {counts['regressed']} regressed, {counts['improved']} improved, "
                  f"{counts['ok']} ok, {counts['insufficient-history']} insufficient history",
                  table),
    ])
    pages["trends.html"] = site.page("Trends", "trends.html", body)
    for op in ops:
        pages[f"trends-{slug(op)}.html"] = _op_page(site, op, [r for r in rows if r["op"] == op])
    return pages


def trend_traces(site: Site, case_rows: list[Row]) -> list[dict]:
    """The traces of one case's chart: median, p99 (if any), baseline (if any),
    regressed points (if any)."""
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
    return traces


def _op_page(site: Site, op: str, rows: list[Row]) -> str:
    by_case = group(rows, "_case")
    order = sorted(by_case, key=lambda k: (STATUS_ORDER.get(site.status(by_case[k][-1]), 9),
                                          case_label(by_case[k][-1])))
    boxes = []
    for (cid,) in order:
        case_rows = by_case[(cid,)]
        last = case_rows[-1]
        status = site.status(last)
        chart = h.chart(f"trend-{cid}", trend_traces(site, case_rows), {
            "margin": {"l": 56, "r": 10, "t": 8, "b": 30},
            "yaxis": {"title": {"text": "µs"}, "rangemode": "tozero"},
            "xaxis": {"type": "date"}, "legend": {"orientation": "h", "y": 1.12, "x": 0},
            "showlegend": True}, height=250)
        title = h.join([h.status_badge(status), " ", case_label(last)])
        boxes.append(h.tag("div", h.Markup(h.tag("h3", title) + chart), cls="chart-box", id=cid))
    body = h.join([
        h.tag("p", h.join([h.link("trends.html", "← all cases"), " · ", RULE_NOTE]), cls="note"),
        h.section(h.join([h.op_chip(op), f" — {len(by_case)} case(s) over nightly runs"]),
                  h.tag("div", h.join(boxes), cls="grid2"))])
    return site.page(f"Trends: {op}", "trends.html", body, charts=True)
