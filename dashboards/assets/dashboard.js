// lamport-lab dashboards: renders the embedded chart specs, makes tables
// sortable, and drives the compare page. Data arrives as JSON in
// <script type="application/json"> blocks; text from it is only ever set as
// textContent, never as HTML.
(function () {
  "use strict";
  var PLOT_CONFIG = { displaylogo: false, responsive: true,
                      modeBarButtonsToRemove: ["lasso2d", "select2d"] };

  function readJson(id) {
    var el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  }

  function renderCharts() {
    var charts = document.querySelectorAll("div.chart");
    var done = 0;
    charts.forEach(function (div) {
      var spec = readJson(div.id + "-spec");
      if (!spec) { console.error("chart " + div.id + ": no spec"); return; }
      if (typeof Plotly === "undefined") { console.error("plotly.js did not load"); return; }
      Plotly.newPlot(div, spec.data, spec.layout, PLOT_CONFIG);
      done += 1;
    });
    return done;
  }

  // ---- sortable tables: click a header; numbers sort numerically.
  function cellValue(td) {
    var t = (td.getAttribute("data-sort") || td.textContent).trim();
    var n = parseFloat(t.replace(/[,+%]/g, ""));
    return (t !== "" && !isNaN(n) && /^[-+]?[\d,.]+(e[-+]?\d+)?%?$/i.test(t)) ? n : t.toLowerCase();
  }
  function makeSortable(table) {
    var heads = table.querySelectorAll("thead th");
    heads.forEach(function (th, col) {
      th.addEventListener("click", function () {
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        var asc = !th.classList.contains("sorted-asc");
        heads.forEach(function (h) { h.classList.remove("sorted-asc", "sorted-desc"); });
        th.classList.add(asc ? "sorted-asc" : "sorted-desc");
        rows.sort(function (a, b) {
          var x = cellValue(a.cells[col]), y = cellValue(b.cells[col]);
          if (x === "—") return 1; if (y === "—") return -1;
          if (typeof x === typeof y) return (x < y ? -1 : x > y ? 1 : 0) * (asc ? 1 : -1);
          return typeof x === "number" ? -1 : 1;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  }

  // Log-axis ticks labelled with their values (1, 2, 5 per decade), as
  // dashboards/html.py log_ticks does for the pages built in Python.
  function logTicks(lo, hi) {
    lo = lo / 1.25; hi = hi * 1.25;
    var sets = [[1, 2, 5], [1, 1.5, 2, 3, 4, 5, 6, 7, 8]], vals = [];
    for (var k = 0; k < sets.length && vals.length < 3; k++) {
      vals = [];
      for (var e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) {
        sets[k].forEach(function (m) {
          var t = m * Math.pow(10, e);
          if (t >= lo && t <= hi) vals.push(t);
        });
      }
    }
    return { range: [Math.log10(lo), Math.log10(hi)], tickmode: "array", tickvals: vals,
             ticktext: vals.map(function (t) {
               return t >= 1000 ? Math.round(t).toLocaleString("en-US")
                                : String(Number(t.toPrecision(3)));
             }) };
  }

  // ---- repro commands: a copy button beside each
  function setupCopy() {
    document.querySelectorAll("div.repro button.copy").forEach(function (b) {
      b.addEventListener("click", function () {
        var text = b.parentNode.querySelector("code").textContent;
        var done = function () { b.textContent = "copied"; b.setAttribute("data-copied", "1");
                                 setTimeout(function () { b.textContent = "copy"; }, 1500); };
        if (navigator.clipboard && window.isSecureContext) {
          navigator.clipboard.writeText(text).then(done, function () { fallback(text); done(); });
        } else { fallback(text); done(); }
      });
    });
    function fallback(text) {
      var t = document.createElement("textarea");
      t.value = text; t.setAttribute("readonly", ""); t.style.position = "fixed"; t.style.opacity = "0";
      document.body.appendChild(t); t.select();
      try { document.execCommand("copy"); } catch (e) { /* nothing to copy to */ }
      document.body.removeChild(t);
    }
  }

  // ---- status filters (dashboards/pages/trends.py status_filter): show only
  // the rows of a table whose cell in one of data-cols reads a chosen status.
  function setupFilters() {
    document.querySelectorAll("select.status-filter").forEach(function (sel) {
      var table = document.getElementById(sel.getAttribute("data-table"));
      if (!table) return;
      var cols = sel.getAttribute("data-cols").split(",").map(Number);
      sel.addEventListener("change", function () {
        var wanted = sel.value ? sel.value.split(",") : null;
        Array.prototype.forEach.call(table.tBodies[0].rows, function (tr) {
          var hit = !wanted || cols.some(function (c) {
            var td = tr.cells[c], b = td && td.querySelector(".badge");
            return wanted.indexOf(((b || td || {}).textContent || "").trim()) >= 0;
          });
          tr.style.display = hit ? "" : "none";
        });
      });
    });
  }

  // ---- compare page
  // An environment value; the topology's summary opens onto its JSON.
  function envCell(run, field, text) {
    var td = el("td"), detail = (run.env_detail || {})[field];
    if (!detail) { td.textContent = text; return td; }
    var d = el("details", null, "topology");
    d.appendChild(el("summary", text)); d.appendChild(el("pre", detail, "json"));
    td.appendChild(d);
    return td;
  }
  function el(name, text, cls) {
    var e = document.createElement(name);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  // A value JSON cannot hold (NaN, inf) arrives as its text: shown as it is, never computed with.
  function fmtUs(v) { return v === null || v === undefined ? "—" : typeof v === "string" ? v : (v >= 100 ? v.toFixed(1) : v.toFixed(2)); }
  function num(v) { return typeof v === "number" ? v : null; }
  function fmtNum(v) { return v === null || v === undefined ? "—" : String(v); }
  function badge(outcome) {
    if (!outcome) return el("span", "—");
    return el("span", outcome, "badge o-" + outcome);
  }
  function fill(tbody, rows) {
    while (tbody.firstChild) tbody.removeChild(tbody.firstChild);
    rows.forEach(function (r) { tbody.appendChild(r); });
  }

  function setupCompare(data) {
    var selA = document.getElementById("run-a"), selB = document.getElementById("run-b");
    var only = document.getElementById("only-changed");
    data.runs.forEach(function (run) {
      [selA, selB].forEach(function (sel) {
        var o = el("option", run.label); o.value = run.id; sel.appendChild(o);
      });
    });
    var params = new URLSearchParams(window.location.search);
    var ids = data.runs.map(function (r) { return r.id; });
    selB.value = ids.indexOf(params.get("b")) >= 0 ? params.get("b") : data.default_b;
    selA.value = ids.indexOf(params.get("a")) >= 0 ? params.get("a") : data.default_a;

    function render() {
      var a = selA.value, b = selB.value;
      var runA = data.runs[ids.indexOf(a)], runB = data.runs[ids.indexOf(b)];
      var ra = data.results[a] || {}, rb = data.results[b] || {};
      // counts
      var counts = [];
      data.outcomes.forEach(function (o) {
        var tr = el("tr"); tr.appendChild(el("td", o));
        var x = runA.counts[o] || 0, y = runB.counts[o] || 0;
        tr.appendChild(el("td", x, "num")); tr.appendChild(el("td", y, "num"));
        var d = el("td", (y - x > 0 ? "+" : "") + (y - x), "num");
        if (y !== x) d.className += (o === "pass") === (y > x) ? " better" : " worse";
        tr.appendChild(d); counts.push(tr);
      });
      fill(document.querySelector("#compare-counts tbody"), counts);
      // environment
      var env = [];
      data.env_fields.forEach(function (f) {
        var x = runA.env[f] || "—", y = runB.env[f] || "—";
        var tr = el("tr"); tr.appendChild(el("td", f));
        var ca = envCell(runA, f, x), cb = envCell(runB, f, y);
        if (x !== y) { ca.className = "changed"; cb.className = "changed"; }
        tr.appendChild(ca); tr.appendChild(cb); env.push(tr);
      });
      fill(document.querySelector("#compare-env tbody"), env);
      // cases
      var keys = Object.keys(data.cases).filter(function (k) { return ra[k] || rb[k]; });
      var rows = [];
      keys.forEach(function (k) {
        var x = ra[k] || null, y = rb[k] || null;
        var oa = x && x[0], ob = y && y[0];
        var ma = x && x[1], mb = y && y[1];
        var delta = (num(ma) && num(mb)) ? (mb - ma) / ma : null;
        var changed = oa !== ob || (delta !== null && Math.abs(delta) > data.changed_fraction);
        rows.push({ k: k, oa: oa, ob: ob, ma: ma, mb: mb, delta: delta, changed: changed,
                    ua: x && x[2], ub: y && y[2], sb: y && y[3] });
      });
      rows.sort(function (p, q) {
        var sp = (p.oa !== p.ob) ? 2 : p.changed ? 1 : 0, sq = (q.oa !== q.ob) ? 2 : q.changed ? 1 : 0;
        if (sp !== sq) return sq - sp;
        return Math.abs(q.delta || 0) - Math.abs(p.delta || 0);
      });
      var shown = rows.filter(function (r) { return !only.checked || r.changed; });
      var trs = shown.map(function (r) {
        var c = data.cases[r.k], tr = el("tr");
        var op = el("td"); var chip = el("span", null, "op");
        var dot = el("span", null, "dot"); dot.style.background = data.colours[c.op] || "#888";
        chip.appendChild(dot); chip.appendChild(document.createTextNode(c.op)); op.appendChild(chip);
        tr.appendChild(op); tr.appendChild(el("td", c.label));
        var ta = el("td"); ta.appendChild(badge(r.oa)); tr.appendChild(ta);
        var tb = el("td"); tb.appendChild(badge(r.ob)); tr.appendChild(tb);
        tr.appendChild(el("td", fmtUs(r.ma), "num")); tr.appendChild(el("td", fmtUs(r.mb), "num"));
        var d = el("td", r.delta === null ? "—" : (r.delta > 0 ? "+" : "") + (100 * r.delta).toFixed(1) + "%", "num");
        if (r.delta !== null && Math.abs(r.delta) > data.changed_fraction) d.className += r.delta > 0 ? " worse" : " better";
        tr.appendChild(d);
        tr.appendChild(el("td", fmtNum(r.ua), "num")); tr.appendChild(el("td", fmtNum(r.ub), "num"));
        var st = el("td"); if (r.sb) st.appendChild(el("span", r.sb, "badge s-" + r.sb)); tr.appendChild(st);
        if (r.oa !== r.ob) tr.className = "changed-row";
        return tr;
      });
      fill(document.querySelector("#compare-cases tbody"), trs);
      document.getElementById("compare-summary").textContent =
        shown.length + " of " + rows.length + " cases shown; " +
        rows.filter(function (r) { return r.oa !== r.ob; }).length + " changed outcome, " +
        rows.filter(function (r) { return r.delta !== null && Math.abs(r.delta) > data.changed_fraction; }).length +
        " moved more than " + (100 * data.changed_fraction).toFixed(0) + "% in median latency.";
      document.body.setAttribute("data-compare-rows", String(shown.length));
      // scatter of timed cases present in both
      var div = document.getElementById("compare-scatter");
      var byOp = {}, lo = Infinity, hi = 0;
      rows.forEach(function (r) {
        if (!(num(r.ma) && num(r.mb))) return;
        var op = data.cases[r.k].op;
        (byOp[op] = byOp[op] || { x: [], y: [], text: [] });
        byOp[op].x.push(r.ma); byOp[op].y.push(r.mb); byOp[op].text.push(data.cases[r.k].label_html);
        lo = Math.min(lo, r.ma, r.mb); hi = Math.max(hi, r.ma, r.mb);
      });
      var traces = Object.keys(byOp).sort().map(function (op) {
        return { type: "scatter", mode: "markers", name: data.cases_op_html[op] || op,
                 x: byOp[op].x, y: byOp[op].y, text: byOp[op].text,
                 marker: { color: data.colours[op] || "#888", size: 8 },
                 hovertemplate: "%{text}<br>A %{x:.2f} µs → B %{y:.2f} µs<extra></extra>" };
      });
      var note = document.getElementById("compare-scatter-none");
      if (traces.length && typeof Plotly !== "undefined") {
        traces.push({ type: "scatter", mode: "lines", name: "same latency", x: [lo, hi], y: [lo, hi],
                      line: { color: "#999", dash: "dash", width: 1 }, hoverinfo: "skip" });
        div.style.display = ""; note.style.display = "none";
        Plotly.react(div, traces, {
          height: 420, margin: { l: 70, r: 20, t: 20, b: 50 }, hovermode: "closest",
          xaxis: Object.assign({ title: { text: "run A median (µs)" }, type: "log",
                                 gridcolor: "#eceff1" }, logTicks(lo, hi)),
          yaxis: Object.assign({ title: { text: "run B median (µs)" }, type: "log",
                                 gridcolor: "#eceff1" }, logTicks(lo, hi)),
          legend: { orientation: "h", y: -0.18 }, paper_bgcolor: "#fff", plot_bgcolor: "#fff"
        }, PLOT_CONFIG);
      } else {
        if (div.data) Plotly.purge(div);
        div.style.display = "none"; note.style.display = "";
      }
      var url = new URL(window.location.href);
      url.searchParams.set("a", a); url.searchParams.set("b", b);
      try { window.history.replaceState(null, "", url.toString()); } catch (e) { /* file:// in some browsers */ }
    }
    [selA, selB, only].forEach(function (s) { s.addEventListener("change", render); });
    render();
  }

  function init() {
    var n = renderCharts();
    document.querySelectorAll("table.sortable").forEach(makeSortable);
    setupCopy();
    setupFilters();
    var compare = readJson("compare-data");
    if (compare) setupCompare(compare);
    document.body.setAttribute("data-charts-rendered", String(n));
    document.body.setAttribute("data-ready", "1");
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
