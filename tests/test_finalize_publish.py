"""The MoE finalize publish without a GPU: compiles for sm_90a and sm_100a,
PTX checks (and that they catch mutations), option and input validation."""

import dataclasses

import pytest
import torch

from cluster import ops
from jobs import compile_check as cc
from kernels.lamport import compile_variants as cv
from kernels.lamport.all_reduce_norm import validate_inputs, validate_moe
from kernels.lamport.finalize_publish import FinalizeTuning, check_finalize_options
from kernels.moe import MoEOutput, RoutedExperts

H, CAP, K = 2560, 16, 6


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_compile_check_finalize(arch, capsys):
    rc = cc.main(["--no-results", "--arch", arch, "--ops", "finalize_publish", "--tp", "2",
                  "--hidden", str(H)])
    out = capsys.readouterr().out
    assert rc == 0, out
    # every option combination, unicast and multicast twins, and owner mode; the
    # single-kernel form: its default (watchdog), every option set, multicast
    assert out.count(" ok ") == (2 * len(cv.FINALIZE_CHECK_CONFIGS)
                                 + len(cv.FINALIZE_OWNER_CHECK_CONFIGS)
                                 + 2 + len(cv.FINALIZE_CHECK_CONFIGS)), out
    assert out.count("single,E=8") == 2 + len(cv.FINALIZE_CHECK_CONFIGS), out


def test_single_finalize_checks_catch_mutations(tmp_path):
    """The single-kernel finalize's PTX check (kernels.ptx_checks
    .check_single_finalize_norm) on a real build, then on broken copies."""
    (v,) = [v for v in ops.get("finalize_publish").variants([H], [2])
            if v.kernel == "single" and v.transport == "unicast" and v.budget_ns]
    row = cc.run_variant(v, "sm_90a", str(tmp_path), 0)
    lines = row.lines
    assert not row.errors and not _check(row, lines), row.errors

    def first(pattern, start=0):
        return next(i for i in range(start, len(lines)) if lines[i].startswith(pattern))
    wait = first("griddepcontrol.wait")
    fma = first("fma.rn.f32")
    assert any("fma.rn.f32" in e for e in _check(row, lines[:fma] + lines[fma + 1:]))
    index = first("ld.global.s32")
    late = lines[:index] + lines[index + 1:wait + 1] + [lines[index]] + lines[wait + 1:]
    assert "routing metadata not loaded before griddepcontrol.wait" in _check(row, late)
    residual = first("ld.global.v4")
    assert any("16-byte loads before griddepcontrol.wait" in e
               for e in _check(row, lines[:residual] + lines[residual + 1:]))
    arrive = first("barrier.cluster.arrive")
    assert any("cluster barrier out of place" in e
               for e in _check(row, lines[:arrive] + lines[arrive + 1:]))


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ptx"))
    variants = ops.get("finalize_publish").variants([], [4])
    out = {}
    for i, v in enumerate(variants):
        key = (v.detail, v.transport)
        out[key] = cc.run_variant(v, "sm_90a", root, i)
    return out


def _row(rows, e, transport="unicast"):
    return next(r for (d, t), r in rows.items() if d.startswith(f"E={e},") and t == transport
                and "sh=before" not in d and "k=1," not in d)


def _check(row, lines):
    return row.variant.check(lines, row.variant)


def test_every_variant_passes(rows):
    assert all(not r.errors for r in rows.values()), {k: r.errors for k, r in rows.items()
                                                      if r.errors}


@pytest.mark.parametrize("e", [4, 8])
def test_finalize_checks_catch_mutations(rows, e):
    row = _row(rows, e)
    lines = row.lines
    assert not _check(row, lines)
    # launch_dependents before the wait
    swapped = [ln.replace("griddepcontrol.wait", "X").replace(
        "griddepcontrol.launch_dependents", "griddepcontrol.wait").replace(
        "X", "griddepcontrol.launch_dependents") for ln in lines]
    assert _check(row, swapped)
    # an FMA split into a multiply and an add (not the fma=True reference)
    i = next(i for i, ln in enumerate(lines) if ln.startswith("fma.rn.f32"))
    split = lines[:i] + ["mul.rn.f32 %r1, %r2, %r3;", "add.rn.f32 %r1, %r1, %r4;"] + lines[i + 1:]
    assert any("fma.rn.f32" in err for err in _check(row, split))
    # a routed row loaded after the first FMA (no prefetch)
    vec = "v4" if e == 8 else "v2"
    loads = [i for i, ln in enumerate(lines) if ln.startswith(f"ld.global.{vec}")]
    first_fma = next(i for i, ln in enumerate(lines) if ln.startswith("fma.rn.f32"))
    late = (lines[:loads[-1]] + lines[loads[-1] + 1:first_fma + 1] + [lines[loads[-1]]]
            + lines[first_fma + 1:])
    assert any("prefetch" in err for err in _check(row, late))
    # a store of the wrong width, a multicast store in a unicast build
    wide = "st.relaxed.sys.global.v4.b32 [%rd1], {%r1, %r2, %r3, %r4};"
    narrow = "st.relaxed.sys.global.v2.b32 [%rd1], {%r1, %r2};"
    assert _check(row, lines + [narrow if e == 8 else wide])
    assert _check(row, lines + [f"multimem.st.relaxed.sys.global.{vec}.bf16x2 [%rd1], {{%r1}};"])
    # the routing metadata loaded after the wait
    meta = next(i for i, ln in enumerate(lines) if ln.startswith("ld.global.s32"))
    wait = lines.index("griddepcontrol.wait;")
    moved = lines[:meta] + lines[meta + 1:wait + 1] + [lines[meta]] + lines[wait + 1:]
    assert any("metadata" in err for err in _check(row, moved))


def test_shared_before_and_after_the_wait(rows):
    before = next(r for (d, t), r in rows.items() if "sh=before" in d and t == "unicast")
    after = _row(rows, 4)
    assert not _check(before, before.lines) and not _check(after, after.lines)
    # Each check rejects the other's placement of the shared-expert load.
    assert _check(before, after.lines) and _check(after, before.lines)


def test_pair_check_catches_an_extra_fence(rows):
    uni, mc = _row(rows, 8, "unicast"), _row(rows, 8, "multicast")
    mutated = cc.Row(mc.variant, mc.arch, lines=mc.lines + ["membar.sys;"])
    cc.check_pairs([cc.Row(uni.variant, uni.arch, lines=uni.lines), mutated])
    assert mutated.errors and "differ beyond their stores" in mutated.errors[0]


# ---------------------------------------------------------------- options
@pytest.mark.parametrize("kwargs, match", [
    (dict(tp=3), "tp must be one of"),
    (dict(top_k=0), r"top_k must be in \[1, 128\], got 0"),
    (dict(elements_per_thread=16), "elements_per_thread must be 4 or 8, got 16"),
    (dict(prefetch_group=7), r"prefetch_group must be in \[1, top_k=6\], got 7"),
    (dict(shared="early"), "shared must be one of .*'early'"),
    (dict(transport="nvls"), "transport must be one of"),
    (dict(routed_scaling_factor=float("inf")), "routed_scaling_factor must be finite"),
])
def test_bad_finalize_options(kwargs, match):
    base = dict(tp=2, top_k=6, elements_per_thread=4, routed_scaling_factor=1.0,
                shared="after", prefetch_group=6, transport="unicast")
    base.update(kwargs)
    with pytest.raises(ValueError, match=match):
        check_finalize_options(**base)


def test_tuning_validation():
    FinalizeTuning().validate(8)
    with pytest.raises(ValueError, match="elements_per_thread must be 4 or 8, got 2"):
        FinalizeTuning(elements_per_thread=2).validate(8)
    with pytest.raises(ValueError, match=r"prefetch_group must be in \[1, top_k=8\]"):
        FinalizeTuning(prefetch_group=9).validate(8)


# ---------------------------------------------------------------- inputs
def moe(m=4, rows=10, *, k=K, wdtype=torch.float32, shared=True, **replace):
    r = RoutedExperts(torch.zeros(rows, H, dtype=torch.bfloat16),
                      torch.zeros(m, k, dtype=wdtype),
                      torch.zeros(m, k, dtype=torch.int32))
    r = dataclasses.replace(r, **{n: v for n, v in replace.items() if n != "shared_output"})
    s = replace.get("shared_output", torch.zeros(m, H, dtype=torch.bfloat16) if shared else None)
    return MoEOutput(r, s)


def call(x, m=4, top_k=K, fragment_bytes=8):
    bf = torch.zeros(m, H, dtype=torch.bfloat16)
    return validate_inputs(x, bf, torch.zeros(H, dtype=torch.bfloat16), hidden=H, capacity=CAP,
                           device="cpu", top_k=top_k, fragment_bytes=fragment_bytes)


@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
def test_valid_moe(wdtype):
    assert call(moe(wdtype=wdtype)) == 4
    assert call(moe(shared=False, rows=0)) == 4
    assert moe().top_k == K and moe().tokens == 4


@pytest.mark.parametrize("x, kw, match", [
    (moe(), dict(top_k=None), "constructed with top_k"),
    (moe(k=8), {}, r"expert_weights must have shape \[\*, top_k=6\].*\[4, 8\]"),
    (moe(wdtype=torch.float16), {}, "expert_weights must be torch.float32 or torch.bfloat16"),
    (moe(expanded_idx_to_permuted_idx=torch.zeros(4, K, dtype=torch.int64)), {},
     "expanded_idx_to_permuted_idx must be torch.int32"),
    (moe(expanded_idx_to_permuted_idx=torch.zeros(4, K + 1, dtype=torch.int32)), {},
     r"expanded_idx_to_permuted_idx must have shape \[4, 6\]"),
    (moe(gemm2_permuted=torch.zeros(10, H + 8, dtype=torch.bfloat16)), {},
     r"gemm2_permuted must have shape \[\*, 2560\]"),
    (moe(gemm2_permuted=torch.zeros(10, H)), {}, "gemm2_permuted must be torch.bfloat16"),
    (moe(gemm2_permuted=torch.zeros(10 * H + 4, dtype=torch.bfloat16)[4:].view(10, H)),
     dict(fragment_bytes=16), "gemm2_permuted must be 16-byte aligned"),
    (moe(shared_output=torch.zeros(3, H, dtype=torch.bfloat16)), {},
     r"shared_output must have shape \[4, 2560\]"),
    (moe(m=17, expanded_idx_to_permuted_idx=torch.zeros(17, K, dtype=torch.int32),
         shared_output=torch.zeros(17, H, dtype=torch.bfloat16)), dict(m=17),
     r"tokens\) must be in \[1, 16\], got 17"),
    (moe(expert_weights=torch.zeros(K, 4).t()), {}, "expert_weights must be contiguous"),
    (MoEOutput(torch.zeros(4, H, dtype=torch.bfloat16)), {}, "routed must be a RoutedExperts"),
])
def test_bad_moe_names_the_argument(x, kw, match):
    with pytest.raises(ValueError, match=match):
        call(x, **kw)


def test_moe_residual_is_still_checked():
    with pytest.raises(ValueError, match=r"residual must have shape \[4, 2560\]"):
        validate_inputs(moe(), torch.zeros(3, H, dtype=torch.bfloat16),
                        torch.zeros(H, dtype=torch.bfloat16), hidden=H, capacity=CAP,
                        top_k=K)


def test_not_a_moe_output():
    with pytest.raises(ValueError, match="x must be a torch.Tensor or a MoEOutput"):
        validate_moe([1, 2], hidden=H, capacity=CAP, top_k=K)


def test_partial_round_trip():
    x = moe()
    assert MoEOutput.from_partial(x.to_partial()) == x
