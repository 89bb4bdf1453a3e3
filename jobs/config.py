"""Suite configs: versioned TOML files naming the cases a job sweeps.

A suite is ``jobs/suites/<name>.toml`` (``--suite NAME``) or any file
(``--config PATH``). Format 1::

    format = 1                    # this loader's format; other values are refused
    name = "smoke"                # results partition (suite=NAME)
    version = 1                   # the suite's own version, bumped when its cases change
    description = "..."

    [selfcheck]                   # optional: golden vectors recomputed
    cases = []                    # names; empty = every committed golden case

    [compile_check]               # optional: python -m jobs compile-check
    arch = ["sm_90a"]
    hidden = [2048]
    tp = [2]
    ops = "*"                     # "*" or [] (the default) = every op with compile variants

    [[correctness]]               # any number of sweeps per job
    op = "all_reduce_norm"        # every sweep key takes a value or a list ("*": every
                                  # registered op the job applies to, job_ops);
    variant = "watchdog"          # lists multiply (a cartesian product)
    transport = "unicast"
    placement = "auto"
    dtype = "bfloat16"
    tp = [1, 2, 4]
    hidden = [256]
    tokens = [1, 3, 8]            # in order: a group runs its cases as one M sequence
    top_k = 8                     # ops that declare it (cluster.ops: finalize_publish, all_reduce_mhc)
    hc = 4                        # all_reduce_mhc only
    finalize = [false, true]      # any other field an op declares (cluster.ops OpSpec.fields)
    repeats = 2                   # calls per case, each with new data
    inputs = ["random", "order_sensitive", "sentinel_pattern"]  # default: every kind the op has
    budget_ns = 1_000_000_000     # consumer watchdog budget, integer nanoseconds (every job;
                                  # the kernels' unit: no conversion from suite to kernel)
    timeout_s = 10                # host deadline per call (--timeout overrides)

    [[correctness]]               # every registered op no other [[correctness]] sweep of
    op = "*"                      # this suite names (an op from an installed package, a new
    exclude_named = true          # module): what any op takes; none left: no case

    [[faults]]                    # sweep keys as above, plus
    kinds = "all"                 # or names from cluster.faults.FAULT_KINDS
    rank = "last"                 # the faulty rank: "last" (tp - 1) or an int

    [[profile]]                   # sweep keys as above, plus
    baselines = ["unfused", "symm_mem", "flashinfer"]
    calls = 50                    # calls captured in one CUDA graph
    replays = 200                 # timed replays
    min_replay_ms = 0             # floor on a replay's duration (more calls where they are short)
    min_replays = 0               # > 0: a graph of more than `calls` calls (rotation, floor) is
                                  # replayed proportionally fewer times, not below this

Every key is checked: an unknown key, a wrong type or a value outside its
choices is a :class:`ConfigError` naming the file, the table and the key.
Ops, their case fields and their input kinds come from the op registry
(:mod:`cluster.ops`): a field or input kind the sweep's op does not declare
is an error too.
What the kernels accept is enforced here too, from the rules the kernels
themselves use (:mod:`kernels.validation`): ``tp`` in ``TP_SIZES`` (1, 2, 4,
8), ``hidden`` a multiple of 8 whose fragments are whole warps, the
consumer watchdog budget ``budget_ns`` as integer nanoseconds (the unit
the kernels compare with ``%globaltimer``: the value reaches them
unconverted; the retired ``budget_ms`` and ``watchdog_ns`` are refused,
naming it), positive finite timeouts, ASCII names (a suite name is a
results partition key). A file larger than ``MAX_CONFIG_BYTES`` is refused
unread. Optional top-level ``memory_limit_gb``: the per-node memory ceiling
of :mod:`jobs.sizing` (``--memory-limit-gb`` and LAMPORT_MEMORY_LIMIT_GB
override it).
Command-line filters (:class:`Filters`) then narrow the expanded cases.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import stat
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cluster import ops as registry
from cluster.placement import Placement
from jobs.limits import LIMITS
from kernels.validation import require_lamport_hidden, require_name, require_tp

FORMAT = 1
MAX_CONFIG_BYTES = 1 << 20
"""A suite file is a page of TOML; anything larger is refused unread."""
SUITES_DIR = Path(__file__).resolve().parent / "suites"

VARIANTS = ("watchdog", "plain")
TRANSPORTS = ("unicast", "multicast")
AUTO = "auto"
"""The placement value that asks for the best one the cluster offers."""
PLACEMENTS = (AUTO, *(p.value for p in Placement))
AUTO_RESOLVES_TO = (Placement.PROCESS_PER_GPU, Placement.SHARED_GPU, Placement.EMULATED)
"""What ``placement = "auto"`` can become (virtual ranks are only ever asked for)."""
DTYPES = ("bfloat16",)
COLUMN_FIELDS = ("top_k", "hc")
"""Op fields that are result columns of their own; other op fields travel
in ``Case.op_args`` (and the rows' extra)."""


def op_names() -> tuple[str, ...]:
    return registry.names()


EVERY_OP = "*"
"""``op = "*"`` in a sweep, ``ops = "*"`` in ``[compile_check]``: every
registered op the job applies to (:func:`job_ops`), read from the registry
when the suite is loaded, so a newly registered op joins without an edit."""
EXCLUDE_NAMED = "exclude_named"
"""A sweep key: ``exclude_named = true`` beside ``op = "*"`` leaves out the
ops another sweep of the same job in the suite names (a name, or in a
list), so a suite's per-op sweeps keep their shapes and the ``*`` sweep
takes every other registered op; it may select none (then no case)."""


def job_ops(job: str) -> tuple[str, ...]:
    """The registered ops ``op = "*"`` selects in a ``job`` sweep: every op
    for correctness, those that declare fault kinds (``OpSpec.faults``) for
    faults, those that declare a timed workload for profile; ValueError
    naming ``job`` if it is none of :data:`JOBS`."""
    if job == "correctness":
        return registry.names()
    if job == "faults":
        return tuple(n for n, s in registry.OPS.items() if s.faults)
    if job == "profile":
        return registry.profiled()
    raise ValueError(f"job = {job!r} is not one of {list(JOBS)}")


def input_kinds() -> tuple[str, ...]:
    """Every input kind some registered op generates."""
    return tuple(dict.fromkeys(k for s in registry.OPS.values() for k in s.inputs))


def baseline_names() -> tuple[str, ...]:
    return tuple(dict.fromkeys(b for s in registry.OPS.values() for b in s.baselines))


def op_field_names() -> tuple[str, ...]:
    return tuple(dict.fromkeys(f for s in registry.OPS.values() for f in s.fields))
JOBS = ("correctness", "faults", "profile")


class ConfigError(ValueError):
    """A suite file or a filter that cannot be used; the message says why."""


@dataclasses.dataclass(frozen=True)
class Case:
    """One case of one job: its identity (the results' case columns) and
    the job's parameters for it."""
    job: str
    op: str
    variant: str
    transport: str
    placement: str
    tp: int
    hidden: int
    tokens: int
    top_k: int | None
    hc: int | None
    dtype: str
    repeats: int
    inputs: str | None = None      # correctness
    fault: str | None = None       # faults
    rank: int | None = None        # faults: the faulty rank
    params: tuple[tuple[str, Any], ...] = ()  # budget_ns, timeout_s, baselines, calls, ...
    op_args: tuple[tuple[str, Any], ...] = ()  # the op's other fields (finalize, heads, ...)

    def param(self, name: str, default: Any = None) -> Any:
        return dict(self.params).get(name, default)

    @property
    def group_key(self) -> tuple:
        """Cases with the same key run on one TP group, in suite order: the
        op's fields that only pick a rank's kernel (``Field.kernel_only``,
        e.g. all_reduce_norm's mode) do not split groups."""
        fields = registry.get(self.op).fields
        shared = tuple((k, v) for k, v in self.op_args
                       if not (k in fields and fields[k].kernel_only))
        return (self.op, self.variant, self.transport, self.placement, self.tp, self.hidden,
                self.top_k, self.hc, self.dtype, shared)

    def op_fields(self) -> dict[str, Any]:
        """The op's case fields this case sets (cluster.cases.make_case adds
        the op's defaults for the rest)."""
        declared = registry.get(self.op).fields
        out = {k: getattr(self, k) for k in COLUMN_FIELDS
               if k in declared and getattr(self, k) is not None}
        return {**out, **dict(self.op_args)}

    def key(self) -> str:
        """The case's identity as one string (every identity field, no job
        parameter): the row that completes a case stores it
        (``extra.case_key``), so ``--resume`` can tell which cases a run has."""
        args = ",".join(f"{k}={v}" for k, v in self.op_args)
        return "|".join(str(v) for v in (
            self.job, self.op, self.variant, self.transport, self.placement, self.tp,
            self.hidden, self.tokens, self.top_k, self.hc, self.dtype, self.inputs, self.fault,
            self.rank, args))

    def label(self) -> str:
        what = self.inputs or self.fault or ""
        args = " ".join(f"{k}={v}" for k, v in self.op_args)
        return (f"{self.job} {self.op} tp={self.tp} hidden={self.hidden} M={self.tokens}"
                + (f" {args}" if args else "") + (f" {what}" if what else ""))


# --------------------------------------------------------------------- keys
def _int(v):
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _kernel_rule(rule, key: str):
    """A check that raises the kernels' own error (ValueError/TypeError)."""
    def check(v):
        rule(key, v)
        return True
    return check


def _limited(name: str):
    """A check against ``jobs.limits.LIMITS[name]`` (raises what it must be)."""
    def check(v):
        LIMITS[name].check(v)
        return True
    return check


_SWEEP_KEYS: dict[str, tuple[Any, Any]] = {
    # key: (default, check): check is a tuple of choices or a predicate
    "op": (None, op_names),
    "variant": ("watchdog", VARIANTS),
    "transport": ("unicast", TRANSPORTS),
    "placement": (AUTO, PLACEMENTS),
    "dtype": ("bfloat16", DTYPES),
    "tp": (None, _kernel_rule(require_tp, "tp")),
    "hidden": (None, _kernel_rule(require_lamport_hidden, "hidden")),
    "tokens": (None, _int),
    "top_k": (None, _limited("top_k")),
    "hc": (None, _int),  # and the op's own rule (cluster.ops: 1..MAX_HC)
}
_SCALAR_KEYS: dict[str, dict[str, tuple[Any, Any]]] = {
    "correctness": {"repeats": (1, _limited("repeats")), "inputs": (None, input_kinds),
                    "budget_ns": (1_000_000_000, _limited("budget_ns")),
                    "timeout_s": (10.0, _limited("timeout_s"))},
    "faults": {"repeats": (1, _limited("repeats")), "kinds": ("all", None),
               "rank": ("last", None), "budget_ns": (200_000_000, _limited("budget_ns")),
               "timeout_s": (2.0, _limited("timeout_s"))},
    "profile": {"repeats": (1, _limited("repeats")), "baselines": (None, baseline_names),
                "calls": (50, _limited("calls")), "replays": (200, _limited("replays")),
                "budget_ns": (1_000_000_000, _limited("budget_ns")),
                "rotate_mb": (120, _limited("rotate_mb")),
                "timeout_s": (600.0, _limited("timeout_s")),
                "min_replay_ms": (0.0, _limited("min_replay_ms")),
                "min_replays": (0, _limited("min_replays"))},
}
_TOP_KEYS = {"format", "name", "version", "description", "memory_limit_gb", "selfcheck",
             "compile_check", *JOBS}
_SELFCHECK_KEYS = {"cases"}
_COMPILE_KEYS = {"arch", "hidden", "tp", "ops"}


@dataclasses.dataclass(frozen=True)
class Suite:
    name: str
    version: int
    description: str
    path: Path
    selfcheck: dict | None
    compile_check: dict | None
    cases: tuple[Case, ...]
    memory_limit_gb: float | None = None

    @property
    def source(self) -> str:
        """How a command line names this suite: ``--suite NAME`` for a
        bundled one, ``--config PATH`` otherwise."""
        bundled = SUITES_DIR / f"{self.name}.toml"
        if self.path.resolve() == bundled.resolve():
            return f"--suite {self.name}"
        return f"--config {self.path}"

    def of(self, job: str) -> list[Case]:
        return [c for c in self.cases if c.job == job]


def bundled_suites() -> list[str]:
    return sorted(p.stem for p in SUITES_DIR.glob("*.toml"))


def suite_path(name: str) -> Path:
    path = SUITES_DIR / f"{name}.toml"
    if not path.is_file():
        raise ConfigError(f"unknown suite {name!r}; bundled suites: {bundled_suites()} "
                          f"(or give a file with --config PATH)")
    return path


def load_suite(path: str | Path) -> Suite:
    """Parse and validate one suite file; ConfigError says what is wrong."""
    path = Path(path)
    try:
        raw = _read_regular(path, MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(f"config {path}: larger than {MAX_CONFIG_BYTES} bytes; "
                              "a suite file is a page of TOML")
        data = tomllib.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"config {path}: cannot read: {err}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"config {path}: not valid TOML: {err}") from None
    except RecursionError:
        raise ConfigError(f"config {path}: nested too deeply to be a suite file") from None
    where = f"config {path}"
    _no_unknown(data, _TOP_KEYS, where)
    if data.get("format") != FORMAT:
        raise ConfigError(f"{where}: format = {data.get('format')!r}; this version of "
                          f"lamport-lab reads format = {FORMAT}")
    name = data.get("name")
    try:
        require_name("name", name)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: {err} (it names the results partition)") from None
    memory_limit_gb = data.get("memory_limit_gb")
    if memory_limit_gb is not None:
        _check(memory_limit_gb, _limited("memory_limit_gb"), f"{where}: memory_limit_gb")
    version = data.get("version")
    if not _int(version):
        raise ConfigError(f"{where}: version = {version!r} must be a positive integer")
    selfcheck = _section(data, "selfcheck", _SELFCHECK_KEYS, where)
    if selfcheck is not None:
        selfcheck["cases"] = _str_list(selfcheck.get("cases", []), f"{where}: [selfcheck] cases")
        _no_duplicates(selfcheck["cases"], f"{where}: [selfcheck] cases")
    compile_check = _section(data, "compile_check", _COMPILE_KEYS, where)
    if compile_check is not None:
        w = f"{where}: [compile_check]"
        compile_check = {
            "arch": _str_list(compile_check.get("arch", ["sm_90a"]), f"{w} arch"),
            "hidden": _int_list(compile_check.get("hidden", [2048]), f"{w} hidden"),
            "tp": _int_list(compile_check.get("tp", [2]), f"{w} tp"),
            "ops": ([] if compile_check.get("ops") == EVERY_OP
                    else _str_list(compile_check.get("ops", []), f"{w} ops")),
        }
        from jobs.compile_selection import DEFAULT_ARCHS, check_selection
        if not compile_check["arch"]:
            raise ConfigError(f"{w} arch = [] selects nothing; give one or more of "
                              f"{list(DEFAULT_ARCHS)} (or leave arch out: {DEFAULT_ARCHS[0]})")
        for key in ("arch", "hidden", "tp", "ops"):
            _no_duplicates(compile_check[key], f"{w} {key}")
        bad = [a for a in compile_check["arch"] if a not in DEFAULT_ARCHS]
        if bad:
            raise ConfigError(f"{w} arch: {bad} not supported; allowed: {list(DEFAULT_ARCHS)}")
        try:
            check_selection(compile_check["ops"] or None, compile_check["hidden"],
                            compile_check["tp"])
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{w}: {err}") from None
    cases: list[Case] = []
    for job in JOBS:
        sweeps = data.get(job, [])
        if not isinstance(sweeps, list) or not all(isinstance(s, dict) for s in sweeps):
            raise ConfigError(f"{where}: {job} must be an array of tables ([[{job}]])")
        named = {op for s in sweeps
                 for op in (s["op"] if isinstance(s.get("op"), list) else [s.get("op")])
                 if isinstance(op, str) and op != EVERY_OP}  # a bad `op` is _expand's to refuse
        for index, sweep in enumerate(sweeps, 1):
            cases += _expand(job, sweep, f"{where}: [[{job}]] #{index}", named=named)
    return Suite(name=name, version=version, description=str(data.get("description", "")),
                 path=path, selfcheck=selfcheck, compile_check=compile_check, cases=tuple(cases),
                 memory_limit_gb=memory_limit_gb)


def _read_regular(path: Path, limit: int) -> bytes:
    """At most ``limit`` bytes of the regular file ``path``; ConfigError for
    anything else (a FIFO would block the read for ever, a device never
    end), checked on the open file, which is opened without blocking."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"config {path}: not a regular file (a FIFO, device or "
                              f"directory); give a suite file")
        os.set_blocking(fd, True)
        chunks, size = [], 0
        while size < limit:
            chunk = os.read(fd, limit - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _no_unknown(table: Mapping, known: Iterable[str], where: str) -> None:
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(known)}")


def _section(data: Mapping, key: str, known: set[str], where: str) -> dict | None:
    if key not in data:
        return None
    if not isinstance(data[key], dict):
        raise ConfigError(f"{where}: [{key}] must be a table")
    _no_unknown(data[key], known, f"{where}: [{key}]")
    return dict(data[key])


def _str_list(value, where: str) -> list[str]:
    value = [value] if isinstance(value, str) else value
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where} = {value!r} must be a string or a list of strings")
    return value


def _int_list(value, where: str) -> list[int]:
    value = [value] if not isinstance(value, list) else value
    if not value or not all(_int(v) for v in value):
        raise ConfigError(f"{where} = {value!r} must be a positive integer or a list of them")
    return value


def _no_duplicates(values: list, where: str) -> None:
    """ConfigError naming the first value ``values`` lists twice: a
    repeated value would run (or compile) each of its cases twice."""
    seen = []
    for v in values:
        key = (type(v), v)
        if key in seen:
            raise ConfigError(f"{where} = {values!r} lists {v!r} twice; give each value once "
                              f"(a repeated value runs its cases twice)")
        seen.append(key)


def _check(value, check, where: str) -> None:
    if check in (op_names, input_kinds, baseline_names):  # registry-backed choices
        check = check()
    if isinstance(check, tuple):
        if not isinstance(value, (str, int, float)) or value not in check:
            raise ConfigError(f"{where} = {value!r} is not one of {list(check)}")
    elif check is not None:
        try:
            ok = check(value)
        except (TypeError, ValueError) as err:  # a kernel rule: its own words
            raise ConfigError(f"{where} = {value!r}: {err}") from None
        if not ok:  # only _int answers False; the other checks say why
            raise ConfigError(f"{where} = {value!r} must be a positive integer")


def _values(sweep: Mapping, key: str, default, check, where: str, *, listable: bool) -> list:
    value = sweep.get(key, default)
    values = value if isinstance(value, list) and listable else [value]
    if not values:
        raise ConfigError(f"{where}: {key} = [] selects nothing")
    _no_duplicates(values, f"{where}: {key}")
    for v in values:
        if v is None:
            continue
        _check(v, check, f"{where}: {key}")
    return values


def _op_axes(sweep: Mapping, op_values: list, where: str) -> dict[str, list]:
    """The sweep's op-field axes (other than top_k / hc), each value checked
    against the declaring op; a field no op of the sweep declares is an error."""
    declared: dict[str, Any] = {}
    for op in op_values:
        declared.update(registry.get(op).fields)
    for key in set(sweep) & set(op_field_names()) | set(sweep) & set(COLUMN_FIELDS):
        if key not in declared:
            raise ConfigError(f"{where}: {key} does not apply to op(s) {op_values}; their "
                              f"fields: {sorted(declared)}")
    for key in sorted(set(sweep) & set(COLUMN_FIELDS)):  # their own rule too (e.g. hc <= MAX_HC)
        for op in op_values:
            field = registry.get(op).fields.get(key)
            for v in sweep[key] if isinstance(sweep[key], list) else [sweep[key]]:
                try:
                    field is None or field.validate(key, v, op)
                except ValueError as err:
                    raise ConfigError(f"{where}: {err}") from None
    axes = {}
    for key in sorted(set(sweep) & set(declared) - set(COLUMN_FIELDS)):
        value = sweep[key]
        axes[key] = value if isinstance(value, list) else [value]
        _no_duplicates(axes[key], f"{where}: {key}")
        for v in axes[key]:
            try:
                declared[key].validate(key, v, "/".join(op_values))
            except ValueError as err:
                raise ConfigError(f"{where}: {err}") from None
    return axes


def _op_inputs(job: str, op: str, wanted: list | None, where: str) -> list:
    spec = registry.get(op)
    if job != "correctness":
        return []
    if wanted is None:
        return list(spec.inputs)
    bad = [k for k in wanted if k not in spec.inputs]
    if bad:
        raise ConfigError(f"{where}: inputs {bad} are not input kinds of op {op}; "
                          f"it has {list(spec.inputs)}")
    return list(wanted)


_RETIRED_KEYS = {"budget_ms": 1_000_000, "watchdog_ns": 1}
"""Budget fields this loader no longer reads (the budget has one name and
one unit, ``budget_ns``) and their factor to nanoseconds: refused with the
line to write instead, never converted behind the user's back."""


def _refuse_retired(sweep: Mapping, where: str) -> None:
    for key, to_ns in _RETIRED_KEYS.items():
        if key in sweep:
            value = sweep[key]
            hint = (f"budget_ns = {int(value * to_ns):_}"
                    if isinstance(value, (int, float)) and not isinstance(value, bool)
                    and math.isfinite(value) else "budget_ns = <integer nanoseconds>")
            raise ConfigError(f"{where}: {key} = {value!r} is no longer read; the budget is "
                              f"budget_ns, in integer nanoseconds: write {hint}")


def _expand(job: str, sweep: Mapping, where: str, *, named: Iterable[str] = ()) -> list[Case]:
    """The cases of one sweep; ``named``: the ops the job's other sweeps
    name (what ``exclude_named`` leaves out)."""
    scalars = _SCALAR_KEYS[job]
    _refuse_retired(sweep, where)
    _no_unknown(sweep, [*_SWEEP_KEYS, *scalars, *op_field_names(), EXCLUDE_NAMED], where)
    for required in ("op", "tp", "hidden", "tokens"):
        if required not in sweep:
            raise ConfigError(f"{where}: {required} is required")
    exclude = sweep.get(EXCLUDE_NAMED, False)
    if not isinstance(exclude, bool):
        raise ConfigError(f"{where}: {EXCLUDE_NAMED} = {exclude!r} must be true or false")
    if exclude and sweep["op"] != EVERY_OP:
        raise ConfigError(f"{where}: {EXCLUDE_NAMED} = true applies to op = {EVERY_OP!r} only; "
                          f"got op = {sweep['op']!r}")
    none_left = False
    if sweep["op"] == EVERY_OP:
        chosen = [op for op in job_ops(job) if not (exclude and op in named)]
        # Every op has a sweep of its own: no case, the sweep's keys checked all the same.
        none_left = exclude and not chosen and bool(job_ops(job))
        sweep = {**sweep, "op": chosen or list(job_ops(job))}
        if not sweep["op"]:
            raise ConfigError(f"{where}: op = {EVERY_OP!r} selects no registered op "
                              f"({job} applies to none)")
    axes = {k: _values(sweep, k, d, c, where, listable=True) for k, (d, c) in _SWEEP_KEYS.items()}
    op_axes = _op_axes(sweep, axes["op"], where)
    params: dict[str, Any] = {}
    for key, (default, check) in scalars.items():
        value = sweep.get(key, default)
        if key in ("inputs", "baselines"):
            params[key] = (None if key not in sweep and default is None
                           else _values(sweep, key, default, check, where, listable=True))
        elif key == "kinds":
            params[key] = _fault_kinds(value, where)
        elif key == "rank":
            if value != "last" and not (isinstance(value, int) and not isinstance(value, bool)
                                        and value >= 0):
                raise ConfigError(f"{where}: rank = {value!r} must be \"last\" or a rank id")
            params[key] = value
        else:
            _check(value, check, f"{where}: {key}")
            params[key] = value
    repeats = params.pop("repeats")
    cases = []
    for combo in itertools.product(*axes.values(), *op_axes.values()):
        fields = dict(zip([*axes, *op_axes], combo))
        spec = registry.get(fields["op"])
        op_args = tuple((k, fields.pop(k)) for k in op_axes if k in spec.fields)
        for k in op_axes:
            fields.pop(k, None)
        for k in COLUMN_FIELDS:
            if fields[k] is None and k in spec.fields:
                fields[k] = spec.fields[k].default
        extra = {k: v for k, v in params.items() if k not in ("inputs", "kinds", "rank")}
        if job == "profile" and extra.get("baselines") is None:
            # one_shot (the one-shot kernel) is owner mode's baseline and only its
            owner = dict(op_args).get("mode") == "owner"
            extra["baselines"] = [b for b in spec.baselines if (b == "one_shot") == owner]
        frozen = tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                              for k, v in extra.items()))
        base = dict(job=job, repeats=repeats, params=frozen, op_args=op_args, **fields)
        if job == "correctness":
            cases += [Case(**base, inputs=i)
                      for i in _op_inputs(job, fields["op"], params["inputs"], where)]
        elif job == "faults":
            rank = fields["tp"] - 1 if params["rank"] == "last" else params["rank"]
            if rank >= fields["tp"]:
                raise ConfigError(f"{where}: rank = {rank} is outside 0..{fields['tp'] - 1} "
                                  f"for tp = {fields['tp']}")
            cases += [Case(**base, fault=k, rank=rank) for k in params["kinds"]]
        else:
            cases.append(Case(**base))
    return [] if none_left else cases


def _fault_kinds(value, where: str) -> list[str]:
    from cluster.faults import FAULT_KINDS
    if value == "all":
        return sorted(FAULT_KINDS)
    kinds = _str_list(value, f"{where}: kinds")
    _no_duplicates(kinds, f"{where}: kinds")
    unknown = sorted(set(kinds) - set(FAULT_KINDS))
    if unknown or not kinds:
        raise ConfigError(f"{where}: kinds: unknown fault kind(s) {unknown or kinds}; "
                          f"known: {sorted(FAULT_KINDS)} or \"all\"")
    return kinds


# ------------------------------------------------------------------ filters
@dataclasses.dataclass(frozen=True)
class Filters:
    """Command-line narrowing of a suite's cases; None = no filter."""
    ops: tuple[str, ...] | None = None
    tp: tuple[int, ...] | None = None
    hidden: tuple[int, ...] | None = None
    tokens: tuple[int, ...] | None = None
    top_k: tuple[int, ...] | None = None
    hc: tuple[int, ...] | None = None
    variant: tuple[str, ...] | None = None
    transport: tuple[str, ...] | None = None
    placement: tuple[str, ...] | None = None
    inputs: tuple[str, ...] | None = None
    faults: tuple[str, ...] | None = None
    op_args: tuple[str, ...] | None = None
    """``name=value`` items: the op fields without a column (finalize, path, ...)."""

    FIELDS = {"ops": "op", "tp": "tp", "hidden": "hidden", "tokens": "tokens", "top_k": "top_k",
              "hc": "hc", "variant": "variant", "transport": "transport",
              "placement": "placement", "inputs": "inputs", "faults": "fault",
              "op_args": "op_args"}

    def validate(self) -> None:
        choices = {"ops": op_names(), "variant": VARIANTS, "transport": TRANSPORTS,
                   "placement": PLACEMENTS, "inputs": input_kinds()}
        for name, known in choices.items():
            bad = sorted(set(getattr(self, name) or ()) - set(known))
            if bad:
                raise ConfigError(f"--{name.replace('_', '-')}: unknown value(s) {bad}; "
                                  f"known: {list(known)}")
        for item in self.op_args or ():
            name, eq, _ = item.partition("=")
            if not eq or name not in op_field_names():
                raise ConfigError(f"--op-args: {item!r} must be NAME=VALUE with NAME one of "
                                  f"{list(op_field_names())}")
        if self.faults:
            from cluster.faults import FAULT_KINDS
            bad = sorted(set(self.faults) - set(FAULT_KINDS))
            if bad:
                raise ConfigError(f"--faults: unknown fault kind(s) {bad}; known: {sorted(FAULT_KINDS)}")

    def check_op_args(self, ops: Iterable[str]) -> None:
        """Each ``--op-args`` item names a field that one of ``ops`` (the ops
        the run selects) takes, not one with a filter of its own (top_k,
        hc), with a value that field accepts, compared as :meth:`keep`
        compares (case-insensitive text); ConfigError naming the item and
        what those ops take. A filter nothing could match is a typo, not an
        empty selection."""
        ops = sorted(set(ops))
        if not self.op_args or not ops:
            return
        takes = {op: {n: f for n, f in registry.get(op).fields.items() if n not in COLUMN_FIELDS}
                 for op in ops}
        accepted = "; ".join(f"{op} takes {', '.join(sorted(t)) or 'none'}"
                             for op, t in takes.items())
        for item in self.op_args:
            name, _, value = item.partition("=")
            fields = [f for t in takes.values() for n, f in t.items() if n == name]
            if not fields:
                own = (f" (it has a filter of its own: --{name.replace('_', '-')})"
                       if name in COLUMN_FIELDS else "")
                raise ConfigError(f"--op-args {item!r}: no selected op takes {name}{own}; "
                                  f"{accepted}")
            if not any(_field_accepts(f, value) for f in fields):
                choices = sorted({str(c).lower() for f in fields if isinstance(f.check, tuple)
                                  for c in f.check})
                what = choices or sorted({f.doc for f in fields})
                raise ConfigError(f"--op-args {item!r}: {value!r} is not a value of {name}; "
                                  f"it takes {', '.join(what)}")

    def keep(self, case: Case) -> bool:
        given = {k: str(v).lower() for k, v in case.op_args}
        for item in self.op_args or ():
            name, _, value = item.partition("=")
            if name in given and given[name] != value.lower():
                return False
        for name, attr in self.FIELDS.items():
            if name == "op_args":
                continue
            wanted = getattr(self, name)
            value = getattr(case, attr)
            # A filter on a field the case does not have (--inputs on a fault
            # case, --top-k on all_reduce_norm) leaves it in; so does
            # placement "auto" where a wanted placement is one auto can become
            # (the run picks the placement among those wanted).
            if wanted is not None and value is not None and value not in wanted \
                    and not (attr == "placement" and value == AUTO
                             and set(wanted) & set(AUTO_RESOLVES_TO)):
                return False
        return True

    def active(self) -> dict[str, tuple]:
        return {n: getattr(self, n) for n in self.FIELDS if getattr(self, n) is not None}


def _field_accepts(field: registry.Field, text: str) -> bool:
    """Whether some value ``field`` accepts reads as ``text`` (as
    :meth:`Filters.keep` compares: ``str(value).lower()``)."""
    if isinstance(field.check, tuple):
        return text.lower() in {str(c).lower() for c in field.check}
    for parse in (int, float, {"true": True, "false": False}.__getitem__, str):
        try:
            value = parse(text.lower() if parse is not str else text)
            if str(value).lower() == text.lower() and field.check(value):
                return True
        except (KeyError, TypeError, ValueError):
            continue
    return False


def select(suite: Suite, jobs: Sequence[str], filters: Filters) -> list[Case]:
    """The suite's cases of ``jobs`` that pass ``filters``, in suite order;
    ConfigError when the filters leave none (a typo should not pass as an
    empty, green run)."""
    filters.validate()
    filters.check_op_args(c.op for c in suite.cases
                          if c.job in jobs and (filters.ops is None or c.op in filters.ops))
    chosen = [c for c in suite.cases if c.job in jobs and filters.keep(c)]
    if not chosen and filters.active():
        have = {n: sorted({getattr(c, a) for c in suite.cases if c.job in jobs} - {None})
                for n, a in Filters.FIELDS.items() if n in filters.active()}
        raise ConfigError(f"filters {filters.active()} select no {'/'.join(jobs)} case of suite "
                          f"{suite.name!r}; the suite has {have}")
    return chosen
