"""Property-based fuzzing of every public entry point with bad input.

Each example changes ONE argument of an otherwise valid call to a bad value
(wrong type, bool for an int, integral float, NaN, +-inf, zero, negative,
out of the kernels' range, non-ASCII or path-like names, ...) and asserts a
clean refusal: a ValueError or TypeError whose message names the argument
(or, for suite files and the command line, ``main(argv)`` returning 2 with
the key or flag named on stderr). Nothing may be accepted (no exception,
or another one: for a host class that means validation let it through to
the GPU allocation), nothing may hang (each call runs under an alarm).

Classes: host classes' construction-time checks (AllReduceNorm,
VirtualRanks, NormKernel, PublishKernel, MHCOptions), the references
(rms_norm, all_reduce_sum's order, the input generators), the case builder
(cluster.cases.make_case), TPGroup (before any actor starts: the placement
group call is replaced by a tripwire), the emulated backend's setup, suite
configs (TOML written to tmp files), the CLI (in-process main(argv); the
Ray session is replaced by a tripwire), and, each input listed: numbers
beyond their bounds (jobs.limits; top_k, hc, repeats, calls, ... in suite
files), [compile_check] sections, suite files that are not one (a FIFO, a
device, 5000-deep nesting, binary), output paths that would harm something
(``''``, /proc, a file, someone's site, outputs inside one another, an
existing trace file), token files that are not one, cluster addresses that
lead nowhere (malformed: exit 2; nothing listening: exit 3, infrastructure)
and results files of no or a newer schema version (report, regress,
compact); and issue 64's classes, each input also checked to have written
nothing (the folder it points into listed before and after, times and
all): paths or path components too long for every path option, results
folders that are no dataset (system folders reached directly or through a
symbolic link, ``/`` included; folders of other files; markers and data
files of a newer or no schema version), ``--op-args`` the selected ops do
not take, values listed twice in a suite, an unusable
``LAMPORT_COMPILE_CACHE`` (exit 3), ``~`` in path options (expanded, and
the expanded path named), and every printing command into a closed pipe
(exit 0 or the refusal's status, no traceback).

Deterministic (derandomize=True, or a fixed list) and bounded (max_examples
per hypothesis target), so CI never flakes. The figures (tried / clean /
unnamed / tracebacks / accepted / hangs, in total and per class) are
printed by the last test and written to $LAMPORT_FUZZ_FIGURES when set.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import math
import os
import signal
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.results.schema import SCHEMA_VERSION

pytestmark = pytest.mark.timeout(300)

HANG_S = 10.0
EXAMPLES = 60
FIGURES: Counter = Counter()
"""(class, outcome) -> count; outcome one of OUTCOMES."""
OUTCOMES = ("tried", "clean", "unnamed", "tracebacks", "accepted", "hangs", "written")
TARGETS_RUN: set[str] = set()
ALL_TARGETS = {"host classes", "references", "case builder", "TPGroup", "emulated backend",
               "configs", "CLI", "bounds", "compile check", "suite files", "output paths",
               "token files", "cluster address", "results files", "long paths",
               "results folders", "op args", "duplicates", "compile cache", "tilde",
               "closed pipes"}
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.filter_too_much])


class Tripwire(Exception):
    """Raised where validation should have stopped the call already."""


class _Hang(BaseException):
    pass


def _alarm(signum, frame):
    raise _Hang()


def count(target: str, outcome: str) -> None:
    FIGURES[target, outcome] += 1


def refuse(target: str, name: str, call) -> None:
    """Run ``call``; it must raise ValueError/TypeError naming ``name``."""
    TARGETS_RUN.add(target)
    count(target, "tried")
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    try:
        call()
    except _Hang:
        count(target, "hangs")
        pytest.fail(f"{target}: {name}: no answer within {HANG_S} s")
    except (ValueError, TypeError) as err:
        if name.lower() not in str(err).lower():
            count(target, "unnamed")
            pytest.fail(f"{target}: {name}: the error does not name it: {type(err).__name__}: {err}")
        count(target, "clean")
    except Exception as err:  # noqa: BLE001 (any other exception is a finding)
        count(target, "accepted")
        pytest.fail(f"{target}: {name}: accepted (got past validation: "
                    f"{type(err).__name__}: {str(err)[:200]})")
    else:
        count(target, "accepted")
        pytest.fail(f"{target}: {name}: accepted")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def listing(root: Path) -> list:
    """Every entry under ``root`` (symbolic links not followed) with its
    mode, and a file's size and modification time: what "nothing written"
    compares. A folder's time is left out: the writability probe of an
    output folder (jobs.options.check_writable_dir: a temporary folder made
    and removed at once) changes it and nothing else."""
    out = []
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            st = os.lstat(path)
            out.append((os.path.relpath(path, root), st.st_mode,
                        None if name in dirs else (st.st_size, st.st_mtime_ns)))
    return sorted(out, key=str)


def exits_2(target: str, name: str, argv: list[str], *, status: int = 2,
            untouched: Path | None = None) -> None:
    """``python -m jobs`` in-process must exit ``status`` (2: usage) and name
    ``name`` in its last line on stderr, with no traceback; ``untouched``:
    a folder in which nothing may be written, made or changed."""
    from jobs.__main__ import main
    TARGETS_RUN.add(target)
    count(target, "tried")
    before = listing(untouched) if untouched is not None else None
    err = io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
    except _Hang:
        count(target, "hangs")
        pytest.fail(f"{target}: {argv}: no answer within {HANG_S} s")
    except Tripwire:
        count(target, "accepted")
        pytest.fail(f"{target}: {argv}: accepted (Ray would have started)")
    except BaseException as exc:  # noqa: BLE001
        count(target, "tracebacks")
        pytest.fail(f"{target}: {argv}: {type(exc).__name__}: {exc} instead of exit {status}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    text = err.getvalue()
    if "Traceback" in text:
        count(target, "tracebacks")
        pytest.fail(f"{target}: {argv}: a traceback on stderr: {text[-500:]}")
    if code != status:
        count(target, "accepted")
        pytest.fail(f"{target}: {argv}: exit {code}, not {status}: {text[-500:]}")
    last = text.rstrip().splitlines()[-1] if text.strip() else ""
    if name.lower() not in last.lower():
        count(target, "unnamed")
        pytest.fail(f"{target}: {argv}: exit {status} but {name!r} is not named: {text[-500:]}")
    if before is not None and listing(untouched) != before:
        count(target, "written")
        pytest.fail(f"{target}: {argv}: refused, but something under {untouched} was written")
    count(target, "clean")


# ----------------------------------------------------------------- bad values
NOT_NUMBERS = st.sampled_from([None, "1", "1024", b"8", [], {}, (1,), object(), 1j])
BOOLS = st.booleans()
NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])


def bad_int(*, low: int = 1, high: int | None = None, also=()) -> st.SearchStrategy:
    """Not an int in [low, high]: other types, bools, integral floats, out of range."""
    out_of_range = st.integers(max_value=low - 1)
    if high is not None:
        out_of_range |= st.integers(min_value=high + 1, max_value=high + 10**6)
    return st.one_of(NOT_NUMBERS, BOOLS, NON_FINITE, out_of_range,
                     st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: x != 0)
                     | st.integers(low, low + 64).map(float), *also)


def bad_positive() -> st.SearchStrategy:
    """Not a finite number > 0."""
    return st.one_of(NOT_NUMBERS, BOOLS, NON_FINITE, st.floats(max_value=0, allow_nan=False),
                     st.integers(max_value=0))


BAD_TP = st.one_of(bad_int(), st.integers(-8, 64).filter(lambda t: t not in (1, 2, 4, 8)))
BAD_HIDDEN = st.one_of(bad_int(), st.integers(-4096, 8192).filter(lambda h: h <= 0 or h % 256))
BAD_NAME = st.one_of(st.sampled_from([None, b"x", [], {}, object(), 1.5, True]), st.integers(),
                    st.sampled_from(
    ["", "a/b", "../x", ".hidden", "-x", "smøke", "a b", "x" * 65, "名前", "a\x00b", "_x"]))
BAD_CHOICE = st.one_of(NOT_NUMBERS, st.integers(), st.text(max_size=12).filter(
    lambda s: s not in ("unicast", "multicast", "random", "order_sensitive",
                        "sentinel_pattern", "zeros", "all_reduce_norm", "emulated", "gpu")))


# --------------------------------------------------------------- host classes
@FUZZ
@given(data=st.data())
def test_host_classes_refuse_bad_construction_arguments(data):
    from kernels.lamport.all_reduce_mhc import MHCOptions
    from kernels.lamport.all_reduce_norm import AllReduceNorm, VirtualRanks
    from kernels.lamport.norm import NormKernel
    from kernels.lamport.publish import PublishKernel
    good = dict(hidden_size=1024, max_num_tokens=8, eps=1e-6, transport="unicast",
                budget_ns=0)
    which = data.draw(st.sampled_from(["AllReduceNorm", "VirtualRanks", "NormKernel",
                                       "PublishKernel", "MHCOptions"]))
    if which in ("AllReduceNorm", "VirtualRanks"):
        bad = {"hidden_size": BAD_HIDDEN, "max_num_tokens": bad_int(), "eps": bad_positive(),
               "transport": BAD_CHOICE, "budget_ns": bad_int(low=0)}
        if which == "VirtualRanks":
            bad["tp"] = BAD_TP
            good = {**good, "tp": 2}
        name = data.draw(st.sampled_from(sorted(bad)))
        value = data.draw(bad[name])
        if which == "VirtualRanks" and name == "transport":
            name = "transport"  # virtual ranks name it in their own check
        cls = AllReduceNorm if which == "AllReduceNorm" else VirtualRanks
        refuse("host classes", name, lambda: cls(**{**good, name: value}))
    elif which == "NormKernel":
        bad = {"hidden": BAD_HIDDEN, "tp": BAD_TP, "budget_ns": bad_int(low=0)}
        name = data.draw(st.sampled_from(sorted(bad)))
        value = data.draw(bad[name])
        args = {"hidden": 1024, "tp": 2, "budget_ns": 0, name: value}
        refuse("host classes", "hidden_size" if name == "hidden" else name,
               lambda: NormKernel(**args))
    elif which == "PublishKernel":
        name = data.draw(st.sampled_from(["tp", "transport"]))
        value = data.draw(BAD_TP if name == "tp" else BAD_CHOICE)
        refuse("host classes", name, lambda: PublishKernel(**{"tp": 2, "transport": "unicast",
                                                              name: value}))
    else:
        bad = {"hidden_size": st.one_of(bad_int(), st.integers(-64, 64).filter(
                   lambda h: h <= 0 or h % 8)),
               "hc_mult": bad_int(high=16), "max_num_tokens": bad_int(),
               "transport": BAD_CHOICE, "budget_ns": bad_int(low=0),
               "top_k": bad_int(high=128)}
        name = data.draw(st.sampled_from(sorted(bad)))
        value = data.draw(bad[name])
        args = dict(hidden_size=1024, hc_mult=4, max_num_tokens=8, transport="unicast",
                    budget_ns=0, top_k=None)
        refuse("host classes", name, lambda: MHCOptions(**{**args, name: value}).validate())


# ----------------------------------------------------------------- references
@FUZZ
@given(data=st.data())
def test_references_refuse_bad_arguments(data):
    import torch

    from kernels.reference import numerics
    from kernels.reference.allreduce import all_reduce_sum, rms_norm
    which = data.draw(st.sampled_from(["rms_norm", "order", "random_partials",
                                       "order_sensitive_partials", "sentinel_pattern_partials"]))
    if which == "rms_norm":
        x = torch.ones(2, 64, dtype=torch.bfloat16)
        w = torch.ones(64, dtype=torch.bfloat16)
        eps = data.draw(bad_positive())
        refuse("references", "eps", lambda: rms_norm(x, w, eps))
    elif which == "order":
        parts = torch.ones(4, 1, 8, dtype=torch.bfloat16)
        order = data.draw(st.one_of(
            NOT_NUMBERS.filter(lambda v: v is not None),
            st.lists(st.integers(-3, 6), max_size=5).filter(lambda o: sorted(o) != [0, 1, 2, 3]),
            st.just([0, 1, 2.0, 3]), st.just([0, 1, True, 3])))
        refuse("references", "order", lambda: all_reduce_sum(parts, order))
    else:
        fn = getattr(numerics, which)
        bad = {"tp": bad_int(high=1 << 10), "tokens": bad_int(high=1 << 24),
               "hidden": bad_int(high=1 << 20)}
        if which != "order_sensitive_partials":
            bad["seed"] = bad_int(low=0).filter(lambda v: not (isinstance(v, int) and v > 0))
        name = data.draw(st.sampled_from(sorted(bad)))
        value = data.draw(bad[name])
        args = {"tp": 2, "tokens": 1, "hidden": 8, name: value}
        seed = {"seed": args.pop("seed")} if "seed" in args else {}
        refuse("references", name,
               lambda: fn(args["tp"], args["tokens"], args["hidden"], **seed))


# --------------------------------------------------------------- case builder
@FUZZ
@given(data=st.data())
def test_the_case_builder_refuses_bad_fields(data):
    from cluster.cases import make_case
    bad = {"tokens": bad_int(high=8), "eps": bad_positive(), "budget_ns": bad_int(),
           "seed": bad_int(low=0, high=2**31 - 2).filter(
               lambda v: not (isinstance(v, int) and not isinstance(v, bool) and v > 0)),
           "inputs": BAD_CHOICE, "residual": BAD_CHOICE, "op": BAD_CHOICE,
           "capacity": bad_int()}
    name = data.draw(st.sampled_from(sorted(bad)))
    value = data.draw(bad[name])
    fields = {"capacity": 8, "tokens": 4, name: value}
    if name == "capacity" and isinstance(value, int) and not isinstance(value, bool):
        fields["tokens"] = 1
    refuse("case builder", name, lambda: make_case(**fields))


# -------------------------------------------------------------------- TPGroup
@FUZZ
@given(data=st.data())
def test_tpgroup_refuses_bad_arguments_before_any_actor_starts(data, monkeypatch):
    import cluster.group as group

    def tripwire(*args, **kwargs):
        raise Tripwire("placement_group called")

    monkeypatch.setattr(group, "placement_group", tripwire)
    bad = {"tp": BAD_TP, "hidden": st.one_of(bad_int(), st.integers(-64, 64).filter(
               lambda h: h <= 0 or h % 8)),
           "capacity": bad_int(), "call_timeout_s": bad_positive(),
           "setup_timeout_s": bad_positive(), "backend": BAD_CHOICE,
           "gpus_per_rank": st.one_of(NOT_NUMBERS, BOOLS, NON_FINITE,
                                      st.floats(max_value=-1e-9, allow_nan=False),
                                      st.floats(min_value=1.0001, allow_nan=False,
                                                allow_infinity=False))}
    name = data.draw(st.sampled_from(sorted(bad)))
    value = data.draw(bad[name])
    args = {"tp": 2, "hidden": 256, "capacity": 4, name: value}
    refuse("TPGroup", name, lambda: group.TPGroup(**args))


# ----------------------------------------------------------- emulated backend
@FUZZ
@given(data=st.data())
def test_the_emulated_backend_refuses_bad_setup_arguments(data):
    import uuid

    from cluster.emulated import EmulatedRank
    bad = {"group_id": BAD_NAME, "tp": BAD_TP, "rank": bad_int(low=0, high=1),
           "capacity": bad_int(), "hidden": st.one_of(bad_int(), st.integers(-64, 64).filter(
               lambda h: h <= 0 or h % 8)), "timeout_s": st.one_of(
               NOT_NUMBERS, BOOLS, NON_FINITE, st.floats(max_value=-1e-9, allow_nan=False))}
    name = data.draw(st.sampled_from(sorted(bad)))
    value = data.draw(bad[name])
    args = {"group_id": f"fuzz-{uuid.uuid4().hex[:8]}", "rank": 0, "tp": 2, "capacity": 2,
            "hidden": 256, "timeout_s": 0.0, name: value}
    rank = EmulatedRank()
    try:
        refuse("emulated backend", name, lambda: rank.setup(**args))
    finally:
        rank.close()


# -------------------------------------------------------------------- configs
@pytest.fixture
def no_ray(monkeypatch):
    """Starting Ray is where a bad suite or command line has got through."""
    import jobs.session as session

    def tripwire(*args, **kwargs):
        raise Tripwire("ray_session")

    monkeypatch.setattr(session, "ray_session", tripwire)


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") \
            if math.isinf(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise AssertionError(value)


TOML_BAD_NUMBER = st.one_of(st.sampled_from([math.nan, math.inf, -math.inf, 0, -1, "1", True,
                                             [], -0.5]))
CONFIG_KEYS = {
    "tp": st.one_of(st.sampled_from([0, 3, 5, 16, -1, 1000000, 2.0, "2", True, math.inf,
                                     [2, 3], []])),
    "hidden": st.one_of(st.sampled_from([12, 1020, 0, -8, 1024.0, "1024", math.nan, 1032,
                                         [1024, 1000], 64])),
    "tokens": st.one_of(st.sampled_from([0, -1, 1.5, "4", True, math.inf, 10_000_000,
                                         [1, 0], [2**40]])),
    "timeout_s": TOML_BAD_NUMBER, "budget_ns": st.one_of(TOML_BAD_NUMBER, st.sampled_from(
        [1e9, 999, 600_000_000_001, 2**63])),
    "repeats": st.sampled_from([0, -3, 1.5, "2", True, math.inf]),
    "name": st.sampled_from(["smøke", "a/b", "", ".x", "-x", "x" * 65, 3, True, "a b"]),
    "memory_limit_gb": TOML_BAD_NUMBER,
    "inputs": st.sampled_from(["randn", 3, [], ["random", "x"]]),
    "op": st.sampled_from(["allreduce", "", 1, "ALL_REDUCE_NORM"]),
}
TOP_LEVEL = ("name", "memory_limit_gb")


@FUZZ
@given(data=st.data())
def test_suite_configs_with_a_bad_value_exit_2_before_ray(data, tmp_path_factory, no_ray):
    key = data.draw(st.sampled_from(sorted(CONFIG_KEYS)))
    value = data.draw(CONFIG_KEYS[key])
    top = {"format": 1, "name": "fuzz", "version": 1}
    sweep = {"op": "all_reduce_norm", "tp": 2, "hidden": 256, "tokens": 2, "timeout_s": 10,
             "budget_ns": 1_000_000_000}
    (top if key in TOP_LEVEL else sweep)[key] = value
    text = "".join(f"{k} = {_toml(v)}\n" for k, v in top.items()) + "[[correctness]]\n" + \
        "".join(f"{k} = {_toml(v)}\n" for k, v in sweep.items())
    path = tmp_path_factory.mktemp("cfg") / "suite.toml"
    path.write_text(text)
    exits_2("configs", key, ["correctness", "--config", str(path), "--backend", "emulated",
                             "--no-results"])


# ------------------------------------------------------------------------ CLI
CLI_CASES = {
    "--timeout": st.sampled_from(["inf", "nan", "-1", "0", "x", "1e400", "-inf", "", "1e308",
                                  "86401"]),
    "--memory-limit-gb": st.sampled_from(["inf", "nan", "0", "-2", "lots", "1e308", "2e6"]),
    "--sigmas": st.sampled_from(["inf", "nan", "-1", "0", "1e309", "1001"]),
    "--threshold": st.sampled_from(["inf", "-0.5", "1e309", "nan"]),
    "--min-history": st.sampled_from(["0", "100000", "2.5"]),
    "--groups-per-gpu": st.sampled_from(["0", "9", "x", "1.5"]),
    "--tp": st.sampled_from(["x", "0", "-1", "2,x", "1.5", ""]),
    "--hidden": st.sampled_from(["x", "0", "-256", "1e3"]),
    "--run-id": st.sampled_from(["a/b", "smøke", "", "../up", ".x", "x" * 80]),
    "--suite": st.sampled_from(["nope", "smøke", "../smoke", ""]),
    "--config": st.sampled_from(["/dev/zero", "/nonexistent/suite.toml", "/"]),
    "--backend": st.sampled_from(["cuda", "", "GPU"]),
    "--ops": st.sampled_from(["allreduce", "x,y"]),
    "--history": st.sampled_from(["x", "1.5"]),
}


@FUZZ
@given(data=st.data())
def test_bad_command_lines_exit_2(data, no_ray):
    flag = data.draw(st.sampled_from(sorted(CLI_CASES)))
    value = data.draw(CLI_CASES[flag])
    command = "nightly" if flag in ("--history", "--min-history", "--sigmas",
                                    "--threshold") else "correctness"
    argv = [command, "--backend", "emulated", "--no-results", flag, value]
    if flag == "--backend":
        argv = [command, "--no-results", flag, value]
    if flag == "--config":
        name = "config"
    elif flag == "--suite":
        name = "suite"
    else:
        name = flag
    exits_2("CLI", name, argv)


# ------------------------------------------------------------------ bounds
SWEEP = {"op": "all_reduce_norm", "tp": 2, "hidden": 256, "tokens": 2}
BOUNDS = [  # (job, key, value, op): a number beyond its bound (jobs.limits) or its op's rule
    *(("correctness", "repeats", v, None) for v in (0, 10_001, 10**9, 2**63)),
    *(("faults", "repeats", v, None) for v in (0, 10**6)),
    *(("correctness", "timeout_s", v, None) for v in (1e300, 86_401, 1e-320 * 0, 10**20)),
    *(("faults", "timeout_s", v, None) for v in (1e308, 99_999.5)),
    *(("correctness", "budget_ns", v, None) for v in (0, 999, 600_000_000_001, 2**63, 1e9)),
    *(("faults", "budget_ns", v, None) for v in (1, 10**30)),
    *(("profile", k, v, None) for k, v in (
        ("calls", 0), ("calls", 10_001), ("calls", 10**12), ("replays", 0),
        ("replays", 10**9), ("min_replays", -1), ("min_replays", 10**7),
        ("min_replay_ms", 1e9), ("min_replay_ms", -0.1), ("rotate_mb", 0), ("rotate_mb", 1e12),
        ("rotate_mb", -5), ("budget_ns", 0), ("budget_ns", 10**18),
        ("timeout_s", 1e300), ("repeats", 10**8))),
    *(("correctness", "top_k", v, "finalize_publish") for v in (0, 129, 50_000, 2**40)),
    *(("correctness", "hc", v, "all_reduce_mhc") for v in (0, 9, 64, 10**6)),
    *(("top", "memory_limit_gb", v, None) for v in (1e308, 2e6, 0, -1)),
]


@pytest.mark.parametrize("job, key, value, op", BOUNDS)
def test_numbers_beyond_their_bounds_exit_2_before_ray(job, key, value, op, tmp_path, no_ray):
    top = {"format": 1, "name": "fuzz", "version": 1}
    sweep = dict(SWEEP, op=op or SWEEP["op"])
    if job == "top":
        top[key], job = value, "correctness"
    else:
        sweep[key] = value
    text = "".join(f"{k} = {_toml(v)}\n" for k, v in top.items()) + f"[[{job}]]\n" + \
        "".join(f"{k} = {_toml(v)}\n" for k, v in sweep.items())
    (tmp_path / "suite.toml").write_text(text)
    exits_2("bounds", key, [job, "--config", str(tmp_path / "suite.toml"), "--backend",
                            "emulated", "--no-results"])


COMPILE = [("hidden", [12]), ("hidden", [1020]), ("hidden", [0]), ("hidden", [16384]),
           ("hidden", ["2048"]), ("tp", [3]), ("tp", [16]), ("tp", [0]), ("tp", [2.0]),
           ("ops", ["bogus"]), ("ops", ["all_reduce_norm", "x"]), ("ops", [1]),
           ("arch", ["sm_80"]), ("arch", [""]), ("hidden", []), ("tp", [True])]


@pytest.mark.parametrize("key, value", COMPILE)
def test_compile_check_sections_exit_2_before_ray(key, value, tmp_path, no_ray):
    text = (f"format = 1\nname = 'fuzz'\nversion = 1\n[compile_check]\n{key} = {_toml(value)}\n"
            f"[[correctness]]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in SWEEP.items()))
    (tmp_path / "suite.toml").write_text(text)
    exits_2("compile check", key, ["nightly", "--config", str(tmp_path / "suite.toml"),
                                   "--backend", "emulated", "--no-results"])


SUITE_FILES = ["fifo", "directory", "/dev/zero", "/dev/null", "/proc/self/status", "deep list",
               "deep table", "binary", "latin-1", "huge", "symlink to fifo", "empty",
               "missing"]


@pytest.mark.parametrize("kind", SUITE_FILES)
def test_suite_files_that_are_not_one_exit_2_without_blocking(kind, tmp_path, no_ray):
    path = tmp_path / "suite.toml"
    if kind in ("fifo", "symlink to fifo"):
        os.mkfifo(tmp_path / "fifo")
        if kind == "fifo":
            path = tmp_path / "fifo"
        else:
            path.symlink_to(tmp_path / "fifo")
    elif kind == "directory":
        path.mkdir()
    elif kind.startswith("/"):
        path = Path(kind)
    elif kind == "deep list":
        path.write_text("format = 1\nname = 'x'\nversion = 1\nx = " + "[" * 5000 + "]" * 5000)
    elif kind == "deep table":
        path.write_text("format = 1\nx = " + "{a = " * 3000 + "1" + "}" * 3000)
    elif kind == "binary":
        path.write_bytes(bytes(range(256)) * 8)
    elif kind == "latin-1":
        path.write_bytes("name = 'sm\xf8ke'".encode("latin-1"))
    elif kind == "huge":
        path.write_text("# " + "x" * (2 << 20))
    elif kind == "empty":
        path.write_text("")
    exits_2("suite files", "config", ["correctness", "--config", str(path), "--no-results"])


OUTPUTS = ["results empty", "results /proc/1", "results /proc/x/y", "results a file",
           "site foreign", "site a file", "site inside results", "results inside site",
           "site is results", "trace-out exists", "trace-out inside results",
           "compact out inside", "compact out a file", "compact out is results",
           "head dir empty", "results /dev/null"]


@pytest.mark.parametrize("kind", OUTPUTS)
def test_output_paths_that_would_harm_something_exit_2(kind, tmp_path, no_ray):
    results, site = tmp_path / "results", tmp_path / "site"
    (tmp_path / "file").write_text("mine")
    quick = ["--suite", "smoke", "--ops", "all_reduce_norm", "--tp", "2", "--backend", "emulated"]
    nightly = ["nightly", *quick, "--results", str(results), "--site", str(site)]
    trace = ["trace", *quick, "--tokens", "3", "--inputs", "random", "--placement", "emulated",
             "--results", str(results)]
    if kind.startswith("compact"):
        from jobs.results import ResultsWriter
        ResultsWriter(results, suite="s").append({"op": "x", "outcome": "pass",
                                                  "started_at": dt.datetime.now(dt.timezone.utc)})
    argv, name = {
        "results empty": (["correctness", *quick, "--results", ""], "--results"),
        "results /proc/1": (["correctness", *quick, "--results", "/proc/1"], "--results"),
        "results /proc/x/y": (["correctness", *quick, "--results", "/proc/x/y"], "--results"),
        "results a file": (["correctness", *quick, "--results", str(tmp_path / "file")],
                           "--results"),
        "results /dev/null": (["correctness", *quick, "--results", "/dev/null"], "--results"),
        "site foreign": (nightly, "--site"),
        "site a file": ([*nightly[:-1], str(tmp_path / "file")], "--site"),
        "site inside results": ([*nightly[:-1], str(results / "site")], "overlap"),
        "results inside site": ([*nightly[:-3], str(site / "r"), "--site", str(site)],
                                "overlap"),
        "site is results": ([*nightly[:-1], str(results)], "overlap"),
        "trace-out exists": ([*trace, "--trace-out", str(tmp_path / "file")], "--trace-out"),
        "trace-out inside results": ([*trace, "--trace-out", str(results / "t.json")],
                                     "overlap"),
        "compact out inside": (["compact", "--results", str(results), "--out",
                                str(results / "c")], "overlap"),
        "compact out a file": (["compact", "--results", str(results), "--out",
                                str(tmp_path / "file")], "not a directory"),
        "compact out is results": (["compact", "--results", str(results), "--out",
                                    str(results)], "not empty"),
        "head dir empty": (["head", "start", "--dir", ""], "--dir"),
    }[kind]
    if kind == "site foreign":
        site.mkdir()
        (site / "index.html").write_text("<p>mine</p>")
    exits_2("output paths", name, argv)
    assert (tmp_path / "file").read_text() == "mine"


TOKENS = ["notes", "loose", "group-writable", "directory", "fifo", "empty", "huge", "binary",
          "two tokens", "symlink to notes", "dangling symlink"]


@pytest.mark.parametrize("kind", TOKENS)
def test_token_files_that_are_not_one_exit_2_untouched(kind, tmp_path, monkeypatch, no_ray):
    path = tmp_path / "token"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dangling symlink":
        path.symlink_to(tmp_path / "nowhere" / "x")
    else:
        content = {"notes": b"call the plumber\n", "loose": b"f" * 64,
                   "group-writable": b"f" * 64, "empty": b"", "huge": b"f" * 10_000,
                   "binary": bytes(range(64)), "two tokens": b"f" * 64 + b"\n" + b"e" * 64,
                   "symlink to notes": b"not a token\n"}[kind]
        target = tmp_path / "target" if kind == "symlink to notes" else path
        target.write_bytes(content)
        os.chmod(target, {"loose": 0o644, "group-writable": 0o620}.get(kind, 0o600))
        if kind == "symlink to notes":
            path.symlink_to(target)
    monkeypatch.setenv("LAMPORT_RAY_TOKEN_FILE", str(path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    before = os.lstat(path)
    exits_2("token files", "token file", ["correctness", "--suite", "smoke", "--ops",
                                          "all_reduce_norm", "--backend", "emulated",
                                          "--no-results"])
    after = os.lstat(path)
    assert (after.st_mode, after.st_mtime_ns) == (before.st_mode, before.st_mtime_ns)


ADDRESSES = ["nowhere", "127.0.0.1", "127.0.0.1:", ":6379", "127.0.0.1:0", "127.0.0.1:70000",
             "127.0.0.1:x", "http://", "[::1]", "closed 127.0.0.1", "closed [::1]",
             "closed ray://127.0.0.1"]


@pytest.mark.parametrize("address", ADDRESSES)
def test_cluster_addresses_that_lead_nowhere_exit_2_or_3_at_once(address, monkeypatch):
    """Malformed: exit 2 before Ray; well formed with nothing listening:
    exit 3 (infrastructure), one line, once the probe gives up (0.5 s here)."""
    import jobs.session as session
    monkeypatch.setattr(session, "JOIN_PROBE_S", 0.5)
    if address.startswith("closed "):
        import socket
        with socket.socket(socket.AF_INET6 if "[" in address else socket.AF_INET) as s:
            s.bind(("::1" if "[" in address else "127.0.0.1", 0))
            port = s.getsockname()[1]
        address = f"{address.split()[1]}:{port}"
        status, name = 3, address
    else:
        status, name = 2, "--address"
    exits_2("cluster address", name, ["correctness", "--suite", "smoke", "--ops",
                                      "all_reduce_norm", "--backend", "emulated",
                                      "--no-results", "--address", address], status=status)


RESULTS_FILES = [{}, {b"lamport_lab.schema_version": b"99"},
                 {b"lamport_lab.schema_version": b"x"},
                 {b"lamport_lab.schema_version": b"9" * 40}]


@pytest.mark.parametrize("metadata", RESULTS_FILES)
@pytest.mark.parametrize("command", ["report", "regress", "compact"])
def test_results_files_of_no_or_a_newer_version_exit_2_naming_the_file(metadata, command,
                                                                        tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    part = tmp_path / "r" / "date=2026-01-01" / "suite=s"
    part.mkdir(parents=True)
    name = f"part-1-{'b' * 32}.parquet"
    pq.write_table(pa.table({"run_id": ["x"]}).replace_schema_metadata(metadata), part / name)
    argv = [command, "--results", str(tmp_path / "r")]
    exits_2("results files", name, argv + (["--out", str(tmp_path / "c")]
                                           if command == "compact" else []))


# ------------------------------------------------------- issue 64's classes
TINY = ("format = 1\nname = 'fuzz'\nversion = 1\n[[correctness]]\nop = '*'\ntp = 2\n"
        "hidden = 256\ntokens = 1\n")
"""Every registered op, one case each: the suite the classes below load
(cheap to parse, so a thousand inputs stay fast)."""


@pytest.fixture
def place(tmp_path, monkeypatch):
    """A folder to work in (the current directory, so that a relative path
    lands in it too) holding the tiny suite; its listing must not change."""
    (tmp_path / "suite.toml").write_text(TINY)
    monkeypatch.chdir(tmp_path)
    return tmp_path


_LONG = ["x" * 256, "x" * 300, "y" * 1024, "z" * 5000, "é" * 128, "€" * 86, "😀" * 64,
         "a/" + "b" * 256 + "/c", "~/" + "h" * 300, "./" + "n" * 260 + ".toml",
         "/".join(["d" * 200] * 20), "/".join(["e" * 250] * 15), "f/" * 1800,
         "s/" * 1000 + "x" * 256,
         "/tmp/" + "t" * 255 + "/" + "u" * 256]
_PATH_OPTIONS = [(["correctness"], "--results"), (["nightly"], "--site"),
                 (["nightly"], "--summary-md"), (["correctness"], "--config"),
                 (["trace"], "--trace-out"), (["head", "start"], "--dir"),
                 (["compact", "--out", "o"], "--results"), (["compact", "--results", "r"], "--out"),
                 (["report"], "--results"), (["regress"], "--results"),
                 (["compile-check"], "--results"), (["bisect", "--case", "x"], "--repo"),
                 (["bisect", "--case", "x"], "--results")]
LONG_PATHS = [(cmd, flag, value) for cmd, flag in _PATH_OPTIONS for value in _LONG]


@pytest.mark.parametrize("command, flag, value", LONG_PATHS,
                         ids=[f"{' '.join(c[:2])} {f} {len(os.fsencode(v))}B {i % len(_LONG)}"
                              for i, (c, f, v) in enumerate(LONG_PATHS)])
def test_paths_too_long_exit_2_naming_the_option(command, flag, value, place):
    """ENAMETOOLONG, refused as the option is read: a component over 255
    bytes, or a whole path that leaves no room for what is written in it."""
    exits_2("long paths", flag, [*command, flag, value], untouched=place)


_SYSTEM = ["/", "/etc", "/usr", "/usr/local", "/proc", "/proc/self", "/sys", "/dev", "/boot",
           "/var", "/var/log", "/var/lib", "/run", "/bin", "/lib", "/sbin", "/home", "/root",
           "/tmp", "/opt"]
RESULTS_FOLDERS = [*(f"link to {p}" for p in _SYSTEM),
                   "link to link to /", "link to / then new", "link to /etc then sub/x",
                   "/", "/etc", "/usr/share/x", "/var/cache/x", "/proc/1", "/sys/kernel",
                   "/dev/shm/x", "/new-top-level-folder",
                   "a text file in it", "a hidden file in it", "a foreign parquet in it",
                   "a folder in it", "a date without a suite", "_runs a file", "a .git in it",
                   "marker a folder", "marker a fifo", "a file", "a link loop",
                   *(f"marker {m}" for m in ("newer", "99", "1e9", "not json", "a list",
                                             "a string version", "a float version",
                                             "a null version", "empty object", "binary",
                                             "huge", "deep")),
                   *(f"{where} file {v}" for where in ("legacy", "marked")
                     for v in ("newer", "99", "none", "x", "40 nines"))]
_MARKERS = {"newer": json.dumps({"schema_version": SCHEMA_VERSION + 1}),
            "99": '{"schema_version": 99}',
            "1e9": '{"schema_version": 1000000000}', "not json": "{", "a list": "[]",
            "a string version": '{"schema_version": "4"}',
            "a float version": '{"schema_version": 4.0}',
            "a null version": '{"schema_version": null}', "empty object": "{}",
            "binary": bytes(range(256)).decode("latin-1"), "huge": " " * 70_000 + "{}",
            "deep": "[" * 100_000 + "]" * 100_000}
_VERSIONS = {"newer": str(SCHEMA_VERSION + 1).encode(), "99": b"99", "none": None, "x": b"x",
             "40 nines": b"9" * 40}


def _results_folder(kind: str, place: Path) -> str:
    """Make the results folder ``kind`` names under ``place``; its path."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    r = place / "r"
    if kind.startswith("link to link"):
        (place / "l1").symlink_to("/")
        r.symlink_to(place / "l1")
    elif kind.startswith("link to"):
        target, _, then = kind[len("link to "):].partition(" then ")
        r.symlink_to(target)
        return str(r / then.replace("new", "new-from-link").replace("sub/x", "cron.d/x")) \
            if then else str(r)
    elif kind.startswith("/"):
        return kind
    elif kind == "a file":
        r.write_text("mine")
    elif kind == "a link loop":
        r.symlink_to(place / "r2")
        (place / "r2").symlink_to(r)
    elif kind.startswith("marker "):
        r.mkdir()
        what = kind[len("marker "):]
        if what == "a folder":
            (r / "_lamport_dataset.json").mkdir()
        elif what == "a fifo":
            os.mkfifo(r / "_lamport_dataset.json")
        else:
            (r / "_lamport_dataset.json").write_text(_MARKERS[what], encoding="latin-1")
    elif kind.startswith(("legacy file ", "marked file ")):
        where, _, version = kind.partition(" file ")
        part = r / "date=2026-01-01" / "suite=s"
        part.mkdir(parents=True)
        if where == "marked":
            (r / "_lamport_dataset.json").write_text('{"schema_version": 4}')
        raw = _VERSIONS[version]
        pq.write_table(pa.table({"run_id": ["x"]}).replace_schema_metadata(
            {} if raw is None else {b"lamport_lab.schema_version": raw}),
            part / f"part-1-{'a' * 32}.parquet")
    else:
        r.mkdir()
        if kind == "a text file in it":
            (r / "notes.txt").write_text("mine")
        elif kind == "a hidden file in it":
            (r / ".profile").write_text("mine")
        elif kind == "a foreign parquet in it":
            (r / "data.parquet").write_bytes(b"PAR1")
        elif kind == "a folder in it":
            (r / "photos").mkdir()
        elif kind == "a date without a suite":
            (r / "date=2026-01-01").mkdir()
        elif kind == "_runs a file":
            (r / "_runs").write_text("")
        elif kind == "a .git in it":
            (r / ".git").mkdir()
    return str(r)


@pytest.mark.parametrize("command", ["correctness", "nightly", "compile-check"])
@pytest.mark.parametrize("kind", RESULTS_FOLDERS)
def test_results_folders_that_are_no_dataset_exit_2_before_ray(kind, command, place, no_ray):
    """Issue 64 item 6: new, empty or a lamport-lab dataset this version
    reads; never a system folder, however reached (a link to / is refused
    before anything under it is listed)."""
    results = _results_folder(kind, place)
    argv = {"correctness": ["correctness", "--config", "suite.toml", "--backend", "emulated"],
            "nightly": ["nightly", "--config", "suite.toml", "--backend", "emulated",
                        "--no-dashboard"],
            "compile-check": ["compile-check", "--ops", "all_reduce_norm"]}[command]
    exits_2("results folders", "--results", [*argv, "--results", results], untouched=place)
    assert not os.path.lexists("/new-top-level-folder") and \
        not os.path.lexists("/new-from-link")


def _op_args() -> list[tuple[str, str]]:
    """(op, item): an op field another op has, a column field, an unknown
    name, a malformed item, or a value the op's field does not take."""
    from cluster import ops as registry
    from jobs.config import COLUMN_FIELDS
    out = []
    every = {n for s in registry.OPS.values() for n in s.fields}
    for op, spec in sorted(registry.OPS.items()):
        own = {n for n in spec.fields if n not in COLUMN_FIELDS}
        out += [(op, f"{n}={registry.OPS[o].fields[n].default}".lower())
                for n in sorted(every - set(spec.fields))
                for o in sorted(registry.OPS) if n in registry.OPS[o].fields][:4]
        out += [(op, f"{n}=8") for n in COLUMN_FIELDS]
        out += [(op, item) for item in ("bogus=1", "=true", "finalize", "FINALIZE=true",
                                        "path=fused=1")]
        for n in sorted(own):
            out += [(op, f"{n}={v}") for v in ("x", "none", "1", "0", "-1", "on", "yes",
                                               "a b", "true1", "default", "auto2")
                    if v.lower() not in {str(c).lower() for c in spec.fields[n].check}]
    return out


OP_ARGS = _op_args()


@pytest.mark.parametrize("op, item", OP_ARGS)
def test_op_args_the_op_does_not_take_exit_2(op, item, place, no_ray):
    """Issue 64 item 8: at 4a8ac23 ignored, exit 0 (the filter matched
    nothing it could name, and every case ran)."""
    exits_2("op args", "--op-args", ["correctness", "--config", "suite.toml", "--backend",
                                     "emulated", "--no-results", "--ops", op, "--op-args", item],
            untouched=place)


_DUPLICATED = [  # (job, op, key, values, the value named)
    *(("correctness", "all_reduce_norm", k, v, d) for k, v, d in (
        ("op", ["all_reduce_norm"] * 2, "all_reduce_norm"),
        ("variant", ["watchdog", "plain", "watchdog"], "watchdog"),
        ("variant", ["plain", "plain"], "plain"),
        ("transport", ["unicast", "unicast"], "unicast"),
        ("placement", ["auto", "emulated", "auto"], "auto"),
        ("placement", ["emulated", "emulated"], "emulated"),
        ("dtype", ["bfloat16", "bfloat16"], "bfloat16"),
        ("tp", [2, 2], 2), ("tp", [1, 2, 4, 1], 1), ("tp", [2, 4, 8, 8], 8),
        ("hidden", [256, 256], 256), ("hidden", [256, 512, 256], 256),
        ("tokens", [1, 1], 1), ("tokens", [1, 3, 8, 3], 3), ("tokens", [4, 4, 4], 4),
        ("inputs", ["random", "random"], "random"),
        ("inputs", ["order_sensitive", "random", "order_sensitive"], "order_sensitive"),
        ("residual", ["zeros", "zeros"], "zeros"), ("mode", ["owner", "one_shot", "owner"],
                                                    "owner"),
        ("form", ["two", "two"], "two"), ("form", ["auto", "single", "auto"], "auto"))),
    *(("correctness", "all_reduce_mhc", k, v, d) for k, v, d in (
        ("finalize", [True, True], True), ("finalize", [False, True, False], False),
        ("hc", [4, 4], 4), ("hc", [2, 4, 2], 2), ("top_k", [8, 8], 8))),
    *(("correctness", "finalize_publish", k, v, d) for k, v, d in (
        ("top_k", [8, 4, 8], 8), ("top_k", [1, 1], 1))),
    *(("correctness", "indexer", k, v, d) for k, v, d in (
        ("heads", [64, 64], 64), ("path", ["fused", "stage", "fused"], "fused"))),
    *(("faults", "all_reduce_norm", k, v, d) for k, v, d in (
        ("kinds", ["stuck_rank", "stuck_rank"], "stuck_rank"),
        ("kinds", ["skip_publish", "dirty_mailbox", "skip_publish"], "skip_publish"),
        ("tp", [2, 2], 2))),
    *(("profile", "all_reduce_norm", k, v, d) for k, v, d in (
        ("baselines", ["unfused", "unfused"], "unfused"),
        ("baselines", ["symm_mem", "unfused", "symm_mem"], "symm_mem"),
        ("tokens", [1, 64, 1], 1))),
    *(("compile_check", None, k, v, d) for k, v, d in (
        ("arch", ["sm_90a", "sm_90a"], "sm_90a"), ("hidden", [2048, 2048], 2048),
        ("hidden", [1024, 2048, 1024], 1024), ("tp", [2, 2], 2), ("tp", [2, 4, 2], 2),
        ("ops", ["all_reduce_norm", "all_reduce_norm"], "all_reduce_norm"))),
    ("selfcheck", None, "cases", ["a", "a"], "a"),
]
DUPLICATES = [(*d, at) for d in _DUPLICATED
              for at in (("first", "last") if d[1] is not None else ("first",))]
"""Each duplicate in the first sweep of its job, then in the last of two."""


@pytest.mark.parametrize("job, op, key, values, dup, at", DUPLICATES)
def test_values_listed_twice_exit_2_naming_the_value(job, op, key, values, dup, at, place,
                                                      no_ray):
    """Issue 64 item 8: at 4a8ac23 each case of a repeated value ran twice."""
    base = {"op": op, "tp": 2, "hidden": 256, "tokens": 2}
    if job == "faults":
        base["timeout_s"] = 10
    table = {**base, key: values}
    if key == "top_k" and op == "all_reduce_mhc":
        table["finalize"] = True
    def sweep(name: str, fields: dict) -> str:
        return f"[[{name}]]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in fields.items())

    if job in ("compile_check", "selfcheck"):
        text = f"[{job}]\n{key} = {_toml(values)}\n" + sweep("correctness", {
            "op": "all_reduce_norm", "tp": 2, "hidden": 256, "tokens": 2})
        command = "nightly"
    else:
        text = sweep(job, table) if at == "first" else sweep(job, base) + sweep(job, table)
        command = job
    (place / "suite.toml").write_text("format = 1\nname = 'fuzz'\nversion = 1\n" + text)
    exits_2("duplicates", f"{key} = {values!r} lists {dup!r} twice",
            [command, "--config", "suite.toml", "--backend", "emulated", "--no-results"],
            untouched=place)


_CACHES = ["a file", "under a file", "a dangling link", "a link loop", "/proc/lamport-x",
           "/proc/1/x", "/sys/lamport-x", "/dev/null", "/dev/null/x", "a fifo", "under a fifo",
           "a name too long", "a path too long", "/etc/passwd/x"]


@pytest.mark.parametrize("command", ["correctness", "nightly", "compile-check"])
@pytest.mark.parametrize("kind", _CACHES)
def test_an_unusable_compile_cache_exits_3_before_ray(kind, command, place, monkeypatch,
                                                      no_ray):
    """Issue 64 item 8: at 4a8ac23 reported as failing kernel cases; it is
    the machine's fault (exit 3, infrastructure), one line, before Ray."""
    if kind.startswith("/"):
        cache = kind
    elif kind == "a name too long":
        cache = str(place / ("c" * 300))
    elif kind == "a path too long":
        cache = str(place / "/".join(["c" * 250] * 20))
    else:
        (place / "file").write_text("")
        os.mkfifo(place / "fifo")
        (place / "dangling").symlink_to(place / "nowhere")
        (place / "loop").symlink_to(place / "loop2")
        (place / "loop2").symlink_to(place / "loop")
        cache = str({"a file": place / "file", "under a file": place / "file" / "sub",
                     "a dangling link": place / "dangling", "a link loop": place / "loop",
                     "a fifo": place / "fifo", "under a fifo": place / "fifo" / "x"}[kind])
    monkeypatch.setenv("LAMPORT_COMPILE_CACHE", cache)
    if command == "nightly":  # the compile check builds kernels whatever the backend
        (place / "suite.toml").write_text(TINY + "[compile_check]\nhidden = [2048]\n")
    argv = {"correctness": ["correctness", "--config", "suite.toml", "--backend", "auto",
                            "--no-results"],
            "nightly": ["nightly", "--config", "suite.toml", "--backend", "emulated",
                        "--no-results"],
            "compile-check": ["compile-check", "--ops", "all_reduce_norm"]}[command]
    exits_2("compile cache", "LAMPORT_COMPILE_CACHE", argv, status=3, untouched=place)


_TILDES = [(["correctness", "--config", "suite.toml", "--backend", "emulated"], "--results",
            v) for v in ("~/file", "~/file/x", "~/theirs", "~/etc", "~/etc/x", "~/root",
                         "~/root/new")] + [
    (["nightly", "--config", "suite.toml", "--backend", "emulated", "--results", "r"],
     "--site", v) for v in ("~/file", "~/theirs", "~/etc")] + [
    (["nightly", "--config", "suite.toml", "--backend", "emulated", "--results", "r",
      "--no-dashboard"], "--summary-md", v) for v in ("~/theirs", "~/etc/x", "~/file/x")] + [
    (["trace", "--config", "suite.toml", "--backend", "emulated", "--ops", "all_reduce_norm",
      "--inputs", "random", "--placement", "emulated", "--results", "r"], "--trace-out", v)
    for v in ("~/file", "~/etc/x")] + [
    (["correctness"], "--config", v) for v in ("~/missing.toml", "~", "~/theirs")] + [
    (["compile-check", "--ops", "all_reduce_norm"], "--results", v) for v in (
        "~/file", "~/theirs", "~/etc")] + [
    (["report"], "--results", "~/missing"), (["regress"], "--results", "~/file")] + [
    (["correctness"], flag, v) for flag in ("--results", "--config")
    for v in ("~no-such-user-lamport/x", "~no-such-user-lamport")]


@pytest.mark.parametrize("command, flag, value", _TILDES,
                         ids=[f"{c[0]} {f} {v}" for c, f, v in _TILDES])
def test_a_tilde_is_the_home_folder_and_the_expanded_path_is_named(command, flag, value, place,
                                                                   monkeypatch, no_ray):
    """Issue 64 item 8: at 4a8ac23 ``--results '~/x'`` made a folder named
    ``~``; now ``~`` is the home folder in every path option, and a refusal
    names the folder it means."""
    home = place / "home"
    home.mkdir()
    (home / "file").write_text("mine")
    (home / "theirs").mkdir()
    (home / "theirs" / "notes.txt").write_text("mine")
    (home / "etc").symlink_to("/etc")
    (home / "root").symlink_to("/")
    monkeypatch.setenv("HOME", str(home))
    name = str(home) + value[1:] if value.startswith("~/") or value == "~" else value
    exits_2("tilde", name, [*command, flag, value], untouched=place)
    assert not (place / "~").exists()


_PRINTING = [["schema"], ["--help"], *([c, "--help"] for c in (
    "nightly", "smoke", "correctness", "faults", "profile", "trace", "compile-check", "report",
    "regress", "selfcheck", "compact", "schema", "submit", "status", "logs", "stop", "head",
    "bisect", "pool"))]
_REFUSED = [["correctness", "--tp", "x"], ["nightly", "--results", "/etc"],
            ["report", "--results", "/nonexistent-lamport"], ["nosuch"],
            ["correctness", "--op-args", "bogus=1", "--backend", "emulated"]]


@pytest.mark.parametrize("argv", _PRINTING + _REFUSED, ids=" ".join)
@pytest.mark.parametrize("gone", ["stdout", "stdout and stderr"])
def test_every_printing_command_into_a_closed_pipe_ends_without_a_traceback(argv, gone, place,
                                                                          monkeypatch):
    """``python -m jobs schema | head -1``: at 4a8ac23 a BrokenPipeError
    traceback. The output nobody reads is dropped; the status is the
    command's own (0 printed, 2 refused)."""
    from jobs.__main__ import main

    class Gone(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    target = "closed pipes"
    TARGETS_RUN.add(target)
    count(target, "tried")
    before = listing(place)
    seen = io.StringIO()
    monkeypatch.setattr(sys, "stdout", Gone())
    monkeypatch.setattr(sys, "stderr", Gone() if gone != "stdout" else seen)
    want = 0 if argv in _PRINTING else 2
    try:
        code = main(argv)
    except BaseException as exc:  # noqa: BLE001
        count(target, "tracebacks")
        pytest.fail(f"{target}: {argv}: {type(exc).__name__}: {exc}")
    if code != want or "Traceback" in seen.getvalue():
        count(target, "accepted" if code != want else "tracebacks")
        pytest.fail(f"{target}: {argv}: exit {code}, not {want}: {seen.getvalue()[-300:]}")
    if listing(place) != before:
        count(target, "written")
        pytest.fail(f"{target}: {argv}: something was written")
    count(target, "clean")


# -------------------------------------------------------------------- figures
def test_zz_figures_every_bad_input_was_refused_cleanly():
    if TARGETS_RUN != ALL_TARGETS:
        pytest.skip(f"only {sorted(TARGETS_RUN)} ran (run the whole file for the figures)")
    total = {k: sum(n for (_, o), n in FIGURES.items() if o == k) for k in OUTCOMES}
    print(f"\nfigure: fuzz: {total['tried']} bad inputs tried, {total['clean']} clean "
          f"refusals naming the argument, {total['unnamed']} unnamed, {total['tracebacks']} "
          f"tracebacks, {total['accepted']} accepted, {total['hangs']} hangs, "
          f"{total['written']} written")
    for target in sorted(ALL_TARGETS):
        print(f"figure: fuzz: {target}: " + ", ".join(
            f"{FIGURES[target, k]} {k}" for k in OUTCOMES if FIGURES[target, k] or k in
            ("tried", "clean")))
    if os.environ.get("LAMPORT_FUZZ_FIGURES"):
        Path(os.environ["LAMPORT_FUZZ_FIGURES"]).write_text(json.dumps(
            {"total": total, "classes": {t: {k: FIGURES[t, k] for k in OUTCOMES}
                                         for t in sorted(ALL_TARGETS)}}, indent=1))
    assert total["tried"] >= 1000
    assert total["clean"] == total["tried"]
    assert total["accepted"] == total["hangs"] == total["unnamed"] == total["tracebacks"] == \
        total["written"] == 0
