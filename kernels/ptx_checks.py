"""What a compile-check variant is and how its PTX is checked, without a GPU
(``python -m jobs compile-check`` runs them; each op's declaration names
the provider of its variants, ``OpSpec.compile_variants``).

A :class:`Variant` is one compile of one kernel for one arch. The checks
take the instruction lines of the variant's ``.entry`` (:func:`entry_body`)
and return error strings (empty: the PTX passes):

- consumers (:func:`check_consumer`) spin with ``ld.volatile.global.v4``;
  their order is residual and gamma loads, ``griddepcontrol.wait``, the
  volatile stage load, the spins, ``griddepcontrol.launch_dependents``,
  then the sentinel stores (a volatile load before the wait is a stage
  hint: no slot is loaded before it); ``%globaltimer`` exactly in watchdog
  builds;
- ``multimem.st`` appears in multicast builds and only there;
- publishes (:func:`check_publish`): ``griddepcontrol.wait`` precedes
  ``launch_dependents`` and the stage / payload loads; owner-mode publishes
  (unicast by nature) store each fragment once; the finalize publish has
  its own count-exact check (:func:`check_finalize_publish`);
- the unicast and multicast builds of one (tp, arch) differ only in their
  stores and the peer-table loads that feed them
  (:func:`publish_pair_difference`).

Op-specific checks live beside their kernels (:mod:`kernels.lamport.mhc_checks`,
:mod:`kernels.indexer.checks`) and reach a variant through ``Variant.check``.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Callable

@dataclasses.dataclass(frozen=True)
class Variant:
    """One compile of one kernel for one arch: ``compile(arch, dump_dir)``
    compiles it and leaves its PTX in ``dump_dir``; ``entry`` names its
    ``.entry``; ``check`` (or the check of its ``kernel`` kind) judges the
    entry's instruction lines."""
    op: str
    kernel: str                      # "publish" | "consumer" | other
    entry: str                       # substring of the PTX .entry name
    compile: Callable[[str, str], object]  # (arch, dump_dir) -> compiled
    transport: str = "-"
    budget_ns: int = 0
    hidden: int | None = None        # None: runtime argument
    tp: int | None = None            # None: runtime argument
    pair_key: tuple | None = None    # publishes: unicast/multicast twins share it
    check: Callable[[list[str], "Variant"], list[str]] | None = None  # overrides the kind's check
    detail: str = ""                 # variant options shown in the table
    mode: str = "one_shot"           # kernels.lamport.protocol.MODES


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


def _watchdog_errors(lines: list[str], v: Variant) -> list[str]:
    """A consumer's watchdog build reads ``%globaltimer``, its plain build never."""
    timer = any("%globaltimer" in ln for ln in lines)
    if v.budget_ns and not timer:
        return ["watchdog variant without %globaltimer"]
    if not v.budget_ns and timer:
        return ["plain variant reads %globaltimer"]
    return []


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
    return errs + _watchdog_errors(lines, v)


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


def check_single_norm(lines: list[str], v: Variant) -> list[str]:
    """The single-kernel AllReduceNorm (:mod:`kernels.lamport.norm_single`):
    peer table, residual and gamma loads before ``griddepcontrol.wait``;
    after it the NEXT_STAGE and payload loads, then
    :func:`_single_tail_errors`."""
    wait = _first(lines, "griddepcontrol.wait")
    plain = [i for i, ln in enumerate(lines) if ln.startswith("ld.global.v4")]
    errs = []
    if len(plain) < 3 or max(plain[:2]) > wait or plain[2] < wait:
        errs.append("residual/gamma loads not before griddepcontrol.wait, or the payload "
                    "load not after it")
    return errs + _single_tail_errors(lines, v)


def _single_tail_errors(lines: list[str], v: Variant) -> list[str]:
    """What every single-kernel form does from its NEXT_STAGE load on: the
    stores (tp ``st.relaxed.sys``, or one ``multimem.st``), the spins,
    ``launch_dependents``, the sentinel write-back, the epilogue's barrier,
    then the acq_rel arrival and the stage advance (the last
    ``st.volatile.global.u32``); the cluster barrier's arrive between the
    NEXT_STAGE load and the first store, its wait after the epilogue's
    barrier and before the advance; the watchdog build alone reads
    ``%globaltimer``."""
    errs = []
    wait = _first(lines, "griddepcontrol.wait")
    launch = _first(lines, "griddepcontrol.launch_dependents")
    if wait < 0 or launch < 0:
        return ["missing griddepcontrol.wait/launch_dependents"]
    stage = _first(lines, "ld.volatile.global.u32", wait)
    stores = [i for i, ln in enumerate(lines)
              if ln.startswith("st.relaxed.sys.global.v4") or "multimem.st" in ln]
    spin = _first(lines, "ld.volatile.global.v4")
    sentinel = _first(lines, "0x80008000")
    barrier = _first(lines, "bar.sync", max(sentinel, 0))
    arrival = _first(lines, "atom.acq_rel.gpu.global.add.u32")
    advance = max((i for i, ln in enumerate(lines) if ln.startswith("st.volatile.global.u32")),
                  default=-1)
    cluster_arrive = _first(lines, "barrier.cluster.arrive")
    cluster_wait = _first(lines, "barrier.cluster.wait")
    want = 1 if v.transport == "multicast" else (v.tp or 1)
    kinds = {"multimem.st" in lines[i] for i in stores}
    if len(stores) != want or kinds != {v.transport == "multicast"}:
        errs.append(f"{v.transport} build: {len(stores)} stores "
                    f"({'multimem.st' if True in kinds else 'st.relaxed.sys'}), want {want}")
    elif not (wait < stage < min(stores) and max(stores) < spin < launch < sentinel < barrier
              < arrival < advance):
        errs.append(f"order wait<stage<stores<spin<launch<sentinel<bar<arrival<advance "
                    f"broken: {wait},{stage},{stores},{spin},{launch},{sentinel},{barrier},"
                    f"{arrival},{advance}")
    elif not (stage < cluster_arrive < min(stores, default=spin) and
              barrier < cluster_wait < advance):
        errs.append(f"cluster barrier out of place: arrive {cluster_arrive} not between the "
                    f"stage load {stage} and the first store, or wait {cluster_wait} not "
                    f"between bar.sync {barrier} and the advance {advance}")
    return errs + _watchdog_errors(lines, v)


def _first_store(lines: list[str]) -> int:
    """The index of a kernel's first peer store (``st.relaxed.sys`` or
    ``multimem.st``), ``len(lines)`` when it has none."""
    return min((i for i, ln in enumerate(lines)
                if ln.startswith("st.relaxed.sys") or "multimem.st" in ln), default=len(lines))


def check_single_embed_norm(lines: list[str], v: Variant) -> list[str]:
    """The single-kernel embedding (:mod:`kernels.lamport.embed_single`):
    enorm and hnorm loaded before ``griddepcontrol.wait``, ``previous``
    after it; the token's id loaded after the NEXT_STAGE load and before
    the first store, its row after the id; then :func:`_single_tail_errors`."""
    wait = _first(lines, "griddepcontrol.wait")
    stage = _first(lines, "ld.volatile.global.u32", max(wait, 0))
    first_store = _first_store(lines)
    plain = [i for i, ln in enumerate(lines) if ln.startswith("ld.global.v4")]
    ids = [i for i, ln in enumerate(lines) if ln.startswith("ld.global.s32")]
    errs = []
    if len(plain) != 4 or max(plain[:2]) > wait or plain[2] < wait:
        errs.append(f"{len(plain)} 16-byte loads: want enorm and hnorm before "
                    f"griddepcontrol.wait, previous and the row after it")
    if len(ids) != 1 or not stage < ids[0] < plain[-1] < first_store:
        errs.append(f"the id load ({ids}) not between the stage load ({stage}) and the row's "
                    f"load, or the row's not before the first store ({first_store})")
    return errs + _single_tail_errors(lines, v)


def check_single_finalize_norm(lines: list[str], v: Variant, *, config) -> list[str]:
    """The single-kernel MoE-finalize AllReduceNorm
    (:mod:`kernels.lamport.finalize_single`; ``config`` its
    :class:`kernels.lamport.compile.SingleFinalizeNormConfig`): residual,
    gamma, the routing metadata (and the shared expert with ``shared =
    "before"``) loaded before ``griddepcontrol.wait``; between the
    NEXT_STAGE load and the first store the finalize arithmetic, count-exact
    (:func:`_finalize_arithmetic_errors`, 8 BF16 a thread); then
    :func:`_single_tail_errors`."""
    c = config
    wait = _first(lines, "griddepcontrol.wait")
    stage = _first(lines, "ld.volatile.global.u32", max(wait, 0))
    first_store = _first_store(lines)
    frags = [i for i, ln in enumerate(lines) if ln.startswith("ld.global.v4")]
    errs = []
    before = [i for i in frags if i < wait]
    if len(before) != 2 + (c.shared == "before"):
        errs.append(f"{len(before)} 16-byte loads before griddepcontrol.wait, want residual, "
                    f"gamma{' and the shared expert' if c.shared == 'before' else ''}")
    errs += _finalize_arithmetic_errors(lines[:first_store], c, elements=8, wait=wait,
                                        stage=stage, fragments=frags)
    return errs + _single_tail_errors(lines, v)


def _finalize_arithmetic_errors(lines: list[str], c, *, elements: int, wait: int, stage: int,
                                fragments: list[int]) -> list[str]:
    """The finalize in ``lines`` (a kernel's lines up to its first store):
    one index and one weight load, before ``griddepcontrol.wait``; ``top_k``
    routed fragment loads after the stage load, a prefetch group's loads
    before its first FMA; exactly ``elements * top_k`` ``fma.rn.f32`` (the
    reference's ``fma=True``), ``elements`` ``add.rn.f32`` for the shared
    expert, one ``mul.rn.f32`` for a routed scaling factor other than 1 and
    one ``cvt.rn.bf16x2.f32`` a lane pair. ``fragments``: the indices of the
    kernel's loads of the fragment width."""
    errs = []
    k = c.top_k

    def where(pattern):
        return [i for i, ln in enumerate(lines) if ln.startswith(pattern)]

    index_loads = where("ld.global.s32")
    weight_loads = where("ld.global.f32" if c.fp32_weights else "ld.global.b16")
    if len(index_loads) != 1 or len(weight_loads) != 1:
        errs.append(f"{len(index_loads)} index / {len(weight_loads)} weight loads, want 1 / 1")
    elif max(index_loads + weight_loads) > wait:
        errs.append("routing metadata not loaded before griddepcontrol.wait")
    routed = [i for i in fragments if stage < i < len(lines)]
    fmas = where("fma.rn.f32")
    if len(routed) != k:
        errs.append(f"{len(routed)} routed loads after the stage load, want top_k={k}")
    if len(fmas) != elements * k:
        errs.append(f"{len(fmas)} fma.rn.f32, want E*top_k={elements * k}")
    elif len(routed) == k:
        group = c.prefetch_group or k
        for g in range(0, k, group):
            last_load = routed[min(g + group, k) - 1]
            if last_load > fmas[g * elements]:
                errs.append(f"prefetch group at route {g}: a load after the group's first FMA")
                break
    counts = {"add.rn.f32": elements if c.shared != "none" else 0,
              "mul.rn.f32": 0 if c.routed_scaling_factor == 1.0 else 1,
              "cvt.rn.bf16x2.f32": elements // 2}
    for op, n in counts.items():
        if len(where(op)) != n:
            errs.append(f"{len(where(op))} {op}, want {n}")
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

    frags = where(f"ld.global.{vec}")
    want = k + (c.shared != "none")
    if len(frags) != want:
        errs.append(f"{len(frags)} ld.global.{vec} fragment loads, want top_k + shared = {want}")
    before = [i for i in frags if i < wait]
    if len(before) != (c.shared == "before"):
        errs.append(f"{len(before)} fragment loads before griddepcontrol.wait "
                    f"with shared={c.shared!r}")
    errs += _finalize_arithmetic_errors(lines, c, elements=e, wait=wait, stage=stage,
                                        fragments=frags)
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


_SIGNIFICANT = ("ld.", "st.", "atom", "red", "multimem", "griddepcontrol", "bar", "membar",
                "fence", "fma", "add.rn", "mul.rn", "cvt")
UNORDERED_PAIRS = {"finalize"}
"""Pair keys whose twins are compared as opcode multisets, not sequences."""


def publish_pair_difference(key: tuple, unicast: list[str], multicast: list[str]) -> str | None:
    """How the multicast build of a publish differs from its unicast twin
    (same ``Variant.pair_key`` and arch) beyond the stores, or None. Keys
    whose first item is in :data:`UNORDERED_PAIRS` compare opcode multisets
    of memory, synchronization and FP instructions; the others the whole
    opcode sequence."""
    a, b = _skeleton(unicast), _skeleton(multicast)
    if a == b:
        return None
    if key[0] in UNORDERED_PAIRS:
        # The compiler schedules and rematerializes the address math of
        # the larger kernels differently around the tp stores: compare
        # the multisets of memory, synchronization and FP instructions.
        extra = collections.Counter(op for op in b if op.startswith(_SIGNIFICANT))
        extra.subtract(op for op in a if op.startswith(_SIGNIFICANT))
        if not any(extra.values()):
            return None
        diff = {op: n for op, n in extra.items() if n}
        return (f"unicast/multicast publishes differ beyond their stores: "
                f"multicast - unicast opcode counts {diff}")
    diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return (f"unicast/multicast publishes differ beyond their stores at op {diff}: "
            f"{a[diff:diff + 3]} vs {b[diff:diff + 3]}")


def check_variant(lines: list[str], v: Variant) -> list[str]:
    """The errors of ``v``'s entry lines: its own ``check``, else the check
    of its kind (``consumer``, ``publish``); a kind with neither is not
    checked beyond its entry's presence."""
    if v.check is not None:
        return v.check(lines, v)
    if v.kernel == "consumer":
        return check_consumer(lines, v)
    if v.kernel == "publish":
        return check_publish(lines, v)
    return []
