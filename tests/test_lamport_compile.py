"""Compile the Lamport kernels for sm_90a and sm_100a with no GPU and check
their PTX (a representative subset; `python -m jobs compile-check` runs all)."""

import pytest

from cluster import ops
from jobs import compile_check as cc
from kernels import ptx_checks as ptx
from kernels.lamport import compile_variants as cv


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_compile_check_subset(arch, capsys):
    rc = cc.main(["--no-results", "--arch", arch, "--ops", "all_reduce_norm,embed_norm", "--hidden", "2560,7168",
                  "--tp", "1,8"])
    out = capsys.readouterr().out
    assert rc == 0, out
    # 4 publishes + 2 hidden x 2 tp x 2 watchdog, as many for the embedding,
    # for owner mode 2 publishes (unicast only) + 8 consumers, and the single
    # kernel: 2 hidden x 2 tp x 2 watchdog unicast + 2 tp multicast; the
    # single embedding: 2 hidden x 2 tp watchdog unicast + 2 tp x (plain,
    # multicast) at the first hidden
    assert out.count(" ok") == 52, out
    assert out.count("[owner]") == 10, out
    assert out.count("[single-kernel form]") == 10, out
    assert out.count("[embed,single-kernel form]") == 8, out


def test_unknown_op_is_rejected(capsys):
    assert cc.main(["--no-results", "--ops", "all_reduce_nrom"]) == 2
    assert "unknown op 'all_reduce_nrom'" in capsys.readouterr().err


def test_bad_hidden_is_rejected(capsys):
    assert cc.main(["--no-results", "--hidden", "2056", "--arch", "sm_90a"]) == 2


@pytest.fixture(scope="module")
def ptx_rows(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ptx"))
    variants = ops.get("all_reduce_norm").variants([2560], [2])
    # one-shot variants only: the owner ones share (kernel, transport, watchdog)
    return {(v.kernel, v.transport, v.budget_ns): cc.run_variant(v, "sm_90a", root, i)
            for i, v in enumerate(variants) if v.mode != "owner"}


def test_checks_catch_mutations(ptx_rows):
    uni = ptx_rows[("publish", "unicast", 0)]
    mc = ptx_rows[("publish", "multicast", 0)]
    norm = ptx_rows[("consumer", "-", 0)]
    assert not (uni.errors or mc.errors or norm.errors)
    # launch_dependents before wait
    swapped = [ln.replace("griddepcontrol.wait", "X").replace(
        "griddepcontrol.launch_dependents", "griddepcontrol.wait").replace(
        "X", "griddepcontrol.launch_dependents") for ln in uni.lines]
    assert ptx.check_publish(swapped, uni.variant)
    # a multimem.st sneaking into a unicast build or a consumer
    assert ptx.check_publish(uni.lines + ["multimem.st.relaxed.sys.global.v4.bf16x2 [x], {a};"],
                             uni.variant)
    assert ptx.check_consumer(norm.lines + ["multimem.st.x"], norm.variant)
    # a consumer spinning with non-volatile loads
    plain = [ln.replace("ld.volatile.global.v4", "ld.global.v4") for ln in norm.lines]
    assert any("volatile" in e for e in ptx.check_consumer(plain, norm.variant))
    # publish twins differing beyond their stores
    mutated = cc.Row(mc.variant, mc.arch, lines=mc.lines + ["membar.sys;"])
    rows = [cc.Row(uni.variant, uni.arch, lines=uni.lines), mutated]
    cc.check_pairs(rows)
    assert mutated.errors and "differ beyond their stores" in mutated.errors[0]


def test_single_kernel_checks_catch_mutations(ptx_rows):
    single = ptx_rows[("single", "unicast", 0)]
    assert not single.errors, single.errors
    check = single.variant.check
    # the stage advanced before the arrival, or without one
    no_arrival = [ln for ln in single.lines if "atom.acq_rel.gpu" not in ln]
    assert any("order" in e for e in check(no_arrival, single.variant))
    # a consumer spinning with non-volatile loads
    plain = [ln.replace("ld.volatile.global.v4", "ld.global.v4") for ln in single.lines]
    assert check(plain, single.variant)
    # one peer store lost, or a multimem.st in a unicast build
    lost = [ln for ln in single.lines if not ln.startswith("st.relaxed.sys.global.v4")]
    assert any("stores" in e for e in check(lost, single.variant))
    assert check(single.lines + ["multimem.st.relaxed.sys.global.v4.bf16x2 [x], {a};"],
                 single.variant)
    wd = ptx_rows[("single", "unicast", cv.CHECK_BUDGET_NS)]
    assert not wd.errors and any("%globaltimer" in ln for ln in wd.lines)


def test_watchdog_variant_reads_globaltimer(ptx_rows):
    wd = ptx_rows[("consumer", "-", cv.CHECK_BUDGET_NS)]
    assert not wd.errors and any("%globaltimer" in ln for ln in wd.lines)
    assert any("atom.global.add" in ln for ln in wd.lines)


@pytest.mark.slow
def test_full_compile_check_sm90a(capsys):
    """Every op and hidden size `python -m jobs compile-check` compiles by
    default, at tp=2, for sm_90a (the H200s'): about 80 CPU-s on a 2-core
    machine with a cold cache. tp=2 is the smoke suite's: the nightly runs
    of this session's other tests (the README's) compile its 68 variants
    into the session's compile cache, and this test takes those from it
    (about 35 CPU-s fewer); tp 1 and 8, and sm_100a, are compiled by each
    op's subset tests; every tp and arch by the job itself (the nightly's
    first step)."""
    rc = cc.main(["--no-results", "--tp", "2", "--arch", "sm_90a"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "0 failed" in out
