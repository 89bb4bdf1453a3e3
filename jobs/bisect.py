"""``python -m jobs bisect``: from a red night to the commit that caused it.

``--case KEY`` is a case's identity as its rows store it (``extra.case_key``,
:meth:`jobs.config.Case.key`: ``job|op|variant|transport|placement|tp|
hidden|tokens|top_k|hc|dtype|inputs|fault|rank|op_args``). ``--good`` and
``--bad`` default to the newest nightly run of that case that went red
(a failing row, or for a timed case a regression by the rule of
:mod:`jobs.regression`) and the newest green one before it, from
``--results``. The candidates are the first-parent commits after good up to
bad (``git rev-list --first-parent good..bad``).

Each commit is checked out into a git worktree of its own under the repo's
git directory (``GIT_COMMON_DIR/lamport-bisect/<sha>``, never the user's
checkout), once: a later bisect of the same repo reuses it (cached by
commit). Its Python dependencies are this environment's: the candidate's
job runs with this interpreter, its working directory the worktree and
first on its PYTHONPATH (then this environment's entries, not this
checkout's root: :func:`candidate_path`), so the driver and (through Ray's
driver path, which puts the driver's directory first on its workers'
``sys.path``) its rank actors run the candidate's code; nothing is installed per commit. A candidate's tree
must therefore work with this environment's packages (a commit that changes
them is tried, and where it cannot run it is skipped, as ``git bisect skip``
would).

A candidate runs only the case, through the service: ``python -m jobs
<job> --config GEN.toml --address GCS`` (a one-case suite with the case's
own parameters from its suite) on the cluster this command starts once
(embedded, loopback, token) or joins (``--address``), results in a scratch
dataset. A latency step runs each commit several times (good in every
step): on an emulated cluster those runs go to the commit's warm driver
(:class:`WarmDriver`, :mod:`jobs.bisect_driver`), a process in its worktree
that joined once and keeps a standing pool of the commit's own rank
workers (``--pool off``: none) between its runs, so only the first run of a
commit pays for the driver's start and its ranks' imports; the drivers of
a step start together before its first run, and a commit's driver ends
once it is judged (the embedded cluster keeps their idle task workers:
:data:`IDLE_WORKERS`). The verdict per commit:

- a wrong result (the case's red row failed, hung or errored; ``--kind
  wrong``): one run; ``pass`` is good, ``fail`` / ``hang`` bad, anything
  else (the job could not run the case) ``skip``;
- a latency regression (``--kind latency``): the good commit is rerun
  beside every candidate in the same step, and both give ``rule.min_history``
  values or more (a correctness case: after ``WARMUP`` calls, ``BATCH``
  calls per value, the fastest of the slowest rank's call phase,
  ``extra.calls_s``; a profile case: one run's ``t_median_us`` per value);
  the candidate's median is judged against the good commit's values by
  :func:`jobs.regression.judge` with the rule's own sigmas and threshold,
  robustly (median and scaled MAD of good's values, so one disturbed good
  run cannot hide a slowdown), and a candidate whose median is worse beyond
  the threshold and whose every value is above every one of good's
  (:func:`separated`) is regressed too, however wide good's spread:
  ``regressed`` is bad, ``ok`` good; ``improved`` (faster than good beyond
  the rule: the good rerun was disturbed) reruns the step once, then
  counts as good. A candidate regressed by the rule whose median is nearer
  good's level than bad's (below the geometric midpoint of good's median
  and bad's median from step 0) is good: the range holds one step from
  one level to the other, and a burst of load on a busy box once put a
  commit with no change +79 % over good, five sigma out, twice in a row. A
  ``regressed`` candidate is judged again, beside a new
  good rerun, before it counts as bad (a burst of load on the machine
  during one candidate's run looks like a regression once, rarely twice);
  when the two judgments differ a third decides. A run that does not pass
  (a host deadline missed on a loaded machine) is run once more; twice, the
  commit is ``skip``.

Where the candidates' code lives: the worktrees are on this machine, and a
candidate's rank actors find its tree through Ray's driver path (the
driver's working directory, put first on its workers' ``sys.path``). On a
cluster of several nodes that path must be there on every node the ranks
may land on (a shared filesystem, or ``--repo`` on one); elsewhere the
ranks would import that node's installed copy. Shipping each tree with the
job (``ray job submit --working-dir`` per candidate) is not done yet.

``--kind auto`` (default) takes the kind from the red night, else from a
first run of bad (a failing row: wrong; passing: latency). Where the
cluster has room (``--parallel``, default: its CPUs or GPUs over what one
candidate's group takes), several candidates run at once and the range is
cut into that many + 1 parts per step.

Every verdict is a row (``job = bisect``, trigger adhoc, the case's
identity, ``outcome`` pass for good, fail for bad, skipped for skip;
``extra.bisect``: the candidate's ``commit``, the step, verdict and
figures; ``git_commit`` is, as for every row, the commit of the tree that
ran the job, here the bisect's own, a fact of its run).
Exit 0: the first bad commit was found (printed with its subject); 1: bad
does not reproduce against good, or skipped commits hide the first bad
one; 2: bad usage, before anything runs; 3: Ray could not be started or
joined.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from jobs import exits
from jobs.config import Case, ConfigError

KEY_FIELDS = ("job", "op", "variant", "transport", "placement", "tp", "hidden", "tokens",
              "top_k", "hc", "dtype", "inputs", "fault", "rank", "op_args")
KINDS = ("auto", "wrong", "latency")
BATCH = 6
"""Calls per latency value of a correctness case. The value is their
fastest: machine noise (a descheduled rank, a peer that publishes late)
only ever adds to a call, so the fastest of a few calls is what the code
costs; the median of such values still swung 3x on the loaded 2-core box."""
WARMUP = 3
"""A correctness run's first calls, left out of its latency values (the
first call of a group pays lazy imports and first touches: 50-250 ms
against 2 ms on the 2-core box)."""
RUN_TIMEOUT_S = 900.0
"""Bound on one candidate run (a subprocess)."""
NOT_READY_EXIT_S = 10.0
"""How long a warm driver that did not become ready gets to exit after EOF
before it is killed: one that failed to start says why and exits, which
took over 0.1 s on a loaded 2-core box (a kill then, and a pool stop the
driver had nothing for)."""
IDLE_WORKERS = 16
"""Idle Ray workers the embedded cluster keeps beyond its CPUs
(``RAY_num_workers_soft_limit``): each warm driver leaves one (its topology
discovery's task), which Ray would otherwise end after a second and the
driver's next run start again (4-8 s on the loaded 2-core box)."""
FAILING = ("fail", "hang", "error")


# ------------------------------------------------------------------ the case
@dataclasses.dataclass(frozen=True)
class CaseKey:
    """A case's identity, parsed from ``--case``: ``case`` (a
    :class:`jobs.config.Case` whose ``key()`` is ``text``; its fields read
    through, ``key.op``) and ``text``."""
    text: str
    case: Case

    def __getattr__(self, name: str):
        if name in ("text", "case"):  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.case, name)

    @classmethod
    def parse(cls, text: str) -> "CaseKey":
        parts = text.split("|")
        if len(parts) != len(KEY_FIELDS):
            raise ConfigError(f"--case {text!r}: a case key has {len(KEY_FIELDS)} fields "
                              f"joined by '|' ({'|'.join(KEY_FIELDS)}), as a row's "
                              f"extra.case_key holds it; got {len(parts)}")
        raw = dict(zip(KEY_FIELDS, parts))

        def opt(name, conv=str):
            v = raw[name]
            if v in ("None", ""):
                return None
            try:
                return conv(v)
            except ValueError:
                raise ConfigError(f"--case {text!r}: {name} {v!r} is not a number") from None

        if raw["job"] not in ("correctness", "faults", "profile"):
            raise ConfigError(f"--case {text!r}: job {raw['job']!r} is not one of correctness, "
                              f"faults, profile")
        from jobs.config import PLACEMENTS, TRANSPORTS, VARIANTS, op_names
        for name, choices in (("op", op_names()), ("variant", VARIANTS),
                              ("transport", TRANSPORTS), ("placement", PLACEMENTS)):
            if raw[name] not in choices:
                raise ConfigError(f"--case {text!r}: {name} {raw[name]!r} is not one of "
                                  f"{', '.join(choices)}")
        args = tuple(tuple(a.split("=", 1)) for a in raw["op_args"].split(",") if a)
        if any(len(a) != 2 for a in args):
            raise ConfigError(f"--case {text!r}: op_args {raw['op_args']!r} must be NAME=VALUE,...")
        case = Case(job=raw["job"], op=raw["op"], variant=raw["variant"],
                    transport=raw["transport"], placement=raw["placement"], tp=opt("tp", int),
                    hidden=opt("hidden", int), tokens=opt("tokens", int),
                    top_k=opt("top_k", int), hc=opt("hc", int), dtype=raw["dtype"], repeats=1,
                    inputs=opt("inputs"), fault=opt("fault"), rank=opt("rank", int),
                    op_args=args)
        if None in (case.tp, case.hidden, case.tokens):
            raise ConfigError(f"--case {text!r}: tp, hidden and tokens are required")
        return cls(text=text, case=case)

    def row_fields(self) -> dict:
        """The results columns of the case's identity."""
        return dict(op=self.op, variant=self.variant, transport=self.transport,
                    placement=self.placement, tp=self.tp, hidden=self.hidden,
                    tokens=self.tokens, top_k=self.top_k, hc=self.hc, dtype=self.dtype)

    def label(self) -> str:
        return self.case.label()


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value))


def _literal(text: str):
    """An op_args value as the suite file would give it."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        return text


def case_params(key: CaseKey, suite: str) -> tuple[dict, int]:
    """The job parameters (budget_ns, timeout_s, calls, ...) and the calls
    per run (``repeats``) the case has in ``suite`` (this tree's copy), or
    the job's defaults and 1 when it has none."""
    from jobs.config import load_suite, suite_path
    try:
        cases = load_suite(suite_path(suite)).cases
    except ConfigError:
        return {}, 1
    for case in cases:
        if case.key() == key.text or (case.placement == "auto" and case.key().replace(
                "|auto|", f"|{key.placement}|", 1) == key.text):
            return dict(case.params), case.repeats
    return {}, 1


def reads_budget_ns(tree: Path) -> bool:
    """Whether the suite loader of the tree at ``tree`` reads the budget as
    ``budget_ns`` (a tree from before the budget had one name reads
    ``budget_ms`` in correctness / faults sweeps and ``watchdog_ns`` in
    profile ones, and refuses ``budget_ns`` as an unknown key)."""
    try:
        return '_limited("budget_ns")' in (tree / "jobs" / "config.py").read_text()
    except OSError:
        return True


def older_budget(job: str, params: dict) -> dict:
    """``params`` as a tree that predates ``budget_ns`` reads them
    (:func:`reads_budget_ns`): ``budget_ns`` written as ``budget_ms`` (float
    milliseconds) for correctness and faults, ``watchdog_ns`` for profile."""
    if params.get("budget_ns") is None:
        return params
    out = {k: v for k, v in params.items() if k != "budget_ns"}
    if job == "profile":
        out["watchdog_ns"] = params["budget_ns"]
    else:
        out["budget_ms"] = params["budget_ns"] / 1e6
    return out


def candidate_path(tree: Path, pythonpath: str | None = None) -> str:
    """A candidate's PYTHONPATH: its tree first, then this environment's own
    entries (``pythonpath``, default ``$PYTHONPATH``: packages staged
    outside site-packages, as on the GPU machines), each made absolute
    (the candidate's working directory is its tree), less this project's
    root and the tree itself, so no module of this checkout shadows the
    candidate's."""
    own = Path(__file__).resolve().parents[1]
    raw = os.environ.get("PYTHONPATH", "") if pythonpath is None else pythonpath
    keep = []
    for entry in raw.split(os.pathsep):
        path = Path(entry or ".").resolve()
        if path not in (own, Path(tree).resolve()) and str(path) not in keep:
            keep.append(str(path))
    return os.pathsep.join([str(tree), *keep])


def suite_toml(key: CaseKey, params: dict, repeats: int) -> str:
    """A suite of one case: ``key`` with ``params`` and ``repeats`` calls."""
    lines = ["format = 1", 'name = "bisect"', "version = 1",
             f'description = "jobs bisect: {key.label()}"', "", f"[[{key.job}]]",
             f"op = {_toml(key.op)}", f"variant = {_toml(key.variant)}",
             f"transport = {_toml(key.transport)}", f"placement = {_toml(key.placement)}",
             f"dtype = {_toml(key.dtype)}", f"tp = [{key.tp}]", f"hidden = [{key.hidden}]",
             f"tokens = [{key.tokens}]", f"repeats = {repeats}"]
    for name in ("top_k", "hc"):
        if getattr(key, name) is not None:
            lines.append(f"{name} = {getattr(key, name)}")
    for name, value in key.op_args:
        lines.append(f"{name} = [{_toml(_literal(value))}]")
    if key.inputs:
        lines.append(f"inputs = [{_toml(key.inputs)}]")
    if key.fault:
        lines.append(f"kinds = [{_toml(key.fault)}]")
    if key.rank is not None and key.job == "faults":
        lines.append(f"rank = {key.rank}")
    for name, value in sorted(params.items()):
        if value is not None:
            lines.append(f"{name} = {_toml(value)}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ git
def git(repo: Path, *argv: str, check: bool = True) -> str:
    done = subprocess.run(["git", "-C", str(repo), *argv], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise ConfigError(f"git {' '.join(argv)} in {repo}: "
                          f"{done.stderr.strip() or done.returncode}")
    return done.stdout.strip()


def resolve(repo: Path, flag: str, rev: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet",
                           f"{rev}^{{commit}}"], capture_output=True, text=True)
    if done.returncode != 0 or not done.stdout.strip():
        raise ConfigError(f"{flag} {rev!r}: not a commit of {repo}")
    return done.stdout.strip()


def subject(repo: Path, sha: str) -> str:
    return git(repo, "log", "-1", "--format=%s", sha)


class Worktrees:
    """One detached worktree per commit under ``GIT_COMMON_DIR/lamport-bisect``,
    made once and reused (cached by commit)."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo
        common = Path(git(repo, "rev-parse", "--git-common-dir"))
        self.root = (common if common.is_absolute() else repo / common).resolve() / "lamport-bisect"

    def get(self, sha: str) -> tuple[Path, bool]:
        """(the worktree of ``sha``, whether it was made now)."""
        path = self.root / sha
        ready = path / ".lamport-bisect-ready"
        if ready.is_file() and git(path, "rev-parse", "HEAD", check=False) == sha:
            return path, False
        if path.exists():
            git(self.repo, "worktree", "remove", "--force", str(path), check=False)
            if path.exists():
                import shutil
                shutil.rmtree(path)
            git(self.repo, "worktree", "prune", check=False)
        self.root.mkdir(parents=True, exist_ok=True)
        git(self.repo, "worktree", "add", "--detach", "--force", str(path), sha)
        ready.write_text(f"{sha}\n")
        return path, True


# ------------------------------------------------------------------ the nights
def nights(results: Path, key: CaseKey, rule) -> list[tuple[str, str, str, dt.datetime]]:
    """The case's nightly runs, oldest first: (run_id, commit, 'green' |
    'red', started_at); red: a failing row, or a regressed timing."""
    from jobs import regression
    from jobs.results import read_results
    from jobs.results.schema import row_job
    table = read_results(results)
    out = {}
    for r in table.to_pylist():
        if r["trigger"] != "nightly" or row_job(r) == "bisect":
            continue
        if json.loads(r.get("extra") or "{}").get("case_key") != key.text:
            continue
        red = r["outcome"] in FAILING
        if not red and r["outcome"] != "pass":
            continue
        run = out.setdefault(r["run_id"], [r["git_commit"], False, r["started_at"]])
        run[1] = run[1] or red
    for run_id, run in out.items():
        if not run[1] and key.job == "profile":
            run[1] = any(v.status == "regressed" and v.case["op"] == key.op
                         and v.case["tp"] == key.tp and v.case["hidden"] == key.hidden
                         and v.case["tokens"] == key.tokens and v.case["variant"] == key.variant
                         for v in regression.detect(results, run_id, rule))
    return sorted(((rid, c, "red" if red else "green", t) for rid, (c, red, t) in out.items()),
                  key=lambda x: x[3])


def default_range(results: Path, key: CaseKey, rule, good: str | None, bad: str | None):
    """(good, bad, kind hint) from the case's nights where not given."""
    hint = None
    if good and bad:
        return good, bad, hint
    if not Path(results).is_dir():
        raise ConfigError(f"--good/--bad: not given, and --results {results} holds no runs "
                          f"to take them from")
    found = nights(results, key, rule)
    reds = [n for n in found if n[2] == "red" and n[1]]
    if bad is None:
        if not reds:
            raise ConfigError(f"--bad: not given, and no nightly run in {results} has case "
                              f"{key.text!r} red")
        bad_night = reds[-1]
        bad = bad_night[1]
        hint = "wrong" if key.job != "profile" else "latency"
        before = [n for n in found if n[3] < bad_night[3]]
    else:
        before = found
    if good is None:
        greens = [n for n in before if n[2] == "green" and n[1]]
        if not greens:
            raise ConfigError(f"--good: not given, and no green nightly run of case "
                              f"{key.text!r} before the red one in {results}")
        good = greens[-1][1]
    return good, bad, hint


# ------------------------------------------------------------------ a run
@dataclasses.dataclass
class Outcome:
    sha: str
    outcome: str | None   # the case row's outcome (None: no row)
    values: list[float]   # latency values (s or us)
    reason: str | None
    wall_s: float
    command: str


class WarmDriver:
    """One commit's warm driver (:mod:`jobs.bisect_driver`): a process in the
    commit's worktree that joined the cluster once and keeps its standing
    pool ``pool`` (``-``: none) of ``warm`` rank workers up, running one
    ``python -m jobs`` command line a request (``warmup``, when given, once
    before it is ready: its first use's costs are paid then). Started by the
    constructor; :meth:`wait_ready` before :meth:`run`."""

    def __init__(self, tree: Path, address: str, pool: str, warm: int, log: Path,
                 env: dict, warmup: tuple[list[str], Path] | None = None) -> None:
        import queue
        import threading
        self.pool, self.log = pool, log
        first = "-" if warmup is None else json.dumps({"argv": warmup[0],
                                                       "output": str(warmup[1])})
        self.proc = subprocess.Popen(
            [sys.executable, "-c", DRIVER_SOURCE, address, pool, str(warm), str(log), first],
            cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._answers: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.ready: bool | None = None   # None: not answered yet
        self.error: str | None = None

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._answers.put(json.loads(line))
        self._answers.put({"gone": True})  # EOF: the driver exits

    def _answer(self, timeout_s: float) -> dict | None:
        """Its next answer; None where none came within ``timeout_s``;
        ``{"gone": True}`` where it exited (reaped)."""
        import queue
        try:
            said = self._answers.get(timeout=timeout_s)
        except queue.Empty:
            return None
        if said.get("gone"):
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        return said

    def wait_ready(self, timeout_s: float) -> bool:
        """Whether it started (``error`` says why not)."""
        if self.ready is None:
            said = self._answer(timeout_s)
            self.ready = bool(said and said.get("ready"))
            if said is None:
                self.error = f"no answer within {timeout_s:g} s"
            elif said.get("gone"):
                self.error = f"exit {self.proc.poll()} (its output: {self.log})"
            elif not self.ready:
                self.error = said.get("error") or f"not ready: {said}"
        return self.ready

    def run(self, argv: list[str], output: Path, timeout_s: float) -> tuple[int | None, str]:
        """(the exit status of ``python -m jobs *argv`` run in the driver,
        None where it raised, died or ran past ``timeout_s``; what it said)."""
        self.proc.stdin.write(json.dumps({"argv": argv, "output": str(output)}) + "\n")
        self.proc.stdin.flush()
        said = self._answer(timeout_s)
        text = output.read_text() if output.is_file() else ""
        if said is None or said.get("gone"):
            why = (f"timed out after {timeout_s:g} s" if said is None
                   else f"the warm driver exited ({self.proc.poll()})")
            self.close(timeout_s=0)
            return None, f"{text}\n{why}"
        return said.get("code"), text + (said.get("error") or "")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, timeout_s: float = 60.0) -> None:
        """Ends it: EOF (its pool stopped, Ray left), killed after
        ``timeout_s`` (not ready: after at most ``NOT_READY_EXIT_S``)."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=timeout_s if self.ready else min(timeout_s, NOT_READY_EXIT_S))
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
            self._stop_pool()

    def _stop_pool(self) -> None:
        """A killed driver's standing pool (its workers are detached); from
        a process joined to the cluster (the bisect's), else only named."""
        if self.pool == "-":
            return
        import ray

        from cluster.pool import WorkerPool
        try:
            if not ray.is_initialized():
                raise RuntimeError("this process has not joined the cluster")
            try:
                pool = WorkerPool.attach(self.pool)
            except ValueError:
                return  # not started, or stopped already
            pool.stop()
        except Exception as err:  # noqa: BLE001 - said, not fatal: the bisect goes on
            print(f"   (the standing pool {self.pool} of a killed warm driver was not stopped: "
                  f"{err}; python -m jobs pool stop --name {self.pool})", flush=True)


DRIVER_SOURCE = (Path(__file__).with_name("bisect_driver.py")).read_text()


class Runner:
    """Runs the case on one commit's worktree through the service.

    A cold run is one ``python -m jobs JOB`` process: the driver starts,
    joins the cluster and starts its ranks (seconds to tens of seconds on a
    loaded box, against milliseconds a call). With ``warm`` (an emulated
    cluster) a run asked for warm goes to the commit's :class:`WarmDriver`
    instead (started by :meth:`prepare` or the commit's first warm run,
    ended by :meth:`retire`): the same command line in a driver that stays
    joined, its ranks from a standing pool of the commit's own (``--pool
    off``: started per run). A commit whose warm driver cannot start runs
    cold. On GPUs every run is cold: a standing pool holds every GPU of its
    node, so two commits' pools could not both stand."""

    def __init__(self, key: CaseKey, suite: str, worktrees: Worktrees, scratch: Path,
                 address: str, pool: str, *, warm: bool = False, starts: int = 1) -> None:
        self.key, self.worktrees, self.scratch = key, worktrees, scratch
        self.address, self.pool, self.warm = address, pool, warm
        self.starts = max(1, starts)
        """Warm drivers started at once (the bisect's ``parallel``): on a
        cluster with room for one candidate, starting three together only
        shares its CPUs three ways, and on a loaded box their groups' setups
        then ran past the setup timeout, were killed and started again."""
        self.params, self.repeats = case_params(key, suite)
        self.runs = 0
        self.drivers: dict[str, WarmDriver | None] = {}  # None: runs cold

    def _argv(self, tree: Path, where: Path, repeats: int, pool: str) -> list[str]:
        """``python -m jobs`` arguments of a run of the case on the worktree
        ``tree``, ``repeats`` calls, ranks from ``pool``, its config (written
        now, in the budget field that tree reads) and results in the new
        directory ``where``."""
        where.mkdir(parents=True, exist_ok=True)
        config = where / "case.toml"
        params = self.params if reads_budget_ns(tree) else older_budget(self.key.job, self.params)
        config.write_text(suite_toml(self.key, params, repeats))
        argv = [self.key.job, "--config", str(config), "--results", str(where / "results"),
                "--address", self.address, "--pool", pool, "--trigger", "adhoc"]
        return argv + (["--backend", "gpu"] if self.key.job == "profile" else [])

    def _env(self, tree: Path, sha: str) -> dict:
        return {**os.environ, "PYTHONPATH": candidate_path(tree), "LAMPORT_GIT_COMMIT": sha}

    def prepare(self, shas: list[str]) -> None:
        """The warm drivers of ``shas`` up (``starts`` started at a time), or
        their commits marked to run cold. Before a step's runs: a driver starting
        beside a measured run would slow it down."""
        if not self.warm:
            return
        t0, new = time.monotonic(), [sha for sha in shas if sha not in self.drivers]
        for at in range(0, len(new), self.starts):
            batch = new[at:at + self.starts]
            for sha in batch:
                tree, _ = self.worktrees.get(sha)
                pool = "-" if self.pool == "off" else f"bisect-{sha[:12]}-{self.scratch.name[-8:]}"
                where = self.scratch / f"warmup-{sha[:12]}"
                argv = self._argv(tree, where, WARMUP, self.pool if pool == "-" else pool)
                self.drivers[sha] = WarmDriver(tree, self.address, pool, self.key.tp,
                                               self.scratch / f"driver-{sha[:12]}.txt",
                                               self._env(tree, sha), (argv, where / "output.txt"))
            for sha in batch:
                self._await_driver(sha)
        for sha in shas:
            if sha not in new:
                self._await_driver(sha)
        if new:
            print(f"   (warm drivers of {', '.join(s[:12] for s in new)}: "
                  f"{time.monotonic() - t0:.1f} s to start)", flush=True)

    def _await_driver(self, sha: str) -> None:
        """Wait until ``sha``'s driver is ready, or mark the commit to run cold."""
        driver = self.drivers[sha]
        if driver is not None and not driver.wait_ready(RUN_TIMEOUT_S):
            print(f"   ({sha[:12]}: no warm driver ({driver.error.strip().splitlines()[-1]}"
                  f"); its runs start cold)", flush=True)
            driver.close()
            self.drivers[sha] = None

    def retire(self, keep: set[str]) -> None:
        """End the warm drivers of every commit but ``keep``."""
        for sha in [s for s in self.drivers if s not in keep]:
            driver = self.drivers.pop(sha)
            if driver is not None:
                driver.close()

    def close(self) -> None:
        self.retire(set())

    def run(self, sha: str, repeats: int, *, warm: bool = False) -> Outcome:
        """The case's row on ``sha``, run ``repeats`` times; through the
        commit's warm driver with ``warm`` where the runner is warm."""
        tree, made = self.worktrees.get(sha)
        self.runs += 1
        where = self.scratch / f"{self.runs:03d}-{sha[:12]}"
        argv = self._argv(tree, where, repeats, self.pool)
        command = [sys.executable, "-m", "jobs", *argv]  # the repro: no pool of the bisect's
        t0 = time.monotonic()
        if warm:
            self.prepare([sha])
        driver = self.drivers.get(sha) if warm and self.warm else None
        if driver is not None:
            if driver.pool != "-":
                argv[argv.index("--pool") + 1] = driver.pool
            code, said = driver.run(argv, where / "output.txt", RUN_TIMEOUT_S)
            if not driver.alive():
                del self.drivers[sha]  # the next run starts a new one
        else:
            try:
                done = subprocess.run(command, cwd=tree, env=self._env(tree, sha),
                                      capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
                said, code = done.stdout + done.stderr, done.returncode
            except subprocess.TimeoutExpired as err:
                said, code = f"timed out after {RUN_TIMEOUT_S:g} s: {err}", None
        wall = time.monotonic() - t0
        (where / "output.txt").write_text(said)
        outcome, values, reason = self._read(where / "results")
        if outcome is None:
            tail = " | ".join(said.strip().splitlines()[-3:])
            reason = f"no row (exit {code}): {tail[-300:]}"
        return Outcome(sha, outcome, values, reason, wall,
                       f"cd {shlex.quote(str(tree))} && PYTHONPATH=. {shlex.join(command)}")

    def _read(self, results: Path):
        from jobs.results import read_results
        if not results.is_dir():
            return None, [], None
        try:
            rows = read_results(results).to_pylist()
        except Exception as err:  # noqa: BLE001 - an old tree's rows: the commit is skipped
            return None, [], f"its rows do not read: {err}"
        rows = [r for r in rows if r.get("op") == self.key.op]
        if not rows:
            return None, [], None
        row = next((r for r in rows if r["outcome"] != "pass"), rows[0])
        values = []
        if row["outcome"] == "pass":
            if self.key.job == "profile":
                values = [r["t_median_us"] for r in rows if r.get("t_median_us") is not None
                          and not str(r.get("variant") or "").startswith("baseline:")]
            else:
                x = json.loads(row.get("extra") or "{}")
                calls = x.get("calls_s") or []
                if not calls and (x.get("phases_s") or {}).get("call"):
                    calls = [x["phases_s"]["call"] / max(1, x.get("repeats") or 1)]
                calls = calls[WARMUP:] if len(calls) > WARMUP else calls
                values = [min(calls[i:i + BATCH])
                          for i in range(0, len(calls) - BATCH + 1, BATCH)] or calls[:1]
        return row["outcome"], values, row.get("reason")


# ------------------------------------------------------------------ the bisect
@dataclasses.dataclass
class Verdict:
    sha: str
    verdict: str        # good | bad | skip
    why: str
    outcome: Outcome
    good_values: list[float] = dataclasses.field(default_factory=list)
    step: int = 0


class Bisect:
    """A step runs its commits at once (subprocesses joining one cluster);
    in latency mode the good commit is run beside them in the same step and
    each candidate is judged against that rerun's values."""

    def __init__(self, key: CaseKey, kind: str, runner: Runner, rule, good: str,
                 parallel: int = 1, bad: str | None = None) -> None:
        self.key, self.kind, self.runner, self.rule, self.good = key, kind, runner, rule, good
        self.parallel = parallel
        self.need = rule.min_history
        self.bad = bad
        self.bad_level: float | None = None
        """The median of bad's values when it was judged (step 0): a
        candidate regressed by the rule but nearer good's level than bad's
        (:meth:`_latency`) is good."""

    def _values(self, sha: str) -> Outcome:
        """Runs of ``sha`` until it gave ``need`` latency values (or failed)."""
        out = None
        per_run = (WARMUP + BATCH * self.need if self.key.job == "correctness"
                   else self.runner.repeats)
        retried = False
        while out is None or (out.outcome == "pass" and len(out.values) < self.need):
            more = self.runner.run(sha, per_run, warm=True)
            if more.outcome != "pass" and not retried:
                # a latency step judges speed: a run that did not pass (a host
                # deadline missed on a loaded machine) is run once more
                print(f"   ({sha[:12]}: {more.outcome or 'no row'}: {more.reason}; once more)",
                      flush=True)
                retried = True
                lost = more.wall_s
                more = self.runner.run(sha, per_run, warm=True)
                more.wall_s += lost
            if out is None:
                out = more
            else:
                out.values += more.values
                out.wall_s += more.wall_s
                if more.outcome != "pass":
                    out.outcome, out.reason = more.outcome, more.reason
            if out.outcome == "pass" and not more.values:
                out.outcome, out.reason = None, "its rows carry no timing"
                break
        return out

    def step(self, shas: list[str]) -> list[Verdict]:
        """The verdicts of ``shas`` (good among them in wrong mode: its own
        verdict), their runs at once."""
        for sha in [*shas, self.good]:
            self.runner.worktrees.get(sha)  # made one at a time (git locks), before the runs
        if self.kind == "wrong":
            outs = _at_once(lambda sha: self.runner.run(sha, self.runner.repeats), shas,
                            self.parallel)
            return [self._wrong(o) for o in outs]
        self.runner.prepare([self.good, *shas])
        for attempt in range(2):
            outs = _at_once(self._values, [self.good, *shas],
                            self.parallel + 1 if self.parallel > 1 else 1)
            good, cands = outs[0], outs[1:]
            if good.outcome != "pass":
                raise RuntimeError(f"the good commit {self.good[:12]} did not pass when rerun "
                                   f"beside {', '.join(s[:12] for s in shas)}: "
                                   f"{good.outcome}: {good.reason}")
            bad = next((c for c in cands if c.sha == self.bad), None)
            if bad is not None and bad.outcome == "pass" and bad.values:
                self.bad_level = statistics.median(bad.values)
            verdicts = [self._latency(c, good) for c in cands]
            if attempt or not any(v.why.startswith("improved") for v in verdicts):
                break
            print(f"   (a candidate ran faster than good beyond the rule: the good rerun was "
                  f"disturbed; the step once more)", flush=True)
        return [self._confirmed(v) for v in verdicts]

    def _confirmed(self, first: Verdict) -> Verdict:
        """A latency ``bad`` judged again beside a new good rerun; a third
        judgment decides when the two differ (the majority's last verdict)."""
        if first.verdict != "bad":
            return first
        seen = [first]
        while len(seen) < 3 and not (len(seen) == 2 and seen[0].verdict == seen[1].verdict):
            print(f"   ({first.sha[:12]} regressed: judged again beside a new good rerun)",
                  flush=True)
            good, cand = _at_once(self._values, [self.good, first.sha],
                                  2 if self.parallel > 1 else 1)
            if good.outcome != "pass":
                raise RuntimeError(f"the good commit {self.good[:12]} did not pass when rerun "
                                   f"beside {first.sha[:12]}: {good.outcome}: {good.reason}")
            seen.append(self._latency(cand, good))
        bads = [v for v in seen if v.verdict == "bad"]
        last = bads[-1] if len(bads) * 2 > len(seen) else \
            next((v for v in reversed(seen) if v.verdict == "good"), seen[-1])
        last.why += f" ({len(bads)} of {len(seen)} judgments regressed)"
        last.outcome.wall_s = sum(v.outcome.wall_s for v in seen)
        return last

    @staticmethod
    def _wrong(out: Outcome) -> Verdict:
        if out.outcome == "pass":
            return Verdict(out.sha, "good", "pass", out)
        if out.outcome in ("fail", "hang"):
            return Verdict(out.sha, "bad", f"{out.outcome}: {out.reason or ''}".strip(": "), out)
        return Verdict(out.sha, "skip", f"{out.outcome or 'no row'}: {out.reason or ''}", out)

    def _latency(self, cand: Outcome, good: Outcome) -> Verdict:
        if cand.outcome != "pass":
            # twice not passing (Bisect._values): no latency to judge; a wrong
            # result in the range is a bisect of its own (--kind wrong)
            return Verdict(cand.sha, "skip", f"{cand.outcome}: {cand.reason}", cand, good.values)
        from jobs.regression import judge
        v = judge((self.key.text,), statistics.median(cand.values), good.values, (), self.rule,
                  robust=True)
        status = v.status
        if status == "ok" and v.change > self.rule.threshold and separated(cand.values,
                                                                            good.values):
            status = "regressed (every value above good's)"
        median = statistics.median(cand.values)
        level = self.bad_level if cand.sha != self.bad else None
        if status.startswith("regressed") and level and v.mean_us and level > v.mean_us:
            # The range holds one step from good's level to bad's: a commit
            # nearer good's (geometric midpoint) has not taken it, whatever a
            # burst of load did to its one run.
            middle = (level * v.mean_us) ** 0.5
            if median < middle:
                status = (f"ok (regressed by the rule, but nearer good's level than bad's "
                          f"{_fmt(level, self.key)}: below the midpoint {_fmt(middle, self.key)})")
        why = (f"{status}: median {_fmt(v.current_us, self.key)} vs good's median "
               f"{_fmt(v.mean_us, self.key)} (MAD sigma {_fmt(v.stdev_us, self.key)}, "
               f"n={v.n} values beside it), {v.change:+.1%}")
        return Verdict(cand.sha, "bad" if status.startswith("regressed") else "good", why, cand,
                       good.values)


def separated(cand: list[float], good: list[float]) -> bool:
    """Every candidate value above every good value. Two samples of one
    distribution, 5 values each, are so ordered once in 252 (Mann-Whitney's
    U = 0): on a loaded machine, where good's values spread wide enough to
    hide a slowdown from the sigma rule (the MAD of a sample whose calm and
    disturbed runs differ tenfold), the order of the values still shows it."""
    return bool(cand) and bool(good) and min(cand) > max(good)


def _at_once(fn, items: list, most: int) -> list:
    """``fn`` over ``items``, ``most`` at a time (1: in turn)."""
    if most <= 1 or len(items) == 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(most, len(items))) as pool:
        return list(pool.map(fn, items))


def _fmt(value, key: CaseKey) -> str:
    if value is None:
        return "-"
    return f"{value:.2f} us" if key.job == "profile" else f"{value * 1e3:.2f} ms"


def probes(lo: int, hi: int, parts: int, skipped: set[int]) -> list[int]:
    """Up to ``parts - 1`` indices strictly between lo and hi, evenly spread,
    none of them skipped."""
    inside = [i for i in range(lo + 1, hi) if i not in skipped]
    if not inside:
        return []
    k = min(parts - 1, len(inside))
    picks = sorted({inside[(len(inside) * (j + 1)) // (k + 1)] for j in range(k)})
    return picks or [inside[len(inside) // 2]]


VERDICT_COLS = (("commit", 40), ("subject", 40), ("step", 4, "d"), ("verdict", 7),
                ("first_bad", 9), ("why", 40), ("values", 20), ("good_values", 20),
                ("wall_s", 7, ".1f"))


def run_bisect(args) -> int:
    """The bisect (module docstring); with ``--format`` csv, json or md its
    progress goes to stderr and stdout holds only the table of verdicts, one
    row per commit tried (:mod:`jobs.formats`)."""
    import contextlib
    from jobs.formats import write
    from jobs.table import Col
    fmt = getattr(args, "format", "table")
    if fmt == "table":
        return _run_bisect(args, {})
    verdicts: dict[str, Verdict] = {}
    first_bad: list[str] = []
    with contextlib.redirect_stdout(sys.stderr):
        code = _run_bisect(args, verdicts, first_bad)
    repo = Path(args.repo).resolve()
    write(fmt, [Col(*c) for c in VERDICT_COLS],
          ([v.sha, subject(repo, v.sha), v.step, v.verdict, v.sha in first_bad, v.why,
            json.dumps(v.outcome.values) if v.outcome.values else None,
            json.dumps(v.good_values) if v.good_values else None, v.outcome.wall_s]
           for v in sorted(verdicts.values(), key=lambda v: v.step)))
    return code


def _run_bisect(args, verdicts: dict, first_bad: list | None = None) -> int:
    from jobs.session import ray_session
    from jobs.regression import Rule
    rule = Rule(history=args.history, min_history=args.min_history, sigmas=args.sigmas,
                threshold=args.threshold)
    rule.validate()
    key = CaseKey.parse(args.case)
    repo = Path(args.repo).resolve()
    if not repo.is_dir() or subprocess.run(["git", "-C", str(repo), "rev-parse", "--git-dir"],
                                           capture_output=True).returncode != 0:
        raise ConfigError(f"--repo {args.repo}: not a git repository")
    from jobs.outputs import check_results  # read for the range, written with the verdicts
    check_results("--results", args.results)
    good, bad, hint = default_range(args.results, key, rule, args.good, args.bad)
    good = resolve(repo, "--good", good)
    bad = resolve(repo, "--bad", bad)
    if good == bad:
        raise ConfigError(f"--good {args.good or good[:12]} and --bad {args.bad or bad[:12]} "
                          f"are the same commit")
    if subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", good, bad],
                      capture_output=True).returncode != 0:
        raise ConfigError(f"--good {good[:12]} is not an ancestor of --bad {bad[:12]}")
    if args.pool not in ("job", "off"):
        raise ConfigError(f"--pool {args.pool}: a standing pool's workers run the code of the "
                          f"tree that started them, not the candidate's; give --pool job "
                          f"(default) or off")
    suite = args.suite
    from jobs.config import suite_path
    suite_path(suite)
    commits = git(repo, "rev-list", "--first-parent", "--reverse", f"{good}..{bad}").split()
    from jobs.session import check_address
    if args.address:
        check_address(args.address)
    else:
        from jobs.embedded import ensure_token, token_path
        ensure_token(token_path())

    t_start = time.monotonic()
    print(f"bisect: case {key.label()} ({key.text})\n  repo {repo}\n  good {good[:12]} "
          f"{subject(repo, good)}\n  bad  {bad[:12]} {subject(repo, bad)}\n  {len(commits)} "
          f"commit(s) after good; environment: this interpreter ({sys.executable}), each "
          f"commit's tree on PYTHONPATH", flush=True)
    if not (args.address or os.environ.get("RAY_ADDRESS")):
        os.environ.setdefault("RAY_num_workers_soft_limit",
                              str((os.cpu_count() or 2) + IDLE_WORKERS))
    import contextlib
    import ray
    with ray_session(args.address) as how, contextlib.ExitStack() as stack:
        address = ray.get_runtime_context().gcs_address
        parallel = args.parallel or _room(key)
        print(f"ray: {how}; candidates join it at {address}; {parallel} at once", flush=True)
        from jobs.results import new_run_id
        run_id = new_run_id()
        worktrees = Worktrees(repo)
        scratch = worktrees.root / "runs" / run_id
        runner = stack.enter_context(contextlib.closing(Runner(
            key, suite, worktrees, scratch, address, args.pool,
            warm=key.job != "profile" and not ray.cluster_resources().get("GPU"),
            starts=parallel)))
        kind = args.kind if args.kind != "auto" else hint
        writer = _writer(args, run_id)
        step = 0
        first = None
        if kind is None:
            probe = runner.run(bad, runner.repeats)
            if probe.outcome not in ("pass", "fail", "hang"):
                print(f"\nbisect: the range does not reproduce: bad {bad[:12]} could not run "
                      f"the case ({probe.outcome or 'no row'}: {probe.reason}); its command:\n"
                      f"  {probe.command}", flush=True)
                return exits.FAILED
            kind = "wrong" if probe.outcome in ("fail", "hang") else "latency"
            print(f"kind: {kind} (bad's first run: {probe.outcome}: {probe.reason or ''})",
                  flush=True)
            if kind == "wrong":
                first = Verdict(bad, "bad", f"{probe.outcome}: {probe.reason}", probe)
        bis = Bisect(key, kind, runner, rule, good, parallel, bad=bad)
        print(f"kind: {kind}" + (f"; the rule: {rule.describe()}, applied to {bis.need} values "
                                 f"of good rerun beside the candidates of each step"
                                 if kind == "latency" else "; one run per commit"), flush=True)

        def record(vs: list[Verdict]) -> None:
            for v in vs:
                v.step = step
                verdicts[v.sha] = v
                print(f"step {step}: {v.sha[:12]} {subject(repo, v.sha)[:60]!r}: {v.verdict} "
                      f"({v.why}; {v.outcome.wall_s:.1f} s)", flush=True)
                _row(writer, key, v, good, bad, kind)

        # Step 0: bad must reproduce (and, for a wrong result, good must
        # pass); the middle of the range runs beside them (the first probe).
        lo, hi = -1, len(commits) - 1     # commits[lo] good (-1: good itself), commits[hi] bad
        skipped: set[int] = set()
        picks = probes(lo, hi, parallel + 1, skipped)
        if first is not None:
            record([first])
        record(bis.step([c for c in ([bad] if first is None else []) +
                         ([good] if kind == "wrong" else []) + [commits[i] for i in picks]]))
        if verdicts[bad].verdict != "bad" or (kind == "wrong" and verdicts[good].verdict != "good"):
            why = (f"bad {bad[:12]} is {verdicts[bad].verdict}" if verdicts[bad].verdict != "bad"
                   else f"good {good[:12]} is {verdicts[good].verdict}")
            print(f"\nbisect: the range does not reproduce ({why}); "
                  f"{time.monotonic() - t_start:.1f} s", flush=True)
            return exits.FAILED
        while True:
            for i in picks:
                v = verdicts[commits[i]].verdict
                if v == "skip":
                    skipped.add(i)
            goods = [i for i in picks if verdicts[commits[i]].verdict == "good"]
            bads = [i for i in picks if verdicts[commits[i]].verdict == "bad"]
            if bads:
                hi = min(bads)
            if goods:
                lo = max([g for g in goods if g < hi], default=lo)
            picks = probes(lo, hi, parallel + 1, skipped) if hi - lo > 1 else []
            if not picks:
                break
            step += 1
            runner.retire({good})  # the commits judged so far are not run again
            record(bis.step([commits[i] for i in picks]))
        wall = time.monotonic() - t_start
        tested = len(verdicts)
        if hi - lo > 1:
            among = ", ".join(c[:12] for c in commits[lo + 1:hi + 1])
            print(f"\nbisect: the first bad commit is one of {among} (the ones between could "
                  f"not be tested); {tested} commit(s) tried in {step} step(s), {wall:.1f} s",
                  flush=True)
            return exits.FAILED
        sha = commits[hi]
        print(f"\nfirst bad commit: {sha} {subject(repo, sha)}\n  {verdicts[sha].why}\n"
              f"  {tested} commit(s) tried in {step + 1} step(s) (step 0 checks the range), "
              f"{runner.runs} run(s), {wall:.1f} s; rows: {args.results} (run {run_id}, "
              f"job bisect)", flush=True)
        if writer is not None:
            _row(writer, key, verdicts[sha], good, bad, kind, first_bad=True)
        if first_bad is not None:
            first_bad.append(sha)
        return exits.OK


def _room(key: CaseKey) -> int:
    """Candidates at once on the open cluster: its CPUs (emulated) or GPUs
    over what one candidate's group takes (tp ranks, twice for a latency
    step with good beside it)."""
    import ray
    res = ray.cluster_resources()
    if key.job == "profile" or res.get("GPU", 0):
        return max(1, int(res.get("GPU", 0) // key.tp))
    return max(1, int(res.get("CPU", 1) // (2 * key.tp)))


def _writer(args, run_id: str):
    if args.no_results:
        return None
    from jobs.results import ResultsWriter
    return ResultsWriter(args.results, suite=args.suite, run_id=run_id, trigger="adhoc")


def _row(writer, key: CaseKey, v: Verdict, good: str, bad: str, kind: str, *,
         first_bad: bool = False) -> None:
    if writer is None:
        return
    from jobs.recorder import now
    from jobs.results import make_row
    outcome = {"good": "pass", "bad": "fail", "skip": "skipped"}[v.verdict]
    values = v.outcome.values
    writer.append(make_row(
        started_at=now(), finished_at=now(), outcome=outcome, job="bisect",
        backend="gpu" if key.job == "profile" else "emulated",
        reason=None if outcome == "pass" else v.why[:400],
        repro_command=v.outcome.command if outcome != "pass" else None,
        extra={"bisect": {"commit": v.sha, "case_key": key.text, "kind": kind,
                          "verdict": v.verdict,
                          "why": v.why, "step": v.step, "good": good, "bad": bad,
                          "first_bad": first_bad, "values": values or None,
                          "good_values": v.good_values or None,
                          "wall_s": round(v.outcome.wall_s, 3)}},
        **key.row_fields()))
