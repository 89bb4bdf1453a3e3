"""An op that cannot register (an installed package's, or one named by
``LAMPORT_OP_MODULES``) stops every ``python -m jobs`` command with one
line naming it and exit 2, never a traceback."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

BROKEN = {
    "no_impl": (textwrap.dedent("""\
        import dataclasses
        from cluster.ops import OPS, register
        register(dataclasses.replace(OPS["all_reduce_norm"], name="no_impl",
                                     impl="lamport_nowhere.impl"), origin="module no_impl")
        """), "no_impl"),
    "clash": (textwrap.dedent("""\
        import dataclasses
        from cluster.ops import OPS, register
        register(dataclasses.replace(OPS["all_reduce_norm"]), origin="module clash")
        """), "is already registered"),
    "missing": (None, "no module 'lamport_missing_op_module' on sys.path"),
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_an_op_that_cannot_register_is_one_line_and_exit_2(tmp_path, kind):
    source, said = BROKEN[kind]
    module = "lamport_missing_op_module" if source is None else f"broken_{kind}"
    if source is not None:
        (tmp_path / f"{module}.py").write_text(source)
    env = {**os.environ, "LAMPORT_OP_MODULES": module,
           "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])}
    done = subprocess.run([sys.executable, "-m", "jobs", "schema"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("python -m jobs: an op cannot be registered: ") and said in lines[0]
    assert done.stdout == ""
