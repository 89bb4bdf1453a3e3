"""compare.html: two runs side by side — outcome counts, environment, and every
case's outcome, median latency and ULP in A and B, changes first. The page
picks the runs in the browser (``?a=RUN&b=RUN``, default: the latest run and
the one before); the data of the last runs is embedded as JSON."""

from __future__ import annotations

import json
import math

from dashboards import html as h
from dashboards import palette
from dashboards.model import ENV_FIELDS, OUTCOME_ORDER, case_label
from dashboards.pages import Site, no_results
from dashboards.pages.environment import LABELS, env_text

MAX_RUNS = 40
CHANGED_FRACTION = 0.05


def compare_data(site: Site) -> dict:
    runs = site.results.runs[:MAX_RUNS]
    cases: dict[str, dict] = {}
    results: dict[str, dict] = {}
    for run in runs:
        per = results.setdefault(run.run_id, {})
        for r in run.rows:
            cases.setdefault(r["_case"], {"op": r["op"], "label": case_label(r),
                                          "label_html": h.plot_text(case_label(r))})
            per[r["_case"]] = [r["outcome"], _value(r.get("t_median_us")), _value(r.get("max_ulp")),
                               site.status(r)]
    ops = sorted({c["op"] for c in cases.values()})
    return {
        "runs": [{"id": run.run_id, "label": f"{run.run_id} · {run.trigger} · "
                  f"{h.fmt(run.started_at)}", "counts": run.counts(),
                  "env": {LABELS.get(f, f): env_text(run.env()[f], f) for f in ENV_FIELDS},
                  "env_detail": {"topology": "\n".join(
                      json.dumps(json.loads(v), indent=1, sort_keys=True)
                      for v in run.env()["topology"] if _is_json(v))}}
                 for run in runs],
        "default_b": runs[0].run_id,
        "default_a": runs[1].run_id if len(runs) > 1 else runs[0].run_id,
        "cases": cases, "results": results, "outcomes": list(OUTCOME_ORDER),
        "env_fields": [LABELS.get(f, f) for f in ENV_FIELDS],
        "colours": {op: palette.op_colour(op) for op in ops},
        "cases_op_html": {op: h.plot_text(op) for op in ops},
        "changed_fraction": CHANGED_FRACTION,
    }


def _value(value: float | None) -> float | str | None:
    """A number for the page's JSON; one JSON cannot hold (NaN, inf) as
    its text, which the page shows as it is and leaves out of sums."""
    return value if value is None or math.isfinite(value) else h.fmt(value)


def _is_json(text: str | None) -> bool:
    try:
        json.loads(text or "")
    except json.JSONDecodeError:
        return False
    return True


def render(site: Site) -> dict[str, str]:
    if not site.results.runs:
        return {"compare.html": site.page("Compare runs", "compare.html", no_results(site))}
    data = compare_data(site)
    only_one = len(site.results.runs) < 2
    controls = h.Markup(
        '<div class="controls"><label>A (before) <select id="run-a"></select></label>'
        '<label>B (after) <select id="run-b"></select></label>'
        '<label><input type="checkbox" id="only-changed" checked> only changed cases</label>'
        "</div>")
    counts = h.Markup('<table class="data compact" id="compare-counts"><thead><tr><th>outcome</th>'
                      '<th class="num">A</th><th class="num">B</th><th class="num">B − A</th>'
                      "</tr></thead><tbody></tbody></table>")
    env = h.Markup('<table class="data compact" id="compare-env"><thead><tr><th>environment</th>'
                   "<th>A</th><th>B</th></tr></thead><tbody></tbody></table>")
    cases = h.Markup(
        '<p class="note" id="compare-summary"></p>'
        '<table class="data compact" id="compare-cases"><thead><tr><th>op</th><th>case</th>'
        '<th>A</th><th>B</th><th class="num">A median µs</th><th class="num">B median µs</th>'
        '<th class="num">Δ median</th><th class="num">A max ULP</th>'
        '<th class="num">B max ULP</th><th>B latency</th></tr></thead><tbody></tbody></table>')
    scatter = h.Markup('<div id="compare-scatter" class="chart-free" style="height:420px"></div>'
                       '<p class="no-data" id="compare-scatter-none" style="display:none">'
                       "<strong>No data.</strong> no case has a median latency in both runs.</p>")
    spec = h.Markup('<script type="application/json" id="compare-data">'
                    f"{h.safe_json(data)}</script>")
    body = h.join([
        h.no_data("only one run so far: A and B are the same run.") if only_one else "",
        h.section("Runs", controls, h.tag("div", h.Markup(counts), style="max-width:520px")),
        h.section("Cases", cases, note="Changed: a different outcome, or the median moved more "
                  f"than {CHANGED_FRACTION:.0%}. Outcome changes first, then the largest moves."),
        h.section("Median latency, A vs B", scatter, note="One point per case timed in both "
                  "runs, coloured by op; above the dashed line B is slower."),
        h.section("Environment", env),
        spec,
    ])
    return {"compare.html": site.page("Compare runs", "compare.html", body, charts=True)}
