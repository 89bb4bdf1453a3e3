"""``python -m jobs selfcheck``: recompute every committed golden vector with
the current torch references and record one result row per case.

It checks the references, not the kernels: a failure means a reference (or
torch's arithmetic on this machine) no longer produces the pinned bits.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time

from jobs.results import ResultsWriter, make_row
from jobs.table import Col, Table
from cluster.ops import golden_cases

COLUMNS = [Col("case", 34), Col("op", 20), Col("elements", 9, "d"), Col("#wrong", 7, "d"),
           Col("max_ulp", 8, ".0f"), Col("ms", 7, ".1f"), Col("result", 6)]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--case", action="append", metavar="NAME",
                   help=f"only this golden case (repeatable); known: "
                        f"{', '.join(sorted(golden_cases()))}")


def run(args: argparse.Namespace, writer: ResultsWriter | None, environment: dict) -> int:
    """Check the cases, print the table, append a row per case; returns the
    number of cases that did not pass."""
    from kernels.reference import golden  # torch: imported when the check runs, not for --help
    cases = golden_cases()
    names = args.case or sorted(cases)
    unknown = sorted(set(names) - set(cases))
    if unknown:
        raise SystemExit(f"unknown golden case(s) {unknown}; known: {sorted(cases)}")
    table = Table(COLUMNS)
    failures = 0
    for name in names:
        case = cases[name]
        started = dt.datetime.now(dt.timezone.utc)
        t0 = time.perf_counter()
        try:
            verdict = golden.verify_golden(name, case.compute)
            outcome = "pass" if verdict.passed else "fail"
            reason = "; ".join(verdict.problems) or None
        except Exception as exc:  # a broken reference is a result, not a crash
            verdict, outcome, reason = golden.Verdict(), "error", f"{type(exc).__name__}: {exc}"
        failures += outcome != "pass"
        table.row([name, case.op, verdict.elements, verdict.mismatches, verdict.max_ulp,
                   (time.perf_counter() - t0) * 1e3, outcome])
        if writer is not None:
            writer.append(make_row(
                started_at=started, finished_at=dt.datetime.now(dt.timezone.utc),
                op=case.op, variant=name, backend="cpu-reference", placement="host",
                outcome=outcome, reason=reason, mismatches=verdict.mismatches,
                elements=verdict.elements, max_ulp=verdict.max_ulp,
                repro_command=f"python -m jobs selfcheck --case {name}",
                job="selfcheck", **environment))
    return failures
