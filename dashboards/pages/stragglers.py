"""stragglers.html: per TP group of the latest run, who starts publishing
last and by how much (cluster.stragglers) — a section per group: its
calls' skew (last rank's publish start after the first's: median, p90,
max, and its distribution), and per rank its offset from the group's first
(median, p90, max) and how often it came last.

A group is the rows' TP group identity (op, variant, transport, placement,
tp, hidden, top_k, hc: the cases one group of rank actors ran, in order);
its calls are every correctness row's ``extra.publish_offsets_us_by_call``.
Rows written before the straggler columns (schema version < 4) have none
and are left out.
"""

from __future__ import annotations

from cluster.stragglers import per_rank, percentile, skew
from dashboards import html as h
from dashboards.model import extra_of, group, number, slug
from dashboards.pages import Site, no_results
from jobs.results import row_job

GROUP = ("op", "variant", "transport", "placement", "tp", "hidden", "top_k", "hc")


def group_id(key: tuple) -> str:
    return "g-" + slug("-".join(str(v) for v in key if v is not None))


def _calls(rows) -> list[list]:
    """Every call of ``rows`` with two marks or more; an offset that is not
    a finite number is no mark (None)."""
    out = []
    for r in rows:
        calls = extra_of(r).get("publish_offsets_us_by_call")
        for call in calls if isinstance(calls, list) else ():
            if isinstance(call, list):
                call = [number(o) for o in call]
                if sum(o is not None for o in call) >= 2:
                    out.append(call)
    return out


def _section(key: tuple, rows, calls) -> h.Markup:
    named = dict(zip(GROUP, key))
    title = (f"{named['op']} tp={named['tp']} hidden={named['hidden']} {named['placement']}"
             + "".join(f" {k}={named[k]}" for k in ("top_k", "hc") if named[k] is not None)
             + f" · {named['variant']} · {named['transport']}")
    skews = [skew(c) for c in calls]
    ranks = per_rank(calls)
    last = max(ranks, key=lambda r: (r["last"], -r["rank"]))
    cards = h.cards([("calls", len(calls), ""),
                     ("skew median", h.us(percentile(skews, 0.5)), ""),
                     ("skew p90", h.us(percentile(skews, 0.9)), ""),
                     ("skew max", h.us(max(skews)), ""),
                     ("last most often", f"rank {last['rank']} ({last['last_share']:.0%})",
                      "")])
    table = h.table(["rank", "calls", "offset median", "offset p90", "offset max",
                     "last (calls)", "last (share)"],
                    [[r["rank"], r["calls"], h.us(r["median_us"]), h.us(r["p90_us"]),
                      h.us(r["max_us"]), r["last"], f"{r['last_share']:.0%}"] for r in ranks],
                    cls="compact stragglers", numeric=(0, 1, 2, 3, 4, 5, 6))
    chart = h.chart(f"{group_id(key)}-skew",
                    [{"type": "histogram", "x": skews, "name": "skew",
                      "marker": {"color": "#5c6bc0"}}],
                    {"title": {"text": "skew per call (us): last rank's publish start after "
                                       "the first's"},
                     "xaxis": {"title": {"text": "us"}}, "yaxis": {"title": {"text": "calls"}},
                     "bargap": 0.05}, height=260)
    note = (f"{len(rows)} case(s), {len(calls)} call(s). Offset: a rank's publish start after "
            f"the group's first rank's, on the node's monotonic clock.")
    return h.section(title, cards, table, chart, id=group_id(key), note=note)


def render(site: Site) -> dict[str, str]:
    run = site.results.latest
    if run is None:
        return {"stragglers.html": site.page("Stragglers", "stragglers.html", no_results(site))}
    sections = []
    for key, rows in sorted(group([r for r in run.rows if row_job(r) == "correctness"],
                                  *GROUP).items(), key=lambda kv: [str(v) for v in kv[0]]):
        calls = _calls(rows)
        if calls:
            sections.append(_section(key, rows, calls))
    if not sections:
        body = h.no_data(f"run {run.run_id} has no publish marks (single-rank groups only, "
                         f"or rows written before the straggler columns)")
    else:
        body = h.join(sections)
    sub = f"run {run.run_id} ({run.trigger}) · {len(sections)} group(s)"
    return {"stragglers.html": site.page("Stragglers", "stragglers.html", body, charts=True,
                                         subtitle=sub)}
