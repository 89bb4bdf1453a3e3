"""cluster.bits' numpy BF16 conversions, which the emulated ranks sum with
instead of torch: bit for bit what torch's CPU casts give, NaN made
canonical."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.bits import BF16_NAN_BITS, bf16_bits_from_f32, f32_from_bf16_bits

EDGES = [0x0000_0000, 0x8000_0000, 0x0000_0001, 0x8000_0001, 0x007F_FFFF, 0x0000_8000,
         0x0001_8000, 0x3F80_8000, 0x3F81_8000, 0x3F80_7FFF, 0x3F80_8001, 0x7F7F_FFFF,
         0xFF7F_FFFF, 0x7F7F_7FFF, 0x7F80_0000, 0xFF80_0000, 0x7FC0_0000, 0xFFFF_FFFF,
         0x7F80_0001, 0xFF80_8000]
"""Zeros, subnormals, ties to even both ways, the overflow edge, infinities, NaNs."""


def torch_bf16_bits(words: np.ndarray) -> np.ndarray:
    f = torch.from_numpy(words.astype(np.uint32).view(np.int32).copy()).view(torch.float32)
    return f.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def test_every_bf16_pattern_widens_exactly():
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    want = torch.from_numpy(every.view(np.int16).copy()).view(torch.bfloat16).float()
    got = f32_from_bf16_bits(every)
    assert np.array_equal(got.view(np.uint32), want.numpy().view(np.uint32))


def check_rounding(words: np.ndarray) -> None:
    got = bf16_bits_from_f32(words.astype(np.uint32).view(np.float32))
    want = torch_bf16_bits(words)
    nan = np.isnan(words.astype(np.uint32).view(np.float32))
    assert np.array_equal(got[~nan], want[~nan]), words[~nan][got[~nan] != want[~nan]]
    assert (got[nan] == BF16_NAN_BITS).all()


def test_rounding_edges_match_torch():
    check_rounding(np.array(EDGES, dtype=np.uint32))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 0xFFFF_FFFF), min_size=1, max_size=64))
def test_rounding_of_any_fp32_pattern_matches_torch(words):
    check_rounding(np.array(words, dtype=np.uint32))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 0xFFFF), min_size=8, max_size=8), min_size=1, max_size=8))
def test_an_fp32_sum_of_bf16_rows_matches_torchs(rows):
    """The emulated consume's sum (FP32 from +0.0 in source order, then one
    rounding) against the same in torch."""
    bits = np.array(rows, dtype=np.uint16)
    acc = np.zeros(8, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for row in bits:
            acc = acc + f32_from_bf16_bits(row)
    ref = torch.zeros(8)
    for row in bits:
        ref = ref + torch.from_numpy(row.view(np.int16).copy()).view(torch.bfloat16).float()
    check_rounding(ref.numpy().view(np.uint32))
    assert np.array_equal(acc.view(np.uint32)[~np.isnan(acc)],
                          ref.numpy().view(np.uint32)[~np.isnan(acc)])
    assert np.array_equal(np.isnan(acc), ref.isnan().numpy())
