"""``ROOT/_runs/runs.pq``: the run manifests as one Parquet table, one row
per run, so a plain Parquet reader gives every row its commit and versions
with ``JOIN ... USING (run_id)`` (docs/results-schema.md shows the DuckDB
query). Its name does not end in ``.parquet``, so that ``ROOT/**/*.parquet``
stays exactly the rows (a DuckDB glob does not skip ``_runs``; the
quarantine renames its files for the same reason).

Columns: ``run_id``, ``trigger``, ``status`` (as the manifest records it:
``running``, ``finished``, ``interrupted`` or ``incomplete``; whether a ``running`` run's
driver is gone is decided at read time, ``runs.effective_status``),
``started_at``, ``finished_at``, then the per-run facts
(``runs.RUN_FACTS``), each with its results column's type
(``schema.COLUMNS``).

The table is rewritten whole from every manifest under ``ROOT/_runs``
whenever a manifest's row changes (a run begins, finishes, is interrupted,
or gets its facts; not on heartbeats or accounting), atomically (a reader
sees the old table or the new one) and under an exclusive lock on
``_runs/.runs.lock``, so that of two drivers writing at once the later one
sees the other's manifest.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from jobs.results.atomic import write_atomically
from jobs.results.run_files import RUN_FACTS, RUNS_DIR, read_manifests
from jobs.results.schema import COLUMNS

TABLE_NAME = "runs.pq"
LOCK_NAME = ".runs.lock"

_TS = pa.timestamp("us", tz="UTC")


def table_schema() -> pa.Schema:
    """The runs table's columns: the run's identity and status, then the
    per-run facts with their results column types."""
    types = {c.name: c.type for c in COLUMNS}
    return pa.schema([pa.field("run_id", pa.string(), nullable=False),
                      pa.field("trigger", pa.string()), pa.field("status", pa.string()),
                      pa.field("started_at", _TS), pa.field("finished_at", _TS),
                      *(pa.field(name, types[name]) for name in RUN_FACTS)])


def table_path(root: str | os.PathLike[str]) -> Path:
    return Path(root) / RUNS_DIR / TABLE_NAME


@contextlib.contextmanager
def _locked(root: str | os.PathLike[str]) -> Iterator[None]:
    path = table_path(root).with_name(LOCK_NAME)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _time(value) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _value(value, type_: pa.DataType):
    """``value`` if Arrow takes it as ``type_``, else None (a manifest edited
    by hand must not stop every later run from writing the table)."""
    try:
        return pa.scalar(value, type=type_).as_py()
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return None


def build(manifests: dict[str, dict]) -> pa.Table:
    """The table of ``manifests`` (``runs.read_manifests``), by run id."""
    schema = table_schema()
    rows = []
    for run_id, data in sorted(manifests.items()):
        facts = data.get("facts") or {}
        given = {"trigger": data.get("trigger"), "status": data.get("status"),
                 "started_at": _time(data.get("started_at")),
                 "finished_at": _time(data.get("finished_at")), **facts}
        rows.append({"run_id": run_id, **{f.name: _value(given.get(f.name), f.type)
                                          for f in schema if f.name != "run_id"}})
    return pa.Table.from_pylist(rows, schema=schema)


def write(root: str | os.PathLike[str]) -> Path:
    """Rewrite ``ROOT/_runs/runs.pq`` from every manifest (see the
    module doc); returns its path."""
    with _locked(root):
        table = build(read_manifests(root))
        return write_atomically(table_path(root), lambda sink: pq.write_table(table, sink))


def read(root: str | os.PathLike[str]) -> pa.Table:
    """The runs table under ``root``; FileNotFoundError when none was
    written (a dataset older than the table: ``python -m jobs compact``
    writes one for its copy)."""
    return pq.read_table(table_path(root))
