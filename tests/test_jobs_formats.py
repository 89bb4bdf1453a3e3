"""``--format table|csv|json|md`` (jobs/formats.py) for report, regress and
bisect: the one writer on its own, then through the commands (no Ray)."""

import csv
import datetime as dt
import io
import json
import math
import types

import pytest

from jobs import __main__ as cli
from jobs import bisect, formats
from jobs.results import ResultsWriter, make_row
from jobs.table import Col

COLS = [Col("name", 6), Col("us", 7, ".2f"), Col("note", 10)]
ROWS = [["a|b", 1.23456, "x"], ["c", math.nan, None], ["d", math.inf, "y,z"]]


def _write(fmt):
    out = io.StringIO()
    assert formats.write(fmt, COLS, ROWS, out) == 3
    return out.getvalue()


def test_csv_json_md_and_table():
    rows = list(csv.reader(io.StringIO(_write("csv"))))
    assert rows == [["name", "us", "note"], ["a|b", "1.23456", "x"], ["c", "", ""],
                    ["d", "", "y,z"]]
    assert json.loads(_write("json")) == [{"name": "a|b", "us": 1.23456, "note": "x"},
                                          {"name": "c", "us": None, "note": None},
                                          {"name": "d", "us": None, "note": "y,z"}]
    md = _write("md").splitlines()
    assert md[:2] == ["| name | us | note |", "| --- | ---: | --- |"]
    assert md[2] == "| a\\|b | 1.23 | x |" and md[3] == "| c |  |  |"
    table = _write("table").splitlines()
    assert table[0].split() == ["name", "us", "note"] and "1.23" in table[2]
    with pytest.raises(ValueError, match="format 'xml'"):
        formats.write("xml", COLS, ROWS, io.StringIO())


def _store(root):
    when = dt.datetime(2026, 11, 1, 2, 0, tzinfo=dt.timezone.utc)
    w = ResultsWriter(root, suite="nightly", trigger="nightly")
    case = dict(op="all_reduce_norm", variant="watchdog", transport="unicast", backend="gpu",
                tp=2, hidden=7168, dtype="bfloat16", job="profile", git_commit="ab" * 20)
    w.append([make_row(started_at=when, outcome="pass", tokens=1, t_median_us=3.5,
                       t_p99_us=4.0, **case),
              make_row(started_at=when, outcome="fail", tokens=8, reason="wrong | values",
                       repro_command="python -m jobs profile ...", **case)])
    return w.run_id


def test_report_formats(tmp_path, capsys):
    run = _store(tmp_path)
    assert cli.main(["report", "--results", str(tmp_path), "--format", "json"]) == 1
    rows = json.loads(capsys.readouterr().out)
    assert [(r["M"], r["result"], r["median_us"]) for r in rows] == [(8, "fail", None),
                                                                     (1, "pass", 3.5)]
    assert rows[0]["repro_command"] == "python -m jobs profile ..." and rows[0]["run_id"] == run
    assert cli.main(["report", "--results", str(tmp_path), "--format", "csv"]) == 1
    got = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["reason"] for r in got] == ["wrong | values", ""]
    assert cli.main(["report", "--results", str(tmp_path), "--list", "--format", "md"]) == 0
    md = capsys.readouterr().out.splitlines()
    assert md[0].startswith("| run_id | status |") and run in md[2]
    assert cli.main(["report", run, run, "--results", str(tmp_path), "--format", "csv"]) == 1
    got = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["B/A"] for r in got] == ["1.0"]


def test_bisect_format_puts_only_the_verdicts_on_stdout(monkeypatch, capsys, tmp_path):
    outcome = types.SimpleNamespace(values=[3.1, 3.2], wall_s=1.5)

    def fake(args, verdicts, first_bad=None):
        print("bisect: progress line")
        verdicts["a" * 40] = bisect.Verdict("a" * 40, "good", "ok", outcome, [3.0], 0)
        verdicts["b" * 40] = bisect.Verdict("b" * 40, "bad", "+20 %", outcome, [3.0], 1)
        first_bad.append("b" * 40)
        return 0

    monkeypatch.setattr(bisect, "_run_bisect", fake)
    monkeypatch.setattr(bisect, "subject", lambda repo, sha: f"subject {sha[:2]}")
    args = types.SimpleNamespace(format="json", repo=tmp_path)
    assert bisect.run_bisect(args) == 0
    out = capsys.readouterr()
    rows = json.loads(out.out)
    assert [(r["commit"][:2], r["verdict"], r["first_bad"]) for r in rows] == [
        ("aa", "good", False), ("bb", "bad", True)]
    assert rows[1]["values"] == "[3.1, 3.2]" and "bisect: progress line" in out.err
