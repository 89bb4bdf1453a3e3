"""Property-based fuzzing of every public entry point with bad input.

Each example changes ONE argument of an otherwise valid call to a bad value
(wrong type, bool for an int, integral float, NaN, +-inf, zero, negative,
out of the kernels' range, non-ASCII or path-like names, ...) and asserts a
clean refusal: a ValueError or TypeError whose message names the argument
(or, for suite files and the command line, ``main(argv)`` returning 2 with
the key or flag named on stderr). Nothing may be accepted (no exception,
or another one: for a host class that means validation let it through to
the GPU allocation), nothing may hang (each call runs under an alarm).

Targets: host classes' construction-time checks (AllReduceNorm,
VirtualRanks, NormKernel, PublishKernel, MHCOptions), the references
(rms_norm, all_reduce_sum's order, the input generators), the case builder
(cluster.cases.make_case), TPGroup (before any actor starts: the placement
group call is replaced by a tripwire), the emulated backend's setup, suite
configs (TOML written to tmp files) and the CLI (in-process main(argv); the
Ray session is replaced by a tripwire).

Deterministic (derandomize=True) and bounded (max_examples per target), so
CI never flakes. The figures (tried / clean / accepted / hangs) are printed
by the last test and written to $LAMPORT_FUZZ_FIGURES when set.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import signal
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.timeout(300)

HANG_S = 10.0
EXAMPLES = 60
FIGURES: Counter = Counter()
TARGETS_RUN: set[str] = set()
ALL_TARGETS = {"host classes", "references", "case builder", "TPGroup", "emulated backend",
               "configs", "CLI"}
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.filter_too_much])


class Tripwire(Exception):
    """Raised where validation should have stopped the call already."""


class _Hang(BaseException):
    pass


def _alarm(signum, frame):
    raise _Hang()


def refuse(target: str, name: str, call) -> None:
    """Run ``call``; it must raise ValueError/TypeError naming ``name``."""
    TARGETS_RUN.add(target)
    FIGURES["tried"] += 1
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    try:
        call()
    except _Hang:
        FIGURES["hangs"] += 1
        pytest.fail(f"{target}: {name}: no answer within {HANG_S} s")
    except (ValueError, TypeError) as err:
        if name.lower() not in str(err).lower():
            FIGURES["unnamed"] += 1
            pytest.fail(f"{target}: {name}: the error does not name it: {type(err).__name__}: {err}")
        FIGURES["clean"] += 1
    except Exception as err:  # noqa: BLE001 (any other exception is a finding)
        FIGURES["accepted"] += 1
        pytest.fail(f"{target}: {name}: accepted (got past validation: "
                    f"{type(err).__name__}: {str(err)[:200]})")
    else:
        FIGURES["accepted"] += 1
        pytest.fail(f"{target}: {name}: accepted")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def exits_2(target: str, name: str, argv: list[str]) -> None:
    """``python -m jobs`` in-process must exit 2 and name ``name`` on stderr."""
    from jobs.__main__ import main
    TARGETS_RUN.add(target)
    FIGURES["tried"] += 1
    err = io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
    except _Hang:
        FIGURES["hangs"] += 1
        pytest.fail(f"{target}: {argv}: no answer within {HANG_S} s")
    except Tripwire:
        FIGURES["accepted"] += 1
        pytest.fail(f"{target}: {argv}: accepted (Ray would have started)")
    except BaseException as exc:  # noqa: BLE001
        FIGURES["accepted"] += 1
        pytest.fail(f"{target}: {argv}: {type(exc).__name__}: {exc} instead of exit 2")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    text = err.getvalue()
    if code != 2:
        FIGURES["accepted"] += 1
        pytest.fail(f"{target}: {argv}: exit {code}, not 2: {text[-500:]}")
    if name.lower() not in text.lower():
        FIGURES["unnamed"] += 1
        pytest.fail(f"{target}: {argv}: exit 2 but {name!r} is not named: {text[-500:]}")
    FIGURES["clean"] += 1


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
                watchdog_ns=0)
    which = data.draw(st.sampled_from(["AllReduceNorm", "VirtualRanks", "NormKernel",
                                       "PublishKernel", "MHCOptions"]))
    if which in ("AllReduceNorm", "VirtualRanks"):
        bad = {"hidden_size": BAD_HIDDEN, "max_num_tokens": bad_int(), "eps": bad_positive(),
               "transport": BAD_CHOICE, "watchdog_ns": bad_int(low=0)}
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
        bad = {"hidden": BAD_HIDDEN, "tp": BAD_TP, "watchdog_ns": bad_int(low=0)}
        name = data.draw(st.sampled_from(sorted(bad)))
        value = data.draw(bad[name])
        args = {"hidden": 1024, "tp": 2, "watchdog_ns": 0, name: value}
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
               "transport": BAD_CHOICE, "watchdog_ns": bad_int(low=0),
               "top_k": bad_int(high=128)}
        name = data.draw(st.sampled_from(sorted(bad)))
        value = data.draw(bad[name])
        args = dict(hidden_size=1024, hc_mult=4, max_num_tokens=8, transport="unicast",
                    watchdog_ns=0, top_k=None)
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
    import jobs.harness as harness

    def tripwire(*args, **kwargs):
        raise Tripwire("ray_session")

    monkeypatch.setattr(harness, "ray_session", tripwire)


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
    "timeout_s": TOML_BAD_NUMBER, "budget_ms": TOML_BAD_NUMBER,
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
             "budget_ms": 1000}
    (top if key in TOP_LEVEL else sweep)[key] = value
    text = "".join(f"{k} = {_toml(v)}\n" for k, v in top.items()) + "[[correctness]]\n" + \
        "".join(f"{k} = {_toml(v)}\n" for k, v in sweep.items())
    path = tmp_path_factory.mktemp("cfg") / "suite.toml"
    path.write_text(text)
    exits_2("configs", key, ["correctness", "--config", str(path), "--backend", "emulated",
                             "--no-results"])


# ------------------------------------------------------------------------ CLI
CLI_CASES = {
    "--timeout": st.sampled_from(["inf", "nan", "-1", "0", "x", "1e400", "-inf", ""]),
    "--memory-limit-gb": st.sampled_from(["inf", "nan", "0", "-2", "lots"]),
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
    command = "nightly" if flag == "--history" else "correctness"
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


# -------------------------------------------------------------------- figures
def test_zz_figures_every_bad_input_was_refused_cleanly():
    if TARGETS_RUN != ALL_TARGETS:
        pytest.skip(f"only {sorted(TARGETS_RUN)} ran (run the whole file for the figures)")
    figures = {k: FIGURES[k] for k in ("tried", "clean", "unnamed", "accepted", "hangs")}
    print(f"\nfigure: fuzz: {figures['tried']} bad inputs tried, {figures['clean']} clean "
          f"errors naming the argument, {figures['unnamed']} unnamed, {figures['accepted']} "
          f"accepted, {figures['hangs']} hangs")
    if os.environ.get("LAMPORT_FUZZ_FIGURES"):
        Path(os.environ["LAMPORT_FUZZ_FIGURES"]).write_text(json.dumps(figures, indent=1))
    assert figures["tried"] >= 300
    assert figures["clean"] == figures["tried"]
    assert figures["accepted"] == figures["hangs"] == figures["unnamed"] == 0
