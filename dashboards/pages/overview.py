"""index.html: the latest run at a glance — counts by outcome, op and topology,
what needs attention, and every run."""

from __future__ import annotations

from cluster.phases import describe
from dashboards import html as h
from dashboards import palette
from dashboards.model import OUTCOME_ORDER, Row, group, is_baseline, slug, sort_key
from dashboards.pages import Site, details_href, latency, no_results, trends
from jobs.results import row_job

MAX_RUNS_LISTED = 60


def counts(site: Site, rows: list[Row]) -> dict[str, int]:
    """Rows per outcome, plus kernel cases ``regressed``, ``improved`` and with
    ``insufficient-history`` (by verdict; baselines never count)."""
    out = dict.fromkeys(OUTCOME_ORDER, 0)
    out["regressed"] = out["improved"] = out["insufficient-history"] = 0
    for r in rows:
        out[r["outcome"]] = out.get(r["outcome"], 0) + 1
        status = site.status(r)
        if status in ("regressed", "improved", "insufficient-history") and not is_baseline(r):
            out[status] += 1
    return out


def _count_cells(c: dict[str, int], keys: tuple[str, ...]) -> list[h.Markup]:
    return [h.tag("span", c[k], cls="zero" if not c[k] else None, data_k=k) for k in keys]


COUNT_KEYS = ("pass", "fail", "hang", "error", "skipped", "regressed")


def render(site: Site) -> dict[str, str]:
    run = site.results.latest
    if run is None:
        return {"index.html": site.page("Overview", "index.html", no_results(site))}
    rows = run.rows
    c = counts(site, rows)
    env = run.env()
    duration = (run.finished_at - run.started_at).total_seconds() if run.finished_at else None
    meta = [("run", run.run_id), ("status", _status(run)), ("trigger", run.trigger),
            ("started", h.fmt(run.started_at)),
            ("duration", f"{duration:,.0f} s" if duration is not None else None),
            ("suites", ", ".join(run.suites)),
            ("commit", ", ".join(str(v)[:12] for v in env["git_commit"]) or None),
            ("GPUs", ", ".join(f"{n}× {m}" for n, m in zip(env["gpu_count"] or [None],
                                                          env["gpu_model"] or ["—"]))
             if env["gpu_model"] else "none recorded"),
            ("hosts", ", ".join(map(str, env["hostname"])) or None)]
    meta_html = h.tag("dl", h.join(h.Markup(h.tag("dt", k) + h.tag("dd", v)) for k, v in meta),
                      cls="meta")
    cards = h.cards([
        ("cases", len(rows), "total"), ("passed", c["pass"], "pass"),
        ("failed", c["fail"], "fail"), ("hung", c["hang"], "hang"),
        ("errors", c["error"], "error"), ("regressed", c["regressed"], "regressed"),
        ("skipped", c["skipped"], "skipped"), ("improved", c["improved"], "improved"),
        ("no history yet", c["insufficient-history"], ""),
    ])

    by_op = group(rows, "op")
    ops = sorted(by_op, key=lambda k: sort_key(k[0]))
    trend_ops = {r["op"] for r in trends.nightly_timed(site)}
    timed_run = latency.latest_timed_run(site)
    latency_ops = {r["op"] for r in latency.timed_rows(timed_run)} if timed_run else set()
    op_rows = []
    for (op,) in ops:
        oc = counts(site, by_op[(op,)])
        links = [h.link(f"details-{slug(op)}.html", "details")]
        if any(row_job(r) == "correctness" for r in by_op[(op,)]):
            links.append(h.link(f"correctness.html#op-{slug(op)}", "matrix"))
        if op in trend_ops:
            links.append(h.link(f"trends-{slug(op)}.html", "trends"))
        if op in latency_ops:
            links.append(h.link(f"latency.html#op-{slug(op)}", "latency"))
        op_rows.append([h.op_chip(op, f"details-{slug(op)}.html"), len(by_op[(op,)]),
                        *_count_cells(oc, COUNT_KEYS), h.join(links, " · ")])
    op_table = h.table(["op", "cases", *COUNT_KEYS, "pages"], op_rows,
                       numeric=range(1, 2 + len(COUNT_KEYS)), id="by-op")
    op_chart = _outcome_chart(site, ops, by_op)

    by_topo = group(rows, "topology", "tp", "transport", "placement")
    topo_rows = []
    for key in sorted(by_topo, key=lambda k: tuple(sort_key(v) for v in k)):
        tc = counts(site, by_topo[key])
        topo_rows.append([h.topology(key[0]), *key[1:], len(by_topo[key]),
                          *_count_cells(tc, COUNT_KEYS)])
    topo_table = h.table(["topology", "tp", "transport", "placement", "cases", *COUNT_KEYS],
                         topo_rows, numeric=range(4, 5 + len(COUNT_KEYS)), id="by-topology")

    attention = [r for r in rows if r["outcome"] not in ("pass", "skipped")
                 or (site.status(r) == "regressed" and not is_baseline(r))]
    attention.sort(key=lambda r: (r["outcome"] == "pass", r["outcome"], r["op"]))
    att_table = _case_table(site, attention, "nothing failed, hung, errored or regressed "
                            "in the latest run.", "attention", good=True)
    skipped = [r for r in rows if r["outcome"] == "skipped"]
    skipped_html = h.tag("details", h.Markup(
        h.tag("summary", f"{len(skipped)} skipped case(s) and why") +
        _case_table(site, skipped, "none skipped.", "skipped"))) if skipped else ""

    nightly_runs, other_runs = site.results.nightly_runs, site.results.other_runs
    runs_table = _runs_table(site, nightly_runs, "runs", "no nightly run yet.")
    other_table = _runs_table(site, other_runs, "other-runs", "none.")

    warning = (h.tag("p", f"This run is {run.status.upper()}: " + {
        "incomplete": "its driver went away before it finished; its counts cover only the "
                      "cases that ended, and it is no regression baseline.",
        "interrupted": "it was stopped (SIGINT or SIGTERM) after the case in hand; its counts "
                       "cover the cases that ended, it is no regression baseline, and the "
                       "same command with --run-id and --resume completes it.",
        "running": "it has not finished yet; it is no regression baseline."}[run.status],
        cls="incomplete", id="run-status")
               if run.status in ("incomplete", "interrupted", "running") else "")
    body = h.join([
        warning,
        cards,
        h.section("Latest nightly run" if site.results.latest_is_nightly
                  else "Latest run (no nightly run yet: the latest of any trigger)", meta_html,
                  id="latest-run"),
        h.section("Needs attention", trends.status_filter("attention", (0,)), att_table,
                  skipped_html, id="attention-section",
                  note="Cases of the latest run that failed, hung, errored or regressed; each "
                       "links to its details."),
        h.section("By op", op_chart, op_table),
        h.section("By topology", topo_table,
                  note="topology: nodes, GPUs, links and multicast as discovered at the run's "
                       "start (click one for the recorded JSON); — where none was recorded."),
        _time_section(run),
        h.section(f"Nightly runs ({len(nightly_runs)})", runs_table),
        h.section(f"Ad-hoc and CI runs ({len(other_runs)})", other_table, id="other-runs-section",
                  note="Runs not started by the nightly schedule (python -m jobs trace, a job "
                       "run by hand, CI): listed here, never the latest run above while a "
                       "nightly run exists."),
    ])
    which = ("Latest nightly run " if site.results.latest_is_nightly
             else "Latest run (no nightly run yet) ")
    sub = h.join([which, h.tag("code", run.run_id), f" · {run.trigger} · "
                  f"{h.fmt(run.started_at)}"])
    return {"index.html": site.page("Overview", "index.html", body, charts=True, subtitle=sub)}


def _runs_table(site: Site, runs: list, table_id: str, empty: str) -> h.Markup:
    """The runs, newest first (at most MAX_RUNS_LISTED), each with its
    counts and links to its environment and to the run before it."""
    runs = runs[:MAX_RUNS_LISTED]
    rows = []
    for i, r in enumerate(runs):
        rc = counts(site, r.rows)
        prev = runs[i + 1] if i + 1 < len(runs) else None
        links = [h.link(f"environment.html#run-{r.run_id}", "environment")]
        if prev:
            links.append(h.link(f"compare.html?a={prev.run_id}&b={r.run_id}", "vs previous"))
        rows.append([h.tag("code", r.run_id, cls="run"), _status(r), r.trigger,
                     h.fmt(r.started_at), len(r.rows),
                     *_count_cells(rc, COUNT_KEYS), h.join(links, " · ")])
    return h.table(["run", "status", "trigger", "started", "cases", *COUNT_KEYS, "links"], rows,
                   numeric=range(4, 5 + len(COUNT_KEYS)), id=table_id, empty=empty)


def _time_section(run) -> h.Markup | str:
    """Where the latest run's time went, per job section (its manifest's
    accounting): a bar of wall time split into the timed work and the rest
    (the service's overhead), and the table behind it."""
    entries = run.accounting
    if not entries:
        return ""
    seen: dict[str, int] = {}
    labels, work, rest, rows = [], [], [], []
    for e in entries:
        job = str(e.get("job") or "?")
        seen[job] = seen.get(job, 0) + 1
        label = job if seen[job] == 1 else f"{job} ({seen[job]})"  # a run in parts
        if e.get("interrupted"):  # stopped by SIGTERM or Ctrl-C (jobs.recorder.Run.stop)
            label += ", interrupted"
        wall, done = float(e["wall_s"]), float(e.get("work_s") or 0.0)
        labels.append(h.plot_text(label))
        work.append(round(min(done, wall), 3))
        rest.append(round(max(wall - done, 0.0), 3))
        rebuilt = (f"{e['rebuilt_cases']} ({float(e.get('rebuilt_s') or 0):,.1f} s)"
                   if e.get("rebuilt_cases") else "—")
        built, prepared = (float(e.get(k) or 0.0) for k in ("build_s", "prepare_s"))
        rows.append([label, e.get("cases"), f"{wall:,.1f}", f"{done:,.2f}" if done else "—",
                     e.get("work") or "—",
                     f"{e['overhead']:.1f}×" if e.get("overhead") is not None else "—",
                     f"{built:,.1f}" if built else "—",
                     f"{prepared:,.1f}" if prepared else "—",
                     e.get("peak_groups") or "—", rebuilt,
                     describe(e["phases_s"]) if e.get("phases_s") else "—"])
    data = [{"type": "bar", "orientation": "h", "name": name, "y": labels, "x": values,
             "marker": {"color": colour},
             "hovertemplate": "%{y}: %{x:.1f} s " + name + "<extra></extra>"}
            for name, values, colour in (("timed work", work, palette.OUTCOME_COLOURS["pass"]),
                                         ("the rest (service overhead)", rest,
                                          palette.BASELINE_COLOUR))]
    layout = {"barmode": "stack", "margin": {"l": 150, "t": 10},
              "yaxis": {"autorange": "reversed"}, "xaxis": {"title": {"text": "seconds"}},
              "legend": {"orientation": "h", "y": -0.3}}
    chart = h.chart("overview-time", data, layout, height=max(160, 60 + 34 * len(labels)))
    table = h.table(["job", "cases", "wall (s)", "timed work (s)", "what is timed",
                     "overhead", "group builds (s)", "kernel preparation (s)",
                     "peak groups at once",
                     "cases that rebuilt their group", "host time in cases, by phase"],
                    rows, numeric=range(1, 4), id="time")
    return h.section("Where the time went", chart, table,
                     note="Per job of the latest run, as each ended (a run in parts lists each "
                          "part's jobs): wall time, the timed work inside it and their "
                          "ratio, the service overhead; group builds: placing each TP group and "
                          "starting and setting up its rank processes (virtual ranks: the "
                          "task's start and imports), rebuilds included; kernel "
                          "preparation: compiling, or "
                          "loading from the compile cache, what the cases needed (the "
                          "profile: each implementation's build and first call, slowest "
                          "rank), summed over groups that may run at once; host time in "
                          "cases: per call the slowest rank's inputs, load, call, readback "
                          "and check (the profile: inputs, check and graph, per "
                          "implementation), summed over the job (cluster.phases).")


def _status(run) -> h.Markup:
    """The run's manifest status as a badge (``unrecorded``: no manifest)."""
    return h.tag("span", run.status, cls=f"status-{run.status}", data_k="run-status")


def _case_table(site: Site, rows: list[Row], empty: str, table_id: str,
                good: bool = False) -> h.Markup:
    out = []
    for r in rows:
        status = site.status(r)
        what = h.badge(r["outcome"]) if r["outcome"] != "pass" else h.status_badge(status)
        why = r.get("diagnosis") or r.get("reason")
        if status == "regressed" and r["outcome"] == "pass":
            v = site.verdicts[r["_index"]]
            why = (f"median {h.us(v.value)} µs vs {h.us(v.mean)} µs mean of the last "
                   f"{v.history} nightly runs ({h.pct(v.value / v.mean - 1) if v.mean else 'from 0'}"
                   f"; flagged above "
                   f"{h.us(v.threshold)} µs)")
        out.append([what, h.op_chip(r["op"]), h.link(details_href(r), _case(r)),
                    h.tag("div", why or "—", cls="reason"), h.repro(r.get("repro_command"))])
    return h.table(["outcome", "op", "case", "why", "reproduce"], out, empty=empty,
                   empty_is_good=good, id=table_id, cls="details")


def _case(r: Row) -> str:
    from dashboards.model import case_label
    return case_label(r)


def _outcome_chart(site: Site, ops: list[tuple], by_op: dict) -> h.Markup:
    """Stacked bars: cases per op by outcome (and regressed)."""
    names = [op for (op,) in ops]
    labels = [h.plot_text(op) for op in names]
    data = []
    for key, colour in [*palette.OUTCOME_COLOURS.items(), ("regressed", palette.REGRESSION_MARKER)]:
        values = [counts(site, by_op[(op,)])[key] for op in names]
        if key == "pass":  # regressed cases passed: show them apart
            values = [v - counts(site, by_op[(op,)])["regressed"] for v, op in zip(values, names)]
        if not any(values):
            continue
        data.append({"type": "bar", "orientation": "h", "name": key, "y": labels, "x": values,
                     "marker": {"color": colour},
                     "hovertemplate": "%{y}: %{x} " + key + "<extra></extra>"})
    tick_colours = [palette.op_colour(op) for op in names]
    layout = {"barmode": "stack", "margin": {"l": 150, "t": 10},
              "yaxis": {"autorange": "reversed", "tickfont": {"size": 12}},
              "xaxis": {"title": {"text": "cases"}}, "legend": {"orientation": "h", "y": -0.25, "traceorder": "normal"},
              "annotations": [], "meta": {"op_colours": tick_colours}}
    return h.chart("overview-outcomes", data, layout, height=max(180, 48 + 34 * len(names)))
