"""kernels.reference.indexer: golden vectors, contract properties, mutations,
validation. CPU, small shapes."""

import math
from fractions import Fraction

import pytest
import torch

from kernels.indexer.layout import DIM, MQA_MIN_HEADS, Tactic, head_weight_scale
from kernels.reference import golden
from kernels.reference import indexer as R
from kernels.reference import numerics as nm
from kernels.reference.indexer_cases import CASES
from tests.oracle import exact, f32


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _bf16(shape, seed, scale=1.0):
    return (torch.randn(shape, generator=_gen(seed)) * scale).to(torch.bfloat16)


# --- golden vectors (pinned in tests/test_golden.py, which holds every case) --

def test_order_sensitive_token_depends_on_the_tree():
    _, make, compute = CASES["indexer_projection_tactics"]
    inputs, params = make()
    out = compute(inputs, params)
    assert out["key_exact"][2, 0].item() == 1.0
    for name in ("w1s1", "w4s1", "w2s2", "w1s4"):
        assert out[f"key_{name}"][2, 0].item() == 0.0  # (2^24 + 1) - 2^24 in FP32


def test_reversed_cluster_order_fails_golden(monkeypatch):
    # Mutation: the cluster's K parts added in reverse rank order.
    original = R.projection_accumulate

    def reversed_tree(x, weight, tactic=None):
        if tactic is None or tactic.split == 1:
            return original(x, weight, tactic)
        k = x.shape[1]
        part = k // tactic.split
        flip = torch.cat([torch.arange(c * part, (c + 1) * part) for c in reversed(range(tactic.split))])
        return original(x[:, flip].contiguous(), weight[:, flip].contiguous(), tactic)

    monkeypatch.setattr(R, "projection_accumulate", reversed_tree)
    _, make, compute = CASES["indexer_projection_tactics"]
    inputs, params = make()
    out = compute(inputs, params)
    assert out["key_w1s4"][2, 0].item() == 1.0  # ((-2^24) + 1) + 2^24
    with pytest.raises(AssertionError, match="key_w1s4"):
        golden.check_golden("indexer_projection_tactics", inputs, out, params)


# --- projection ---------------------------------------------------------------

@pytest.mark.parametrize("tactic", [None, Tactic(16, 1), Tactic(8, 4), Tactic(2, 2), Tactic(1, 1)])
def test_projection_within_its_bound(tactic):
    x, w = _bf16((5, 1024), 1), _bf16((24, 1024), 2, 0.05)
    got = R.projection_accumulate(x, w, tactic)
    R.assert_projection_within_bound(got, x, w, tactic, "fp32")
    R.assert_projection_within_bound(got.to(torch.bfloat16), x, w, tactic, "bf16")


def test_projection_bound_catches_a_wrong_sum():
    x, w = _bf16((2, 512), 3), _bf16((8, 512), 4)
    got = R.projection_accumulate(x, w, Tactic(16, 1)).clone()
    got[1, 3] += 1e-2
    with pytest.raises(AssertionError, match=r"first \(1, 3\)"):
        R.assert_projection_within_bound(got, x, w, Tactic(16, 1), "mutated")
    got[1, 3] = float("nan")
    with pytest.raises(AssertionError):
        R.assert_projection_within_bound(got, x, w, Tactic(16, 1), "nan")


def test_projection_roundings():
    assert R.projection_roundings(7168, Tactic(16, 1)) == 14 * 18 + 1 + 16 + 1
    assert R.projection_roundings(7168, Tactic(8, 4)) == 7 * 18 + 1 + 8 + 4
    assert R.projection_roundings(7168, None) == 7168


def test_projection_splits_rows_into_outputs():
    x, w = _bf16((3, 512), 5), _bf16((8 + 4 + 4, 512), 6, 0.05)
    key, weights, gate = R.indexer_projection(x, w, key=8, heads=4, tactic=Tactic(16, 1))
    total = R.projection_accumulate(x, w, Tactic(16, 1))
    assert key.dtype == gate.dtype == torch.bfloat16 and weights.dtype == torch.float32
    assert torch.equal(nm.bits(key), nm.bits(total[:, :8].to(torch.bfloat16)))
    assert torch.equal(nm.bits(weights), nm.bits(total[:, 8:12]))
    assert torch.equal(nm.bits(gate), nm.bits(total[:, 12:].to(torch.bfloat16)))


# --- Hadamard ----------------------------------------------------------------

def test_hadamard_matrix_is_orthogonal():
    for n in (1, 2, 8, 128):
        h = R.hadamard_matrix(n)
        assert torch.equal(h @ h.T, n * torch.eye(n, dtype=torch.float64))


def test_hadamard_matches_dense_bit_for_bit_on_exact_inputs():
    # Small integers: every FP32 butterfly is exact, so only the scale multiply
    # and the BF16 rounding remain; the dense product must give the same bits.
    x = torch.randint(-8, 9, (6, DIM), generator=_gen(7)).to(torch.bfloat16)
    dense = (x.double() @ R.hadamard_matrix(DIM)).float() * torch.tensor(DIM ** -0.5, dtype=torch.float32)
    got = R.hadamard_transform(x)
    assert torch.equal(nm.bits(got), nm.bits(dense.to(torch.bfloat16)))
    rev = R.hadamard_transform(x, strides=[64, 32, 16, 8, 4, 2, 1])
    assert torch.equal(nm.bits(rev), nm.bits(got))


def test_hadamard_within_one_ulp_of_dense_and_orthonormal():
    x = _bf16((16, 4, DIM), 8, 3.0)
    got = R.hadamard_transform(x)
    dense = nm.round_bf16((x.double() @ R.hadamard_matrix(DIM)) * DIM ** -0.5)
    assert nm.bf16_ulp_distance(got, dense).max() <= 1
    # orthonormal: norms kept, and applying it twice gives x back (BF16 error only)
    ratio = got.double().norm(dim=-1) / x.double().norm(dim=-1)
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=2e-3)
    back = R.hadamard_transform(got)
    assert (back.double() - x.double()).abs().max() <= 2 ** -6 * x.double().abs().max()


# --- FP8 quantization ------------------------------------------------------

def _fp8_bound(v, scale):
    """Half an e4m3 step of v / scale, in units of v: 2^-4 relative for
    normals (3 mantissa bits), 2^-10 absolute below 2^-6 (subnormals)."""
    y = (v / scale).abs()
    return scale * torch.maximum(y * 2.0**-4, torch.full_like(y, 2.0**-10)) * (1 + 2**-20)


@pytest.mark.parametrize("ue8m0", [False, True])
def test_quantization_round_trip_within_fp8_bound(ue8m0):
    x = _bf16((7, 3, 256), 9, 5.0)
    q, s = R.quantize_fp8(x, block_size=128, ue8m0=ue8m0)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (7, 3, 2)
    back = R.dequantize_fp8(q, s, block_size=128)
    v = x.float()
    assert ((back - v).abs() <= _fp8_bound(v, s.repeat_interleave(128, -1))).all()
    ymax = (q.float().abs().reshape(7, 3, 2, 128)).amax(-1)
    if ue8m0:
        assert ((ymax >= 224) & (ymax <= 448)).all()  # amax / s in (224, 448]
    else:
        assert (ymax == 448).all()  # each block's amax lands on the top of the range


def _check_pow2_scales(quantize):
    """Contract: ue8m0 scales are powers of two, >= amax / 448, < 2 amax / 448."""
    x = _bf16((5, 4, 128), 10, 3.0)
    _, s = quantize(x, block_size=128, ue8m0=True)
    mantissa, _ = torch.frexp(s)
    assert (mantissa == 0.5).all(), "ue8m0 scales are not powers of two"
    _, plain = quantize(x, block_size=128, ue8m0=False)
    assert ((s >= plain) & (s < 2 * plain)).all()


def test_ue8m0_scales_are_powers_of_two():
    _check_pow2_scales(R.quantize_fp8)


def test_zero_block_uses_the_amax_floor():
    q, s = R.quantize_fp8(torch.zeros(2, 128, dtype=torch.bfloat16))
    assert (nm.bits(q) == 0).all()
    assert torch.equal(s, torch.full((2, 1), R.AMAX_FLOOR, dtype=torch.float32) * (1 / 448))


def test_quantization_rounds_to_nearest_even():
    # A block with amax 448 has scale 448 * FP32(1/448); values at e4m3 ties.
    x = torch.tensor([448.0, 1.0625, 1.1875, 232.0, -1.0625], dtype=torch.float32)
    x = torch.cat([x, torch.zeros(123)])
    q, s = R.quantize_fp8(x, ue8m0=True)  # 448/448 = 1: scale exactly 1
    assert s.item() == 1.0
    assert q[:5].float().tolist() == [448.0, 1.0, 1.25, 224.0, -1.0]


# --- key LayerNorm ------------------------------------------------------------

def _layer_norm64(key, w, b, eps):
    v = key.double()
    mean = v.mean(-1, keepdim=True)
    var = ((v - mean) ** 2).mean(-1, keepdim=True)
    return nm.round_bf16((v - mean) / torch.sqrt(var + eps) * w.double() + b.double())


def _offset_key(m=6, n=128, seed=11):
    """Keys whose 8-row partitions have very different means (so the
    between-partition term of the combination matters)."""
    offsets = torch.arange(n // 8).repeat_interleave(8).float() * 0.75
    return (torch.randn(m, n, generator=_gen(seed)) * 0.1 + offsets).to(torch.bfloat16)


def _check_layer_norm_contract(norm):
    """Contract: within 1 BF16 ULP of an FP64 LayerNorm of the BF16 key,
    for every partition count the kernel may use."""
    key = _offset_key()
    w = torch.randn(128, generator=_gen(12)) * 0.2 + 1
    b = torch.randn(128, generator=_gen(13)) * 0.1
    want = _layer_norm64(key, w, b, 1e-6)
    for partitions in (1, 2, 16, 128):
        got = norm(key, w, b, 1e-6, partitions=partitions)
        assert nm.bf16_ulp_distance(got, want).max() <= 1, f"partitions={partitions}"


def test_key_layer_norm_contract():
    _check_layer_norm_contract(R.key_layer_norm)


def test_key_layer_norm_matches_torch_layer_norm():
    key = _bf16((8, 128), 14, 2.0)
    w, b = torch.randn(128, generator=_gen(15)), torch.randn(128, generator=_gen(16))
    ref = torch.nn.functional.layer_norm(key.float(), (128,), w, b, 1e-6).to(torch.bfloat16)
    for partitions in (1, 16):
        got = R.key_layer_norm(key, w, b, 1e-6, partitions=partitions)
        assert nm.bf16_ulp_distance(got, ref).max() <= 1


def test_partition_stats_combine_to_the_whole():
    v = _offset_key().float()
    mean1, m21 = R.layer_norm_stats(v, 1)
    mean16, m216 = R.layer_norm_stats(v, 16)
    assert torch.allclose(mean16, mean1, rtol=1e-6) and torch.allclose(m216, m21, rtol=1e-5)


# --- the query epilogue and the fused op ------------------------------------

def _query_inputs(m=3, heads=4, key=16, seed=20):
    return dict(
        q=_bf16((m, heads, DIM), seed, 2.0), key=_bf16((m, key), seed + 1),
        weights=torch.randn(m, heads, generator=_gen(seed + 2)),
        norm_weight=torch.randn(key, generator=_gen(seed + 3)) * 0.1 + 1,
        norm_bias=torch.randn(key, generator=_gen(seed + 4)) * 0.1,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_query_epilogue_is_its_stages(dtype, ue8m0):
    a = _query_inputs()
    scale = head_weight_scale(DIM ** -0.5, 4)
    q_fp8, w, key = R.indexer_query(**a, eps=1e-6, scale=scale, weights_dtype=dtype, ue8m0=ue8m0)
    assert q_fp8.shape == (3, MQA_MIN_HEADS, DIM) and w.shape == (3, MQA_MIN_HEADS) and w.dtype == dtype
    q_ref, s = R.quantize_fp8(R.hadamard_transform(a["q"]), ue8m0=ue8m0)
    assert torch.equal(nm.bits(q_fp8[:, :4]), nm.bits(q_ref))
    w_ref = (a["weights"] * s[..., 0]) * torch.tensor(scale, dtype=torch.float32)
    assert torch.equal(nm.bits(w[:, :4]), nm.bits(w_ref.to(dtype)))
    assert torch.equal(nm.bits(key), nm.bits(R.key_layer_norm(a["key"], a["norm_weight"], a["norm_bias"], 1e-6)))
    # padding heads are exact zeros (bits 0: +0.0, not -0.0)
    assert (nm.bits(q_fp8[:, 4:]) == 0).all() and (nm.bits(w[:, 4:]) == 0).all()


def test_no_padding_when_heads_reach_the_minimum():
    a = _query_inputs(heads=MQA_MIN_HEADS)
    q_fp8, w, _ = R.indexer_query(**a, eps=1e-6, scale=0.01)
    assert q_fp8.shape[1] == w.shape[1] == MQA_MIN_HEADS
    q2d, _, _ = R.indexer_query(**{**a, "q": a["q"].reshape(3, -1)}, eps=1e-6, scale=0.01)
    assert torch.equal(nm.bits(q2d), nm.bits(q_fp8))  # [M, heads * DIM] accepted too


def test_fused_is_projection_then_query():
    x, w = _bf16((2, 512), 30), _bf16((16 + 8 + 8, 512), 31, 0.05)
    a = _query_inputs(m=2, heads=8, key=16, seed=32)
    args = dict(eps=1e-6, scale=head_weight_scale(DIM ** -0.5, 8), padded=10)
    t = Tactic(16, 1)
    fused = R.indexer_fused(x, w, a["q"], a["norm_weight"], a["norm_bias"], key=16, heads=8, tactic=t, **args)
    k, hw, g = R.indexer_projection(x, w, key=16, heads=8, tactic=t)
    two_step = (*R.indexer_query(a["q"], k, hw, a["norm_weight"], a["norm_bias"], **args), g)
    for f, s in zip(fused, two_step):
        assert torch.equal(nm.bits(f), nm.bits(s))


# --- mutations make the contract tests fail ----------------------------------

def _check_hadamard_contract():
    x = _bf16((8, DIM), 40, 3.0)
    ratio = R.hadamard_transform(x).double().norm(dim=-1) / x.double().norm(dim=-1)
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=2e-3), "Hadamard is not orthonormal"


def _mutate_combination(means, m2s, count):
    """Wrong: drops the between-partition term count * d^2."""
    mean = means.mean(dim=1)
    return mean, m2s.sum(dim=1)


@pytest.mark.parametrize("mutation", ["hadamard_scale", "ue8m0_off", "partitions_merged_wrongly"])
def test_mutation_fails_the_contract(monkeypatch, mutation):
    if mutation == "hadamard_scale":
        check = _check_hadamard_contract
        monkeypatch.setattr(R, "_hadamard_scale", lambda n: 1.0 / n)
        golden_name = "indexer_fused_fp32_w2s2"
    elif mutation == "ue8m0_off":
        def check():
            _check_pow2_scales(R.quantize_fp8)
        monkeypatch.setattr(R, "_pow2_ceil", lambda s: s)
        golden_name = "indexer_fused_ue8m0_bf16"
    else:
        def check():
            _check_layer_norm_contract(R.key_layer_norm)
        monkeypatch.setattr(R, "_combine_stats", _mutate_combination)
        golden_name = "indexer_fused_fp32_w2s2"
    with pytest.raises(AssertionError):
        check()
    _, make, compute = CASES[golden_name]
    inputs, params = make()
    with pytest.raises(AssertionError, match="golden"):
        golden.check_golden(golden_name, inputs, compute(inputs, params), params)


# --- validation ---------------------------------------------------------------

def _fused_call(**over):
    x, w = _bf16((2, 512), 50), _bf16((32, 512), 51)
    a = _query_inputs(m=2, heads=8, key=16, seed=52)
    kw = dict(x=x, weight=w, q=a["q"], norm_weight=a["norm_weight"], norm_bias=a["norm_bias"],
              key=16, heads=8, eps=1e-6, scale=0.01)
    kw.update(over)
    return R.indexer_fused(**kw)


@pytest.mark.parametrize("over,match", [
    (dict(x=torch.zeros(2, 512)), "x must be torch.bfloat16"),
    (dict(x=torch.zeros(2, 512, 1, dtype=torch.bfloat16)), "x must have shape"),
    (dict(x=torch.zeros(0, 512, dtype=torch.bfloat16)), "x must hold at least one token"),
    (dict(weight=torch.zeros(32, 256, dtype=torch.bfloat16)), r"weight must have shape \[\*, 512\]"),
    (dict(x=torch.zeros(2, 12, dtype=torch.bfloat16), weight=torch.zeros(32, 12, dtype=torch.bfloat16)),
     "x hidden size"),
    (dict(tactic=Tactic(8, 4)), r"x: K = 512 does not tile"),
    (dict(tactic=(16, 1)), "tactic must be a Tactic"),
    (dict(key=0), "key must be a positive int"),
    (dict(heads=40), "fewer than key \\+ heads"),
    (dict(q=torch.zeros(2, 8, 64, dtype=torch.bfloat16)), r"q must have shape \[2, 8, 128\]"),
    (dict(q=torch.zeros(2, 8, 128)), "q must be torch.bfloat16"),
    (dict(norm_weight=torch.zeros(8)), r"norm_weight must have shape \[16\]"),
    (dict(norm_bias=torch.zeros(16, dtype=torch.float16)), "norm_bias must be"),
    (dict(eps=0.0), "eps must be a positive"),
    (dict(scale=float("nan")), "scale must be a positive finite"),
    (dict(padded=4), "padded must be an int >= heads = 8"),
    (dict(weights_dtype=torch.float16), "weights_dtype must be"),
    (dict(partitions=3), "partitions must be a positive divisor of 16"),
])
def test_bad_input_names_the_argument(over, match):
    with pytest.raises(ValueError, match=match):
        _fused_call(**over)


@pytest.mark.parametrize("call,match", [
    (lambda: R.hadamard_transform(torch.zeros(4, 96, dtype=torch.bfloat16)), "last dim must be a power of two"),
    (lambda: R.hadamard_transform(torch.zeros(4, 8, dtype=torch.bfloat16), strides=[1, 2, 2]), "strides"),
    (lambda: R.hadamard_transform(torch.zeros(4, 8)), "x must be torch.bfloat16"),
    (lambda: R.quantize_fp8(torch.zeros(4, 100, dtype=torch.bfloat16)), "multiple of block_size 128"),
    (lambda: R.quantize_fp8(torch.zeros(4, 128, dtype=torch.float16)), "x must be"),
    (lambda: R.quantize_fp8(torch.zeros(4, 128), block_size=0), "block_size"),
    (lambda: R.hadamard_matrix(6), "n must be a power of two"),
    (lambda: R.dequantize_fp8(torch.zeros(2, 128, dtype=torch.uint8), torch.ones(2, 1)), "q must be"),
])
def test_bad_helper_input_names_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_nan_propagates_and_never_passes():
    x = _bf16((1, DIM), 60)
    x[0, 3] = math.nan
    q, s = R.quantize_fp8(R.hadamard_transform(x))
    assert torch.isnan(s).all()
    assert nm.bf16_ulp_distance(R.hadamard_transform(x), R.hadamard_transform(x)).isinf().all()


# --- the reduction tree against a scalar oracle -------------------------------

def _oracle_tree(x_row, w_row, warps, split):
    """The seed's loops, literally, in exact rationals rounded to FP32 where the
    kernel rounds: lane quad q of warp v in CTA c holds the 8 K elements
    ``first + 32 p .. + 7`` (``first = (c * warps + v) * span + 8 q``); mma
    step j (even) takes words j % 4 and j % 4 + 1 of pair j // 4 from all four
    quads into accumulator (j // 2) % 2; then acc0 + acc1, warps from 0, CTAs
    from 0."""
    k = len(x_row)
    span = k // (warps * split)
    pairs = span // 32
    total = Fraction(0)
    for c in range(split):
        cta = Fraction(0)
        for v in range(warps):
            acc = [Fraction(0), Fraction(0)]
            for j in range(0, pairs * 4, 2):
                p, word = j // 4, j % 4
                chunk = Fraction(0)
                for q in range(4):
                    first = (c * warps + v) * span + q * 8 + p * 32
                    for i in (word, word + 1):
                        for e in (2 * i, 2 * i + 1):
                            chunk += x_row[first + e] * w_row[first + e]
                acc[j // 2 % 2] = f32(acc[j // 2 % 2] + chunk)
            cta = f32(cta + f32(acc[0] + acc[1]))
        total = f32(total + cta)
    return total


@pytest.mark.parametrize("warps,split", [(1, 1), (2, 2), (1, 4), (4, 1)])
def test_tree_matches_scalar_oracle(warps, split):
    k = 256
    g = _gen(70 + warps * 10 + split)
    # Values over ~40 binades so that almost every addition rounds.
    x = (torch.randn(2, k, generator=g) * torch.exp2(torch.randint(-20, 20, (2, k), generator=g))).to(torch.bfloat16)
    w = (torch.randn(3, k, generator=g) * torch.exp2(torch.randint(-20, 20, (3, k), generator=g))).to(torch.bfloat16)
    got = R.projection_accumulate(x, w, Tactic(warps, split))
    xs, ws = exact(x), exact(w)
    want = torch.tensor([[float(_oracle_tree(xs[m], ws[r], warps, split)) for r in range(3)] for m in range(2)],
                        dtype=torch.float64).to(torch.float32)
    assert torch.equal(got, want)
    # and the tree matters: the exact dot product differs somewhere
    assert not torch.equal(R.projection_accumulate(x, w, None), got)
