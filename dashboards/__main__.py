"""``python -m dashboards``: build the perf team's static site, or look at it.

  build  --results DIR --out SITE     write SITE/index.html and the other pages
  serve  [--site SITE] [--results DIR] [--port N] [--seconds S]
         serve SITE on 127.0.0.1 (built from DIR first when --results is given)

Exit status: 0 on success; 2 on bad usage, nothing written: a missing
results folder or one that is not a lamport-lab dataset (nor empty), an
--out that cannot be written or is not a site built here, a --port in use;
3 when the site was built but some page failed: each is an error page naming
the exception, and one line on stderr names it (the nightly reports this as
infrastructure and keeps the run's own exit status).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_SITE = Path("site")


def main(argv: list[str] | None = None) -> int:
    from jobs.options import path_arg  # ~ expanded, names too long refused, as for the jobs
    parser = argparse.ArgumentParser(prog="python -m dashboards", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the static site from a results dataset")
    b.add_argument("--results", type=path_arg, required=True, help="results dataset directory")
    b.add_argument("--out", type=path_arg, default=DEFAULT_SITE, help="site directory "
                   "(replaced whole when it is a site built here, i.e. holds the .lamport-lab-site "
                   "marker; a new or empty directory otherwise; default: %(default)s)")
    s = sub.add_parser("serve", help="serve a built site on 127.0.0.1 for a while")
    s.add_argument("--site", type=path_arg, default=DEFAULT_SITE, help="default: %(default)s")
    s.add_argument("--results", type=path_arg, help="build the site from this dataset first")
    s.add_argument("--port", type=int, default=8765, help="default: %(default)s (0: any free)")
    s.add_argument("--seconds", type=float, default=900.0,
                   help="stop after this long, at most a week (default: %(default)s)")
    args = parser.parse_args(argv)
    from dashboards.build import PAGES_FAILED, build
    failures = []
    try:
        if args.command == "serve":  # before a build spends its time
            from dashboards.serve import check_port, check_serve_args
            check_serve_args(args.port, args.seconds)
            check_port(args.port)
        if args.command == "build" or args.results is not None:
            out = args.out if args.command == "build" else args.site
            built = build(args.results, out)
            failures = built.failures
            print(f"site: {built.index}", flush=True)
            for failure in failures:
                print(f"python -m dashboards {args.command}: {failure.line()}", file=sys.stderr,
                      flush=True)
        if args.command == "serve":
            from dashboards.serve import serve
            serve(args.site, args.port, args.seconds)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"python -m dashboards {args.command}: {err}", file=sys.stderr)
        return 2
    return PAGES_FAILED if failures else 0


if __name__ == "__main__":
    sys.exit(main())
