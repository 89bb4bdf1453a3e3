"""The compile-check variants of the ops built on :class:`AllReduceNorm`'s
kernels: ``all_reduce_norm`` (one-shot and owner mode), ``embed_norm`` and
``finalize_publish``. Each provider is ``provider(hiddens, tps) ->
list[Variant]`` (:class:`kernels.ptx_checks.Variant`), named by its op's
declaration (``OpSpec.compile_variants``); a kernel that takes tp or hidden
at run time is not multiplied by them. ``all_reduce_mhc``'s provider is
:func:`kernels.lamport.mhc_checks.mhc_variants`, the indexer's
:func:`kernels.indexer.checks.indexer_variants`.
"""

from __future__ import annotations

import dataclasses
import functools

from kernels.lamport.protocol import DEFAULT_BUDGET_NS
from kernels.ptx_checks import Variant, check_finalize_publish

CHECK_BUDGET_NS = DEFAULT_BUDGET_NS
"""The watchdog budget of the watchdog builds: any nonzero budget compiles
the same code, and the default one is what correctness cases load."""


def publish_variant(op: str, tp: int, transport: str, *, pair_key: tuple) -> Variant:
    """The variant of the plain one-shot Lamport publish
    (:class:`kernels.lamport.compile.PublishConfig`) for ``tp`` and
    ``transport``, checked as a publish; ``pair_key`` pairs its unicast and
    multicast builds."""
    from kernels.lamport.compile import PublishConfig, compile_publish

    def build(arch, dump):
        return compile_publish(PublishConfig(tp=tp, transport=transport, arch=arch),
                               dump_dir=dump)
    return Variant(op, "publish", "PublishKernel", build, transport=transport, tp=tp,
                   pair_key=pair_key)


def all_reduce_norm_variants(hiddens, tps) -> list[Variant]:
    """``AllReduceNorm`` (one-shot): the publish for every tp and both
    transports (unicast/multicast twins), the consumer for every (hidden,
    tp), plain and watchdog; then the owner-mode builds."""
    from kernels.lamport.compile import NormConfig, compile_norm
    from kernels.lamport.norm import norm_threads

    out = [publish_variant("all_reduce_norm", tp, transport, pair_key=("publish", tp))
           for tp in tps for transport in ("unicast", "multicast")]
    for hidden in hiddens:
        norm_threads(hidden)  # ValueError for an unsupported hidden
        for tp in tps:
            for wd in (0, CHECK_BUDGET_NS):
                def build(arch, dump, hidden=hidden, tp=tp, wd=wd):
                    return compile_norm(NormConfig(hidden=hidden, tp=tp, budget_ns=wd,
                                                   arch=arch), dump_dir=dump)
                out.append(Variant("all_reduce_norm", "consumer", "NormKernel", build,
                                   budget_ns=wd, hidden=hidden, tp=tp))
    return out + _single_variants(hiddens, tps) + _owner_variants(hiddens, tps)


def _single_variants(hiddens, tps) -> list[Variant]:
    """The single-kernel form (:mod:`kernels.lamport.norm_single`): unicast,
    plain and watchdog, for every (hidden, tp); multicast (compiled and
    checked, never run here) at the first hidden for every tp, whose stores
    do not depend on hidden."""
    from kernels.lamport.compile import SingleNormConfig, compile_single_norm
    from kernels.ptx_checks import check_single_norm

    builds = [(hidden, tp, "unicast", wd) for hidden in hiddens for tp in tps
              for wd in (0, CHECK_BUDGET_NS)]
    if hiddens:
        builds += [(hiddens[0], tp, "multicast", CHECK_BUDGET_NS) for tp in tps]
    out = []
    for hidden, tp, transport, wd in builds:
        def build(arch, dump, hidden=hidden, tp=tp, transport=transport, wd=wd):
            return compile_single_norm(SingleNormConfig(hidden=hidden, tp=tp, budget_ns=wd,
                                                        transport=transport, arch=arch),
                                       dump_dir=dump)
        out.append(Variant("all_reduce_norm", "single", "SingleNormKernel", build,
                           transport=transport, budget_ns=wd, hidden=hidden, tp=tp,
                           check=check_single_norm, detail="single-kernel form"))
    return out


def _owner_variants(hiddens, tps) -> list[Variant]:
    """``AllReduceNorm(mode="owner")``: the owner publish (unicast only, one
    store a fragment) and the owner consumer (plain and watchdog)."""
    from kernels.lamport.compile import NormConfig, PublishConfig, compile_norm, compile_publish

    out = []
    for tp in tps:
        def build(arch, dump, tp=tp):
            return compile_publish(PublishConfig(tp=tp, arch=arch, mode="owner"), dump_dir=dump)
        out.append(Variant("all_reduce_norm", "publish", "PublishKernel", build,
                           transport="unicast", tp=tp, detail="owner", mode="owner"))
    for hidden in hiddens:
        for tp in tps:
            for wd in (0, CHECK_BUDGET_NS):
                def build(arch, dump, hidden=hidden, tp=tp, wd=wd):
                    return compile_norm(NormConfig(hidden=hidden, tp=tp, budget_ns=wd,
                                                   arch=arch, mode="owner"), dump_dir=dump)
                out.append(Variant("all_reduce_norm", "consumer", "NormKernel", build,
                                   budget_ns=wd, hidden=hidden, tp=tp, detail="owner",
                                   mode="owner"))
    return out


def embed_norm_variants(hiddens, tps) -> list[Variant]:
    """``AllReduceNorm.embed_norm``: the embedding publish (runtime hidden,
    shard and rank; checked like a publish) and the embed-norm consumer
    (plain and watchdog; checked like a consumer)."""
    from kernels.lamport.compile import (EmbedNormConfig, EmbedPublishConfig,
                                         compile_embed_norm, compile_embed_publish)

    out = []
    for tp in tps:
        for transport in ("unicast", "multicast"):
            def build(arch, dump, tp=tp, transport=transport):
                return compile_embed_publish(
                    EmbedPublishConfig(tp=tp, transport=transport, arch=arch), dump_dir=dump)
            out.append(Variant("embed_norm", "publish", "EmbedPublishKernel", build,
                               transport=transport, tp=tp, pair_key=("embed_publish", tp),
                               detail="embed"))
    for hidden in hiddens:
        for tp in tps:
            for wd in (0, CHECK_BUDGET_NS):
                def build(arch, dump, hidden=hidden, tp=tp, wd=wd):
                    return compile_embed_norm(EmbedNormConfig(hidden=hidden, tp=tp,
                                                              budget_ns=wd, arch=arch),
                                              dump_dir=dump)
                out.append(Variant("embed_norm", "consumer", "EmbedNormKernel", build,
                                   budget_ns=wd, hidden=hidden, tp=tp, detail="embed"))
    return out + _single_embed_variants(hiddens, tps)


def _single_embed_variants(hiddens, tps) -> list[Variant]:
    """The single-kernel embedding (:mod:`kernels.lamport.embed_single`):
    unicast watchdog builds for every (hidden, tp), the plain build at the
    first hidden for every tp, multicast (compiled and checked, never run
    here) at the first hidden for every tp."""
    from kernels.lamport.compile import SingleEmbedNormConfig, compile_single_embed_norm
    from kernels.ptx_checks import check_single_embed_norm

    builds = [(hidden, tp, "unicast", CHECK_BUDGET_NS) for hidden in hiddens for tp in tps]
    if hiddens:
        builds += [(hiddens[0], tp, transport, wd) for tp in tps
                   for transport, wd in (("unicast", 0), ("multicast", CHECK_BUDGET_NS))]
    out = []
    for hidden, tp, transport, wd in builds:
        def build(arch, dump, hidden=hidden, tp=tp, transport=transport, wd=wd):
            return compile_single_embed_norm(SingleEmbedNormConfig(
                hidden=hidden, tp=tp, budget_ns=wd, transport=transport, arch=arch),
                dump_dir=dump)
        out.append(Variant("embed_norm", "single", "SingleEmbedNormKernel", build,
                           transport=transport, budget_ns=wd, hidden=hidden, tp=tp,
                           check=check_single_embed_norm, detail="embed,single-kernel form"))
    return out


FINALIZE_CHECK_CONFIGS = (
    # (elements_per_thread, fp32_weights, top_k, shared, prefetch_group, routed_scaling_factor)
    (8, True, 8, "after", None, 1.0),
    (4, False, 8, "after", None, 1.0),
    (4, True, 6, "before", 1, 2.5),
    (8, False, 6, "none", 4, 2.5),
    (4, True, 1, "after", 1, 1.0),
)
"""Every option of the finalize publish at least once: 8/16-byte fragments,
FP32/BF16 weights, top_k 1/6/8, shared expert absent/before/after the PDL
wait, prefetch groups 1 / uneven / all, with and without a routed scaling
factor; each for every tp and both transports."""

FINALIZE_OWNER_CHECK_CONFIGS = FINALIZE_CHECK_CONFIGS[:4]
"""Owner mode (unicast only): 8/16-byte fragments, FP32/BF16 weights, shared
expert absent/before/after the wait, for every tp."""


def _finalize_detail(c) -> str:
    return (f"E={getattr(c, 'elements_per_thread', 8)},{'f32' if c.fp32_weights else 'bf16'}w,"
            f"k={c.top_k},"
            f"sh={c.shared},pg={c.prefetch_group or c.top_k},s={c.routed_scaling_factor:g}")


def finalize_publish_variant(op: str, config, *, detail: str,
                             pair_key: tuple | None = None) -> Variant:
    """The variant of one finalize publish build (``config``: a
    :class:`kernels.lamport.compile.FinalizePublishConfig`, compiled for the
    requested arch), checked by :func:`kernels.ptx_checks.check_finalize_publish`;
    its transport, tp and mode are the config's."""
    from kernels.lamport.compile import compile_finalize_publish

    def build(arch, dump):
        return compile_finalize_publish(dataclasses.replace(config, arch=arch), dump_dir=dump)
    return Variant(op, "publish", "FinalizePublishKernel", build, transport=config.transport,
                   tp=config.tp, pair_key=pair_key,
                   check=functools.partial(check_finalize_publish, config=config),
                   detail=detail, mode=config.mode)


def finalize_publish_variants(hiddens, tps) -> list[Variant]:
    """The finalize publish in every :data:`FINALIZE_CHECK_CONFIGS` for every
    tp and both transports, and in every :data:`FINALIZE_OWNER_CHECK_CONFIGS`
    (owner mode, unicast); hidden is a runtime argument: not multiplied."""
    from kernels.lamport.compile import FinalizePublishConfig

    out = []
    for e, fp32, top_k, shared, group, scale in FINALIZE_CHECK_CONFIGS:
        for tp in tps:
            for transport in ("unicast", "multicast"):
                config = FinalizePublishConfig(
                    tp=tp, top_k=top_k, elements_per_thread=e, fp32_weights=fp32,
                    routed_scaling_factor=scale, shared=shared, prefetch_group=group,
                    transport=transport)

                out.append(finalize_publish_variant(
                    "finalize_publish", config,
                    pair_key=("finalize", dataclasses.replace(config, transport="-")),
                    detail=_finalize_detail(config)))
    for e, fp32, top_k, shared, group, scale in FINALIZE_OWNER_CHECK_CONFIGS:
        for tp in tps:
            config = FinalizePublishConfig(
                tp=tp, top_k=top_k, elements_per_thread=e, fp32_weights=fp32,
                routed_scaling_factor=scale, shared=shared, prefetch_group=group,
                mode="owner")
            out.append(finalize_publish_variant(
                "finalize_publish", config, detail="owner," + _finalize_detail(config)))
    return out + _single_finalize_variants(hiddens, tps)


def _single_finalize_variants(hiddens, tps) -> list[Variant]:
    """The single-kernel finalize form (:mod:`kernels.lamport.finalize_single`,
    16-byte fragments, hidden compiled in): the op's default options,
    watchdog build, for every (hidden, tp); every option set of
    :data:`FINALIZE_CHECK_CONFIGS` (their fragment width aside) unicast at
    the first hidden for every tp; multicast (compiled and checked, never
    run here) with the default options at the first hidden for every tp."""
    from kernels.lamport.compile import SingleFinalizeNormConfig, compile_single_finalize_norm
    from kernels.ptx_checks import check_single_finalize_norm

    default = SingleFinalizeNormConfig(hidden=0, tp=0, top_k=8, budget_ns=CHECK_BUDGET_NS)
    configs = [dataclasses.replace(default, hidden=hidden, tp=tp)
               for hidden in hiddens for tp in tps]
    for _, fp32, top_k, shared, group, scale in FINALIZE_CHECK_CONFIGS if hiddens else ():
        configs += [SingleFinalizeNormConfig(
            hidden=hiddens[0], tp=tp, top_k=top_k, fp32_weights=fp32, shared=shared,
            prefetch_group=group, routed_scaling_factor=scale) for tp in tps]
    if hiddens:
        configs += [dataclasses.replace(default, hidden=hiddens[0], tp=tp,
                                        transport="multicast") for tp in tps]
    out = []
    for config in configs:
        def build(arch, dump, config=config):
            return compile_single_finalize_norm(dataclasses.replace(config, arch=arch),
                                                dump_dir=dump)
        out.append(Variant("finalize_publish", "single", "SingleFinalizeNormKernel", build,
                           transport=config.transport, budget_ns=config.budget_ns,
                           hidden=config.hidden, tp=config.tp,
                           check=functools.partial(check_single_finalize_norm, config=config),
                           detail="single," + _finalize_detail(config)))
    return out
