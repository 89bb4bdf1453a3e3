"""MoE finalize reference: golden vectors, exact identities, mutations, validation."""

from fractions import Fraction

import pytest
import torch

from kernels.reference import moe
from kernels.reference import numerics as nm
from kernels.reference.allreduce import all_reduce_norm
from kernels.reference.golden import UPDATE_ENV, check_golden
from tests.oracle import bf16, exact, f32, madd, to_tensor
from kernels.reference.moe import (
    MoEPartial,
    all_reduce_norm_finalize,
    finalize_payloads,
    moe_finalize,
)

# FMA-sensitive FP32 values: A * B = 1 + 2^-7 + 2^-23 + 2^-30 exactly, which
# rounds to -P; so fma(A, B, P) = 2^-30 while round(A * B) + P = 0.
A = 1 + 2.0**-7  # exact in BF16
B = 1 + 2.0**-23
P = -(1 + 2.0**-7 + 2.0**-23)
EPS = 1e-6


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _bf16(*shape, seed):
    return torch.randn(*shape, generator=_gen(seed)).to(torch.bfloat16)


def _norm_weight(h, seed=0):
    return (torch.randn(h, generator=_gen(seed)) * 0.1 + 1).to(torch.bfloat16)


def _random_partial(m, h, top_k, rows, *, seed, weight_dtype=torch.float32, held=0.6):
    """One rank's MoEPartial with random rows, weights and routes (some -1)."""
    g = _gen(seed)
    gemm2 = torch.randn(rows, h, generator=g).to(torch.bfloat16)
    weights = torch.rand(m, top_k, generator=g).to(weight_dtype)
    idx = torch.randint(0, rows, (m, top_k), generator=g, dtype=torch.int32)
    idx = torch.where(torch.rand(m, top_k, generator=g) < held, idx, torch.full_like(idx, -1))
    shared = torch.randn(m, h, generator=g).to(torch.bfloat16)
    return MoEPartial(gemm2, weights, idx, shared)


def _finalize(p, **kw):
    return moe_finalize(p.gemm2_permuted, p.expert_weights, p.expanded_idx_to_permuted_idx,
                        p.shared_output, **kw)


def _fma_token_partial(h):
    """One token whose payload is 2^-30 with FMA and 0 without (top_k=3)."""
    gemm2 = torch.stack([torch.ones(h), torch.full((h,), A)]).to(torch.bfloat16)
    weights = torch.tensor([[P, B, 5.0]], dtype=torch.float32)
    idx = torch.tensor([[0, 1, -1]], dtype=torch.int32)
    return MoEPartial(gemm2, weights, idx, torch.zeros(1, h, dtype=torch.bfloat16))


def _crafted_partials(h=16, top_k=3, rows=6):
    """tp=3, M=3: token 0 random on every rank; token 1 FMA-sensitive on rank
    0 (zero elsewhere); token 2 the order-sensitive 2^24, +1, -2^24 as the
    shared outputs of ranks 0..2 (all routes -1)."""
    tp, m = 3, 3
    ordered = nm.order_sensitive_partials(tp, 1, h)
    fma_token = _fma_token_partial(h)
    out = []
    for r in range(tp):
        p = _random_partial(m, h, top_k, rows, seed=10 + r)
        gemm2 = p.gemm2_permuted.clone()
        weights, idx = p.expert_weights.clone(), p.expanded_idx_to_permuted_idx.clone()
        shared = p.shared_output.clone()
        idx[1:] = -1
        shared[1:] = 0
        shared[2] = ordered[r, 0]
        if r == 0:
            gemm2[:2] = fma_token.gemm2_permuted
            weights[1] = fma_token.expert_weights[0]
            idx[1] = fma_token.expanded_idx_to_permuted_idx[0]
        out.append(MoEPartial(gemm2, weights, idx, shared))
    return out


def _golden_inputs(partials, **extra):
    inputs = {}
    for r, p in enumerate(partials):
        inputs[f"gemm2_permuted.{r}"] = p.gemm2_permuted
        inputs[f"expert_weights.{r}"] = p.expert_weights
        inputs[f"expanded_idx_to_permuted_idx.{r}"] = p.expanded_idx_to_permuted_idx
        if p.shared_output is not None:
            inputs[f"shared_output.{r}"] = p.shared_output
    return {**inputs, **extra}


# --- golden vectors ----------------------------------------------------------

def test_golden_single_rank_bf16_weights_scaled():
    p = _random_partial(3, 64, 3, 8, seed=1, weight_dtype=torch.bfloat16)
    payload = _finalize(p, routed_scaling_factor=2.5)
    check_golden(
        "moe_finalize_bf16_scaled",
        _golden_inputs([p]),
        {"payload": payload},
        {"M": 3, "hidden": 64, "top_k": 3, "routed_scaling_factor": 2.5, "fma": True},
    )


def test_golden_all_reduce_norm_finalize_tp3():
    partials = _crafted_partials()
    residual, w = _bf16(3, 16, seed=20), _norm_weight(16)
    norm_out, residual_out = all_reduce_norm_finalize(partials, residual, w, EPS)
    check_golden(
        "moe_all_reduce_norm_finalize_tp3",
        _golden_inputs(partials, residual=residual, norm_weight=w),
        {"payloads": finalize_payloads(partials), "norm_out": norm_out, "residual_out": residual_out},
        {"M": 3, "hidden": 16, "tp": 3, "top_k": 3, "eps": EPS, "order": None, "fma": True},
    )


# --- the scalar oracle (exact rationals, rounded where the kernel rounds) -----

def _oracle_payload(p, *, scale=1.0, fma=True):
    rows, ws = exact(p.gemm2_permuted), exact(p.expert_weights.float())
    idx = p.expanded_idx_to_permuted_idx.tolist()
    shared = exact(p.shared_output) if p.shared_output is not None else None
    s = f32(Fraction(scale))
    out = []
    for t, routes in enumerate(idx):
        token = []
        for h in range(p.gemm2_permuted.shape[1]):
            acc = Fraction(0)
            for k, row in enumerate(routes):
                if row != -1:
                    w = ws[t][k] if scale == 1.0 else f32(ws[t][k] * s)
                    acc = madd(rows[row][h], w, acc, fma)
            if shared is not None:
                acc = f32(acc + shared[t][h])
            token.append(bf16(acc))
        out.append(token)
    return to_tensor(out, torch.bfloat16)


@pytest.mark.parametrize("fma", [True, False])
@pytest.mark.parametrize("scale", [1.0, 2.5])
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
def test_reference_equals_scalar_oracle(fma, scale, weight_dtype):
    cases = [_random_partial(3, 16, 3, 6, seed=40, weight_dtype=weight_dtype),
             _crafted_partials()[0]]
    for p in cases:
        p = MoEPartial(p.gemm2_permuted, p.expert_weights.to(weight_dtype),
                       p.expanded_idx_to_permuted_idx, p.shared_output)
        got = _finalize(p, routed_scaling_factor=scale, fma=fma)
        want = _oracle_payload(p, scale=scale, fma=fma)
        assert torch.equal(got.float(), want.float()), (got, want)


# --- arithmetic pinned by hand ----------------------------------------------

def test_fma_token_by_hand():
    p = _fma_token_partial(8)
    with_fma = _finalize(p, fma=True)
    without = _finalize(p, fma=False)
    assert (with_fma.float() == 2.0**-30).all()
    assert (nm.bits(without) == 0).all()


def test_top_k_order_by_hand():
    # Rows of ones, weights 2^24, 1, -2^24: (2^24 + 1) rounds to 2^24, so the
    # k order 0, 1, 2 gives 0; reversed, (-2^24 + 1) + 2^24 = 1.
    gemm2 = torch.ones(3, 8, dtype=torch.bfloat16)
    w = torch.tensor([[2.0**24, 1.0, -(2.0**24)]])
    idx = torch.tensor([[0, 1, 2]], dtype=torch.int32)
    assert (moe_finalize(gemm2, w, idx).float() == 0).all()
    assert (moe_finalize(gemm2, w.flip(1), idx.flip(1)).float() == 1).all()


def test_scale_multiplies_each_weight_not_the_sum():
    # Weights P and B scaled by 3 round in FP32 to -(3 + 3*2^-7 + 2^-21) and
    # 3 + 2^-21; then fma(A, 3 + 2^-21, .) leaves 2^-28. Scaling the finished
    # sum instead would give 3 * 2^-30.
    p = _fma_token_partial(8)
    out = _finalize(p, routed_scaling_factor=3.0)
    assert (out.float() == 2.0**-28).all()
    assert (_finalize(p).float() * 3 == 3 * 2.0**-30).all()


# --- exact identities ---------------------------------------------------------

@pytest.mark.parametrize("fma", [True, False])
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
def test_all_routes_missing_is_the_shared_expert(fma, weight_dtype):
    p = _random_partial(4, 32, 3, 5, seed=2, weight_dtype=weight_dtype)
    weights = p.expert_weights.clone().fill_(float("nan"))  # never read: weight forced to 0
    idx = torch.full_like(p.expanded_idx_to_permuted_idx, -1)
    out = moe_finalize(p.gemm2_permuted, weights, idx, p.shared_output, fma=fma, routed_scaling_factor=1.5)
    nm.assert_bit_exact(out, p.shared_output, "payload")


def test_rank_without_experts_publishes_the_shared_expert():
    shared = _bf16(2, 8, seed=9)
    out = moe_finalize(torch.zeros(0, 8, dtype=torch.bfloat16), torch.ones(2, 3),
                       torch.full((2, 3), -1, dtype=torch.int32), shared)
    nm.assert_bit_exact(out, shared, "payload")


def test_all_routes_missing_sanitizes_negative_zero_shared():
    shared = torch.full((2, 8), -0.0, dtype=torch.bfloat16)
    idx = torch.full((2, 2), -1, dtype=torch.int32)
    out = moe_finalize(torch.ones(1, 8, dtype=torch.bfloat16), torch.ones(2, 2), idx, shared)
    assert (nm.bits(out) == 0).all()


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fma", [True, False])
def test_top_1_unit_weight_is_the_gathered_row(weight_dtype, fma):
    gemm2 = _bf16(7, 64, seed=3)
    idx = torch.tensor([[4], [0], [6], [4]], dtype=torch.int32)
    out = moe_finalize(gemm2, torch.ones(4, 1, dtype=weight_dtype), idx, fma=fma)
    nm.assert_bit_exact(out, nm.sanitize_negative_zero(gemm2[idx[:, 0].long()]), "payload")


def test_all_reduce_norm_finalize_without_routes_is_all_reduce_norm():
    partials = [_random_partial(3, 16, 2, 4, seed=30 + r) for r in range(3)]
    partials = [MoEPartial(p.gemm2_permuted, p.expert_weights,
                           torch.full_like(p.expanded_idx_to_permuted_idx, -1), p.shared_output)
                for p in partials]
    residual, w = _bf16(3, 16, seed=4), _norm_weight(16)
    got = all_reduce_norm_finalize(partials, residual, w, EPS, order=[2, 0, 1])
    want = all_reduce_norm([p.shared_output for p in partials], residual, w, EPS, order=[2, 0, 1])
    for g, e, what in zip(got, want, ("norm_out", "residual_out")):
        nm.assert_bit_exact(g, e, what)


def test_runs_on_the_inputs_device():
    p = _random_partial(2, 16, 2, 3, seed=5)
    assert _finalize(p).device == p.gemm2_permuted.device


# --- mutations make the contract check fail ------------------------------------

def test_mutation_fma_off_fails_contract_and_golden(monkeypatch):
    monkeypatch.delenv(UPDATE_ENV, raising=False)
    partials = _crafted_partials()
    residual, w = _bf16(3, 16, seed=20), _norm_weight(16)
    good = finalize_payloads(partials)
    bad = finalize_payloads(partials, fma=False)
    with pytest.raises(AssertionError, match="not bit-exact"):
        nm.assert_bit_exact(bad, good, "payloads")
    norm_out, residual_out = all_reduce_norm_finalize(partials, residual, w, EPS, fma=False)
    with pytest.raises(AssertionError, match="payloads"):
        check_golden(
            "moe_all_reduce_norm_finalize_tp3",
            _golden_inputs(partials, residual=residual, norm_weight=w),
            {"payloads": bad, "norm_out": norm_out, "residual_out": residual_out},
            {"M": 3, "hidden": 16, "tp": 3, "top_k": 3, "eps": EPS, "order": None, "fma": True},
        )


def test_mutation_rank_order_reversed_fails_contract_and_golden(monkeypatch):
    monkeypatch.delenv(UPDATE_ENV, raising=False)
    partials = _crafted_partials()
    residual, w = _bf16(3, 16, seed=20), _norm_weight(16)
    good = all_reduce_norm_finalize(partials, residual, w, EPS)
    bad = all_reduce_norm_finalize(partials, residual, w, EPS, order=[2, 1, 0])
    with pytest.raises(AssertionError, match="not bit-exact"):
        nm.assert_bit_exact(bad[1], good[1], "residual_out")
    with pytest.raises(AssertionError, match="residual_out"):
        check_golden(
            "moe_all_reduce_norm_finalize_tp3",
            _golden_inputs(partials, residual=residual, norm_weight=w),
            {"payloads": finalize_payloads(partials), "norm_out": bad[0], "residual_out": bad[1]},
            {"M": 3, "hidden": 16, "tp": 3, "top_k": 3, "eps": EPS, "order": None, "fma": True},
        )


def test_mutation_top_k_order_reversed_fails_contract():
    gemm2 = torch.ones(3, 8, dtype=torch.bfloat16)
    w = torch.tensor([[2.0**24, 1.0, -(2.0**24)]])
    idx = torch.tensor([[0, 1, 2]], dtype=torch.int32)
    good = moe_finalize(gemm2, w, idx)
    with pytest.raises(AssertionError, match="not bit-exact"):
        nm.assert_bit_exact(moe_finalize(gemm2, w.flip(1), idx.flip(1)), good, "payload")


# --- validation -----------------------------------------------------------------

def _args():
    p = _random_partial(3, 16, 2, 4, seed=6)
    return dict(gemm2_permuted=p.gemm2_permuted, expert_weights=p.expert_weights,
                expanded_idx_to_permuted_idx=p.expanded_idx_to_permuted_idx,
                shared_output=p.shared_output)


@pytest.mark.parametrize("change, match", [
    (lambda a: {"gemm2_permuted": a["gemm2_permuted"].half()}, "gemm2_permuted must be torch.bfloat16"),
    (lambda a: {"gemm2_permuted": a["gemm2_permuted"].flatten()}, "gemm2_permuted must be"),
    (lambda a: {"gemm2_permuted": a["gemm2_permuted"][:, :12],
                "shared_output": a["shared_output"][:, :12]},
     "gemm2_permuted hidden must be a positive multiple of 8"),
    (lambda a: {"expert_weights": a["expert_weights"].half()},
     "expert_weights must be torch.float32 or torch.bfloat16"),
    (lambda a: {"expert_weights": a["expert_weights"][:, :1]}, "expanded_idx_to_permuted_idx must have shape"),
    (lambda a: {"expanded_idx_to_permuted_idx": a["expanded_idx_to_permuted_idx"].long()},
     "expanded_idx_to_permuted_idx must be torch.int32"),
    (lambda a: {"expanded_idx_to_permuted_idx": a["expanded_idx_to_permuted_idx"].clone().fill_(4)},
     r"expanded_idx_to_permuted_idx holds 4 .* outside \[-1, 4\)"),
    (lambda a: {"expanded_idx_to_permuted_idx": a["expanded_idx_to_permuted_idx"].clone().fill_(-2)},
     "expanded_idx_to_permuted_idx holds -2"),
    (lambda a: {"shared_output": a["shared_output"][:2]}, "shared_output must have shape"),
    (lambda a: {"shared_output": a["shared_output"].float()}, "shared_output must be torch.bfloat16"),
])
def test_bad_input_names_the_argument(change, match, monkeypatch):
    # Validation comes before any arithmetic.
    monkeypatch.setattr(moe, "fma_f32", lambda *a: pytest.fail("computed before validating"))
    a = _args()
    a.update(change(a))
    with pytest.raises(ValueError, match=match):
        moe_finalize(**a)


def test_top_k_mismatch_named():
    with pytest.raises(ValueError, match="expert_weights has top_k=2, expected top_k=3"):
        moe_finalize(**_args(), top_k=3)


def test_rank_disagreement_named():
    partials = [_random_partial(3, 16, 2, 4, seed=7), _random_partial(2, 16, 2, 4, seed=8)]
    with pytest.raises(ValueError, match=r"partials\[1\] has \(M, hidden, top_k\)"):
        finalize_payloads(partials)
    bad_rank = [partials[0], MoEPartial(partials[0].gemm2_permuted, partials[0].expert_weights,
                                        partials[0].expanded_idx_to_permuted_idx.long())]
    with pytest.raises(ValueError, match=r"partials\[1\]\.expanded_idx_to_permuted_idx must be torch.int32"):
        finalize_payloads(bad_rank)


def test_all_reduce_norm_finalize_validates_before_computing(monkeypatch):
    monkeypatch.setattr(moe, "finalize_payloads", lambda *a, **k: pytest.fail("computed before validating"))
    partials = [_random_partial(3, 16, 2, 4, seed=30 + r) for r in range(2)]
    w = _norm_weight(16)
    with pytest.raises(ValueError, match="residual must have shape"):
        all_reduce_norm_finalize(partials, _bf16(2, 16, seed=1), w, EPS)
    with pytest.raises(ValueError, match="norm_weight must have shape"):
        all_reduce_norm_finalize(partials, _bf16(3, 16, seed=1), w[:8], EPS)
    with pytest.raises(ValueError, match="order must be a permutation"):
        all_reduce_norm_finalize(partials, _bf16(3, 16, seed=1), w, EPS, order=[0, 0])
    with pytest.raises(ValueError, match="eps must be > 0"):
        all_reduce_norm_finalize(partials, _bf16(3, 16, seed=1), w, 0.0)


@pytest.mark.gpu
@pytest.mark.parametrize("fma", [True, False])
def test_cuda_matches_cpu_bit_for_bit(fma):
    partials = _crafted_partials()
    residual, w = _bf16(3, 16, seed=20), _norm_weight(16)
    cuda = [MoEPartial(*(t.cuda() for t in (p.gemm2_permuted, p.expert_weights,
                                            p.expanded_idx_to_permuted_idx, p.shared_output)))
            for p in partials]
    want = finalize_payloads(partials, fma=fma, routed_scaling_factor=1.5)
    got = finalize_payloads(cuda, fma=fma, routed_scaling_factor=1.5)
    assert got.device.type == "cuda"
    nm.assert_bit_exact(got.cpu(), want, "payloads")
    want_res = all_reduce_norm_finalize(partials, residual, w, EPS, fma=fma)[1]
    got_res = all_reduce_norm_finalize(cuda, residual.cuda(), w.cuda(), EPS, fma=fma)[1]
    nm.assert_bit_exact(got_res.cpu(), want_res, "residual_out")
