"""``python -m dashboards``: build the perf team's static site, or look at it.

  build  --results DIR --out SITE     write SITE/index.html and the other pages
  serve  [--site SITE] [--results DIR] [--port N] [--seconds S]
         serve SITE on 127.0.0.1 (built from DIR first when --results is given)

Exit status: 0 on success, 2 on bad usage or a missing results folder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_SITE = Path("site")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the static site from a results dataset")
    b.add_argument("--results", type=Path, required=True, help="results dataset directory")
    b.add_argument("--out", type=Path, default=DEFAULT_SITE, help="site directory "
                   "(replaced whole when it is a site built here, i.e. holds the .lamport-lab-site "
                   "marker; a new or empty directory otherwise; default: %(default)s)")
    s = sub.add_parser("serve", help="serve a built site on 127.0.0.1 for a while")
    s.add_argument("--site", type=Path, default=DEFAULT_SITE, help="default: %(default)s")
    s.add_argument("--results", type=Path, help="build the site from this dataset first")
    s.add_argument("--port", type=int, default=8765, help="default: %(default)s (0: any free)")
    s.add_argument("--seconds", type=float, default=900.0,
                   help="stop after this long, at most a week (default: %(default)s)")
    args = parser.parse_args(argv)
    from dashboards.build import build_site
    try:
        if args.command == "serve":  # before a build spends its time
            from dashboards.serve import check_serve_args
            check_serve_args(args.port, args.seconds)
        if args.command == "build" or args.results is not None:
            out = args.out if args.command == "build" else args.site
            index = build_site(args.results, out)
            print(f"site: {index}")
        if args.command == "serve":
            from dashboards.serve import serve
            serve(args.site, args.port, args.seconds)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"python -m dashboards {args.command}: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
