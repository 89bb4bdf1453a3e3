"""Adding an op is one declaration (issue 34): a toy op, declared in a module
of a temporary folder and registered through the public registry API
(``cluster.ops.register``; ``LAMPORT_OP_MODULES`` carries the module to the
rank actors' processes), goes through correctness, faults and profile on
the emulated backend and onto the dashboard's pages, with no file under
jobs/, cluster/ or dashboards/ edited.

The run is a subprocess (``python -m jobs nightly`` with its own embedded
Ray cluster): the rank actors must import the toy module themselves, so
the environment that names it has to be there when Ray starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("ray")]

TOY_MODULE = '''
"""toy_copy: every rank's partial all-reduced and copied out, bit for bit."""
from cluster import ops
from cluster.ops.spec import OpSpec


def make_inputs(case, *, tp, hidden, tokens):
    from cluster.ops.all_reduce_norm import partials
    return {"partials": partials(case.inputs, tp, tokens, hidden, case.seed)}


def payload(case, inputs, rank):
    return inputs["partials"][rank]


def epilogue(case, inputs, reduced, rank):
    return {"copy": reduced.clone()}


def expected(case, inputs, *, tp, facts):
    from kernels.reference.allreduce import all_reduce_sum
    return {"copy": (all_reduce_sum(inputs["partials"]), 0)}


SPEC = ops.register(OpSpec(
    name="toy_copy", summary="the all-reduced sum, copied out", collective=True,
    impl=__name__, inputs=("random", "order_sensitive"),
    reference="kernels.reference.allreduce:all_reduce_sum",
    faults=("skip_publish", "late_within_budget")))
'''

SUITE = """
format = 1
name = "toy"
version = 1
[[correctness]]
op = "toy_copy"
tp = [2]
hidden = [256]
tokens = [1, 3]
[[faults]]
op = "toy_copy"
tp = 2
hidden = 256
tokens = 2
kinds = ["skip_publish", "late_within_budget"]
[[profile]]
op = "toy_copy"
tp = 1
hidden = 256
tokens = 2
"""


def _tracked_under(*folders: str) -> str:
    """``git status --porcelain`` of the folders: empty when nothing there
    differs from the commit."""
    return subprocess.run(["git", "status", "--porcelain", "--", *folders], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout


def test_a_toy_op_goes_through_every_job_and_onto_the_pages(tmp_path):
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "toy_copy_op.py").write_text(textwrap.dedent(TOY_MODULE))
    suite = tmp_path / "toy.toml"
    suite.write_text(SUITE)
    results, site = tmp_path / "results", tmp_path / "site"
    before = _tracked_under("jobs", "cluster", "dashboards")
    env = {**os.environ, "LAMPORT_OP_MODULES": "toy_copy_op",
           "PYTHONPATH": os.pathsep.join([str(plugin), str(REPO)])}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-m", "jobs", "nightly", "--config", str(suite),
         "--jobs", "correctness,faults,profile", "--backend", "emulated",
         "--results", str(results), "--site", str(site)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert _tracked_under("jobs", "cluster", "dashboards") == before

    from jobs.results import read_results
    rows = read_results(results).to_pylist()
    seen = {(r["job"], r["outcome"]) for r in rows if r["op"] == "toy_copy"}
    assert seen == {("correctness", "pass"), ("faults", "pass"), ("profile", "skipped")}, seen
    assert sum(r["job"] == "correctness" for r in rows) == 4  # 2 M x 2 input kinds
    assert {r["fault_kind"] for r in rows if r["job"] == "faults"} == {"skip_publish",
                                                                        "late_within_budget"}
    for page in ("correctness.html", "faults.html", "details-toy_copy.html"):
        assert "toy_copy" in (site / page).read_text(), page


def test_a_plugin_module_that_is_not_there_is_named(tmp_path):
    env = {**os.environ, "LAMPORT_OP_MODULES": "no_such_toy_module", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", "import cluster.ops"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert ("LAMPORT_OP_MODULES: no module 'no_such_toy_module' on sys.path"
            in done.stderr), done.stderr
