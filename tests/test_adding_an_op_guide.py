"""docs/adding-an-op.md stays true: its code blocks whose first line is
``# file: PATH`` are written into a temporary folder as the package they
describe, and the commands of its section 4 run on it as written (the pip
install into a temporary ``--target``, the runs with their results in a
temporary folder): the golden file written by its reference module, the
package installed by pip (the op registered by the installed dist-info's
entry point), ``check-op`` passing every check, and the smoke suite's
correctness and fault cases of the op (``nightly --suite smoke --jobs
correctness,faults``: the bundled suite takes it with no edit) all
passing, with no file of the repository edited. A step of the guide that
no longer works fails here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.op_packages import REPO, environment, repository_status

GUIDE = REPO / "docs" / "adding-an-op.md"
OP = "all_reduce_sum"
FILE_BLOCK = re.compile(r"^```\w*\n# file: (\S+)\n(.*?)^```$", re.S | re.M)

# The guide's commands, verbatim (tests/test_docs_commands.py: covered here).
GOLDEN = "LAMPORT_UPDATE_GOLDEN=1 python -m all_reduce_sum.reference"
INSTALL = "python -m pip install --no-deps --no-build-isolation ."
CHECK = "python -m jobs check-op all_reduce_sum"
SMOKE = "python -m jobs nightly --suite smoke --jobs correctness,faults --ops all_reduce_sum --backend emulated"
COMMANDS = (GOLDEN, INSTALL, CHECK, SMOKE)

pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("ray")]


def guide_files(text: str) -> dict[str, str]:
    """Each ``# file: PATH`` block of the guide, by path (the marker line is
    the file's first line: a comment in both Python and TOML)."""
    found: dict[str, str] = {}
    for path, body in FILE_BLOCK.findall(text):
        assert path not in found, f"the guide writes {path} twice"
        found[path] = f"# file: {path}\n{body}"
    return found


def run(command: str, cwd: Path, site: Path | None = None) -> subprocess.CompletedProcess:
    """``command`` by bash in ``cwd``, ``python`` this interpreter, the
    checkout (and ``site``) on PYTHONPATH."""
    env = environment(*([site] if site else []))
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=840)


def test_the_guide_writes_one_package_and_shows_the_commands_run_here():
    text = GUIDE.read_text()
    assert sorted(guide_files(text)) == ["all_reduce_sum/__init__.py", "all_reduce_sum/op.py",
                                         "all_reduce_sum/reference.py", "pyproject.toml"]
    for command in COMMANDS:
        assert f"\n{command}\n" in text, command


def test_the_guide_s_op_is_checked_and_runs_in_the_smoke_suite(tmp_path):
    from jobs.results import read_results

    package, site = tmp_path / "all-reduce-sum", tmp_path / "site"
    for path, body in guide_files(GUIDE.read_text()).items():
        (package / path).parent.mkdir(parents=True, exist_ok=True)
        (package / path).write_text(body)
    before = repository_status()
    steps = [(GOLDEN, None), (f"{INSTALL} --target {site} --no-index --quiet", None),
             (CHECK, site), (f"{SMOKE} --results {tmp_path / 'results'} --no-dashboard", site)]
    for command, path in steps:
        done = run(command, package, path)
        assert done.returncode == 0, f"$ {command}\n{done.stdout[-5000:]}{done.stderr[-3000:]}"
        if command == CHECK:
            assert [ln.split("  ")[0] for ln in done.stdout.splitlines()[1:]] == ["pass"] * 6, \
                done.stdout
    assert (package / "all_reduce_sum" / "golden" / "all_reduce_sum_tp3.json").is_file()
    (info,) = site.glob("lamport_lab_all_reduce_sum-*.dist-info")
    assert f"{OP} = all_reduce_sum.op:SPEC" in (info / "entry_points.txt").read_text()
    assert repository_status() == before  # repository files the guide's op touches: 0
    rows = read_results(tmp_path / "results").to_pylist()
    assert {(r["op"], r["job"], r["outcome"]) for r in rows} == {
        (OP, "correctness", "pass"), (OP, "faults", "pass")}
