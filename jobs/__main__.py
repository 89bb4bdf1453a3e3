"""``python -m jobs <command>``: the service's entry point, also under
``ray job submit --working-dir . -- python -m jobs <command>``.

Commands:
  smoke          what a fresh machine can run today: the reference self-check
                 and the kernel compile check, with results written
  selfcheck      recompute every golden vector with the torch references
  compile-check  compile every registered kernel variant (no GPU needed) and
                 check its PTX

Exit status: 0 when every case passed, 1 when any failed, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jobs import selfcheck

DEFAULT_RESULTS = Path("results")


def _results_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results", type=Path, default=DEFAULT_RESULTS,
                   help="results dataset directory (hive-partitioned Parquet; default: %(default)s)")
    p.add_argument("--no-results", action="store_true", help="print the table only, write no rows")
    p.add_argument("--trigger", default="adhoc", choices=("adhoc", "nightly", "ci"),
                   help="what started this run, recorded with every row (default: %(default)s)")


def _writer(args: argparse.Namespace, suite: str, run_id: str | None = None):
    if args.no_results:
        return None
    from jobs.results import ResultsWriter
    return ResultsWriter(args.results, suite=suite, trigger=args.trigger, run_id=run_id)


def _selfcheck(args: argparse.Namespace) -> int:
    from jobs.results import env_info
    writer = _writer(args, "selfcheck")
    failures = selfcheck.run(args, writer, env_info())
    _report(writer, failures)
    return 1 if failures else 0


def _compile_check(argv: list[str]) -> int:
    from jobs import compile_check
    return compile_check.main(argv)


def _smoke(args: argparse.Namespace) -> int:
    from jobs.results import env_info
    writer = _writer(args, "smoke")
    print("== reference self-check (golden vectors, CPU) ==")
    failures = selfcheck.run(argparse.Namespace(case=None), writer, env_info())
    print("\n== kernel compile check (no GPU needed) ==")
    compile_argv = ["--arch", "sm_90a", "--quick"]
    if writer is not None:
        compile_argv += ["--results", str(args.results), "--run-id", writer.run_id,
                         "--suite", "smoke", "--trigger", args.trigger]
    compile_failures = _compile_check(compile_argv)
    print("\nsmoke: ran the reference self-check and the sm_90a kernel compile check only; "
          "no kernel was launched (the GPU correctness, fault and profile jobs are not built yet).")
    _report(writer, failures + compile_failures)
    return 1 if failures or compile_failures else 0


def _report(writer, failures: int) -> None:
    where = f"results in {writer.directory} (run {writer.run_id})" if writer else "no results written"
    print(f"{'FAILED' if failures else 'OK'}: {failures} failing case(s); {where}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["compile-check"]:
        return _compile_check(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m jobs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("smoke", help="reference self-check + kernel compile check")
    _results_options(p)
    p.set_defaults(func=_smoke)
    p = sub.add_parser("selfcheck", help="recompute the golden vectors")
    _results_options(p)
    selfcheck.add_arguments(p)
    p.set_defaults(func=_selfcheck)
    sub.add_parser("compile-check", help="compile kernel variants and check the PTX "
                   "(see python -m jobs compile-check --help)")
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
