"""The mHC consumer and AllReduceMHC's publishes compile for sm_90a and sm_100a
with no GPU, and their PTX passes the checks of ``kernels.lamport.mhc_checks``
(which must catch the mutations below)."""

import dataclasses

import pytest

from cluster import ops
from jobs import compile_check as cc
from kernels import ptx_checks as ptx
from kernels.lamport import compile_variants as cv
from kernels.lamport import mhc_checks as mc
from kernels.lamport.mhc import MHCConfig


def test_compile_check_subset_sm90a(capsys):
    """hidden 5120, tp 1 and 8: table geometry plain + watchdog per tp, rank
    lanes 2/4/8 at tp 8, hc 1 per tp, one CTA with 2 trips (plain +
    watchdog), and the plain / finalize publishes (unicast + multicast) per tp."""
    rc = cc.main(["--no-results", "--arch", "sm_90a", "--ops", "all_reduce_mhc", "--hidden",
                  "5120", "--tp", "1,8"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.count(" ok") == 19, out
    assert "cluster=5x1024,R=8" in out and "cluster=1x128,R=1,trips=2" in out


def test_registered():
    assert "all_reduce_mhc" in ops.compiled()


@pytest.fixture(scope="module", params=["sm_90a", "sm_100a"])
def rows(request, tmp_path_factory):
    """A cluster build with rank lanes (watchdog) and a one-CTA build, per arch."""
    root = str(tmp_path_factory.mktemp("ptx"))
    configs = {
        "lanes_wd": MHCConfig(hidden=7168, tp=8, hc=4, cluster_size=7, threads=256, rank_lanes=2,
                              budget_ns=cv.CHECK_BUDGET_NS),
        "one_cta": MHCConfig(hidden=4096, tp=2, hc=4, cluster_size=1, threads=128, rank_lanes=1),
    }
    out = {}
    for i, (name, config) in enumerate(configs.items()):
        v = ptx.Variant("all_reduce_mhc", "consumer", "MHCKernel",
                        lambda arch, dump, c=config: mc.compile_mhc(
                            dataclasses.replace(c, arch=arch), dump_dir=dump),
                        budget_ns=config.budget_ns, hidden=config.hidden, tp=config.tp,
                        check=lambda lines, v, c=config: mc.check_mhc_consumer(lines, v, config=c))
        out[name] = (cc.run_variant(v, request.param, root, i), config)
    return out


def _check(row, config, lines):
    return mc.check_mhc_consumer(lines, row.variant, config=config)


def test_builds_pass(rows):
    for name, (row, _) in rows.items():
        assert not row.errors, (name, row.errors)


def test_checks_catch_mutations(rows):
    row, config = rows["lanes_wd"]
    lines = row.lines
    wait = next(i for i, ln in enumerate(lines) if "griddepcontrol.wait" in ln)
    launch = next(i for i, ln in enumerate(lines) if "griddepcontrol.launch_dependents" in ln)
    mutations = {
        # a residual load moved after the PDL wait
        "load after wait": lines[:wait + 1] + ["ld.global.v4.u32 {%r1, %r2, %r3, %r4}, [%rd1];"]
        + lines[wait + 1:],
        # a spin with a non-volatile load
        "plain spin": [ln.replace("ld.volatile.global.v4", "ld.global.v4") for ln in lines],
        # launch_dependents before the spins
        "early launch": lines[:wait + 1] + ["griddepcontrol.launch_dependents;"]
        + lines[wait + 1:launch] + lines[launch + 1:],
        # a contracted / unrounded product
        "fma dropped": [ln.replace("fma.rn.f32", "mul.f32", 1) if "fma.rn.f32" in ln else ln
                        for ln in lines],
        # the DSMEM exchange or a cluster barrier removed
        "no dsmem": [ln for ln in lines if "st.shared::cluster" not in ln],
        "no cluster wait": [ln for ln in lines if "barrier.cluster.wait" not in ln],
        # an early return (the watchdog leaving its cluster behind)
        "early ret": lines[:launch] + ["ret;"] + lines[launch:],
        # multicast in a consumer
        "multimem": lines + ["multimem.st.relaxed.sys.global.v4.bf16x2 [x], {a};"],
        # the watchdog timer gone
        "no timer": [ln for ln in lines if "%globaltimer" not in ln],
    }
    for name, mutated in mutations.items():
        assert _check(row, config, mutated), f"mutation {name!r} not caught"
    plain = dataclasses.replace(config, budget_ns=0)
    assert any("globaltimer" in e for e in _check(row, plain, lines))


def test_one_cta_build_has_no_cluster_ops(rows):
    row, config = rows["one_cta"]
    assert not any("barrier.cluster" in ln or "mapa" in ln for ln in row.lines)
    errs = _check(row, config, row.lines + ["barrier.cluster.wait;"])
    assert any("one-CTA build" in e for e in errs)
    # a four-trip build counts every trip's spins and FMAs
    want = mc.expected_counts(config)
    assert want["ld.volatile.global.v4"] == 4 * 2 and want["fma.rn.f32"] == 4 * 8 * 21


def test_expected_counts_follow_the_geometry():
    c = MHCConfig(hidden=5120, tp=8, hc=4, cluster_size=5, threads=512, rank_lanes=4)
    n = mc.expected_counts(c)
    # 640 fragments, 5 x 128 groups: one trip; 2 waves; 2 butterfly steps
    assert n["ld.volatile.global.v4"] == 2 and n["shfl.sync.bfly"] == 8 * 2 + 5
    assert n["add.rn.f32"] == 8 * (2 + 2) + 5 + 16 + 5 + 1
