"""The dashboards' static site, checked in Python: pages, counts, links,
chart specs, escaping, empty and partial datasets, the regression rule,
the CLI and the loopback server. The browser test is test_dashboards_browser.py."""

from __future__ import annotations

import datetime as dt
import html as htmllib
import json
import re
import threading
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pyarrow.compute as pc
import pytest

from dashboards import palette
from dashboards.__main__ import main as cli
from dashboards.build import build_site
from dashboards.model import CASE_FIELDS
from dashboards.regression import Rule, verdict
from dashboards.serve import make_server, serve
from jobs.results import ResultsWriter, read_results
from tests import dashboards_sample as sample

TOP_PAGES = ("index.html", "trends.html", "latency.html", "correctness.html", "faults.html",
             "stragglers.html", "environment.html", "compare.html")
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}


class Node:
    def __init__(self, tag, attrs, parent=None):
        self.tag, self.attrs, self.parent, self.children, self.parts = tag, attrs, parent, [], []

    @property
    def text(self) -> str:
        return "".join(p if isinstance(p, str) else p.text for p in self.parts)

    def iter(self):
        yield self
        for c in self.children:
            yield from c.iter()

    def find_all(self, tag=None, cls=None, **attrs):
        out = []
        for n in self.iter():
            if tag and n.tag != tag:
                continue
            if cls and cls not in (n.attrs.get("class") or "").split():
                continue
            if any(n.attrs.get(k.replace("_", "-")) != v for k, v in attrs.items()):
                continue
            out.append(n)
        return out

    def find(self, tag=None, cls=None, **attrs):
        found = self.find_all(tag, cls, **attrs)
        assert found, f"no <{tag} class={cls} {attrs}>"
        return found[0]


class _Parser(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = self.cur = Node("#root", {})

    def handle_starttag(self, tag, attrs):
        node = Node(tag, dict(attrs), self.cur)
        self.cur.children.append(node)
        self.cur.parts.append(node)
        if tag not in VOID:
            self.cur = node

    def handle_endtag(self, tag):
        n = self.cur
        while n is not None and n.tag != tag:
            n = n.parent
        if n is not None and n.parent is not None:
            self.cur = n.parent

    def handle_data(self, data):
        self.cur.parts.append(data)


def parse(path: Path) -> Node:
    p = _Parser()
    p.feed(path.read_text(encoding="utf-8"))
    return p.root


def chart_specs(doc: Node) -> dict[str, dict]:
    return {n.attrs["id"][:-5]: json.loads(n.text) for n in doc.find_all("script")
            if n.attrs.get("type") == "application/json" and n.attrs["id"].endswith("-spec")}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("results")
    sample.write_sample(root)
    return root


@pytest.fixture(scope="module")
def site(dataset, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    index = build_site(dataset, out)
    assert index == out / "index.html"
    return out


def latest_table(dataset: Path):
    runs = read_results(dataset, columns=["run_id", "started_at"])
    latest = runs["run_id"][pc.index(runs["started_at"], pc.max(runs["started_at"])).as_py()]
    return read_results(dataset, filters={"run_id": latest.as_py()})


def test_site_has_every_page_and_bundles_plotly_once(site):
    names = {p.name for p in site.glob("*.html")}
    assert set(TOP_PAGES) <= names
    assert {"details-all_reduce_norm.html", "details-finalize_publish.html",
            "trends-all_reduce_norm.html", "trends-finalize_publish.html"} <= names
    assert sorted(p.name for p in (site / "assets").iterdir()) == [
        "dashboard.css", "dashboard.js", "plotly.min.js"]
    assert (site / "assets" / "plotly.min.js").stat().st_size > 1_000_000
    for page in site.glob("*.html"):
        text = page.read_text()
        srcs = re.findall(r'(?:src|href)="([^"]*)"', text)
        assert not [s for s in srcs if re.match(r"(https?:)?//", s)], page.name  # no CDN
        doc = parse(page)
        nav = [a.attrs["href"] for a in doc.find("nav").find_all("a")]
        assert nav == list(TOP_PAGES)
        if doc.find_all("div", cls="chart"):
            assert 'src="assets/plotly.min.js"' in text, page.name


def test_overview_counts_equal_the_dataset(site, dataset):
    latest = latest_table(dataset)
    outcomes = {c["values"]: c["counts"] for c in pc.value_counts(latest["outcome"]).to_pylist()}
    assert outcomes == {"pass": 28, "fail": 1, "hang": 1, "skipped": 1}  # the sample's design
    doc = parse(site / "index.html")
    cards = {n.attrs["data-count"]: int(n.find("div", cls="value").text)
             for n in doc.find_all("div", cls="card")}
    assert cards == {"cases": latest.num_rows, "passed": outcomes["pass"],
                     "failed": outcomes["fail"], "hung": outcomes["hang"], "errors": 0,
                     "regressed": 1, "skipped": outcomes["skipped"], "improved": 0,
                     "no history yet": 0}
    by_op = doc.find("table", id="by-op")
    for tr in by_op.find("tbody").find_all("tr"):
        op = tr.find("a", cls="op").text
        rows = latest.filter(pc.field("op") == op)
        got = {s.attrs["data-k"]: int(s.text) for s in tr.find_all("span")
               if "data-k" in s.attrs}
        for outcome in ("pass", "fail", "hang", "error", "skipped"):
            assert got[outcome] == (pc.sum(pc.equal(rows["outcome"], outcome)).as_py() or 0)
    attention = doc.find("table", id="attention").find("tbody").find_all("tr")
    assert sorted(tr.find("span", cls="badge").text for tr in attention) == [
        "fail", "hang", "regressed"]
    skipped = doc.find("table", id="skipped").find("tbody").find_all("tr")
    assert [td.text for td in skipped[0].find_all("td")][3] == "needs 16 GPUs, 8 present"
    runs = doc.find("table", id="runs").find("tbody").find_all("tr")
    assert len(runs) == sample.RUNS


def test_overview_shows_where_the_latest_run_s_time_went(site):
    """The run manifest's accounting (one entry per job section, a run in
    parts listing a job once per part): bars of timed work and the rest,
    and the table behind them."""
    doc = parse(site / "index.html")
    rows = [[td.text.strip() for td in tr.find_all("td")]
            for tr in doc.find("table", id="time").find("tbody").find_all("tr")]
    assert [r[0] for r in rows] == ["correctness", "faults", "correctness (2)",
                                    "profile, interrupted"]
    assert rows[0][1:6] == ["576", "168.0", "12.55", "summed kernel call time", "13.4×"]
    assert rows[1][9] == "18 (204.6 s)" and rows[0][9] == "—"
    assert rows[1][6] == "96.3" and rows[0][6] == "—"  # group builds
    assert rows[1][7] == "41.5" and rows[0][7] == "—"  # kernel preparation
    assert rows[0][10] == ("inputs 21.4 s, load 3.0 s, call 14.1 s, readback 6.0 s, "
                           "check 40.2 s") and rows[1][10] == "—"
    spec = chart_specs(doc)["overview-time"]
    work, rest = spec["data"]
    assert work["x"] == [e["work_s"] for e in sample.ACCOUNTING]
    assert rest["x"] == [round(e["wall_s"] - e["work_s"], 3) for e in sample.ACCOUNTING]


def test_every_registered_op_is_named_on_the_correctness_page(site):
    """The sample holds all_reduce_norm and finalize_publish rows; the other
    registered ops (cluster.ops) are named as absent from the run."""
    doc = parse(site / "correctness.html")
    text = " ".join(doc.text.split())
    assert ("registered ops the run did not check: all_reduce_mhc, embed_norm, indexer"
            in text)


def test_correctness_matrix_cells_link_to_their_detail_rows(site):
    doc = parse(site / "correctness.html")
    matrix = doc.find("table", cls="matrix", data_op="all_reduce_norm")
    cells = matrix.find_all("td", cls="cell")
    filled = [c for c in cells if "empty" not in c.attrs["class"]]
    # 18 timed cases + the skipped tp=16 cell; the fault rows (tp=8 multicast
    # tokens=32) and the baseline's profile rows are not correctness rows.
    assert len(filled) == 19
    assert sorted(c.attrs["data-outcome"] for c in filled if c.attrs["data-outcome"] != "pass") \
        == ["fail", "skipped"]
    assert int(sum(int(c.attrs["data-cases"]) for c in filled)) == 19
    details = parse(site / "details-all_reduce_norm.html")
    row_ids = {tr.attrs.get("id") for tr in details.find_all("tr")}
    for cell in filled:
        page, anchor = cell.find("a").attrs["href"].split("#")
        assert page == "details-all_reduce_norm.html" and anchor in row_ids
        row = details.find("tr", id=anchor)
        assert row.find("span", cls="badge").text == cell.attrs["data-outcome"]
    fail = next(c for c in filled if c.attrs["data-outcome"] == "fail")
    row = details.find("tr", id=fail.find("a").attrs["href"].split("#")[1])
    texts = [td.text for td in row.find_all("td")]
    assert "3" in texts and "17" in texts  # max ULP, mismatches


def test_trends_mark_the_regression(site):
    doc = parse(site / "trends.html")
    statuses = [tr.find("span", cls="badge").text
                for tr in doc.find("table", id="trend-cases").find("tbody").find_all("tr")]
    # the kernel case and the slower baseline row; only the kernel counts on the overview
    assert statuses[:2] == ["regressed"] * 2 and statuses.count("regressed") == 2
    assert len(statuses) == 22 + sample.BASELINE_ROWS
    specs = chart_specs(parse(site / "trends-all_reduce_norm.html"))
    assert len(specs) == 18 + sample.BASELINE_ROWS
    cp = ("segment mean", "step")
    shapes = sorted(tuple((t["name"], len(t["x"])) for t in s["data"] if t["name"] not in cp)
                    for s in specs.values())
    regressed = [s for s in shapes if s[-1][0] == "regressed"]
    assert sorted(regressed) == [
        (("median", 6), ("p99", 6), ("baseline: nccl+torch", 6), ("regressed", 1)),
        (("median", 6), ("p99", 6), ("regressed", 1))]
    failed = [s for s in shapes if s[0] == ("median", 5)]  # no timing in the latest run
    assert len(failed) == 1
    median = next(s for s in specs.values()
                  if any(t["name"] == "regressed" for t in s["data"]))["data"][0]
    assert median["line"]["color"] == palette.op_colour("all_reduce_norm")
    # change points: every chart draws its history's segments, first night to last; the
    # one-night slowdown of the latest run is no step (a step needs two nights)
    for spec in specs.values():
        segs = [t for t in spec["data"] if t["name"] == "segment mean"]
        nights = sorted({x for t in spec["data"] if t["name"] == "median" for x in t["x"]})
        assert segs and segs[0]["x"][0] == nights[0] and segs[-1]["x"][-1] == nights[-1]
        assert not [t for t in spec["data"] if t["name"] == "step"]
    assert doc.find("select", cls="status-filter").attrs["data-table"] == "trend-cases"


def test_latency_series_per_tp_and_transport_with_baselines_and_ratio(site):
    specs = chart_specs(parse(site / "latency.html"))
    ar, fp = specs["latency-all_reduce_norm"]["data"], specs["latency-finalize_publish"]["data"]
    assert len(ar) == 6 * 3 and len(fp) == 2 * 3  # latency, baseline, ratio per series
    assert sorted(len(t["x"]) for t in ar) == [2] * 3 + [3] * 15  # tp=8 multicast lost tokens=128
    assert {t["yaxis"] for t in ar} == {"y", "y2"}
    first = ar[0]
    assert first["line"]["color"] == palette.op_colour("all_reduce_norm")
    assert fp[0]["line"]["color"] == palette.op_colour("finalize_publish")


def test_latency_numbers_show_how_far_the_ranks_medians_are_apart(site):
    from dashboards.model import extra_of, rank_spread_us
    assert "rank spread µs" in (site / "latency.html").read_text()
    assert rank_spread_us({"extra": json.dumps({"rank_median_us": [8.57, 7.08]})}) \
        == pytest.approx(1.49)
    assert rank_spread_us({"extra": json.dumps({"rank_median_us": [3.1]})}) is None
    assert rank_spread_us({"extra": None}) is None
    assert extra_of({"extra": "not json"}) == {} and extra_of({"extra": "[1]"}) == {}


def test_faults_page_shows_diagnosis(site):
    doc = parse(site / "faults.html")
    faults = doc.find_all("div", cls="fault")
    assert sorted((f.attrs["data-kind"], f.attrs["data-outcome"]) for f in faults) == [
        ("corrupt_flag", "pass"), ("kill_rank", "hang")]
    assert faults[0].attrs["data-kind"] == "kill_rank"  # problems first
    text = " ".join(faults[0].text.split())
    assert "missing ranks 3 · token 5 · fragment 2 · stage 1" in text
    assert "rank 3 never published generation 1" in text
    assert "python -m jobs faults --kind kill_rank --tp 8" in text
    summary = doc.find("table", id="fault-summary").find("tbody").find_all("tr")
    assert [[td.text for td in tr.find_all("td")] for tr in summary] == [
        ["corrupt_flag", "all_reduce_norm", "1", "1", "0", "0", "1"],
        ["kill_rank", "all_reduce_norm", "1", "0", "1", "1", "1"]]
    note = " ".join(doc.find("section").text.split())
    assert ("Collective ops with no fault row in these runs: all_reduce_mhc, embed_norm, "
            "finalize_publish.") in note


def test_every_relative_link_resolves(site):
    ids = {p.name: {n.attrs["id"] for n in parse(p).iter() if "id" in n.attrs}
           for p in site.glob("*.html")}
    checked = 0
    for page in site.glob("*.html"):
        for a in parse(page).find_all("a"):
            href = a.attrs.get("href", "")
            target, _, anchor = href.partition("#")
            target = target.split("?")[0] or page.name
            assert target in ids, f"{page.name}: broken link {href}"
            assert not anchor or anchor in ids[target], f"{page.name}: no #{anchor} in {target}"
            checked += 1
    assert checked > 100


def test_environment_flags_the_driver_change(site):
    doc = parse(site / "environment.html")
    rows = doc.find("table", id="environment").find("tbody").find_all("tr")
    assert len(rows) == sample.RUNS
    changed = [s.text for s in rows[0].find_all("span", cls="changed-value")]
    assert changed == ["580.95"]
    assert not rows[1].find_all("span", cls="changed-value")


def test_text_from_the_data_is_escaped(site):
    for page in site.glob("*.html"):
        text = page.read_text()
        assert sample.INJECT not in text and sample.SCRIPT not in text, page.name
        assert "<img" not in text and text.count("<script") == text.count("</script>")
        # and our own markup is never escaped twice
        assert not re.search(r"&lt;/?(strong|span|a|code|td|div|p)[ &]", text), page.name
    details = (site / "details-finalize_publish.html").read_text()
    assert htmllib.escape(sample.INJECT) in details


def test_compare_data_embeds_every_run(site):
    doc = parse(site / "compare.html")
    data = json.loads(doc.find("script", id="compare-data").text)
    assert len(data["runs"]) == sample.RUNS
    assert data["default_b"].endswith("run5") and data["default_a"].endswith("run4")
    assert data["colours"]["all_reduce_norm"] == palette.op_colour("all_reduce_norm")


def test_empty_dataset_says_no_data(tmp_path):
    (tmp_path / "results").mkdir()
    index = build_site(tmp_path / "results", tmp_path / "site")
    for name in TOP_PAGES:
        doc = parse(tmp_path / "site" / name)
        assert doc.find("p", cls="no-data").find("strong").text == "No data.", name
    assert index.is_file()


def test_partial_dataset_without_timings_or_faults(tmp_path):
    """Like the smoke job's rows: no tokens, no timings, no faults, no GPU."""
    writer = ResultsWriter(tmp_path / "r", suite="smoke", trigger="adhoc")
    now = dt.datetime.now(dt.timezone.utc)
    writer.append([dict(started_at=now, op="all_reduce_norm", variant="consumer", backend="compile",
                        transport=t, tp=tp, outcome="pass", extra={"arch": "sm_90a"})
                   for t in ("unicast", "multicast") for tp in (1, 8)]
                  + [dict(started_at=now, op="indexer", backend="cpu-reference", outcome="error",
                          reason="ValueError: boom", max_ulp=None)])
    build_site(tmp_path / "r", tmp_path / "site")
    site = tmp_path / "site"
    for name in ("trends.html", "latency.html", "faults.html"):
        assert "No data." in (site / name).read_text(), name
    doc = parse(site / "correctness.html")  # compile and self-check rows: no matrix
    assert not doc.find_all("td", cls="cell")
    assert "no correctness rows in the latest run" in (site / "correctness.html").read_text()
    details = parse(site / "details-all_reduce_norm.html").find("table", id="details")
    assert len(details.find("tbody").find_all("tr")) == 4
    cards = {n.attrs["data-count"]: n.find("div", cls="value").text
             for n in parse(site / "index.html").find_all("div", cls="card")}
    assert cards["cases"] == "5" and cards["errors"] == "1"


def test_rebuild_replaces_the_site_but_not_a_foreign_folder(site, dataset, tmp_path):
    out = tmp_path / "s"
    build_site(dataset, out)
    (out / "stale.html").write_text("old")
    build_site(dataset, out)
    assert not (out / "stale.html").exists()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError):
        build_site(dataset, foreign)
    assert (foreign / "keep.txt").exists()
    # an index.html alone does not make a folder a site built here
    (foreign / "index.html").write_text("<p>mine</p>")
    with pytest.raises(FileExistsError, match="marker"):
        build_site(dataset, foreign)
    assert sorted(p.name for p in foreign.iterdir()) == ["index.html", "keep.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert build_site(dataset, empty).is_file()


def test_cli_build_refuses_a_foreign_directory(tmp_path, dataset, capsys):
    foreign = tmp_path / "docs"
    foreign.mkdir()
    (foreign / "index.html").write_text("x")
    (foreign / "notes.md").write_text("y")
    assert cli(["build", "--results", str(dataset), "--out", str(foreign)]) == 2
    assert "refusing to replace" in capsys.readouterr().err
    assert (foreign / "notes.md").read_text() == "y"


def test_cli_build_and_bad_results(tmp_path, dataset, capsys):
    assert cli(["build", "--results", str(dataset), "--out", str(tmp_path / "s")]) == 0
    assert (tmp_path / "s" / "index.html").is_file()
    assert cli(["build", "--results", str(tmp_path / "nope"), "--out", str(tmp_path / "t")]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_regression_rule_is_the_jobs_rule():
    import jobs.regression
    assert CASE_FIELDS == jobs.regression.KEY  # one case identity for jobs and pages
    history = [10.0, 10.1, 9.9, 10.0, 10.05]
    assert verdict(13.0, history).status == "regressed"
    assert verdict(10.4, history).status == "ok"  # < 5 % worse
    assert verdict(7.0, history).status == "improved"
    assert verdict(13.0, history[:4]).status == "insufficient-history"
    assert verdict(None, history).status == "no-timing"
    noisy = [10.0, 14.0, 6.0, 12.0, 8.0]  # stdev ~3.2: 13 is not 5 sigma out
    assert verdict(13.0, noisy).status == "ok"
    flat = [10.0] * 5  # stdev 0: the 5 % bound decides
    assert verdict(10.4, flat).status == "ok"
    v = verdict(10.6, flat)
    assert v.status == "regressed" and v.threshold == pytest.approx(10.5)
    window = [100.0] * 20 + history  # only the last `history` results count
    assert verdict(13.0, window, Rule(history=5)).status == "regressed"


def test_serve_is_loopback_only_and_bounded(site):
    urls: list[str] = []
    ready = threading.Event()
    thread = threading.Thread(
        target=serve, args=(site, 0, 1.5),
        kwargs={"on_ready": lambda url: (urls.append(url), ready.set())}, daemon=True)
    thread.start()
    assert ready.wait(10)
    assert urls[0].startswith("http://127.0.0.1:")
    with urllib.request.urlopen(urls[0] + "index.html", timeout=5) as response:
        assert b"Overview" in response.read()
    thread.join(15)
    assert not thread.is_alive(), "serve() did not stop after its time limit"
    with pytest.raises(FileNotFoundError, match="index.html"):
        make_server(site.parent / "missing", 0)


@pytest.mark.parametrize("argv, named", [
    (["--seconds", "inf"], "--seconds must be in (0, 604800] s, got inf"),
    (["--seconds", "nan"], "got nan"),
    (["--seconds", "0"], "got 0.0"),
    (["--seconds", "1e9"], "got 1000000000.0"),
    (["--port", "70000"], "--port must be an integer in 0..65535, got 70000"),
    (["--port", "-1"], "got -1"),
])
def test_serve_refuses_an_unbounded_look_before_building(argv, named, tmp_path, capsys):
    from dashboards.__main__ import main
    missing = tmp_path / "no-results"  # a build would fail differently, and later
    assert main(["serve", "--site", str(tmp_path / "site"), "--results", str(missing),
                 *argv]) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "site").exists()


def test_latency_draws_every_baseline_row_of_a_series():
    """Each baseline the profile timed (its own ``baseline:<impl>`` row) is a
    dashed trace of its series, one dash pattern each; rows of another
    series (here tp=4) are not drawn there."""
    from dashboards.pages.latency import latency_traces
    case = dict(op="all_reduce_norm", tp=2, transport="unicast", placement="process-per-gpu",
                hidden=7168, dtype="bfloat16", top_k=None, hc=None, backend="gpu")
    fused = [dict(case, variant="watchdog", tokens=m, t_median_us=3.0 + m, ratio=0.3)
             for m in (1, 8)]
    bases = [dict(case, variant=f"baseline:{impl}", tokens=m, t_median_us=t + m)
             for impl, t in (("unfused", 10.0), ("symm_mem", 8.0), ("flashinfer_oneshot", 4.0))
             for m in (1, 8)] + [dict(case, tp=4, variant="baseline:unfused", tokens=1,
                                      t_median_us=99.0)]
    traces = latency_traces("all_reduce_norm", fused, bases)
    dashed = [t for t in traces if t["line"].get("dash")]
    assert [t["name"].split(" · ")[1] for t in dashed] == ["flashinfer_oneshot", "symm_mem",
                                                           "unfused"]
    assert len({t["line"]["dash"] for t in dashed}) == 3
    assert [t["y"] for t in dashed] == [[5.0, 12.0], [9.0, 16.0], [11.0, 18.0]]
    assert len(traces) == 1 + 3 + 1  # latency, three baselines, ratio


def test_topology_reads_as_a_summary_with_its_json_folded(site):
    for page, table_id in (("index.html", "by-topology"), ("environment.html", "environment")):
        details = parse(site / page).find("table", id=table_id).find_all("details", cls="topology")
        assert details, page
        for d in details:
            assert d.find("summary").text == sample.TOPOLOGY_BRIEF
            assert json.loads(d.find("pre", cls="json").text)["gpu_count"] == 8
    data = json.loads(parse(site / "compare.html").find("script", id="compare-data").text)
    assert {r["env"]["topology"] for r in data["runs"]} == {sample.TOPOLOGY_BRIEF}
    assert all(json.loads(r["env_detail"]["topology"])["gpu_count"] == 8 for r in data["runs"])


def test_details_rows_wrap_reasons_and_copy_repro_commands(site):
    doc = parse(site / "details-all_reduce_norm.html")
    table = doc.find("table", id="details")
    assert "details" in table.attrs["class"]
    fail = next(tr for tr in table.find("tbody").find_all("tr")
                if tr.find("span", cls="badge").text == "fail")
    assert fail.find("div", cls="reason").text.startswith("17 elements beyond 1 ULP")
    repro = fail.find("div", cls="repro")
    assert repro.find("code").text.startswith("python -m jobs correctness")
    assert repro.find("button", cls="copy").text == "copy"


def test_log_ticks_label_every_tick_with_its_value():
    from dashboards.html import log_ticks
    ticks = log_ticks([12.0, 180.0])
    assert ticks["tickvals"] == [10, 20, 50, 100, 200]
    assert ticks["ticktext"] == ["10", "20", "50", "100", "200"]
    # Less than a decade: finer steps, every one inside the axis range.
    narrow = log_ticks([3.2, 10.5])
    assert narrow["ticktext"] == ["3", "4", "5", "6", "7", "8", "10"]
    assert all(10 ** narrow["range"][0] <= v <= 10 ** narrow["range"][1]
               for v in narrow["tickvals"])
    assert log_ticks([0.3, 0.9, 1500])["ticktext"] == ["0.5", "1", "2", "5", "10", "20", "50",
                                                       "100", "200", "500", "1,000"]
    assert log_ticks([]) == {}


def test_a_failed_build_in_a_job_names_its_error_on_the_headline(tmp_path, monkeypatch, capsys):
    """The nightly's dashboard line, read where only the headline is kept (a
    GPU machine's part summary), names the exception, not a traceback frame."""
    import argparse
    import subprocess

    from jobs import __main__ as jobs_cli

    traceback = ('Traceback (most recent call last):\n  File "dashboards/build.py", line 36,'
                 ' in plotly_js\n    import plotly\nModuleNotFoundError: No module named \'plotly\'')
    monkeypatch.setattr(jobs_cli.subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(
        argv, 1, stdout="", stderr=traceback))
    args = argparse.Namespace(no_results=False, no_dashboard=False, results=tmp_path / "r",
                              site=tmp_path / "site")
    assert jobs_cli._dashboard_part(args) == 1
    headline, *rest = capsys.readouterr().out.splitlines()
    assert headline.startswith("dashboard: FAILED to build")
    assert headline.endswith("exit 1): ModuleNotFoundError: No module named 'plotly'")
    assert rest[-1] == "ModuleNotFoundError: No module named 'plotly'"


def _adhoc_trace_run(root: Path, trace: Path, when: dt.datetime) -> None:
    trace.parent.mkdir(exist_ok=True)
    trace.write_text('{"traceEvents": []}')
    ResultsWriter(root, suite="smoke", run_id="adhoc-trace", trigger="adhoc").append(
        [dict(op="all_reduce_norm", tp=2, hidden=1024, tokens=t, job="correctness",
              backend="emulated", placement="emulated", outcome="pass", started_at=when,
              extra={"trace_path": str(trace)}) for t in (1, 3)])


def test_latest_run_is_the_latest_nightly_and_every_trace_stays_linked(tmp_path):
    """An ad-hoc ``jobs trace`` after the last nightly is listed with the
    ad-hoc runs, not as the latest run; its trace stays linked from the
    op's details page (and copied into the site) after later runs. With no
    nightly run at all, the latest run of any trigger is the latest."""
    root = tmp_path / "results"
    run_ids = sample.write_sample(root)
    trace = tmp_path / "traces" / "adhoc-all_reduce_norm-tp2.json"
    later = sample.DAY0 + dt.timedelta(days=sample.RUNS + 1)
    _adhoc_trace_run(root, trace, later)
    site = build_site(root, tmp_path / "site").parent
    index = parse(site / "index.html")
    latest = index.find("section", id="latest-run")
    assert latest.find("h2").text == "Latest nightly run" and run_ids[-1] in latest.text
    nightly = [c.text for c in index.find("table", id="runs").find_all("code")]
    other = [c.text for c in index.find("table", id="other-runs").find_all("code")]
    assert nightly == run_ids[::-1] and other == ["adhoc-trace"]
    details = parse(site / "details-all_reduce_norm.html")
    (link,) = [a for a in details.find("table", id="traces").find_all("a")
               if a.attrs["href"].startswith("traces/")]
    assert link.attrs["href"] == f"traces/{trace.name}"
    assert (site / link.attrs["href"]).read_text() == trace.read_text()

    alone = tmp_path / "adhoc-only"
    _adhoc_trace_run(alone, trace, later)
    index = parse(build_site(alone, tmp_path / "site2"))
    latest = index.find("section", id="latest-run")
    assert latest.find("h2").text.startswith("Latest run (no nightly run yet")
    assert "adhoc-trace" in latest.text
