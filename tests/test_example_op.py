"""The example op package (examples/scaled_allreduce) brought as a kernel
team would bring its own: installed with pip into a temporary folder (the
op registered by the entry point of the installed dist-info, nothing
written by hand), then held to the contract (``check-op``), run through
correctness and faults on the emulated backend by the bundled smoke suite
(``nightly --jobs correctness,faults``: one Ray start; the suite names no
such op, its ``exclude_named`` sweeps take it) and compiled for sm_90a by
the compile check, with no file of the repository edited. A wrong element
planted in a copy of its emulated rank kernel is caught with exit 1.

Every command is a subprocess: the op must come from the installed package
in each process of a run (the driver and its rank actors), as in CI.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.op_packages import NOT_SOURCES, REPO, jobs, pip_install, repository_status

EXAMPLE = REPO / "examples" / "scaled_allreduce"
OP = "scaled_allreduce"
ORIGIN = ("entry point scaled_allreduce = 'scaled_allreduce.op:SPEC' "
          "(lamport-lab-scaled-allreduce 0.1.0)")
EPILOGUE = '    return {"out": scale_sum(reduced, case.params.scale)}\n'
PLANTED = ('    import torch\n'
           '    out = scale_sum(reduced, case.params.scale)\n'
           '    out.view(torch.int16)[0, 0] ^= 1  # planted: one wrong element (its lowest bit)\n'
           '    return {"out": out}\n')

pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("ray")]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return pip_install(EXAMPLE, tmp_path_factory.mktemp("example") / "site")


def test_the_installed_example_is_an_op_with_its_origin_and_parts(site):
    (info,) = site.glob("lamport_lab_scaled_allreduce-*.dist-info")
    assert "[lamport_lab.ops]\nscaled_allreduce = scaled_allreduce.op:SPEC" in \
        (info / "entry_points.txt").read_text()
    listed = jobs(site, "ops", timeout=300)
    assert listed.returncode == 0, listed.stderr
    mine = listed.stdout[listed.stdout.index(f"\n{OP}  (collective)"):]
    assert f"  origin      {ORIGIN}" in mine
    assert "  parts       gpu kernel: no, virtual kernel: no, workload: no, goldens: yes" in mine
    checked = jobs(site, "check-op", OP, timeout=600)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    lines = checked.stdout.splitlines()
    assert lines[0] == f"check-op {OP} ({ORIGIN})"
    assert [ln.split("  ")[0] for ln in lines[1:]] == ["pass"] * 6, checked.stdout


def test_the_example_runs_correctness_and_faults_with_no_repository_edit(site, tmp_path):
    from jobs.results import read_results

    before = repository_status()
    run = jobs(site, "nightly", "--suite", "smoke", "--jobs", "correctness,faults",
               "--ops", OP, "--backend", "emulated", "--results", str(tmp_path / "results"),
               "--no-dashboard", timeout=840)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert repository_status() == before  # repository files a new op touches: 0
    rows = read_results(tmp_path / "results").to_pylist()
    assert {r["op"] for r in rows} == {OP}
    assert {(r["job"], r["outcome"]) for r in rows} == {("correctness", "pass"),
                                                         ("faults", "pass")}
    correctness = [r for r in rows if r["job"] == "correctness"]
    assert {(r["tp"], json.loads(r["extra"])["inputs"]) for r in correctness} == {
        (tp, kind) for tp in (1, 2) for kind in ("random", "order_sensitive", "sentinel_pattern")}
    assert {r["fault_kind"] for r in rows if r["job"] == "faults"} == {
        "skip_publish", "negative_zero_payload", "unsanitized_lane"}


def test_the_example_kernel_compiles_for_sm_90a_without_a_gpu(site):
    run = jobs(site, "compile-check", "--ops", OP, "--arch", "sm_90a", "--hidden", "1024",
               "--tp", "2", "--no-results", timeout=600, CUTE_DSL_ARCH="sm_90a")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-3000:]
    rows = [ln.split() for ln in run.stdout.splitlines() if ln.startswith(OP)]
    assert [(r[1], r[3], r[4], r[5], r[6], r[-1]) for r in rows] == [
        ("consumer", budget, "1024", "2", "sm_90a", "ok") for budget in ("0", "2000000000")], \
        run.stdout


def test_a_wrong_element_planted_in_the_example_is_caught(tmp_path):
    planted = tmp_path / "planted"
    shutil.copytree(EXAMPLE, planted, ignore=NOT_SOURCES)
    op = planted / "scaled_allreduce" / "op.py"
    assert op.read_text().count(EPILOGUE) == 1
    op.write_text(op.read_text().replace(EPILOGUE, PLANTED))
    site = pip_install(planted, tmp_path / "site")
    run = jobs(site, "check-op", OP, timeout=600)
    assert run.returncode == 1, run.stdout + run.stderr
    failed = [ln for ln in run.stdout.splitlines() if ln.startswith("fail")]
    assert failed and all(ln.startswith("fail  emulated correctness tp=") for ln in failed), \
        run.stdout
    assert "rank 0: {'out': {'elements':" in failed[0] and "'mismatches': 1" in failed[0], \
        failed[0]
