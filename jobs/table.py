"""The fixed-width results table every job prints (the nccl-tests habit):
one header, one line per case, right-aligned numbers, '-' for no value.

Text is never cut: a value wider than its column pushes the rest of its row
to the right (a name cut short, ``finalize_publis``, is worse than a row out
of line). The name columns are as wide as the longest name they can hold
(:func:`job_col`, :func:`op_col`), so they keep the table aligned."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO


@dataclass(frozen=True)
class Col:
    header: str
    width: int
    fmt: str = ""  # format spec for numbers, e.g. ".2f"; text is left-aligned


def job_col(header: str = "job") -> Col:
    """A column as wide as the longest job name (``jobs.results.schema.JOBS``)."""
    from jobs.results.schema import JOBS
    return Col(header, max(len(header), *map(len, JOBS)))


def op_col(header: str = "op") -> Col:
    """A column as wide as the longest registered op name (``cluster.ops``)."""
    from cluster import ops
    return Col(header, max(len(header), *map(len, ops.names())))


def _cell(col: Col, value: Any) -> str:
    if value is None:
        return "-".rjust(col.width)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, col.fmt).rjust(col.width)
    return str(value).ljust(col.width)


class Table:
    """Prints a header once, then rows as they come (so a long sweep shows
    progress and a crash keeps what was printed)."""

    def __init__(self, cols: Sequence[Col], out: TextIO | None = None):
        self.cols = list(cols)
        self.out = out or sys.stdout
        self._printed_header = False

    def header(self) -> None:
        line = "  ".join(c.header.rjust(c.width) if c.fmt else c.header.ljust(c.width)
                         for c in self.cols)
        print(line, file=self.out)
        print("-" * len(line), file=self.out, flush=True)
        self._printed_header = True

    def row(self, values: Sequence[Any]) -> None:
        if not self._printed_header:
            self.header()
        print("  ".join(_cell(c, v) for c, v in zip(self.cols, values)), file=self.out, flush=True)

    def rows(self, rows: Iterable[Sequence[Any]]) -> None:
        for r in rows:
            self.row(r)
