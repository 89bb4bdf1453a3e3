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
    import jobs.session as session

    def tripwire(*args, **kwargs):
        raise AssertionError("Ray would have started")

    monkeypatch.setattr(session, "ray_session", tripwire)


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
    # 2 GiB a node: the nightly's largest group (all_reduce_mhc with hc 4 and
    # its finalize, tp=8, hidden 7168, M=64, all ranks on one node's shared
    # memory) needs 1.78 GiB.
    estimates = check(load_suite(suite_path(suite)).cases, cli_gb=2.0)
    assert estimates and estimates[0].per_node < 2 * GIB


FINALIZE = """format = 1
name = "moe"
version = 1
[[correctness]]
op = "finalize_publish"
tp = 2
hidden = 1024
tokens = 8
top_k = {top_k}
"""


def test_the_estimate_grows_with_every_field_that_scales_the_inputs(tmp_path):
    """top_k multiplies the MoE rows every rank generates, hc the mHC
    streams, rotate_mb the profile's input sets."""
    def per_rank(text):
        path = tmp_path / "s.toml"
        path.write_text(text)
        (one,) = estimate(load_suite(path).cases)
        return one.io_per_rank
    small, large = (per_rank(FINALIZE.format(top_k=k)) for k in (1, 128))
    assert large - small == 2 * 127 * 8 * 1024 * (2 + 4)  # tp x extra routes x M x hidden
    mhc = FINALIZE.replace('"finalize_publish"', '"all_reduce_mhc"').replace(
        "top_k = {top_k}", "hc = {hc}")
    assert per_rank(mhc.format(hc=8)) - per_rank(mhc.format(hc=1)) == 7 * 8 * 1024 * (4 + 4)
    profile = FINALIZE.replace("[[correctness]]", "[[profile]]").replace(
        "top_k = {top_k}", "top_k = 8\nrotate_mb = {mb}")
    assert per_rank(profile.format(mb=1000)) - per_rank(profile.format(mb=1)) == 999 << 20


def test_the_issues_moe_case_is_refused_before_ray(tmp_path, capsys, no_ray):
    """top_k = 50000 once passed as 0.0005 GiB and grew to 7.3 GB: now it is
    beyond top_k's bound, and a top_k within it over the ceiling is refused
    with the MoE rows counted."""
    from jobs.__main__ import main
    path = tmp_path / "moe.toml"
    path.write_text(FINALIZE.format(top_k=50000))
    assert main(["correctness", "--config", str(path), "--no-results",
                 "--memory-limit-gb", "1"]) == 2
    assert "top_k = 50000: must be in [1, 128]" in capsys.readouterr().err
    path.write_text(FINALIZE.format(top_k=128).replace("tokens = 8", "tokens = 4096"))
    assert main(["correctness", "--config", str(path), "--no-results",
                 "--memory-limit-gb", "1"]) == 2
    err = capsys.readouterr().err
    assert "finalize_publish tp=2 hidden=1024 capacity=4096 top_k=128" in err
    assert "over the memory ceiling of 1 GiB" in err
