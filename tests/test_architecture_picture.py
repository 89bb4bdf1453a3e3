"""docs/img/architecture.svg is what scripts/draw_architecture.py draws
today (so the picture of the data path cannot drift from its script), every
module a box names exists, and the script's ``--check`` tells a stale
picture from a current one."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "draw_architecture.py"
_spec = importlib.util.spec_from_file_location("draw_architecture", SCRIPT)
draw = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = draw  # dataclasses look their module up there
_spec.loader.exec_module(draw)


def test_the_committed_picture_is_what_the_script_draws():
    committed = (REPO / draw.OUT).read_text()
    assert committed == draw.render(), (f"{draw.OUT} differs from what {SCRIPT.relative_to(REPO)} "
                                        f"draws: run python3 scripts/draw_architecture.py and "
                                        f"commit the result")


def test_the_drawing_is_deterministic():
    assert draw.render() == draw.render()


@pytest.mark.parametrize("path", draw.cited_paths())
def test_every_module_the_picture_names_exists(path):
    matches = list(REPO.glob(path))
    assert matches, f"scripts/draw_architecture.py names {path}, which is not in the repo"


def test_check_passes_on_the_picture_and_fails_on_a_stale_one(tmp_path):
    def check(out: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(SCRIPT), "--check", "--out", str(out)],
                              capture_output=True, text=True, timeout=60)

    assert check(REPO / draw.OUT).returncode == 0
    stale = tmp_path / "architecture.svg"
    stale.write_text(draw.render().replace("rank workers", "rank actors"))
    done = check(stale)
    assert done.returncode == 1 and "out of date" in done.stderr, done
    assert check(tmp_path / "absent.svg").returncode == 1
    written = tmp_path / "new.svg"
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(written)], check=True,
                   capture_output=True, timeout=60)
    assert written.read_text() == draw.render()
