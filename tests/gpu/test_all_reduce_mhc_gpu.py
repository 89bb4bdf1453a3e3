"""AllReduceMHC on one GPU with virtual ranks (tp ranks, one stream each).

NOT YET RUN: written without GPU time (CPU session); the first run on the
H200 verifies the kernel. Run under a process timeout (a plain consumer
whose data never arrives spins forever); the watchdog tests run first, so a
protocol bug times out and is named there instead of hanging the sweep:

    timeout 900 python -m pytest -m gpu tests/gpu/test_all_reduce_mhc_gpu.py

Contract checked (docs/design.md, Numerical contract), stage by stage, each
stage fed with the kernel's own upstream output, and end to end:

1. reduced sum: a probe call with ``post = 1, comb = 0`` makes every
   ``residual_out[:, t]`` equal the BF16 all-reduced sum exactly
   (``fma(r, 1, res * 0) = r``: the product is exact and the added zero
   changes nothing, ``r`` is never -0.0); it must equal
   :func:`kernels.reference.mhc.reduce_ranks` in the kernel's order (rank
   order for rank_lanes 1, the butterfly for 2) bit for bit;
2. residual streams: bit for bit against
   :func:`kernels.reference.mhc.mhc_post_collapse` (``fma=True,
   post_fma=True``: exact-FMA emulation in float64 with error-free
   transforms) fed with the probe's reduced sum; the kernel spells every
   rounding in PTX (``mul.rn`` / ``fma.rn`` / ``cvt.rn``, counted by
   ``jobs.compile_check``), so the bound is 0 ULP;
3. layer input: within 1 BF16 ULP of an FP32 RMSNorm
   (:func:`kernels.reference.allreduce.rms_norm`) of the collapse computed
   exactly (``fma`` chain from +0.0, one BF16 rounding) from the kernel's own
   residual streams. Why 1 ULP: the kernel's square sum (per-thread FMA
   chain, warp butterfly, warps, cluster CTAs) and torch's differ in order,
   relative error <= hidden * 2^-24 (~4.4e-4 at 7168) on a sum of positive
   terms, halved by the square root, plus ``rsqrt.approx`` (<= 2^-22.9
   relative) and two ``mul.rn``: the FP32 results differ by far less than
   half a BF16 spacing (2^-9 relative), so their BF16 roundings differ by at
   most one step;
4. end to end against :func:`kernels.reference.mhc.all_reduce_mhc` /
   :func:`kernels.reference.mhc.finalize` (same bounds); every output
   element written (poisoned before each call); the mailboxes all sentinel
   after each call.
"""

from __future__ import annotations

import functools
import time

import pytest

import torch

from kernels.reference.allreduce import rms_norm
from kernels.reference.mhc import (all_reduce_mhc, finalize as ref_finalize,
                                   mhc_post_collapse, reduce_ranks)
from kernels.reference.moe import MoEPartial, finalize_payloads
from kernels.reference.numerics import (assert_all_written, assert_bit_exact,
                                        assert_within_ulp, bits, fma_f32, poison_,
                                        order_sensitive_partials, random_partials,
                                        round_bf16, sentinel_pattern_partials)
from tests.gpu import sweep

pytestmark = pytest.mark.gpu

EPS = 1e-6
CAPACITY = 64
TPS = (1, 2, 4, 8)
HCS = (1, 4)
HIDDENS = (4096, 5120, 7168)
TOKENS = (1, 5, 16, 64)
RANK_LANES = (1, 2)
TOP_K = 8
BUDGET_NS = 50_000_000  # 50 ms
DEVICE = "cuda"
"""Where inputs are made; ``tests/test_mhc_oracle.py`` runs this module's
helpers on "cpu" with the reference standing in for the kernel."""


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def lanes_tuning(hidden: int, tp: int, rank_lanes: int):
    """The table's tuning, with rank_lanes R and R times the threads (the
    same fragments a CTA, so the same trips)."""
    from kernels.all_reduce_mhc import MHCTuning, tuning_for

    base = tuning_for(hidden, tp)
    if rank_lanes == 1:
        return base
    return MHCTuning(cluster_size=base.cluster_size, threads=min(1024, base.threads * rank_lanes),
                     rank_lanes=rank_lanes)


@functools.lru_cache(maxsize=None)
def group(tp: int, hidden: int, hc: int, rank_lanes: int = 1, budget_ns: int = 0,
          tuning=None):
    from kernels.all_reduce_mhc import AllReduceMHC

    tuning = lanes_tuning(hidden, tp, rank_lanes) if tuning is None else tuning
    return AllReduceMHC.virtual_ranks(tp=tp, hidden_size=hidden, hc_mult=hc,
                                      max_num_tokens=CAPACITY, top_k=TOP_K,
                                      budget_ns=budget_ns, tuning=tuning)


# ---------------------------------------------------------------- inputs
def mixes(m, hc, hidden, seed, *, kind="random", post_3d=False):
    """(residual [m, hc, H], post, comb, pre, norm_weight) on the GPU; comb
    and post of both signs; ``kind="sentinel"`` fills the residual streams
    with -0.0 and negative subnormals (no flush to zero anywhere)."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    if kind == "sentinel":
        residual = sentinel_pattern_partials(1, m * hc, hidden, seed=seed,
                                             device=DEVICE).view(m, hc, hidden)
    else:
        residual = torch.randn(m, hc, hidden, generator=g, device=DEVICE).to(torch.bfloat16)
    post = 2 * torch.rand(m, hc, generator=g, device=DEVICE) - 0.5
    comb = torch.randn(m, hc, hc, generator=g, device=DEVICE)
    pre = torch.rand(m, hc, generator=g, device=DEVICE) + 0.1
    weight = (1 + 0.1 * torch.randn(hidden, generator=g, device=DEVICE)).to(torch.bfloat16)
    return (residual.contiguous(), post.unsqueeze(-1) if post_3d else post, comb, pre, weight)


def partials(tp, m, hidden, seed, kind="random"):
    if kind == "random":
        xs = random_partials(tp, m, hidden, seed=seed, device=DEVICE)
    elif kind == "order":
        xs = order_sensitive_partials(tp, m, hidden, device=DEVICE)
    else:
        xs = sentinel_pattern_partials(tp, m, hidden, seed=seed, device=DEVICE)
    return [x.contiguous() for x in xs]


def moe_outputs(tp, m, hidden, seed, held=0.7):
    """One MoEOutput per rank (FP32 weights, shared expert), generated on
    the GPU without a host sync; token 0 holds no route on rank 0."""
    from kernels.all_reduce_mhc import MoEOutput, RoutedExperts

    g = torch.Generator(device=DEVICE).manual_seed(seed)
    out = []
    for r in range(tp):
        rows = m * TOP_K
        gemm2 = torch.randn(rows, hidden, generator=g, device=DEVICE).to(torch.bfloat16)
        weights = torch.rand(m, TOP_K, generator=g, device=DEVICE)
        perm = torch.argsort(torch.rand(rows, generator=g, device=DEVICE)).to(torch.int32)
        keep = torch.rand(m, TOP_K, generator=g, device=DEVICE) < held
        if r == 0:
            keep[0] = False
        idx = torch.where(keep, perm.view(m, TOP_K), torch.full_like(perm.view(m, TOP_K), -1))
        shared = torch.randn(m, hidden, generator=g, device=DEVICE).to(torch.bfloat16)
        out.append(MoEOutput(RoutedExperts(gemm2, weights, idx.contiguous()), shared))
    return out


A = 1 + 2.0**-7            # BF16
B = 1 + 2.0**-23           # FP32
P = -(1 + 2.0**-7 + 2.0**-23)
"""fma(A, B, P) = 2^-30 exactly; round(A * B) + P = 0."""


def craft(xs, mix):
    """Copies of (xs, mix) whose last three tokens tell every contraction
    apart (M >= 3): token M-1 ``reduced = A, post = B, comb[0, :] = P,
    stream 0 = 1``: 2^-30 only when ``reduced * post`` is the folded product
    (``post_fma=True``); token M-2 (hc >= 2) ``post = 0``, streams (1, A),
    comb rows (P, B): 2^-30 only with the FMA chain; token M-3 (hc >= 2)
    ``post = 0``, identity comb, streams (1, A, 0, ..), pre (P, B, 0, ..): a
    collapse of 2^-30 only with the FMA collapse (else a zero row)."""
    residual, post, comb, pre, weight = (t.clone() for t in mix)
    m, hc, _ = residual.shape
    post2 = post.view(m, hc)
    xs = [x.clone() for x in xs]
    a = m - 1
    for r, x in enumerate(xs):
        x[a] = A if r == 0 else 0.0
    post2[a], comb[a], residual[a, 0] = B, 0.0, 1.0
    comb[a, 0, :] = P
    if hc >= 2:
        b, c = m - 2, m - 3
        post2[b], comb[b] = 0.0, 0.0
        comb[b, 0, :], comb[b, 1, :] = P, B
        residual[b, 0], residual[b, 1] = 1.0, A
        post2[c], comb[c], residual[c], pre[c] = 0.0, 0.0, 0.0, 0.0
        comb[c] += torch.eye(hc, device=comb.device)
        residual[c, 0], residual[c, 1] = 1.0, A
        pre[c, 0], pre[c, 1] = P, B
    return xs, (residual, post, comb, pre, weight)


def to_partials(moes):
    return [MoEPartial(x.routed.gemm2_permuted, x.routed.expert_weights,
                       x.routed.expanded_idx_to_permuted_idx, x.shared_output) for x in moes]


# ---------------------------------------------------------------- runs and checks
def poisoned_outs(tp, m, hc, hidden):
    return [(poison_(torch.empty(m, hc, hidden, dtype=torch.bfloat16, device=DEVICE)),
             poison_(torch.empty(m, hidden, dtype=torch.bfloat16, device=DEVICE)))
            for _ in range(tp)]


def run(grp, xs, mix, **kw):
    m = xs[0].shape[0] if isinstance(xs[0], torch.Tensor) else xs[0].tokens
    outs = poisoned_outs(grp.tp, m, grp.hc_mult, grp.hidden_size)
    if isinstance(xs[0], torch.Tensor):
        grp(xs, *mix, EPS, outs=outs, **kw)
    else:
        grp.finalize(xs, *mix, EPS, outs=outs, **kw)
    return outs


def probe_mix(mix):
    """post = 1, comb = 0: every residual_out stream is the reduced sum."""
    residual, post, comb, pre, weight = mix
    return residual, torch.ones_like(post), torch.zeros_like(comb), pre, weight


def collapse_of(residual_out, pre):
    """Stage 3 from the kernel's own streams: fma chain from +0.0, BF16."""
    m, hc, hidden = residual_out.shape
    acc = torch.zeros(m, hidden, dtype=torch.float32, device=residual_out.device)
    for t in range(hc):
        acc = fma_f32(residual_out[:, t].float(), pre.reshape(m, hc)[:, t:t + 1], acc)
    return round_bf16(acc)


def check_outputs(outs, reduced, mix, what, *, end_to_end=None):
    """Stages 2-3 from ``reduced`` (the kernel's own sum), and end to end."""
    residual, post, comb, pre, weight = mix
    ref_res, _ = mhc_post_collapse(reduced, residual, post, comb, pre)
    for rank, (res_out, layer) in enumerate(outs):
        assert_all_written(res_out, f"{what} rank {rank} residual_out")
        assert_all_written(layer, f"{what} rank {rank} layer_input")
        assert_bit_exact(res_out, ref_res, f"{what} rank {rank} residual_out")
        assert_within_ulp(layer, rms_norm(collapse_of(res_out, pre), weight, EPS), 1,
                          f"{what} rank {rank} layer_input vs rms_norm(collapse(residual_out))")
        if end_to_end is not None:
            assert_bit_exact(res_out, end_to_end[0], f"{what} rank {rank} residual_out e2e")
            assert_within_ulp(layer, end_to_end[1], 1, f"{what} rank {rank} layer_input e2e")


def probe_reduced(grp, xs, mix, ref_reduced, what):
    """Stage 1: the probe call; returns rank 0's reduced sum (every rank's
    is checked bit for bit against the reference's)."""
    outs = run(grp, xs, probe_mix(mix))
    sync()
    for rank, (res_out, _) in enumerate(outs):
        assert_all_written(res_out, f"{what} probe rank {rank}")
        for t in range(grp.hc_mult):
            assert_bit_exact(res_out[:, t], ref_reduced, f"{what} reduced sum rank {rank} "
                                                         f"stream {t}")
    check_outputs(outs, ref_reduced, probe_mix(mix), f"{what} probe")
    assert_clean(grp, f"{what} probe")
    return outs[0][0][:, 0].contiguous()


def assert_clean(grp, what):
    assert grp.is_all_sentinel(), f"{what}: mailbox not all sentinel"
    d = grp.diagnose()
    assert d.ok, f"{what}: {d.summary()}"


def full_case(grp, xs, mix, rank_lanes, what):
    """Probe, then the real mixes: stages 1-4 and the mailbox; with M >= 3
    the last three tokens are :func:`craft`-ed."""
    if xs[0].shape[0] >= 3:
        xs, mix = craft(xs, mix)
    ref_reduced = reduce_ranks(xs, rank_lanes=rank_lanes)
    reduced = probe_reduced(grp, xs, mix, ref_reduced, what)
    outs = run(grp, xs, mix)
    sync()
    e2e = all_reduce_mhc(xs, *mix, EPS, rank_lanes=rank_lanes)
    check_outputs(outs, reduced, mix, what, end_to_end=e2e)
    assert_clean(grp, what)
    return outs


def full_finalize_case(grp, moes, mix, rank_lanes, what):
    payloads = finalize_payloads(to_partials(moes), fma=True)
    ref_reduced = reduce_ranks(payloads, rank_lanes=rank_lanes)
    reduced = probe_reduced(grp, moes, mix, ref_reduced, f"{what} finalize")
    outs = run(grp, moes, mix)
    sync()
    e2e = ref_finalize(to_partials(moes), *mix, EPS, rank_lanes=rank_lanes)
    check_outputs(outs, reduced, mix, f"{what} finalize", end_to_end=e2e)
    assert_clean(grp, f"{what} finalize")
    return outs


# --------------------------------------------------------------- watchdog first
@pytest.mark.parametrize("tp", TPS)
def test_watchdog_variant_smoke(tp):
    """Both kinds of call on the watchdog consumer first (cluster 5 at 5120,
    7 at 7168): a protocol bug times out here instead of hanging later."""
    for hidden in (5120, 7168):
        grp = group(tp, hidden, 4, 1, BUDGET_NS)
        for i, m in enumerate((1, 5, CAPACITY)):
            what = f"watchdog smoke tp={tp} H={hidden} M={m}"
            full_case(grp, partials(tp, m, hidden, seed=i), mixes(m, 4, hidden, seed=i), 1, what)
            full_finalize_case(grp, moe_outputs(tp, m, hidden, seed=i),
                               mixes(m, 4, hidden, seed=i + 50), 1, what)


@pytest.mark.parametrize("rank_lanes", RANK_LANES)
def test_watchdog_names_the_missing_rank_cluster_does_not_deadlock(rank_lanes):
    """tp=4, hidden 7168 (a cluster of 7 CTAs): rank 2 skips its publish.
    Every consumer gives up within the budget (no CTA of a cluster left
    waiting at a cluster barrier), the group view names rank 2, every
    output is written (NaN), recover() scrubs, and the next call is
    bit-exact; both call kinds."""
    tp, hidden, hc, m = 4, 7168, 4, 16
    grp = group(tp, hidden, hc, rank_lanes, BUDGET_NS)
    grp.recover()
    xs, mix = partials(tp, m, hidden, seed=11), mixes(m, hc, hidden, seed=11)
    full_case(grp, xs, mix, rank_lanes, "before fault")
    for kind in ("plain", "finalize"):
        args = xs if kind == "plain" else moe_outputs(tp, m, hidden, seed=12)
        t0 = time.perf_counter()
        outs = run(grp, args, mix, skip_publish=(2,))
        sync()
        elapsed = time.perf_counter() - t0
        d = grp.diagnose()
        print(f"\nmhc watchdog {kind} R={rank_lanes}: budget {BUDGET_NS / 1e6:.0f} ms, "
              f"returned in {elapsed * 1e3:.1f} ms; {d.summary()}; records per rank "
              f"{[e.count for e in grp.errors()]}")
        assert elapsed < 10 * BUDGET_NS / 1e9 + 1.0, f"watchdog call took {elapsed:.3f} s"
        assert d.missing_ranks == {2} and d.stale_ranks == {2}, d.summary()
        assert "missing ranks: {2}" in d.summary()
        for e in grp.errors():
            assert e.count > 0 and e.records, e
            assert all(r.missing for r in e.records), e
        for rank, (res_out, layer) in enumerate(outs):
            assert_all_written(res_out, f"timeout rank {rank} residual_out")
            assert_all_written(layer, f"timeout rank {rank} layer_input")
            assert torch.isnan(res_out.float()).all(), "every fragment lacks rank 2's part"
            assert torch.isnan(layer.float()).all(), "a timed-out token's layer input is NaN"
        assert not grp.is_all_sentinel(), "unconsumed writes expected before recover()"
        grp.recover()
        assert_clean(grp, "after recover")
        full_case(grp, partials(tp, m, hidden, seed=13), mix, rank_lanes,
                  f"{kind} after recover")


def test_one_fragment_times_out_in_one_cta_of_the_cluster():
    """tp=1, hidden 5120 (cluster of 5): one fragment of token 1 carries an
    unsanitized -0.0 lane (written straight into the mailbox, publish
    skipped), so one thread of one CTA times out while the other four CTAs
    wait for it at the cluster barrier. It is reported as unsanitized (not
    missing) with its token, source and fragment; only that fragment's
    streams are NaN; token 1's whole layer input is NaN (the NaN square sum
    reaches every CTA through DSMEM); the other tokens are exact."""
    tp, hidden, hc, m, frag = 1, 5120, 4, 3, 600  # fragment 600: cluster CTA 4
    grp = group(tp, hidden, hc, 1, BUDGET_NS)
    grp.recover()
    xs, mix = partials(tp, m, hidden, seed=41), mixes(m, hc, hidden, seed=41)
    stage = grp.ranks[0].mailbox.stage_state.tolist()[0]
    payload = xs[0].clone()
    payload[payload == 0] = 1.0
    payload[1, frag * 8 + 3] = -0.0
    grp.ranks[0].mailbox.buffer[stage, 0, :m].copy_(payload)
    outs = run(grp, xs, mix, skip_publish=(0,))
    sync()
    d = grp.diagnose()
    print(f"\nmhc unsanitized: {d.summary()}")
    assert d.unsanitized_ranks == {0} and not d.missing_ranks, d.summary()
    (rec,) = grp.errors()[0].records
    assert (rec.token, rec.source, rec.fragment) == (1, 0, frag) and not rec.missing
    res_out, layer = outs[0]
    assert_all_written(res_out, "residual_out")
    assert_all_written(layer, "layer_input")
    bad = torch.zeros(m, hidden, dtype=torch.bool, device=DEVICE)
    bad[1, frag * 8:(frag + 1) * 8] = True
    for t in range(hc):
        assert torch.equal(torch.isnan(res_out[:, t].float()), bad), f"stream {t} NaN mask"
    assert torch.isnan(layer[1].float()).all()
    ref_res, ref_layer = all_reduce_mhc([payload], *mix, EPS)
    for tok in (0, 2):
        assert_bit_exact(res_out[tok], ref_res[tok], f"token {tok} residual_out")
        assert_within_ulp(layer[tok], ref_layer[tok], 1, f"token {tok} layer_input")
    grp.recover()
    assert_clean(grp, "after recover")


def test_corrupt_stage_is_flagged_without_wild_stores():
    tp, hidden, hc, m = 2, 5120, 4, 4
    grp = group(tp, hidden, hc, 1, BUDGET_NS)
    grp.recover()
    xs, mix = partials(tp, m, hidden, seed=31), mixes(m, hc, hidden, seed=31)
    grp.ranks[1].mailbox.stage_state[1] = 7  # NEXT_STAGE out of range
    outs = run(grp, xs, mix)
    sync()
    d = grp.diagnose()
    print(f"\nmhc corrupt stage: {d.summary()}")
    assert d.bad_stage_ranks == {1} and d.kind == "bad_stage", d.summary()
    assert "stage_state corrupt on rank 1" in d.summary()
    for r in grp.ranks:  # rank 1 stored nothing anywhere
        plane = r.mailbox.buffer[:, 1].view(torch.int16)
        assert bool((plane == -32768).all()), f"rank 1 wrote into rank {r.rank}'s mailbox"
    assert torch.isnan(outs[1][0].float()).all() and torch.isnan(outs[1][1].float()).all()
    grp.recover()
    full_case(grp, xs, mix, 1, "after corrupt-stage recover")


@pytest.mark.parametrize("kind", ["sentinel", "order"])
@pytest.mark.parametrize("rank_lanes", RANK_LANES)
def test_sentinel_like_payload_and_order(kind, rank_lanes):
    """-0.0 and negative subnormals in every partial (and, for "sentinel", in
    the residual streams: no flush to zero), on the watchdog build so a
    mistaken sentinel test fails instead of hanging; order-sensitive
    partials (2^24, 1, -2^24) tell rank order from the butterfly."""
    tp, hidden, hc = 4, 5120, 4
    grp = group(tp, hidden, hc, rank_lanes, BUDGET_NS)
    grp.recover()
    for m in (1, 5, CAPACITY):
        xs = partials(tp, m, hidden, seed=m, kind=kind)
        mix = mixes(m, hc, hidden, seed=m, kind="sentinel" if kind == "sentinel" else "random")
        full_case(grp, xs, mix, rank_lanes, f"{kind} R={rank_lanes} M={m}")
        if kind == "order":
            other = reduce_ranks(xs, rank_lanes=2 if rank_lanes == 1 else 1)
            assert not torch.equal(bits(other), bits(reduce_ranks(xs, rank_lanes=rank_lanes)))


# --------------------------------------------------------------- contract sweep
@sweep.parametrize("tp, hidden, hc, rank_lanes", TPS, HIDDENS, HCS, RANK_LANES,
                   default=lambda tp, hidden, hc, rank_lanes: hidden == 7168 and hc == 4
                   and (rank_lanes == 1 or tp == 8))
def test_contract(tp, hidden, hc, rank_lanes):
    """tp {1,2,4,8} x hidden {4096, 5120, 7168} x hc {1, 4} x tokens
    {1, 5, 16, 64} x rank_lanes {1, 2}: stages 1-4 (module docstring)."""
    if tp % rank_lanes:
        pytest.skip(f"rank_lanes={rank_lanes} needs tp divisible by it (tp={tp})")
    grp = group(tp, hidden, hc, rank_lanes)
    for i, m in enumerate(TOKENS):
        what = f"tp={tp} H={hidden} hc={hc} R={rank_lanes} M={m}"
        full_case(grp, partials(tp, m, hidden, seed=1000 * tp + i),
                  mixes(m, hc, hidden, seed=i, post_3d=bool(i % 2)), rank_lanes, what)


@pytest.mark.parametrize("tp", [2, 8])
@pytest.mark.parametrize("hidden", [5120, 7168])
def test_finalize_contract(tp, hidden):
    grp = group(tp, hidden, 4)
    for i, m in enumerate(TOKENS):
        full_finalize_case(grp, moe_outputs(tp, m, hidden, seed=i),
                           mixes(m, 4, hidden, seed=i), 1, f"tp={tp} H={hidden} M={m}")


@pytest.mark.parametrize("hidden, tuning_args", [
    (4096, dict(cluster_size=1, threads=128, rank_lanes=1)),    # no cluster, 4 trips
    (7168, dict(cluster_size=2, threads=256, rank_lanes=4)),    # 7 trips, 4 lanes
    (5120, dict(cluster_size=5, threads=1024, rank_lanes=8)),   # 8 lanes
    (2056, dict(cluster_size=3, threads=96, rank_lanes=1)),     # partial last trip
    (1000, dict(cluster_size=1, threads=32, rank_lanes=2)),     # tiny, 8 trips
])
def test_other_geometries(hidden, tuning_args):
    """Any hidden that is a multiple of 8, any tuning the kernel takes."""
    from kernels.all_reduce_mhc import MHCTuning

    tp = 8
    tuning = MHCTuning(**tuning_args)
    grp = group(tp, hidden, 4, tuning.rank_lanes, 0, tuning)
    for i, m in enumerate((1, 16)):
        full_case(grp, partials(tp, m, hidden, seed=i), mixes(m, 4, hidden, seed=i),
                  tuning.rank_lanes, f"H={hidden} {tuning_args} M={m}")


# --------------------------------------------------------------- no host sync
@sweep.parametrize("tp, rank_lanes", [(2, 1), (8, 1), (8, 2)], default=lambda tp, rank_lanes: tp == 2)
def test_many_calls_without_host_sync(tp, rank_lanes):
    """120 calls on one group, plain and finalize alternating, M varying,
    residual_out fed back as the next residual, with torch's sync debug mode
    set to "error" around the calls (inputs are generated beforehand)."""
    hidden, hc, calls = 4096, 4, 120
    grp = group(tp, hidden, hc, rank_lanes)
    grp.recover()
    pattern = (27, 11, 64, 1, 16, 5, 2)
    g = torch.Generator(device=DEVICE).manual_seed(9)
    residual = torch.randn(CAPACITY, hc, hidden, generator=g, device=DEVICE).to(torch.bfloat16)
    plan = []
    for call in range(calls):
        m = pattern[call % len(pattern)]
        kind = "finalize" if call % 2 else "plain"
        args = (moe_outputs(tp, m, hidden, seed=call) if kind == "finalize"
                else partials(tp, m, hidden, seed=call))
        _, post, comb, pre, weight = mixes(m, hc, hidden, seed=call)
        outs = [(torch.empty(m, hc, hidden, dtype=torch.bfloat16, device=DEVICE),
                 torch.empty(m, hidden, dtype=torch.bfloat16, device=DEVICE))
                for _ in range(tp)]
        plan.append((kind, m, args, (post, comb, pre, weight), outs))
    sync()
    history = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for kind, m, args, (post, comb, pre, weight), outs in plan:
            res_in = residual[:m]
            if kind == "plain":
                grp(args, res_in, post, comb, pre, weight, EPS, outs=outs)
            else:
                grp.finalize(args, res_in, post, comb, pre, weight, EPS, outs=outs)
            history.append((kind, args, (res_in, post, comb, pre, weight), outs))
            residual = torch.cat([outs[0][0], residual[m:]]) if m < CAPACITY else outs[0][0]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    sync()
    for call, (kind, args, mix, outs) in enumerate(history):
        if kind == "plain":
            e2e = all_reduce_mhc(args, *mix, EPS, rank_lanes=rank_lanes)
            reduced = reduce_ranks(args, rank_lanes=rank_lanes)
        else:
            e2e = ref_finalize(to_partials(args), *mix, EPS, rank_lanes=rank_lanes)
            reduced = reduce_ranks(finalize_payloads(to_partials(args), fma=True),
                                   rank_lanes=rank_lanes)
        check_outputs(outs, reduced, mix, f"call {call} {kind}", end_to_end=e2e)
    assert_clean(grp, f"after {calls} calls")
    stages = {tuple(r.mailbox.stage_state.tolist()) for r in grp.ranks}
    assert len(stages) == 1, stages


# --------------------------------------------------------------- CUDA graphs
def test_cuda_graph_replay_with_new_data():
    """One graph holding a plain and a finalize call; replays with new data
    equal eager calls bit for bit and the references."""
    tp, hidden, hc, m = 4, 5120, 4, 16
    grp = group(tp, hidden, hc)
    grp.recover()
    xs = partials(tp, m, hidden, seed=3)
    moes = moe_outputs(tp, m, hidden, seed=3)
    mix = mixes(m, hc, hidden, seed=3)
    s_plain = poisoned_outs(tp, m, hc, hidden)
    s_fin = poisoned_outs(tp, m, hc, hidden)

    def step():
        grp(xs, *mix, EPS, outs=s_plain)
        grp.finalize(moes, *mix, EPS, outs=s_fin)

    step()  # warm-up (module load)
    sync()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed in range(30, 35):
        for s, n in zip(xs, partials(tp, m, hidden, seed=seed)):
            s.copy_(n)
        for s, n in zip(moes, moe_outputs(tp, m, hidden, seed=seed)):
            for a, b in zip(s.tensors(), n.tensors()):
                a.copy_(b)
        for s, n in zip(mix, mixes(m, hc, hidden, seed=seed)):
            s.copy_(n)
        for pair in s_plain + s_fin:
            for t in pair:
                poison_(t)
        graph.replay()
        sync()
        assert_clean(grp, f"graph seed {seed}")
        eager_plain = run(grp, xs, mix)
        eager_fin = run(grp, moes, mix)
        sync()
        for rank in range(tp):
            for a, b, name in ((s_plain, eager_plain, "plain"), (s_fin, eager_fin, "finalize")):
                assert_bit_exact(a[rank][0], b[rank][0], f"graph {name} residual_out {rank}")
                assert_bit_exact(a[rank][1], b[rank][1], f"graph {name} layer_input {rank}")
        check_outputs(s_plain, reduce_ranks(xs), mix, f"graph seed {seed} plain",
                      end_to_end=all_reduce_mhc(xs, *mix, EPS))
        check_outputs(s_fin, reduce_ranks(finalize_payloads(to_partials(moes), fma=True)), mix,
                      f"graph seed {seed} finalize",
                      end_to_end=ref_finalize(to_partials(moes), *mix, EPS))
        assert_clean(grp, f"graph seed {seed} eager")


# --------------------------------------------------------------- API and placements
def test_single_rank_api_and_validation_before_launch():
    from kernels.all_reduce_mhc import AllReduceMHC

    hidden, hc, m = 7168, 4, 8
    op = AllReduceMHC(hidden_size=hidden, hc_mult=hc, max_num_tokens=CAPACITY, top_k=TOP_K)
    assert op.tp == 1 and op.tuning.cluster_size == 7
    xs, mix = partials(1, m, hidden, seed=8), mixes(m, hc, hidden, seed=8, post_3d=True)
    res_out, layer = op(xs[0], *mix, EPS)
    sync()
    e2e = all_reduce_mhc(xs, *mix, EPS)
    check_outputs([(res_out, layer)], reduce_ranks(xs), mix, "tp=1 __call__", end_to_end=e2e)
    (moe,) = moe_outputs(1, m, hidden, seed=9)
    r = moe.routed
    res_out, layer = op.finalize(r.gemm2_permuted, r.expert_weights,
                                 r.expanded_idx_to_permuted_idx, moe.shared_output, *mix, EPS)
    sync()
    check_outputs([(res_out, layer)], finalize_payloads(to_partials([moe]), fma=True)[0], mix,
                  "tp=1 finalize", end_to_end=ref_finalize(to_partials([moe]), *mix, EPS))
    assert op.mailbox.is_all_sentinel() and op.diagnose().ok
    before = op.mailbox.stage_state.tolist()
    residual, post, comb, pre, weight = mix
    bad = [
        ("x must have shape", lambda: op(xs[0][:, :-8], *mix, EPS)),
        ("residual must have shape", lambda: op(xs[0], residual[:, :2], post, comb, pre,
                                                weight, EPS)),
        ("post must have shape", lambda: op(xs[0], residual, post[:, :2].contiguous(), comb, pre, weight,
                                            EPS)),
        ("comb must be torch.float32", lambda: op(xs[0], residual, post, comb.double(), pre,
                                                  weight, EPS)),
        ("pre must have shape", lambda: op(xs[0], residual, post, comb, pre[:1], weight, EPS)),
        ("norm_weight must be torch.bfloat16", lambda: op(xs[0], residual, post, comb, pre,
                                                          weight.float(), EPS)),
        ("norm_eps must be", lambda: op(xs[0], *mix, 0.0)),
        (r"x.shape\[0\] \(tokens\) must be in", lambda: op(
            torch.zeros(CAPACITY + 1, hidden, dtype=torch.bfloat16, device=DEVICE), *mix, EPS)),
        ("expert_weights must be torch.float32", lambda: op.finalize(
            r.gemm2_permuted, r.expert_weights.bfloat16(), r.expanded_idx_to_permuted_idx,
            moe.shared_output, *mix, EPS)),
        ("expanded_idx_to_permuted_idx must be torch.int32", lambda: op.finalize(
            r.gemm2_permuted, r.expert_weights, r.expanded_idx_to_permuted_idx.long(),
            moe.shared_output, *mix, EPS)),
        ("gemm2_permuted must have shape", lambda: op.finalize(
            r.gemm2_permuted[:, 8:], r.expert_weights, r.expanded_idx_to_permuted_idx,
            moe.shared_output, *mix, EPS)),
    ]
    for match, call in bad:
        with pytest.raises(ValueError, match=match):
            call()
    sync()
    assert op.mailbox.stage_state.tolist() == before, "a rejected call launched something"
    assert op.mailbox.is_all_sentinel()


def test_external_peer_table_placement():
    """Mailbox.from_peer_table (the CUDA-IPC / external placement) at tp=1."""
    from kernels.all_reduce_mhc import AllReduceMHC
    from kernels.lamport.mailbox import Mailbox
    from kernels.lamport.protocol import mailbox_shape

    hidden, hc = 4096, 4
    buf = torch.empty(mailbox_shape(1, CAPACITY, hidden), dtype=torch.bfloat16, device=DEVICE)
    box = Mailbox.from_peer_table(rank=0, tp=1, capacity=CAPACITY, hidden=hidden, buffer=buf,
                                  peers=[buf.data_ptr()])
    op = AllReduceMHC(hidden_size=hidden, hc_mult=hc, max_num_tokens=CAPACITY, mailbox=box,
                      budget_ns=BUDGET_NS)
    for m in (1, CAPACITY, 5):
        xs, mix = partials(1, m, hidden, seed=m), mixes(m, hc, hidden, seed=m)
        out = poisoned_outs(1, m, hc, hidden)[0]
        op(xs[0], *mix, EPS, out=out)
        sync()
        check_outputs([out], reduce_ranks(xs), mix, f"peer table M={m}",
                      end_to_end=all_reduce_mhc(xs, *mix, EPS))
        assert op.mailbox.is_all_sentinel() and op.diagnose().ok


def test_multicast_refused_without_opt_in():
    from kernels.all_reduce_mhc import AllReduceMHC

    with pytest.raises(RuntimeError, match="transport='multicast' refused"):
        AllReduceMHC(hidden_size=4096, hc_mult=4, max_num_tokens=8, transport="multicast")


def test_symmetric_memory_group_of_one():
    """The process-group placement (torch symmetric memory) with world size 1."""
    import os
    import socket

    import torch.distributed as dist

    from kernels.all_reduce_mhc import AllReduceMHC

    created = False
    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("nccl", rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
        created = True
    try:
        hidden, hc = 5120, 4
        op = AllReduceMHC(hidden_size=hidden, hc_mult=hc, max_num_tokens=32, top_k=TOP_K,
                          group=dist.group.WORLD, budget_ns=BUDGET_NS)
        assert op.tp == 1 and op.rank == 0
        for m in (1, 32, 5):
            xs, mix = partials(1, m, hidden, seed=m), mixes(m, hc, hidden, seed=m)
            out = poisoned_outs(1, m, hc, hidden)[0]
            op(xs[0], *mix, EPS, out=out)
            sync()
            check_outputs([out], reduce_ranks(xs), mix, f"symmetric M={m}",
                          end_to_end=all_reduce_mhc(xs, *mix, EPS))
            assert op.mailbox.is_all_sentinel()
        assert op.diagnose().ok
        op.recover()
    finally:
        if created:
            dist.destroy_process_group()
