"""Compaction: a run's per-case files of one partition rewritten as one file,
in place, without a reader of this package ever losing or doubling a row;
and :func:`compact`, a copy of a dataset as one file per run.

Why compact at all: a nightly writes one file per case (so a crash keeps
every case that ended), and reading many small files is slow; 30 nightlies
of 80 cases read in 9.7 s as 2400 per-case files and in 0.08 s as 30
compacted ones (docs/results/hardening_cpu_2026-12-01.md).

The protocol, per partition folder (``date=D/suite=S``) and run:

1. The compaction lists the folder's live files (:func:`jobs.results.store.live`:
   files of ours whose footer reads and that no compacted file covers),
   picks those holding rows of the run only (their footers' statistics
   say so), and reads them, holding no
   lock: writers go on appending (their new files are not among these),
   readers go on reading.
2. It writes their rows as one new file under a hidden temporary name,
   fsynced, whose metadata names the files it covers
   (:data:`jobs.results.store.COVERS_KEY`).
3. Holding the dataset's lock alone (:func:`jobs.results.lock.exclusive`;
   each read holds it shared), it checks that every file it covers is
   still there and covered by no other compacted file (else another
   compaction of the run came first: it gives up, having changed nothing),
   renames the new file into place (``run-<run id>-<hex>.parquet``, a new
   name: it never replaces a file), fsyncs the folder, unlinks the files it
   covers (and any file another compacted file there covers: what a
   compaction killed at this point leaves) and fsyncs again.
4. A reader skips every file that a compacted file in its folder covers.

A read holds the lock shared from its listing to its last row, so it sees
the folder as it was before a swap or as it is after it; and no row is
ever in two live files: from the rename on, the new file covers the old
ones, which readers skip until they are gone. A compaction killed before
the rename leaves a hidden temporary file (ignored); killed after it, the
covered files (skipped, and removed by the next compaction in the folder).
The kernel drops a killed process's lock. A compaction that cannot have
the lock within ``wait_s`` (a long read) leaves the run as it is: complete,
uncompacted.

Plain Parquet readers (pyarrow, DuckDB) know neither the lock nor covers:
they count a covered file's rows twice between the rename and the unlinks
(a few milliseconds), and after a compaction killed there until the next
compaction in the folder.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs.results import lock, runs
from jobs.results.atomic import fsync_directory, publish, write_hidden
from jobs.results.runs import RUN_FACTS
from jobs.results.schema import SCHEMA, SCHEMA_VERSION, SCHEMA_VERSION_KEY
from jobs.results.store import (COVERS_KEY, FILE_SCHEMA, DataFile, _file_table,
                                _write_atomically, data_files, live, partitions, read_results,
                                write_table)
from kernels.validation import require_name

LOCK_WAIT_S = 60.0
"""How long a compaction waits for the readers to let it swap its file in."""


def compact_run(root: str | os.PathLike[str], run_id: str, *,
                wait_s: float = LOCK_WAIT_S) -> list[Path]:
    """Rewrite run ``run_id``'s files under ``root`` in place as one file per
    partition folder (the protocol in the module docstring); returns the
    files written (none where the run is one file already, holds no rows,
    or the lock was not had within ``wait_s``). Files of older schema
    versions stay as they are."""
    require_name("run_id", run_id)
    root = Path(root)
    written = []
    for directory in partitions(root):
        new = _compact_folder(root, directory, run_id, wait_s)
        if new is not None:
            written.append(new)
    return written


def _version(file: DataFile) -> int | None:
    try:
        return int((file.schema.metadata or {})[SCHEMA_VERSION_KEY])
    except (KeyError, ValueError):
        return None


def _compact_folder(root: Path, directory: Path, run_id: str, wait_s: float) -> Path | None:
    files = data_files(directory)
    mine: list[DataFile] = []
    tables = []
    for file in live(files):
        if file.run_id != run_id or _version(file) != SCHEMA_VERSION:
            continue
        try:
            tables.append(pq.read_table(file.path, page_checksum_verification=True))
        except (pa.ArrowException, OSError):
            continue  # gone, or damaged: a reader sets it aside
        mine.append(file)
    names = [f.path.name for f in mine]
    if len(mine) == 1 and mine[0].covers:  # compact already: remove what a kill left, if any
        present = {f.path.name for f in files}
        if present & {n for f in files for n in f.covers}:
            _swap(root, directory, None, [], wait_s)
        return None
    if not mine:
        return None
    table = pa.concat_tables([t.cast(FILE_SCHEMA) for t in tables]).sort_by("started_at")
    table = table.replace_schema_metadata({**FILE_SCHEMA.metadata,
                                           COVERS_KEY: json.dumps(names).encode()})
    final = directory / f"run-{run_id}-{uuid.uuid4().hex[:12]}.parquet"
    temp = write_hidden(final, lambda sink: write_table(table, sink))
    return _swap(root, directory, (temp, final), names, wait_s)


def _swap(root: Path, directory: Path, new: tuple[Path, Path] | None, names: list[str],
          wait_s: float) -> Path | None:
    """Step 3 of the protocol: under the exclusive lock, rename ``new``
    (temporary file, final name) into place if every file of ``names`` is
    still there and uncovered, then unlink them and every covered file of
    the folder; returns the final name (None: given up, nothing changed but
    the removal of covered files)."""
    temp, final = new if new is not None else (None, None)
    with lock.exclusive(root, wait_s) as held:
        present = set(os.listdir(directory)) if held else set()
        covered = {name for f in data_files(directory, only=[n for n in present
                                                              if n.startswith("run-")])
                   for name in f.covers}
        if not held or any(n not in present or n in covered for n in names):
            if temp is not None:
                temp.unlink(missing_ok=True)
            return None
        if temp is not None:
            publish(temp, final, overwrite=False)
        for name in sorted((covered & present) | set(names)):
            (directory / name).unlink(missing_ok=True)
        fsync_directory(directory)
    return final


def compact(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> list[Path]:
    """Copy the dataset under ``src`` to the new directory ``dst`` as one file
    per (date, suite, run) instead of one per case; returns the files
    written. ``src`` is left as it is (swap the directories once ``dst`` reads
    back the same). Each file is written atomically, in the current schema
    version (older files read with nulls for what they lack). ValueError,
    before anything is written, when ``dst`` exists and is not an empty
    directory (compaction never mixes into a dataset) or when one of the
    two lies inside the other."""
    src, dst = Path(src), Path(dst)
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise ValueError(f"compact: {str(dst)!r} exists and is not "
                         + ("empty" if dst.is_dir() else "a directory"))
    a, b = src.resolve(), dst.resolve()
    if a == b or a.is_relative_to(b) or b.is_relative_to(a):
        raise ValueError(f"compact: {str(dst)!r} and {str(src)!r} overlap (one is, or is "
                         f"inside, the other): every reader of {str(src)!r} would read the "
                         f"copy's rows too")
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
