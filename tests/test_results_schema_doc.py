"""docs/results-schema.md, where users look for the columns: its table is
the schema's (``python -m jobs schema``), and its DuckDB query runs on a
dataset written by the results store and gives the expected answer."""

import datetime as dt
import re
from pathlib import Path

import pytest

from jobs.results import ResultsWriter
from jobs.results.schema import markdown_table

DOC = Path(__file__).resolve().parents[1] / "docs" / "results-schema.md"


def test_the_doc_lists_every_column_as_the_schema_defines_it():
    text = DOC.read_text()
    assert markdown_table() in text
    assert "results-schema.md" in (DOC.parents[1] / "README.md").read_text()


def test_the_docs_duckdb_query_answers_on_a_written_dataset(tmp_path, monkeypatch):
    duckdb = pytest.importorskip("duckdb", reason="duckdb is a dev extra (scripts/setup --dev)")
    t0 = dt.datetime(2026, 11, 30, 3, 0, tzinfo=dt.timezone.utc)
    base = dict(op="all_reduce_norm", tp=2, hidden=1024, tokens=3)
    for run, start in (("old", t0), ("new", t0 + dt.timedelta(hours=1))):
        writer = ResultsWriter(tmp_path / "results", suite="smoke", run_id=run)
        writer.append([dict(base, started_at=start, job="correctness", outcome="pass"),
                       dict(base, started_at=start, job="correctness", outcome="fail",
                            repro_command=f"python -m jobs correctness --tp 2 # {run}"),
                       dict(base, started_at=start, job="faults", outcome="skipped",
                            repro_command="python -m jobs faults --tp 2")])
    query = _queries()[0]
    monkeypatch.chdir(tmp_path)  # the query reads results/ as the doc says
    got = duckdb.sql(query).fetchall()
    assert got == [("correctness", "fail", 1, "python -m jobs correctness --tp 2 # new"),
                   ("correctness", "pass", 1, None),
                   ("faults", "skipped", 1, "python -m jobs faults --tp 2")]


def _queries() -> list[str]:
    """The doc's SQL blocks, in order."""
    return re.findall(r"```sql\n(.*?)```", DOC.read_text(), re.S)


def test_the_docs_join_gives_every_row_its_commit_and_versions(tmp_path, monkeypatch):
    """The per-run facts are in ``_runs/runs.pq`` as soon as runs begin and
    end: the doc's JOIN ... USING (run_id) gives the latest run's rows its
    commit, torch and Ray, with no JSON read by hand."""
    duckdb = pytest.importorskip("duckdb", reason="duckdb is a dev extra (scripts/setup --dev)")
    from jobs.results import runs
    t0 = dt.datetime(2026, 11, 30, 3, 0, tzinfo=dt.timezone.utc)
    base = dict(op="all_reduce_norm", tp=2, hidden=1024, tokens=3, started_at=t0)
    for run, commit, torch in (("old", "a" * 40, "2.11.0"), ("new", "b" * 40, "2.13.0")):
        facts = {"git_commit": commit, "torch": torch, "ray": "2.60.0"}
        runs.begin(tmp_path / "results", run, trigger="nightly", facts=facts)
        writer = ResultsWriter(tmp_path / "results", suite="smoke", run_id=run)
        writer.append([dict(base, job="correctness", outcome="pass", **facts),
                       dict(base, job="correctness", outcome="pass", **facts),
                       dict(base, job="faults", outcome="fail", **facts)])
        runs.finish(tmp_path / "results", run)
    monkeypatch.chdir(tmp_path)
    got = duckdb.sql(_queries()[1]).fetchall()
    assert got == [("b" * 40, "2.13.0", "2.60.0", "correctness", "pass", 2),
                   ("b" * 40, "2.13.0", "2.60.0", "faults", "fail", 1)]
