"""python -m jobs COMMAND: the service's entry point, also run by
ray job submit --working-dir . -- python -m jobs COMMAND (see `submit`).

Cluster: with no --address and no RAY_ADDRESS a job starts an embedded local
Ray cluster for its run; with either, it joins that cluster. --backend auto
runs on GPUs when the cluster has some and a gpu backend is registered, else
on the emulated backend, and says which.

Git commit: rows record `git rev-parse HEAD` of the checkout, or
LAMPORT_GIT_COMMIT when set (`submit` sets it for the job: ray job submit
--working-dir uploads no .git).

A submitted job is followed with `status`, `logs` and `stop` JOB_ID, which
reach the head recorded by `head start` (or --address) with its token.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

from jobs import exits, limits

try:  # first: an installed op that cannot register is one line, not a traceback
    import cluster.ops  # noqa: F401
except (ImportError, TypeError, ValueError) as _err:
    print(f"python -m jobs: an op cannot be registered: {_err}", file=sys.stderr)
    sys.exit(exits.USAGE)
from jobs.config import ConfigError, Filters, bundled_suites, load_suite, select, suite_path
from jobs.exits import InfraError, Interrupted
from jobs.head import DASHBOARD_MODES, DEFAULT_HEAD_DIR, HEAD_DIR_ENV
from jobs.options import (DEFAULT_RESULTS, add_results_arguments, add_suite_arguments,
                          groups_per_gpu, int_list, name_arg, number, open_results, path_arg,
                          pool_choice, report, selected_suite, str_list)

DEFAULT_SITE = Path("site")


# ----------------------------------------------------------------- options
def _add_sweep_arguments(p: argparse.ArgumentParser, *, suite: str, trigger: str) -> None:
    which = p.add_mutually_exclusive_group()
    which.add_argument("--suite", type=str_list(), default=None,
                       help=f"bundled suite(s), comma-separated: {', '.join(bundled_suites())} "
                            f"(default: {suite})")
    which.add_argument("--config", type=path_arg, action="append", default=None, metavar="PATH",
                       help="a suite file (repeatable); format in jobs/config.py")
    p.set_defaults(default_suite=suite)
    p.add_argument("--results", type=path_arg, default=DEFAULT_RESULTS,
                   help="results dataset directory (default: %(default)s)")
    p.add_argument("--no-results", action="store_true", help="print the tables only, write no rows")
    p.add_argument("--trigger", default=trigger, choices=("adhoc", "nightly", "ci"),
                   help="what started this run, recorded with every row (default: %(default)s)")
    p.add_argument("--run-id", type=name_arg, default=None,
                   help="join an existing run (default: a new run id)")
    p.add_argument("--resume", action="store_true",
                   help="with --run-id: run only the cases the run does not hold yet (a run "
                        "cut short, or a nightly part stopped by its time limit)")
    p.add_argument("--address", default=None,
                   help="Ray cluster to join (GCS address, e.g. 10.0.0.1:6379, or 'auto'); "
                        "default: RAY_ADDRESS, else an embedded local cluster")
    p.add_argument("--backend", default="auto", choices=("auto", "gpu", "emulated"),
                   help="rank backend (default: %(default)s: gpu when the cluster has GPUs and "
                        "a gpu backend is registered, else emulated)")
    p.add_argument("--timeout", type=number("timeout_s"), default=None, metavar="S",
                   help="host deadline per collective call in seconds (default: the suite's "
                        "timeout_s); must exceed the watchdog budget")
    from jobs.plant import add_argument as add_plant_argument
    add_plant_argument(p)  # hidden, test-only: scripts/gpu/detection_power.sh
    p.add_argument("--allow-empty", action="store_true",
                   help="exit 0 when no case ran (every one skipped, or none selected on this "
                        "cluster); without it such a run exits 1: a job that tests nothing "
                        "is not green")
    p.add_argument("--memory-limit-gb", type=number("memory_limit_gb"), default=None,
                   metavar="GIB",
                   help="refuse a TP group whose estimated memory per node exceeds this "
                        "(default: LAMPORT_MEMORY_LIMIT_GB, else the suite's memory_limit_gb, "
                        "else half of this machine's RAM or /dev/shm; see jobs/sizing.py)")
    p.add_argument("--pool", type=pool_choice, default="job", metavar="job|off|NAME",
                   help="where TP groups take their rank processes from: 'job' (default) a pool "
                        "of warm workers this run starts once and every group reuses; 'off' a "
                        "fresh actor per rank per group; NAME the standing pool of that name on "
                        "the cluster joined with --address (python -m jobs pool start)")
    p.add_argument("--groups-per-gpu", type=groups_per_gpu, default=1, metavar="N",
                   help="one-GPU groups (shared-gpu, virtual-ranks) that may share a GPU at once, "
                        "each holding 1/N of it; their kernels time-slice (default: %(default)s)")
    from cluster.faults import FAULT_KINDS
    from jobs.config import PLACEMENTS, TRANSPORTS, VARIANTS, input_kinds, op_field_names, op_names
    f = p.add_argument_group(
        "filters", "comma-separated values; a case is run when its value is listed (a filter "
                   "on a field the case does not have leaves it in)")
    for flag, choices, what in (("--ops", op_names(), "operations (cluster.ops)"),
                                ("--variant", VARIANTS, "kernel variants"),
                                ("--transport", TRANSPORTS, "mailbox transports"),
                                ("--placement", PLACEMENTS, "rank placements (auto: the best "
                                 "the cluster offers)"),
                                ("--inputs", input_kinds(), "correctness input kinds"),
                                ("--faults", tuple(FAULT_KINDS), "fault kinds (faults job)")):
        f.add_argument(flag, type=str_list(choices), metavar="A,B",
                       help=f"{what}: {', '.join(choices)}")
    for flag, what in (("--tp", "ranks per TP group, e.g. 1,2,4"),
                       ("--hidden", "elements per token, e.g. 1024"),
                       ("--tokens", "tokens per call (M), e.g. 1,3,8"),
                       ("--top-k", "experts per token (finalize ops), e.g. 8"),
                       ("--hc", "mHC streams, e.g. 4")):
        f.add_argument(flag, type=int_list, metavar="N,M", dest=flag[2:].replace("-", "_"),
                       help=f"{what}; positive integers")
    f.add_argument("--op-args", type=str_list(), dest="op_args", metavar="NAME=VALUE,...",
                   help="op fields without a column of their own (cluster.ops), NAME one of "
                        f"{', '.join(op_field_names())} that a selected op takes, VALUE one "
                        f"it accepts; e.g. finalize=true or path=fused")


def _add_format_argument(p: argparse.ArgumentParser) -> None:
    from jobs.formats import FORMATS
    p.add_argument("--format", choices=FORMATS, default="table",
                   help="table (default: fixed width, with the prose), or csv, json, md: the "
                        "table alone on stdout (json: NaN/Inf as null; md: a GitHub table)")


def _add_rule_arguments(p: argparse.ArgumentParser) -> None:
    from jobs import regression as rg
    r = p.add_argument_group("regression rule")
    r.add_argument("--history", type=number("history"), default=rg.DEFAULT_HISTORY,
                   help="compare with the last N nightly runs (default: %(default)s)")
    r.add_argument("--min-history", type=number("history"), default=rg.DEFAULT_MIN_HISTORY,
                   help="fewer runs than this: status insufficient-history (default: %(default)s)")
    r.add_argument("--sigmas", type=number("sigmas"), default=rg.DEFAULT_SIGMAS,
                   help="standard deviations beyond the history mean; a bisect: beyond the "
                        "median of good's values, their MAD scaled to a standard deviation "
                        "(default: %(default)s)")
    r.add_argument("--threshold", type=number("threshold"), default=rg.DEFAULT_THRESHOLD,
                   help="and more than this fraction worse (default: %(default)s)")


def _add_changepoint_arguments(p: argparse.ArgumentParser) -> None:
    from jobs import changepoints as cp
    g = p.add_argument_group("change points (jobs/changepoints.py)")
    g.add_argument("--confirm", type=number("segment"), default=cp.DEFAULT_CONFIRM, metavar="K",
                   help="a step counts after K consecutive nights at its new level "
                        "(default: %(default)s)")
    g.add_argument("--min-segment", type=number("segment"), default=cp.DEFAULT_MIN_SEGMENT,
                   metavar="N", help="fewest nights in a segment: a one-night spike is never "
                                     "one (default: %(default)s)")
    g.add_argument("--alpha", type=number("alpha"), default=cp.DEFAULT_ALPHA,
                   help="significance level of a step against the history's noise "
                        "(default: %(default)s)")
    g.add_argument("--min-step", type=number("threshold"), default=cp.DEFAULT_MIN_STEP,
                   help="smallest step reported, a fraction (default: %(default)s)")


def _method(args, rule):
    from jobs.changepoints import Method
    method = Method(min_segment=args.min_segment, confirm=args.confirm, alpha=args.alpha,
                    min_step=args.min_step, min_history=rule.min_history, history=rule.history)
    method.validate()
    return method


def _rule(args):
    from jobs.regression import Rule
    rule = Rule(history=args.history, min_history=args.min_history, sigmas=args.sigmas,
                threshold=args.threshold)
    rule.validate()
    return rule


# ----------------------------------------------------------------- planning
def _plan(args, jobs: tuple[str, ...]):
    """Suites and their selected cases, everything validated before Ray
    starts or a row is written; ConfigError otherwise."""
    from kernels.validation import require_name

    from jobs import sizing
    from jobs.session import check_backend_request
    paths = args.config or [suite_path(n) for n in (args.suite or (args.default_suite,))]
    filters = Filters(**{name: getattr(args, name) for name in Filters.FIELDS})
    plan = []
    for path in paths:
        suite = load_suite(path)
        cases = select(suite, jobs, filters)
        if suite.selfcheck and "selfcheck" in jobs:
            # only here: the golden cases import the torch references (seconds)
            from cluster.ops import golden_cases
            known = golden_cases()
            unknown = sorted(set(suite.selfcheck["cases"]) - set(known))
            if unknown:
                raise ConfigError(f"config {path}: [selfcheck] cases: unknown golden case(s) "
                                  f"{unknown}; known: {sorted(known)}")
        for case in cases:
            timeout = args.timeout or case.param("timeout_s")
            budget_s = (case.param("budget_ns") or 0) / 1e9
            need = 3 * budget_s if case.job == "faults" else budget_s
            if case.job != "profile" and not timeout > need:
                raise ConfigError(
                    f"{case.label()}: the host deadline {timeout} s must exceed "
                    f"{'3 x ' if case.job == 'faults' else ''}the watchdog budget "
                    f"{budget_s} s (late faults sleep 2 budgets); raise --timeout")
        sizing.check(cases, cli_gb=args.memory_limit_gb, suite_gb=suite.memory_limit_gb)
        plan.append((suite, cases))
    names = [s.name for s, _ in plan]
    if len(set(names)) != len(names):
        raise ConfigError(f"suites {names}: each suite may run once per invocation")
    if not any(cases for _, cases in plan) and not any(
            ("selfcheck" in jobs and s.selfcheck) or ("compile-check" in jobs and s.compile_check)
            for s, _ in plan):
        raise ConfigError(f"suite(s) {names} have no {'/'.join(jobs)} case")
    if args.run_id is not None:
        try:
            require_name("--run-id", args.run_id)
        except (TypeError, ValueError) as err:
            raise ConfigError(str(err)) from None
    if args.run_id is not None and not args.no_results:
        from jobs.results import git_commit, runs
        try:
            runs.check_same_tree(args.results, args.run_id, git_commit())
        except ValueError as err:
            raise ConfigError(f"--run-id: {err}") from None
    if args.resume:
        from jobs.results import runs
        if args.run_id is None or args.no_results:
            raise ConfigError("--resume needs --run-id RUN (the run to complete) and rows "
                              "(not --no-results)")
        try:
            found = runs.read_manifest(args.results, args.run_id)
        except runs.ManifestError as err:
            raise ConfigError(f"--resume: {err}") from None
        if found is None:
            raise ConfigError(f"--resume: no run {args.run_id!r} in --results {args.results}")
    check_backend_request(args.backend)
    if args.pool not in ("job", "off") and not (args.address or os.environ.get("RAY_ADDRESS")):
        from jobs.pool import cluster_address
        try:  # the head `jobs head start` recorded, as `jobs pool start` found it
            args.address = cluster_address(None)
        except ConfigError as err:
            raise ConfigError(f"--pool {args.pool}: {err}; or --pool job for a pool of this "
                              f"run's own") from None
    from jobs.plant import calibrate
    args.plant = calibrate(args, plan)  # {} without --plant-slowdown
    if getattr(args, "cmd", None) == "trace":
        from jobs.trace import check_one_group
        if len(plan) != 1:
            raise ConfigError(f"trace: one suite at a time, got {names}")
        check_one_group(plan[0][1])
    if not args.no_results:
        from jobs.results import runs
        try:
            runs.runs_dir(args.results)
        except runs.ManifestError as err:
            raise ConfigError(f"--results: {err}") from None
    # Last, so that a command refused for another reason touched nothing.
    _check_outputs(args)
    if args.backend != "emulated" or ("compile-check" in jobs and any(
            s.compile_check for s, _ in plan)):  # a run that may build kernels
        from jobs.outputs import check_compile_cache
        check_compile_cache()
    _check_cluster(args)  # the only check that may write (an embedded cluster's token)
    return plan


def _check_outputs(args) -> None:
    """Every path the run writes (jobs.outputs): a directory this process
    writes into, a site it may replace, a trace file that does not exist,
    none inside another."""
    from jobs import outputs
    where = {}
    if not args.no_results:
        where["--results"] = outputs.check_results("--results", args.results)
        if getattr(args, "nightly", False) and not args.no_dashboard:
            where["--site"] = outputs.check_site("--site", args.site)
    if getattr(args, "trace_out", None) is not None:
        where["--trace-out"] = outputs.check_new_file("--trace-out", args.trace_out)
    if getattr(args, "nightly", False):  # the webhooks, read and checked whole (jobs.alerts)
        from jobs.alerts import webhooks
        args.notify = webhooks(args)
    if getattr(args, "notify", None) or getattr(args, "summary_md", None) is not None:
        if args.no_results:
            raise ConfigError("--notify / --summary-md: the alert is made from the run's rows; "
                              "drop --no-results")
        if args.summary_md is not None:
            where["--summary-md"] = outputs.check_append_file("--summary-md", args.summary_md)
    outputs.check_apart(where)


def _check_cluster(args) -> None:
    """Before Ray starts: the cluster address's form
    (:func:`jobs.session.check_address`), or for an embedded cluster its
    token file (:mod:`jobs.ray_token`: made when missing, else only read)."""
    address = args.address or os.environ.get("RAY_ADDRESS")
    if address:
        from jobs.session import check_address
        check_address(address)
    else:
        from jobs.embedded import ensure_token, token_path
        ensure_token(token_path())


# ----------------------------------------------------------------- sweeps
def _sweep(args, jobs: tuple[str, ...], *, nightly: bool = False) -> int:
    """Run the sweep. SIGINT or SIGTERM (``Interrupted``) once the run is
    open ends it as :meth:`jobs.recorder.Run.interrupted` says (before Ray's
    cleanup, which a signal to the whole process group can block), printing
    the command that resumes it, and is raised on (exit 130 or 143)."""
    from jobs.results import env_info_soon
    from jobs.session import ray_session
    plan = _plan(args, jobs)
    rule = _rule(args) if nightly else None
    opened: list = []  # the run, once it exists
    facts = env_info_soon()  # while Ray starts or is joined

    def on_stop(stop: Interrupted) -> None:
        if opened:
            run = opened[0]
            shown = run.stopped_by is None and run.results is not None and not run.finished
            run.interrupted(stop, compact=nightly, resume=resume_command(args.argv, run.run_id))
            from jobs.alerts import secret_free
            hidden = secret_free(args.argv)[1]
            if shown and hidden:  # the resume command names them for --notify's URLs
                print(f"  (--notify's URL is a secret, shown nowhere: export "
                      f"{' and '.join(hidden)} with it first)", flush=True)
            if nightly:  # within the signal's grace (jobs.embedded.TERM_GRACE_S)
                _alert_part(args, opened[0], rule, stop.code, budget_s=ALERT_BUDGET_STOPPED_S)

    _take_lease(args)
    try:
        with ray_session(args.address) as how:
            try:
                regressed, checked = _sweep_run(args, jobs, plan, rule, how, nightly=nightly,
                                                opened=opened, on_stop=on_stop, facts=facts)
            except Interrupted as stop:
                on_stop(stop)
                raise
        (run,) = opened
        failing = run.summary()
        missing = run.finish(compact=nightly)
        if missing:
            print(f"\nrun {run.run_id} incomplete: {missing} planned case(s) have no row; "
                  f"complete it (only the cases it lacks) with:\n  "
                  f"{resume_command(args.argv, run.run_id)}", flush=True)
            failing += missing
        if nightly:
            failing += _dashboard_part(args)
    except Interrupted as stop:
        on_stop(stop)  # (once: a run already marked is left as it is)
        raise
    finally:
        _release_lease(args, opened)
    tested = checked or any(run.run_counts()[o] for o in ("pass", "fail", "hang", "error"))
    if not tested and not args.allow_empty:
        print(f"\nno case ran: every case of this run was skipped (the reasons above) or none "
              f"was selected on this cluster; exit {exits.FAILED}, since a job that tests "
              f"nothing is not green (--allow-empty: exit 0 for such a run)", flush=True)
        status = exits.FAILED
    else:
        status = exits.FAILED if failing or regressed else exits.OK
    if nightly:
        _alert_part(args, run, rule, status)
    return status


def _take_lease(args) -> None:
    """A named run (``--run-id``, ``--resume`` too): take its lease
    (:mod:`jobs.results.lease`) before Ray starts, so that a second driver
    of the run is refused (exit 2, naming the live one) before it starts
    anything; a fresh run id is the run's own (taken as the run opens)."""
    if args.run_id is None or args.no_results:
        return
    from jobs.results import runs
    try:
        runs.begin(args.results, args.run_id, trigger=args.trigger, keep_alive=True)
    except (runs.ManifestError, ValueError) as err:  # LeaseHeld among them
        raise ConfigError(str(err)) from None


def _release_lease(args, opened: list) -> None:
    """However the sweep ended: a run it neither finished nor interrupted
    is marked ``incomplete`` and its lease released (a failure to write
    that is said in one line: what ended the sweep keeps its exit status)."""
    from jobs.results import runs
    try:
        if opened:
            opened[0].close()
        elif args.run_id is not None and not args.no_results:
            runs.release(args.results, args.run_id)
    except (InfraError, runs.ManifestError) as err:
        print(f"run {args.run_id or opened[0].run_id}: not released: {err}", file=sys.stderr,
              flush=True)


ALERT_BUDGET_STOPPED_S = 5.0
"""The alert's delivery budget when a signal stopped the run (its grace is short)."""


def _alert_part(args, run, rule, status: int, *, budget_s: float | None = None) -> None:
    """``--notify`` / ``--summary-md`` (jobs.alerts), once per run; never
    fails the run."""
    if getattr(args, "_alerted", False) or run.results is None:
        return
    args._alerted = True
    from jobs import alerts
    alerts.notify(args, run.run_id, rule=rule, exit_status=status,
                  budget_s=alerts.BUDGET_S if budget_s is None else budget_s)


def resume_command(argv: list[str], run_id: str) -> str:
    """The command line ``argv`` (after ``python -m jobs``) that completes
    run ``run_id``: with ``--run-id`` and ``--resume`` added where absent,
    each ``--notify URL`` (a secret) as ``--notify-env VAR``
    (:func:`jobs.alerts.secret_free`), run by this interpreter, shell-quoted."""
    from jobs.alerts import secret_free
    words, _ = secret_free(argv)
    if not any(w == "--run-id" or w.startswith("--run-id=") for w in words):
        words += ["--run-id", run_id]
    if "--resume" not in words:
        words.append("--resume")
    return shlex.join([sys.executable, "-m", "jobs", *words])


def _sweep_run(args, jobs: tuple[str, ...], plan, rule, how: str, *, nightly: bool,
               opened: list, on_stop, facts) -> int:
    """The sweep inside the Ray session, with the worker pool ``--pool``
    asks for: the run opened (appended to ``opened``), every job of
    ``plan``, the regression part; returns the number of kernel cases
    regressed and whether a self-check or compile check ran.
    ``on_stop(Interrupted)`` is called before the pool closes; ``facts()``
    gives the environment's columns (jobs.results.env_info_soon)."""
    from jobs import correctness, faults, profile
    from jobs.cluster_view import ClusterView
    from jobs.session import resolve_backend, worker_pool

    runners = {"correctness": correctness.run, "faults": faults.run, "profile": profile.run}
    if getattr(args, "plant", None):
        runners["profile"] = functools.partial(profile.run, plant=args.plant)
    if args.cmd == "trace":
        from jobs import trace
        runners["correctness"] = functools.partial(trace.run, out=args.trace_out)
    backend, why = resolve_backend(args.backend)
    with worker_pool(args.pool, backend) as pool:
        view = ClusterView(backend, groups_per_gpu=args.groups_per_gpu, pool=pool)
        try:
            run, checked = _run_jobs(args, jobs, plan, runners, view,
                                     f"ray: {how}\nbackend: {why}", nightly=nightly,
                                     opened=opened, facts=facts)
            return (_regression_part(run, rule, args) if nightly else 0), checked
        except Interrupted as stop:
            on_stop(stop)  # before the pool's and Ray's cleanup, which the signal may block
            raise


def _run_jobs(args, jobs: tuple[str, ...], plan, runners, view, heading: str, *,
              nightly: bool, opened: list, facts):
    """Every job of every suite of ``plan`` on the open cluster; ``(the Run,
    whether a self-check or compile check ran)`` (they test something
    without rows of cases); the Run is also appended to ``opened`` as soon
    as it exists. ``facts()``: the environment's columns."""
    from jobs.recorder import Run, done_in_run
    if view.pool is not None:
        # workers start (imports, CUDA contexts) while the topology is found
        # and the self-check and compile check run
        view.pool.prestart(prestart_count([c for _, cases in plan for c in cases], view))
    environment = {**facts(), **view.columns()}
    run = Run(results=None if args.no_results else args.results, trigger=args.trigger,
              run_id=args.run_id, backend=view.backend, environment=environment)
    opened.append(run)
    if run.results is not None and not run.results.is_absolute() and "joined" in heading:
        print(f"note: --results {run.results} is relative to this job's working directory "
              f"(under ray job submit, a temporary copy): give an absolute path to keep them")
    print(f"{heading}\ncluster: {view.describe()}"
          f"\npool: {view.pool.describe() if view.pool else 'off (a fresh actor per rank per group)'}"
          f"\ncommit: {environment.get('git_commit') or 'unknown'}"
          f"\nrun: {run.run_id} (trigger {run.trigger}); results: "
          f"{'not written' if args.no_results else args.results}", flush=True)
    done = done_in_run(args.results, run.run_id) if args.resume else set()
    checked = False
    for suite, cases in plan:
        print(f"\n#### suite {suite.name} v{suite.version} ({suite.path}): {suite.description}")
        # The nightly runs every placement the cluster offers a case
        # ("every topology"); a single job runs the best one.
        cases = view.concretize(cases, every=nightly, wanted=args.placement)
        planned = _planned(suite, jobs, cases)
        run.plan(k for keys in planned.values() for k in keys)
        if args.resume:
            total = sum(map(len, planned.values()))
            held = {job: sum(k in done for k in keys) for job, keys in planned.items()}
            print(f"resume: run {run.run_id} holds {sum(held.values())} of these {total} "
                  f"planned case(s) already ("
                  + ", ".join(f"{job} {held[job]} of {len(keys)}" for job, keys in planned.items())
                  + f"); running the other {total - sum(held.values())}", flush=True)
        if "selfcheck" in planned and not set(planned["selfcheck"]) <= done:
            _selfcheck_part(run, suite, only=[k.split("/", 1)[1] for k in planned["selfcheck"]
                                              if k not in done] if args.resume else None)
            checked = True
        if "compile-check" in planned and not set(planned["compile-check"]) <= done:
            _compile_part(run, suite, args)
            checked = True
        cases = [c for c in cases if c.key() not in done]
        for job in ("correctness", "faults", "profile"):
            mine = [c for c in cases if c.job == job]
            if mine:
                runners[job](run, suite, mine, view=view, timeout_s=args.timeout)
    if view.pool is not None:
        print(f"\npool {view.pool.name}: {view.pool.usage()}", flush=True)
        if not view.pool.standing:  # a standing pool's leased workers answer late
            print(f"pool warm-up: {view.pool.warm_summary()}", flush=True)
    return run, checked


def prestart_count(cases, view) -> int:
    """Workers a pool slot needs at the busiest moment of ``cases``: on
    GPUs, ``groups_per_gpu`` shared-GPU groups of the largest tp at once on
    one GPU; emulated, the largest group (groups are placed one node at a
    time). Emulated, only the groups it runs: not the profile's (no timing
    there) nor those of a placement or op it does not run (virtual ranks,
    GPU-only ops), which the smoke suite's tp 8 are: each worker imports
    torch, seconds of CPU."""
    ranked = [c for c in cases if c.job in ("correctness", "faults", "profile")]
    if view.backend == "emulated":
        from jobs.correctness import skip_reason
        ranked = [c for c in ranked if c.job != "profile" and not isinstance(view.offered(c), str)
                  and skip_reason(c, view.backend) is None]
    if not ranked:
        return 0
    tp = max(c.tp for c in ranked)
    return min(tp * view.groups_per_gpu, 16) if view.backend == "gpu" else tp


def _planned(suite, jobs: tuple[str, ...], cases) -> dict[str, list[str]]:
    """The case keys (``jobs.recorder.row_case_key``'s) of every job of
    ``jobs`` that ``suite`` runs, by job, in run order: the self-check's
    golden cases, the compile check's variants x arches, the (concrete)
    kernel cases."""
    from jobs.recorder import selfcheck_key
    planned = {}
    if "selfcheck" in jobs and suite.selfcheck:
        from cluster.ops import golden_cases
        names = suite.selfcheck["cases"] or sorted(golden_cases())
        planned["selfcheck"] = [selfcheck_key(n) for n in names]
    if "compile-check" in jobs and suite.compile_check:
        from jobs.compile_check import planned_keys
        c = suite.compile_check
        planned["compile-check"] = planned_keys(c["ops"], c["hidden"], c["tp"], c["arch"])
    for job in ("correctness", "faults", "profile"):
        keys = [case.key() for case in cases if case.job == job]
        if keys:
            planned[job] = keys
    return planned


def _selfcheck_part(run, suite, only: list[str] | None = None) -> None:
    """The suite's self-check (``only``: these golden cases of it, a resume's)."""
    from jobs import selfcheck
    print("\n== reference self-check: golden vectors recomputed with the torch references ==")
    failures = selfcheck.run(argparse.Namespace(case=only or suite.selfcheck["cases"] or None),
                             run.writer(suite.name), run.environment)
    run.count_external(Counter(fail=failures))


def _compile_part(run, suite, args) -> None:
    from jobs import compile_check
    c = suite.compile_check
    print("\n== kernel compile check: kernel variants compiled without a GPU, PTX checked ==",
          flush=True)
    argv = ["--arch", ",".join(c["arch"]), "--hidden", ",".join(map(str, c["hidden"])),
            "--tp", ",".join(map(str, c["tp"])), "--trigger", run.trigger,
            "--partition", suite.name]
    if c["ops"]:
        argv += ["--ops", ",".join(c["ops"])]
    argv += (["--no-results"] if run.results is None
             else ["--results", str(run.results), "--run-id", run.run_id])
    if args.resume:
        argv.append("--resume")
    status = compile_check.main(argv)
    run.count_external(Counter(fail=int(status != 0)))


def _regression_part(run, rule, args) -> int:
    from jobs import regression
    if run.results is None:
        print("\nregression: skipped (--no-results: no history to compare with)")
        return 0
    from jobs import changepoints
    from jobs.changepoints import Method
    why = changepoints.missing()
    if why:
        print(f"\nchange points: skipped ({why}); the lookback rule alone judges")
    method = None if why else Method(min_history=rule.min_history, history=rule.history)
    verdicts = regression.detect(run.results, run.run_id, rule, method)
    if not verdicts:
        print(f"\nregression: no timed case in this run (backend {run.backend}); nothing to compare")
        return 0
    regressed = regression.show(verdicts, rule, method=method)
    status = Counter(v.status for v in verdicts)
    steps = Counter(v.cp_status for v in verdicts) if method is not None else None
    print(f"regression: {dict(status)}" + (f"; change points: {dict(steps)}" if steps else "")
          + f"; {regressed} kernel case(s) regressed")
    return regressed


DASHBOARD_PAGES_FAILED = 3
"""``python -m dashboards build``'s exit status for a site built with error
pages (dashboards.build.PAGES_FAILED; jobs never import dashboards)."""


def _dashboard_part(args) -> int:
    """Build the dashboard with ``python -m dashboards build`` (a separate
    process: jobs sit below dashboards and never import them); 1 if the
    build failed. Pages that failed (the site built with error pages) are
    named, one line each, as infrastructure, and return 0: the run's exit
    status stays its cases' verdict."""
    if args.no_results or args.no_dashboard:
        print("dashboard: not built (" + ("--no-results" if args.no_results else "--no-dashboard") + ")")
        return 0
    argv = [sys.executable, "-m", "dashboards", "build", "--results", str(args.results),
            "--out", str(args.site)]
    repo = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(argv, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": path})
    if done.returncode == DASHBOARD_PAGES_FAILED:
        index = done.stdout.strip().rpartition("site: ")[2] or args.site
        failed = [line.partition(": ")[2] for line in done.stderr.splitlines()
                  if ": page " in line]
        print(f"dashboard: built {index}, but {len(failed)} page(s) failed (infrastructure: "
              f"the dashboards' fault, not the cases'; this run's exit status is its cases' "
              f"verdict)")
        for line in failed:
            print(f"dashboard: {line}")
        return 0
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()
        # The headline names the error (a traceback's last line); its tail follows.
        print(f"dashboard: FAILED to build from {args.results} into {args.site} "
              f"({' '.join(argv[1:])}, exit {done.returncode}): "
              f"{said.splitlines()[-1] if said else 'no output'}\n{said[-600:]}")
        return 1
    index = done.stdout.strip().rpartition("site: ")[2] or args.site
    print(f"dashboard: built {index}")
    return 0


# ----------------------------------------------------------------- others
def _selfcheck(args: argparse.Namespace) -> int:
    from jobs import selfcheck
    suite = selected_suite(args, "selfcheck")
    if suite is not None and args.case is None:  # --case narrows further
        args.case = suite.selfcheck["cases"] or None
    writer, environment = open_results(args, suite)
    failures = selfcheck.run(args, writer, environment)
    report(writer, failures, args)
    return exits.FAILED if failures else exits.OK


def _report(args) -> int:
    from jobs import report as rp
    return rp.main(args)


def _regress(args) -> int:
    from jobs import regression
    from jobs.report import _resolve
    from jobs import changepoints
    rule = _rule(args)
    method = _method(args, rule)
    only = _only(args.only)
    why = changepoints.missing()
    if why:
        raise ConfigError(f"regress: change points need ruptures: {why}")
    (run_id,) = _resolve(args.results, [args.run] if args.run else [])
    say = print if args.format == "table" else (lambda *a: print(*a, file=sys.stderr))
    say(f"regression check of run {run_id} in {args.results}: {rule.describe()}")
    if args.segments:
        regressed = regression.show_segments(args.results, run_id, method, fmt=args.format,
                                             only=only)
        say(f"\n{regressed} confirmed regressed step(s) in the history")
        return exits.OK
    verdicts = regression.detect(args.results, run_id, rule, method)
    if not verdicts:
        say("no timed case in this run; nothing to compare")
        if args.format != "table":
            regression.show([], rule, method=method, fmt=args.format, only=only)
        return exits.OK
    regressed = regression.show(verdicts, rule, method=method, fmt=args.format, only=only)
    say(f"\n{regressed} kernel case(s) regressed")
    return exits.FAILED if regressed else exits.OK


def _only(text: str | None) -> tuple[str, ...] | None:
    from jobs.regression import STATUSES
    if text is None:
        return None
    wanted = tuple(w.strip() for w in text.split(",") if w.strip())
    bad = [w for w in wanted if w not in STATUSES]
    if bad or not wanted:
        raise ConfigError(f"--only {text!r}: each of a comma-separated list of "
                          f"{', '.join(STATUSES)}")
    return wanted


def _compact(args) -> int:
    from jobs.results import compact, read_results
    try:
        written = compact(args.results, args.out)
    except (ValueError, FileNotFoundError) as err:
        raise ConfigError(str(err)) from None
    before, after = read_results(args.results).num_rows, read_results(args.out).num_rows
    print(f"compacted {before} rows of {args.results} into {len(written)} file(s) "
          f"({after} rows) under {args.out}")
    return exits.OK if before == after else exits.FAILED


def _schema(args) -> int:
    from jobs.results.schema import SCHEMA_VERSION, markdown_table
    print(f"results schema version {SCHEMA_VERSION}\n\n{markdown_table()}")
    return exits.OK


def _ray_cli() -> str:
    """The ``ray`` command of this interpreter's environment (else PATH's)."""
    ray_bin = Path(sys.executable).with_name("ray")
    return str(ray_bin) if ray_bin.exists() else (shutil.which("ray") or "ray")


def _job_server(args):
    """(URL, auth) of the job server ``--address`` / RAY_ADDRESS / the
    head in ``--dir`` names, reached and its token settled
    (jobs.head.job_server_auth)."""
    from jobs import head as hd
    head = hd.head_dir(args.dir)
    url = hd.job_server_url(args.address, head, use=args.cmd)
    return url, hd.job_server_auth(url, head)


def _ray_env(auth) -> dict[str, str]:
    """The environment for the ``ray`` CLI: Ray's auth variables as
    ``auth`` settles them, no RAY_ADDRESS (the address is passed)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    return {**env, **auth.env}


def job_exit_status(info: dict | None) -> int:
    """A submitted job's exit status from Ray's record of it
    (jobs.head.job_info): its entrypoint's exit code (killed by signal N:
    128 + N); a job Ray never ran, or that failed before its entrypoint
    did (its runtime environment, say): INFRA; stopped without a code:
    INTERRUPTED_SIGTERM."""
    if info is None:
        return exits.INFRA
    code = info.get("driver_exit_code")
    if code is not None:
        return 128 - code if code < 0 else code
    status = info.get("status")
    if status == "SUCCEEDED":
        return exits.OK
    if status == "STOPPED":
        return exits.INTERRUPTED_SIGTERM
    return exits.INFRA


def _submit(args) -> int:
    """``ray job submit --working-dir <repo>`` of a job command: the job is
    checked here first (bad usage: exit 2 before anything is sent), the head
    reached (nothing answering: exit 3) and its authentication settled, the
    commit passed in LAMPORT_GIT_COMMIT; the entrypoint runs ``--python``
    (default: this interpreter, the project's environment). Its log is
    followed to the end and the exit status is the job's
    (:func:`job_exit_status`; ``ray job submit`` itself says 1 for any
    failure). Ctrl-C stops following, not the job. ``--no-wait``: return
    once the job is taken (0; INFRA when it was not)."""
    import datetime as dt
    import secrets

    from jobs import head as hd
    from jobs.results import git_commit
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise ConfigError("give the job command after '--', e.g. "
                          "python -m jobs submit -- nightly --suite smoke")
    if command[0] in SIDE_COMMANDS:
        raise ConfigError(f"{command[0]!r} runs on this side, not as a Ray job")
    job = _parse_job(command)
    if job is None:
        return exits.USAGE
    if getattr(job, "notify", None):
        raise ConfigError("--notify URL: Ray keeps a submitted job's command line and shows it "
                          "(jobs status, the dashboard), and a webhook's URL is a secret: pass "
                          "it as --notify-env VAR (set where the head runs) or --notify-file "
                          "PATH (a file there)")
    for name in ("results", "site"):
        path = getattr(job, name, None)
        if path is not None and not getattr(job, "no_results", False) and not path.is_absolute():
            raise ConfigError(f"--{name} {path}: give an absolute path; a submitted job runs "
                              f"in a temporary copy of the tree, which Ray deletes")
    if args.submission_id is not None:
        hd.check_job_id(args.submission_id, "--submission-id")
    url, auth = _job_server(args)
    job_id = args.submission_id or (f"lamport-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}"
                                    f"-{secrets.token_hex(3)}")
    repo = Path(__file__).resolve().parents[1]
    from jobs.embedded import TERM_GRACE_S
    env_vars = {"LAMPORT_GIT_COMMIT": os.environ.get("LAMPORT_GIT_COMMIT") or git_commit() or "unknown",
                # `stop` sends SIGTERM, then SIGKILL after this (Ray's default: 3 s):
                # room for the job's closing line, accounting and run marked interrupted.
                "RAY_JOB_STOP_WAIT_TIME_S": str(int(TERM_GRACE_S) + 5)}
    argv = [_ray_cli(), "job", "submit", "--address", url, "--working-dir", str(repo),
            "--runtime-env-json", json.dumps({"env_vars": env_vars}), "--submission-id", job_id,
            *(["--no-wait"] if args.no_wait else []),
            "--", args.python or sys.executable, "-m", "jobs", *command]
    where = [] if args.dir is None else ["--dir", str(args.dir)]
    where += [] if args.address is None else ["--address", args.address]
    follow = {action: shlex.join(["python", "-m", "jobs", action, job_id, *where])
              for action in ("status", "logs", "stop")}
    print(f"auth: {auth.why}\nsubmitting: {shlex.join(argv)}\njob: {job_id} (elsewhere: "
          f"{follow['status']}; {follow['logs']}; {follow['stop']})", flush=True)
    try:
        said = subprocess.call(argv, env=_ray_env(auth))
    except Interrupted as stop:
        print(f"\n{stop.name}: stopped following job {job_id}; it goes on. Follow it with "
              f"`{follow['logs']} --follow`, stop it with `{follow['stop']}`", file=sys.stderr)
        raise
    info = hd.job_info(url, job_id, auth)
    if args.no_wait:
        print(f"submit: job {job_id} " + (f"taken ({info.get('status')}); follow it with "
                                          f"`{follow['logs']} --follow`" if info else
                                          f"was not taken (ray job submit exited {said})"),
              flush=True)
        return exits.OK if info else exits.INFRA
    status = job_exit_status(info)
    print(f"submit: job {job_id} " + (f"ended {info.get('status')}, exit status {status}"
                                      if info else f"was not taken (ray job submit exited "
                                                   f"{said}), exit status {status}"), flush=True)
    return status


def _follow(args) -> int:
    """``ray job status|logs|stop JOB_ID`` against the job server ``submit``
    used (the head in ``--dir``, or ``--address``), with its token settled
    as for ``submit``: a user never sets Ray's auth variables. The id is
    checked first: a malformed one is exit 2 before any request, one the
    server does not know exit 2, a server that errs exit 3, each one line
    (jobs.head.job_info). ``status --wait running`` first waits until the
    job runs and its log shows its first case's line (jobs.head.wait_running,
    at most ``--timeout`` s). The exit status is the ``ray`` command's;
    ``status`` exits with the job's own status once it has ended
    (:func:`job_exit_status`), 0 while it runs."""
    from jobs import head as hd
    hd.check_job_id(args.job_id)
    url, auth = _job_server(args)
    if getattr(args, "wait", None):
        info, line = hd.wait_running(url, args.job_id, auth, args.timeout)
        print(f"job {args.job_id}: " + (f"running, first case: {' '.join(line.split())}" if line
                                        else f"ended {info.get('status')} before a case line"),
              flush=True)
        if args.cmd == "stop":  # at once, from this process: no ray CLI to start in between
            stopped = line is not None and hd.stop_job(url, args.job_id, auth)
            print(f"job {args.job_id}: " + ("stop requested (SIGTERM: it ends after the case "
                                            "in hand)" if stopped else "not running, nothing "
                                            "to stop"), flush=True)
            return exits.OK
    else:
        info = hd.job_info(url, args.job_id, auth)
    if info is None:
        raise ConfigError(f"JOB_ID {args.job_id!r}: no such job at {url} (the id `submit` "
                          f"printed, or `ray job list --address {url}`)")
    argv = [_ray_cli(), "job", args.cmd, "--address", url, args.job_id]
    if args.cmd == "logs" and args.follow:
        argv.append("--follow")
    said = _ray_job(argv, auth, f"ray job {args.cmd} {args.job_id}")
    if args.cmd != "status" or said != 0:
        return said
    ended = info.get("status") in hd.ENDED
    return job_exit_status(info) if ended else exits.OK


def _ray_job(argv: list[str], auth, what: str) -> int:
    """Run the ``ray job`` command ``argv`` (``what``, in words); its exit
    status. Its stderr is passed on, except a traceback (the job server
    failing under it): then InfraError with the traceback's last line."""
    with subprocess.Popen(argv, env=_ray_env(auth), stderr=subprocess.PIPE, text=True,
                          errors="replace") as proc:
        try:
            _, err = proc.communicate()
        except BaseException:  # Ctrl-C: the command goes too, as subprocess.call does
            proc.kill()
            raise
    if proc.returncode != 0 and "Traceback (most recent call last)" in err:
        last = next((ln.strip() for ln in reversed(err.splitlines()) if ln.strip()), "")
        raise InfraError(f"{what} failed: {last}")
    sys.stderr.write(err)
    return proc.returncode


def _parse_job(command: list[str]):
    """The job command's arguments as the job will parse them; None (after
    argparse printed why) on bad usage."""
    if command[0] == "compile-check":
        from jobs import compile_check
        parser = compile_check.build_parser()
    else:
        parser = build_parser(only=command[0])
    try:
        return parser.parse_args(command[1:] if command[0] == "compile-check" else command)
    except SystemExit as exit_:
        if exit_.code:
            return None
        raise


def _head(args) -> int:
    from jobs import head as hd
    where = hd.head_dir(args.dir)
    if args.action == "stop":
        print(hd.stop(where))
        return exits.OK
    if args.action == "status":
        running, said = hd.status(where)
        print(said)
        return exits.OK if running else exits.FAILED
    state = hd.start(where, num_cpus=args.num_cpus, wait_s=args.wait, host=args.host,
                     dashboard=args.dashboard)
    if args.host != hd.LOOPBACK:
        print(f"note: the head listens on {args.host}, reachable from the network; its token "
              f"({state['token_path']}, 0600) is all that keeps it yours: give it only to "
              f"those who may run code on this machine")
    without = hd.no_job_server(state)
    if without:
        print(f"note: the head runs without the dashboard and so without a job server "
              f"({without}): `jobs submit` is refused; pools and --pool NAME join its GCS")
    print(f"ray head: {hd.describe(state)} (" + ("" if without else "job server, ")
          + f"token auth; token in {state['token_path']}), GCS {state['address']}, "
          f"{state['num_cpus']} CPUs\n"
          + ("  pool:   python -m jobs pool start --name lab\n" if without else
             "  submit: python -m jobs submit -- nightly --suite smoke --results "
             "\"$PWD/ray-results\"\n")
          + "  stop:   python -m jobs head stop" + (f" --dir {args.dir}" if args.dir else ""))
    return exits.OK


NIGHTLY_JOBS = ("selfcheck", "compile-check", "correctness", "faults", "profile")
SIDE_COMMANDS = ("submit", "head", "pool", "status", "logs", "stop")
"""Commands that run on the submitting side, never as a Ray job."""
_BOUNDS = ("bounds of the suite fields and options (jobs/limits.py; a value outside is refused "
           "with exit 2 before Ray starts; memory is bounded by the sizing's ceiling, "
           "--memory-limit-gb):\n" + limits.describe())


def _add_job_server_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", default=None, metavar="URL",
                   help="the head's job server, e.g. http://10.0.0.1:8265 (default: RAY_ADDRESS, "
                        "else the head `python -m jobs head start` recorded in --dir)")
    p.add_argument("--dir", type=path_arg, default=None,
                   help=f"head directory (default: ${{{HEAD_DIR_ENV}}} or {DEFAULT_HEAD_DIR})")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line. ``only``: build that command's options alone (the
    other commands are listed with their help, so ``python -m jobs --help``
    imports neither torch nor Ray; ``""``: none); None: every command's."""
    def full(name: str) -> bool:
        return only is None or only == name

    parser = argparse.ArgumentParser(prog="python -m jobs", description=__doc__,
                                     epilog=f"exit status:\n{exits.help_text()}",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND",
                                title="commands (python -m jobs COMMAND --help for each)")
    for name, suite, trigger, helptext in (
            ("nightly", "nightly", "nightly", "every job of the suite(s) (reference self-check, "
                                              "compile check, correctness, faults, profile), "
                                              "then regression detection against the nightly "
                                              "history, then the dashboard"),
            ("smoke", "smoke", "adhoc", "the same as nightly --suite smoke"),
            ("correctness", "smoke", "adhoc", "the numerical contract through TP groups of "
                                              "rank actors"),
            ("faults", "smoke", "adhoc", "docs/design.md's fault table: expected vs seen, per kind, "
                                         "op and tp"),
            ("profile", "smoke", "adhoc", "latency against same-run baselines (GPU only; "
                                          "skipped rows elsewhere)"),
            ("trace", "smoke", "adhoc", "one TP group's correctness cases, every rank traced "
                                        "onto one Perfetto timeline")):
        p = sub.add_parser(name, help=helptext, description=helptext, epilog=_BOUNDS,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        if not full(name):
            continue
        _add_sweep_arguments(p, suite=suite, trigger=trigger)
        if name in ("nightly", "smoke"):
            _add_rule_arguments(p)
            p.add_argument("--site", type=path_arg, default=DEFAULT_SITE,
                           help="dashboard output directory (default: %(default)s)")
            p.add_argument("--no-dashboard", action="store_true", help="do not build the dashboard")
            from jobs.alerts import check_site_url, check_url, env_name
            p.add_argument("--notify", type=check_url, action="append", default=None,
                           metavar="URL",
                           help="post the run's alert (generic webhook JSON: counts, worst "
                                "cases with repro commands, page links; docs/alerts.md) to URL "
                                "when it has something to say (regressions, failures, hangs, "
                                "a run not finished); repeatable; retried with backoff, never "
                                "failing the run; shown only redacted (scheme and host)")
            p.add_argument("--notify-env", type=env_name, action="append", default=None,
                           metavar="VAR",
                           help="the same, the URL taken from environment variable VAR (e.g. "
                                "LAMPORT_NOTIFY_URL): out of shell history and CI logs; "
                                "repeatable")
            p.add_argument("--notify-file", type=path_arg, action="append", default=None,
                           metavar="PATH",
                           help="the same, the URL taken from the first line of file PATH; "
                                "repeatable")
            p.add_argument("--notify-on", choices=("news", "always"), default="news",
                           help="post when the run has something to say (news, the default) "
                                "or after every run (always: a green run's message too)")
            p.add_argument("--summary-md", type=path_arg, default=None, metavar="FILE",
                           help="append the same alert as Markdown to FILE, made when missing "
                                "in an existing folder (a CI job summary, e.g. "
                                "$GITHUB_STEP_SUMMARY), whatever the run had to say")
            p.add_argument("--site-url", type=check_site_url, default=None, metavar="URL",
                           help="where --site is served, for the alert's links: http(s)://... "
                                "or a relative path (default: file:// links to --site)")
            p.add_argument("--jobs", type=str_list(NIGHTLY_JOBS), default=NIGHTLY_JOBS,
                           metavar="A,B",
                           help=f"the suite's jobs to run, comma-separated (default: all: "
                                f"{','.join(NIGHTLY_JOBS)}); with --run-id, one nightly split "
                                f"over several invocations")
            p.set_defaults(nightly=True)
        elif name == "trace":
            p.add_argument("--trace-out", type=path_arg, default=None, metavar="PATH",
                           help="the merged trace JSON, a file that does not exist yet "
                                "(default: traces/RUN-OP-tpN.json beside --results)")
            p.set_defaults(jobs=("correctness",), nightly=False)
        else:
            p.set_defaults(jobs=(name,), nightly=False)
    sub.add_parser("compile-check", help="compile every registered kernel variant (no GPU "
                   "needed) and check its PTX")
    p = sub.add_parser("report", help="print a run from the results, or compare two")
    p.add_argument("runs", nargs="*", metavar="RUN_ID", help="none: the latest run; two: compare")
    p.add_argument("--results", type=path_arg, default=DEFAULT_RESULTS)
    p.add_argument("--list", action="store_true", help="list the runs, newest first")
    p.add_argument("--all", action="store_true", help="every row, not only failing and timed ones")
    _add_format_argument(p)
    p.set_defaults(func=_report)
    p = sub.add_parser("regress", help="regression detection for one run in the results")
    if full("regress"):
        p.add_argument("--results", type=path_arg, default=DEFAULT_RESULTS)
        p.add_argument("--run", default=None, help="run id (default: the latest run)")
        p.add_argument("--segments", action="store_true",
                       help="each case's nightly history up to the run, split into segments "
                            "by change points: each step's size, confidence, commit range and "
                            "the jobs bisect command that narrows it")
        p.add_argument("--only", default=None, metavar="STATUS,...",
                       help="only the cases with one of these statuses (by either rule; with "
                            "--segments: the newest night's change-point status): "
                            "regressed, improved, ok, insufficient-history")
        _add_format_argument(p)
        _add_rule_arguments(p)
        _add_changepoint_arguments(p)
    p.set_defaults(func=_regress)
    p = sub.add_parser("selfcheck", help="recompute every golden vector with the torch references")
    if full("selfcheck"):
        add_suite_arguments(p, section="selfcheck", default="no suite: every golden case")
        add_results_arguments(p, partition="selfcheck")
        from jobs import selfcheck
        selfcheck.add_arguments(p)
    p.set_defaults(func=_selfcheck)
    from jobs import ops_cmd
    ops_cmd.add_ops_parser(sub)
    p = sub.add_parser("compact", help="copy a results dataset as one Parquet file per run")
    p.add_argument("--results", type=path_arg, default=DEFAULT_RESULTS)
    p.add_argument("--out", type=path_arg, required=True,
                   help="a new (or empty) directory, not inside --results (nor it inside this)")
    p.set_defaults(func=_compact)
    p = sub.add_parser("schema", help="print the results columns (docs/results-schema.md)")
    p.set_defaults(func=_schema)
    p = sub.add_parser("submit", help="ray job submit --working-dir . of a job command, the git "
                                      "commit passed along; its exit status is the job's",
                       description=textwrap.fill(
                           "Submit a job command to a Ray head (README: 'Ray: a head and a "
                           "submitted job'). Token authentication is settled before "
                           "submitting: the head's token file, RAY_AUTH_TOKEN, "
                           "RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token, whichever the head "
                           "accepts. The job's log is followed to its end; the exit status is "
                           "the job's.", 79),
                       epilog=f"exit status:\n{exits.help_text()}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_job_server_arguments(p)
    p.add_argument("--python", default=None, metavar="PATH",
                   help=f"the job's interpreter (default: this one, {sys.executable}, so the job "
                        f"runs in the project's environment; on a cluster whose nodes have the "
                        f"project installed elsewhere give that path, e.g. "
                        f"/opt/lamport/.venv/bin/python)")
    p.add_argument("--submission-id", default=None, metavar="JOB_ID",
                   help="the job's id (default: lamport-UTCTIME-RANDOM, printed)")
    p.add_argument("--no-wait", action="store_true",
                   help="return once the job is taken, without following it (then: status, "
                        "logs, stop)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the job command")
    p.set_defaults(func=_submit)
    for action, helptext in (("status", "a submitted job's status (exit: the job's status "
                                        "once it ended, 0 while it runs)"),
                             ("logs", "a submitted job's log (--follow: until it ends)"),
                             ("stop", "stop a submitted job (SIGTERM: it ends after the case "
                                      "in hand, its run marked interrupted)")):
        p = sub.add_parser(action, help=helptext, description=helptext + ". The job server "
                           "and its token are the ones `submit` uses.")
        p.add_argument("job_id", metavar="JOB_ID", help="the id `submit` printed")
        _add_job_server_arguments(p)
        if action == "logs":
            p.add_argument("--follow", "-f", action="store_true", help="follow until the job ends")
        if action in ("status", "stop"):
            p.add_argument("--wait", choices=("running",), default=None,
                           help="first wait until the job runs and its log shows its first "
                                "case's line (`stop --wait running` then stops it at once, "
                                "so the stop interrupts a run that has begun); one that "
                                "ended first is reported as it is")
            p.add_argument("--timeout", type=number("timeout_s"), default=300.0, metavar="S",
                           help="--wait at most this long, then one line and exit 3 (the job "
                                "goes on; default: %(default)s s)")
        p.set_defaults(func=_follow)
    p = sub.add_parser("head", help="start, check or stop a local Ray head for `submit` and "
                                    "standing pools",
                       description="A local Ray head with token authentication, every server "
                                   "on 127.0.0.1 (or --host), free ports, and its job agent up "
                                   "before this returns (without the dashboard: its GCS; "
                                   "jobs/head.py). status: exit 0 when it runs, 1 when not.")
    p.add_argument("action", choices=("start", "status", "stop"))
    p.add_argument("--dir", type=path_arg, default=None,
                   help=f"where the head's token, log and address live (default: "
                        f"${{{HEAD_DIR_ENV}}} or {DEFAULT_HEAD_DIR})")
    p.add_argument("--host", default="127.0.0.1", metavar="ADDR",
                   help="the address of this machine its servers listen on (default: "
                        "%(default)s, this machine only); another one makes the head "
                        "reachable from the network, where its token file (0600, in --dir) "
                        "is all that keeps it yours")
    p.add_argument("--num-cpus", type=number("num_cpus"), default=None, metavar="N",
                   help="CPUs the head offers (default: this machine's, at least 2)")
    p.add_argument("--wait", type=number("wait_s"), default=180.0, metavar="S",
                   help="how long to wait for the job agent (without the dashboard: the GCS; "
                        "default: %(default)s s)")
    p.add_argument("--dashboard", choices=DASHBOARD_MODES, default="auto",
                   help="start: run Ray's dashboard, and with it the job server `submit` needs "
                        "(default: %(default)s: where Ray's dashboard packages import; on: "
                        "refused where they do not; off: never). Without it the head is ready "
                        "once its GCS answers, and serves pools and --pool NAME, not submit")
    p.set_defaults(func=_head)
    p = sub.add_parser("bisect", help="find the commit that turned a case red: each candidate "
                                      "in a git worktree of its own, only that case run "
                                      "through the service (jobs/bisect.py)",
                       description="Bisect one case between a good and a bad commit "
                                   "(default: its newest green and red nightly runs in "
                                   "--results). Exit 0: found; 1: the range does not "
                                   "reproduce; 2: bad usage; 3: Ray did not start.",
                       epilog=f"exit status:\n{exits.help_text()}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    if full("bisect"):
        from jobs import bisect
        p.add_argument("--case", required=True, metavar="KEY",
                       help="the case's key, as its rows' extra.case_key holds it: "
                            + "|".join(bisect.KEY_FIELDS))
        p.add_argument("--good", default=None, metavar="COMMIT",
                       help="a commit where the case is green (default: its newest green "
                            "nightly before the red one)")
        p.add_argument("--bad", default=None, metavar="COMMIT",
                       help="a commit where it is red (default: its newest red nightly)")
        p.add_argument("--repo", type=path_arg, default=Path("."),
                       help="the git repository (default: the current directory); its "
                            "checkout is never touched, each commit gets a worktree of its own")
        p.add_argument("--suite", type=name_arg, default="smoke",
                       help="the suite the case's parameters come from and the rows' "
                            "partition (default: %(default)s)")
        p.add_argument("--kind", choices=bisect.KINDS, default="auto",
                       help="wrong: a wrong result or hang, one run per commit; latency: a "
                            "regression, good rerun beside each candidate; auto (default): "
                            "from the red night, else from a first run of bad")
        p.add_argument("--parallel", type=number("parallel"), default=None, metavar="N",
                       help="candidates run at once (default: what the cluster has room for)")
        p.add_argument("--results", type=path_arg, default=DEFAULT_RESULTS,
                       help="where the nights are read and the verdict rows written "
                            "(default: %(default)s)")
        p.add_argument("--no-results", action="store_true", help="write no rows")
        p.add_argument("--address", default=None,
                       help="Ray cluster to join (default: RAY_ADDRESS, else an embedded one "
                            "started once for every candidate)")
        p.add_argument("--pool", type=pool_choice, default="job", metavar="job|off",
                       help="the candidates' rank processes: job (default: pools of the "
                            "bisect's own; on an emulated cluster a latency step keeps one per "
                            "commit across its runs) or off (started per run); a standing pool "
                            "runs its own tree's code and is refused")
        _add_format_argument(p)
        _add_rule_arguments(p)
    p.set_defaults(func=_bisect)
    from jobs import pool
    pool.add_parser(sub)
    return parser


def _bisect(args) -> int:
    from jobs import bisect
    return bisect.run_bisect(args)


def _command_of(argv: list[str]) -> str:
    """The command word of ``argv`` ("" for none, e.g. ``--help``)."""
    return argv[0] if argv and not argv[0].startswith("-") else ""


def main(argv: list[str] | None = None) -> int:
    """Parse, run, and turn what ends a command into its exit status
    (jobs.exits): ConfigError USAGE, InfraError INFRA, SIGINT / SIGTERM
    INTERRUPTED_* (handled from the start: Ctrl-C while Ray starts is one
    line too, never a traceback). A reader of stdout or stderr that goes
    away (``| head``) ends nothing (jobs.pipes)."""
    from jobs.embedded import terminate_raises
    from jobs.pipes import outliving_readers
    argv = sys.argv[1:] if argv is None else list(argv)
    from jobs.results import ResultsError
    from jobs.results.run_files import ManifestError
    command = _command_of(argv)
    with terminate_raises(), outliving_readers():
        try:
            if command == "compile-check":  # it owns its options
                from jobs import compile_check
                return compile_check.main(argv[1:])
            parser = build_parser(only=command)
            try:
                args = parser.parse_args(argv)
            except SystemExit as exit_:  # argparse: 2 on bad usage, 0 for --help
                return int(exit_.code or 0)
            args.argv = argv
            if hasattr(args, "func"):
                return args.func(args)
            return _sweep(args, args.jobs, nightly=args.nightly)
        except (ConfigError, ResultsError, ManifestError) as err:
            print(f"python -m jobs {command}: error: {err}", file=sys.stderr)
            return exits.USAGE
        except InfraError as err:
            print(f"python -m jobs {command}: infrastructure: {err}", file=sys.stderr)
            return exits.INFRA
        except Interrupted as stop:
            print(f"python -m jobs {command}: stopped by {stop.name} (exit {stop.code})",
                  file=sys.stderr, flush=True)
            return stop.code


if __name__ == "__main__":
    sys.exit(main())
