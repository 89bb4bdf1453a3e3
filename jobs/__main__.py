"""``python -m jobs <command>``: the service's entry point, also under
``ray job submit --working-dir . -- python -m jobs <command>``.

Commands:
  smoke          what a fresh machine can run today: the reference self-check
                 and the sm_90a kernel compile check, with results written
  selfcheck      recompute every golden vector with the torch references
  compile-check  compile every registered kernel variant (no GPU needed) and
                 check its PTX

Exit status: 0 when every case passed, 1 when any failed, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import sys

from jobs import selfcheck
from jobs.options import add_results_arguments, open_results, report


def _selfcheck(args: argparse.Namespace) -> int:
    writer, environment = open_results(args)
    failures = selfcheck.run(args, writer, environment)
    report(writer, failures)
    return 1 if failures else 0


def _smoke(args: argparse.Namespace) -> int:
    from jobs import compile_check
    writer, environment = open_results(args)
    print("== reference self-check: golden vectors recomputed with the torch references ==")
    failures = selfcheck.run(argparse.Namespace(case=None), writer, environment)
    print("\n== kernel compile check: every kernel variant compiled for sm_90a, PTX checked ==")
    compile_argv = ["--arch", "sm_90a", "--trigger", args.trigger, "--suite", args.suite]
    compile_argv += (["--no-results"] if writer is None
                     else ["--results", str(args.results), "--run-id", writer.run_id])
    compile_failed = compile_check.main(compile_argv) != 0
    print("\nsmoke: ran the reference self-check and the kernel compile check; no kernel was "
          "launched (the GPU correctness, fault and profile jobs are not built yet).")
    report(writer, failures + compile_failed)
    return 1 if failures or compile_failed else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["compile-check"]:  # it owns its options
        from jobs import compile_check
        return compile_check.main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m jobs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("smoke", help="reference self-check + kernel compile check")
    add_results_arguments(p, suite="smoke")
    p.set_defaults(func=_smoke)
    p = sub.add_parser("selfcheck", help="recompute the golden vectors")
    add_results_arguments(p, suite="selfcheck")
    selfcheck.add_arguments(p)
    p.set_defaults(func=_selfcheck)
    sub.add_parser("compile-check", help="compile kernel variants and check the PTX "
                   "(see python -m jobs compile-check --help)")
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
