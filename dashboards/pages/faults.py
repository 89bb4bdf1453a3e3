"""faults.html: every injected or observed fault and every hang, newest run
first — the fault, what was expected and seen, the diagnosis (missing ranks,
token, fragment, stage) and the outcome; a summary per fault kind on top.

A fault row's ``outcome`` is the job's verdict on the handling: ``pass``
means the fault was detected/diagnosed/recovered as expected. What the
faulty call itself did is ``extra.call_outcome`` when the job records it.
"""

from __future__ import annotations

from cluster import ops as registry
from dashboards import html as h
from dashboards.model import Row, case_label, extra_of, group, sort_key
from dashboards.pages import Site, details_href, no_results

MAX_RUNS = 30


def is_fault(row: Row) -> bool:
    """Injected (fault_kind) or observed (a hang, a diagnosis, blamed ranks)."""
    return (row.get("fault_kind") is not None or row["outcome"] == "hang"
            or row.get("diagnosis") is not None or row.get("fault_seen") is not None
            or bool(row.get("missing_ranks")))


def call_outcome(row: Row) -> str | None:
    value = extra_of(row).get("call_outcome")
    return value if isinstance(value, str) else None


def where(row: Row) -> list[str]:
    parts = []
    if row.get("missing_ranks"):
        parts.append("missing ranks " + ", ".join(map(str, row["missing_ranks"])))
    for name in ("token", "fragment", "stage"):
        value = row.get(f"fault_{name}")
        if value is not None:
            parts.append(f"{name} {value}")
    return parts


def _fault_block(row: Row, linkable: bool) -> h.Markup:
    kind = row.get("fault_kind") or "observed"
    call = call_outcome(row)
    facts = [h.badge(row["outcome"]), h.tag("strong", kind, cls="fault-kind"), h.op_chip(row["op"]),
             h.link(details_href(row), case_label(row)) if linkable else
             h.tag("span", case_label(row))]
    side = ([f"call: {call}"] if call else []) + where(row)
    lines = [h.tag("div", h.join([h.join(facts, " "),
                                  h.tag("span", " · ".join(side), cls="where")]), cls="head")]
    for label, value in (("expected", row.get("fault_expected")), ("seen", row.get("fault_seen")),
                         ("diagnosis", row.get("diagnosis")), ("reason", row.get("reason"))):
        if value:
            lines.append(h.tag("div", h.join([h.tag("span", label, cls="k"), h.tag("span", value)]),
                               cls="line"))
    if row.get("repro_command"):
        lines.append(h.tag("div", h.join([h.tag("span", "reproduce", cls="k"),
                                          h.tag("code", row["repro_command"])]), cls="line"))
    return h.tag("div", h.join(lines), cls=f"fault f-{row['outcome']}",
                 data_outcome=row["outcome"], data_kind=kind)


def render(site: Site) -> dict[str, str]:
    if not site.results.rows:
        return {"faults.html": site.page("Faults & hangs", "faults.html", no_results(site))}
    runs = site.results.runs[:MAX_RUNS]
    faults = [r for run in runs for r in run.rows if is_fault(r)]
    if not faults:
        body = h.no_data(f"no injected faults, hangs or diagnoses in the last {len(runs)} run(s).")
        return {"faults.html": site.page("Faults & hangs", "faults.html", body)}
    latest_ids = {r["_index"] for r in site.results.latest.rows}
    summary_rows = []
    for (kind, op), rows in sorted(group(faults, "fault_kind", "op").items(),
                                   key=lambda kv: (sort_key(kv[0][0]), sort_key(kv[0][1]))):
        summary_rows.append([
            kind if kind is not None else "(observed, not injected)", op, len(rows),
            sum(r["outcome"] == "pass" for r in rows),
            sum(r["outcome"] in ("fail", "hang", "error") for r in rows),
            sum(r["outcome"] == "hang" or call_outcome(r) == "hang" for r in rows),
            sum(r["_index"] in latest_ids for r in rows)])
    summary = h.table(["fault kind", "op", "rows", "handled as expected", "not handled",
                       "hung (call or case)", "in latest run"], summary_rows,
                      numeric=range(2, 7), id="fault-summary", cls="compact")
    untested = [op for op in registry.collective() if op not in {r["op"] for r in faults}]
    sections = [h.section("By fault kind and op", summary, note=(
        "handled as expected: the job's verdict on the row is pass (the fault was detected, "
        "diagnosed and recovered from as the campaign expects); not handled: fail, hang or "
        "error. stage: Lamport generation (0..2); token/fragment: where the watchdog fired; "
        "missing ranks: the ranks the group view blames."
        + (f" Collective ops with no fault row in these runs: {', '.join(untested)}."
           if untested else "")))]
    for run in runs:
        rows = [r for r in run.rows if is_fault(r)]
        if not rows:
            continue
        rows.sort(key=lambda r: (r["outcome"] == "pass", sort_key(r.get("fault_kind")),
                                 r["started_at"]))
        blocks = h.join(_fault_block(r, r["_index"] in latest_ids) for r in rows)
        title = h.join([h.tag("code", run.run_id, cls="run"),
                        f" · {run.trigger} · {h.fmt(run.started_at)} — {len(rows)} fault row(s), "
                        f"{sum(r['outcome'] != 'pass' for r in rows)} not handled"])
        sections.append(h.section(title, blocks, id=f"run-{run.run_id}"))
    return {"faults.html": site.page("Faults & hangs", "faults.html", h.join(sections),
                                     subtitle=f"{len(faults)} fault row(s) in the last "
                                              f"{len(runs)} run(s); problems first")}
