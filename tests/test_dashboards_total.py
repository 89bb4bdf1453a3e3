"""Every page builds from every value a results row can hold (issue 64).

A Hypothesis property: result tables generated column by column from
``jobs.results.schema.COLUMNS`` (NaN, plus and minus infinity, the largest
and the smallest floats, the int32/int64 bounds, nulls in every column,
text that looks like HTML, ``extra`` JSON holding non-finite numbers,
topology text that is not a topology), written with the real store
(``ResultsWriter``, run manifests through ``jobs.results.runs``), some files
rewritten as an older schema version that lacks columns; then the whole
site is built from them with ``build_site`` and every page is checked:
it exists, its tags balance, no page is an error page, each embedded JSON
spec is strict JSON (no NaN or Infinity), and the latest run's ``max_ulp``
values are shown on their op's details page.

``TALLY`` counts the tables each page was built from (printed at the end;
docs/results/dashboards_total_cpu_2026-12-07.md records it).
"""

from __future__ import annotations

import datetime as dt
import html
import json
import math
import os
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dashboards import html as h
from dashboards.build import build_site
from dashboards.model import slug
from jobs.results import COLUMNS, OUTCOMES, TRIGGERS, BACKENDS, JOBS, ResultsWriter, runs
from jobs.results.schema import SCHEMA_VERSION_KEY
from jobs.results.store import FILE_SCHEMA
from tests import dashboards_sample as sample

TOP_PAGES = tuple(name for name, _ in h.NAV)
EXAMPLES = 40
"""Tables per property (each builds every page): bounded for CI."""
TALLY: Counter = Counter()
"""Per page: the tables it was built from, and how many of them it showed data for."""

SPECIAL_FLOATS = (math.nan, math.inf, -math.inf, 1e308, -1e308, 1.7976931348623157e308,
                  5e-324, -5e-324, 0.0, -0.0, 1e15, 0.5, 3.0)
SPECIAL_INTS32 = (0, -1, 1, 2**31 - 1, -2**31)
SPECIAL_INTS64 = (0, -1, 2**63 - 1, -2**63)
TEXTS = ("", sample.INJECT, sample.SCRIPT, "a|b", "line\nbreak", "日本語", "nan", "inf",
         "baseline:", "x" * 300)
TOPOLOGIES = (sample.ENV["topology"], "{}", "[]", '{"nodes": 5}', '{"nodes": [{"gpus": "x"}]}',
              "not json", "null", "1e999")
OPS = ("all_reduce_norm", "finalize_publish", "indexer")
RUN_IDS = ("r1", "r2", "r3")
SUITES = ("smoke", "s-2")


def nullable(strategy):
    return st.one_of(st.none(), strategy)


floats = nullable(st.one_of(st.sampled_from(SPECIAL_FLOATS), st.floats()))
chars = st.characters(exclude_categories=("Cs",))
"""Every character UTF-8 can hold (all but surrogates), the default
alphabet's set; given explicitly, so Hypothesis does not derive it by
encoding all 1.1M code points (``codec="utf-8"``: 2 s of CPU in a checkout
where it has not cached that yet, as in CI's)."""
texts = nullable(st.one_of(st.sampled_from(TEXTS), st.text(chars, max_size=12)))
aware = st.datetimes(min_value=dt.datetime(1971, 1, 2), max_value=dt.datetime(2200, 1, 1),
                     timezones=st.just(dt.timezone.utc))
extra_values = st.one_of(floats, texts, st.booleans(), st.lists(st.one_of(floats, texts), max_size=4),
                         st.lists(st.lists(floats, max_size=4), max_size=3),
                         st.dictionaries(st.text(chars, max_size=3), floats, max_size=2))
extras = nullable(st.fixed_dictionaries({}, optional={
    "rank_median_us": st.one_of(st.lists(floats, max_size=4), extra_values),
    "publish_offsets_us_by_call": st.one_of(
        st.lists(st.lists(floats, min_size=2, max_size=4), min_size=1, max_size=3), extra_values),
    **{key: extra_values for key in ("trace_path", "call_outcome", "collective", "job",
                                     "finalize", "heads", "x")}}))

BY_TYPE = {
    pa.float64(): floats,
    pa.int32(): nullable(st.one_of(st.sampled_from(SPECIAL_INTS32),
                                   st.integers(-2**31, 2**31 - 1))),
    pa.int64(): nullable(st.one_of(st.sampled_from(SPECIAL_INTS64),
                                   st.integers(-2**63, 2**63 - 1))),
    pa.string(): texts,
    pa.bool_(): nullable(st.booleans()),
    pa.list_(pa.float64()): nullable(st.lists(floats, max_size=5)),
    pa.list_(pa.int32()): nullable(st.lists(st.integers(-2**31, 2**31 - 1), max_size=5)),
    pa.timestamp("us", tz="UTC"): nullable(aware),
}
SPECIAL = {
    "run_id": st.sampled_from(RUN_IDS), "suite": st.sampled_from(SUITES),
    "trigger": st.none(),  # the writer stamps its run's trigger
    "started_at": aware,
    "op": st.one_of(st.sampled_from(OPS), st.text(chars, min_size=1, max_size=6)),
    "outcome": st.sampled_from(OUTCOMES), "backend": nullable(st.sampled_from(BACKENDS)),
    "job": nullable(st.sampled_from(JOBS)), "extra": extras,
    "variant": nullable(st.one_of(st.sampled_from(("baseline:nccl", "consumer")), texts)),
    "topology": nullable(st.sampled_from(TOPOLOGIES)),
}
rows = st.fixed_dictionaries({c.name: SPECIAL.get(c.name, BY_TYPE[c.type]) for c in COLUMNS})
OPTIONAL = [c.name for c in COLUMNS if not c.required and c.name in FILE_SCHEMA.names]


@st.composite
def tables(draw) -> dict:
    """Rows, each run's trigger and manifest, and which file (if any) is
    rewritten as an older schema version lacking some columns."""
    table = draw(st.lists(rows, min_size=1, max_size=8))
    used = sorted({r["run_id"] for r in table})
    return {
        "rows": table,
        "triggers": {r: draw(st.sampled_from(TRIGGERS)) for r in used},
        "manifests": {r: draw(st.sampled_from(("none", "running", "finished", "interrupted")))
                      for r in used},
        "accounting": draw(nullable(st.lists(st.fixed_dictionaries({
            "job": texts, "cases": nullable(st.integers(-5, 10**6)), "wall_s": floats,
            "work_s": st.one_of(floats, texts), "overhead": st.one_of(floats, texts),
            "build_s": floats, "phases_s": nullable(st.one_of(texts, st.dictionaries(
                st.sampled_from(["load", "call"]), floats, max_size=2))),
            "rebuilt_cases": nullable(st.integers(0, 9)), "rebuilt_s": floats}),
            max_size=3))),
        "older": draw(nullable(st.tuples(st.integers(1, 3),
                                         st.lists(st.sampled_from(OPTIONAL), max_size=12)))),
    }


def write(root: Path, table: dict) -> None:
    """The table as a dataset under ``root``, through the real store."""
    first = None
    for run_id, trigger in table["triggers"].items():
        state = table["manifests"][run_id]
        if state != "none":
            runs.begin(root, run_id, trigger=trigger)
        for suite in SUITES:
            mine = [r for r in table["rows"] if r["run_id"] == run_id and r["suite"] == suite]
            if mine:
                path = ResultsWriter(root, suite=suite, run_id=run_id, trigger=trigger).append(mine)
                first = first or path
        if table["accounting"] is not None and state != "none":
            for entry in table["accounting"]:
                runs.add_accounting(root, run_id, entry)
        if state == "finished":
            runs.finish(root, run_id)
        elif state == "interrupted":
            runs.interrupt(root, run_id, by="SIGINT")
    if table["older"] is not None:  # one file as an older version wrote it
        version, dropped = table["older"]
        old = pq.read_table(first)
        old = old.drop_columns(sorted(set(dropped)))
        pq.write_table(old.replace_schema_metadata({SCHEMA_VERSION_KEY: str(version).encode()}),
                       first)


def kinds(table: dict) -> set[str]:
    """Which of the values the issue names this table holds (for the tally)."""
    values = [v for r in table["rows"] for v in r.values()]
    values += [x for v in values if isinstance(v, list) for x in v]
    floats_ = [v for v in values if isinstance(v, float)]
    out = {name for name, hit in (
        ("tables with NaN", any(math.isnan(v) for v in floats_)),
        ("tables with +inf", math.inf in floats_), ("tables with -inf", -math.inf in floats_),
        ("tables with |x| >= 1e308", any(1e308 <= abs(v) < math.inf for v in floats_)),
        ("tables with a subnormal", any(0 < abs(v) < 2.3e-308 for v in floats_)),
        ("tables with an older-schema file", table["older"] is not None),
        ("tables with a run manifest", set(table["manifests"].values()) != {"none"}))
        if hit}
    return out


class Balance(HTMLParser):
    """Fails on a closing tag that closes nothing open, or tags left open."""
    VOID = {"br", "hr", "img", "input", "link", "meta", "source", "wbr"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, f"</{tag}> closes {self.open[-3:]}"
        self.open.pop()


def strict_json(text: str):
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def check_page(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!doctype html>\n") and text.endswith("</html>\n"), path.name
    assert "Traceback" not in text and 'class="page-error"' not in text, path.name
    parser = Balance()
    parser.feed(text)
    parser.close()
    assert parser.open == [], f"{path.name}: left open {parser.open}"
    start = '<script type="application/json" id="'
    for chunk in text.split(start)[1:]:
        strict_json(chunk.split('">', 1)[1].split("</script>", 1)[0])
    return text


@pytest.fixture(scope="module", autouse=True)
def no_fsync():
    """The store's fsyncs (two a file it writes) off for this module: what
    is tested is what the pages make of the values, not that the files
    survive a power cut, and on the loaded shared box each fsync waited on
    every other writer's disk traffic."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "fsync", lambda fd: None)
        yield


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(table=tables())
def test_every_page_builds_from_any_table(table, tmp_path_factory):
    base = tmp_path_factory.mktemp("total")
    root, out = base / "results", base / "site"
    write(root, table)
    index = build_site(root, out)
    assert index == out / "index.html"
    for name in TOP_PAGES:
        check_page(out / name)
        TALLY[name] += 1
    TALLY.update(kinds(table))
    latest_ops = set()
    for page in out.glob("*.html"):
        if page.name not in TOP_PAGES:
            check_page(page)
    # The latest run's values are rendered: each max ULP on its op's details page.
    from dashboards.model import load
    results = load(root)
    run = results.latest
    for r in run.rows:
        latest_ops.add(r["op"])
        details = (out / f"details-{slug(r['op'])}.html").read_text(encoding="utf-8")
        if r.get("max_ulp") is not None:
            assert html.escape(h.fmt(r["max_ulp"])) in details, (r["op"], r["max_ulp"])
    TALLY["details pages"] += len(latest_ops)


def test_tally_every_page_was_built_from_every_table():
    """Runs after the property (file order): each page saw every table."""
    if not TALLY:
        pytest.skip("the property did not run in this session")
    print("\ntables per page:", dict(TALLY))
    for name in TOP_PAGES:
        assert TALLY[name] == EXAMPLES, (name, TALLY[name])
