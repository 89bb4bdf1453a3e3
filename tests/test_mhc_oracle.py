"""The GPU test's oracle, run on the CPU: ``tests/gpu/test_all_reduce_mhc_gpu.py``
drives the kernel through probe + real calls and checks stage by stage; here
its helpers run with the reference standing in for the kernel. The checks
must pass for the reference itself (the probe identity, the stage chain, the
1-ULP norm bound) and fail for the mutations a kernel could carry (separately
rounded products, the other first-FMA contraction, the other reduction order,
a dropped fragment), so the GPU run cannot pass a wrong kernel or fail a
right one on the oracle's account."""

from __future__ import annotations

import importlib

import pytest
import torch

from kernels.lamport.diagnosis import GroupDiagnosis
from kernels.reference.mhc import all_reduce_mhc, finalize as ref_finalize

gpu = importlib.import_module("tests.gpu.test_all_reduce_mhc_gpu")
gpu.DEVICE = "cpu"


class ReferenceGroup:
    """MHCVirtualRanks' call surface, computed by the reference."""

    def __init__(self, tp, hidden, hc, rank_lanes, **mutation):
        self.tp, self.hidden_size, self.hc_mult = tp, hidden, hc
        self.rank_lanes, self.mutation = rank_lanes, mutation

    def _write(self, outs, result, what):
        res, layer = result
        if self.mutation.get("drop_fragment"):
            res, layer = res.clone(), layer.clone()
            res[..., :8] = 0
        for o in outs:
            o[0].copy_(res)
            o[1].copy_(layer)

    def _kw(self):
        kw = {k: v for k, v in self.mutation.items() if k in ("fma", "post_fma")}
        lanes = self.mutation.get("order_lanes", self.rank_lanes)
        return dict(kw, rank_lanes=lanes)

    def __call__(self, xs, residual, post, comb, pre, weight, eps, *, outs, skip_publish=()):
        self._write(outs, all_reduce_mhc(xs, residual, post, comb, pre, weight, eps,
                                         **self._kw()), "plain")

    def finalize(self, moes, residual, post, comb, pre, weight, eps, *, outs, skip_publish=()):
        self._write(outs, ref_finalize(gpu.to_partials(moes), residual, post, comb, pre, weight,
                                       eps, **self._kw()), "finalize")

    def is_all_sentinel(self):
        return True

    def diagnose(self):
        return GroupDiagnosis("ok")


H = 64  # 8 fragments


@pytest.mark.parametrize("tp, rank_lanes, hc", [(1, 1, 1), (2, 2, 4), (4, 1, 4), (4, 2, 1)])
@pytest.mark.parametrize("kind", ["random", "sentinel", "order"])
def test_reference_passes_the_gpu_checks(tp, rank_lanes, hc, kind):
    grp = ReferenceGroup(tp, H, hc, rank_lanes)
    for i, m in enumerate((1, 5)):
        xs = gpu.partials(tp, m, H, seed=i, kind=kind)
        mix = gpu.mixes(m, hc, H, seed=i, kind="sentinel" if kind == "sentinel" else "random",
                        post_3d=bool(i))
        gpu.full_case(grp, xs, mix, rank_lanes, f"{kind} tp={tp} R={rank_lanes} M={m}")
        gpu.full_finalize_case(grp, gpu.moe_outputs(tp, m, H, seed=i), mix, rank_lanes,
                               f"tp={tp} M={m}")


@pytest.mark.parametrize("mutation, tp, rank_lanes", [
    (dict(fma=False), 2, 1),          # products rounded apart from their adds
    (dict(post_fma=False), 2, 1),     # reduced * post rounded alone
    (dict(order_lanes=2), 4, 1),      # butterfly where rank order was claimed
    (dict(order_lanes=1), 4, 2),      # rank order where the butterfly was claimed
    (dict(drop_fragment=True), 2, 1),  # a fragment not computed
])
def test_gpu_checks_catch_mutations(mutation, tp, rank_lanes):
    grp = ReferenceGroup(tp, H, 4, rank_lanes, **mutation)
    m = 16
    kind = "order" if "order_lanes" in mutation else "random"
    xs = gpu.partials(tp, m, H, seed=3, kind=kind)
    mix = gpu.mixes(m, 4, H, seed=3)
    with pytest.raises(AssertionError):
        gpu.full_case(grp, xs, mix, rank_lanes, f"mutation {mutation}")


def test_probe_identity_holds_for_sentinel_streams():
    """post = 1, comb = 0 returns the reduced sum bit for bit in every stream,
    even with -0.0 / negative subnormal residual streams."""
    from kernels.reference.mhc import mhc_post_collapse, reduce_ranks
    from kernels.reference.numerics import bits

    xs = gpu.partials(4, 32, H, seed=7, kind="sentinel")
    mix = gpu.probe_mix(gpu.mixes(32, 4, H, seed=7, kind="sentinel"))
    reduced = reduce_ranks(xs)
    streams, _ = mhc_post_collapse(reduced, *mix[:4])
    for t in range(4):
        assert torch.equal(bits(streams[:, t]), bits(reduced))
