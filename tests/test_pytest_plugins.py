"""What tests/conftest.py and tests/isolation.py add to pytest, in inner
pytest runs (pytester; gloo on the CPU): a test module that fails with a
process group open and the environment changed does not take the next
module down (the GPU suite once lost 17 tests that way); --repeat N runs a
test N times; a slow GPU test runs only with --slow, a slow CPU test always."""

import pytest

pytest_plugins = ["pytester"]

LEAKS = '''
import os, socket
import torch.distributed as dist

def test_fails_with_a_group_open():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    assert False, "a failure before the group is destroyed"
'''

NEEDS_A_CLEAN_PROCESS = '''
import os, socket
import torch.distributed as dist

def test_starts_its_own_group():
    assert "MASTER_PORT" not in os.environ
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    dist.destroy_process_group()
'''


def _run(pytester, *args):
    pytester.makepyfile(test_a_leaks=LEAKS, test_b_needs_a_clean_process=NEEDS_A_CLEAN_PROCESS)
    return pytester.runpytest_inprocess("-p", "tests.isolation", "-p", "no:cacheprovider", *args)


def test_a_failing_module_leaves_nothing_to_the_next(pytester):
    result = _run(pytester)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_a_leaks: destroyed the default torch.distributed "
                                 "process group it left*",
                                 "*LeftoverWarning: test_a_leaks: restored the environment "
                                 "variables ?'MASTER_PORT'?"])


def test_without_the_plugin_the_next_module_breaks(pytester):
    """The failure the plugin prevents (so the test above can fail)."""
    pytester.makepyfile(test_a_leaks=LEAKS, test_b_needs_a_clean_process=NEEDS_A_CLEAN_PROCESS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)


@pytest.mark.parametrize("n", [3])
def test_repeat_runs_a_test_n_times(pytester, n):
    pytester.makeconftest("from tests.conftest import pytest_addoption, pytest_generate_tests, "
                          "_repeat_index  # noqa: F401")
    pytester.makepyfile(test_once="def test_once():\n    pass\n")
    result = pytester.runpytest_inprocess("--repeat", str(n), "-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=n)
    result.stdout.fnmatch_lines([f"*test_once?rep{n}of{n}?*PASSED*"])


def test_slow_gpu_tests_only_with_the_option(pytester):
    pytester.makeconftest("from tests.conftest import *  # noqa: F401,F403")
    pytester.makepyfile(test_marks='''
import pytest

@pytest.mark.slow
@getattr(pytest.mark, "gpu")  # spelled so: scripts/gpu/suite.py lists this file otherwise
def test_slow_gpu():
    pass

@pytest.mark.slow
def test_slow_cpu():
    pass
''')
    plain = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    plain.assert_outcomes(passed=1, deselected=1)
    asked = pytester.runpytest_inprocess("--slow", "-p", "no:cacheprovider")
    assert asked.parseoutcomes().get("deselected", 0) == 0
    assert asked.parseoutcomes()["passed"] + asked.parseoutcomes().get("skipped", 0) == 2
