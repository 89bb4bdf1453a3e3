"""``python -m jobs compile-check``: compile every registered kernel variant
without a GPU and check its PTX.

Variants come from a registry: an op registers a provider with
:func:`register_op`; the provider turns the requested hidden sizes and tp
values into :class:`Variant` objects (a kernel that takes tp or hidden at
runtime is not multiplied by them). Checks, per variant and per arch:

- the PTX dump exists and holds an ``.entry`` containing ``entry``;
- consumers spin with ``ld.volatile.global.v4``; their order is residual and
  gamma loads, ``griddepcontrol.wait``, the volatile stage load, the spins,
  ``griddepcontrol.launch_dependents``, then the sentinel stores (a volatile
  load before the wait is a stage hint: no slot is loaded before it);
- ``multimem.st`` appears in multicast builds and only there;
- publishes: ``griddepcontrol.wait`` precedes ``launch_dependents`` and the
  stage / payload loads; the unicast and multicast builds of one (tp, arch)
  differ only in their stores (and the peer-table loads that feed them);
  owner-mode publishes (unicast by nature) store each fragment once.

Compiles go through the persistent compile cache (:mod:`kernels.compile_cache`):
a variant whose key (kernel sources, config, arch, CuTe DSL version) is
unchanged since an earlier run is not compiled again; its stored PTX is
checked. ``--all`` compiles every variant and replaces its entry.

Prints a fixed-width table with compile times (``cached`` where the cache
served the variant); exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime as dt
import glob
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

from jobs import exits
from jobs.options import add_results_arguments, int_list, open_results, report, str_list

DEFAULT_ARCHS = ("sm_90a", "sm_100a")
DEFAULT_HIDDEN = (2048, 2560, 3584, 4096, 5120, 7168, 8192)
DEFAULT_TP = (1, 2, 4, 8)


@dataclasses.dataclass(frozen=True)
class Variant:
    """One compile of one kernel for one arch."""
    op: str
    kernel: str                      # "publish" | "consumer" | other
    entry: str                       # substring of the PTX .entry name
    compile: Callable[[str, str], object]  # (arch, dump_dir) -> compiled
    transport: str = "-"
    watchdog_ns: int = 0
    hidden: int | None = None        # None: runtime argument
    tp: int | None = None            # None: runtime argument
    pair_key: tuple | None = None    # publishes: unicast/multicast twins share it
    check: Callable[[list[str], "Variant"], list[str]] | None = None  # overrides the kind's check
    detail: str = ""                 # variant options shown in the table
    mode: str = "one_shot"           # kernels.lamport.protocol.MODES


_PROVIDERS: dict[str, Callable[[Sequence[int], Sequence[int]], list[Variant]]] = {}


def register_op(name: str):
    """Decorator: ``provider(hiddens, tps) -> list[Variant]`` for op ``name``."""
    def wrap(provider):
        _PROVIDERS[name] = provider
        return provider
    return wrap


def registered_ops() -> list[str]:
    """The ops with compile variants, in the op registry's order (cluster.ops)."""
    return [o for o in op_names() if o in _PROVIDERS]


def op_names() -> tuple[str, ...]:
    from cluster import ops
    return ops.names()


def check_selection(ops: Sequence[str] | None, hiddens: Sequence[int],
                    tps: Sequence[int]) -> None:
    """ValueError/TypeError naming the first op without compile variants,
    the first hidden size the Lamport consumers do not take
    (:func:`kernels.validation.norm_threads`) or the first tp not in
    ``TP_SIZES``: what the suite loader and the command line check before
    anything is written or compiled."""
    from kernels.validation import norm_threads, require_tp
    for op in ops or ():
        if op not in _PROVIDERS:
            raise ValueError(f"ops: unknown op {op!r} (no compile variants); registered: "
                             f"{registered_ops()}")
    for hidden in hiddens:
        norm_threads(hidden, "hidden")
    for tp in tps:
        require_tp("tp", tp)


# ---------------------------------------------------------------- all_reduce_norm
WATCHDOG_CHECK_NS = 1_000_000


@register_op("all_reduce_norm")
def _all_reduce_norm_variants(hiddens, tps) -> list[Variant]:
    from kernels.lamport.compile import (NormConfig, PublishConfig, compile_norm,
                                         compile_publish)
    from kernels.lamport.norm import norm_threads

    out = []
    for tp in tps:
        for transport in ("unicast", "multicast"):
            def build(arch, dump, tp=tp, transport=transport):
                return compile_publish(PublishConfig(tp=tp, transport=transport, arch=arch),
                                       dump_dir=dump)
            out.append(Variant("all_reduce_norm", "publish", "PublishKernel", build,
                               transport=transport, tp=tp, pair_key=("publish", tp)))
    for hidden in hiddens:
        norm_threads(hidden)  # ValueError for an unsupported hidden
        for tp in tps:
            for wd in (0, WATCHDOG_CHECK_NS):
                def build(arch, dump, hidden=hidden, tp=tp, wd=wd):
                    return compile_norm(NormConfig(hidden=hidden, tp=tp, watchdog_ns=wd,
                                                   arch=arch), dump_dir=dump)
                out.append(Variant("all_reduce_norm", "consumer", "NormKernel", build,
                                   watchdog_ns=wd, hidden=hidden, tp=tp))
    return out + _owner_variants(hiddens, tps)


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
            for wd in (0, WATCHDOG_CHECK_NS):
                def build(arch, dump, hidden=hidden, tp=tp, wd=wd):
                    return compile_norm(NormConfig(hidden=hidden, tp=tp, watchdog_ns=wd,
                                                   arch=arch, mode="owner"), dump_dir=dump)
                out.append(Variant("all_reduce_norm", "consumer", "NormKernel", build,
                                   watchdog_ns=wd, hidden=hidden, tp=tp, detail="owner",
                                   mode="owner"))
    return out


@register_op("embed_norm")
def _embed_variants(hiddens, tps) -> list[Variant]:
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
            for wd in (0, WATCHDOG_CHECK_NS):
                def build(arch, dump, hidden=hidden, tp=tp, wd=wd):
                    return compile_embed_norm(EmbedNormConfig(hidden=hidden, tp=tp,
                                                              watchdog_ns=wd, arch=arch),
                                              dump_dir=dump)
                out.append(Variant("embed_norm", "consumer", "EmbedNormKernel", build,
                                   watchdog_ns=wd, hidden=hidden, tp=tp, detail="embed"))
    return out


# ---------------------------------------------------------------- finalize_publish
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
    return (f"E={c.elements_per_thread},{'f32' if c.fp32_weights else 'bf16'}w,k={c.top_k},"
            f"sh={c.shared},pg={c.prefetch_group or c.top_k},s={c.routed_scaling_factor:g}")


@register_op("finalize_publish")
def _finalize_publish_variants(hiddens, tps) -> list[Variant]:
    """hidden is a runtime argument of the finalize publish: not multiplied."""
    import functools

    from kernels.lamport.compile import FinalizePublishConfig, compile_finalize_publish

    out = []
    for e, fp32, top_k, shared, group, scale in FINALIZE_CHECK_CONFIGS:
        for tp in tps:
            for transport in ("unicast", "multicast"):
                config = FinalizePublishConfig(
                    tp=tp, top_k=top_k, elements_per_thread=e, fp32_weights=fp32,
                    routed_scaling_factor=scale, shared=shared, prefetch_group=group,
                    transport=transport)

                def build(arch, dump, config=config):
                    return compile_finalize_publish(dataclasses.replace(config, arch=arch),
                                                    dump_dir=dump)
                out.append(Variant(
                    "finalize_publish", "publish", "FinalizePublishKernel", build,
                    transport=transport, tp=tp,
                    pair_key=("finalize", dataclasses.replace(config, transport="-")),
                    check=functools.partial(check_finalize_publish, config=config),
                    detail=_finalize_detail(config)))
    for e, fp32, top_k, shared, group, scale in FINALIZE_OWNER_CHECK_CONFIGS:
        for tp in tps:
            config = FinalizePublishConfig(
                tp=tp, top_k=top_k, elements_per_thread=e, fp32_weights=fp32,
                routed_scaling_factor=scale, shared=shared, prefetch_group=group,
                mode="owner")

            def build(arch, dump, config=config):
                return compile_finalize_publish(dataclasses.replace(config, arch=arch),
                                                dump_dir=dump)
            out.append(Variant(
                "finalize_publish", "publish", "FinalizePublishKernel", build,
                transport="unicast", tp=tp,
                check=functools.partial(check_finalize_publish, config=config),
                detail="owner," + _finalize_detail(config), mode="owner"))
    return out


# ---------------------------------------------------------------- all_reduce_mhc
@register_op("all_reduce_mhc")
def _all_reduce_mhc_variants(hiddens, tps) -> list[Variant]:
    """The mHC consumer and AllReduceMHC's publishes (kernels.lamport.mhc_checks)."""
    from kernels.lamport.mhc_checks import mhc_variants
    return mhc_variants(Variant, hiddens, tps, watchdog_ns=WATCHDOG_CHECK_NS,
                        check_finalize_publish=check_finalize_publish)


# ---------------------------------------------------------------- indexer
@register_op("indexer")
def _indexer_variants(hiddens, tps) -> list[Variant]:
    from kernels.indexer.checks import indexer_variants
    return indexer_variants(Variant)


# ---------------------------------------------------------------- PTX checks
_INSTR = re.compile(r"^\s*(?:@%?!?\w+\s+)?([a-z][\w.:]*)")


def entry_body(ptx: str, entry: str) -> tuple[str | None, list[str]]:
    """(entry name, instruction lines) of the first .entry containing ``entry``."""
    m = re.search(r"\.entry\s+(\w*" + re.escape(entry) + r"\w*)\s*\(", ptx)
    if not m:
        return None, []
    body = ptx[m.end():]
    start = body.index("{")
    lines = [ln.strip() for ln in body[start + 1:].splitlines()]
    instrs = [ln for ln in lines if ln and not ln.startswith(("//", ".reg", "$L", "{", "}"))]
    return m.group(1), instrs


def _first(lines, pattern, start=0):
    for i in range(start, len(lines)):
        if pattern in lines[i]:
            return i
    return -1


def check_consumer(lines: list[str], v: Variant) -> list[str]:
    errs = []
    wait = _first(lines, "griddepcontrol.wait")
    launch = _first(lines, "griddepcontrol.launch_dependents")
    stage = _first(lines, "ld.volatile.global.u32", max(wait, 0))
    spin = _first(lines, "ld.volatile.global.v4")
    sentinel = _first(lines, "0x80008000")
    plain = [i for i, ln in enumerate(lines) if ln.startswith("ld.global.v4")]
    if spin < 0:
        errs.append("no ld.volatile.global.v4 (Lamport spin)")
    if any("multimem.st" in ln for ln in lines):
        errs.append("multimem.st in a consumer")
    if wait < 0 or launch < 0:
        errs.append("missing griddepcontrol.wait/launch_dependents")
    elif len(plain) < 2 or max(plain[:2]) > wait:
        errs.append("residual/gamma loads not before griddepcontrol.wait")
    elif not wait < stage < spin < launch < sentinel:
        errs.append(f"order wait<stage<spin<launch<sentinel broken: "
                    f"{wait},{stage},{spin},{launch},{sentinel}")
    if v.watchdog_ns and not any("%globaltimer" in ln for ln in lines):
        errs.append("watchdog variant without %globaltimer")
    if not v.watchdog_ns and any("%globaltimer" in ln for ln in lines):
        errs.append("plain variant reads %globaltimer")
    return errs


def check_publish(lines: list[str], v: Variant) -> list[str]:
    errs = []
    wait = _first(lines, "griddepcontrol.wait")
    launch = _first(lines, "griddepcontrol.launch_dependents")
    stage = _first(lines, "ld.volatile.global.u32")
    payload = _first(lines, "ld.global.v4")
    mc = sum("multimem.st" in ln for ln in lines)
    uc = sum(ln.startswith("st.relaxed.sys.global.v4") for ln in lines)
    if wait < 0 or launch < 0 or not wait < launch:
        errs.append(f"griddepcontrol.wait ({wait}) must precede launch_dependents ({launch})")
    if not (0 <= wait < stage and wait < payload):
        errs.append("stage/payload loaded before griddepcontrol.wait")
    if v.transport == "multicast" and (mc != 1 or uc):
        errs.append(f"multicast build: {mc} multimem.st, {uc} st.relaxed.sys")
    stores = 1 if v.mode == "owner" else (v.tp or 1)
    if v.transport == "unicast" and (mc or uc != stores):
        errs.append(f"unicast build: {mc} multimem.st, {uc} st.relaxed.sys (want {stores}: "
                    f"tp={v.tp}, mode={v.mode})")
    return errs


def check_finalize_publish(lines: list[str], v: Variant, *, config) -> list[str]:
    """The finalize publish: metadata staged before ``griddepcontrol.wait``,
    the shared expert on its side of the wait, the routed rows after the
    stage load in prefetch groups (a group's loads before its first FMA),
    exactly ``E * top_k`` ``fma.rn.f32`` (the reference's ``fma=True``), one
    ``add.rn.f32`` a lane for the shared expert, one ``mul.rn.f32`` for the
    routed scaling factor, one ``cvt.rn.bf16x2.f32`` a lane pair, and the
    stores of the fragment width (tp ``st.relaxed.sys`` or one
    ``multimem.st``)."""
    c = config
    errs = []
    e, k = c.elements_per_thread, c.top_k
    vec = "v4" if e == 8 else "v2"
    wait = _first(lines, "griddepcontrol.wait")
    launch = _first(lines, "griddepcontrol.launch_dependents")
    stage = _first(lines, "ld.volatile.global.u32")
    if wait < 0 or launch < 0 or not wait < launch:
        errs.append(f"griddepcontrol.wait ({wait}) must precede launch_dependents ({launch})")
    if not 0 <= wait < stage:
        errs.append("stage loaded before griddepcontrol.wait")

    def where(pattern):
        return [i for i, ln in enumerate(lines) if ln.startswith(pattern)]

    index_loads = where("ld.global.s32")
    weight_loads = where("ld.global.f32" if c.fp32_weights else "ld.global.b16")
    if len(index_loads) != 1 or len(weight_loads) != 1:
        errs.append(f"{len(index_loads)} index / {len(weight_loads)} weight loads, want 1 / 1")
    elif max(index_loads + weight_loads) > wait:
        errs.append("routing metadata not loaded before griddepcontrol.wait")
    frags = where(f"ld.global.{vec}")
    want = k + (c.shared != "none")
    if len(frags) != want:
        errs.append(f"{len(frags)} ld.global.{vec} fragment loads, want top_k + shared = {want}")
    before = [i for i in frags if i < wait]
    if len(before) != (c.shared == "before"):
        errs.append(f"{len(before)} fragment loads before griddepcontrol.wait "
                    f"with shared={c.shared!r}")
    routed = [i for i in frags if i > stage]
    fmas = where("fma.rn.f32")
    if len(routed) != k:
        errs.append(f"{len(routed)} routed loads after the stage load, want top_k={k}")
    if len(fmas) != e * k:
        errs.append(f"{len(fmas)} fma.rn.f32, want E*top_k={e * k}")
    elif len(routed) == k:
        group = c.prefetch_group or k
        for g in range(0, k, group):
            last_load = routed[min(g + group, k) - 1]
            if last_load > fmas[g * e]:
                errs.append(f"prefetch group at route {g}: a load after the group's first FMA")
                break
    counts = {"add.rn.f32": e if c.shared != "none" else 0,
              "mul.rn.f32": 0 if c.routed_scaling_factor == 1.0 else 1,
              "cvt.rn.bf16x2.f32": e // 2}
    for op, n in counts.items():
        if len(where(op)) != n:
            errs.append(f"{len(where(op))} {op}, want {n}")
    mc = len(where(f"multimem.st.relaxed.sys.global.{vec}.bf16x2"))
    uc = len(where(f"st.relaxed.sys.global.{vec}.b32"))
    other = len(where("multimem.st")) + len(where("st.relaxed.sys")) - mc - uc
    if other:
        errs.append(f"{other} stores of the wrong width (want {vec})")
    if v.transport == "multicast" and (mc != 1 or uc):
        errs.append(f"multicast build: {mc} multimem.st, {uc} st.relaxed.sys")
    stores = 1 if c.mode == "owner" else c.tp
    if v.transport == "unicast" and (mc or uc != stores):
        errs.append(f"unicast build: {mc} multimem.st, {uc} st.relaxed.sys (want {stores}: "
                    f"tp={c.tp}, mode={c.mode})")
    if any("ld.volatile.global.v" in ln or "%globaltimer" in ln for ln in lines):
        errs.append("a publish must not spin or read %globaltimer")
    return errs


def _skeleton(lines: list[str]) -> list[str]:
    """Opcodes of a publish without its stores and the address math and
    peer-table loads that only feed them."""
    drop = ("st.relaxed.sys", "multimem.st", "ld.global.u64", "add.s64", "mov.b64",
            "ld.param")
    ops = []
    for ln in lines:
        m = _INSTR.match(ln)
        if m and not m.group(1).startswith(drop):
            ops.append(m.group(1))
    return ops


# ---------------------------------------------------------------- the run
@dataclasses.dataclass
class Row:
    variant: Variant
    arch: str
    seconds: float = 0.0
    cached: bool = False
    ptx_kb: float = 0.0
    errors: list[str] = dataclasses.field(default_factory=list)
    lines: list[str] = dataclasses.field(default_factory=list)
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def run_variant(v: Variant, arch: str, dump_root: str, index: int) -> Row:
    from kernels.compile_cache import stats
    row = Row(v, arch, started_at=_now())
    dump = os.path.join(dump_root, f"{index:04d}_{v.op}_{v.kernel}_{arch}")
    t0 = time.perf_counter()
    loaded = stats["loaded"]
    try:
        v.compile(arch, dump)
        row.cached = stats["loaded"] > loaded
    except Exception as exc:  # report every failure, keep going
        row.seconds = time.perf_counter() - t0
        row.finished_at = _now()
        row.errors.append(f"compile failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        return row
    row.seconds = time.perf_counter() - t0
    row.finished_at = _now()
    ptxs = sorted(glob.glob(os.path.join(dump, "*.ptx")), key=os.path.getmtime)
    if not ptxs:
        row.errors.append(f"no PTX dump in {dump}")
        return row
    ptx = open(ptxs[-1]).read()
    row.ptx_kb = len(ptx) / 1024
    if f".target {arch}" not in ptx:
        row.errors.append(f"PTX .target is not {arch}")
    name, row.lines = entry_body(ptx, v.entry)
    if name is None:
        row.errors.append(f"no .entry containing {v.entry!r}")
        return row
    if v.check is not None:
        row.errors += v.check(row.lines, v)
    elif v.kernel == "consumer":
        row.errors += check_consumer(row.lines, v)
    elif v.kernel == "publish":
        row.errors += check_publish(row.lines, v)
    return row


_SIGNIFICANT = ("ld.", "st.", "atom", "red", "multimem", "griddepcontrol", "bar", "membar",
                "fence", "fma", "add.rn", "mul.rn", "cvt")
UNORDERED_PAIRS = {"finalize"}
"""Pair keys whose twins are compared as opcode multisets, not sequences."""


def check_pairs(rows: list[Row]) -> None:
    """Unicast vs multicast publishes of the same (key, arch): same skeleton."""
    groups: dict[tuple, dict[str, Row]] = {}
    for r in rows:
        if r.variant.pair_key and r.lines:
            groups.setdefault((r.variant.pair_key, r.arch), {})[r.variant.transport] = r
    for pair in groups.values():
        if {"unicast", "multicast"} <= set(pair):
            a, b = _skeleton(pair["unicast"].lines), _skeleton(pair["multicast"].lines)
            if pair["unicast"].variant.pair_key[0] in UNORDERED_PAIRS and a != b:
                # The compiler schedules and rematerializes the address math of
                # the larger kernels differently around the tp stores: compare
                # the multisets of memory, synchronization and FP instructions.
                extra = collections.Counter(op for op in b if op.startswith(_SIGNIFICANT))
                extra.subtract(op for op in a if op.startswith(_SIGNIFICANT))
                if any(extra.values()):
                    diff = {op: n for op, n in extra.items() if n}
                    pair["multicast"].errors.append(
                        f"unicast/multicast publishes differ beyond their stores: "
                        f"multicast - unicast opcode counts {diff}")
            elif a != b:
                diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                msg = (f"unicast/multicast publishes differ beyond their stores at op {diff}: "
                       f"{a[diff:diff + 3]} vs {b[diff:diff + 3]}")
                pair["multicast"].errors.append(msg)


HEADER = (f"{'op':<16} {'kernel':<9} {'transport':<9} {'watchdog':>9} {'hidden':>7} "
          f"{'tp':>3} {'arch':<8} {'compile_s':>9} {'ptx_kb':>7}  status")


def format_row(r: Row) -> str:
    v = r.variant
    status = "ok" if not r.errors else "FAIL: " + "; ".join(r.errors)
    if r.cached:
        status += " (cached)"
    if v.detail:
        status += f"  [{v.detail}]"
    return (f"{v.op:<16} {v.kernel:<9} {v.transport:<9} {v.watchdog_ns:>9} "
            f"{'rt' if v.hidden is None else v.hidden:>7} {'rt' if v.tp is None else v.tp:>3} "
            f"{r.arch:<8} {r.seconds:>9.3f} {r.ptx_kb:>7.1f}  {status}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jobs compile-check",
                                description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=str_list(DEFAULT_ARCHS), default=list(DEFAULT_ARCHS),
                   metavar="A,B",
                   help=f"target arches, comma-separated: {', '.join(DEFAULT_ARCHS)} (the kernels "
                        f"use sm_90 features: clusters, DSMEM, multimem; default: all)")
    p.add_argument("--ops", type=str_list(), default=None, metavar="A,B",
                   help=f"comma-separated ops, default every registered one ({', '.join(op_names())})")
    p.add_argument("--hidden", type=int_list, default=list(DEFAULT_HIDDEN), metavar="N,M",
                   help=f"elements per token (default: {','.join(map(str, DEFAULT_HIDDEN))})")
    p.add_argument("--tp", type=int_list, default=list(DEFAULT_TP), metavar="N,M",
                   help=f"TP sizes (default: {','.join(map(str, DEFAULT_TP))})")
    p.add_argument("--dump-dir", default=None, help="keep the PTX here (default: a temp dir)")
    p.add_argument("--all", action="store_true",
                   help="compile every variant, also those the compile cache holds with an "
                        "unchanged key (their entries are replaced)")
    add_results_arguments(p, suite="compile-check")
    return p


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def result_row(r: Row, environment: dict) -> dict:
    """The results-store row of one compile (outcome pass/fail, never timed)."""
    from jobs.results import make_row
    v = r.variant
    repro = (f"python -m jobs compile-check --arch {r.arch} --ops {v.op}"
             + (f" --hidden {v.hidden}" if v.hidden else "") + (f" --tp {v.tp}" if v.tp else ""))
    return make_row(
        started_at=r.started_at, finished_at=r.finished_at, op=v.op,
        variant=f"{v.kernel}" + (f"/{v.detail}" if v.detail else "")
        + (f"/watchdog={v.watchdog_ns}ns" if v.watchdog_ns else ""),
        transport=None if v.transport == "-" else v.transport, backend="compile", job="compile-check",
        tp=v.tp, hidden=v.hidden, outcome="fail" if r.errors else "pass",
        reason="; ".join(r.errors) or None, repro_command=None if not r.errors else repro,
        extra={"arch": r.arch, "compile_s": round(r.seconds, 4), "ptx_kb": round(r.ptx_kb, 1),
               "cached": r.cached},
        **environment)


def main(argv: Sequence[str] | None = None) -> int:
    from jobs.config import ConfigError
    try:
        args = parse_args(argv)
    except SystemExit as exit_:  # argparse: 2 on bad usage, 0 for --help
        return int(exit_.code or 0)
    ops = args.ops if args.ops is not None else registered_ops()
    try:
        check_selection(ops, args.hidden, args.tp)
        writer, environment = open_results(args)
    except (ConfigError, TypeError, ValueError) as err:
        print(f"compile-check: {err}", file=sys.stderr)
        return exits.USAGE
    t_import = time.perf_counter()
    import cutlass  # noqa: F401  (import time reported apart from compiles)
    t_import = time.perf_counter() - t_import
    try:
        variants = [v for op in ops for v in _PROVIDERS[op](args.hidden, args.tp)]
    except ValueError as exc:
        print(f"compile-check: {exc}", file=sys.stderr)
        return exits.USAGE

    tmp = None
    dump_root = args.dump_dir
    if dump_root is None:
        tmp = tempfile.TemporaryDirectory(prefix="compile-check-")
        dump_root = tmp.name
    rows: list[Row] = []
    print(HEADER)
    print("-" * len(HEADER))
    from kernels.compile_cache import cache_root, refreshing
    t0 = time.perf_counter()
    try:
        with refreshing() if args.all else contextlib.nullcontext():
            for arch in args.arch:
                for v in variants:
                    row = run_variant(v, arch, dump_root, len(rows))
                    rows.append(row)
                    if v.pair_key is None:  # publishes are checked in pairs below
                        print(format_row(row), flush=True)
                        if writer:
                            writer.append(result_row(row, environment))
        check_pairs(rows)
        for row in rows:
            if row.variant.pair_key is not None:
                print(format_row(row), flush=True)
                if writer:
                    writer.append(result_row(row, environment))
    finally:
        if tmp is not None:
            tmp.cleanup()
    failed = [r for r in rows if r.errors]
    served = sum(r.cached for r in rows)
    total = time.perf_counter() - t0
    print("-" * len(HEADER))
    print(f"{len(rows)} variants: {len(rows) - served} compiled, {served} from the compile cache "
          f"({cache_root() or 'off'}), {len(failed)} failed, total {total:.1f} s "
          f"(import cutlass {t_import:.1f} s), PTX in {args.dump_dir or 'a temp dir (removed)'}")
    report(writer, len(failed), args)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
