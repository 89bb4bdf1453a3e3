"""latency.html: per op, median latency against token count for each tp,
transport (and hidden size / variant where they vary) with every baseline
the run timed dashed beside it (unfused, symm_mem, FlashInfer's modes ...:
the ``baseline:<impl>`` rows), and the ratio below; the numbers in a table
under each."""

from __future__ import annotations

from dashboards import html as h
from dashboards import palette
from dashboards.model import CASE_FIELDS, Row, group, is_baseline, rank_spread_us, slug, sort_key
from dashboards.pages import Site, details_href

SERIES_FIELDS = tuple(f for f in CASE_FIELDS if f not in ("op", "tokens"))
MARKERS = ("circle", "square", "diamond", "triangle-up", "cross", "triangle-down", "star",
           "hexagon")


def timed_rows(run) -> list[Row]:
    """The run's kernel rows with a latency (baseline rows are drawn from the
    kernel rows' baseline columns)."""
    return [r for r in run.rows if r.get("t_median_us") is not None and not is_baseline(r)]


def baseline_rows(run) -> list[Row]:
    """The run's baseline rows (``variant = baseline:<impl>``) with a latency."""
    return [r for r in run.rows if r.get("t_median_us") is not None and is_baseline(r)]


BASELINE_DASHES = ("dash", "dot", "dashdot", "longdash", "longdashdot", "5px,2px")


def baselines_of(key: tuple, baselines: list[Row]) -> dict[str, list[Row]]:
    """The baseline rows of the series ``key`` (same case fields but the
    variant), by implementation, each by tokens."""
    fields = [i for i, f in enumerate(SERIES_FIELDS) if f != "variant"]
    out: dict[str, list[Row]] = {}
    for r in baselines:
        if all(r.get(SERIES_FIELDS[i]) == key[i] for i in fields):
            out.setdefault(str(r["variant"]).split(":", 1)[1], []).append(r)
    return {impl: sorted(v, key=lambda r: sort_key(r.get("tokens")))
            for impl, v in sorted(out.items())}


def latest_timed_run(site: Site):
    for run in site.results.runs:
        if timed_rows(run):
            return run
    return None


def series_of(rows: list[Row]) -> dict[tuple, list[Row]]:
    """Rows of one op grouped into series (everything but tokens), each by tokens."""
    out = group(rows, *SERIES_FIELDS)
    return {k: sorted(v, key=lambda r: sort_key(r.get("tokens")))
            for k, v in sorted(out.items(), key=lambda kv: tuple(sort_key(x) for x in kv[0]))}


def series_name(key: tuple, varying: list[str]) -> str:
    values = dict(zip(SERIES_FIELDS, key))
    parts = []
    for f in varying:
        v = values[f]
        parts.append(f"{f}={h.fmt(v)}" if f in ("tp", "hidden", "top_k", "hc") else h.fmt(v))
    return " ".join(parts) or "all"


def latency_traces(op: str, rows: list[Row], baselines: list[Row] = ()) -> list[dict]:
    """Per series: latency (op colour, shaded per series), every baseline of
    ``baselines`` (its rows; dashed, one dash pattern per implementation;
    without baseline rows, the kernel rows' ``baseline_median_us``), ratio
    (lower panel). Baseline/ratio traces appear only where values exist."""
    series = series_of(rows)
    keys = list(series)
    varying = [f for i, f in enumerate(SERIES_FIELDS) if len({k[i] for k in keys}) > 1] \
        or ["tp", "transport"]
    colour = palette.op_colour(op)
    traces = []
    for n, key in enumerate(keys):
        pts = series[key]
        name = h.plot_text(series_name(key, varying))
        c = palette.shade(colour, n, len(keys))
        marker = MARKERS[n % len(MARKERS)]
        x = [r.get("tokens") for r in pts]
        traces.append({"type": "scatter", "mode": "lines+markers", "name": name,
                       "legendgroup": name, "x": x, "y": [r["t_median_us"] for r in pts],
                       "line": {"color": c, "width": 2}, "marker": {"color": c, "symbol": marker,
                                                                  "size": 8},
                       "xaxis": "x", "yaxis": "y",
                       "hovertemplate": name + "<br>tokens %{x}<br>median %{y:.2f} µs"
                                               "<extra></extra>"})
        impls = baselines_of(key, list(baselines))
        if not impls:  # rows written before every baseline had its own row
            base = [r for r in pts if r.get("baseline_median_us") is not None]
            if base:
                impls = {base[0].get("baseline") or "baseline":
                         [{"tokens": r.get("tokens"), "t_median_us": r["baseline_median_us"]}
                          for r in base]}
        for b, (impl, brows) in enumerate(impls.items()):
            bname = h.plot_text(impl)
            traces.append({"type": "scatter", "mode": "lines", "name": f"{name} · {bname}",
                           "legendgroup": name, "x": [r.get("tokens") for r in brows],
                           "y": [r["t_median_us"] for r in brows],
                           "line": {"color": c, "width": 1.5,
                                    "dash": BASELINE_DASHES[b % len(BASELINE_DASHES)]},
                           "opacity": 0.7, "xaxis": "x", "yaxis": "y",
                           "hovertemplate": bname + "<br>tokens %{x}<br>%{y:.2f} µs"
                                                    "<extra></extra>"})
        rat = [r for r in pts if r.get("ratio") is not None]
        if rat:
            traces.append({"type": "scatter", "mode": "lines+markers", "name": f"{name} ratio",
                           "legendgroup": name, "showlegend": False,
                           "x": [r.get("tokens") for r in rat], "y": [r["ratio"] for r in rat],
                           "line": {"color": c, "width": 1.5}, "marker": {"color": c,
                                                                       "symbol": marker, "size": 6},
                           "xaxis": "x", "yaxis": "y2",
                           "hovertemplate": name + "<br>tokens %{x}<br>ratio %{y:.3f}"
                                                   "<extra></extra>"})
    return traces


def render(site: Site) -> dict[str, str]:
    run = latest_timed_run(site)
    if run is None:
        msg = ("no run recorded latencies (t_median_us) yet; the profile jobs write them."
               if site.results.rows else f"no results rows under {site.results.root}.")
        return {"latency.html": site.page("Latency vs tokens", "latency.html", h.no_data(msg))}
    timed = timed_rows(run)
    base_all = baseline_rows(run)
    sections = []
    for (op,) in sorted(group(timed, "op"), key=lambda k: sort_key(k[0])):
        rows = [r for r in timed if r["op"] == op]
        bases = [r for r in base_all if r["op"] == op]
        traces = latency_traces(op, rows, bases)
        has_ratio = any(t["yaxis"] == "y2" for t in traces)
        ticks = sorted({r["tokens"] for r in rows if r.get("tokens") is not None})
        layout = {
            "xaxis": {"title": {"text": "tokens"}, "type": "log", "anchor": "y2" if has_ratio
                      else "y", "tickvals": ticks, "ticktext": [str(t) for t in ticks]},
            "yaxis": {"title": {"text": "median µs"}, "type": "log",
                      "domain": [0.38, 1] if has_ratio else [0, 1],
                      **h.log_ticks(y for t in traces if t["yaxis"] == "y" for y in t["y"])},
            "legend": {"orientation": "v", "x": 1.02, "y": 1},
            "margin": {"r": 260, "t": 16, "b": 50},
        }
        if has_ratio:
            layout["yaxis2"] = {"title": {"text": "ratio"}, "domain": [0, 0.28],
                                "gridcolor": "#eceff1", "zeroline": False}
            layout["shapes"] = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y2",
                                 "y0": 1, "y1": 1, "line": {"color": "#999", "dash": "dot",
                                                            "width": 1}}]
        chart = h.chart(f"latency-{slug(op)}", traces, layout, height=520 if has_ratio else 400)
        ordered = sorted(rows + bases, key=lambda r: tuple(sort_key(r.get(f)) for f in
                                                           (*SERIES_FIELDS, "tokens")))
        table = h.table(
            ["tp", "transport", "hidden", "variant", "tokens", "median µs", "p99 µs",
             "max-over-ranks µs", "rank spread µs", "baseline", "baseline µs", "ratio",
             "outcome", "latency"],
            [[r.get("tp"), r.get("transport"), r.get("hidden"),
              h.link(details_href(r), h.fmt(r.get("variant"))), r.get("tokens"),
              h.us(r["t_median_us"]), h.us(r.get("t_p99_us")),
              h.us(r.get("t_max_over_ranks_median_us")), h.us(rank_spread_us(r)),
              r.get("baseline"), h.us(r.get("baseline_median_us")), h.ratio(r.get("ratio")),
              h.badge(r["outcome"]), h.status_badge(site.status(r))] for r in ordered],
            numeric=(0, 2, 4, 5, 6, 7, 8, 10, 11), cls="compact")
        sections.append(h.section(h.op_chip(op), chart,
                                  h.tag("details", h.Markup(h.tag("summary", "numbers") + table)),
                                  id=f"op-{slug(op)}"))
    note = ("Solid: this kernel's median; dashed: each baseline timed in the same run (same "
            "colour, one dash pattern per baseline: unfused, symm_mem, flashinfer_oneshot, ...); "
            "lower panel: ratio = median / first baseline (below 1 is faster). Log axes. "
            "Rank spread (numbers): the ranks' own medians apart; large where a graph holds few "
            "calls and the rank that starts a replay first carries the start skew.")
    sub = h.join(["Run ", h.tag("code", run.run_id), f" · {run.trigger} · {h.fmt(run.started_at)}"])
    body = h.join([h.tag("p", note, cls="note"), *sections])
    return {"latency.html": site.page("Latency vs tokens", "latency.html", body, charts=True,
                                      subtitle=sub)}
