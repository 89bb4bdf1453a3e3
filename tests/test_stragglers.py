"""The straggler view (cluster/stragglers.py): per call each rank's publish
start after the group's first, the row columns a case's calls make, and the
dashboard's stragglers page with a section per TP group."""

import datetime as dt
import json

from cluster import stragglers as st
from dashboards.build import build_site
from jobs.results import ResultsWriter, make_row, read_results
from jobs.results import runs as runs_mod


def test_offsets_from_the_ranks_marks():
    results = [{"publish_start_ns": 5_000}, {"publish_start_ns": 2_000}, None,
               {"publish_start_ns": 9_500}]
    assert st.call_offsets(results) == [3.0, 0.0, None, 7.5]
    assert st.call_offsets([{"publish_start_ns": 1}, {}]) is None  # one mark: nothing to compare
    assert st.last_rank([3.0, 0.0, None, 7.5]) == 3 and st.skew([3.0, 0.0, None, 7.5]) == 7.5
    assert st.last_rank([0.0, 4.0, 4.0]) == 1  # a tie: the lowest rank


def test_a_cases_calls_make_the_row_columns():
    calls = [[0.0, 10.0], [0.0, 30.0], [5.0, 0.0], None, [0.0, 20.0]]
    got = st.summarize(calls)
    assert got == {"publish_skew_us": 15.0, "publish_skew_max_us": 30.0, "last_rank": 1,
                   "last_rank_share": 0.75, "publish_offsets_us": [0.0, 15.0]}
    assert st.summarize([None]) == {}
    (r0, r1) = st.per_rank([c for c in calls if c])
    assert (r0["last"], r1["last"]) == (1, 3)
    assert r1["median_us"] == 15.0 and r1["max_us"] == 30.0 and r1["p90_us"] == 27.0


def _row(when, tp, calls, **kw):
    return make_row(started_at=when, outcome="pass", job="correctness", op="all_reduce_norm",
                    variant="watchdog", transport="unicast", placement="emulated",
                    backend="emulated", tp=tp, hidden=1024, tokens=kw.pop("tokens", 3),
                    dtype="bfloat16", **st.summarize(calls),
                    extra={"publish_offsets_us_by_call": calls}, **kw)


def test_the_page_has_a_section_per_group(tmp_path):
    results = tmp_path / "results"
    when = dt.datetime.now(dt.timezone.utc)
    w = ResultsWriter(results, suite="smoke", trigger="nightly")
    w.append([_row(when, 2, [[0.0, 40.0], [0.0, 60.0], [10.0, 0.0]]),
              _row(when, 2, [[0.0, 50.0]], tokens=8),
              _row(when, 4, [[0.0, 1.0, 2.0, 900.0], [0.0, 3.0, 4.0, 700.0]])])
    runs_mod.begin(results, w.run_id, trigger="nightly")
    runs_mod.finish(results, w.run_id)
    rows = read_results(results).to_pylist()
    four = next(r for r in rows if r["tp"] == 4)
    assert four["last_rank"] == 3 and four["publish_offsets_us"] == [0.0, 2.0, 3.0, 800.0]
    build_site(results, tmp_path / "site")
    page = (tmp_path / "site" / "stragglers.html").read_text()
    assert 'href="stragglers.html"' in (tmp_path / "site" / "index.html").read_text()
    from dashboards.pages.stragglers import group_id
    ids = [group_id(("all_reduce_norm", "watchdog", "unicast", "emulated", tp, 1024, None, None))
           for tp in (2, 4)]
    assert ids[0] != ids[1]
    two, four_at = page.index(f'id="{ids[0]}"'), page.index(f'id="{ids[1]}"')
    sec2, sec4 = page[two:four_at], page[four_at:]
    assert "all_reduce_norm tp=2 hidden=1024 emulated" in sec2
    assert "2 case(s), 4 call(s)" in sec2 and "rank 1 (75%)" in sec2
    assert "4 call(s)" not in sec4 and "1 case(s), 2 call(s)" in sec4 and "rank 3 (100%)" in sec4
    assert "800.0" in sec4  # rank 3's median offset, us
    spec = json.loads(sec2.split('-skew-spec">', 1)[1].split("</script>", 1)[0])
    assert sorted(spec["data"][0]["x"]) == [10.0, 40.0, 50.0, 60.0]


def test_rows_of_older_files_read_the_new_columns_as_null():
    from pathlib import Path
    data = Path(__file__).resolve().parents[1] / "docs" / "results" / "data"
    table = read_results(data / "h200_nightly_smoke_2026-11-29")
    assert table.num_rows > 0
    assert set(table.column("publish_skew_us").to_pylist()) == {None}
