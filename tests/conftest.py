"""Markers: `gpu` tests skip where no CUDA GPU is present, `multigpu` tests
where fewer than two are; CPU tests never need a GPU.

Parallel runs (``pytest -n 2 --dist loadgroup``, the README's and CI's): each
module is one unit of work (its module-scoped fixtures, e.g. compiled
kernels, are built once), and the modules that start Ray clusters
(``pytestmark = pytest.mark.xdist_group("ray")``) run one after another on
one worker, so two embedded clusters never compete for the cores
mid-deadline; the README's Ray section (tests/readme_ray.py, run once for
test_jobs_submit.py and test_jobs_nightly.py, group "ray-head", free ports
and directories of its own) may run beside them, and test_jobs_head.py's
head after it, in the same group (one `ray start --head` at a time). The
doc commands that start Ray (tests/test_docs_commands.py, group "ray-docs")
are subprocesses with clusters, ports and directories of their own and no
deadline tighter than their exit; they run beside "ray" too, so that the
worker that takes "ray" is not the last by a quarter of the run.
If pytest-xdist cannot honour the groups (pytest 9 with xdist 3.8: see
pyproject.toml), the run stops at collection instead of scattering them.
Nothing here depends on the environment's Ray: RAY_ADDRESS is dropped, so
no test joins a cluster that happens to run on the machine. Every cluster a
test starts runs its workers at the niceness of the rest
(:data:`jobs.embedded.WORKER_ENV`), as the service's own clusters do."""

import os
import tempfile

import pytest

from jobs.embedded import WORKER_ENV
from tests.ray_local import local_ray_cluster

os.environ.pop("RAY_ADDRESS", None)
os.environ.update(WORKER_ENV)

pytest_plugins = [
    "tests.isolation",  # a module's leftovers (process group, Ray, env) end with it
    "tests.cpu_profile",  # --cpu-profile FILE: the CPU seconds of each test and what it started
]


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true",
                     help="also run the GPU tests marked slow (left out of a GPU run by "
                          "default, so that it fits one device call)")
    parser.addoption("--repeat", type=int, default=1, metavar="N",
                     help="run every selected test N times in this process (flake hunts: "
                          "the ids end in [..-repIofN])")


def pytest_generate_tests(metafunc):
    n = metafunc.config.getoption("repeat")
    if n < 1:
        raise pytest.UsageError(f"--repeat must be >= 1, got {n}")
    if n > 1:
        metafunc.fixturenames.append("_repeat_index")
        metafunc.parametrize("_repeat_index", range(n), ids=[f"rep{i + 1}of{n}" for i in range(n)],
                             indirect=True)


@pytest.fixture
def _repeat_index(request):
    return request.param


def pytest_configure(config):
    """A compile cache of the test session's own (kernels.compile_cache), so
    tests neither read nor fill the user's (an explicit LAMPORT_COMPILE_CACHE
    is kept); xdist schedules the groups in the order of the collection."""
    if "LAMPORT_COMPILE_CACHE" not in os.environ:
        os.environ["LAMPORT_COMPILE_CACHE"] = tempfile.mkdtemp(prefix="lamport-compile-cache-")
    if hasattr(config.option, "loadscopereorder"):
        # xdist would order the groups by their number of tests; ours are
        # ordered by their length (LONGEST_FIRST).
        config.option.loadscopereorder = False


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray cluster of 2 CPUs for the module (the one a test process
    already has is used as it is; a slow start is retried); its modules are in
    the xdist group "ray"."""
    with local_ray_cluster(num_cpus=2):
        yield


@pytest.fixture(scope="session")
def readme_ray_run(tmp_path_factory):
    """The README's Ray section run once (tests/readme_ray.py); its users are
    in the xdist group "ray-head"."""
    from tests.readme_ray import run_readme_ray_section
    return run_readme_ray_section(tmp_path_factory.mktemp("readme-ray"))


def _cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    devices = _cuda_devices()
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is present")
    few_gpus = pytest.mark.skip(reason=f"needs 2+ CUDA GPUs; {devices} present")
    if not config.getoption("slow"):
        slow_gpu = [i for i in items if "slow" in i.keywords
                    and ("gpu" in i.keywords or "multigpu" in i.keywords)]
        if slow_gpu:
            config.hook.pytest_deselected(items=slow_gpu)
            gone = {id(i) for i in slow_gpu}
            items[:] = [i for i in items if id(i) not in gone]
    for item in items:
        if "multigpu" in item.keywords and devices < 2:
            item.add_marker(few_gpus)
        elif "gpu" in item.keywords and devices < 1:
            item.add_marker(no_gpu)
        if not any(True for _ in item.iter_markers("xdist_group")):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    # The longest groups first (a stable sort: modules stay whole), so that on
    # two workers neither is left with a long group at the end.
    def rank(item):
        group = next(item.iter_markers("xdist_group")).args[0]
        return LONGEST_FIRST.index(group) if group in LONGEST_FIRST else len(LONGEST_FIRST)
    items.sort(key=rank)


LONGEST_FIRST = ("ray-head", "ray", "ray-docs", "test_lamport_compile", "test_embedded_cluster",
                 "test_dashboards_browser")
"""xdist groups by their share of a run (the README's Ray section with its
smoke nightly, the Ray cluster tests, the full compile check, ...); the
scheduler takes them in this order (``pytest_configure``), then the rest as
collected."""



def pytest_xdist_node_collection_finished(node, ids):
    """(On the xdist controller, per worker.) Under ``--dist loadgroup``
    every test must arrive with its group in its node id
    (``...::test@group``: the hook above gives every test one), which is
    what the scheduler groups by; a pytest/xdist pair that drops it would
    run the Ray modules side by side and split module fixtures over both
    workers, so the run stops instead."""
    if node.config.getoption("dist", default="no") != "loadgroup":
        return
    untagged = [i for i in ids if "@" not in i.rsplit("]", 1)[-1]]
    if untagged:
        pytest.exit(f"--dist loadgroup: {len(untagged)} of {len(ids)} test(s) reached the "
                    f"scheduler without their xdist_group (e.g. {untagged[0]}): pytest-xdist "
                    f"cannot group under pytest {pytest.__version__}; install the versions "
                    f"pyproject.toml pins (scripts/setup --dev)", returncode=4)
