"""Command-line options every job shares: where results go and what started
the run."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_RESULTS = Path("results")


def add_results_arguments(p: argparse.ArgumentParser, *, suite: str) -> None:
    p.add_argument("--results", type=Path, default=DEFAULT_RESULTS,
                   help="results dataset directory (hive-partitioned Parquet; default: %(default)s)")
    p.add_argument("--no-results", action="store_true", help="print the table only, write no rows")
    p.add_argument("--trigger", default="adhoc", choices=("adhoc", "nightly", "ci"),
                   help="what started this run, recorded with every row (default: %(default)s)")
    p.add_argument("--suite", default=suite, help="results partition (default: %(default)s)")
    p.add_argument("--run-id", default=None, help="join an existing run (default: a new run id)")


def open_results(args: argparse.Namespace):
    """``(writer or None, environment columns)`` for a job's rows."""
    from jobs.results import ResultsWriter, env_info
    if args.no_results:
        return None, {}
    from jobs.results import runs
    writer = ResultsWriter(args.results, suite=args.suite, trigger=args.trigger, run_id=args.run_id)
    environment = env_info()
    if args.run_id is None:  # a run of its own (not one joined with --run-id): manifest it
        runs.begin(args.results, writer.run_id, trigger=args.trigger, facts=environment)
    return writer, environment


def report(writer, failures: int) -> None:
    """The closing line of a job; marks a run this process began finished."""
    if writer is not None:
        from jobs.results import runs
        runs.finish(writer.root, writer.run_id)
    where = f"results in {writer.directory} (run {writer.run_id})" if writer else "no results written"
    print(f"{'FAILED' if failures else 'OK'}: {failures} failing case(s); {where}", flush=True)
