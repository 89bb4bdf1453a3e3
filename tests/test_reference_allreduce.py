"""all_reduce_norm and embed_norm references: identities, contract, validation."""

import pytest
import torch

from kernels.reference import numerics as nm
from kernels.reference.allreduce import add_residual, all_reduce_norm, all_reduce_sum, rms_norm
from kernels.reference.embed import embed_norm, embedding_payload


def _weights(h, seed=0):
    return (torch.randn(h, generator=torch.Generator().manual_seed(seed)) * 0.1 + 1).to(torch.bfloat16)


def test_single_rank_sum_is_the_partial():
    p = nm.random_partials(1, 5, 64, seed=3)
    assert torch.equal(all_reduce_sum(p).view(torch.int16), p[0].view(torch.int16))


def test_sum_rounds_once_not_per_rank():
    # 1 + 2^-8 + 2^-8 in FP32 is 1 + 2^-7 exactly; rounding per hop to BF16
    # (as NCCL's ring does) would lose both halves-ULPs and give 1.
    parts = torch.tensor([[[1.0]], [[2.0**-8]], [[2.0**-8]]]).expand(3, 1, 8).to(torch.bfloat16)
    assert all_reduce_sum(parts)[0, 0].item() == 1 + 2.0**-7
    per_hop = parts[0].clone()
    for r in (1, 2):
        per_hop = (per_hop.float() + parts[r].float()).to(torch.bfloat16)
    assert per_hop[0, 0].item() == 1.0


def test_sentinel_payload_sums_to_plus_zero_not_sentinel():
    p = torch.full((2, 1, 8), -0.0, dtype=torch.bfloat16)
    s = all_reduce_sum(p)
    assert (nm.bits(s) == 0).all()  # +0.0 from the +0.0 start, never 0x8000


def test_all_reduce_norm_composes_its_stages():
    p = nm.random_partials(4, 6, 128, seed=5)
    res = nm.random_partials(1, 6, 128, seed=6)[0]
    w = _weights(128)
    norm_out, residual_out = all_reduce_norm(p, res, w, 1e-6)
    nm.assert_bit_exact(residual_out, add_residual(all_reduce_sum(p), res), "residual_out")
    nm.assert_bit_exact(norm_out, rms_norm(residual_out, w, 1e-6), "norm_out")
    # RMSNorm of the FP64 computation is within 1 BF16 ULP.
    x = residual_out.double()
    exact = x / torch.sqrt(x.square().mean(-1, keepdim=True) + 1e-6) * w.double()
    nm.assert_within_ulp(norm_out, exact, 1, "norm_out vs fp64")


def test_list_and_stacked_partials_agree():
    p = nm.random_partials(3, 2, 16, seed=7)
    assert torch.equal(all_reduce_sum(list(p)).view(torch.int16), all_reduce_sum(p).view(torch.int16))


@pytest.mark.parametrize("bad, match", [
    (lambda p, r, w: (p[:, :, :12], r[:, :12], w[:12]), "hidden size"),
    (lambda p, r, w: (p.float(), r, w), "partials must be torch.bfloat16"),
    (lambda p, r, w: (p, r[:1], w), "residual must have shape"),
    (lambda p, r, w: (p, r, w[:8]), "norm_weight must have shape"),
    (lambda p, r, w: (p, r.float(), w), "residual must be torch.bfloat16"),
])
def test_bad_input_names_the_argument(bad, match):
    p, r, w = nm.random_partials(2, 3, 16), torch.zeros(3, 16, dtype=torch.bfloat16), _weights(16)
    with pytest.raises(ValueError, match=match):
        all_reduce_norm(*bad(p, r, w), 1e-6)


def test_bad_order_rejected():
    with pytest.raises(ValueError, match="permutation"):
        all_reduce_sum(nm.random_partials(3, 1, 8), order=[0, 0, 1])


# --- embed_norm ------------------------------------------------------------

def _shards(tp, rows, h):
    return [(nm.random_partials(1, rows, h, seed=40 + r)[0], r * rows) for r in range(tp)]


def test_embed_payload_owns_only_its_rows_and_sanitizes():
    w = torch.full((4, 8), -0.0, dtype=torch.bfloat16)
    ids = torch.tensor([3, 4, 6, 7, 8], dtype=torch.int32)
    out = embedding_payload(ids, w, start=4)
    assert (nm.bits(out) == 0).all()  # owned rows sanitized to +0.0, others +0.0


def test_embed_norm_is_the_norm_of_the_owner_row():
    h, rows, tp = 16, 4, 2
    shards = _shards(tp, rows, h)
    ids = torch.tensor([0, 3, 4, 7], dtype=torch.int32)
    pos = torch.tensor([5, 0, 1, 2], dtype=torch.int64)
    prev = nm.random_partials(1, 4, h, seed=50)[0]
    en, hn = _weights(h, 1), _weights(h, 2)
    out = embed_norm(ids, pos, prev, shards, en, hn, 1e-5)
    table = torch.cat([w for w, _ in shards])
    emb = table[ids.long()]
    emb[1] = 0  # position 0
    nm.assert_bit_exact(out[:, :h], rms_norm(emb, en, 1e-5), "enorm half")
    nm.assert_bit_exact(out[:, h:], rms_norm(prev, hn, 1e-5), "hnorm half")
    assert (nm.bits(out[1, :h]) == 0).all()


def test_embed_rejects_overlapping_shards_and_bad_ids():
    h = 8
    w = torch.zeros(4, h, dtype=torch.bfloat16)
    args = dict(positions=torch.zeros(1, dtype=torch.int64), previous=torch.zeros(1, h, dtype=torch.bfloat16),
                enorm=torch.ones(h, dtype=torch.bfloat16), hnorm=torch.ones(h, dtype=torch.bfloat16), eps=1e-5)
    with pytest.raises(ValueError, match="overlap"):
        embed_norm(torch.zeros(1, dtype=torch.int32), shards=[(w, 0), (w, 2)], **args)
    with pytest.raises(ValueError, match="ids must be torch.int32"):
        embed_norm(torch.zeros(1, dtype=torch.int64), shards=[(w, 0)], **args)
    with pytest.raises(ValueError, match="hidden size"):
        embed_norm(torch.zeros(1, dtype=torch.int32), shards=[(torch.zeros(4, 12, dtype=torch.bfloat16), 0)],
                   **{**args, "previous": torch.zeros(1, 12, dtype=torch.bfloat16),
                      "enorm": torch.ones(12, dtype=torch.bfloat16), "hnorm": torch.ones(12, dtype=torch.bfloat16)})
