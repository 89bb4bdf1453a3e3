"""Every registered op is in smoke and nightly without a suite edit: their
``[[correctness]]`` sweep ``op = "*"`` with ``exclude_named = true``
(jobs/config.py) takes every op no other correctness sweep of the suite
names, at sizes any collective takes, and adds no case for the built-in
ops, whose sweeps keep their own shapes."""

from __future__ import annotations

import collections
import hashlib
import json
import shlex
import sys
import tomllib
import types
from pathlib import Path

import pytest

from cluster import ops
from cluster.ops.spec import Field, OpSpec
from jobs import __main__ as cli
from jobs.config import EXCLUDE_NAMED, ConfigError, Filters, load_suite, select, suite_path
from jobs.recorder import repro_command

BUNDLED = ("smoke", "nightly")
"""The suites :data:`BEFORE` holds."""
ALL_BUNDLED = ("smoke", "nightly", "full")


BEFORE = Path(__file__).parent / "data" / "bundled_cases_4a8ac23.json"
"""What smoke and nightly held for the built-in ops at 4a8ac23 (before the
``exclude_named`` sweeps): per suite the number of cases, the sha256 of
their sorted reprs (every field, job parameters included; sorted: a sweep
of ``op = "*"`` takes the ops in registry order) and the count per (job,
op). A deliberate change to the bundled cases rewrites it:
``python tests/test_suite_every_op.py``."""


def bundled_cases(name: str) -> dict:
    """The facts :data:`BEFORE` holds, for the built-in ops' cases of ``name``
    (an op from an installed package left out)."""
    builtin = {n for n, origin in ops.ORIGINS.items() if origin.startswith("built-in")}
    cases = [c for c in load_suite(suite_path(name)).cases if c.op in builtin]
    return {"cases": len(cases),
            "sha256": hashlib.sha256("\n".join(sorted(map(repr, cases))).encode()).hexdigest(),
            "by_job_op": dict(sorted(collections.Counter(f"{c.job} {c.op}"
                                                         for c in cases).items()))}


@pytest.mark.parametrize("name", BUNDLED)
def test_the_built_in_ops_cases_are_those_of_4a8ac23(name):
    assert bundled_cases(name) == json.loads(BEFORE.read_text())[name]
    sweeps = tomllib.loads(suite_path(name).read_text())["correctness"]
    assert [s for s in sweeps if s["op"] == "*" and s.get(EXCLUDE_NAMED)]  # a new op's sweep


@pytest.fixture
def probe():
    """A collective op registered at run time (as an entry point registers
    one), with a field of its own and fault kinds; unregistered after."""
    module = types.ModuleType("every_probe_impl")
    module.__dict__.update(make_inputs=lambda case, **kw: {}, expected=lambda *a, **kw: {},
                           payload=lambda *a: None, epilogue=lambda *a: {})
    sys.modules[module.__name__] = module
    spec = ops.register(OpSpec(
        name="every_probe", summary="", collective=True, impl=module.__name__,
        inputs=("random", "order_sensitive"), fields={"gain": Field(2, (1, 2), "a gain")},
        faults=("skip_publish", "negative_zero_payload", "unsanitized_lane")))
    yield spec
    ops.unregister(spec.name)
    sys.modules.pop(module.__name__, None)


@pytest.mark.parametrize("name", ALL_BUNDLED)
def test_every_registered_op_has_correctness_cases_in_every_bundled_suite(name):
    """(full had none for the indexer until c31321b.)"""
    held = {c.op for c in load_suite(suite_path(name)).cases if c.job == "correctness"}
    assert held == set(ops.names()), set(ops.names()) - held


@pytest.mark.parametrize("name", ALL_BUNDLED)
def test_a_new_op_runs_in_every_bundled_suite_without_a_suite_edit(name, probe, tmp_path):
    suite = load_suite(suite_path(name))
    mine = [c for c in suite.cases if c.op == probe.name]
    sweep = next(s for s in tomllib.loads(suite_path(name).read_text())["correctness"]
                 if s.get(EXCLUDE_NAMED))
    correctness = [c for c in mine if c.job == "correctness"]
    assert [(c.tp, c.hidden, c.tokens, c.inputs) for c in correctness] == [
        (tp, sweep["hidden"][0], m, kind) for tp in sweep["tp"] for m in sweep["tokens"]
        for kind in probe.inputs]
    assert all(c.op_args == () for c in correctness)  # its fields at their defaults
    assert {c.fault for c in mine if c.job == "faults"} >= {"skip_publish"}
    # the built-in ops' cases are what they were without it
    assert [c.key() for c in suite.cases if c.op != probe.name] == \
        [c.key() for c in load_suite(suite_path(name)).cases if c.op != probe.name]
    parser = cli.build_parser()
    for case in mine:
        args = parser.parse_args(shlex.split(repro_command(case, suite, "emulated"))[3:])
        chosen = select(suite, args.jobs, Filters(**{n: getattr(args, n) for n in Filters.FIELDS}))
        assert chosen == [case], (case, chosen)


def test_an_op_named_by_a_sweep_is_left_to_it(probe, tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(
        "format = 1\nname = 's'\nversion = 1\n"
        "[[correctness]]\nop = 'every_probe'\ntp = 4\nhidden = 256\ntokens = 2\n"
        "[[correctness]]\nop = '*'\nexclude_named = true\ntp = 1\nhidden = 1024\ntokens = 1\n"
        "[[faults]]\nop = '*'\ntp = 2\nhidden = 1024\ntokens = 4\nkinds = ['skip_publish']\n")
    suite = load_suite(path)
    assert [c.tp for c in suite.of("correctness") if c.op == probe.name] == [4, 4]
    assert {c.op for c in suite.of("correctness") if c.tp == 1} == set(ops.names()) - {probe.name}
    # exclude_named reads the sweeps of its own job only: faults is a plain "*"
    assert probe.name in {c.op for c in suite.of("faults")}


@pytest.mark.parametrize("sweep, message", [
    ("op = 'all_reduce_norm'\nexclude_named = true",
     r"exclude_named = true applies to op = '\*' only; got op = 'all_reduce_norm'"),
    ("op = '*'\nexclude_named = 'yes'", r"exclude_named = 'yes' must be true or false"),
    # selecting no op, it is still checked
    ("op = '*'\nexclude_named = true\ntp = 3", r"\[\[correctness\]\] #2: tp = 3"),
])
def test_bad_exclude_named_sweeps_are_named(tmp_path, sweep, message):
    path = tmp_path / "bad.toml"
    names = ", ".join(f"'{n}'" for n in ops.names())
    body = sweep if "tp =" in sweep else sweep + "\ntp = 1"
    path.write_text(f"format = 1\nname = 'bad'\nversion = 1\n[[correctness]]\nop = [{names}]\n"
                    f"tp = 1\nhidden = 1024\ntokens = 1\n[[correctness]]\n{body}\n"
                    f"hidden = 1024\ntokens = 1\n")
    with pytest.raises(ConfigError, match=message):
        load_suite(path)


if __name__ == "__main__":
    BEFORE.write_text(json.dumps({n: bundled_cases(n) for n in BUNDLED}, indent=1,
                                 sort_keys=True) + "\n")
    print(f"wrote {BEFORE}")
