"""Every command the README and docs/ show (tests/docs_commands.py finds
them) is run here as written, on the emulated backend, with its exit
status checked, or is accounted for: run as written by another test (the
README's Ray block, CI's own command, a test module), or skipped with the
reason (GPU only, a cluster, a command that rewrites committed files). A
command added to the docs and not listed in DOC_COMMANDS fails the first
test; one listed and gone from the docs fails it too. So a doc example
cannot drift from the code again (issue 33: the trace example exited 2).

A command runs from a scratch directory standing for the repo root (its
``.venv`` this interpreter's environment, ``docs`` and ``scripts`` the
checkout's, ``python`` on PATH the venv's, HOME its own), with ``bash -euo
pipefail``. Where running it whole would cost CI minutes, filters are
appended (``append``): the command still runs as written, on fewer cases.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from jobs import exits
from tests.docs_commands import REPO, all_commands, left_behind, untracked

pytestmark = pytest.mark.timeout(900)

GPU = "GPU only: it needs an NVIDIA GPU (the H200 machine); CI is CPU-only"
STAGING = "stages wheels for, or runs on, the offline GPU machine"
SYNOPSIS = "a synopsis, not an example: its capitals / ... are placeholders"
SMALL = "--backend emulated --jobs correctness --ops embed_norm"


@dataclass(frozen=True)
class Run:
    """Run as written (``before``: after that command of its block;
    ``after``: from that point of a ``&&`` chain, the part before it
    covered as ``covered`` says; ``append``: options added for CI time),
    expecting ``status``; ``creates``: paths it must leave in the scratch
    root; ``ray``: it starts Ray (xdist group "ray-docs", see tests/conftest.py)."""

    status: int = exits.OK
    before: str = ""
    """The command of the same block it follows (run first, as written)."""
    given: str = ""
    """What the prose around it says must be there first (run first)."""
    cleanup: str = ""
    """Run after it whatever happened (a head or pool it left)."""
    append: str = ""
    after: str = ""
    covered: str = ""
    needs_results: bool = False
    creates: tuple[str, ...] = ()
    ray: bool = False
    twice: bool = False
    """Run it twice in a row (after ``before``/``given``): an example the
    docs say can be run again."""


@dataclass(frozen=True)
class Covered:
    """Run as written elsewhere: ``by`` is ``README Ray block``
    (tests/readme_ray.py), ``.ci/run``, or a test module it reproduces."""

    by: str


@dataclass(frozen=True)
class Skip:
    reason: str


README_RAY = "README Ray block"
GUIDE_TEST = "tests/test_adding_an_op_guide.py"
DASHBOARD_BUILD = ".venv/bin/python -m dashboards build --results results --out site   # site/index.html"

STRAGGLERS_RUN = (".venv/bin/python -m jobs correctness --suite smoke --ops "
                  "all_reduce_norm,embed_norm --tp 2,4 --results artifacts/strag/results")
H200_BUILD = (".venv/bin/python -m dashboards build --results "
              "docs/results/data/h200_nightly_smoke_2026-11-29 --out artifacts/h200site")
DOC_COMMANDS: dict[str, Run | Covered | Skip] = {
    # README: the two commands it opens with.
    "scripts/setup && .venv/bin/python -m jobs nightly --suite smoke                          "
    "# set up, run the main job":
        Run(after=".venv/bin/python", covered=".ci/run (scripts/setup --dev)", append=SMALL,
            creates=("results/_runs/runs.pq", "site/index.html"), ray=True),
    "scripts/setup --dev && .venv/bin/python -m pytest -n 2 --dist loadgroup --durations=15   "
    "# set up, run the tests":
        Covered(".ci/run"),
    # README: the jobs, the cache, the simulated cluster, the trace.
    ".venv/bin/python -m jobs --help": Run(),
    ".venv/bin/python -m jobs correctness --help": Run(),
    "rm -rf ~/.cache/lamport-lab/compile": Run(),
    # One simulated cluster of 2 nodes, not three (1, 2, 4: 90 s on the CI box): the
    # same command and fan-out over nodes (the last --nodes wins).
    "python -m jobs.simulate --nodes 1,2,4": Run(append="--nodes 2 --jobs correctness "
                                                        "--ops embed_norm", ray=True),
    ".venv/bin/python -m jobs trace --ops all_reduce_norm --tp 2 --hidden 1024 --inputs random "
    "--placement emulated": Run(creates=("traces",), ray=True),
    # A standing pool on the head `jobs head start` recorded (the prose's prerequisite).
    "python -m jobs pool start --name lab": Run(
        given=".venv/bin/python -m jobs head start --num-cpus 2",
        cleanup="python -m jobs pool stop --name lab; python -m jobs head stop", ray=True),
    "python -m dashboards build --results results --out site":
        Run(needs_results=True, creates=("site/index.html",)),
    "scripts/gpu/nightly_cache.sh cold|warm 1|2|3|4|all": Skip(GPU),
    "ray start --head": Skip("what `jobs head start` runs, named in prose (README Ray block)"),
    "ray job submit --working-dir . -- python -m jobs ...": Skip(SYNOPSIS),
    "LAMPORT_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_golden.py":
        Skip("rewrites the committed golden vectors; tests/test_golden.py runs in the suite"),
    # README: the Ray section, run whole by tests/readme_ray.py.
    ".venv/bin/python -m jobs head start": Covered(README_RAY),
    '.venv/bin/python -m jobs submit --submission-id smoke-1 -- nightly --suite smoke --results '
    '"$PWD/ray-results" --site "$PWD/ray-site"': Covered(README_RAY),
    ".venv/bin/python -m jobs status smoke-1": Covered(README_RAY),
    ".venv/bin/python -m jobs logs smoke-1 | tail -n 3": Covered(README_RAY),
    '.venv/bin/python -m jobs submit --no-wait --submission-id cut-1 -- correctness --suite smoke '
    '--results "$PWD/ray-results-cut"': Covered(README_RAY),
    ".venv/bin/python -m jobs stop cut-1 --wait running": Covered(README_RAY),
    '.venv/bin/python -m jobs logs cut-1 | grep -E "before it was interrupted|^SIGTERM: |--resume$"':
        Covered(README_RAY),
    ".venv/bin/python -m jobs report --results ray-results": Covered(README_RAY),
    "ls ray-site/index.html": Covered(README_RAY),
    ".venv/bin/python -m jobs head stop": Covered(README_RAY),
    # README: a head without the dashboard (a minimal Ray); with a pool, a pooled check and a
    # refused submit in tests/test_jobs_head_minimal.py.
    "python -m jobs head start --dashboard off": Run(cleanup="python -m jobs head stop",
                                                     ray=True),
    # README: GPU tests, benchmarks and the GPU machine.
    "timeout -s KILL 900 bash scripts/gpu/suite.sh                  # the GPU suite (add --slow "
    "for all)": Skip(GPU),
    "timeout 900 .venv/bin/python -m pytest -m gpu                  # the same in one process":
        Skip(GPU),
    "timeout -s KILL": Skip("names timeout's option in prose, not a command"),
    "timeout -s KILL 900 bash scripts/gpu/suite.sh": Skip(GPU),
    "timeout 900 .venv/bin/python -m benchmarks.all_reduce_norm     # tp=1 fused vs torch add + "
    "rms_norm": Skip(GPU),
    "timeout 600 .venv/bin/python -m benchmarks.owner_crossover    # 2 GPUs: owner mode vs "
    "one-shot, M 1..512": Skip(GPU),
    "timeout 1800 python3 -m jobs profile --suite nightly --backend gpu --results /tmp/results":
        Skip(GPU),
    "timeout 900 python3 -m jobs profile --suite nightly --backend gpu --ops all_reduce_norm "
    "--tp 2 --hidden 5120,7168 --tokens 1,8,16,64 --results /tmp/results": Skip(GPU),
    "bash .dev/fi1/recv.sh": Skip(STAGING),
    "bash .dev/fi2/recv.sh": Skip(STAGING),
    "source /tmp/site/env.sh && source /tmp/flashinfer-site/env.sh": Skip(STAGING),
    "OUT=/tmp/out timeout -s KILL 580 bash scripts/gpu/indexer_gpu_run.sh": Skip(GPU),
    "OUT=/tmp/out bash scripts/gpu/allreduce_ncu.sh": Skip(GPU),
    "bash .dev/extra/install.sh": Skip(STAGING),
    "source scripts/gpu/env.sh": Skip(STAGING),
    "timeout 600 python3 -m jobs nightly --suite smoke --backend gpu --results /tmp/results":
        Skip(GPU),
    # docs/dashboard.md
    DASHBOARD_BUILD: Run(needs_results=True, creates=("site/index.html",)),
    ".venv/bin/python -m dashboards serve --site site                     # http://127.0.0.1:8765/,"
    " 15 min": Run(before=DASHBOARD_BUILD, append="--seconds 1", needs_results=True),
    ".venv/bin/python -m dashboards serve --results results --port 0      # build, then serve on a"
    " free port": Run(append="--seconds 1", needs_results=True),
    H200_BUILD: Run(creates=("artifacts/h200site/index.html",)),
    ".venv/bin/python -m dashboards.browser artifacts/h200site artifacts/h200shots index.html":
        Skip("needs chromium (scripts/setup --dev, as root); the browser run is "
             "tests/test_dashboards_browser.py"),
    ".venv/bin/python -m dashboards.browser --viewport 1400x1100 artifacts/h200site "
    "artifacts/h200shots correctness.html latency.html trends-all_reduce_norm.html":
        Skip("needs chromium (scripts/setup --dev, as root); the browser run is "
             "tests/test_dashboards_browser.py"),
    "scripts/setup --dev": Covered(".ci/run"),
    STRAGGLERS_RUN: Run(ray=True, creates=("artifacts/strag/results",)),
    ".venv/bin/python -m dashboards build --results artifacts/strag/results --out "
    "artifacts/strag/site": Run(before=STRAGGLERS_RUN, ray=True,
                                creates=("artifacts/strag/site/stragglers.html",)),
    ".venv/bin/python -m dashboards.browser artifacts/strag/site artifacts/strag/shots "
    "stragglers.html":
        Skip("needs chromium (scripts/setup --dev, as root); the browser run is "
             "tests/test_dashboards_browser.py"),
    ".venv/bin/python -m dashboards.browser SITE OUTDIR [page.html ...]": Skip(SYNOPSIS),
    # docs/deploy.md: a cluster of the perf team's.
    "python -m jobs nightly --suite nightly --backend gpu": Skip(GPU),
    "docker build -f deploy/Dockerfile --build-arg GIT_COMMIT=$(git rev-parse HEAD) -t "
    "registry.example.com/lamport-lab:nightly .": Skip("builds the cluster image (docker, a "
                                                      "registry); tests/test_deploy.py checks it"),
    "docker push registry.example.com/lamport-lab:nightly": Skip("pushes to a registry"),
    "helm upgrade --install kuberay-operator kuberay/kuberay-operator --version 1.7.0 "
    "--reuse-values -f deploy/kuberay/operator/values-1.7.0.yaml":
        Skip("reconfigures a Kubernetes cluster's KubeRay operator"),
    "kubectl create secret generic lamport-notify --from-file=url=/path/to/webhook-url":
        Skip("needs a Kubernetes cluster"),
    "kubectl apply -f deploy/kuberay/site.yaml -f deploy/kuberay/site-ingress.yaml":
        Skip("needs a Kubernetes cluster with KubeRay; tests/test_deploy.py checks the files"),
    "kubectl apply -f deploy/kuberay/nightly-cronjob.yaml":
        Skip("needs a Kubernetes cluster with KubeRay; tests/test_deploy.py checks the file"),
    "kubectl create job --from=cronjob/lamport-nightly lamport-nightly-now":
        Skip("needs a Kubernetes cluster with KubeRay"),
    "kubectl get cronjob,job,rayjob,raycluster": Skip("needs a Kubernetes cluster with KubeRay"),
    "kubectl logs -l job-name=<the rayjob's name>": Skip(SYNOPSIS),
    "mkdir -p ~/.config/lamport-lab && (umask 077 && openssl rand -hex 32 > "
    "~/.config/lamport-lab/cluster-auth-token)": Run(creates=("home/.config/lamport-lab/"
                                                              "cluster-auth-token",)),
    ".venv/bin/ray up --yes deploy/ray-up/cluster.yaml": Skip("needs the perf team's machines "
                                                              "(ssh); tests/test_deploy.py checks "
                                                              "the config"),
    "0 2 * * * cd /path/to/lamport-lab && LAMPORT_SITE_DIR=/var/www/lamport-lab "
    "deploy/ray-up/nightly.sh >> nightly.log 2>&1": Skip("a crontab line for the machine that "
                                                         "runs `ray up`"),
    ".venv/bin/ray exec deploy/ray-up/cluster.yaml 'cd ~/lamport-lab && .venv/bin/python -m jobs "
    "logs lamport-nightly-20261208T020000Z --address http://127.0.0.1:8265'":
        Skip("needs the perf team's machines (ssh) and a night's job there"),
    ".venv/bin/ray dashboard deploy/ray-up/cluster.yaml": Skip("needs the perf team's machines "
                                                               "(ssh)"),
    # docs/hardening.md: each reproduces a figure of a test that runs in the suite.
    "export PYTHONPATH=$PWD": Run(),
    "timeout 600 .venv/bin/python -m pytest tests/test_fuzz_inputs.py -q -s -p no:randomly \\| "
    "grep figure": Covered("tests/test_fuzz_inputs.py"),
    "timeout 300 .venv/bin/python -m pytest tests/test_run_lease.py -q -s -k racing \\| "
    "grep figure": Covered("tests/test_run_lease.py"),
    "python -m jobs schema | head -1": Covered("tests/test_jobs_dataset.py"),
    "timeout 300 .venv/bin/python -m pytest tests/test_jobs_sizing.py -q":
        Covered("tests/test_jobs_sizing.py"),
    "timeout 300 .venv/bin/python -m pytest tests/test_results_readers.py -q -s -k status \\| "
    "grep figure": Covered("tests/test_results_readers.py"),
    "timeout 300 .venv/bin/python -m pytest tests/test_results_store.py -q -s -k killed \\| grep "
    "figure": Covered("tests/test_results_store.py"),
    "timeout 300 .venv/bin/python -m pytest tests/test_results_readers.py -q -s -k readers \\| "
    "grep figure": Covered("tests/test_results_readers.py"),
    "timeout 300 .venv/bin/python -m pytest tests/test_embedded_cluster.py -q -s -k loopback \\| "
    "grep figure": Covered("tests/test_embedded_cluster.py"),
    "timeout 300 .venv/bin/python -m pytest tests/test_jobs_head.py -q -s -k loopback_only \\| "
    "grep figure": Covered("tests/test_jobs_head.py"),
    "LAMPORT_RACE_S=300 timeout 1500 .venv/bin/python -m pytest tests/test_results_race.py -q -s "
    "\\| grep figure": Covered("tests/test_results_race.py"),
    "python -m jobs.embedded --watch PID": Skip(SYNOPSIS + " (the watchdog the embedded cluster "
                                                "starts; tests/test_embedded_cluster.py)"),
    "timeout 600 .venv/bin/python -m pytest tests/test_embedded_cluster.py -q -s -k killed \\| "
    "grep figure": Covered("tests/test_embedded_cluster.py"),
    "python -m dashboards build --out DIR": Skip(SYNOPSIS),
    # docs/architecture.md: redrawing the picture; --check draws it and compares, writing
    # nothing (tests/test_architecture_picture.py also redraws it and compares).
    ".venv/bin/python scripts/draw_architecture.py": Run(append="--check"),
    # README: which compile-check variants the working tree's changes touch (exit 0 either way).
    ".venv/bin/python scripts/ptx_diff.py HEAD --ops indexer": Run(),
    # docs/alerts.md: a webhook that refuses (nothing on port 9): retried, logged, still exit 0;
    # run twice, as its prose says (the summary appended to, not refused).
    "export LAMPORT_NOTIFY_URL=http://127.0.0.1:9/hook   # in CI: from the CI system's secrets":
        Run(),
    ".venv/bin/python -m jobs nightly --suite smoke --notify-env LAMPORT_NOTIFY_URL "
    "--notify-on always --summary-md summary.md":
        Run(given="export LAMPORT_NOTIFY_URL=http://127.0.0.1:9/hook", append=SMALL,
            creates=("summary.md",), ray=True, twice=True),
    # README: the bisect, in prose (tests/test_jobs_bisect.py runs it on a repo of ten commits).
    "python -m jobs bisect --case KEY": Skip(SYNOPSIS),
    # docs/results-schema.md
    ".venv/bin/python -m jobs report --results results          # the latest run":
        Run(needs_results=True),
    ".venv/bin/python -m jobs report --results results --list   # every run":
        Run(needs_results=True),
    # docs/adding-an-op.md: its package's commands, run on it as written by the test that
    # writes the package from the guide (pip into a temporary --target).
    "LAMPORT_UPDATE_GOLDEN=1 python -m all_reduce_sum.reference": Covered(GUIDE_TEST),
    "python -m pip install --no-deps --no-build-isolation .": Covered(GUIDE_TEST),
    "python -m jobs check-op all_reduce_sum": Covered(GUIDE_TEST),
    "python -m jobs nightly --suite smoke --jobs correctness,faults --ops all_reduce_sum "
    "--backend emulated": Covered(GUIDE_TEST),
}


def test_every_doc_command_is_run_or_accounted_for():
    shown = {c.text: c for c in all_commands()}
    new = [f"{c.doc}:{c.line}: {t}" for t, c in shown.items() if t not in DOC_COMMANDS]
    gone = [t for t in DOC_COMMANDS if t not in shown]
    assert not new, ("commands in the docs that DOC_COMMANDS does not list: run them here, "
                     "or say where they run or why not", new)
    assert not gone, ("DOC_COMMANDS lists commands the docs no longer show", gone)


def test_covered_commands_are_run_where_they_say():
    from tests.readme_ray import readme_block
    block = readme_block().splitlines()
    ci = (REPO / ".ci" / "run").read_text()
    for text, entry in DOC_COMMANDS.items():
        by = entry.by if isinstance(entry, Covered) else None
        if by == README_RAY:
            assert text in block, text  # tests/readme_ray.py runs the block line by line
        elif by == ".ci/run":
            assert text.split("#")[0].strip() in ci, text
        elif by is not None:  # the test is named in the command, or holds it verbatim
            assert (REPO / by).is_file() and (by in text or text in (REPO / by).read_text()), \
                (text, by)
    assert "scripts/setup --dev" in ci  # the first command's setup half (Run.covered)


def _results(root: Path) -> None:
    """A small finished run in ``root/results`` (the commands that read one)."""
    from jobs.results import ResultsWriter, runs
    facts = {"git_commit": "0" * 40, "torch": "2.13.0", "ray": "2.60.0"}
    runs.begin(root / "results", "docs-run", trigger="nightly", facts=facts)
    now = dt.datetime.now(dt.timezone.utc)
    ResultsWriter(root / "results", suite="smoke", run_id="docs-run", trigger="nightly").append(
        [dict(op="all_reduce_norm", tp=2, hidden=1024, tokens=t, job="correctness",
              backend="emulated", placement="emulated", outcome="pass", started_at=now,
              **facts) for t in (1, 3)])
    runs.finish(root / "results", "docs-run")


def _runnable():
    for text, entry in DOC_COMMANDS.items():
        marks = [pytest.mark.xdist_group("ray-docs")] if isinstance(entry, Run) and entry.ray else []
        if isinstance(entry, Skip):
            marks.append(pytest.mark.skip(reason=entry.reason))
        if not isinstance(entry, Covered):
            yield pytest.param(text, entry, marks=marks, id=re.sub(r"\W+", "-", text)[:60])


@pytest.mark.parametrize("text, entry", list(_runnable()))
def test_doc_command_runs_as_written(text, entry, tmp_path):
    root = tmp_path / "root"
    (root / "home").mkdir(parents=True)
    (root / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    for name in ("docs", "scripts"):
        (root / name).symlink_to(REPO / name, target_is_directory=True)
    if entry.needs_results:
        _results(root)
    command = text
    if entry.after:
        assert entry.covered and entry.after in command, (text, entry)
        command = command[command.index(entry.after):]
    if entry.append:
        command = re.sub(r"\s+#.*$", "", command) + " " + entry.append
    if entry.twice:
        command = f"{command}\n{command}"
    if entry.before:
        assert isinstance(DOC_COMMANDS[entry.before], Run), entry.before
        command = f"{entry.before}\n{command}"
    if entry.given:
        command = f"{entry.given}\n{command}"
    if entry.cleanup:  # the command's own status, after the cleanup ran
        command = f"trap '{entry.cleanup}' EXIT\n{command}"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "LAMPORT_HEAD_DIR")}
    env.update(PYTHONPATH=str(REPO), HOME=str(root / "home"),
               PATH=f"{Path(sys.prefix) / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    before = untracked("docs", "scripts")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=root, env=env,
                          capture_output=True, text=True, timeout=840)
    out = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == entry.status, f"$ {command}\n(exit {done.returncode})\n{out}"
    for path in entry.creates:
        assert (root / path).exists(), f"$ {command}\nleft no {path}\n{out}"
    assert "Traceback" not in done.stderr, out
    stray = left_behind(root)
    assert not stray, f"$ {command}\nleft files a clone's git status lists untracked: {stray}"
    assert untracked("docs", "scripts") <= before, f"$ {command}\nwrote into docs/ or scripts/"


def test_readme_lists_every_exit_status_from_the_one_module():
    assert exits.markdown_table() in (REPO / "README.md").read_text()
