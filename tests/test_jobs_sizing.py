"""The memory estimate per TP group (jobs.sizing), refused over the ceiling
with exit 2 before Ray starts."""

from __future__ import annotations

import pytest

from jobs.config import load_suite, suite_path
from jobs.sizing import GIB, check, estimate

BIG = """format = 1
name = "big"
version = 1
[[correctness]]
op = "all_reduce_norm"
tp = 2
hidden = 1024
tokens = [1, 10000000]
"""


@pytest.fixture
def no_ray(monkeypatch):
    import jobs.harness as harness

    def tripwire(*args, **kwargs):
        raise AssertionError("Ray would have started")

    monkeypatch.setattr(harness, "ray_session", tripwire)


def test_the_estimate_is_the_mailbox_and_the_inputs(tmp_path):
    path = tmp_path / "big.toml"
    path.write_text(BIG)
    (big,) = estimate(load_suite(path).cases)
    assert big.capacity == 10_000_000  # the group's mailbox holds its largest M
    assert big.mailbox_per_rank == 4096 + 3 * 2 * 10_000_000 * 1024 * 2
    assert big.per_node == 2 * (big.mailbox_per_rank + big.io_per_rank)
    assert big.per_node > 100 * GIB


def test_a_case_over_the_ceiling_exits_2_before_ray(tmp_path, capsys, no_ray, monkeypatch):
    from jobs.__main__ import main
    monkeypatch.delenv("LAMPORT_MEMORY_LIMIT_GB", raising=False)
    path = tmp_path / "big.toml"
    path.write_text(BIG)
    assert main(["correctness", "--config", str(path), "--no-results"]) == 2
    err = capsys.readouterr().err
    assert "mailbox [3, 2, 10000000, 1024] BF16" in err and "over the memory ceiling" in err
    # the ceiling is configurable: the CLI, the environment, the suite
    path.write_text(BIG.replace("tokens = [1, 10000000]", "tokens = [4096]"))
    assert main(["correctness", "--config", str(path), "--no-results",
                 "--memory-limit-gb", "0.01"]) == 2
    assert "0.01 GiB per node (--memory-limit-gb)" in capsys.readouterr().err
    monkeypatch.setenv("LAMPORT_MEMORY_LIMIT_GB", "0.01")
    assert main(["correctness", "--config", str(path), "--no-results"]) == 2
    assert "(LAMPORT_MEMORY_LIMIT_GB)" in capsys.readouterr().err
    monkeypatch.setenv("LAMPORT_MEMORY_LIMIT_GB", "inf")
    assert main(["correctness", "--config", str(path), "--no-results"]) == 2
    assert "LAMPORT_MEMORY_LIMIT_GB='inf'" in capsys.readouterr().err
    monkeypatch.delenv("LAMPORT_MEMORY_LIMIT_GB")
    path.write_text(BIG.replace("tokens = [1, 10000000]", "tokens = [4096]")
                    .replace('version = 1\n', 'version = 1\nmemory_limit_gb = 0.01\n'))
    assert main(["correctness", "--config", str(path), "--no-results"]) == 2
    assert "the suite's memory_limit_gb" in capsys.readouterr().err


@pytest.mark.parametrize("suite", ["smoke", "nightly", "full"])
def test_the_bundled_suites_fit_a_small_machine(suite):
    # 2 GiB a node: the nightly's largest group (owner mode, tp=8, hidden 7168,
    # M=256, all ranks on one node's shared memory) needs 1.42 GiB.
    estimates = check(load_suite(suite_path(suite)).cases, cli_gb=2.0)
    assert estimates and estimates[0].per_node < 2 * GIB
