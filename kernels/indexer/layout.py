"""DSA indexer stage: constants, tactic table, fused row layout (no CuTe DSL).

Everything here is plain Python (no torch, no cutlass), so the host classes,
the references, the jobs and the CPU tests share one definition of how the
projection kernel tiles its work. The seed (``seeds/001_...``) references
these names without defining them; each constant below states why it has its
value (from the seed's own usage or the DeepSeek-V3.2 / GLM-5 model config).

The projection kernel computes ``x @ weight.T`` for the concatenated rows
``[wk (key); weights_proj (heads); kpool gate (gate)]`` on ``mma.sync``
m16n8k16: tokens are the m16 (``TILE``), weight rows the n8 (``ROWS``), one
CTA (or one cluster of ``split`` CTAs splitting K) per ``ROWS`` weight rows,
``warps`` warps per CTA each summing a contiguous ``span = K / (warps *
split)`` of K. The reduction tree this implies is modelled in
:func:`kernels.reference.indexer.projection_accumulate`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

# --- constants the seed references without defining ------------------------

#: Weight rows per CTA: the n8 of mma.sync m16n8k16 (the seed's "owns 8 weight
#: rows"; a head CTA holds one head row and "up to seven gate rows").
ROWS = 8
#: Tokens per mma tile: the m16 of m16n8k16 (rows g and g + 8 of a fragment).
TILE = 16
#: K elements per mma.sync step (the k16); each lane quad holds 4 of them.
MMA_K = 16
#: Query head dim: DeepSeek-V3.2 / GLM-5 ``index_head_dim`` = 128; the fused
#: kernel gives each of a warp's 32 lanes 4 BF16 of q and one int32 word of
#: 4 FP8 outputs (``DIM // 4`` words a head).
DIM = 128
#: FP8 quantization block: one scale per (token, head), i.e. the whole head
#: (DeepSeek-V3.2 ``act_quant`` block_size 128 = index_head_dim); the fused
#: kernel keeps one ``scales[t]`` per head CTA and folds it into that head's
#: weight, which needs exactly one block per head.
QUANT_BLOCK = DIM
#: Head count the MQA-logits kernel is given at least (``padded = max(heads,
#: MQA_MIN_HEADS)``): 64 = DeepSeek-V3.2 ``index_n_heads``. The seed pads with
#: zero heads, which only happens for models with fewer heads such as GLM-5's
#: 32, so the minimum is above 32. ASSUMPTION (the seed does not say): DeepGEMM's
#: SM90 MQA logits accept {32, 64} heads, so 32 would also be legal there.
MQA_MIN_HEADS = 64
#: Warps per CTA of the fused kernel: the seed's projection tactic for every
#: token count ``fuse`` accepts is (16 warps, no K split), and the fused kernel
#: must use the same tactic for its bit-identity claim.
FUSED_WARPS = 16
#: Partial C tiles the fused kernel keeps at the most: the split-K variant
#: with two row groups a warp receives 16 CTAs x 2 K halves of them. Shared
#: memory and the token limit are sized for it, whatever the variant.
FUSED_PARTIAL_SLOTS = 2 * FUSED_WARPS
#: K must be a multiple of this (the seed's ``k % 1024``): the largest
#: ``32 * warps * split`` of the tactic table (8 warps x 4 CTAs x 32 = 1024),
#: so every tactic's span is a whole number of 32-element fragment rows.
K_MULTIPLE = 1024
#: Key width: ``index_head_dim`` = 128 (DeepSeek-V3.2, GLM-5); the key rows
#: are one cluster of ``KEY // ROWS`` = 16 CTAs in the fused layout.
KEY = 128
#: Kpool gate rows (GLM-5-Next pooled indexer, issue 6's test shape).
GATE = 128
#: Largest cluster the hardware launches (sm_90 / sm_100: 8 portable, 16
#: with the non-portable opt-in), bounding ``split`` and the key cluster.
MAX_CLUSTER = 16
#: Dynamic shared memory a block may opt into on sm_90 and sm_100 (227 KiB).
MAX_SMEM_BYTES = 232_448
#: Largest token count the tactic tables cover: the largest power of two whose
#: split-K tactic (8 warps, 4 CTAs) fits ``MAX_SMEM_BYTES`` (512 tokens take
#: 147,584 B; 1024 would take 295,040 B). Beyond it the stock path runs.
MAX_TOKENS = 512
#: Rows a key CTA of the ``spread`` fused variant holds (of its eight
#: slots): 64 key CTAs at key 128, so the key's 1.8 MB at K 7168 is read by
#: half the GPU, each key CTA reading less than a head CTA (it still has the
#: key's exchange to do after its GEMV).
SPREAD_KEY_ROWS = 2
#: Rows a head CTA of the ``spread`` variant holds at the most: its head row
#: and up to ``SPREAD_ROWS - 1`` gate rows; gate rows left over after the
#: last head fill CTAs of ``SPREAD_ROWS`` rows. At heads 64, gate 128: 64 key
#: CTAs + 64 head CTAs = 128 CTAs, one a SM of the H200's 132.
SPREAD_ROWS = 3
#: The most tokens a ``stage_x`` variant's ``x`` tile holds: 4 token tiles,
#: 60 KB of shared memory at K 7168 (``FusedVariant.x_stage_bytes``).
STAGE_X_MAX_TOKENS = 4 * TILE
#: A ``spread`` key-mailbox slot before its value arrives: an FP32 NaN no
#: arithmetic produces (the GPU's NaNs are 0x7FC00000 or the input's).
MAILBOX_SENTINEL = 0xFFFFFFFF
#: What a key value whose bits equal the sentinel is sent as, and what the
#: reducer takes for a value that never came (a NaN key: the check fails).
MAILBOX_NAN = 0x7FC00000
#: The spread reducer's poll gives up after this long (ns): a lost key CTA
#: gives a NaN key, never a hang.
MAILBOX_DEADLINE_NS = 50_000_000
#: Bits of a slot code's row index (``code & 0xFFFF``); the kind sits above.
SLOT_INDEX_BITS = 16

# Slot kinds of the fused layout (the seed's _NONE, _KEY, _HEAD, _GATE): the
# kernel reads ``code >> 16`` as the kind and ``code & 0xFFFF`` as the row
# within that output.
SLOT_NONE = 0
SLOT_KEY = 1
SLOT_HEAD = 2
SLOT_GATE = 3


# --- shared memory (the seed's formulas) ------------------------------------

def projection_smem_bytes(tokens: int, warps: int) -> int:
    """Bytes of dynamic shared memory of the projection kernel: per-warp partial
    C tiles ``[warps, tiles, 32 lanes, 4]`` FP32 plus ``tokens * ROWS`` FP32
    cluster sums, plus the seed's 128 B alignment slack."""
    tiles = -(-tokens // TILE)
    return (warps * tiles * 32 * 4 + tokens * ROWS) * 4 + 128


def fused_smem_bytes(tokens: int, warps: int, key: int) -> int:
    """Bytes of dynamic shared memory of the fused kernel with ``warps``
    partial C tiles (:data:`FUSED_PARTIAL_SLOTS` bounds every variant): the projection's plus
    q scales, key values, LayerNorm stats, affine, slot codes, the cluster's
    (mean, M2) mailbox and its mbarrier (the seed's ``fused_smem``)."""
    extra = (tokens * (ROWS + 5 + 2 * key // ROWS) + 3 * ROWS) * 4 + 128
    return projection_smem_bytes(tokens, warps) + extra


def bulk_row_stride(k: int, key: int = KEY, *, split_k: bool = True) -> int:
    """Bytes between two rows of a shared tile: a ``bulk`` variant's weight
    rows, a ``stage_x`` variant's token rows of ``x``. The row (with
    ``split_k``, the CTA's K part, ``K / (key / ROWS)`` BF16; else all ``K``)
    padded to 64 mod 128, so the eight lanes of a quarter-warp reading rows g
    and g + 1 at 16-byte chunks q hit eight different 16-byte bank groups."""
    row = (k // (key // ROWS) if split_k else k) * 2
    return row + (64 - row) % 128


def bulk_tile_bytes(k: int, key: int = KEY, *, split_k: bool = True) -> int:
    """Shared memory of a ``bulk`` variant's weight tile at
    :func:`bulk_row_stride`: with ``split_k`` the cluster's ``key`` rows over
    the CTA's K part, else the CTA's own ``ROWS`` rows over all of K."""
    return (key if split_k else ROWS) * bulk_row_stride(k, key, split_k=split_k)


# --- tactics ----------------------------------------------------------------

@dataclass(frozen=True)
class Tactic:
    """How the projection kernel splits K for one token range.

    ``warps`` warps per CTA each sum a contiguous span of K; ``split`` CTAs of
    a cluster each own a contiguous K part and add their partial sums through
    DSMEM (``split == 1``: no cluster). Frozen and hashable: a compile-cache
    key. Invalid values raise ValueError naming the field.
    """

    warps: int
    split: int

    def __post_init__(self) -> None:
        for name in ("warps", "split"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"Tactic.{name} must be an int, got {value!r}")
        if not 1 <= self.warps <= 32:
            raise ValueError(f"Tactic.warps must be in [1, 32] (1024 threads), got {self.warps}")
        if not 1 <= self.split <= MAX_CLUSTER:
            raise ValueError(f"Tactic.split must be in [1, {MAX_CLUSTER}] (cluster size), got {self.split}")

    @property
    def k_multiple(self) -> int:
        """K must be a multiple of this: each warp's span is whole 32-element rows."""
        return 32 * self.warps * self.split

    def span(self, k: int) -> int:
        """Contiguous K elements one warp sums; ValueError if K does not tile."""
        if k <= 0 or k % self.k_multiple:
            raise ValueError(
                f"K = {k} does not tile for {self}: it must be a positive multiple of {self.k_multiple}"
            )
        return k // (self.warps * self.split)

    def smem_bytes(self, tokens: int) -> int:
        """Dynamic shared memory of the projection kernel (seed: ``smem + 128``)."""
        return projection_smem_bytes(tokens, self.warps)


@dataclass(frozen=True)
class FusedVariant:
    """Which loads the fused kernel issues, and where, and how its CTAs split
    the GEMV. The load fields move loads, never arithmetic, so they write the
    same bits; ``split_k`` changes the sum tree, and its outputs equal the
    projection kernel's at :meth:`tactic` bit for bit instead.

    ``skip_zero``: the zero (padding) rows of the fused layout are not loaded
    (:func:`fused_row_live`; their products are never stored), so the kernel
    reads each weight row once instead of every slot. ``early_consts``: the
    slot codes and the key CTAs' LayerNorm weight and bias are loaded before
    the PDL wait with the weights (non-coherent loads of constant parameters),
    instead of after the GEMV (a dependent round trip in the epilogue).
    ``early_launch``: ``griddepcontrol.launch_dependents`` first thing in the
    kernel instead of after ``griddepcontrol.wait``, so the next kernel's CTAs
    may take free SMs (and issue their own pre-wait loads) while this one
    still waits on its predecessor; safe because a dependent's own wait still
    waits for this grid's completion and memory flush.

    ``split_k`` (0, 1 or 2): with ``G = split_k`` >= 1 the CTAs of a cluster
    split K instead of rows. CTA ``c`` of a cluster of ``n = key / ROWS`` CTAs
    sums K part ``c`` (``K / n`` wide) of all the cluster's ``n`` row groups:
    warp ``w`` takes the ``G`` groups ``G (w mod n/G) ..`` over K half
    ``w div (n/G)`` of that part (``G`` = 1: the whole part), so one load of
    ``x`` feeds ``G`` groups' mma. Each warp pushes a group's partial tile
    into the shared memory of the CTA owning the group (``st.async``
    completing on an mbarrier), which adds the parts in the projection's
    order at ``Tactic(G, n)`` (K halves from +0.0 within a CTA, CTAs from
    +0.0 in rank order) and runs the same epilogue. Each CTA reads ``1 / n``
    of ``x`` (at 16 tokens and K 7168: 14 KB instead of 229 KB). Needs
    ``n`` == ``FUSED_WARPS``.

    ``bulk`` (with ``skip_zero``): the CTA's weight tile comes by
    ``cp.async.bulk`` into shared memory, one copy a live row, issued before
    the PDL wait and completing on an mbarrier, instead of by ``ld.global``
    into registers: the copy engine keeps the whole tile in flight, which the
    load units' outstanding requests do not (:func:`bulk_tile_bytes`). With
    ``split_k`` the tile is the cluster's live rows over the CTA's K part
    (one ``K / 16`` copy a row); without, the CTA's own eight rows over all of
    K (one whole-row copy, ``2 K`` bytes, a row).

    ``stage_x`` (with ``split_k``): the CTA's K part of ``x`` (``tokens x K /
    n`` BF16) comes into shared memory once, right after the PDL wait, by all
    threads with coalesced 16-byte loads (rows :func:`bulk_row_stride` apart),
    and the warps read their ``x`` fragments there (``ld.shared.v4``, no bank
    conflict) instead of each warp loading them from global memory: in a
    split-K CTA ``16 / G`` warps load the same ``x`` (at 16 tokens and K 7168,
    112 KB of fragments a CTA for 14 KB of data). The same words reach the
    same lanes, so the bits are the ``split_k`` variant's. At most
    :data:`STAGE_X_MAX_TOKENS` tokens.

    ``spread`` (with ``skip_zero`` and ``early_consts``, without ``split_k``):
    the grid of :func:`spread_layout`, no clusters, every CTA
    reading fewer rows (at heads 64: 128 CTAs of 2 or 3 rows instead of 80 of
    up to 8), straight from the concatenated weight. The key's LayerNorm,
    which needs every key row, goes through a global mailbox instead of the
    key cluster's DSMEM: each key CTA stores its BF16-rounded values into
    their slots (FP32 words, :data:`MAILBOX_SENTINEL` until written), and key
    CTA 0 polls every slot (``ld.volatile``; a NaN after
    :data:`MAILBOX_DEADLINE_NS`, never a hang), resets it, and runs the
    LayerNorm of the whole key with the same partitions and order as the
    cluster (16 partitions of 8 rows, Chan in partition order). The GEMV of a
    row is the default's (16 warps over K), so every output is the default
    variant's bit for bit but the key, which is the reference LayerNorm's
    within 1 BF16 ULP as everywhere. No CTA waits on another but key CTA 0,
    and it only on CTAs that wait on nothing, so the grid needs no
    co-residency. With ``bulk`` each CTA's 2-3 rows come by whole-row copies
    (its slots' source rows) instead of register loads, whose warp loads
    carry only the live slots' lanes (2-3 of 8 rows, 128-192 of 512 bytes).

    ``key_first`` (with ``spread`` and ``bulk``): the grid of
    :func:`key_first_layout`, one CTA a key row, each holding its key row
    and one or two of the other rows, so that the key's exchange can hide
    behind the rest of the stream instead of following it. Each CTA's key
    row comes by its own copy on its own mbarrier. The CTA runs the GEMV
    twice over the same ``x`` fragments: first once the key row has
    landed, storing only the key slot's sum into the mailbox, then once
    the other rows have. The reducer is the last CTA, which holds the
    fewest rows. It gathers and norms the key between its two passes. The
    sums are the spread variant's, so are the bits. Needs one token tile
    (``tokens <= TILE``) and ``heads <= key``.

    ``exchange`` (default True; False only with ``spread``) is a timing
    probe, never a candidate or a table pick: the key CTAs store their
    un-normed BF16 key straight to the key output and nobody reduces it, so
    the key is wrong by design and the benchmark's ``--variants`` times the
    spread grid without its mailbox and reducer (:data:`TIMING_PROBES`).
    Frozen and hashable: part of the compile-cache key."""

    skip_zero: bool = False
    early_consts: bool = False
    early_launch: bool = False
    split_k: int = 0
    bulk: bool = False
    spread: bool = False
    exchange: bool = True
    key_first: bool = False
    stage_x: bool = False

    def __post_init__(self) -> None:
        for name in ("skip_zero", "early_consts", "early_launch", "bulk", "spread", "exchange",
                     "key_first", "stage_x"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"FusedVariant.{name} must be a bool, got {getattr(self, name)!r}")
        if not isinstance(self.split_k, int) or isinstance(self.split_k, bool) or self.split_k not in (0, 1, 2):
            raise ValueError(f"FusedVariant.split_k must be 0, 1 or 2, got {self.split_k!r}")
        if self.bulk and not self.skip_zero:
            raise ValueError(f"FusedVariant.bulk needs skip_zero, got skip_zero={self.skip_zero}")
        if self.spread and not (self.skip_zero and self.early_consts and not self.split_k):
            raise ValueError(f"FusedVariant.spread needs skip_zero and early_consts, without "
                             f"split_k, got skip_zero={self.skip_zero}, early_consts="
                             f"{self.early_consts}, split_k={self.split_k}")
        if not self.exchange and not self.spread:
            raise ValueError("FusedVariant.exchange=False (a timing probe) needs spread, got "
                             "spread=False")
        if self.key_first and not (self.spread and self.bulk and self.exchange):
            raise ValueError(f"FusedVariant.key_first needs spread and bulk, with the exchange, "
                             f"got spread={self.spread}, bulk={self.bulk}, "
                             f"exchange={self.exchange}")
        if self.stage_x and not self.split_k:
            raise ValueError(f"FusedVariant.stage_x needs split_k, got split_k={self.split_k}")

    @property
    def token_limit(self) -> int | None:
        """The most tokens this variant runs (``key_first``: one token tile,
        ``TILE``; ``stage_x``: :data:`STAGE_X_MAX_TOKENS`), or None: the
        projection's ``fused_max_tokens``."""
        if self.key_first:
            return TILE
        return STAGE_X_MAX_TOKENS if self.stage_x else None

    def runs(self, tokens: int) -> bool:
        """Whether this variant runs ``tokens`` tokens (:attr:`token_limit`)."""
        return self.token_limit is None or tokens <= self.token_limit

    def gather_bytes(self, tokens: int, key: int = KEY) -> int:
        """Shared memory of the spread reducer's gathered key, FP32 ``[tokens,
        key]`` (0 unless ``spread``)."""
        return tokens * key * 4 if self.spread else 0

    def layout(self, key: int, heads: int, gate: int) -> tuple[list[int], int]:
        """This variant's (source row of every slot, first head CTA):
        :func:`key_first_layout` with ``key_first``, :func:`spread_layout`
        with ``spread``, else :func:`fused_layout`."""
        if self.key_first:
            return key_first_layout(key, heads, gate)
        return spread_layout(key, heads, gate) if self.spread else fused_layout(key, heads, gate)

    def bulk_tile_bytes(self, k: int, key: int = KEY) -> int:
        """Shared memory of this variant's weight tile (0 unless ``bulk``),
        with ``key_first`` also its key row's mbarrier (16 bytes)."""
        if not self.bulk:
            return 0
        return bulk_tile_bytes(k, key, split_k=bool(self.split_k)) + (16 if self.key_first else 0)

    def x_stage_bytes(self, tokens: int, k: int, key: int = KEY) -> int:
        """Shared memory of the ``stage_x`` variant's ``x`` tile, ``tokens``
        rows :func:`bulk_row_stride` apart (0 unless ``stage_x``)."""
        return tokens * bulk_row_stride(k, key) if self.stage_x else 0

    @property
    def name(self) -> str:
        parts = ((["skip-zero"] if self.skip_zero else []) + (["early"] if self.early_consts else [])
                 + (["launch"] if self.early_launch else []) + ([f"split-k{self.split_k if self.split_k > 1 else ''}"] if self.split_k else [])
                 + (["bulk"] if self.bulk else []) + (["spread"] if self.spread else [])
                 + (["key-first"] if self.key_first else [])
                 + (["stage-x"] if self.stage_x else [])
                 + ([] if self.exchange else ["no-exchange"]))
        return "+".join(parts) or "load-all"

    def tactic(self, key: int = KEY) -> Tactic:
        """The projection tactic whose sum tree this variant's outputs share
        (bit for bit): ``Tactic(FUSED_WARPS, 1)``, or with ``split_k``
        ``Tactic(split_k, key / ROWS)``. ValueError if ``split_k`` and the
        key cluster is not ``FUSED_WARPS`` CTAs."""
        if not self.split_k:
            return Tactic(FUSED_WARPS, 1)
        if key // ROWS != FUSED_WARPS or key % ROWS:
            raise ValueError(f"split_k needs a key cluster of {FUSED_WARPS} CTAs (key = "
                             f"{FUSED_WARPS * ROWS}), got key = {key}")
        return Tactic(self.split_k, key // ROWS)


#: The fused kernel's candidates the benchmark's ``--sweep`` times side by
#: side: today's kernel, then each change added in turn.
FUSED_CANDIDATES = (FusedVariant(), FusedVariant(skip_zero=True),
                    FusedVariant(skip_zero=True, early_consts=True),
                    FusedVariant(skip_zero=True, early_consts=True, early_launch=True),
                    FusedVariant(skip_zero=True, early_consts=True, split_k=1),
                    FusedVariant(skip_zero=True, early_consts=True, split_k=2),
                    FusedVariant(skip_zero=True, early_consts=True, split_k=1, bulk=True),
                    FusedVariant(skip_zero=True, early_consts=True, split_k=2, bulk=True),
                    FusedVariant(skip_zero=True, early_consts=True, bulk=True),
                    FusedVariant(skip_zero=True, early_consts=True, spread=True),
                    FusedVariant(skip_zero=True, early_consts=True, bulk=True, spread=True),
                    FusedVariant(skip_zero=True, early_consts=True, bulk=True, spread=True,
                                 key_first=True),
                    FusedVariant(skip_zero=True, early_consts=True, split_k=1, stage_x=True),
                    FusedVariant(skip_zero=True, early_consts=True, split_k=2, stage_x=True))

#: Builds the benchmark's ``--variants`` may time but nothing else runs: the
#: spread grids without their key exchange (``FusedVariant.exchange``), whose
#: key is un-normed by design. They tell the exchange's cost from the grid's.
TIMING_PROBES = tuple(replace(v, exchange=False)
                      for v in FUSED_CANDIDATES if v.spread and not v.key_first)


@dataclass(frozen=True)
class TacticRange:
    """``tactic`` serves token counts up to and including ``max_tokens``."""

    max_tokens: int
    tactic: Tactic


@dataclass(frozen=True)
class FuseRule:
    """When the query epilogue runs inside the projection kernel (seed ``_fuse``):
    ``tokens <= max_tokens`` for any head count, or ``heads >= wide_heads``
    and ``tokens <= wide_max_tokens``."""

    max_tokens: int
    wide_heads: int
    wide_max_tokens: int

    def __call__(self, tokens: int, heads: int) -> bool:
        return tokens <= self.max_tokens or (heads >= self.wide_heads and tokens <= self.wide_max_tokens)

    @property
    def largest_tokens(self) -> int:
        return max(self.max_tokens, self.wide_max_tokens)


@dataclass(frozen=True)
class VariantRule:
    """Where the fused kernel runs ``variant`` instead of its table's default:
    ``min_tokens <= tokens <= max_tokens`` at a K in ``k`` and a head count in
    ``heads`` (an empty tuple: any). A table takes its first matching rule."""

    variant: FusedVariant
    min_tokens: int
    max_tokens: int
    k: tuple[int, ...] = ()
    heads: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.variant, FusedVariant):
            raise ValueError(f"VariantRule.variant must be a FusedVariant, got {self.variant!r}")
        if not self.variant.exchange:
            raise ValueError(f"VariantRule.variant {self.variant.name} is a timing probe (its key "
                             f"is un-normed), never a table pick")
        if not self.variant.runs(self.max_tokens):
            raise ValueError(f"VariantRule.variant {self.variant.name} runs at most "
                             f"{self.variant.token_limit} tokens, got max_tokens={self.max_tokens}")
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"VariantRule tokens must satisfy 1 <= min_tokens <= max_tokens, got "
                             f"{self.min_tokens}..{self.max_tokens}")
        for name in ("k", "heads"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not all(isinstance(v, int) and v > 0 for v in value):
                raise ValueError(f"VariantRule.{name} must be a tuple of positive ints, got {value!r}")

    def matches(self, k: int, heads: int, tokens: int) -> bool:
        return (self.min_tokens <= tokens <= self.max_tokens and (not self.k or k in self.k)
                and (not self.heads or heads in self.heads))


@dataclass(frozen=True)
class TacticTable:
    """A validated token-range table of tactics plus the fuse rule, for one
    GPU. Ranges are consecutive (``1..ranges[0].max_tokens``, then up to the
    next bound, ...); every tactic fits ``MAX_SMEM_BYTES`` at its range's
    largest token count; every token count the fuse rule accepts maps to the
    fused kernel's tactic, ``fused_variant.tactic()`` (the seed's bit-identity
    claim: the fused and the two-kernel path give the same bits); where a
    :class:`VariantRule` picks another fused variant for a (K, heads, tokens)
    cell, :meth:`lookup` given K and heads returns that variant's tactic.
    ``source`` says where the numbers come from."""

    name: str
    ranges: tuple[TacticRange, ...]
    fuse: FuseRule
    source: str
    #: The fused kernel's default variant.
    fused_variant: FusedVariant = FusedVariant()
    #: Cells where another variant runs (first match wins), all inside the
    #: fuse rule's token range.
    variant_rules: tuple[VariantRule, ...] = ()

    def __post_init__(self) -> None:
        for rule in self.variant_rules:
            if not isinstance(rule, VariantRule):
                raise ValueError(f"tactic table {self.name!r}: {rule!r} is not a VariantRule")
            if rule.max_tokens > self.fuse.largest_tokens:
                raise ValueError(f"tactic table {self.name!r}: {rule.variant.name} up to "
                                 f"{rule.max_tokens} tokens, beyond the fuse rule's "
                                 f"{self.fuse.largest_tokens}")
            if rule.variant.bulk:
                if not rule.k:
                    raise ValueError(f"tactic table {self.name!r}: a bulk rule must name its K "
                                     f"(the weight tile grows with K)")
                for k in rule.k:
                    need = (fused_smem_bytes(rule.max_tokens, FUSED_PARTIAL_SLOTS, KEY)
                            + rule.variant.bulk_tile_bytes(k))
                    if need > MAX_SMEM_BYTES:
                        raise ValueError(f"tactic table {self.name!r}: {rule.variant.name} at K = "
                                         f"{k}, {rule.max_tokens} tokens needs {need} B of shared "
                                         f"memory, more than {MAX_SMEM_BYTES}")
        if not isinstance(self.fused_variant, FusedVariant):
            raise ValueError(f"tactic table {self.name!r}: fused_variant must be a FusedVariant, "
                             f"got {self.fused_variant!r}")
        if not self.ranges:
            raise ValueError(f"tactic table {self.name!r} has no ranges")
        low = 1
        for r in self.ranges:
            if not isinstance(r, TacticRange) or not isinstance(r.tactic, Tactic):
                raise ValueError(f"tactic table {self.name!r}: {r!r} is not a TacticRange of a Tactic")
            if r.max_tokens < low:
                raise ValueError(
                    f"tactic table {self.name!r}: bounds must increase from 1, got {r.max_tokens} after {low - 1}"
                )
            smem = r.tactic.smem_bytes(r.max_tokens)
            if smem > MAX_SMEM_BYTES:
                raise ValueError(
                    f"tactic table {self.name!r}: {r.tactic} at {r.max_tokens} tokens needs {smem} B "
                    f"of shared memory, more than {MAX_SMEM_BYTES}"
                )
            if K_MULTIPLE % r.tactic.k_multiple:
                raise ValueError(
                    f"tactic table {self.name!r}: {r.tactic} needs K % {r.tactic.k_multiple}, "
                    f"which K % {K_MULTIPLE} does not guarantee"
                )
            low = r.max_tokens + 1
        fused = self.fused_variant.tactic()
        for tokens in range(1, self.fuse.largest_tokens + 1):
            got = self.lookup(tokens)
            if got != fused:
                raise ValueError(
                    f"tactic table {self.name!r}: the fuse rule accepts {tokens} tokens but the "
                    f"projection tactic there is {got}, not the fused kernel's {fused}"
                )
        need = fused_smem_bytes(self.fuse.largest_tokens, FUSED_PARTIAL_SLOTS, KEY)
        if need > MAX_SMEM_BYTES:
            raise ValueError(f"tactic table {self.name!r}: the fused kernel at "
                             f"{self.fuse.largest_tokens} tokens needs {need} B of shared memory")

    @property
    def max_tokens(self) -> int:
        return self.ranges[-1].max_tokens

    def fused_variant_for(self, k: int, heads: int, tokens: int) -> FusedVariant:
        """The fused variant of a (K, heads, tokens) cell: the first matching
        :class:`VariantRule`'s, else :attr:`fused_variant`."""
        for rule in self.variant_rules:
            if rule.matches(k, heads, tokens):
                return rule.variant
        return self.fused_variant

    def lookup(self, tokens: int, k: int | None = None, heads: int | None = None) -> Tactic:
        """The tactic for ``tokens``; ValueError outside ``1..max_tokens``.
        Given ``k`` and ``heads``, where the fuse rule accepts the cell, the
        tactic of its fused variant (:meth:`fused_variant_for`), so the
        projection alone gives the fused kernel's bits."""
        if not isinstance(tokens, int) or isinstance(tokens, bool):
            raise ValueError(f"tokens must be an int, got {tokens!r}")
        if k is not None and heads is not None and 1 <= tokens and self.fuse(tokens, heads):
            variant = self.fused_variant_for(k, heads, tokens)
            if variant != self.fused_variant:
                return variant.tactic()
        for r in self.ranges:
            if 1 <= tokens <= r.max_tokens:
                return r.tactic
        raise ValueError(
            f"tokens = {tokens} is outside tactic table {self.name!r} (1..{self.max_tokens}); "
            f"larger batches take the stock path"
        )


#: The seed's table and fuse rule, "from a GB300 sweep" (sm_103).
GB300 = TacticTable(
    name="gb300",
    ranges=(TacticRange(16, Tactic(16, 1)), TacticRange(MAX_TOKENS, Tactic(8, 4))),
    fuse=FuseRule(max_tokens=2, wide_heads=32, wide_max_tokens=16),
    source="seed _tactic/_fuse, tuned on GB300",
)
#: H200 (sm_90), measured 2026-11-29 (``python -m benchmarks.indexer --sweep``,
#: K 7168, key 128, gate 128, heads 64 and 32; docs/results/indexer_h200_2026-11-29.md):
#: the fused kernel beat the two-step path at every measured token count up to
#: 64 (3.0-15x, heads 32 and 64), so the fuse rule reaches 64 tokens for
#: heads >= 32, and the table keeps the fused kernel's tactic (16 warps, no
#: split) up to 64 tokens so a planned step's outputs never depend on the path
#: (the projection kernel alone is then not on the stage's path there; alone,
#: 8 warps x 4 CTAs was up to 1.4x faster at 64 tokens and within 10% at
#: 1-16). Beyond 64 tokens: 8 warps x 4 CTAs (fastest alone at 64). Head
#: counts below 32 were not measured and keep the seed's rule (<= 2 tokens).
#: Fused variant: skip-zero+early, measured 2026-11-30 (``scripts/gpu/
#: indexer_gpu_run.sh``; docs/results/indexer_roofline_h200_2026-11-30.md):
#: of the three candidates then, fastest (one tie) in 18 of the 20 (K 7168/4096,
#: heads 64/32, tokens 1-16) cells, behind skip-zero alone at K 7168, heads 64,
#: tokens 4 and 8, and faster than load-all in all 20.
#: Variant rules: the split-K variants, measured 2026-12-03 side by side with
#: the others (``python -m benchmarks.indexer --sweep``, K 7168/4096, heads
#: 64/32; docs/results/indexer_splitk_h200_2026-12-03.md). Each rule names the
#: cells where its variant was the fastest in that run; everywhere else the
#: default (skip-zero+early) was fastest or within noise. K 7168, heads 64,
#: 1 token moved from split-k to split-k2: faster in four of five runs, median
#: 3.15 against 3.33 us (docs/results/indexer_fixed_cost_h200_2026-12-03.md).
#: The spread variant (2026-12-04, K 7168/4096, heads 64/32, tokens 1-16;
#: docs/results/indexer_spread_kernel_h200_2026-12-04.md) was the slowest of
#: the three timed in every cell, so no rule picks it.
#: The stage-x variants (2026-12-05, K 7168/4096, heads 64/32, tokens 1/4/8/16,
#: on an H100, which shares this table; docs/results/indexer_stage_x_h100_2026-12-05.md)
#: were faster than the earlier pick by 3-17 % in the cells the first five
#: rules name (tokens 2 and 9-15 lie between measured ones); the earlier pick
#: stays where it was faster or within 2 % (one token but at K 7168, heads 64;
#: K 7168, heads 32, 16 tokens; K 4096, heads 32, 4 tokens) and where
#: stage-x was not timed (17-64 tokens).
_SPLIT_K = FusedVariant(skip_zero=True, early_consts=True, split_k=1)
_SPLIT_K2 = FusedVariant(skip_zero=True, early_consts=True, split_k=2)
_STAGE_X = FusedVariant(skip_zero=True, early_consts=True, split_k=1, stage_x=True)
_STAGE_X2 = FusedVariant(skip_zero=True, early_consts=True, split_k=2, stage_x=True)
H200 = TacticTable(
    name="h200",
    ranges=(TacticRange(64, Tactic(16, 1)), TacticRange(MAX_TOKENS, Tactic(8, 4))),
    fuse=FuseRule(max_tokens=2, wide_heads=32, wide_max_tokens=64),
    source="measured on H200 2026-11-29 (benchmarks.indexer --sweep); fused variants "
           "2026-11-30 and 2026-12-03; stage-x on H100 2026-12-05",
    fused_variant=FusedVariant(skip_zero=True, early_consts=True),
    variant_rules=(
        VariantRule(_STAGE_X, 1, 8, k=(7168,), heads=(64,)),
        VariantRule(_STAGE_X2, 9, 16, k=(7168,), heads=(64,)),
        VariantRule(_STAGE_X, 2, 8, k=(7168,), heads=(32,)),
        VariantRule(_STAGE_X, 2, 16, k=(4096,), heads=(64,)),
        VariantRule(_STAGE_X, 8, 16, k=(4096,), heads=(32,)),
        VariantRule(_SPLIT_K2, 1, 1, k=(7168,), heads=(64,)),
        VariantRule(_SPLIT_K2, 2, 64, k=(7168,), heads=(32, 64)),
        VariantRule(_SPLIT_K, 4, 8, k=(4096,), heads=(64,)),
        VariantRule(_SPLIT_K2, 16, 64, k=(4096,), heads=(32, 64)),
    ),
)
#: Tables by compute capability (``sm_XY``); the one place to add a GPU.
TACTIC_TABLES: dict[str, TacticTable] = {"sm_90": H200, "sm_100": GB300, "sm_103": GB300}
#: The arch whose table the seed's ``_tactic``/``_fuse`` encode.
DEFAULT_ARCH = "sm_103"


def tactic_table(arch: str = DEFAULT_ARCH) -> TacticTable:
    """The table for ``arch`` (e.g. ``"sm_90"``); ValueError for an unknown arch."""
    try:
        return TACTIC_TABLES[arch]
    except KeyError:
        raise ValueError(f"arch must be one of {sorted(TACTIC_TABLES)}, got {arch!r}") from None


def tactic(tokens: int, arch: str = DEFAULT_ARCH) -> Tactic:
    """The projection kernel's tactic for ``tokens`` on ``arch`` (seed ``_tactic``:
    16 warps and no K split up to 16 tokens, else 8 warps and 4 CTAs splitting
    K). ValueError for tokens outside the table or an unknown arch."""
    return tactic_table(arch).lookup(tokens)


def fuse(tokens: int, heads: int, arch: str = DEFAULT_ARCH) -> bool:
    """Whether the query epilogue runs inside the projection kernel (seed
    ``_fuse``: ``tokens <= 2 or (heads >= 32 and tokens <= 16)``): only where
    the projection's tactic is the fused kernel's (checked when the table is
    built), so the head weights stay bit-identical, and where the GB300 chain
    measured faster. ValueError for tokens < 1 or heads < 1."""
    for name, value in (("tokens", tokens), ("heads", heads)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return tactic_table(arch).fuse(tokens, heads)


# --- shapes and the fused row layout ---------------------------------------

def _positive(name: str, value: int, *, zero: bool = False) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < (0 if zero else 1):
        want = "a non-negative" if zero else "a positive"
        raise ValueError(f"{name} must be {want} int, got {value!r}")
    return value


def check_projection_shape(key: int, heads: int, gate: int, k: int) -> None:
    """The seed's ``IndexerProjection`` constructor check, as ValueError with the
    values: key, heads and the total rows tile by ``ROWS``, K by ``K_MULTIPLE``,
    the key cluster is launchable, indices fit a slot code."""
    _positive("key", key)
    _positive("heads", heads)
    _positive("gate", gate, zero=True)
    _positive("K", k)
    rows = key + heads + gate
    if key % ROWS or heads % ROWS or rows % ROWS or k % K_MULTIPLE:
        raise ValueError(
            f"indexer projection rows or K do not tile: key={key}, heads={heads}, rows={rows} "
            f"must be multiples of {ROWS} and K={k} a multiple of {K_MULTIPLE}"
        )
    if key // ROWS > MAX_CLUSTER:
        raise ValueError(f"key = {key} needs a cluster of {key // ROWS} CTAs, more than {MAX_CLUSTER}")
    if max(key, heads, gate) >= 1 << SLOT_INDEX_BITS:
        raise ValueError(f"key, heads, gate = {key}, {heads}, {gate} do not fit {SLOT_INDEX_BITS}-bit slot codes")


def fused_layout(key: int, heads: int, gate: int) -> tuple[list[int], int]:
    """(source row of every fused slot, -1 for a zero row; first head CTA).

    Source rows index the concatenated weight ``[wk (key rows); weights_proj
    (heads rows); gate rows]``. Slot ``s`` belongs to CTA ``s // ROWS``. The
    key rows fill the first ``key // ROWS`` CTAs (one cluster, whose LayerNorm
    statistics it exchanges), then CTA ``first + h`` holds head row h followed
    by up to ``ROWS - 1`` gate rows (in order) and zero rows; gate rows left
    over after the last head follow, and the CTAs pad with zero rows to whole
    clusters of ``key // ROWS`` CTAs. Every source row appears exactly once.
    Equivalent to the seed's ``_fused_layout``; ValueError if ``key`` is not a
    positive multiple of ``ROWS`` or a count is negative.
    """
    _positive("key", key)
    _positive("heads", heads)
    _positive("gate", gate, zero=True)
    if key % ROWS:
        raise ValueError(f"key must be a multiple of {ROWS}, got {key}")
    first = key // ROWS
    order = list(range(key))
    gates = list(range(key + heads, key + heads + gate))
    for h in range(heads):
        order += [key + h] + gates[: ROWS - 1]
        gates = gates[ROWS - 1 :]
        order += [-1] * (-len(order) % ROWS)
    order += gates
    order += [-1] * (-len(order) % (ROWS * first))
    return order, first


def fused_row_live(cta, row, key: int, heads: int, gate: int):
    """Whether slot ``row`` (0..ROWS-1) of fused CTA ``cta`` holds a weight
    row (else a zero row, see :func:`fused_layout`): the key CTAs are full;
    head CTA h holds its head row and gate rows ``7h..7h+6`` below ``gate``;
    the gate rows left over after the last head fill the next CTAs in order.
    Integer arithmetic only, so the kernel evaluates the same expression on
    run-time ``cta``/``row`` (:meth:`kernels.indexer.kernel.ProjectionKernel.
    live_row`); this is the definition the CPU tests hold to the layout."""
    first = key // ROWS
    head = cta - first
    per = ROWS - 1
    if cta < first:
        return True
    if head < heads:
        return row == 0 or per * head + row <= gate
    return (head - heads) * ROWS + row < gate - per * heads


def spread_source_row(cta, row, key: int, heads: int, gate: int):
    """Source row (of ``[key rows; head rows; gate rows]``) of slot ``row``
    (0..ROWS-1) of CTA ``cta`` of the spread layout, -1 for a zero slot: key
    CTA c holds key rows ``SPREAD_KEY_ROWS * c ..``; head CTA h holds head
    row h, then gate rows ``(SPREAD_ROWS - 1) * h ..`` below ``gate``; the
    gate rows left over fill CTAs of ``SPREAD_ROWS`` rows in order. Integer
    arithmetic only, so the kernel evaluates the same expression on run-time
    ``cta``/``row`` (:meth:`kernels.indexer.kernel.ProjectionKernel.
    spread_row`); this is the definition the CPU tests hold to the layout."""
    key_ctas = key // SPREAD_KEY_ROWS
    per = SPREAD_ROWS - 1
    if cta < key_ctas:
        return cta * SPREAD_KEY_ROWS + row if row < SPREAD_KEY_ROWS else -1
    head = cta - key_ctas
    if head < heads:
        if row == 0:
            return key + head
        g = per * head + row - 1
        return key + heads + g if row <= per and g < gate else -1
    g = per * heads + (head - heads) * SPREAD_ROWS + row
    return key + heads + g if row < SPREAD_ROWS and g < gate else -1


def spread_layout(key: int, heads: int, gate: int) -> tuple[list[int], int]:
    """(source row of every slot, -1 for a zero slot; first head CTA) of the
    ``spread`` fused variant (:func:`spread_source_row`): ``key /
    SPREAD_KEY_ROWS`` key CTAs, ``heads`` head CTAs, then the leftover gate
    CTAs; no cluster padding. Every source row appears exactly once.
    ValueError if ``key`` is not a positive multiple of ``ROWS``."""
    _positive("key", key)
    _positive("heads", heads)
    _positive("gate", gate, zero=True)
    if key % ROWS:
        raise ValueError(f"key must be a multiple of {ROWS}, got {key}")
    left = max(0, gate - (SPREAD_ROWS - 1) * heads)
    ctas = key // SPREAD_KEY_ROWS + heads + -(-left // SPREAD_ROWS)
    order = [spread_source_row(c, r, key, heads, gate) for c in range(ctas) for r in range(ROWS)]
    return order, key // SPREAD_KEY_ROWS


def key_first_source_row(cta, row, key: int, heads: int, gate: int):
    """Source row (of ``[key rows; head rows; gate rows]``) of slot ``row``
    of CTA ``cta`` of the key-first layout, -1 for a zero slot: slot 0 of
    CTA c is key row c; the other rows (heads, then gate) go round the CTAs,
    other row j into slot ``1 + j // key`` of CTA ``j % key``, so CTA h <
    heads holds head h in slot 1 and the last CTAs hold the fewest rows.
    Integer arithmetic only, so the kernel evaluates the same expression on
    run-time ``cta``/``row`` (:meth:`kernels.indexer.kernel.ProjectionKernel.
    key_first_row`)."""
    if row == 0:
        return cta
    other = (row - 1) * key + cta
    return key + other if other < heads + gate else -1


def key_first_layout(key: int, heads: int, gate: int) -> tuple[list[int], int]:
    """(source row of every slot, -1 for a zero slot; first head CTA, 0) of
    the ``key_first`` fused variant (:func:`key_first_source_row`): ``key``
    CTAs, no cluster. Every source row appears exactly once. ValueError if
    ``key`` is not a positive multiple of ``ROWS``, if ``heads > key`` (head
    h must sit in CTA h) or if the rows do not fit ``ROWS`` slots a CTA."""
    check_key_first_shape(key, heads, gate)
    order = [key_first_source_row(c, r, key, heads, gate) for c in range(key) for r in range(ROWS)]
    return order, 0


def check_key_first_shape(key: int, heads: int, gate: int) -> None:
    """ValueError, naming the value, unless the key-first layout holds these
    rows: ``key`` a positive multiple of ``ROWS``, ``heads <= key``, and the
    head and gate rows within ``ROWS - 1`` slots of each of ``key`` CTAs."""
    _positive("key", key)
    _positive("heads", heads)
    _positive("gate", gate, zero=True)
    if key % ROWS:
        raise ValueError(f"key must be a multiple of {ROWS}, got {key}")
    if heads > key:
        raise ValueError(f"the key-first layout needs heads <= key = {key}, got heads={heads}")
    if heads + gate > key * (ROWS - 1):
        raise ValueError(f"the key-first layout fits {key * (ROWS - 1)} head and gate rows in "
                         f"{key} CTAs, got heads + gate = {heads + gate}")


def slot_code(row: int, key: int, heads: int) -> int:
    """The kernel's int32 code for a fused slot holding source ``row``:
    ``kind << 16 | index``, index counted within that kind's output
    (the seed's ``code``); -1 gives ``SLOT_NONE << 16``."""
    if row < 0:
        return SLOT_NONE << SLOT_INDEX_BITS
    if row < key:
        return SLOT_KEY << SLOT_INDEX_BITS | row
    if row < key + heads:
        return SLOT_HEAD << SLOT_INDEX_BITS | row - key
    return SLOT_GATE << SLOT_INDEX_BITS | row - key - heads


def slot_codes(order: list[int], key: int, heads: int) -> list[int]:
    """:func:`slot_code` of every slot of ``order`` (the seed's ``slots``)."""
    return [slot_code(r, key, heads) for r in order]


def fused_ctas(key: int, heads: int, gate: int) -> int:
    """CTAs of the fused kernel's grid (a multiple of the key cluster)."""
    order, _ = fused_layout(key, heads, gate)
    return len(order) // ROWS


def padded_heads(heads: int) -> int:
    """``max(heads, MQA_MIN_HEADS)``: the head count the MQA logits receive."""
    _positive("heads", heads)
    return max(heads, MQA_MIN_HEADS)


def hadamard_scale(dim: int = DIM) -> float:
    """``dim ** -0.5``: the orthonormal Hadamard scale (DeepSeek-V3.2
    ``rotate_activation``), as a Python float (FP32-rounded where used)."""
    if dim < 1 or dim & (dim - 1):
        raise ValueError(f"dim must be a power of two, got {dim}")
    return dim ** -0.5


def head_weight_scale(softmax_scale: float, heads: int) -> float:
    """``softmax_scale * heads ** -0.5`` in FP64 (the seed's ``scale``; the
    kernel receives it as one FP32). DeepSeek-V3.2: ``softmax_scale =
    index_head_dim ** -0.5``."""
    _positive("heads", heads)
    if not (isinstance(softmax_scale, (int, float)) and math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale must be a positive finite number, got {softmax_scale!r}")
    return float(softmax_scale) * heads ** -0.5


# --- roofline ----------------------------------------------------------------

def fused_min_bytes(tokens: int, k: int, key: int, heads: int, gate: int, padded: int,
                    weights_bytes: int = 4) -> int:
    """Bytes the fused kernel must move at the least, the roofline's numerator:
    each weight row once (BF16 ``[key + heads + gate, K]``), the inputs (x
    BF16 ``[M, K]``, q BF16 ``[M, heads, DIM]``, the FP32 LayerNorm weight and
    bias), and the outputs (q FP8 ``[M, padded, DIM]``, head weights
    ``[M, padded]`` of ``weights_bytes``, key and gate BF16). Zero rows and
    the slot codes are the kernel's overhead, not counted."""
    for name, value in (("tokens", tokens), ("K", k), ("key", key), ("heads", heads),
                        ("padded", padded), ("weights_bytes", weights_bytes)):
        _positive(name, value)
    _positive("gate", gate, zero=True)
    weights = (key + heads + gate) * k * 2
    inputs = tokens * k * 2 + tokens * heads * DIM * 2 + 2 * key * 4
    outputs = tokens * (padded * DIM + padded * weights_bytes + key * 2 + gate * 2)
    return weights + inputs + outputs


def fused_weight_bytes_read(k: int, key: int, heads: int, gate: int, *, skip_zero: bool) -> int:
    """Weight bytes the fused kernel reads: every slot of the fused layout
    (zero rows included), or only the weight rows with ``skip_zero``."""
    order, _ = fused_layout(key, heads, gate)
    rows = sum(r >= 0 for r in order) if skip_zero else len(order)
    return rows * _positive("K", k) * 2
