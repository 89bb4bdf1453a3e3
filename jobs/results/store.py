"""The results dataset: hive-partitioned Parquet files, appended atomically.

Layout: ``ROOT/date=YYYY-MM-DD/suite=NAME/part-<pid>-<uuid>.parquet``. Every
``ResultsWriter.append`` writes one new file: first to a hidden temporary
file in the same directory (``.part-...parquet.tmp``), fsynced, then
``os.replace``d to its final name, so a reader never sees a partial file and
any number of writer processes can append at once without locks (no file is
ever written twice). A writer killed mid-append leaves at most a hidden
temporary file, which readers ignore (pyarrow skips names starting with "."
or "_").

Reading returns the columns of ``SCHEMA`` plus the partition column
``date`` (string). Files of older schema versions read with nulls for the
columns they lack; a file without a version, or of a newer version, is an
error naming the file.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from jobs.results.schema import (SCHEMA, SCHEMA_VERSION, SCHEMA_VERSION_KEY,
                                 TRIGGERS, make_row, rows_to_table)

READ_SCHEMA = SCHEMA.append(pa.field("date", pa.string()))

_PARTITIONING = ds.partitioning(
    pa.schema([("date", pa.string()), ("suite", pa.string())]), flavor="hive")
_SUITE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_STAMPED = ("run_id", "suite", "trigger")

Filters = pc.Expression | Mapping[str, Any] | None


def new_run_id() -> str:
    """A fresh run id: UTC time to the second plus 8 random hex digits."""
    return f"{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"


class ResultsWriter:
    """Appends rows of one suite of one run to the dataset under ``root``.

    Files go to ``root/date=DATE/suite=SUITE/``, DATE being ``date`` or the
    UTC date when the writer was made (so a run that crosses midnight stays
    in one partition). ``run_id`` defaults to ``new_run_id()``; share it
    across the writers of one run. The writer stamps ``run_id``, ``suite``
    and ``trigger`` into rows that leave them out, and rejects rows that give
    other values.
    """

    def __init__(self, root: str | os.PathLike[str], *, suite: str,
                 run_id: str | None = None, trigger: str = "adhoc",
                 date: dt.date | None = None) -> None:
        if not isinstance(suite, str) or not _SUITE_NAME.fullmatch(suite):
            raise ValueError(
                f"suite={suite!r} must match {_SUITE_NAME.pattern} (it names a directory)")
        if trigger not in TRIGGERS:
            raise ValueError(f"trigger={trigger!r} is not one of {TRIGGERS}")
        if run_id is not None and not (isinstance(run_id, str) and run_id):
            raise ValueError(f"run_id={run_id!r} must be a non-empty string")
        self.suite = suite
        self.trigger = trigger
        self.run_id = run_id or new_run_id()
        self.date = f"{date or dt.datetime.now(dt.timezone.utc):%Y-%m-%d}"
        self.directory = Path(root) / f"date={self.date}" / f"suite={suite}"

    def append(self, rows: Mapping[str, Any] | Iterable[Mapping[str, Any]]) -> Path | None:
        """Write ``rows`` (one row mapping, or several) as one new Parquet file.

        Each row goes through ``make_row``; errors name the row index and the
        field. Returns the file written, or None when ``rows`` is empty.
        """
        rows = [rows] if isinstance(rows, Mapping) else list(rows)
        if not rows:
            return None
        complete = []
        for index, row in enumerate(rows):
            row = dict(row)
            for name in _STAMPED:
                given, value = row.get(name), getattr(self, name)
                if given is None:
                    row[name] = value
                elif given != value:
                    raise ValueError(f"row {index}: {name}={given!r} but this writer "
                                     f"writes {name}={value!r}")
            try:
                complete.append(make_row(**row))
            except ValueError as err:
                raise ValueError(f"row {index}: {err}") from None
        return _write_atomically(rows_to_table(complete), self.directory)


def _write_atomically(table: pa.Table, directory: Path) -> Path:
    """Write ``table`` to a new file in ``directory`` via a hidden temp + rename."""
    directory.mkdir(parents=True, exist_ok=True)
    name = f"part-{os.getpid()}-{uuid.uuid4().hex}.parquet"
    final, temp = directory / name, directory / f".{name}.tmp"
    try:
        with open(temp, "xb") as sink:
            pq.write_table(table, sink)
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(temp, final)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _fsync_directory(directory)
    return final


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_results(root: str | os.PathLike[str], filters: Filters = None,
                 columns: Sequence[str] | None = None) -> pa.Table:
    """Read the results under ``root`` as one Table.

    ``filters``: a pyarrow expression, or a mapping ``{column: value}`` where
    a list/tuple/set value means "any of"; partition columns (``date``,
    ``suite``) prune whole directories. ``columns``: names to return
    (default all of ``READ_SCHEMA``). Unknown names raise ValueError naming
    them; a missing ``root`` raises FileNotFoundError; an existing root
    without files gives an empty table. Files of a newer or unknown schema
    version raise ValueError naming the file.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"results root {str(root)!r} is not a directory")
    _check_names("columns", columns or (), READ_SCHEMA)
    expression = _as_expression(filters)
    dataset = ds.dataset(root, schema=READ_SCHEMA, format="parquet", partitioning=_PARTITIONING)
    schemas = [_file_schema(fragment) for fragment in dataset.get_fragments(filter=expression)]
    schema = pa.unify_schemas([READ_SCHEMA, *schemas])
    return dataset.replace_schema(schema).to_table(columns=columns, filter=expression)


def compact(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> list[Path]:
    """Copy the dataset under ``src`` to the new directory ``dst`` as one file
    per (date, suite, run) instead of one per case; returns the files
    written. ``src`` is left as it is (swap the directories once ``dst`` reads
    back the same). Each file is written atomically, in the current schema
    version (older files read with nulls for what they lack). A ``dst`` that
    exists and is not empty is a ValueError: compaction never mixes into a
    dataset."""
    dst = Path(dst)
    if dst.exists() and any(dst.iterdir()):
        raise ValueError(f"compact: {str(dst)!r} exists and is not empty")
    table = read_results(src)
    keys = sorted(set(zip(*(table.column(c).to_pylist() for c in ("date", "suite", "run_id")))))
    written = []
    for date, suite, run_id in keys:
        mask = pc.and_(pc.and_(pc.equal(table["date"], date), pc.equal(table["suite"], suite)),
                       pc.equal(table["run_id"], run_id))
        part = table.filter(mask).select(SCHEMA.names).cast(SCHEMA)
        written.append(_write_atomically(part, dst / f"date={date}" / f"suite={suite}"))
    return written


def _file_schema(fragment: ds.ParquetFileFragment) -> pa.Schema:
    """The fragment's schema, after checking its version is readable."""
    schema = fragment.physical_schema
    raw = (schema.metadata or {}).get(SCHEMA_VERSION_KEY)
    if raw is None:
        raise ValueError(f"{fragment.path}: no {SCHEMA_VERSION_KEY.decode()} in its metadata; "
                         "not written by jobs.results")
    version = int(raw)
    if version > SCHEMA_VERSION:
        raise ValueError(f"{fragment.path}: schema version {version} is newer than this "
                         f"reader's {SCHEMA_VERSION}; update lamport-lab")
    try:
        pa.unify_schemas([READ_SCHEMA, schema])
    except (pa.ArrowTypeError, pa.ArrowInvalid) as err:
        raise ValueError(f"{fragment.path}: schema version {version} conflicts with "
                         f"version {SCHEMA_VERSION}: {err}") from None
    return schema


def _as_expression(filters: Filters) -> pc.Expression | None:
    """``filters`` as a pyarrow expression (None for no filter)."""
    if filters is None or isinstance(filters, pc.Expression):
        return filters
    _check_names("filters", filters, READ_SCHEMA)
    expression = None
    for name, value in filters.items():
        if isinstance(value, (list, tuple, set, frozenset)):
            term = pc.field(name).isin(list(value))
        else:
            term = pc.field(name) == value
        expression = term if expression is None else expression & term
    return expression


def _check_names(what: str, names: Iterable[str], schema: pa.Schema) -> None:
    unknown = sorted(set(names) - set(schema.names))
    if unknown:
        raise ValueError(f"{what}: unknown column(s) {unknown}")


def list_runs(root: str | os.PathLike[str]) -> pa.Table:
    """One row per run under ``root``, newest first.

    Columns: run_id, trigger, started_at (earliest case), finished_at
    (latest case), suites (list of suite names), rows (cases recorded).
    """
    table = read_results(root, columns=["run_id", "trigger", "suite",
                                        "started_at", "finished_at"])
    runs = table.group_by(["run_id", "trigger"]).aggregate([
        ("started_at", "min"), ("finished_at", "max"), ("suite", "distinct"),
        ([], "count_all"),
    ])
    runs = runs.rename_columns({"started_at_min": "started_at", "finished_at_max": "finished_at",
                                "suite_distinct": "suites", "count_all": "rows"})
    return runs.sort_by([("started_at", "descending")])
