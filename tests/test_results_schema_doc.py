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
    query = re.search(r"```sql\n(.*?)```", DOC.read_text(), re.S).group(1)
    monkeypatch.chdir(tmp_path)  # the query reads results/ as the doc says
    got = duckdb.sql(query).fetchall()
    assert got == [("correctness", "fail", 1, "python -m jobs correctness --tp 2 # new"),
                   ("correctness", "pass", 1, None),
                   ("faults", "skipped", 1, "python -m jobs faults --tp 2")]
