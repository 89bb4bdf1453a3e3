"""Schema version 5's bandwidth columns (algbw_gbps, busbw_gbps): the rows
of a version-4 file read them as null, through read_results and the report."""

import datetime as dt
import json

import pyarrow.parquet as pq

from jobs import __main__ as cli
from jobs.results import SCHEMA_VERSION, SCHEMA_VERSION_KEY, ResultsWriter, read_results


def test_a_version_4_file_reads_the_bandwidth_columns_as_null(tmp_path, capsys):
    assert SCHEMA_VERSION == 5
    when = dt.datetime(2026, 12, 1, 2, 0, tzinfo=dt.timezone.utc)
    w = ResultsWriter(tmp_path, suite="nightly", trigger="nightly")
    path = w.append(dict(started_at=when, outcome="pass", op="all_reduce_norm", tp=2,
                         hidden=7168, tokens=8, job="profile", t_median_us=4.0,
                         algbw_gbps=28.7, busbw_gbps=28.7))
    assert read_results(tmp_path).column("busbw_gbps").to_pylist() == [28.7]
    # the same file as version 4 wrote it: no bandwidth columns
    old = pq.read_table(path).drop_columns(["algbw_gbps", "busbw_gbps"])
    old = old.replace_schema_metadata({**old.schema.metadata, SCHEMA_VERSION_KEY: b"4"})
    pq.write_table(old, path)
    (row,) = read_results(tmp_path).to_pylist()
    assert row["algbw_gbps"] is None and row["busbw_gbps"] is None and row["t_median_us"] == 4.0
    assert cli.main(["report", "--results", str(tmp_path), "--format", "json"]) == 0
    (shown,) = json.loads(capsys.readouterr().out)
    assert shown["algbw_gbps"] is None and shown["median_us"] == 4.0
