"""The indexer's ``jobs compile-check`` variants and their PTX checks.

Variants (each compiled for every requested arch, K = 7168, key 128, heads
64, gate 128): the projection kernel with the tactics of the tables (16 warps
no split at 1 and 16 tokens, 8 warps x 4-CTA cluster at 64 tokens), the
benchmark's early-launch build (2 warps x 16-CTA cluster at 1 token) and the
fused kernel's variants (``FUSED_VARIANTS``: FP32 head weights at 1 token,
BF16 at 16 tokens).

Checks on the kernel's instruction lines:
- ``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`` present;
- every weight load (``ld.global.nc``) before ``griddepcontrol.wait``, every
  input load (``ld.global.v4``) after it, ``wait`` before
  ``launch_dependents`` (after it exactly in the early-launch builds);
- split-K builds: ``barrier.cluster`` and ``mapa`` + ``ld.shared::cluster``
  (the DSMEM partial sums); no-split builds: none of them;
- fused builds: the mbarrier init and its cluster fence and the relaxed
  cluster arrive before ``griddepcontrol.wait``, then ``barrier.cluster.wait``,
  ``mapa`` + ``st.async...mbarrier::complete_tx`` (the (mean, M2) pushes),
  ``mbarrier.try_wait``, and the FP8 conversion ``cvt.rn.satfinite.e4m3x2``;
  predicated (``@p``) weight loads exactly in the skip-zero builds; no plain
  slot-code / LayerNorm loads (``ld.global.u32/.f32``) exactly in the
  early-consts builds (there they are ``ld.global.nc``, before the wait);
  exactly the split-K builds push their partial tiles
  (``st.async...complete_tx::bytes.v4.f32``) between the cluster wait and the
  ``mbarrier.try_wait`` on them; exactly the bulk builds copy the weight tile
  with ``cp.async.bulk`` before the PDL wait, read it with ``ld.shared.v4``
  after it and load no weights into registers;
- spread builds instead: no cluster barrier or DSMEM instruction at all
  (``mbarrier`` and the ``cp.async.bulk`` copies only in the bulk build, as
  above); after the PDL wait the key mailbox's ``st.volatile.global.u32``
  stores, then its ``ld.volatile.global.u32`` poll with a ``%globaltimer``
  deadline; in the no-exchange timing probe no mailbox access at all; in
  the key-first build the mailbox stores and the poll between the wait on
  the key row's copy and the wait on the other rows' (the exchange ahead of
  the second GEMV pass);
- stage-x builds: after the PDL wait every ``x`` load (``ld.global.v4``)
  before the ``x`` tile's ``st.shared.v4`` stores, then ``bar.sync``, then the
  fragment reads (``ld.shared.v4``) and the mma; ``st.shared.v4`` in no
  other build.
"""

from __future__ import annotations

from kernels.ptx_checks import Variant

CHECK_K = 7168
CHECK_SHAPE = dict(key=128, heads=64, gate=128)
#: (name, tokens, warps, split, launch_dependents first) of the projection variants.
PROJECTION_VARIANTS = (("proj16x1", 1, 16, 1, False), ("proj16x1", 16, 16, 1, False),
                       ("proj8x4", 64, 8, 4, False), ("proj2x16launch", 1, 2, 16, True))
#: (name, tokens, BF16 head weights, FusedVariant fields) of the fused variants.
FUSED_VARIANTS = (("fusedf32", 1, False, (False, False)), ("fusedbf16", 16, True, (False, False)),
                  ("fusedskip", 1, False, (True, False)), ("fusedearly", 16, False, (True, True)),
                  ("fusedlaunch", 1, True, (True, True, True)),
                  ("fusedsplitk", 1, False, (True, True, False, 1)),
                  ("fusedsplitk2", 16, True, (True, True, False, 2)),
                  ("fusedbulk", 1, False, (True, True, False, 1, True)),
                  ("fusedbulk2", 16, True, (True, True, False, 2, True)),
                  ("fusedbulkrows", 1, False, (True, True, False, 0, True)),
                  ("fusedspread", 1, False, (True, True, False, 0, False, True)),
                  ("fusedspreadbulk", 1, False, (True, True, False, 0, True, True)),
                  ("fusedspreadnox", 1, False, (True, True, False, 0, False, True, False)),
                  ("fusedkeyfirst", 1, False, (True, True, False, 0, True, True, True, True)),
                  ("fusedstagex", 16, True, (True, True, False, 2, False, False, True, False, True)),
                  ("fusedstagex1", 1, False,
                   (True, True, False, 1, False, False, True, False, True)))


def _first(lines, pattern):
    return next((i for i, ln in enumerate(lines) if pattern in ln), -1)


def _unguarded(line: str) -> str:
    """The instruction without its predicate guard (``@p ld...`` -> ``ld...``)."""
    return line.split(None, 1)[1] if line.startswith("@") and " " in line else line


def _all(lines, prefix):
    return [i for i, ln in enumerate(lines) if _unguarded(ln).startswith(prefix)]


def _common(lines, early_launch: bool = False) -> tuple[list[str], int]:
    errs = []
    wait = _first(lines, "griddepcontrol.wait")
    launch = _first(lines, "griddepcontrol.launch_dependents")
    if not any(ln.startswith("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") for ln in lines):
        errs.append("no mma.sync m16n8k16 bf16")
    if wait < 0 or launch < 0 or (launch < wait) != early_launch:
        errs.append(f"griddepcontrol.wait ({wait}) must {'follow' if early_launch else 'precede'} "
                    f"launch_dependents ({launch})")
    weights = _all(lines, "ld.global.nc")
    inputs = _all(lines, "ld.global.v4")
    if not weights:
        errs.append("no ld.global.nc weight loads")
    elif max(weights) > wait:
        errs.append("weight loads (ld.global.nc) after griddepcontrol.wait")
    if not inputs:
        errs.append("no ld.global.v4 input loads")
    elif min(inputs) < wait:
        errs.append("input loads (ld.global.v4) before griddepcontrol.wait")
    return errs, wait


def check_projection(lines: list[str], v) -> list[str]:
    errs, _ = _common(lines, early_launch=v.detail.endswith(",launch"))
    split = "split=1," not in v.detail + ","  # not split=16
    cluster = [_first(lines, p) for p in ("barrier.cluster", "mapa.shared::cluster",
                                           "ld.shared::cluster")]
    if split and min(cluster) < 0:
        errs.append("split-K build without barrier.cluster / mapa / ld.shared::cluster")
    if not split and max(cluster) >= 0:
        errs.append("no-split build with cluster / DSMEM ops")
    if any("st.async" in ln or "mbarrier" in ln for ln in lines):
        errs.append("projection build with st.async / mbarrier")
    return errs


def _check_bulk(lines: list[str], wait: int) -> list[str]:
    """The weight tile by the copy engine, before the PDL wait; read from
    shared memory (``ld.shared.v4``) after it; no weight loads into registers."""
    errs = []
    copies = _all(lines, "cp.async.bulk.shared::cluster.global")
    tile_reads = _all(lines, "ld.shared.v4.u32")
    if not copies or max(copies) > wait:
        errs.append(f"bulk build: cp.async.bulk weight copies {copies[:2]} missing or after "
                    f"griddepcontrol.wait ({wait})")
    if not tile_reads or min(tile_reads) < wait:
        errs.append("bulk build: no ld.shared.v4 weight-tile reads after griddepcontrol.wait")
    if _all(lines, "ld.global.nc.L1::no_allocate"):
        errs.append("bulk build with register weight loads (ld.global.nc.L1::no_allocate)")
    return errs


def _check_key_first(lines: list[str], wait: int) -> list[str]:
    """The exchange between the two GEMV passes: after the PDL wait, the wait
    on the key row's copy, the mailbox stores and the poll, then the wait on
    the other rows' copies, each pass's mma after its wait."""
    waits = [i for i in _all(lines, "mbarrier.try_wait") if i > wait]
    stores = _all(lines, "st.volatile.global.u32")
    polls = _all(lines, "ld.volatile.global.u32")
    mmas = _all(lines, "mma.sync")
    if len(waits) < 2 or not stores or not polls:
        return [f"key-first build: two mbarrier waits after griddepcontrol.wait ({waits[:3]}), "
                f"the mailbox stores and the poll needed"]
    first, second = waits[0], waits[-1]
    if not first < min(stores) <= max(polls) < second:
        return [f"key-first build: the mailbox stores ({min(stores)}) and the poll "
                f"({max(polls)}) not between the key row's wait ({first}) and the other rows' "
                f"({second})"]
    if not any(first < i < min(stores) for i in mmas) or not any(i > second for i in mmas):
        return ["key-first build: a GEMV pass's mma not after its mbarrier wait"]
    return []


def _check_stage_x(lines: list[str], wait: int) -> list[str]:
    """The ``x`` tile: after the PDL wait, every ``x`` load (``ld.global.v4``)
    before the first tile store (``st.shared.v4``), the stores before a CTA
    barrier, and after it the fragment reads (``ld.shared.v4``), then the
    mma; no ``x`` load after the barrier."""
    inputs = [i for i in _all(lines, "ld.global.v4") if i > wait]
    stores = [i for i in _all(lines, "st.shared.v4.u32") if i > wait]
    if not inputs or not stores:
        return [f"stage-x build: no x loads (ld.global.v4) {inputs[:2]} or tile stores "
                f"(st.shared.v4) {stores[:2]} after griddepcontrol.wait ({wait})"]
    barrier = next((i for i in _all(lines, "bar.sync") if i > max(stores)), -1)
    reads = [i for i in _all(lines, "ld.shared.v4.u32") if i > barrier]
    mmas = [i for i in _all(lines, "mma.sync") if i > wait]
    if not max(inputs) < min(stores) or barrier < 0:
        return [f"stage-x build: x loads {inputs[:2]}..{inputs[-1]} not all before the tile "
                f"stores {stores[:2]}, or no CTA barrier (bar.sync) after them"]
    if not reads or not mmas or not barrier < min(reads) < min(mmas):
        return [f"stage-x build: the barrier ({barrier}) < fragment reads (ld.shared.v4) "
                f"{reads[:1]} < mma {mmas[:1]} order broken"]
    return []


def _check_spread(lines: list[str], wait: int, *, bulk: bool, exchange: bool) -> list[str]:
    errs = []
    # A bulk copy's destination is spelled shared::cluster even with no cluster.
    cluster = [ln for ln in lines if any(p in ln for p in ("barrier.cluster", "mapa", "st.async"))
               or ("shared::cluster" in ln and not ln.startswith("cp.async.bulk."))
               or ("mbarrier" in ln and not bulk)]
    if cluster:
        errs.append(f"spread build with cluster / DSMEM instructions (or an mbarrier outside a "
                    f"bulk build): {cluster[:2]}")
    errs += _check_bulk(lines, wait) if bulk else []
    stores = _all(lines, "st.volatile.global.u32")
    polls = _all(lines, "ld.volatile.global.u32")
    timer = _first(lines, "%globaltimer")
    if not exchange:
        if stores or polls:
            errs.append(f"no-exchange spread build with mailbox stores / polls: "
                        f"{(stores + polls)[:2]}")
        return errs
    if not stores or min(stores) < wait:
        errs.append(f"spread build: key mailbox stores (st.volatile.global.u32) {stores[:2]} "
                    f"missing or before griddepcontrol.wait ({wait})")
    if not polls or not stores or min(polls) < min(stores) or timer < 0:
        errs.append(f"spread build: no ld.volatile.global.u32 poll after the mailbox stores "
                    f"{polls[:2]}, or no %globaltimer deadline ({timer})")
    return errs


def check_fused(lines: list[str], v) -> list[str]:
    errs, wait = _common(lines, early_launch="launch" in v.detail)
    if "spread" in v.detail:
        bulk = "bulk" in v.detail
        errs += _check_spread(lines, wait, bulk=bulk, exchange="no-exchange" not in v.detail)
        if "key-first" in v.detail:
            errs += _check_key_first(lines, wait)
        if _first(lines, "cvt.rn.satfinite.e4m3x2.f32") < 0:
            errs.append("no FP8 e4m3 conversion")
        if not bulk and not [ln for ln in lines if ln.startswith("@") and "ld.global.nc" in ln]:
            errs.append("spread build without predicated (@p) weight loads")
        late = [ln for ln in lines if _unguarded(ln).startswith(("ld.global.u32", "ld.global.f32"))]
        if late:
            errs.append(f"spread build with slot/norm loads after the PDL wait: {late[:2]}")
        return errs
    order = [_first(lines, p) for p in ("mbarrier.init.shared", "fence.mbarrier_init",
                                         "barrier.cluster.arrive.relaxed")]
    if min(order) < 0 or not order[0] < order[1] < order[2] < wait:
        errs.append(f"mbarrier init < fence < cluster arrive < griddepcontrol.wait broken: "
                    f"{order} vs wait {wait}")
    after = [_first(lines, p) for p in ("barrier.cluster.wait", "mapa.shared::cluster",
                                         "st.async.shared::cluster.mbarrier::complete_tx")]
    # The wait on the pushes: the first try_wait after the first push (a bulk
    # build also waits, earlier, on its weight tile).
    pushed = _first(lines[after[2] + 1:], "mbarrier.try_wait") if after[2] >= 0 else -1
    after.append(after[2] + 1 + pushed if pushed >= 0 else -1)
    if min(after) < 0 or not wait < after[0] < after[2] < after[3]:
        errs.append(f"cluster wait < st.async complete_tx < mbarrier.try_wait after the PDL "
                    f"wait broken: {after}")
    if _first(lines, "cvt.rn.satfinite.e4m3x2.f32") < 0:
        errs.append("no FP8 e4m3 conversion")
    guarded = [ln for ln in lines if ln.startswith("@") and "ld.global.nc" in ln]
    skip = "skip-zero" in v.detail
    bulk = "bulk" in v.detail
    copies = _all(lines, "cp.async.bulk.shared::cluster.global")
    if bulk:
        errs += _check_bulk(lines, wait)
    elif copies:
        errs.append("cp.async.bulk weight copies in a build that is not bulk")
    if skip and not bulk and not guarded:
        errs.append("skip-zero build without predicated (@p) weight loads")
    if not skip and guarded:
        errs.append("predicated weight loads in a build that loads every row")
    late = [ln for ln in lines if _unguarded(ln).startswith(("ld.global.u32", "ld.global.f32"))]
    early = "early" in v.detail
    if early and late:
        errs.append(f"early-consts build with slot/norm loads after the PDL wait: {late[:2]}")
    if not early and not late:
        errs.append("no slot code / norm loads (ld.global.u32/.f32) in a late-consts build")
    if "stage-x" in v.detail:
        errs += _check_stage_x(lines, wait)
    elif _all(lines, "st.shared.v4"):
        errs.append("st.shared.v4 x-tile stores in a build that is not stage-x")
    pushes = [i for i, ln in enumerate(lines)
              if ln.startswith("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32")]
    if "split-k" in v.detail:
        # The partial tiles go out after the cluster wait and before the
        # CTA's wait on its own gather mbarrier.
        if not pushes or not after[0] < min(pushes) < after[3]:
            errs.append(f"split-K build: partial-tile st.async.v4 pushes {pushes[:2]} not between "
                        f"the cluster wait ({after[0]}) and the wait on them ({after[3]})")
    elif pushes:
        errs.append("st.async.v4 partial-tile pushes in a build that does not split K")
    return errs


def indexer_variants(hiddens, tps) -> list[Variant]:
    """The compile-check variants (the indexer's declaration's
    ``compile_variants``): see the module docstring; the shapes are fixed,
    ``hiddens`` and ``tps`` are not used (the indexer is no collective)."""
    from kernels.indexer.compile import (FusedConfig, ProjectionConfig, compile_fused,
                                         compile_projection)
    from kernels.indexer.layout import FusedVariant, Tactic, padded_heads

    out = []
    for name, tokens, warps, split, early in PROJECTION_VARIANTS:
        def build(arch, dump, tokens=tokens, warps=warps, split=split, early=early):
            return compile_projection(ProjectionConfig(
                **CHECK_SHAPE, k=CHECK_K, tokens=tokens, tactic=Tactic(warps, split), arch=arch,
                early_launch=early), dump_dir=dump)
        out.append(Variant("indexer", name, "ProjectionKernel", build, hidden=CHECK_K,
                           check=check_projection,
                           detail=f"M={tokens},warps={warps},split={split}"
                                  + (",launch" if early else "")))
    for name, tokens, bf16, flags in FUSED_VARIANTS:
        variant = FusedVariant(*flags)

        def build(arch, dump, tokens=tokens, bf16=bf16, variant=variant):
            return compile_fused(FusedConfig(
                **CHECK_SHAPE, k=CHECK_K, tokens=tokens,
                padded=padded_heads(CHECK_SHAPE["heads"]), bf16=bf16, arch=arch,
                variant=variant), dump_dir=dump)
        out.append(Variant("indexer", name, "fused_kernel", build, hidden=CHECK_K,
                           check=check_fused,
                           detail=f"M={tokens},{'bf16' if bf16 else 'fp32'} weights,"
                                  f"{variant.name}"))
    return out
