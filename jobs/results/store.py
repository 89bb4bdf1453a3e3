"""The results dataset: hive-partitioned Parquet files, appended atomically.

Layout: ``ROOT/date=YYYY-MM-DD/suite=NAME/part-<pid>-<uuid>.parquet`` (one
file per ``ResultsWriter.append``) and ``run-<run_id>-<hex>.parquet`` (a
run's files of one partition compacted into one,
:mod:`jobs.results.compaction`), plus ``ROOT/_runs/<run_id>.json`` (the run
manifests, :mod:`jobs.results.runs`), ``ROOT/_compaction.lock``
(:mod:`jobs.results.lock`), ``ROOT/_lamport_dataset.json`` (the marker that
makes the folder a dataset, written with the first rows:
:mod:`jobs.results.dataset`) and ``ROOT/_quarantine/`` (files that could not
be read). A file holds the columns of ``FILE_SCHEMA``: ``suite`` is only
the partition key and the per-run facts live in the manifest, so any
Parquet reader opens the dataset as it is (``pyarrow.parquet.read_table(ROOT)``,
``pyarrow.dataset.dataset(ROOT, partitioning="hive")``, DuckDB's
``read_parquet('ROOT/**/*.parquet', hive_partitioning = true)``; add
``union_by_name = true`` where version-1 files are mixed in).

Writing: every ``ResultsWriter.append`` writes one new file, first to a
hidden temporary file in the same directory (``.part-...parquet.<hex>.tmp``),
fsynced, then renamed to its final name, so a reader never sees a partial
file and any number of writer processes can append at once without locks
(no file is ever written twice). A writer killed mid-append leaves at most
a hidden temporary file, which readers ignore (pyarrow skips names starting
with "." or "_"). Pages carry CRC checksums, which readers verify.

Reading returns the columns of ``SCHEMA`` plus the partition column
``date`` (string) and ``run_status`` (the run's effective status from its
manifest, :func:`jobs.results.runs.effective_status`); the per-run facts are
filled in from the manifests. A read holds the compaction lock shared and
skips the files a compacted file covers, so it sees every row exactly once
whatever compaction, writer or reader runs beside it. Files of older schema
versions read with nulls for the columns they lack; one of ours without a
version, or of a newer version, is a :class:`ResultsError` naming the file.
The dataset is the files this module and the compaction write (names
``part-<pid>-<32 hex>.parquet`` and ``run-<run id>-<hex>.parquet``): any
other ``.parquet`` file under ``ROOT`` is left where it is, unread, with a
:class:`ForeignFileWarning`. One of ours that cannot be read (truncated,
a damaged page) is moved to ``ROOT/_quarantine/`` beside a note of the
reason, with a :class:`QuarantineWarning`, and the rest of the dataset
reads on.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import re
import uuid
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from jobs.results import dataset, lock, runs
from jobs.results.atomic import write_atomically
from jobs.results.runs import RUN_FACTS
from kernels.validation import require_name
from jobs.results.schema import (SCHEMA, SCHEMA_VERSION, SCHEMA_VERSION_KEY,
                                 TRIGGERS, make_row, rows_to_table)

FILE_SCHEMA = pa.schema([f for f in SCHEMA if f.name not in ("suite", *RUN_FACTS)],
                        metadata=SCHEMA.metadata)
"""What a version-2 file holds: ``SCHEMA`` without the partition key and the
per-run facts."""
READ_SCHEMA = SCHEMA.append(pa.field("date", pa.string())).append(
    pa.field("run_status", pa.string()))
QUARANTINE_DIR = "_quarantine"
COVERS_KEY = b"lamport_lab.covers"
"""File metadata of a compacted file: the JSON list of the names of the
files in its folder whose rows it holds (:mod:`jobs.results.compaction`)."""
_OURS = re.compile(r"part-[0-9]+-[0-9a-f]{32}\.parquet|run-[A-Za-z0-9][A-Za-z0-9_.-]*\.parquet")
"""The names of results files: ``ResultsWriter``'s, and the compaction's
(``run-<run id>-<hex>``; ``run-<run id>`` from earlier versions)."""
_FORMAT = ds.ParquetFileFormat(default_fragment_scan_options=ds.ParquetFragmentScanOptions(
    page_checksum_verification=True))


class ResultsError(ValueError):
    """The dataset cannot be read as lamport-lab results (a file of a newer
    schema version, one of ours without a version, a lock held too long);
    the message names the file."""


class ResultsWarning(UserWarning):
    """Something in the dataset was not read; the message says what and why."""


class QuarantineWarning(ResultsWarning):
    """A results file could not be read and was moved aside."""


class ForeignFileWarning(ResultsWarning):
    """A ``.parquet`` file in the dataset that lamport-lab did not write;
    left where it is, unread."""


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
        self._marked = False

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
        if not self._marked:  # the folder is a dataset from its first rows on
            dataset.write_marker(self.root)
            self._marked = True
        return _write_atomically(_file_table(table), self.directory)


def _file_table(table: pa.Table) -> pa.Table:
    """``table`` (``SCHEMA`` columns) as a file holds it (``FILE_SCHEMA``)."""
    return table.select(FILE_SCHEMA.names).cast(FILE_SCHEMA)


def _write_atomically(table: pa.Table, directory: Path) -> Path:
    """Write ``table`` to a new file in ``directory`` via a hidden temp + rename."""
    name = f"part-{os.getpid()}-{uuid.uuid4().hex}.parquet"
    return write_atomically(directory / name, lambda sink: write_table(table, sink))


def write_table(table: pa.Table, sink) -> None:
    """How every results file is written: with page checksums, which readers verify."""
    pq.write_table(table, sink, write_page_checksum=True)


def row_counts(root: str | os.PathLike[str], run_id: str) -> Counter[str]:
    """Run ``run_id``'s rows under ``root`` by outcome, read back (every
    part's, self-check and compile check included; none: an empty Counter)."""
    if not Path(root).is_dir():
        return Counter()
    return Counter(read_results(root, filters={"run_id": run_id},
                                columns=["outcome"]).column("outcome").to_pylist())


def read_results(root: str | os.PathLike[str], filters: Filters = None,
                 columns: Sequence[str] | None = None) -> pa.Table:
    """Read the results under ``root`` as one Table.

    ``filters``: a pyarrow expression, or a mapping ``{column: value}`` where
    a list/tuple/set value means "any of"; partition columns (``date``,
    ``suite``) prune whole directories. ``columns``: names to return
    (default all of ``READ_SCHEMA``). Unknown names raise ValueError naming
    them; a missing ``root`` raises FileNotFoundError; an existing root
    without files gives an empty table. Files of a newer or unknown schema
    version raise :class:`ResultsError` naming the file.
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
    for attempt in range(2):
        try:
            with lock.shared(root) as held:
                table = _read_live(root, expression, columns, derived)
        except lock.LockTimeout as err:
            raise ResultsError(f"cannot read {root}: {err}") from None
        if held or not lock.exists(root):
            break  # read unlocked only where no compaction can have begun meanwhile
    wanted = (list(columns) if columns is not None else
              [*READ_SCHEMA.names, *(n for n in table.column_names if n not in READ_SCHEMA.names)])
    table = _fill_run_columns(root, table, [c for c in wanted if c in derived])
    if late:
        table = table.filter(_as_expression(late))
    return table.select(wanted)


def _read_live(root: Path, expression: pc.Expression | None, columns: Sequence[str] | None,
               derived: set[str]) -> pa.Table:
    """The rows of the live files (the caller holds the lock): every file of
    ours that reads and that no compacted file covers."""
    file_schema = pa.schema([f for f in READ_SCHEMA if f.name not in derived])
    for attempt in range(5):
        files = {str(f.path): f for f in live_files(root)}
        try:
            dataset = ds.dataset(list(files), schema=file_schema, format=_FORMAT,
                                 partitioning=_PARTITIONING, partition_base_dir=str(root))
            break
        except FileNotFoundError:  # set aside by another reader since the listing
            if attempt == 4:
                raise
    fragments = list(dataset.get_fragments(filter=expression))
    schema = pa.unify_schemas([file_schema, *(_checked_schema(files[f.path]) for f in fragments)])
    names = set(columns) if columns is not None else set(schema.names)
    read = [c for c in schema.names if c in names or (c == "run_id" and derived & names)]
    try:
        return dataset.replace_schema(schema).to_table(columns=read, filter=expression)
    except (pa.ArrowException, OSError):
        pass  # a damaged file among them: file by file, to set it aside
    tables = []
    for fragment in fragments:
        try:
            one = ds.dataset([fragment.path], schema=schema, format=_FORMAT,
                             partitioning=_PARTITIONING, partition_base_dir=str(root))
            tables.append(one.to_table(columns=read, filter=expression))
        except FileNotFoundError:
            continue  # another reader set it aside just now
        except (pa.ArrowException, OSError) as err:
            _quarantine(root, Path(fragment.path), err)
    return pa.concat_tables(tables) if tables else schema.empty_table().select(read)


@dataclasses.dataclass(frozen=True)
class DataFile:
    """One file of the dataset, as its footer describes it."""
    path: Path
    schema: pa.Schema
    covers: tuple[str, ...]
    """Names of the files in its folder whose rows it holds (a compacted
    file; :mod:`jobs.results.compaction`)."""
    run_id: str | None
    """The run whose rows alone it holds, from the footer's statistics
    (None: rows of several runs, or no statistics)."""


def is_ours(name: str) -> bool:
    """Whether a file name is one this store or the compaction writes."""
    return bool(_OURS.fullmatch(name))


def data_files(directory: Path, *, root: Path | None = None,
               only: Iterable[str] | None = None) -> list[DataFile]:
    """The files of ours in ``directory`` (``only``: of these names) whose
    footer reads, by name; one that does not is moved to quarantine when
    ``root`` is given (else skipped); any other ``.parquet`` file is skipped
    with a ForeignFileWarning."""
    out = []
    only = None if only is None else set(only)
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        name = entry.name
        if name.startswith((".", "_")) or not name.endswith(".parquet") or \
                (only is not None and name not in only):
            continue
        path = Path(entry.path)
        if not is_ours(name) or not entry.is_file(follow_symlinks=False):
            _warn_foreign(path)
            continue
        try:
            metadata = pq.read_metadata(path)
            schema = metadata.schema.to_arrow_schema()
        except FileNotFoundError:
            continue  # set aside or compacted just now
        except (pa.ArrowException, OSError) as err:
            if root is not None:
                _quarantine(root, path, err)
            continue
        raw = (schema.metadata or {}).get(COVERS_KEY)
        try:
            covers = tuple(str(n) for n in json.loads(raw)) if raw else ()
        except (TypeError, ValueError):
            covers = ()
        out.append(DataFile(path, schema, covers, _only_run(metadata)))
    return out


def _only_run(metadata: pq.FileMetaData) -> str | None:
    """The one run_id of a file's rows, from its row groups' statistics."""
    ids = set()
    try:
        leaves = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
        column = leaves.index("run_id")
        for i in range(metadata.num_row_groups):
            stats = metadata.row_group(i).column(column).statistics
            if stats is None or not stats.has_min_max:
                return None
            ids |= {stats.min, stats.max}
    except (pa.ArrowException, IndexError, ValueError):
        return None
    return ids.pop() if len(ids) == 1 and isinstance(next(iter(ids)), str) else None


def live(files: Sequence[DataFile]) -> list[DataFile]:
    """``files`` (one folder's) less those a compacted file among them covers."""
    covered = {name for f in files for name in f.covers}
    return [f for f in files if f.path.name not in covered]


def partitions(root: Path) -> list[Path]:
    """``root`` and every folder under it that may hold data files (none
    whose name starts with '.' or '_')."""
    out = []
    for directory, subdirs, _ in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith((".", "_")))
        out.append(Path(directory))
    return out


def live_files(root: Path) -> list[DataFile]:
    """The dataset's live files: every readable file of ours that no
    compacted file covers (unreadable ones are quarantined)."""
    return [f for d in partitions(root) for f in live(data_files(d, root=root))]


_warned: set[str] = set()


def _warn_foreign(path: Path) -> None:
    if str(path) not in _warned:
        _warned.add(str(path))
        warnings.warn(f"{path} is not a results file of lamport-lab (not a name it writes: "
                      f"part-<pid>-<uuid>.parquet, run-<run id>-<hex>.parquet); left where it "
                      f"is, not read", ForeignFileWarning, stacklevel=5)


def _quarantine(root: Path, path: Path, err: BaseException) -> None:
    """Move ``path`` (ours, unreadable) to ``_quarantine/``, a note of why beside it."""
    reason = f"{type(err).__name__}: {' '.join(str(err).split())}"
    target = root / QUARANTINE_DIR / path.relative_to(root).parent / f"{path.name}.quarantined"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
    except FileNotFoundError:
        return  # another reader set it aside first
    except OSError as move_err:
        where = f"left in place (cannot move it: {move_err}); skipped"
    else:
        where = f"moved to {target}"
        try:
            target.with_name(f"{target.name}.reason").write_text(
                f"{path}: not readable Parquet ({reason}); set aside by pid {os.getpid()} "
                f"at {dt.datetime.now(dt.timezone.utc).isoformat()}\n")
            where += " (the reason beside it)"
        except OSError:
            pass
    warnings.warn(f"results file {path} is not readable Parquet ({reason}); {where}; the "
                  f"rest of the dataset reads on", QuarantineWarning, stacklevel=5)


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


def _checked_schema(file: DataFile) -> pa.Schema:
    """The file's schema, after checking its version is readable."""
    schema = file.schema
    raw = (schema.metadata or {}).get(SCHEMA_VERSION_KEY)
    if raw is None:
        raise ResultsError(f"{file.path}: no {SCHEMA_VERSION_KEY.decode()} in its metadata; "
                           "not written by jobs.results")
    try:
        version = int(raw)
    except ValueError:
        raise ResultsError(f"{file.path}: {SCHEMA_VERSION_KEY.decode()} = {raw[:40]!r} is "
                           "not a version number; not written by jobs.results") from None
    if version > SCHEMA_VERSION:
        raise ResultsError(f"{file.path}: schema version {version} is newer than this "
                           f"reader's {SCHEMA_VERSION}; update lamport-lab")
    try:
        pa.unify_schemas([READ_SCHEMA, schema])
    except (pa.ArrowTypeError, pa.ArrowInvalid) as err:
        raise ResultsError(f"{file.path}: schema version {version} conflicts with "
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
