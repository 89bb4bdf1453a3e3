"""The mHC tuning table and launch geometry (pure Python, no GPU)."""

import pytest

from kernels.lamport.mhc import MHCKernel
from kernels.lamport.mhc_tuning import (ARCHS, MAX_TRIPS, TABLE, MHCTuning, check_geometry,
                                        default_tuning, tuning_for)


def test_seed_entry_and_measured_entries():
    for arch in ARCHS:
        for tp in (1, 2, 4, 8):
            t = tuning_for(5120, tp, arch)
            assert (t.cluster_size, t.threads, t.rank_lanes, t.source) == (5, 128, 1, "seed")
            assert t.trips(5120) == 1  # 640 fragments in one fully used trip
        for hidden, cluster in ((7168, 7), (8192, 8)):
            t = tuning_for(hidden, 1, arch)
            assert t.cluster_size == cluster and t.trips(hidden) == 1
            assert t.source == "measured"
    for (hidden, tp, arch), t in TABLE.items():
        assert arch in ARCHS
        t.validate(hidden=hidden, tp=tp)


def test_source_is_not_part_of_the_key():
    assert MHCTuning(5, 128, 1, source="seed") == MHCTuning(5, 128, 1)
    assert hash(MHCTuning(5, 128, 1, source="seed")) == hash(MHCTuning(5, 128, 1))


@pytest.mark.parametrize("hidden", [8, 1000, 2048, 2056, 2560, 3584, 4096, 7168, 12288, 16384,
                                    65536])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_default_rule_covers_any_multiple_of_8(hidden, tp):
    t = tuning_for(hidden, tp, "sm_80")  # no table entry: the default rule
    assert t.source == "default" and 1 <= t.trips(hidden) <= MAX_TRIPS
    assert t.trips(hidden) == 1  # one trip up to 8 x 1024 x 8 elements


@pytest.mark.parametrize("hidden, cluster, threads, lanes", [
    (5120, 5, 128, 1), (5120, 5, 256, 2), (7168, 2, 256, 4), (2056, 3, 96, 1), (1000, 1, 32, 2),
    (4096, 1, 128, 1), (5120, 5, 1024, 8)])
def test_every_fragment_has_exactly_one_owner(hidden, cluster, threads, lanes):
    """The kernel's mapping: CTA c, group g, trip k own fragment
    c * groups + g + k * stride (below F)."""
    k = MHCKernel(hidden=hidden, tp=8, hc=4, cluster_size=cluster, threads=threads,
                  rank_lanes=lanes)
    owners = {}
    for c in range(cluster):
        for tid in range(threads):
            if tid % lanes:
                continue
            for trip in range(k.trips):
                f = c * k.groups + tid // lanes + trip * k.stride
                if f < k.fragments:
                    assert f not in owners, f"fragment {f} owned twice"
                    owners[f] = (c, tid, trip)
    assert sorted(owners) == list(range(hidden // 8))
    assert k.waves * lanes == 8


@pytest.mark.parametrize("kw, match", [
    (dict(hidden=5121), "hidden_size must be a positive multiple of 8"),
    (dict(tp=3), "tp must be one of"),
    (dict(rank_lanes=3), "rank_lanes must be one of"),
    (dict(tp=2, rank_lanes=4), "rank_lanes=4 must divide tp=2"),
    (dict(threads=100), "threads must be a positive multiple of 32"),
    (dict(threads=2048), "threads must be a positive multiple of 32"),
    (dict(cluster_size=9), r"cluster_size must be in \[1, 8\]"),
    (dict(cluster_size=1, threads=32, hidden=8192), "needs 32 trips"),
])
def test_geometry_errors_name_the_argument(kw, match):
    args = dict(hidden=5120, tp=8, cluster_size=5, threads=128, rank_lanes=1) | kw
    with pytest.raises(ValueError, match=match):
        check_geometry(**args)


def test_default_tuning_rejects_bad_hidden():
    with pytest.raises(ValueError, match="hidden_size"):
        default_tuning(0, 1)


def test_sweep_caps_virtual_rank_graphs_not_tp1_ones():
    """benchmarks.all_reduce_mhc: at tp > 1 (virtual ranks) a graph holds at
    most VIRTUAL_MAX_CALLS calls (replay cost grows with a fork/join graph's
    size); tp=1 rotates over the full 120 MB."""
    from benchmarks.all_reduce_mhc import VIRTUAL_MAX_CALLS, _sets
    tp1, set_bytes = _sets(120, 1, 4, 5120)
    assert tp1 * set_bytes >= 120 * 2**20 and tp1 > VIRTUAL_MAX_CALLS
    assert _sets(120, 1, 4, 5120, tp=2)[0] == VIRTUAL_MAX_CALLS
    assert _sets(120, 64, 4, 7168, tp=8)[0] < VIRTUAL_MAX_CALLS  # large M: 120 MB in fewer sets
