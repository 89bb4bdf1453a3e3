"""``python -m jobs compile-check``: compile every registered kernel variant
without a GPU and check its PTX.

The variants are the registered ops' (each op's declaration names the
kernel-side provider that turns the requested hidden sizes and tp values
into :class:`kernels.ptx_checks.Variant` objects; selection and defaults:
:mod:`jobs.compile_selection`). ``--suite NAME`` (or ``--config PATH``)
compiles what the suite's ``[compile_check]`` selects, as the nightly of that
suite does, its rows in the suite's partition; ``--arch``, ``--ops``,
``--hidden`` and ``--tp`` replace the suite's value of theirs. Without a
suite: every variant of every arch, its rows in ``suite=compile-check``.

Per variant and per arch: the PTX dump exists, targets the arch and holds
an ``.entry`` containing the variant's ``entry``, whose instruction lines
pass the variant's check (:func:`kernels.ptx_checks.check_variant`); unicast
and multicast publish twins differ only in their stores (:func:`check_pairs`).

Compiles go through the persistent compile cache (:mod:`kernels.compile_cache`):
a variant whose key (kernel sources, config, arch, CuTe DSL version) is
unchanged since an earlier run is not compiled again; its stored PTX is
checked. ``--all`` compiles every variant and replaces its entry.

Prints a fixed-width table with compile times (``cached`` where the cache
served the variant) and, from the kept cubin (:mod:`kernels.cubin_info`),
ptxas's registers a thread (``regs``) and stack frame bytes (``stack``:
local memory a thread, for spilled registers or local arrays); exit status 1
on any failure.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import glob
import os
import sys
import tempfile
import time
from collections.abc import Sequence

from jobs import compile_selection, exits
from jobs.compile_selection import (DEFAULT_ARCHS, DEFAULT_HIDDEN, DEFAULT_TP, check_selection,
                                    choose, registered_ops)
from jobs.options import (add_results_arguments, add_suite_arguments, int_list, open_results,
                          report, selected_suite, str_list)
from kernels.cubin_info import Resources, entry_resources
from kernels.ptx_checks import Variant, check_variant, entry_body, publish_pair_difference


# ---------------------------------------------------------------- the run
@dataclasses.dataclass
class Row:
    variant: Variant
    arch: str
    seconds: float = 0.0
    cached: bool = False
    ptx_kb: float = 0.0
    #: ptxas's registers a thread and stack frame bytes (local memory), from the
    #: kept cubin (None: no cubin, e.g. a compile-cache entry from before).
    resources: Resources | None = None
    errors: list[str] = dataclasses.field(default_factory=list)
    lines: list[str] = dataclasses.field(default_factory=list)
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def run_variant(v: Variant, arch: str, dump_root: str, index: int) -> Row:
    from kernels.compile_cache import stats
    row = Row(v, arch, started_at=_now())
    dump = os.path.join(dump_root, f"{index:04d}_{v.op}_{v.kernel}_{arch}")
    t0 = time.perf_counter()
    loaded = stats["loaded"]
    try:
        v.compile(arch, dump)
        row.cached = stats["loaded"] > loaded
    except Exception as exc:  # report every failure, keep going
        row.seconds = time.perf_counter() - t0
        row.finished_at = _now()
        row.errors.append(f"compile failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        return row
    row.seconds = time.perf_counter() - t0
    row.finished_at = _now()
    ptxs = sorted(glob.glob(os.path.join(dump, "*.ptx")), key=os.path.getmtime)
    if not ptxs:
        row.errors.append(f"no PTX dump in {dump}")
        return row
    ptx = open(ptxs[-1]).read()
    row.ptx_kb = len(ptx) / 1024
    if f".target {arch}" not in ptx:
        row.errors.append(f"PTX .target is not {arch}")
    name, row.lines = entry_body(ptx, v.entry)
    if name is None:
        row.errors.append(f"no .entry containing {v.entry!r}")
        return row
    cubins = sorted(glob.glob(os.path.join(dump, "*.cubin")), key=os.path.getmtime)
    if cubins:
        with open(cubins[-1], "rb") as f:
            row.resources = entry_resources(f.read(), name)
    row.errors += check_variant(row.lines, v)
    return row


def check_pairs(rows: list[Row]) -> None:
    """Unicast vs multicast publishes of the same (key, arch): the same
    code beyond their stores (:func:`kernels.ptx_checks.publish_pair_difference`);
    a difference is an error of the multicast row."""
    groups: dict[tuple, dict[str, Row]] = {}
    for r in rows:
        if r.variant.pair_key and r.lines:
            groups.setdefault((r.variant.pair_key, r.arch), {})[r.variant.transport] = r
    for pair in groups.values():
        if {"unicast", "multicast"} <= set(pair):
            diff = publish_pair_difference(pair["unicast"].variant.pair_key,
                                           pair["unicast"].lines, pair["multicast"].lines)
            if diff:
                pair["multicast"].errors.append(diff)


HEADER = (f"{'op':<16} {'kernel':<15} {'transport':<9} {'budget_ns':>9} {'hidden':>7} "
          f"{'tp':>3} {'arch':<8} {'compile_s':>9} {'ptx_kb':>7} {'regs':>4} {'stack':>5}  "
          f"status")


def format_row(r: Row) -> str:
    v = r.variant
    status = "ok" if not r.errors else "FAIL: " + "; ".join(r.errors)
    if r.cached:
        status += " (cached)"
    if v.detail:
        status += f"  [{v.detail}]"
    return (f"{v.op:<16} {v.kernel:<15} {v.transport:<9} {v.budget_ns:>9} "
            f"{'rt' if v.hidden is None else v.hidden:>7} {'rt' if v.tp is None else v.tp:>3} "
            f"{r.arch:<8} {r.seconds:>9.3f} {r.ptx_kb:>7.1f} "
            f"{r.resources.registers if r.resources else '-':>4} "
            f"{r.resources.stack_bytes if r.resources else '-':>5}  {status}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jobs compile-check",
                                description=__doc__.splitlines()[0])
    add_suite_arguments(p, section="compile_check",
                        default="no suite: every variant, the defaults below")
    p.add_argument("--arch", type=str_list(DEFAULT_ARCHS), default=None, metavar="A,B",
                   help=f"target arches, comma-separated: {', '.join(DEFAULT_ARCHS)} (the kernels "
                        f"use sm_90 features: clusters, DSMEM, multimem; default: the suite's, "
                        f"else all)")
    p.add_argument("--ops", type=str_list(), default=None, metavar="A,B",
                   help=f"comma-separated ops (default: the suite's, else every one with compile "
                        f"variants: {', '.join(registered_ops())})")
    p.add_argument("--hidden", type=int_list, default=None, metavar="N,M",
                   help=f"elements per token (default: the suite's, else "
                        f"{','.join(map(str, DEFAULT_HIDDEN))})")
    p.add_argument("--tp", type=int_list, default=None, metavar="N,M",
                   help=f"TP sizes (default: the suite's, else {','.join(map(str, DEFAULT_TP))})")
    p.add_argument("--dump-dir", default=None, help="keep the PTX here (default: a temp dir)")
    p.add_argument("--all", action="store_true",
                   help="compile every variant, also those the compile cache holds with an "
                        "unchanged key (their entries are replaced)")
    add_results_arguments(p, partition="compile-check")
    p.add_argument("--resume", action="store_true",
                   help="with --run-id: compile only the variants the run holds no row of "
                        "(and the publish twins their pair check needs, whose rows it has)")
    return p


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def variant_label(v: Variant) -> str:
    """A compile row's ``variant``: the kernel, its detail, its watchdog budget."""
    return (f"{v.kernel}" + (f"/{v.detail}" if v.detail else "")
            + (f"/watchdog={v.budget_ns}ns" if v.budget_ns else ""))


def variant_key(v: Variant, arch: str) -> str:
    """The planned case (``jobs.recorder.compile_key``) that the row
    :func:`result_row` writes for ``v`` on ``arch`` completes."""
    from jobs.recorder import compile_key
    return compile_key(v.op, variant_label(v), None if v.transport == "-" else v.transport,
                       v.tp, v.hidden, arch)


def planned_keys(ops: Sequence[str] | None, hiddens: Sequence[int], tps: Sequence[int],
                 archs: Sequence[str]) -> list[str]:
    """The case keys of a selection (``ops`` None: every registered op), in run order."""
    found = compile_selection.variants(ops if ops else registered_ops(), hiddens, tps)
    return [variant_key(v, arch) for arch in archs for v in found]


def result_row(r: Row, environment: dict) -> dict:
    """The results-store row of one compile (outcome pass/fail, never timed)."""
    from jobs.results import make_row
    v = r.variant
    repro = (f"python -m jobs compile-check --arch {r.arch} --ops {v.op}"
             + (f" --hidden {v.hidden}" if v.hidden else "") + (f" --tp {v.tp}" if v.tp else ""))
    return make_row(
        started_at=r.started_at, finished_at=r.finished_at, op=v.op, variant=variant_label(v),
        transport=None if v.transport == "-" else v.transport, backend="compile", job="compile-check",
        tp=v.tp, hidden=v.hidden, outcome="fail" if r.errors else "pass",
        reason="; ".join(r.errors) or None, repro_command=None if not r.errors else repro,
        extra={"arch": r.arch, "compile_s": round(r.seconds, 4), "ptx_kb": round(r.ptx_kb, 1),
               "cached": r.cached,
               "registers": r.resources.registers if r.resources else None,
               "stack_bytes": r.resources.stack_bytes if r.resources else None},
        **environment)


def main(argv: Sequence[str] | None = None) -> int:
    from jobs.config import ConfigError
    try:
        args = parse_args(argv)
    except SystemExit as exit_:  # argparse: 2 on bad usage, 0 for --help
        return int(exit_.code or 0)
    try:
        suite = selected_suite(args, "compile_check")
        chosen = choose(suite and suite.compile_check, arch=args.arch, ops=args.ops,
                        hidden=args.hidden, tp=args.tp)
        ops, hidden, tps = chosen["ops"], chosen["hidden"], chosen["tp"]
        check_selection(ops, hidden, tps)
        from jobs.outputs import check_compile_cache
        check_compile_cache()  # InfraError, exit 3: the machine's fault, not a kernel's
        writer, environment = open_results(args, suite)
    except (ConfigError, TypeError, ValueError) as err:
        print(f"compile-check: {err}", file=sys.stderr)
        return exits.USAGE
    t_import = time.perf_counter()
    import cutlass  # noqa: F401  (import time reported apart from compiles)
    t_import = time.perf_counter() - t_import
    try:
        variants = compile_selection.variants(ops, hidden, tps)
    except ValueError as exc:
        print(f"compile-check: {exc}", file=sys.stderr)
        return exits.USAGE
    done = _done(args, variants, chosen["arch"])

    tmp = None
    dump_root = args.dump_dir
    if dump_root is None:
        tmp = tempfile.TemporaryDirectory(prefix="compile-check-")
        dump_root = tmp.name
    rows: list[Row] = []
    print(HEADER)
    print("-" * len(HEADER))
    from kernels.compile_cache import cache_root, refreshing
    t0 = time.perf_counter()
    try:
        with refreshing() if args.all else contextlib.nullcontext():
            for arch in chosen["arch"]:
                for v in variants:
                    if variant_key(v, arch) in done.get("skip", ()):
                        continue
                    row = run_variant(v, arch, dump_root, len(rows))
                    rows.append(row)
                    if v.pair_key is None:  # publishes are checked in pairs below
                        print(format_row(row), flush=True)
                        if writer:
                            writer.append(result_row(row, environment))
        check_pairs(rows)
        for row in rows:
            if row.variant.pair_key is not None:
                print(format_row(row), flush=True)
                if writer and variant_key(row.variant, row.arch) not in done.get("keys", ()):
                    writer.append(result_row(row, environment))
    finally:
        if tmp is not None:
            tmp.cleanup()
    failed = [r for r in rows if r.errors]
    served = sum(r.cached for r in rows)
    total = time.perf_counter() - t0
    print("-" * len(HEADER))
    print(f"{len(rows)} variants: {len(rows) - served} compiled, {served} from the compile cache "
          f"({cache_root() or 'off'}), {len(failed)} failed, total {total:.1f} s "
          f"(import cutlass {t_import:.1f} s), PTX in {args.dump_dir or 'a temp dir (removed)'}")
    report(writer, len(failed), args)
    return 1 if failed else 0


def _done(args: argparse.Namespace, variants: list[Variant], archs: Sequence[str]) -> dict:
    """``--resume``: ``{"keys": the run's compile rows' case keys, "skip":
    the (variant, arch) not to compile}``: those with a row, unless a
    publish twin without one needs their PTX for its pair check (then it
    is compiled, the compile cache serving it, and not written again)."""
    if not args.resume:
        return {}
    from jobs.recorder import done_in_run
    keys = done_in_run(args.results, args.run_id, job="compile-check")
    twins: dict[tuple, list[str]] = {}
    for arch in archs:
        for v in variants:
            if v.pair_key is not None:
                twins.setdefault((v.pair_key, arch), []).append(variant_key(v, arch))
    skip = {variant_key(v, arch) for arch in archs for v in variants
            if variant_key(v, arch) in keys
            and all(k in keys for k in twins.get((v.pair_key, arch), ()))}
    planned = len(archs) * len(variants)
    held = sum(variant_key(v, arch) in keys for arch in archs for v in variants)
    again = planned - len(skip) - (planned - held)
    print(f"resume: run {args.run_id} holds {held} of these {planned} compile case(s) "
          f"already; compiling the other {planned - held}"
          + (f" (and again {again} publish twin(s) their pair check needs)" if again else ""),
          flush=True)
    return {"keys": keys, "skip": skip}


if __name__ == "__main__":
    sys.exit(main())
