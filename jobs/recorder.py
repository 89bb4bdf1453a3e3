"""The run recorder every job writes through (the nccl-tests shape): a job
supplies its cases and runs them; :class:`Run` owns the results rows (one
appended as each case ends, every failing one with its one-command repro),
the fixed-width table, the progress bar and the failure count. The Ray
session is :mod:`jobs.session`, the cluster's placements
:mod:`jobs.cluster_view`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobs import exits
from jobs.config import Case, Suite
from jobs.table import Col, Table, job_col, op_col

FAILING = ("fail", "hang", "error")

COLUMNS = [job_col(), op_col(), Col("tp", 3, "d"), Col("hidden", 6, "d"),
           Col("M", 4, "d"), Col("placement", 15), Col("inputs/fault", 22), Col("n", 3, "d"),
           Col("#wrong", 7, "d"), Col("max_ulp", 7, ".0f"), Col("median_us", 9, ".2f"),
           Col("p99_us", 9, ".2f"), Col("result", 7), Col("note", 48)]


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def selfcheck_key(name: str) -> str:
    """The planned case of the self-check's golden case ``name``."""
    return f"selfcheck/{name}"


def compile_key(op: str, variant: str, transport: str | None, tp: int | None,
                hidden: int | None, arch: str | None) -> str:
    """The planned case of a compile check row, from its columns (``extra.arch``
    among them): one variant on one arch (``jobs.compile_check.variant_key``)."""
    return f"compile-check/{op}/{variant}/{transport or '-'}/tp{tp}/h{hidden}/{arch}"


def row_case_key(job: str | None, variant: str | None, extra: dict, row: dict) -> str | None:
    """The planned case a results row completes (None: a further row of a
    case, e.g. a profile's baseline): ``extra.case_key`` of a kernel job's
    row (:meth:`jobs.config.Case.key`), the golden case of a self-check row
    (:func:`selfcheck_key`), variant x arch of a compile check row
    (:func:`compile_key`)."""
    if extra.get("case_key"):
        return extra["case_key"]
    if job == "selfcheck" and variant:
        return selfcheck_key(variant)
    if job == "compile-check":
        return compile_key(row["op"], variant, row["transport"], row["tp"], row["hidden"],
                           extra.get("arch"))
    return None


def done_in_run(results: Path, run_id: str, *, job: str | None = None) -> set[str]:
    """The planned cases run ``run_id`` holds a row of (:func:`row_case_key`),
    of every job or of ``job``."""
    import json

    from jobs.results import read_results
    filters = {"run_id": run_id, **({"job": job} if job else {})}
    table = read_results(results, filters=filters,
                         columns=["job", "op", "variant", "transport", "tp", "hidden", "extra"])
    keys = set()
    for row in table.to_pylist():
        key = row_case_key(row["job"], row["variant"], json.loads(row["extra"] or "{}"), row)
        if key:
            keys.add(key)
    return keys


def case_seed(case: Case, repeat: int = 0) -> int:
    """A seed that depends on the case, not on its position in a sweep, so a
    filtered re-run (the repro command) sees the same data."""
    return zlib.crc32(f"{case.op}/{case.tp}/{case.hidden}/{case.tokens}/{case.inputs}/"
                      f"{case.fault}/{repeat}".encode()) & 0x7FFFFFFF


def repro_command(case: Case, suite: Suite, backend: str, placement: str | None = None) -> str:
    """One command that reruns exactly ``case`` (every filter of its
    identity; ``placement`` where the run resolved ``auto``)."""
    parts = ["python -m jobs", case.job, suite.source, "--backend", backend,
             "--ops", case.op, "--tp", str(case.tp), "--hidden", str(case.hidden),
             "--tokens", str(case.tokens), "--variant", case.variant,
             "--transport", case.transport, "--placement", str(placement or case.placement)]
    if case.top_k is not None:
        parts += ["--top-k", str(case.top_k)]
    if case.hc is not None:
        parts += ["--hc", str(case.hc)]
    if case.op_args:
        parts += ["--op-args", ",".join(f"{k}={str(v).lower()}" for k, v in case.op_args)]
    if case.inputs:
        parts += ["--inputs", case.inputs]
    if case.fault:
        parts += ["--faults", case.fault]
    return " ".join(parts)


def closing_line(entry: dict) -> str:
    """``12.3 s, 40 cases, overhead 3.1x wall / summed case compute time
    (0.40 s), peak 3 groups at once`` from a :attr:`Run.accounting` entry."""
    parts = [f"{entry['wall_s']:.1f} s", f"{entry['cases']} case(s)"]
    if entry.get("interrupted"):
        parts[1] += " before it was interrupted"
    if entry.get("overhead") is not None:
        parts.append(f"service overhead {entry['overhead']:.1f}x = wall / {entry['work']} "
                     f"({entry['work_s']:.2f} s)")
    else:
        parts.append("service overhead n/a (no timed work)")
    if entry.get("peak_groups"):
        parts.append(f"peak {entry['peak_groups']} group(s) at once")
    if entry.get("build_s"):
        parts.append(f"group builds {entry['build_s']:.1f} s")
    if entry.get("prepare_s"):
        parts.append(f"kernel preparation {entry['prepare_s']:.1f} s")
    if entry.get("rebuilt_cases"):
        parts.append(f"{entry['rebuilt_cases']} case(s) rebuilt their group "
                     f"({entry['rebuilt_s']:.1f} s of case time)")
    if entry.get("phases_s"):
        from cluster.phases import describe
        parts.append(f"host time in cases, slowest rank: {describe(entry['phases_s'])}")
    return ", ".join(parts)


class _BarOut:
    """Table output that does not tear a progress bar on the same terminal."""

    def __init__(self, bar):
        self._bar = bar
        self._pending = ""

    def write(self, text: str) -> None:
        self._pending += text
        while "\n" in self._pending:
            line, self._pending = self._pending.split("\n", 1)
            self._bar.write(line, file=sys.stdout)

    def flush(self) -> None:
        sys.stdout.flush()


class Run:
    """One invocation's results: a writer per suite sharing one run id, the
    environment columns, the table, the counts, the failing rows."""

    def __init__(self, *, results: Path | None, trigger: str, run_id: str | None = None,
                 backend: str = "emulated", environment: dict | None = None) -> None:
        from jobs.results import new_run_id
        self.results = results
        self.trigger = trigger
        from cluster.group import RUN_TAG_ENV
        self.run_id = run_id or new_run_id()
        os.environ[RUN_TAG_ENV] = self.run_id  # names the run's mailbox segments
        self.backend = backend
        self.environment = dict(environment or {})
        self.counts: Counter[str] = Counter()
        self.failing: list[dict] = []
        self.rows_written = 0
        self.finished = False
        """Set by :meth:`finish` (the manifest says ``finished``)."""
        self.stopped_by: str | None = None
        """The signal :meth:`interrupted` handled (once)."""
        self.planned: set[str] = set()
        """The keys of the cases this invocation plans (:meth:`plan`): the
        run is ``finished`` only when each has its row (:meth:`finish`)."""
        if results is not None:
            from jobs.results import runs
            runs.begin(results, self.run_id, trigger=trigger, facts=self.environment,
                       keep_alive=True)
        self._writers: dict[str, Any] = {}
        self._table: Table | None = None
        self._bar = None
        self._lock = threading.RLock()  # groups run at once (cluster.fanout) and record here
        self._section: dict | None = None
        self._tags = threading.local()
        self.accounting: list[dict] = []
        """Per job section: wall_s, work_s (timed GPU work, or on the emulated
        backend the summed case compute time), overhead (wall / work), cases,
        peak_groups, build_s (group builds: :meth:`add_build`, summed over
        groups), prepare_s (kernel preparation: :meth:`add_prepare`,
        summed over groups), and where cases rebuilt their group (a rank killed:
        ``extra.rebuilt``) rebuilt_cases and their summed time rebuilt_s;
        phases_s: the cases' host time by phase (:meth:`add_phases`);
        also appended to the run's manifest as each section ends
        (``accounting``)."""
        self._skips: dict[str, list] = {}
        """A section's skip reasons: reason -> [footnote mark, cases]."""
        self.stopping = threading.Event()
        """Set when a job section ends by an exception (SIGINT's or SIGTERM's
        ``jobs.exits.Interrupted``): the cases its TP-group threads still finish are not
        recorded (cut short, they are run again by ``--resume``)."""

    def writer(self, suite: str):
        from jobs.results import ResultsWriter
        if self.results is None:
            return None
        if suite not in self._writers:
            self._writers[suite] = ResultsWriter(self.results, suite=suite, run_id=self.run_id,
                                                 trigger=self.trigger)
        return self._writers[suite]

    @contextlib.contextmanager
    def section(self, title: str, total: int) -> Iterator[None]:
        """A job's part of the run: a heading, a fresh table, progress with
        an ETA on stderr (a tqdm bar on a terminal, else a plain line every
        10% of the cases), and a closing line with the wall time and the
        service overhead (wall / timed work, :meth:`add_work`)."""
        from tqdm import tqdm
        print(f"\n== {title} ==", flush=True)
        t0 = time.monotonic()
        job = title.split(":", 1)[0]
        self._section = {"job": job, "t0": t0, "total": total, "done": 0, "work_s": 0.0,
                         "work_kind": None, "peak_groups": None, "next_line": 0.1,
                         "rebuilt_cases": 0, "rebuilt_s": 0.0, "build_s": 0.0,
                         "prepare_s": 0.0, "phases_s": {}}
        self._bar = tqdm(total=total, file=sys.stderr, leave=False, unit="case",
                         disable=not sys.stderr.isatty() or total < 2, dynamic_ncols=True)
        self._table = Table(COLUMNS, out=None if self._bar.disable else _BarOut(self._bar))
        self._skips = {}
        interrupted = False
        try:
            yield
        except BaseException:
            interrupted = True
            self.stop()
            raise
        finally:
            self._bar.close()
            self._bar = None
            if self._skips:
                print("   skipped, by reason:")
                for reason, (mark, n) in self._skips.items():
                    print(f"   [{mark}] {n} case(s): {reason}")
            sec, self._section = self._section, None
            wall = time.monotonic() - t0
            entry = {"job": job, "wall_s": round(wall, 3), "cases": sec["done"],
                     "work_s": round(sec["work_s"], 6), "work": sec["work_kind"],
                     "overhead": round(wall / sec["work_s"], 2) if sec["work_s"] > 0 else None,
                     "peak_groups": sec["peak_groups"]}
            if interrupted:
                entry["interrupted"] = True
            if sec["rebuilt_cases"]:
                entry.update(rebuilt_cases=sec["rebuilt_cases"],
                             rebuilt_s=round(sec["rebuilt_s"], 3))
            for key in ("build_s", "prepare_s"):
                if sec[key] > 0:
                    entry[key] = round(sec[key], 3)
            if sec["phases_s"]:
                from cluster.phases import rounded
                entry["phases_s"] = rounded(sec["phases_s"], 3)
            self.accounting.append(entry)
            if self.results is not None:
                from jobs.results import runs
                runs.add_accounting(self.results, self.run_id, entry)
            print(f"   ({closing_line(entry)})", flush=True)

    def stop(self) -> None:
        """Record no further row (:attr:`stopping`); a row being written now
        completes, and counts."""
        with self._lock:
            self.stopping.set()

    def add_work(self, seconds: float, kind: str) -> None:
        """Add timed work to the current job's overhead figure; ``kind``
        says what was timed (e.g. ``GPU kernel time`` or, on the emulated
        backend, ``summed case compute time``)."""
        with self._lock:
            if self._section is not None and seconds > 0:
                self._section["work_s"] += seconds
                self._section["work_kind"] = kind

    def add_group(self, group, kind: str) -> None:
        """A TP group's share of the current job's accounting as it closes:
        its timed work (:meth:`add_work`), its builds (``TPGroup.build_s``),
        its kernel preparation time
        (``TPGroup.prepare_s``: compiling, or loading from the compile cache,
        what its cases needed) and its cases' host time by phase
        (``TPGroup.phases_s``)."""
        self.add_work(group.work_s, kind)
        self.add_build(group.build_s)
        self.add_prepare(group.prepare_s)
        self.add_phases(group.phases_s)

    def add_phases(self, phases_s: dict) -> None:
        """Add cases' host time by phase (:mod:`cluster.phases`, seconds) to
        the current job's accounting."""
        from cluster.phases import add
        with self._lock:
            if self._section is not None:
                add(self._section["phases_s"], phases_s)

    def add_build(self, seconds: float) -> None:
        """Add a group's build (placing it, starting its processes, their
        imports and device set-up, the mailbox rendezvous) to the current
        job's accounting."""
        self._add("build_s", seconds)

    def add_prepare(self, seconds: float) -> None:
        """Add kernel preparation (compile or load from the compile cache,
        and what a first call sets up) to the current job's accounting."""
        self._add("prepare_s", seconds)

    def _add(self, key: str, seconds: float) -> None:
        with self._lock:
            if self._section is not None and seconds > 0:
                self._section[key] += seconds

    def note_fanout(self, fan) -> None:
        """Record the peak number of TP groups the current job ran at once."""
        with self._lock:
            if self._section is not None:
                self._section["peak_groups"] = fan.peak

    @contextlib.contextmanager
    def tagged(self, **extra: Any) -> Iterator[None]:
        """Within (on this thread): every row's ``extra`` also holds ``extra``
        (e.g. the node a TP group was pinned to and its ranks' nodes)."""
        old = getattr(self._tags, "extra", {})
        self._tags.extra = {**old, **extra}
        try:
            yield
        finally:
            self._tags.extra = old

    def _progress(self) -> None:
        """One case done: the bar, or off a terminal a plain line with the ETA
        every 10% of the job's cases."""
        sec = self._section
        if self._bar is not None:
            self._bar.update(1)
        if sec is None:
            return
        sec["done"] += 1
        if (self._bar is None or self._bar.disable) and sec["total"] >= 10 and \
                sec["done"] >= sec["next_line"] * sec["total"] and sec["done"] < sec["total"]:
            sec["next_line"] += 0.1
            elapsed = time.monotonic() - sec["t0"]
            eta = elapsed / sec["done"] * (sec["total"] - sec["done"])
            print(f"   [{sec['job']}] {sec['done']}/{sec['total']} cases, {elapsed:.0f} s, "
                  f"ETA {eta:.0f} s", file=sys.stderr, flush=True)

    def announce(self, text: str) -> None:
        """A line in the table, before a case runs (e.g. a rank killed on
        purpose, so the Ray message that follows is expected)."""
        out = self._table.out if self._table is not None else sys.stdout
        print(f"   >> {text}", file=out, flush=True)

    def record(self, case: Case | None, suite: Suite, **kwargs: Any) -> dict:
        """Append one row (as the case ends), print its table line; returns
        the row ({} and nothing written once :attr:`stopping` is set). Safe
        to call from the threads of concurrent groups.
        ``progress=False``: a further row of a case already counted (the
        profile writes one row per implementation of one case)."""
        with self._lock:
            if self.stopping.is_set():
                return {}  # a case the run's stop cut short: not a result
            return self._record(case, suite, **kwargs)

    def _record(self, case: Case | None, suite: Suite, *, outcome: str, started_at: dt.datetime,
                reason: str | None = None, note: str | None = None, extra: dict | None = None,
                placement: str | None = None, progress: bool = True, **fields: Any) -> dict:
        from jobs.results import make_row
        columns: dict[str, Any] = {}
        if case is not None:
            columns = dict(op=case.op, variant=case.variant, transport=case.transport,
                           placement=str(placement or case.placement), tp=case.tp,
                           hidden=case.hidden, tokens=case.tokens, top_k=case.top_k, hc=case.hc,
                           dtype=case.dtype, backend=self.backend)
        columns.update(fields)
        if case is not None:
            columns.setdefault("job", case.job)
            if outcome != "pass" and not columns.get("repro_command"):
                columns["repro_command"] = repro_command(case, suite, self.backend,
                                                         columns["placement"])
        info = {"suite_version": suite.version, "inputs": case.inputs if case else None,
                **getattr(self._tags, "extra", {}), **(extra or {})}
        if progress and case is not None:
            info.setdefault("case_key", case.key())  # this row completes the case
        row = make_row(started_at=started_at, finished_at=now(), outcome=outcome, reason=reason,
                       extra={k: v for k, v in info.items() if v is not None},
                       **{**self.environment, **columns})
        writer = self.writer(suite.name)
        if writer is not None:
            writer.append(row)
            self.rows_written += 1
        self.counts[outcome] += 1
        if outcome in FAILING:
            self.failing.append({**row, "suite": suite.name})
        if outcome == "skipped" and reason and self._table is not None:
            mark = self._skips.setdefault(reason, [len(self._skips) + 1, 0])
            mark[1] += 1
            note = note or f"see [{mark[0]}] below"
        if self._table is not None:
            what = (case.inputs or case.fault or ",".join(case.param("baselines", ()) or ())) if case else ""
            self._table.row([columns.get("job", "-"), columns.get("op"), columns.get("tp"),
                             columns.get("hidden"), columns.get("tokens"), columns.get("placement"),
                             what, columns.get("t_n") or (case.repeats if case else None),
                             columns.get("mismatches"), columns.get("max_ulp"),
                             columns.get("t_median_us"), columns.get("t_p99_us"), outcome,
                             note or reason or ""])
        if progress:
            if info.get("rebuilt") and self._section is not None:
                self._section["rebuilt_cases"] += 1
                self._section["rebuilt_s"] += (row["finished_at"] - started_at).total_seconds()
            self._progress()
        return row

    def plan(self, keys) -> None:
        """Add planned case keys (:func:`row_case_key`'s): every case of
        every job this invocation means to have a row of."""
        self.planned.update(keys)

    def missing(self) -> int:
        """Planned cases the run holds no row of (0 without rows written)."""
        if self.results is None or not self.planned:
            return 0
        return len(self.planned - done_in_run(self.results, self.run_id))

    def finish(self, *, compact: bool = False) -> int:
        """End the run in its manifest (a run is ``incomplete`` until then,
        once its driver is gone) and release its lease: ``finished`` when
        every planned case (:meth:`plan`) has its row, else ``incomplete``
        with the number missing, which is returned (0: finished);
        ``compact``: first rewrite its rows as one file per partition
        (``jobs.results.compact_run``)."""
        if self.results is None:
            return 0
        from jobs.results import runs
        self._compact(compact)
        missing = self.missing()
        runs.finish(self.results, self.run_id, counts=dict(self.run_counts()), missing=missing)
        self.finished = True
        return missing

    def close(self) -> None:
        """The driver is done with the run, however it ended: a run neither
        finished nor interrupted is marked ``incomplete`` and its lease
        released (idempotent; nothing to do for the others)."""
        if self.results is not None and not self.finished and self.stopped_by is None:
            from jobs.results import runs
            runs.release(self.results, self.run_id)

    def _compact(self, compact: bool) -> None:
        if compact and self._writers:
            from jobs.results import compact_run
            files = compact_run(self.results, self.run_id)
            if files:
                print(f"results: run {self.run_id} compacted into {len(files)} file(s)",
                      flush=True)

    def interrupted(self, stop, *, compact: bool, resume: str) -> None:
        """The run was stopped by ``stop`` (``jobs.exits.Interrupted``) after
        the case in hand (its section printed its closing line and wrote its
        accounting): the failing rows and counts, the rows compacted as
        :meth:`finish` would (``compact``), the manifest marked
        ``interrupted``, and ``resume``, the command that completes the run,
        printed. Once per run; a run already finished (the signal came
        during the dashboard build) is left as it is. Takes the row lock: a
        row being written completes first."""
        with self._lock:
            if self.stopped_by is not None:
                return
            self.stopped_by = stop.name
        if self.results is None:
            print(f"\n{stop.name}: stopped; nothing to resume (--no-results)", flush=True)
            return
        if self.finished:
            print(f"\n{stop.name}: stopped after run {self.run_id} finished", flush=True)
            return
        from jobs.results import runs
        self.summary()
        self._compact(compact)
        runs.interrupt(self.results, self.run_id, by=stop.name, counts=dict(self.run_counts()))
        print(f"\n{stop.name}: run {self.run_id} interrupted after the case in hand; "
              f"complete it (only the cases it lacks) with:\n  {resume}", flush=True)

    def count_external(self, outcome_counts: Counter[str]) -> None:
        """Fold in the counts of parts that write their own rows (selfcheck,
        compile-check)."""
        self.counts.update(outcome_counts)

    def run_counts(self) -> Counter[str]:
        """Rows by outcome: read back from the run's rows (every part of a
        run split in parts, self-check and compile check included), else
        (no rows: --no-results, or none written yet) this process's own count."""
        if self.results is None:
            return Counter(self.counts)
        from jobs.results.store import row_counts
        return row_counts(self.results, self.run_id) or Counter(self.counts)

    def summary(self) -> int:
        """Print the failing rows with their repro commands and the closing
        line (counts over every row of the run, self-check and compile
        check included, when rows were written); returns the number of
        failing cases."""
        counts = self.run_counts()
        n = max(sum(counts[o] for o in FAILING), sum(self.counts[o] for o in FAILING))
        if self.failing:
            print(f"\n{len(self.failing)} failing case(s), each with the command that reproduces it:")
            for row in self.failing:
                print(f"  [{row['outcome']}] {row['op']} tp={row['tp']} hidden={row['hidden']} "
                      f"M={row['tokens']}: {row['reason'] or ''}")
                print(f"      {row['repro_command']}")
        counts = ", ".join(f"{counts[o]} {o}" for o in ("pass", "fail", "hang", "error", "skipped"))
        where = (f"rows written to {self.results}/ (run {self.run_id})"
                 if self.results is not None else "no rows written (--no-results)")
        print(f"\n{counts}; {where}", flush=True)
        return n
