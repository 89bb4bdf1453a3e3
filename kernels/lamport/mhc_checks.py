"""``all_reduce_mhc``'s ``jobs compile-check`` variants and the PTX check of
the mHC consumer (:mod:`kernels.lamport.mhc`).

Variants, each compiled for every requested arch:
- the consumer for every requested (hidden, tp) with the tuning table's
  geometry (:func:`kernels.lamport.mhc_tuning.tuning_for`), hc 4, plain;
  its watchdog build at the largest requested tp, and at every tp for
  hidden 5120 and 7168 (or the first requested hidden);
- rank lanes 2, 4, 8 (those dividing tp; threads scaled by R so the trips
  stay those of the table) at hidden 5120 and 7168 (or the first requested
  hidden), watchdog builds (their timeout records name a run-time source
  rank);
- hc 1 for every tp (plain), and a cluster of one CTA with two trips at
  hidden 2048 (plain and watchdog: no cluster barrier, no DSMEM);
- the publishes ``AllReduceMHC`` launches, for every tp and both transports:
  the plain publish and the seed's finalize publish (8-byte fragments, FP32
  weights, top_k 8, shared expert after the PDL wait), checked as those of
  ``all_reduce_norm`` / ``finalize_publish`` (unicast/multicast twins).

Consumer checks (:func:`check_mhc_consumer`), on the kernel's instruction
lines, with the counts derived from the geometry (T trips, W = tp / R
waves, hc streams):
- every plain global load (``ld.global.v4``: gamma + hc residual fragments a
  trip; ``ld.global.f32``: the ``hc^2 + 2 hc`` mixes) before
  ``griddepcontrol.wait``, none after it;
- ``wait`` < volatile stage load < spins (``ld.volatile.global.v4``, T*W)
  < NEXT_STAGE store < ``launch_dependents`` < sentinel stores (T*W) <
  output stores (T*(hc + 1) ``st.global.v4``);
- the arithmetic the reference models, exactly: T*8*(hc^2 + hc + 1)
  ``fma.rn.f32`` (mix, collapse, squares), T*(8 hc + 16) ``mul.rn.f32``,
  T*(12 + 4 hc) ``cvt.rn.bf16x2.f32``, T*8*log2(R) + 5 ``shfl.sync.bfly``,
  one ``div.rn.f32`` for the mean (a multiply by 2^-k where hidden is
  2^k), and no other contractible ``add/sub/mul/fma.f32`` without ``.rn``;
- cluster builds: ``barrier.cluster.arrive.relaxed`` before the PDL wait,
  then after the sentinel stores ``barrier.cluster.wait`` < ``mapa`` <
  ``st.shared::cluster.f32`` < ``barrier.cluster.arrive`` <
  ``barrier.cluster.wait``, once each, before the layer-input store; builds
  of one CTA: no cluster or DSMEM op;
- one ``bar.sync``; one ``ret``, the last instruction, and no ``exit`` or
  ``trap`` (no early return, in the watchdog variant too);
- ``%globaltimer`` and the ``atom.global.add`` record append only in
  watchdog builds; no ``multimem.st``.
"""

from __future__ import annotations

import dataclasses
import functools
import re

from kernels.ptx_checks import Variant

from .compile_variants import CHECK_BUDGET_NS, finalize_publish_variant, publish_variant
from .mhc import MHCConfig, compile_mhc
from .mhc_tuning import ARCHS, MHCTuning, tuning_for
from .protocol import MAX_THREADS, VEC_BF16

CHECK_HC = 4
LANE_HIDDENS = (5120, 7168)
ONE_CTA_HIDDEN = 2048
MHC_FINALIZE_TOP_K = 8


def _ops(lines, prefix):
    pat = re.compile(r"^\s*(?:@%?!?\w+\s+)?" + re.escape(prefix))
    return [i for i, ln in enumerate(lines) if pat.match(ln)]


def _first(lines, pattern, start=0):
    return next((i for i in range(start, len(lines)) if pattern in lines[i]), -1)


def expected_counts(c: MHCConfig) -> dict[str, int]:
    """Instruction counts of one consumer build (see the module docstring)."""
    k = c.kernel()
    t, w, hc = k.trips, k.waves, c.hc
    lanes_log2 = c.rank_lanes.bit_length() - 1
    return {
        "ld.volatile.global.v4": t * w,
        "ld.global.v4": t * (hc + 1),
        "ld.global.f32": hc * hc + 2 * hc,
        "fma.rn.f32": t * VEC_BF16 * (hc * hc + hc + 1),
        "mul.rn.f32": t * (VEC_BF16 * hc + 2 * VEC_BF16),
        "cvt.rn.bf16x2.f32": t * (12 + 4 * hc),
        "add.rn.f32": (t * VEC_BF16 * (w + lanes_log2) + 5 + k.warps
                       + (c.cluster_size if c.cluster_size > 1 else 0) + 1),
        "shfl.sync.bfly": t * VEC_BF16 * lanes_log2 + 5,
        "st.global.v4": t * w + t * (hc + 1),
        "bar.sync": 1,
        "ret": 1,
    }


def check_mhc_consumer(lines: list[str], v, *, config: MHCConfig) -> list[str]:
    c = config
    errs: list[str] = []
    want = expected_counts(c)
    for op, n in want.items():
        got = len(_ops(lines, op))
        if got != n:
            errs.append(f"{got} {op}, want {n}")
    # The mean: sum / hidden (a multiply by an exact power of two 2^-k when
    # hidden is 2^k, as LLVM folds it).
    scale = [i for i in _ops(lines, "mul.f32") if re.search(r", 0f[0-9A-F]{8};", lines[i])]
    means = len(_ops(lines, "div.rn.f32")) + len(scale)
    if means != 1:
        errs.append(f"{means} div.rn.f32 / constant mul.f32 for the mean, want 1")
    for op in ("add.f32", "sub.f32", "mul.f32", "fma.f32", "fma.rn.ftz.f32", "mul.ftz.f32",
               "add.ftz.f32", "sub.rn.f32"):
        if len([i for i in _ops(lines, op) if i not in scale]):
            errs.append(f"{op} present (arithmetic the reference does not model)")
    if any("multimem.st" in ln for ln in lines):
        errs.append("multimem.st in a consumer")
    wait = _first(lines, "griddepcontrol.wait")
    launch = _first(lines, "griddepcontrol.launch_dependents")
    stage = _first(lines, "ld.volatile.global.u32")
    spins = _ops(lines, "ld.volatile.global.v4")
    sentinel = [i for i, ln in enumerate(lines) if "0x80008000" in ln]
    stores = [i for i in _ops(lines, "st.global.v4") if "{s, s, s, s}" not in lines[i]]
    plain_loads = _ops(lines, "ld.global.v4") + _ops(lines, "ld.global.f32")
    if wait < 0 or launch < 0:
        return errs + ["missing griddepcontrol.wait/launch_dependents"]
    if any(i > wait for i in plain_loads):
        errs.append("a residual/gamma/mix load after griddepcontrol.wait")
    if not spins or not sentinel or not stores:
        return errs + ["no spin, sentinel or output store"]
    next_stage = [i for i in _ops(lines, "st.volatile.global.u32") if spins[-1] < i < launch]
    if not (wait < stage < spins[0] and spins[-1] < launch < sentinel[0]):
        errs.append(f"order wait<stage<spins<launch<sentinel broken: {wait},{stage},"
                    f"{spins[0]}..{spins[-1]},{launch},{sentinel[0]}")
    if not next_stage:
        errs.append("no NEXT_STAGE store (st.volatile.global.u32) between the spins and "
                    "launch_dependents")
    if min(stores) < sentinel[-1]:
        errs.append("an output store before the sentinel write-back")
    cluster_ops = {op: _ops(lines, op) for op in (
        "barrier.cluster.arrive.relaxed", "barrier.cluster.wait", "mapa.shared::cluster",
        "st.shared::cluster.f32")}
    arrive = [i for i in _ops(lines, "barrier.cluster.arrive")
              if i not in cluster_ops["barrier.cluster.arrive.relaxed"]]
    if c.cluster_size > 1:
        relaxed, waits = cluster_ops["barrier.cluster.arrive.relaxed"], \
            cluster_ops["barrier.cluster.wait"]
        mapa, remote = cluster_ops["mapa.shared::cluster"], cluster_ops["st.shared::cluster.f32"]
        counts = (len(relaxed), len(waits), len(mapa), len(remote), len(arrive))
        if counts != (1, 2, 1, 1, 1):
            errs.append(f"cluster ops (arrive.relaxed, wait, mapa, st.shared::cluster, "
                        f"arrive) = {counts}, want (1, 2, 1, 1, 1)")
        elif not (relaxed[0] < wait and sentinel[-1] < waits[0] < mapa[0] < remote[0]
                  < arrive[0] < waits[1] < stores[-1]):
            errs.append("cluster order arrive.relaxed < PDL wait, sentinel < wait < mapa < "
                        "st.shared::cluster < arrive < wait < layer-input store broken")
    elif any(cluster_ops.values()) or arrive:
        errs.append("a one-CTA build with cluster barriers or DSMEM ops")
    rets = _ops(lines, "ret")
    if rets and rets[-1] != len(lines) - 1:
        errs.append("ret is not the last instruction (early return)")
    if _ops(lines, "exit") or _ops(lines, "trap"):
        errs.append("exit/trap in a consumer (early return)")
    timer = any("%globaltimer" in ln for ln in lines)
    if c.budget_ns and not (timer and _ops(lines, "atom.global.add")):
        errs.append("watchdog variant without %globaltimer / record append")
    if not c.budget_ns and timer:
        errs.append("plain variant reads %globaltimer")
    return errs


def _detail(c: MHCConfig) -> str:
    k = c.kernel()
    return (f"hc={c.hc},cluster={c.cluster_size}x{c.threads},R={c.rank_lanes},"
            f"trips={k.trips}")


def consumer_configs(hiddens, tps, *, budget_ns: int) -> list[MHCConfig]:
    """The consumer builds of the module docstring (deduplicated, in order)."""
    out: list[MHCConfig] = []

    def add(hidden, tp, hc, tuning, wd):
        config = MHCConfig.from_tuning(hidden=hidden, tp=tp, hc=hc, tuning=tuning,
                                       budget_ns=wd)
        if config not in out:
            out.append(config)

    lane_hiddens = [h for h in hiddens if h in LANE_HIDDENS] or list(hiddens[:1])
    for hidden in hiddens:
        for tp in tps:
            for tuning in dict.fromkeys(tuning_for(hidden, tp, arch) for arch in ARCHS):
                add(hidden, tp, CHECK_HC, tuning, 0)
                if hidden in lane_hiddens or tp == tps[-1]:
                    add(hidden, tp, CHECK_HC, tuning, budget_ns)
    for hidden in lane_hiddens:
        for tp in tps:
            base = tuning_for(hidden, tp, ARCHS[0])
            for lanes in (2, 4, 8):
                if lanes <= tp and tp % lanes == 0:
                    threads = min(MAX_THREADS, base.threads * lanes)
                    add(hidden, tp, CHECK_HC, MHCTuning(base.cluster_size, threads, lanes),
                        budget_ns)
    for tp in tps:
        add(hiddens[0], tp, 1, tuning_for(hiddens[0], tp, ARCHS[0]), 0)
    one = MHCTuning(cluster_size=1, threads=128, rank_lanes=1)
    for wd in (0, budget_ns):  # 2 trips, no cluster
        add(ONE_CTA_HIDDEN, tps[-1], CHECK_HC, one, wd)
    return out


def mhc_variants(hiddens, tps, *, budget_ns: int = CHECK_BUDGET_NS) -> list[Variant]:
    """The compile-check variants of ``all_reduce_mhc`` (its declaration's
    ``compile_variants``): see the module docstring."""
    from .compile import FinalizePublishConfig

    out = []
    for config in consumer_configs(hiddens, tps, budget_ns=budget_ns):
        def build(arch, dump, config=config):
            return compile_mhc(dataclasses.replace(config, arch=arch), dump_dir=dump)
        out.append(Variant("all_reduce_mhc", "consumer", "MHCKernel", build,
                           budget_ns=config.budget_ns, hidden=config.hidden, tp=config.tp,
                           check=functools.partial(check_mhc_consumer, config=config),
                           detail=_detail(config)))
    for tp in tps:
        for transport in ("unicast", "multicast"):
            out.append(publish_variant("all_reduce_mhc", tp, transport,
                                       pair_key=("mhc_publish", tp)))
            fin = FinalizePublishConfig(tp=tp, top_k=MHC_FINALIZE_TOP_K, elements_per_thread=4,
                                        fp32_weights=True, routed_scaling_factor=1.0,
                                        shared="after", prefetch_group=None,
                                        transport=transport)
            out.append(finalize_publish_variant(
                "all_reduce_mhc", fin,
                pair_key=("finalize", "mhc", dataclasses.replace(fin, transport="-")),
                detail=f"finalize E=4,f32w,k={MHC_FINALIZE_TOP_K},sh=after"))
    return out
