"""One table, four ways to write it (``--format`` of ``report``, ``regress``
and ``bisect``):

- ``table``: the fixed-width table every job prints (:mod:`jobs.table`);
- ``csv``: the csv module's dialect, a header row of the column names,
  empty for no value;
- ``json``: a JSON array of objects, one per row, keyed by column name; no
  value, NaN and +-Inf are ``null`` (strict JSON has no NaN);
- ``md``: a GitHub Markdown table, ``|`` in a cell escaped.

In csv and json the numbers are written in full (not rounded to the
table's format; md, for people, rounds as the table does), and only the
table is written: the commands' prose
(headings, repro commands) goes with ``table`` alone, so the output of the
other three parses as it is.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

from jobs.table import Col, Table

FORMATS = ("table", "csv", "json", "md")


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def write(fmt: str, cols: Sequence[Col], rows: Iterable[Sequence[Any]],
          out: TextIO | None = None) -> int:
    """Write ``rows`` (one value per column) in ``fmt``; returns how many."""
    out = out or sys.stdout
    rows = list(rows)
    names = [c.header for c in cols]
    if fmt == "table":
        Table(cols, out).rows(rows)
    elif fmt == "csv":
        w = csv.writer(out, lineterminator="\n")
        w.writerow(names)
        for r in rows:
            w.writerow(["" if (v := _plain(x)) is None else v for x in r])
    elif fmt == "json":
        json.dump([dict(zip(names, map(_plain, r))) for r in rows], out, indent=1,
                  allow_nan=False)
        out.write("\n")
    elif fmt == "md":
        def cell(c: Col, x: Any) -> str:
            v = _plain(x)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and c.fmt:
                v = format(v, c.fmt)
            return "" if v is None else str(v).replace("|", "\\|").replace("\n", " ")
        out.write("| " + " | ".join(names) + " |\n")
        out.write("|" + "|".join(" ---: " if c.fmt else " --- " for c in cols) + "|\n")
        for r in rows:
            out.write("| " + " | ".join(cell(c, x) for c, x in zip(cols, r)) + " |\n")
    else:
        raise ValueError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    out.flush()
    return len(rows)
