"""The compile cache's key (kernels.compile_cache.cache_key): what makes two
builds one entry. The compile check spells the arch (``sm_90a``), a GPU
rank leaves it to the device (``""``); both build the same binary, so they
must share the entry, or a cold machine compiles every kernel twice (once
for the check, once for the ranks). The check's watchdog builds use the
default case budget for the same reason (the budget is compiled in)."""

from __future__ import annotations

import pytest

from kernels.compile_cache import cache_key
from kernels.lamport import compile as lc
from kernels.lamport import compile_variants as cv
from kernels.lamport.protocol import DEFAULT_BUDGET_NS


@pytest.fixture
def on_hopper(monkeypatch):
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")


def key(fn, config) -> str:
    return cache_key(fn.uncached, config)[0]


def test_a_spelled_arch_and_the_devices_share_an_entry(on_hopper):
    for fn, config in ((lc.compile_norm, lc.NormConfig(hidden=7168, tp=2, budget_ns=5)),
                       (lc.compile_publish, lc.PublishConfig(tp=4)),
                       (lc.compile_embed_norm, lc.EmbedNormConfig(hidden=7168, tp=8))):
        spelled = type(config)(**{**config.__dict__, "arch": "sm_90a"})
        assert key(fn, config) == key(fn, spelled), config
        other = type(config)(**{**config.__dict__, "arch": "sm_100a"})
        assert key(fn, config) != key(fn, other), "another arch is another binary"


def test_what_changes_the_binary_changes_the_key(on_hopper):
    base = lc.NormConfig(hidden=7168, tp=2, budget_ns=DEFAULT_BUDGET_NS)
    for changed in (lc.NormConfig(hidden=4096, tp=2, budget_ns=DEFAULT_BUDGET_NS),
                    lc.NormConfig(hidden=7168, tp=4, budget_ns=DEFAULT_BUDGET_NS),
                    lc.NormConfig(hidden=7168, tp=2, budget_ns=0),
                    lc.NormConfig(hidden=7168, tp=2, budget_ns=DEFAULT_BUDGET_NS, mode="owner")):
        assert key(lc.compile_norm, base) != key(lc.compile_norm, changed), changed


def test_the_checks_watchdog_builds_are_the_default_cases_kernels():
    from cluster.cases import DEFAULTS

    assert cv.CHECK_BUDGET_NS == DEFAULTS["budget_ns"] == DEFAULT_BUDGET_NS
