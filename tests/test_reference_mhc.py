"""AllReduceMHC reference: golden vectors, scalar oracle, exact identities,
mutations that must fail the contract check, validation."""

from fractions import Fraction

import pytest
import torch

from kernels.reference import mhc
from kernels.reference import numerics as nm
from kernels.reference.allreduce import add_residual, all_reduce_norm, all_reduce_sum, rms_norm
from kernels.reference.golden import UPDATE_ENV, check_golden
from kernels.reference.mhc import all_reduce_mhc, butterfly_rank_sum, finalize, mhc_post_collapse
from kernels.reference.moe import MoEPartial
from tests.oracle import bf16, exact, f32, madd, to_tensor

A = 1 + 2.0**-7  # A * B rounds to -P; fma(A, B, P) = 2^-30, round(A*B) + P = 0
B = 1 + 2.0**-23
P = -(1 + 2.0**-7 + 2.0**-23)
EPS = 1e-6
TP, M, H, HC, TOP_K = 3, 4, 16, 4, 3


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _bf16(*shape, seed):
    return torch.randn(*shape, generator=_gen(seed)).to(torch.bfloat16)


def _norm_weight(h, seed=0):
    return (torch.randn(h, generator=_gen(seed)) * 0.1 + 1).to(torch.bfloat16)


def _random_mix(m, hc, seed):
    g = _gen(seed)
    post = torch.rand(m, hc, generator=g) * 2
    comb = torch.rand(m, hc, hc, generator=g)
    pre = torch.rand(m, hc, generator=g)
    return post, comb, pre


def _crafted_case():
    """tp=3, M=4, H=16, hc=4. Token 0: random everything. Token 1 (FMA chain):
    reduced 1, post 0, streams 1 and A with comb rows P and B (others 0):
    every stream is fma(A, B, P) = 2^-30 with FMA, 0 without. Token 2: the
    order-sensitive 2^24, +1, -2^24 across ranks, post 1, identity comb.
    Token 3 (which product the first FMA folds): reduced A, post B, stream 0
    = 1 with comb row P: fma(A, B, P) = 2^-30 when reduced * post is folded,
    round(A * B) + P = 0 when it is rounded alone."""
    partials = _bf16(TP, M, H, seed=1)
    residual = _bf16(M, HC, H, seed=2)
    post, comb, pre = _random_mix(M, HC, seed=3)
    partials[:, 1:] = 0
    partials[0, 1] = 1
    post[1] = 0
    comb[1] = 0
    comb[1, 0], comb[1, 1] = P, B
    residual[1, 0], residual[1, 1] = 1, A
    pre[1] = 1
    partials[:, 2] = nm.order_sensitive_partials(TP, 1, H)[:, 0]
    post[2] = 1
    comb[2] = torch.eye(HC)
    partials[0, 3] = A
    post[3] = B
    comb[3] = 0
    comb[3, 0] = P
    residual[3, 0] = 1
    pre[3] = 1
    return dict(partials=partials, residual=residual, post=post, comb=comb, pre=pre,
                norm_weight=_norm_weight(H))


def _call(case, **kw):
    return all_reduce_mhc(case["partials"], case["residual"], case["post"], case["comb"], case["pre"],
                          case["norm_weight"], EPS, **kw)


def _random_moe_partials(tp, m, h, top_k, rows, seed):
    out = []
    for r in range(tp):
        g = _gen(seed + r)
        idx = torch.randint(0, rows, (m, top_k), generator=g, dtype=torch.int32)
        idx = torch.where(torch.rand(m, top_k, generator=g) < 0.6, idx, torch.full_like(idx, -1))
        out.append(MoEPartial(torch.randn(rows, h, generator=g).to(torch.bfloat16),
                              torch.rand(m, top_k, generator=g), idx,
                              torch.randn(m, h, generator=g).to(torch.bfloat16)))
    return out


# --- golden vectors ------------------------------------------------------------

GOLDEN_PARAMS = {"tp": TP, "M": M, "hidden": H, "hc": HC, "eps": EPS, "order": None, "rank_lanes": 1,
                 "fma": True, "post_fma": True}


def _check_crafted_golden(residual_out, layer_input):
    case = _crafted_case()
    check_golden("mhc_all_reduce_tp3", case,
                 {"residual_out": residual_out, "layer_input": layer_input}, GOLDEN_PARAMS)


def test_golden_all_reduce_mhc_tp3():
    _check_crafted_golden(*_call(_crafted_case()))


def test_golden_finalize_tp2():
    partials = _random_moe_partials(2, M, 64, TOP_K, 5, seed=10)
    residual = _bf16(M, HC, 64, seed=11)
    post, comb, pre = _random_mix(M, HC, seed=12)
    post = post.unsqueeze(-1)  # the [M, hc, 1] form
    w = _norm_weight(64)
    residual_out, layer_input = finalize(partials, residual, post, comb, pre, w, EPS)
    inputs = {"residual": residual, "post": post, "comb": comb, "pre": pre, "norm_weight": w}
    for r, p in enumerate(partials):
        inputs.update({f"gemm2_permuted.{r}": p.gemm2_permuted, f"expert_weights.{r}": p.expert_weights,
                       f"expanded_idx_to_permuted_idx.{r}": p.expanded_idx_to_permuted_idx,
                       f"shared_output.{r}": p.shared_output})
    check_golden("mhc_finalize_tp2", inputs, {"residual_out": residual_out, "layer_input": layer_input},
                 {"tp": 2, "M": M, "hidden": 64, "hc": HC, "top_k": TOP_K, "eps": EPS, "fma": True,
                  "post_fma": True})


# --- scalar oracle -----------------------------------------------------------------

def _oracle_post_collapse(reduced, residual, post, comb, pre, fma, post_fma):
    m, hc, h = residual.shape
    r, res = exact(reduced), exact(residual)
    post, cb, pr = exact(post.reshape(m, hc)), exact(comb), exact(pre)
    streams = [[[None] * h for _ in range(hc)] for _ in range(m)]
    prenorm = [[None] * h for _ in range(m)]
    for t in range(m):
        for e in range(h):
            collapse = Fraction(0)
            for tgt in range(hc):
                if fma and post_fma:  # fma(reduced, post, f32(res[0] * comb[0, t]))
                    mixed = f32(r[t][e] * post[t][tgt] + f32(res[t][0][e] * cb[t][0][tgt]))
                else:
                    mixed = madd(res[t][0][e], cb[t][0][tgt], f32(r[t][e] * post[t][tgt]), fma)
                for src in range(1, hc):
                    mixed = madd(res[t][src][e], cb[t][src][tgt], mixed, fma)
                streams[t][tgt][e] = bf16(mixed)
                collapse = madd(streams[t][tgt][e], pr[t][tgt], collapse, fma)
            prenorm[t][e] = bf16(collapse)
    return to_tensor(streams, torch.bfloat16), to_tensor(prenorm, torch.bfloat16)


def _oracle_lanes(partials, rank_lanes):
    vals = exact(partials)
    tp, m, h = partials.shape
    out = [[None] * h for _ in range(m)]
    for t in range(m):
        for e in range(h):
            lanes = []
            for lane in range(rank_lanes):
                acc = Fraction(0)
                for wave in range(tp // rank_lanes):
                    acc = f32(acc + vals[wave * rank_lanes + lane][t][e])
                lanes.append(acc)
            offset = 1
            while offset < rank_lanes:
                lanes = [f32(lanes[i] + lanes[i ^ offset]) for i in range(rank_lanes)]
                offset *= 2
            out[t][e] = bf16(lanes[0])
    return to_tensor(out, torch.bfloat16)


def _same_values(a, b):
    return torch.equal(a.float(), b.float())


@pytest.mark.parametrize("fma, post_fma", [(True, True), (True, False), (False, True)])
def test_post_collapse_equals_scalar_oracle(fma, post_fma):
    case = _crafted_case()
    reduced = all_reduce_sum(case["partials"])
    args = (reduced, case["residual"], case["post"], case["comb"], case["pre"])
    got = mhc_post_collapse(*args, fma=fma, post_fma=post_fma)
    want = _oracle_post_collapse(*args, fma, post_fma)
    assert _same_values(got[0], want[0]) and _same_values(got[1], want[1])


@pytest.mark.parametrize("tp, rank_lanes", [(3, 1), (4, 2), (4, 4), (8, 2), (8, 8)])
def test_rank_lanes_equal_scalar_oracle(tp, rank_lanes):
    partials = nm.random_partials(tp, 2, 8, seed=tp, scale=100.0)
    partials[:, 0] = torch.tensor([2.0**24, 1.0, -(2.0**24), 1.0] * 2)[:tp, None].to(torch.bfloat16)
    assert _same_values(butterfly_rank_sum(partials, rank_lanes), _oracle_lanes(partials, rank_lanes))


def test_norm_within_one_ulp_of_fp64():
    case = _crafted_case()
    _, layer_input = _call(case)
    reduced = all_reduce_sum(case["partials"])
    _, prenorm = mhc_post_collapse(reduced, case["residual"], case["post"], case["comb"], case["pre"])
    x = prenorm.double()
    want = x / torch.sqrt(x.square().mean(-1, keepdim=True) + EPS) * case["norm_weight"].double()
    nm.assert_within_ulp(layer_input, want, 1, "layer_input vs fp64")


# --- arithmetic pinned by hand -------------------------------------------------------

def test_fma_tokens_by_hand():
    case = _crafted_case()
    default, post_mul, no_fma = _call(case)[0], _call(case, post_fma=False)[0], _call(case, fma=False)[0]
    for streams in (default[1], post_mul[1]):  # FMA chain: either contraction
        assert (streams.float() == 2.0**-30).all()
    assert (no_fma[1].float() == 0).all()
    assert (default[3].float() == 2.0**-30).all()  # reduced * post folded
    assert (post_mul[3].float() == 0).all() and (no_fma[3].float() == 0).all()


def test_rank_lane_orders_by_hand():
    # [2^24, 1, -2^24, 1]: in rank order 1; lanes of 2: (2^24 - 2^24) + (1 + 1) = 2.
    # [2^24, 1, 1, -2^24]: in rank order 0; lanes of 2 or 4: 2^24 + (1 - 2^24) = 1.
    for values, by_lanes in (([2.0**24, 1, -(2.0**24), 1], {1: 1, 2: 2, 4: 1}),
                             ([2.0**24, 1, 1, -(2.0**24)], {1: 0, 2: 1, 4: 1})):
        parts = torch.tensor(values)[:, None, None].expand(4, 1, 8).to(torch.bfloat16)
        for lanes, want in by_lanes.items():
            assert (mhc.reduce_ranks(parts, rank_lanes=lanes).float() == want).all(), (values, lanes)


def test_comb_is_indexed_source_target():
    # comb[s, t] = 1 for t = s + 1 (mod hc): target t takes source t - 1.
    m, hc, h = 2, 4, 8
    residual = _bf16(m, hc, h, seed=4)
    comb = torch.zeros(m, hc, hc)
    for s in range(hc):
        comb[:, s, (s + 1) % hc] = 1
    zero = torch.zeros(m, h, dtype=torch.bfloat16)
    out, _ = mhc_post_collapse(zero, residual, torch.ones(m, hc), comb, torch.ones(m, hc))
    nm.assert_bit_exact(out, residual.roll(1, dims=1), "residual_out")


# --- exact identities ------------------------------------------------------------------

@pytest.mark.parametrize("fma", [True, False])
@pytest.mark.parametrize("order", [None, [2, 0, 1]])
def test_hc1_unit_mix_is_residual_add_and_norm(fma, order):
    # hc=1, post=1, comb=1, pre=1: reduced * 1 is exact, fma(res, 1, reduced)
    # rounds reduced + res once (= add_residual), fma(out, 1, +0) = out.
    parts = nm.random_partials(TP, 5, 64, seed=5)
    residual = _bf16(5, 1, 64, seed=6)
    w = _norm_weight(64)
    one = torch.ones(5, 1)
    res_out, layer_input = all_reduce_mhc(parts, residual, one, one[:, :, None], one, w, EPS,
                                          order=order, fma=fma)
    norm_out, residual_out = all_reduce_norm(parts, residual[:, 0], w, EPS, order=order)
    nm.assert_bit_exact(res_out[:, 0], residual_out, "residual_out")
    nm.assert_bit_exact(layer_input, norm_out, "layer_input")


@pytest.mark.parametrize("fma", [True, False])
def test_identity_comb_one_hot_pre_is_per_stream_residual_add(fma):
    # post=1, comb=I: stream t = BF16(reduced + res[t]) (the 0 * res[s] terms
    # add exact zeros); pre = e_j collapses to stream j exactly.
    parts = nm.random_partials(TP, 3, 32, seed=7)
    residual = _bf16(3, HC, 32, seed=8)
    w = _norm_weight(32)
    j = 2
    pre = torch.zeros(3, HC)
    pre[:, j] = 1
    res_out, layer_input = all_reduce_mhc(parts, residual, torch.ones(3, HC),
                                          torch.eye(HC).expand(3, HC, HC), pre, w, EPS, fma=fma)
    reduced = all_reduce_sum(parts)
    for t in range(HC):
        nm.assert_bit_exact(res_out[:, t], add_residual(reduced, residual[:, t]), f"stream {t}")
    nm.assert_bit_exact(layer_input, all_reduce_norm(parts, residual[:, j], w, EPS)[0], "layer_input")


def test_finalize_without_routes_is_all_reduce_mhc_of_shared():
    partials = _random_moe_partials(TP, M, H, TOP_K, 4, seed=20)
    partials = [MoEPartial(p.gemm2_permuted, p.expert_weights,
                           torch.full_like(p.expanded_idx_to_permuted_idx, -1), p.shared_output)
                for p in partials]
    residual = _bf16(M, HC, H, seed=21)
    post, comb, pre = _random_mix(M, HC, seed=22)
    w = _norm_weight(H)
    got = finalize(partials, residual, post, comb, pre, w, EPS)
    want = all_reduce_mhc([p.shared_output for p in partials], residual, post, comb, pre, w, EPS)
    nm.assert_bit_exact(got[0], want[0], "residual_out")
    nm.assert_bit_exact(got[1], want[1], "layer_input")


def test_post_with_trailing_one_is_the_same():
    case = _crafted_case()
    a = _call(case)
    case["post"] = case["post"].unsqueeze(-1)
    b = _call(case)
    nm.assert_bit_exact(a[0], b[0], "residual_out")


# --- mutations make the contract check fail -------------------------------------------

@pytest.mark.parametrize("mutation", ["rank order reversed", "fma off", "other contraction",
                                      "comb transposed"])
def test_mutation_fails_contract_and_golden(mutation, monkeypatch):
    monkeypatch.delenv(UPDATE_ENV, raising=False)
    case = _crafted_case()
    good = _call(case)
    if mutation == "rank order reversed":
        bad = _call(case, order=[2, 1, 0])
    elif mutation == "fma off":
        bad = _call(case, fma=False)
    elif mutation == "other contraction":
        bad = _call(case, post_fma=False)
    else:
        bad = _call({**case, "comb": case["comb"].transpose(1, 2)})
    with pytest.raises(AssertionError, match="not bit-exact"):
        nm.assert_bit_exact(bad[0], good[0], "residual_out")
    with pytest.raises(AssertionError, match="exceeds 1 BF16 ULP"):
        nm.assert_within_ulp(bad[1], good[1], 1, "layer_input")
    with pytest.raises(AssertionError, match="output residual_out"):
        _check_crafted_golden(*bad)


def test_mutation_butterfly_vs_rank_order_fails_contract():
    parts = torch.tensor([2.0**24, 1, -(2.0**24), 1])[:, None, None].expand(4, 1, 8).to(torch.bfloat16)
    residual = torch.zeros(1, 1, 8, dtype=torch.bfloat16)
    one = torch.ones(1, 1)
    args = (parts, residual, one, one[:, :, None], one, torch.ones(8, dtype=torch.bfloat16), EPS)
    with pytest.raises(AssertionError, match="not bit-exact"):
        nm.assert_bit_exact(all_reduce_mhc(*args, rank_lanes=2)[0], all_reduce_mhc(*args)[0], "residual_out")


# --- validation --------------------------------------------------------------------------

@pytest.mark.parametrize("change, match", [
    (lambda c: {"partials": c["partials"][:, :, :12], "residual": c["residual"][..., :12],
                "norm_weight": c["norm_weight"][:12]}, "hidden size must be a positive multiple of 8"),
    (lambda c: {"partials": c["partials"].float()}, "partials must be torch.bfloat16"),
    (lambda c: {"residual": c["residual"].float()}, "residual must be torch.bfloat16"),
    (lambda c: {"residual": c["residual"][:2]}, "residual must have shape"),
    (lambda c: {"residual": c["residual"][:, :, :8]}, "residual must have shape"),
    (lambda c: {"post": c["post"][:, :3]}, "post must have shape"),
    (lambda c: {"post": c["post"].bfloat16()}, "post must be torch.float32"),
    (lambda c: {"comb": c["comb"][:, :, :3]}, "comb must have shape"),
    (lambda c: {"comb": c["comb"].double()}, "comb must be torch.float32"),
    (lambda c: {"pre": c["pre"][:, :, None]}, "pre must have shape"),
    (lambda c: {"norm_weight": c["norm_weight"][:8]}, "norm_weight must have shape"),
    (lambda c: {"norm_weight": c["norm_weight"].float()}, "norm_weight must be torch.bfloat16"),
])
def test_bad_input_names_the_argument(change, match, monkeypatch):
    monkeypatch.setattr(mhc, "reduce_ranks", lambda *a, **k: pytest.fail("computed before validating"))
    case = {**_crafted_case()}
    case.update(change(case))
    with pytest.raises(ValueError, match=match):
        _call(case)


@pytest.mark.parametrize("kw, match", [
    ({"hc": 2}, "residual has hc=4 streams, expected hc=2"),
    ({"rank_lanes": 3}, "rank_lanes must be one of"),
    ({"rank_lanes": 2}, "rank_lanes=2 must divide tp=3"),
    ({"order": [0, 1, 1]}, "order must be a permutation"),
])
def test_bad_options_named(kw, match, monkeypatch):
    monkeypatch.setattr(mhc, "reduce_ranks", lambda *a, **k: pytest.fail("computed before validating"))
    with pytest.raises(ValueError, match=match):
        _call(_crafted_case(), **kw)


def test_bad_eps_named():
    with pytest.raises(ValueError, match="norm_eps must be > 0"):
        all_reduce_mhc(*(_crafted_case()[k] for k in ("partials", "residual", "post", "comb", "pre",
                                                       "norm_weight")), 0.0)


def _finalize_args():
    case = _crafted_case()
    partials = _random_moe_partials(TP, M, H, TOP_K, 4, seed=30)
    return partials, [case[k] for k in ("residual", "post", "comb", "pre", "norm_weight")]


@pytest.mark.parametrize("mutate, kw, match", [
    (lambda p: [MoEPartial(p[0].gemm2_permuted, p[0].expert_weights.bfloat16(),
                           p[0].expanded_idx_to_permuted_idx, p[0].shared_output)] + p[1:], {},
     r"partials\[0\]\.expert_weights must be torch.float32"),
    (lambda p: p, {"top_k": 2}, r"partials\[0\]\.expert_weights has top_k=3, expected top_k=2"),
    (lambda p: p[:1] + [MoEPartial(p[1].gemm2_permuted, p[1].expert_weights,
                                   p[1].expanded_idx_to_permuted_idx.long(), p[1].shared_output)] + p[2:], {},
     r"partials\[1\]\.expanded_idx_to_permuted_idx must be torch.int32"),
    (lambda p: p[:2] + [MoEPartial(p[2].gemm2_permuted, p[2].expert_weights,
                                   p[2].expanded_idx_to_permuted_idx, None)], {},
     r"partials\[2\]\.shared_output is required"),
    (lambda p: [MoEPartial(p[0].gemm2_permuted[:, :12], p[0].expert_weights,
                           p[0].expanded_idx_to_permuted_idx, p[0].shared_output[:, :12])] + p[1:], {},
     r"partials\[0\]\.gemm2_permuted hidden must be a positive multiple of 8"),
    (lambda p: p, {"hc": 3}, "residual has hc=4 streams, expected hc=3"),
])
def test_finalize_bad_input_named(mutate, kw, match, monkeypatch):
    monkeypatch.setattr(mhc, "finalize_payloads", lambda *a, **k: pytest.fail("computed before validating"))
    partials, rest = _finalize_args()
    with pytest.raises(ValueError, match=match):
        finalize(mutate(partials), *rest, EPS, **kw)


# --- the contraction the reference assumes is the compiler's (CPU: PTX only) ------------

def _compile_post_mix_ptx(dump_dir) -> str:
    """PTX of the seed's post-mix expression for one target (hc=2), compiled
    by CuTe DSL for sm_90a; no GPU needed."""
    cute = pytest.importorskip("cutlass.cute")
    import cutlass
    from cutlass import BFloat16, Float32
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    class PostMixProbe:
        @cute.jit
        def __call__(self, vals: cute.Tensor, post: cute.Tensor, comb: cute.Tensor, out: cute.Tensor,
                     stream):
            self.kernel(vals, post, comb, out).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream)

        @cute.kernel
        def kernel(self, vals: cute.Tensor, post: cute.Tensor, comb: cute.Tensor, out: cute.Tensor):
            mixed = vals[(0, None)].load().to(Float32) * post[0]  # as the seed writes it
            for source in cutlass.range_constexpr(2):
                mixed = mixed + vals[(1 + source, None)].load().to(Float32) * comb[source * 2]
            out[(0, None)].store(mixed.to(BFloat16))

    args = (make_fake_compact_tensor(BFloat16, (3, 8), assumed_align=16),
            make_fake_compact_tensor(Float32, (2,), assumed_align=4),
            make_fake_compact_tensor(Float32, (4,), assumed_align=4),
            make_fake_compact_tensor(BFloat16, (1, 8), assumed_align=16))
    cute.compile(PostMixProbe(), *args, make_fake_stream(),
                 options=f"--gpu-arch sm_90a --keep-ptx --dump-dir {dump_dir}")
    (ptx,) = list(dump_dir.glob("*.ptx"))
    return ptx.read_text()


def test_compiler_folds_reduced_times_post_into_the_first_fma(tmp_path):
    import re

    ptx = _compile_post_mix_ptx(tmp_path)
    param_of = {m[0]: int(m[1]) for m in re.findall(r"ld\.param\.b64\s+(%rd\d+), \[\w+_param_(\d+)\]", ptx)}
    loads = re.findall(r"ld\.global\.\w+\s+(%r\d+), \[(%rd\d+)\]", ptx)
    loaded_from = {reg: param_of.get(base) for reg, base in loads}
    muls = re.findall(r"mul(?:\.rn)?\.f32\s+(%r\d+), (%r\d+), (%r\d+);", ptx)
    fmas = re.findall(r"fma\.rn\.f32\s+(%r\d+), (%r\d+), (%r\d+), (%r\d+);", ptx)
    assert len(muls) == 8 and len(fmas) == 16, (muls, fmas)  # 8 lanes x (1 mul + 2 fma)
    for dst, a, b in muls:  # the lone rounded product is residual[0] * comb[0, t] ...
        assert 2 in (loaded_from.get(a), loaded_from.get(b)), ("mul operands", a, b)
        (user,) = [f for f in fmas if f[3] == dst]
        # ... and the FMA that adds it multiplies reduced by post[t].
        assert 1 in (loaded_from.get(user[1]), loaded_from.get(user[2])), ("fma operands", user)


@pytest.mark.gpu
@pytest.mark.parametrize("fma, post_fma", [(True, True), (True, False), (False, True)])
def test_cuda_matches_cpu_bit_for_bit(fma, post_fma):
    case = _crafted_case()
    want = _call(case, fma=fma, post_fma=post_fma)
    got = _call({k: v.cuda() for k, v in case.items()}, fma=fma, post_fma=post_fma)
    assert got[0].device.type == "cuda"
    nm.assert_bit_exact(got[0].cpu(), want[0], "residual_out")
    nm.assert_within_ulp(got[1].cpu(), want[1], 1, "layer_input")
