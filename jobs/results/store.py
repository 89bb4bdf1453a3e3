"""The results dataset: hive-partitioned Parquet files, appended atomically.

Layout: ``ROOT/date=YYYY-MM-DD/suite=NAME/part-<pid>-<uuid>.parquet``, plus
``ROOT/_runs/<run_id>.json`` (the run manifests, :mod:`jobs.results.runs`)
and ``ROOT/_quarantine/`` (files that could not be read). A file holds the
columns of ``FILE_SCHEMA``: ``suite`` is only the partition key and the
per-run facts live in the manifest, so any Parquet reader opens the dataset
as it is (``pyarrow.parquet.read_table(ROOT)``, ``pyarrow.dataset.dataset(ROOT,
partitioning="hive")``, DuckDB's ``read_parquet('ROOT/**/*.parquet',
hive_partitioning = true)``; add ``union_by_name = true`` where version-1
files are mixed in). Every
``ResultsWriter.append`` writes one new file: first to a hidden temporary
file in the same directory (``.part-...parquet.tmp``), fsynced, then
``os.replace``d to its final name, so a reader never sees a partial file and
any number of writer processes can append at once without locks (no file is
ever written twice). A writer killed mid-append leaves at most a hidden
temporary file, which readers ignore (pyarrow skips names starting with "."
or "_").

Reading returns the columns of ``SCHEMA`` plus the partition column
``date`` (string) and ``run_status`` (the run's effective status from its
manifest, :func:`jobs.results.runs.effective_status`); the per-run facts are
filled in from the manifests. Files of older schema versions read with nulls
for the columns they lack; a file without a version, or of a newer version,
is an error naming the file. A visible file that is not readable Parquet
(truncated, say) is moved to ``ROOT/_quarantine/`` with a
:class:`QuarantineWarning`, and the rest of the dataset reads on.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import uuid
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from jobs.results import runs
from jobs.results.atomic import fsync_directory, write_atomically
from kernels.validation import require_name
from jobs.results.runs import RUN_FACTS
from jobs.results.schema import (SCHEMA, SCHEMA_VERSION, SCHEMA_VERSION_KEY,
                                 TRIGGERS, make_row, rows_to_table)

FILE_SCHEMA = pa.schema([f for f in SCHEMA if f.name not in ("suite", *RUN_FACTS)],
                        metadata=SCHEMA.metadata)
"""What a version-2 file holds: ``SCHEMA`` without the partition key and the
per-run facts."""
READ_SCHEMA = SCHEMA.append(pa.field("date", pa.string())).append(
    pa.field("run_status", pa.string()))
QUARANTINE_DIR = "_quarantine"


class QuarantineWarning(UserWarning):
    """A results file could not be read and was moved aside."""

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
        if run_id is not None:
            require_name("run_id", run_id)  # it names the run's manifest file
        self.suite = suite
        self.trigger = trigger
        self.run_id = run_id or new_run_id()
        self.date = f"{date or dt.datetime.now(dt.timezone.utc):%Y-%m-%d}"
        self.root = Path(root)
        self.directory = self.root / f"date={self.date}" / f"suite={suite}"
        self._facts: dict | None = None

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
        table = rows_to_table(complete)
        facts = {name: table.column(name)[0].as_py() for name in RUN_FACTS}
        if any(v is not None for v in facts.values()) and facts != self._facts:
            runs.record_facts(self.root, self.run_id, facts)
            self._facts = facts
        return _write_atomically(_file_table(table), self.directory)


def _file_table(table: pa.Table) -> pa.Table:
    """``table`` (``SCHEMA`` columns) as a file holds it (``FILE_SCHEMA``)."""
    return table.select(FILE_SCHEMA.names).cast(FILE_SCHEMA)


def _write_atomically(table: pa.Table, directory: Path, name: str | None = None) -> Path:
    """Write ``table`` to a new file in ``directory`` via a hidden temp + rename."""
    name = name or f"part-{os.getpid()}-{uuid.uuid4().hex}.parquet"
    return write_atomically(directory / name, lambda sink: pq.write_table(table, sink))


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
    derived = set(RUN_FACTS) | {"run_status"}
    late = {}  # filters on derived columns apply after they are filled in
    if isinstance(filters, Mapping):
        late = {k: v for k, v in filters.items() if k in derived}
        filters = {k: v for k, v in filters.items() if k not in derived} or None
    expression = _as_expression(filters)
    file_schema = pa.schema([f for f in READ_SCHEMA if f.name not in derived])
    files = _readable_files(root)
    dataset = ds.dataset(files, schema=file_schema, format="parquet",
                         partitioning=_PARTITIONING, partition_base_dir=str(root))
    schemas = [_file_schema(fragment) for fragment in dataset.get_fragments(filter=expression)]
    schema = pa.unify_schemas([file_schema, *schemas])
    wanted = (list(columns) if columns is not None else
              [*READ_SCHEMA.names, *(n for n in schema.names if n not in READ_SCHEMA.names)])
    read = [c for c in schema.names if c in wanted or (c == "run_id" and derived & set(wanted))]
    table = dataset.replace_schema(schema).to_table(columns=read, filter=expression)
    table = _fill_run_columns(root, table, [c for c in wanted if c in derived])
    if late:
        table = table.filter(_as_expression(late))
    return table.select(wanted)


def _readable_files(root: Path) -> list[str]:
    """The dataset's visible Parquet files; one whose footer cannot be read is
    moved to ``_quarantine`` with a warning."""
    files = []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith((".", "_")))
        for name in sorted(names):
            if name.startswith("run-") and name.endswith(".parquet.new"):
                _finish_compaction(Path(directory) / name)  # a compaction cut short
        names = sorted(os.listdir(directory)) if any(n.endswith(".parquet.new") for n in names) \
            else names
        for name in sorted(names):
            if name.startswith((".", "_")) or not name.endswith(".parquet"):
                continue
            path = Path(directory) / name
            try:
                pq.read_metadata(path)
            except (pa.ArrowException, OSError) as err:
                _quarantine(root, path, err)
                continue
            files.append(str(path))
    return files


def _quarantine(root: Path, path: Path, err: BaseException) -> None:
    target = root / QUARANTINE_DIR / path.relative_to(root).parent / f"{path.name}.quarantined"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
        where = f"moved to {target}"
    except OSError as move_err:
        where = f"left in place (cannot move it: {move_err}); skipped"
    warnings.warn(f"results file {path} is not readable Parquet ({type(err).__name__}: "
                  f"{err}); {where}; the rest of the dataset reads on",
                  QuarantineWarning, stacklevel=3)


def _fill_run_columns(root: Path, table: pa.Table, derived: list[str]) -> pa.Table:
    """Add ``run_status`` and fill the per-run facts a row lacks from its
    run's manifest."""
    if not derived:
        return table
    manifests = runs.read_manifests(root)
    run_ids = table.column("run_id").to_pylist()
    for name in derived:
        if name == "run_status":
            status = {r: runs.effective_status(manifests.get(r)) for r in set(run_ids)}
            values = [status[r] for r in run_ids]
        else:
            given = (table.column(name).to_pylist() if name in table.column_names
                     else [None] * len(run_ids))
            values = [g if g is not None else manifests.get(r, {}).get("facts", {}).get(name)
                      for g, r in zip(given, run_ids)]
        array = pa.array(values, type=READ_SCHEMA.field(name).type)
        if name in table.column_names:
            table = table.set_column(table.schema.get_field_index(name), name, array)
        else:
            table = table.append_column(READ_SCHEMA.field(name), array)
    return table


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
        part = _file_table(table.filter(mask).select(SCHEMA.names).cast(SCHEMA))
        written.append(_write_atomically(part, dst / f"date={date}" / f"suite={suite}"))
    manifests = runs.read_manifests(src)
    for run_id in sorted({k[2] for k in keys}):
        rows = table.filter(pc.equal(table["run_id"], run_id))
        facts = {n: next((v for v in rows.column(n).to_pylist() if v is not None), None)
                 for n in RUN_FACTS}
        data = manifests.get(run_id, {"run_id": run_id})
        data["facts"] = {**facts, **{k: v for k, v in data.get("facts", {}).items()
                                     if v is not None}}
        runs._write(dst, run_id, data, table=False)  # noqa: SLF001 (one module's private writer)
    if keys:
        from jobs.results import runs_table
        runs_table.write(dst)  # once, not once per run
    return written


def compact_run(root: str | os.PathLike[str], run_id: str) -> list[Path]:
    """Rewrite run ``run_id``'s rows under ``root`` in place as one file per
    (date, suite) partition, ``run-<run_id>.parquet``; returns the files
    written. The compacted rows are first written whole, atomically, as
    ``run-<run_id>.parquet.new`` (no reader takes it); then the run's
    per-case files are removed and the new file renamed into place. A crash
    in between is finished by the next read (:func:`_finish_compaction`)."""
    root = Path(root)
    table = read_results(root, filters={"run_id": run_id})
    written = []
    for date, suite in sorted(set(zip(table.column("date").to_pylist(),
                                       table.column("suite").to_pylist()))):
        directory = root / f"date={date}" / f"suite={suite}"
        if [p.name for p in _files_of_run(directory, run_id)] == [f"run-{run_id}.parquet"]:
            continue
        mask = pc.and_(pc.equal(table["date"], date), pc.equal(table["suite"], suite))
        part = _file_table(table.filter(mask).select(SCHEMA.names).cast(SCHEMA))
        new = _write_atomically(part, directory, name=f"run-{run_id}.parquet.new")
        written.append(_finish_compaction(new))
    return written


def _files_of_run(directory: Path, run_id: str) -> list[Path]:
    """The visible files in ``directory`` that hold rows of ``run_id`` only."""
    out = []
    for path in sorted(directory.glob("*.parquet")):
        try:
            ids = set(pq.read_table(path, columns=["run_id"]).column("run_id").to_pylist())
        except (pa.ArrowException, OSError):
            continue
        if ids == {run_id}:
            out.append(path)
    return out


def _finish_compaction(new: Path) -> Path:
    """``run-<id>.parquet.new`` holds every row of run ``id`` in its folder:
    remove the run's other files there, then rename it into place."""
    run_id = new.name[len("run-"):-len(".parquet.new")]
    final = new.with_name(f"run-{run_id}.parquet")
    for path in _files_of_run(new.parent, run_id):
        path.unlink()
    os.replace(new, final)
    fsync_directory(new.parent)
    return final


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

    Columns: run_id, trigger, run_status (``runs.STATUSES``), started_at
    (earliest case), finished_at (latest case), suites (list of suite
    names), rows (cases recorded).
    """
    table = read_results(root, columns=["run_id", "trigger", "run_status", "suite",
                                        "started_at", "finished_at"])
    runs = table.group_by(["run_id", "trigger", "run_status"]).aggregate([
        ("started_at", "min"), ("finished_at", "max"), ("suite", "distinct"),
        ([], "count_all"),
    ])
    runs = runs.rename_columns({"started_at_min": "started_at", "finished_at_max": "finished_at",
                                "suite_distinct": "suites", "count_all": "rows"})
    return runs.sort_by([("started_at", "descending")])
