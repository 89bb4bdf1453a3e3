"""Command-line options every job shares: where results go and what started
the run."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from jobs.outputs import check_writable_dir  # noqa: F401 (its home; imported from here too)

DEFAULT_RESULTS = Path("results")


def _items(text: str) -> list[str]:
    """The comma-separated items of ``text``; an empty item (``2,,4``, a
    trailing comma) or no item at all is an error naming the text."""
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list without empty items, got {text!r}")
    return items


def int_list(text: str) -> tuple[int, ...]:
    """Positive integers, comma-separated (``1,2,4``)."""
    try:
        values = tuple(int(t) for t in _items(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def str_list(choices: Sequence[str] | None = None) -> Callable[[str], tuple[str, ...]]:
    """An argparse type: comma-separated names, each one of ``choices``
    when given."""
    def parse(text: str) -> tuple[str, ...]:
        values = tuple(_items(text))
        bad = [v for v in values if choices is not None and v not in choices]
        if bad:
            raise argparse.ArgumentTypeError(
                f"unknown value(s) {bad} in {text!r}; allowed: {', '.join(choices)}")
        return values
    parse.__name__ = "list"  # argparse names the type in its messages
    return parse


POOL_MODES = ("job", "off")


def pool_choice(text: str) -> str:
    """``--pool``: ``job`` (a worker pool of this run's own), ``off`` (every
    TP group starts rank actors of its own, today's path before pools) or
    the name of a standing pool (letters, digits, ``_``, ``-``, ``.``)."""
    from kernels.validation import require_name
    if text in POOL_MODES:
        return text
    try:
        require_name("--pool", text)
    except (TypeError, ValueError) as err:
        raise argparse.ArgumentTypeError(f"{err}; or one of {', '.join(POOL_MODES)}") from None
    return text


def number(name: str) -> Callable[[str], float | int]:
    """An argparse type: a number within ``jobs.limits.LIMITS[name]`` (an
    integer where the limit says so; ``inf``, ``nan`` and overflowing
    values are refused: a deadline must end, a size must fit)."""
    from jobs.limits import LIMITS
    limit = LIMITS[name]

    def parse(text: str) -> float | int:
        try:
            value = int(text) if limit.integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if limit.integer else 'a number'} in "
                f"{limit.bounds()}, got {text!r}") from None
        try:
            return limit.check(value)
        except (TypeError, ValueError) as err:
            raise argparse.ArgumentTypeError(f"{text!r}: {err}") from None
    parse.__name__ = "number"  # argparse names the type in its messages
    return parse


def name_arg(text: str) -> str:
    """An argparse type: an ASCII word (:data:`kernels.validation.NAME_PATTERN`:
    it names a file or a results partition)."""
    from kernels.validation import require_name
    try:
        return require_name("value", text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).replace("value must be", "must be")) from None


NAME_MAX = 255
"""Most bytes in one path component (Linux's, every common file system's)."""
PATH_MAX = 4096
"""Most bytes in a path the kernel takes (Linux's ``PATH_MAX``)."""
PATH_ROOM = 512
"""Bytes a path option leaves for what lamport-lab makes inside it
(``date=.../suite=.../part-<pid>-<uuid>.parquet``, a site's pages)."""


def _shown(text: str, width: int = 80) -> str:
    """``text`` for an error line: repr'd, cut to about ``width`` characters."""
    return repr(text) if len(text) <= width else f"{text[:width // 2]!r}...({len(text)} chars)"


def path_arg(text: str) -> Path:
    """An argparse type: a path, not empty (``''`` would be the current
    directory), without NUL, with ``~`` and ``~user`` expanded (as a shell
    would have: no option makes a folder named ``~``), no component longer
    than ``NAME_MAX`` bytes and the whole, made absolute, at most
    ``PATH_MAX - PATH_ROOM`` bytes (the kernel's ENAMETOOLONG, refused
    here by name instead of half-way through a run)."""
    if not text.strip() or "\0" in text:
        raise argparse.ArgumentTypeError(f"expected a path, got {_shown(text)}")
    try:
        path = Path(text).expanduser()
    except RuntimeError:  # ~user of no such user, or no home directory
        raise argparse.ArgumentTypeError(f"cannot expand ~ in {_shown(text)}: no such "
                                         f"user or home directory") from None
    try:
        parts = [os.fsencode(p) for p in path.parts]
        whole = os.fsencode(os.path.abspath(path))
    except (UnicodeError, ValueError):
        raise argparse.ArgumentTypeError(f"{_shown(text)} cannot be a file name") from None
    long = [p for p in parts if len(p) > NAME_MAX]
    if long:
        raise argparse.ArgumentTypeError(
            f"a component of {len(long[0])} bytes in {_shown(text)}; at most {NAME_MAX}")
    if len(whole) > PATH_MAX - PATH_ROOM:
        raise argparse.ArgumentTypeError(
            f"{_shown(text)} is {len(whole)} bytes long made absolute; at most "
            f"{PATH_MAX - PATH_ROOM} (room for what is written inside it)")
    return path


MAX_GROUPS_PER_GPU = 8
"""Most one-GPU groups ``--groups-per-gpu`` lets share one GPU."""


def check_groups_per_gpu(value) -> int:
    """``value`` if it is an int in 1..MAX_GROUPS_PER_GPU, else ValueError naming it."""
    if not isinstance(value, int) or isinstance(value, bool) \
            or not 1 <= value <= MAX_GROUPS_PER_GPU:
        raise ValueError(f"groups_per_gpu must be an integer in 1..{MAX_GROUPS_PER_GPU}, "
                         f"got {value!r}")
    return value


def groups_per_gpu(text: str) -> int:
    """``--groups-per-gpu``: an integer in 1..MAX_GROUPS_PER_GPU."""
    try:
        return check_groups_per_gpu(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an integer in 1..{MAX_GROUPS_PER_GPU}, got {text!r}") from None


def add_suite_arguments(p: argparse.ArgumentParser, *, section: str, default: str) -> None:
    """``--suite NAME`` | ``--config PATH`` of a job that is not a sweep
    (compile-check, selfcheck): the suite's ``[section]`` selects what the
    job runs, as ``--suite`` selects a sweep job's cases; ``default`` says
    what runs without either (:func:`selected_suite` loads it)."""
    from jobs.config import bundled_suites
    which = p.add_mutually_exclusive_group()
    which.add_argument("--suite", type=name_arg, default=None, metavar="NAME",
                       help=f"run what a bundled suite's [{section}] selects: "
                            f"{', '.join(bundled_suites())} (default: {default}); the rows go "
                            f"to its partition (suite=NAME)")
    which.add_argument("--config", type=path_arg, default=None, metavar="PATH",
                       help=f"the same from a suite file's [{section}] (format in jobs/config.py)")


def selected_suite(args: argparse.Namespace, section: str):
    """The :class:`jobs.config.Suite` that ``--suite`` / ``--config`` name
    (None: neither); ConfigError for an unknown name, a bad file or a suite
    without ``[section]``."""
    from jobs.config import ConfigError, load_suite, suite_path
    if args.suite is None and args.config is None:
        return None
    suite = load_suite(suite_path(args.suite) if args.suite is not None else args.config)
    if getattr(suite, section) is None:
        raise ConfigError(f"{suite.source}: the suite has no [{section}] section")
    return suite


def add_results_arguments(p: argparse.ArgumentParser, *, partition: str) -> None:
    p.add_argument("--results", type=path_arg, default=DEFAULT_RESULTS,
                   help="results dataset directory (hive-partitioned Parquet; default: %(default)s)")
    p.add_argument("--no-results", action="store_true", help="print the table only, write no rows")
    p.add_argument("--trigger", default="adhoc", choices=("adhoc", "nightly", "ci"),
                   help="what started this run, recorded with every row (default: %(default)s)")
    p.add_argument("--partition", type=name_arg, default=None, metavar="NAME",
                   help=f"results partition of the rows (suite=NAME; selects nothing; default: "
                        f"the --suite's or --config's name, else {partition})")
    p.set_defaults(default_partition=partition)
    p.add_argument("--run-id", type=name_arg, default=None,
                   help="join an existing run (default: a new run id)")


def open_results(args: argparse.Namespace, suite=None):
    """``(writer or None, environment columns)`` for a job's rows, in the
    partition ``--partition`` names, else ``suite``'s (the one ``--suite``
    or ``--config`` selected), else the job's own; ConfigError when
    ``--results`` cannot hold them (:func:`jobs.outputs.check_results`).

    The run's lease (:mod:`jobs.results.lease`) is taken here, before any
    row: a run of its own, or one joined with ``--run-id`` that no live
    driver holds (ManifestError, a ValueError, naming the live one
    otherwise: two drivers never write one run); :func:`report` ends what
    this job took. A run this process already drives (the nightly's own
    compile check) is joined as it is."""
    from jobs.outputs import check_results
    from jobs.results import ResultsWriter, env_info
    if args.no_results:
        return None, {}
    check_results("--results", args.results)
    from jobs.results import runs
    partition = args.partition or (suite.name if suite is not None else args.default_partition)
    writer = ResultsWriter(args.results, suite=partition, trigger=args.trigger, run_id=args.run_id)
    environment = env_info()
    args.took_run = args.run_id is None or not runs.drives(args.results, args.run_id)
    if args.took_run:
        runs.begin(args.results, writer.run_id, trigger=args.trigger, facts=environment,
                   keep_alive=args.run_id is not None)
    return writer, environment


def report(writer, failures: int, args: argparse.Namespace) -> None:
    """The closing line of a job; marks the run finished and releases its
    lease when this job took it (:func:`open_results`; not when it joined
    one this process drives: e.g. the nightly's compile check, whose run
    the nightly finishes)."""
    if writer is not None and args.took_run:
        from jobs.results import runs
        from jobs.results.store import row_counts
        runs.finish(writer.root, writer.run_id,
                    counts=dict(row_counts(writer.root, writer.run_id)))
    where = (f"rows written to {writer.directory}/ (run {writer.run_id})" if writer
             else "no rows written (--no-results)")
    print(f"{'FAILED' if failures else 'OK'}: {failures} failing case(s); {where}", flush=True)
