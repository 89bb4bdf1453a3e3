"""The README's Ray section, run once per test session as written: a local
head, the smoke nightly submitted to it, the report, the head stopped.

One run serves two modules (the ``readme_ray_run`` fixture in conftest.py):
test_jobs_submit.py checks what the section promises (auth, the project's
interpreter, the commit, the head gone after), test_jobs_nightly.py checks
the smoke nightly's dataset, console and site. Both are in the xdist group
"ray-head", so the run happens once, on one worker."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Ray: a head and a submitted job"


def readme_block() -> str:
    """The first bash block under the README's Ray section."""
    text = (REPO / "README.md").read_text()
    assert SECTION in text, f"README.md has no section {SECTION!r}"
    block = re.search(r"```bash\n(.*?)```", text[text.index(SECTION):], re.S)
    assert block, f"no bash block under {SECTION!r}"
    return block.group(1)


@dataclasses.dataclass(frozen=True)
class ReadmeRun:
    done: subprocess.CompletedProcess
    root: Path
    """The scratch directory the block ran in (``ray-results``, ``ray-site``, ``.ray-head``)."""
    commit: str

    @property
    def out(self) -> str:
        return self.done.stdout + self.done.stderr


def run_readme_ray_section(root: Path) -> ReadmeRun:
    """Run the block in ``root``, standing in for the repo root (its .venv is
    this interpreter's environment, PYTHONPATH this checkout), so the head's
    directory, results and site are the test session's own; the head is
    stopped at the end whatever happens."""
    (root / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "LAMPORT_HEAD_DIR", "LAMPORT_GIT_COMMIT", "RAY_AUTH_TOKEN",
                        "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE")}
    env["PYTHONPATH"] = str(REPO)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    try:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", readme_block()], cwd=root,
                              env=env, capture_output=True, text=True, timeout=1100)
    finally:
        subprocess.run([sys.executable, "-m", "jobs", "head", "stop"], cwd=root, env=env,
                       capture_output=True, timeout=60)
    return ReadmeRun(done, root, commit)
