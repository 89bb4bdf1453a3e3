"""Torch references for the DSA indexer stage (seed 001): ``IndexerProjection``
and its ``fused`` query epilogue. CPU and GPU; every function validates its
arguments and raises ValueError naming the bad one.

What is modelled, and how exactly (docs/design.md, Numerical contract):

Projection (``x @ weight.T`` over the concatenated ``[wk; weights_proj; gate]``
rows, BF16 in, FP32 accumulation). Products of BF16 values are exact in FP32,
so only the summation order matters. :func:`projection_accumulate` takes the
kernel's reduction tree as a parameter (``tactic``): each warp's K span is fed
to mma.sync 16 K elements at a time into two alternating accumulators (steps
of fragment words 0-1 into one, words 2-3 into the other), then ``acc0 + acc1``,
then the warps in warp order from +0.0, then the cluster's CTAs in rank order
from +0.0. One mma step is modelled as the exact 16-term sum added to the
accumulator with one FP32 round-to-nearest; tensor cores align and truncate
internally instead, so the kernel is *not* expected to match this model bit
for bit. Its distance from the exact dot product is held to
:func:`projection_error_bound` (a forward error bound in units of
``sum(|x * w|)`` that counts every rounding of the tree, 18 per mma step), and
``tactic=None`` gives the exact dot product rounded once to FP32 (FP64
accumulation). Bit-exact claims live between kernels (the fused kernel equals
the projection kernel with the same tactic), not against this model.

Query epilogue (``indexer_query``, DeepSeek-V3.2 conventions):
- Hadamard: FP32 butterflies of the BF16 q (strides 1, 2, 4, ... unless given),
  times FP32(``DIM ** -0.5``), rounded once to BF16 (``rotate_activation``).
  Bit-exact as long as the kernel butterflies in the same stride order.
- FP8 e4m3: per block of ``QUANT_BLOCK`` = 128 values, ``amax = max(|v|, 1e-4)``,
  ``s = amax * FP32(1/448)``, or with ``ue8m0`` the power of two
  ``2^ceil(log2(s))`` read off the FP32 bits; ``q = e4m3(clamp(v / s, +-448))``
  round-to-nearest-even (``act_quant``). Bit-exact; with ue8m0 also for a kernel
  that multiplies by ``1/s`` (exact for powers of two).
- Head weights: ``FP32(FP32(w * s) * FP32(scale))`` with ``scale =
  softmax_scale * heads ** -0.5``, stored FP32 or rounded once to BF16;
  bit-exact given the projection's ``w``.
- Key LayerNorm of the BF16 key: (mean, M2) per partition of ``key /
  partitions`` rows (sequential FP32 sums from +0.0), combined in partition
  order with Chan's equal-count formula as the kernel's key cluster does over
  DSMEM, ``rstd = rsqrt(M2 / key + eps)``, ``((v - mean) * rstd) * w + b``
  rounded to BF16. The kernel's rsqrt is approximate and it may contract
  into FMAs, so its key is held to 1 BF16 ULP of this, not bit-exactness.
- Padding heads (``heads..padded-1``) are exact zeros (FP8 bits 0x00, +0.0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from kernels.indexer.layout import DIM, MMA_K, MQA_MIN_HEADS, QUANT_BLOCK, ROWS, Tactic
from kernels.reference.numerics import bf16_ulp_at
from kernels.validation import require_multiple, require_tensor

#: Largest finite float8_e4m3fn value.
FP8_MAX = 448.0
#: ``act_quant``'s floor on a block's amax (keeps the scale normal and nonzero).
AMAX_FLOOR = 1e-4
#: Unit roundoff of FP32 (round to nearest).
FP32_UNIT = 2.0**-24
#: Roundings charged to one mma.sync step by :func:`projection_error_bound`:
#: each of the 16 products and the incoming accumulator may be truncated once
#: when aligned to the largest term, plus the final rounding.
MMA_STEP_ROUNDINGS = MMA_K + 2

_WEIGHT_DTYPES = (torch.float32, torch.bfloat16)


def _f32(value: float, device) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32, device=device)


def _check_tokens(name: str, t: torch.Tensor) -> None:
    if t.shape[0] < 1:
        raise ValueError(f"{name} must hold at least one token, got shape {list(t.shape)}")


def _check_projection_inputs(x: torch.Tensor, weight: torch.Tensor) -> tuple[int, int, int]:
    require_tensor("x", x, dtype=torch.bfloat16, shape=(None, None))
    require_tensor("weight", weight, dtype=torch.bfloat16, shape=(None, x.shape[1]), device=x.device)
    _check_tokens("x", x)
    require_multiple("x hidden size (K)", x.shape[1], 8)
    if weight.shape[0] < 1:
        raise ValueError(f"weight must hold at least one row, got shape {list(weight.shape)}")
    return x.shape[0], x.shape[1], weight.shape[0]


# --- projection -------------------------------------------------------------

def projection_accumulate(x: torch.Tensor, weight: torch.Tensor, tactic: Tactic | None = None) -> torch.Tensor:
    """FP32 ``[M, rows]`` of ``x @ weight.T`` summed in the kernel's order.

    Args:
        x: BF16 ``[M, K]`` layer input.
        weight: BF16 ``[rows, K]``.
        tactic: the kernel's ``Tactic(warps, split)``; K must be a multiple of
            ``32 * warps * split``. ``None``: the exact dot product rounded once
            (FP64 accumulation, exact unless the terms span ~29+ binades).

    K index ``((c * warps + v) * pairs + p) * 32 + q * 8 + h * 4 + e`` is CTA
    ``c`` of the cluster, warp ``v``, fragment pair ``p``, lane quad ``q``,
    mma half ``h`` (accumulator ``h``), element ``e``; see the module docstring
    for the tree and the one-rounding-per-mma model. The 16-term mma sums and
    the accumulator additions go through FP64 before the FP32 rounding: one
    correct rounding unless a step's terms span more than ~29 binades.
    Checked bit for bit against a scalar rational oracle of the seed's loops.
    """
    m, k, rows = _check_projection_inputs(x, weight)
    x64, w64 = x.to(torch.float64), weight.to(torch.float64)
    if tactic is None:
        return (x64 @ w64.T).to(torch.float32)
    if not isinstance(tactic, Tactic):
        raise ValueError(f"tactic must be a Tactic or None, got {tactic!r}")
    try:
        span = tactic.span(k)
    except ValueError as err:
        raise ValueError(f"x: {err}") from None
    pairs, warps, split = span // 32, tactic.warps, tactic.split

    def groups(t: torch.Tensor) -> torch.Tensor:
        g = t.reshape(t.shape[0], split, warps, pairs, 4, 2, 4).permute(0, 1, 2, 3, 5, 4, 6)
        return g.reshape(t.shape[0], split * warps * pairs * 2, MMA_K)

    chunks = torch.einsum("mgi,rgi->mrg", groups(x64), groups(w64))
    chunks = chunks.reshape(m, rows, split, warps, pairs, 2)
    acc = torch.zeros(m, rows, split, warps, 2, dtype=torch.float32, device=x.device)
    for p in range(pairs):
        acc = (acc.to(torch.float64) + chunks[..., p, :]).to(torch.float32)
    per_warp = acc[..., 0] + acc[..., 1]
    per_cta = torch.zeros(m, rows, split, dtype=torch.float32, device=x.device)
    for v in range(warps):
        per_cta = per_cta + per_warp[..., v]
    total = torch.zeros(m, rows, dtype=torch.float32, device=x.device)
    for c in range(split):
        total = total + per_cta[..., c]
    return total


def projection_roundings(k: int, tactic: Tactic | None) -> int:
    """Roundings on the longest path of the reduction tree: ``pairs`` mma steps
    of ``MMA_STEP_ROUNDINGS`` each, ``acc0 + acc1``, ``warps`` and ``split``
    additions; ``None`` (any FP32 order, e.g. cuBLAS with TF32 off): ``K``."""
    if tactic is None:
        return k
    return (tactic.span(k) // 32) * MMA_STEP_ROUNDINGS + 1 + tactic.warps + tactic.split


def projection_error_bound(x: torch.Tensor, weight: torch.Tensor, tactic: Tactic | None = None) -> torch.Tensor:
    """FP64 ``[M, rows]``: a bound on ``|FP32 result - exact dot|`` for a kernel
    summing in ``tactic``'s tree (or any order, ``None``):
    ``gamma(n) * sum_k |x_k * w_k|`` with ``gamma(n) = n u / (1 - n u)``,
    ``u = 2^-24`` and ``n`` = :func:`projection_roundings`. It covers the
    tensor cores' internal truncation, so it holds for the real kernel."""
    _, k, _ = _check_projection_inputs(x, weight)
    n = projection_roundings(k, tactic)
    gamma = n * FP32_UNIT / (1 - n * FP32_UNIT)
    return gamma * (x.to(torch.float64).abs() @ weight.to(torch.float64).abs().T)


def assert_projection_within_bound(actual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                                   tactic: Tactic | None, what: str) -> None:
    """Raise AssertionError unless ``actual`` ``[M, rows]`` (FP32, or BF16 with
    half a BF16 ULP more for its rounding) is within
    :func:`projection_error_bound` of the exact dot product; NaN never passes."""
    exact = x.to(torch.float64) @ weight.to(torch.float64).T
    allowed = projection_error_bound(x, weight, tactic)
    if actual.dtype == torch.bfloat16:
        allowed = allowed + 0.5 * bf16_ulp_at(exact.abs() + allowed)
    err = (actual.to(torch.float64) - exact).abs()
    bad = ~(err <= allowed)
    if bad.any():
        i = tuple(int(v) for v in bad.nonzero()[0])
        raise AssertionError(f"{what}: {int(bad.sum())} elements beyond the projection bound; "
                             f"first {i}: got {float(actual[i])}, exact {float(exact[i])}, "
                             f"allowed {float(allowed[i]):.3g}")


def indexer_projection(x: torch.Tensor, weight: torch.Tensor, *, key: int, heads: int,
                       tactic: Tactic | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(key BF16 [M, key], head weights FP32 [M, heads], kpool gate BF16 [M,
    gate])`` as ``IndexerProjection.__call__`` returns them, from one projection
    by ``weight = [wk; weights_proj; gate]`` (BF16 ``[key + heads + gate, K]``)
    of ``x`` (BF16 ``[M, K]``), summed as :func:`projection_accumulate` with
    ``tactic``; BF16 outputs are the FP32 sums rounded once (nearest-even)."""
    _, _, rows = _check_projection_inputs(x, weight)
    for name, value in (("key", key), ("heads", heads)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if key + heads > rows:
        raise ValueError(f"weight has {rows} rows, fewer than key + heads = {key} + {heads}")
    total = projection_accumulate(x, weight, tactic)
    return (total[:, :key].to(torch.bfloat16).contiguous(),
            total[:, key:key + heads].contiguous(),
            total[:, key + heads:].to(torch.bfloat16).contiguous())


# --- Hadamard transform -----------------------------------------------------

def hadamard_matrix(n: int) -> torch.Tensor:
    """The Sylvester Hadamard matrix ``[n, n]`` of +-1 (FP64), ``H @ H.T = n I``;
    ``y = x @ H`` is the unscaled transform :func:`hadamard_transform` computes."""
    if not isinstance(n, int) or n < 1 or n & (n - 1):
        raise ValueError(f"n must be a power of two, got {n!r}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def _hadamard_scale(n: int) -> float:
    return n ** -0.5


def hadamard_transform(x: torch.Tensor, *, scale: float | None = None,
                       strides: Sequence[int] | None = None) -> torch.Tensor:
    """BF16 ``[..., n]``: the Hadamard transform of BF16 ``x`` over its last dim
    (n a power of two), as ``rotate_activation`` / fast_hadamard_transform:
    FP32 butterflies ``(a + b, a - b)`` of the pairs ``(i, i + h)``, for each
    stride ``h`` in ``strides`` (default 1, 2, 4, ..., n/2), then times
    FP32(``scale``) (default ``n ** -0.5``, orthonormal), rounded once to BF16.
    The butterflies are exact (so the order irrelevant) while a row's values
    span fewer than ~9 binades; beyond that the kernel must use the same order
    to match bit for bit."""
    require_tensor("x", x, dtype=torch.bfloat16, contiguous=False)
    n = x.shape[-1] if x.dim() else 0
    if n < 1 or n & (n - 1):
        raise ValueError(f"x's last dim must be a power of two, got shape {list(x.shape)}")
    if strides is None:
        strides = [1 << i for i in range(n.bit_length() - 1)]
    strides = [int(h) for h in strides]
    if sorted(strides) != [1 << i for i in range(n.bit_length() - 1)]:
        raise ValueError(f"strides must be a permutation of the powers of two below {n}, got {strides}")
    scale = _hadamard_scale(n) if scale is None else scale
    if not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number, got {scale!r}")
    v = x.to(torch.float32).reshape(-1, n)
    for h in strides:
        pairs = v.reshape(-1, n // (2 * h), 2, h)
        a, b = pairs[:, :, 0, :], pairs[:, :, 1, :]
        v = torch.stack([a + b, a - b], dim=2).reshape(-1, n)
    return (v * _f32(scale, x.device)).to(torch.bfloat16).reshape(x.shape)


# --- FP8 quantization -------------------------------------------------------

def _pow2_ceil(s: torch.Tensor) -> torch.Tensor:
    """``2^ceil(log2(s))`` of positive normal FP32 ``s``, from its bits (as
    DeepSeek-V3.2's ``fast_round_scale``); non-finite values pass through."""
    raw = s.view(torch.int32)
    exponent = ((raw >> 23) & 0xFF) - 127 + ((raw & 0x7FFFFF) != 0).to(torch.int32)
    pow2 = ((exponent + 127) << 23).view(torch.float32)
    return torch.where(torch.isfinite(s), pow2, s)


def quantize_fp8(x: torch.Tensor, *, block_size: int = QUANT_BLOCK,
                 ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q float8_e4m3fn [..., n], scale FP32 [..., n / block_size])`` of BF16
    or FP32 ``x [..., n]`` per block of ``block_size`` consecutive values, as
    DeepSeek-V3.2's ``act_quant``: ``amax = max(|v|, 1e-4)``, ``scale = amax *
    FP32(1/448)`` (power of two ``2^ceil(log2(.))`` with ``ue8m0``), ``q =
    e4m3_rn(clamp(v / scale, -448, 448))``. ``q * scale`` dequantizes. Bit-exact
    for a kernel that divides with IEEE rounding (``div.rn.f32``) or, with
    ``ue8m0``, multiplies by ``1 / scale`` (exact for powers of two)."""
    require_tensor("x", x, dtype=(torch.bfloat16, torch.float32), contiguous=False)
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    if x.dim() == 0 or x.shape[-1] % block_size:
        raise ValueError(f"x's last dim must be a multiple of block_size {block_size}, got shape {list(x.shape)}")
    v = x.to(torch.float32).reshape(*x.shape[:-1], x.shape[-1] // block_size, block_size)
    amax = torch.clamp_min(v.abs().amax(dim=-1), AMAX_FLOOR)
    scale = amax * _f32(1.0 / FP8_MAX, x.device)
    if ue8m0:
        scale = _pow2_ceil(scale)
    q = torch.clamp(v / scale.unsqueeze(-1), -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(x.shape), scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, *, block_size: int = QUANT_BLOCK) -> torch.Tensor:
    """FP32 ``q * scale`` (``q`` e4m3 ``[..., n]``, ``scale`` FP32 ``[..., n / block_size]``)."""
    require_tensor("q", q, dtype=torch.float8_e4m3fn, contiguous=False)
    blocks = q.shape[-1] // block_size if q.dim() else 0
    require_tensor("scale", scale, dtype=torch.float32, shape=(*q.shape[:-1], blocks), contiguous=False)
    v = q.to(torch.float32).reshape(*q.shape[:-1], blocks, block_size) * scale.unsqueeze(-1)
    return v.reshape(q.shape)


# --- key LayerNorm ----------------------------------------------------------

def _partition_stats(values: torch.Tensor, partitions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per partition ``(mean, M2)`` FP32 ``[M, partitions]``: sequential sums
    from +0.0, ``mean = sum * FP32(1 / count)``, ``M2 = sum (v - mean)^2``."""
    m, n = values.shape
    count = n // partitions
    parts = values.reshape(m, partitions, count)
    total = torch.zeros(m, partitions, dtype=torch.float32, device=values.device)
    for r in range(count):
        total = total + parts[:, :, r]
    mean = total * _f32(1.0 / count, values.device)
    m2 = torch.zeros_like(mean)
    for r in range(count):
        d = parts[:, :, r] - mean
        m2 = m2 + d * d
    return mean, m2


def _combine_stats(means: torch.Tensor, m2s: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Chan's combination of equal-count partitions in partition order (the
    kernel's ``key_norm``): ``mean = (sum of means) * FP32(1/P)``, ``M2 = sum of
    (M2_c + (count * d_c) * d_c)`` with ``d_c = mean_c - mean``, from +0.0."""
    parts = means.shape[1]
    mean = means[:, 0]
    for c in range(1, parts):
        mean = mean + means[:, c]
    mean = mean * _f32(1.0 / parts, means.device)
    m2 = torch.zeros_like(mean)
    weight = _f32(float(count), means.device)
    for c in range(parts):
        d = means[:, c] - mean
        m2 = m2 + m2s[:, c] + weight * d * d
    return mean, m2


def layer_norm_stats(values: torch.Tensor, partitions: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """FP32 ``(mean [M], M2 [M])`` of FP32 ``values [M, n]`` from ``partitions``
    equal partitions' statistics (``partitions=1``: plain two-pass)."""
    require_tensor("values", values, dtype=torch.float32, shape=(None, None), contiguous=False)
    n = values.shape[1]
    if not isinstance(partitions, int) or partitions < 1 or n % partitions:
        raise ValueError(f"partitions must be a positive divisor of {n}, got {partitions!r}")
    means, m2s = _partition_stats(values, partitions)
    return _combine_stats(means, m2s, n // partitions)


def key_layer_norm(key: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, *,
                   partitions: int | None = None) -> torch.Tensor:
    """BF16 ``[M, n]`` LayerNorm of the BF16 key ``[M, n]`` with FP32 or BF16
    ``weight``/``bias [n]``: stats by :func:`layer_norm_stats` over
    ``partitions`` (default ``n // ROWS``, the fused kernel's key CTAs),
    ``rstd = rsqrt(M2 / n + eps)``, ``((v - mean) * rstd) * weight + bias`` in
    FP32, rounded once to BF16. A kernel is held to 1 BF16 ULP of this."""
    require_tensor("key", key, dtype=torch.bfloat16, shape=(None, None), contiguous=False)
    n = key.shape[1]
    require_tensor("norm_weight", weight, dtype=_WEIGHT_DTYPES, shape=(n,), contiguous=False, device=key.device)
    require_tensor("norm_bias", bias, dtype=_WEIGHT_DTYPES, shape=(n,), contiguous=False, device=key.device)
    if not (isinstance(eps, (int, float)) and eps > 0 and math.isfinite(eps)):
        raise ValueError(f"eps must be a positive finite number, got {eps!r}")
    if partitions is None:
        partitions = max(n // ROWS, 1) if n % ROWS == 0 else 1
    values = key.to(torch.float32)
    mean, m2 = layer_norm_stats(values, partitions)
    rstd = torch.rsqrt(m2 / _f32(float(n), key.device) + _f32(eps, key.device))
    out = (values - mean[:, None]) * rstd[:, None] * weight.to(torch.float32) + bias.to(torch.float32)
    return out.to(torch.bfloat16)


# --- the query epilogue and the fused op ------------------------------------

def _check_scale(scale: float) -> None:
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")


def indexer_query(q: torch.Tensor, key: torch.Tensor, weights: torch.Tensor, norm_weight: torch.Tensor,
                  norm_bias: torch.Tensor, *, eps: float, scale: float, padded: int | None = None,
                  weights_dtype: torch.dtype = torch.float32, ue8m0: bool = False,
                  partitions: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q_fp8 [M, padded, DIM] e4m3, scaled head weights [M, padded]
    weights_dtype, normed key [M, key] BF16)``: the seed's ``indexer_query``.

    Args:
        q: BF16 query, ``[M, heads, DIM]`` or ``[M, heads * DIM]`` (wq_b's output).
        key: BF16 ``[M, key]`` pre-norm key (the projection's).
        weights: FP32 ``[M, heads]`` head weights (the projection's).
        norm_weight, norm_bias: FP32 or BF16 ``[key]`` LayerNorm affine.
        eps: LayerNorm epsilon.
        scale: ``softmax_scale * heads ** -0.5`` (see ``head_weight_scale``),
            used as one FP32.
        padded: heads written, ``>= heads`` (default ``max(heads, MQA_MIN_HEADS)``);
            heads ``heads..padded-1`` are exact zeros in both outputs.
        weights_dtype: ``torch.float32`` or ``torch.bfloat16`` (rounded once).
        ue8m0: power-of-two q scales.
        partitions: LayerNorm partitions (default ``key // ROWS``).

    q is rotated by :func:`hadamard_transform` and quantized by
    :func:`quantize_fp8` with one block per head, and that head's scale ``s``
    gives ``FP32(FP32(weights * s) * FP32(scale))``. All bit-exact except the
    key (1 BF16 ULP for a kernel, see :func:`key_layer_norm`).
    """
    require_tensor("weights", weights, dtype=torch.float32, shape=(None, None), contiguous=False)
    m, heads = weights.shape
    _check_tokens("weights", weights)
    require_tensor("q", q, dtype=torch.bfloat16, contiguous=False, device=weights.device)
    if tuple(q.shape) == (m, heads * DIM):
        q = q.reshape(m, heads, DIM)
    require_tensor("q", q, shape=(m, heads, DIM), contiguous=False)
    require_tensor("key", key, dtype=torch.bfloat16, shape=(m, None), contiguous=False, device=weights.device)
    _check_scale(scale)
    padded = max(heads, MQA_MIN_HEADS) if padded is None else padded
    if not isinstance(padded, int) or padded < heads:
        raise ValueError(f"padded must be an int >= heads = {heads}, got {padded!r}")
    if weights_dtype not in _WEIGHT_DTYPES:
        raise ValueError(f"weights_dtype must be torch.float32 or torch.bfloat16, got {weights_dtype}")
    dev = weights.device

    q_fp8, q_scale = quantize_fp8(hadamard_transform(q), block_size=DIM, ue8m0=ue8m0)
    scaled = weights * q_scale[..., 0] * _f32(scale, dev)
    w_out = torch.zeros(m, padded, dtype=weights_dtype, device=dev)
    w_out[:, :heads] = scaled.to(weights_dtype)
    q_out = torch.zeros(m, padded, DIM, dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn)
    q_out[:, :heads] = q_fp8
    return q_out, w_out, key_layer_norm(key, norm_weight, norm_bias, eps, partitions=partitions)


def indexer_fused(x: torch.Tensor, weight: torch.Tensor, q: torch.Tensor, norm_weight: torch.Tensor,
                  norm_bias: torch.Tensor, *, key: int, heads: int, eps: float, scale: float,
                  padded: int | None = None, weights_dtype: torch.dtype = torch.float32,
                  ue8m0: bool = False, tactic: Tactic | None = None,
                  partitions: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q_fp8 [M, padded, DIM] e4m3, scaled head weights [M, padded],
    normed key [M, key] BF16, kpool gate [M, gate] BF16)`` as
    ``IndexerProjection.fused`` returns them: :func:`indexer_projection` (with
    ``tactic``) followed by :func:`indexer_query`; arguments as there."""
    key_pre, weights, gate = indexer_projection(x, weight, key=key, heads=heads, tactic=tactic)
    q_fp8, w_out, key_out = indexer_query(
        q, key_pre, weights, norm_weight, norm_bias, eps=eps, scale=scale, padded=padded,
        weights_dtype=weights_dtype, ue8m0=ue8m0, partitions=partitions,
    )
    return q_fp8, w_out, key_out, gate
