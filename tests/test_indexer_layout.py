"""kernels.indexer.layout: constants, tactic table, fuse rule, fused row layout."""

import dataclasses
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.indexer import layout as L
from kernels.indexer.layout import (
    DIM, FUSED_WARPS, K_MULTIPLE, KEY, MAX_TOKENS, ROWS, SLOT_GATE, SLOT_HEAD, SLOT_KEY,
    SLOT_NONE, TACTIC_TABLES, FuseRule, Tactic, TacticRange, TacticTable,
)


# --- constants --------------------------------------------------------------

def test_constants_agree_with_the_seed_usage():
    assert ROWS == 8 and L.TILE == 16 and L.MMA_K == 16  # mma.sync m16n8k16
    assert DIM // 4 == 32  # one int32 word of 4 FP8 a lane of a warp
    assert L.QUANT_BLOCK == DIM  # one q scale per head, folded into its weight
    assert L.padded_heads(32) == L.MQA_MIN_HEADS == 64 and L.padded_heads(65) == 65
    assert KEY // ROWS <= L.MAX_CLUSTER
    every = {r.tactic for t in TACTIC_TABLES.values() for r in t.ranges}
    assert K_MULTIPLE == max(t.k_multiple for t in every)
    assert all(K_MULTIPLE % t.k_multiple == 0 for t in every)


def test_max_tokens_is_the_largest_power_of_two_that_fits():
    split = L.tactic(MAX_TOKENS)
    assert split.smem_bytes(MAX_TOKENS) <= L.MAX_SMEM_BYTES < split.smem_bytes(2 * MAX_TOKENS)


def test_layout_imports_without_cutlass():
    code = ("import sys, kernels.indexer, kernels.reference.indexer; "
            "assert 'cutlass' not in sys.modules, 'cutlass imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=L.__file__.rsplit("/kernels/", 1)[0])


# --- tactics ----------------------------------------------------------------

@pytest.mark.parametrize("tokens", [1, 2, 3, 8, 16])
def test_seed_tactic_small(tokens):
    assert L.tactic(tokens) == Tactic(16, 1)


@pytest.mark.parametrize("tokens", [17, 32, 64, 100, MAX_TOKENS])
def test_seed_tactic_split_k(tokens):
    assert L.tactic(tokens) == Tactic(8, 4)


@pytest.mark.parametrize("tokens", [0, -1, MAX_TOKENS + 1, 10**6])
def test_tokens_outside_the_table_are_rejected_with_the_value(tokens):
    with pytest.raises(ValueError, match=f"tokens = {tokens} is outside tactic table"):
        L.tactic(tokens)


@pytest.mark.parametrize("tokens", [1.0, "4", None, True])
def test_non_int_tokens_are_rejected(tokens):
    with pytest.raises(ValueError, match="tokens must be"):
        L.tactic(tokens)


def test_unknown_arch_is_rejected_by_name():
    with pytest.raises(ValueError, match=r"arch must be one of .*'sm_90'.* got 'sm_80'"):
        L.tactic(4, arch="sm_80")
    with pytest.raises(ValueError, match="arch must be"):
        L.fuse(4, 64, arch="gfx942")


def test_tactic_is_frozen_hashable_and_a_cache_key():
    t = Tactic(16, 1)
    cache = {("fused", 320, 7168, t): "compiled"}
    assert cache[("fused", 320, 7168, Tactic(16, 1))] == "compiled"
    assert hash(t) == hash(Tactic(16, 1)) and t != Tactic(8, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.warps = 8
    hash(L.GB300)  # whole tables too


@pytest.mark.parametrize("warps,split,field", [(0, 1, "warps"), (33, 1, "warps"), (8, 0, "split"),
                                               (8, 17, "split"), (8.0, 1, "warps"), (8, True, "split")])
def test_invalid_tactic_fields_are_named(warps, split, field):
    with pytest.raises(ValueError, match=f"Tactic.{field}"):
        Tactic(warps, split)


def test_tactic_span_and_k_tiling():
    assert Tactic(16, 1).span(7168) == 448 and Tactic(8, 4).span(7168) == 224
    assert Tactic(16, 1).span(4096) == 256
    with pytest.raises(ValueError, match=r"K = 7000 does not tile .* multiple of 1024"):
        Tactic(8, 4).span(7000)


def _table(ranges, fuse=FuseRule(2, 32, 16)):
    return TacticTable("t", tuple(TacticRange(m, t) for m, t in ranges), fuse, "test")


def test_table_validation():
    with pytest.raises(ValueError, match="no ranges"):
        TacticTable("t", (), FuseRule(2, 32, 16), "test")
    with pytest.raises(ValueError, match="bounds must increase"):
        _table([(16, Tactic(16, 1)), (16, Tactic(8, 4))])
    with pytest.raises(ValueError, match="needs .* B of shared memory"):
        _table([(16, Tactic(16, 1)), (4096, Tactic(8, 4))])
    with pytest.raises(ValueError, match=r"fuse rule accepts 9 tokens .* Tactic\(warps=8, split=4\)"):
        _table([(8, Tactic(16, 1)), (512, Tactic(8, 4))])
    with pytest.raises(ValueError, match="not the fused kernel's"):
        _table([(16, Tactic(16, 2)), (512, Tactic(8, 4))])
    with pytest.raises(ValueError, match="K % 2048"):
        _table([(16, Tactic(16, 1)), (64, Tactic(16, 4))])


# --- fuse -------------------------------------------------------------------

@pytest.mark.parametrize("arch", sorted(TACTIC_TABLES))
def test_fuse_matches_the_seed_and_only_where_the_tactic_is_the_fused_one(arch):
    # The seed's GB300 rule; the H200's, measured there, fuses up to 64 tokens.
    wide = 64 if arch == "sm_90" else 16
    for tokens in range(1, 80):
        for heads in (1, 8, 16, 31, 32, 64, 128):
            want = tokens <= 2 or (heads >= 32 and tokens <= wide)
            assert L.fuse(tokens, heads, arch) == want, (tokens, heads)
            if want:
                assert L.tactic(tokens, arch) == Tactic(FUSED_WARPS, 1)
    assert L.fuse(MAX_TOKENS + 1, 64) is False  # beyond the table: never fused


@pytest.mark.parametrize("tokens,heads,name", [(0, 64, "tokens"), (4, 0, "heads"), (2.0, 64, "tokens")])
def test_fuse_rejects_bad_counts(tokens, heads, name):
    with pytest.raises(ValueError, match=f"{name} must be a positive int"):
        L.fuse(tokens, heads)


def test_fused_kernel_fits_shared_memory_where_it_is_used():
    for t in range(1, 17):
        assert L.fused_smem_bytes(t, FUSED_WARPS, KEY) <= L.MAX_SMEM_BYTES


# --- fused layout -----------------------------------------------------------

def test_fused_layout_small_case_by_hand():
    order, first = L.fused_layout(8, 2, 10)
    assert first == 1
    assert order == [*range(8), 8, *range(10, 17), 9, 17, 18, 19, -1, -1, -1, -1]


def test_fused_layout_leftover_gates_and_cluster_padding():
    order, first = L.fused_layout(16, 1, 10)  # cluster of 2 CTAs
    assert first == 2
    assert order == [*range(16), 16, *range(17, 24), 24, 25, 26, *[-1] * 5]
    assert len(order) == 4 * ROWS


def test_fused_layout_production_shape():
    order, first = L.fused_layout(KEY, 64, 128)
    assert first == 16 and len(order) // ROWS == 80 == L.fused_ctas(KEY, 64, 128)
    order32, _ = L.fused_layout(KEY, 32, 128)
    assert len(order32) // ROWS == 48  # 16 key CTAs + 32 head CTAs: 3 whole clusters


@settings(max_examples=200, deadline=None)
@given(key=st.integers(1, 6).map(lambda c: c * ROWS), heads=st.integers(1, 40), gate=st.integers(0, 300))
def test_fused_layout_properties(key, heads, gate):
    order, first = L.fused_layout(key, heads, gate)
    rows = key + heads + gate
    # every source row exactly once, the rest zero rows
    assert sorted(r for r in order if r >= 0) == list(range(rows))
    assert all(r == -1 or r >= 0 for r in order)
    # whole clusters of key // ROWS CTAs
    assert first == key // ROWS and len(order) % (ROWS * first) == 0
    # key rows first, in order, exactly filling the key cluster
    assert order[:key] == list(range(key))
    ctas = [order[i:i + ROWS] for i in range(0, len(order), ROWS)]
    gates_seen = []
    for h in range(heads):
        cta = ctas[first + h]
        assert cta[0] == key + h  # head h leads CTA first + h
        assert all(r < 0 or r >= key + heads for r in cta[1:])  # then gate or zero rows
        real = [r for r in cta[1:] if r >= 0]
        assert cta[1:1 + len(real)] == real  # zero rows only at the end
        gates_seen += real
    rest = [r for c in ctas[first + heads:] for r in c if r >= 0]
    assert gates_seen + rest == list(range(key + heads, rows))  # gate rows in order
    # the kernel's zero-row predicate (skip_zero) is exactly the layout's zero rows
    for c, cta in enumerate(ctas):
        for g, r in enumerate(cta):
            assert L.fused_row_live(c, g, key, heads, gate) == (r >= 0), (c, g, r)
    # slot codes: kind and index per slot
    codes = L.slot_codes(order, key, heads)
    for r, code in zip(order, codes):
        kind, index = code >> 16, code & 0xFFFF
        if r < 0:
            assert (kind, index) == (SLOT_NONE, 0)
        elif r < key:
            assert (kind, index) == (SLOT_KEY, r)
        elif r < key + heads:
            assert (kind, index) == (SLOT_HEAD, r - key)
        else:
            assert (kind, index) == (SLOT_GATE, r - key - heads)


def test_spread_layout_small_case_by_hand():
    # key 8 (4 key CTAs of 2 rows), 2 heads (head row + 2 gate rows), then
    # the 6 leftover gate rows in CTAs of 3
    order, first = L.spread_layout(8, 2, 10)
    assert first == 4
    z = [-1] * 5
    assert order == [0, 1, *z, -1, 2, 3, *z, -1, 4, 5, *z, -1, 6, 7, *z, -1,
                     8, 10, 11, *z, 9, 12, 13, *z, 14, 15, 16, *z, 17, 18, 19, *z]


def test_spread_layout_production_shapes():
    order, first = L.spread_layout(KEY, 64, 128)
    assert first == 64 and len(order) // ROWS == 128  # one CTA a SM of 132
    order32, _ = L.spread_layout(KEY, 32, 128)
    assert len(order32) // ROWS == 64 + 32 + 22  # 64 leftover gate rows in CTAs of 3
    assert len(L.spread_layout(KEY, 64, 0)[0]) // ROWS == 128  # no gate: 1-row head CTAs


@settings(max_examples=200, deadline=None)
@given(key=st.integers(1, 16).map(lambda c: c * ROWS), heads=st.integers(1, 40),
       gate=st.integers(0, 300))
def test_spread_layout_properties(key, heads, gate):
    order, first = L.spread_layout(key, heads, gate)
    rows = key + heads + gate
    assert sorted(r for r in order if r >= 0) == list(range(rows))
    assert first == key // L.SPREAD_KEY_ROWS
    ctas = [order[i:i + ROWS] for i in range(0, len(order), ROWS)]
    assert all(sum(r >= 0 for r in c) <= max(L.SPREAD_KEY_ROWS, L.SPREAD_ROWS) for c in ctas)
    assert [r for c in ctas[:first] for r in c if r >= 0] == list(range(key))
    for h in range(heads):
        assert ctas[first + h][0] == key + h
    gates = [r for c in ctas[first:] for r in c[1 if ctas.index(c) < first + heads else 0:]
             if r >= 0]
    assert gates == list(range(key + heads, rows))  # gate rows in order
    assert all(sum(r >= 0 for r in c) for c in ctas)  # no empty CTA
    codes = L.slot_codes(order, key, heads)
    assert [c >> 16 == SLOT_KEY for c in codes[:ROWS * first] if c >> 16] == [True] * key


def test_key_first_layout_small_case_by_hand():
    # key 8: CTA c holds key row c; heads 2 and gate 10 go round: other row j
    # (head rows 8, 9, then gate 10..19) into slot 1 + j // 8 of CTA j % 8
    order, first = L.key_first_layout(8, 2, 10)
    assert first == 0 and len(order) // ROWS == 8
    z = [-1] * 5
    assert order[:ROWS] == [0, 8, 16, *z] and order[ROWS:2 * ROWS] == [1, 9, 17, *z]
    assert order[4 * ROWS:5 * ROWS] == [4, 12, -1, *z] and order[7 * ROWS:] == [7, 15, -1, *z]


@settings(max_examples=200, deadline=None)
@given(key=st.integers(1, 16).map(lambda c: c * ROWS), heads=st.integers(1, 128),
       gate=st.integers(0, 300))
def test_key_first_layout_properties(key, heads, gate):
    if heads > key or heads + gate > key * (ROWS - 1):
        with pytest.raises(ValueError, match="the key-first layout"):
            L.key_first_layout(key, heads, gate)
        return
    order, first = L.key_first_layout(key, heads, gate)
    assert first == 0 and sorted(r for r in order if r >= 0) == list(range(key + heads + gate))
    ctas = [order[i:i + ROWS] for i in range(0, len(order), ROWS)]
    assert [c[0] for c in ctas] == list(range(key))  # slot 0: the CTA's key row
    assert all(ctas[h][1] == key + h for h in range(heads))  # head h in CTA h (the q epilogue's)
    live = [sum(r >= 0 for r in c) for c in ctas]
    assert live[-1] == min(live)  # the reducer, the last CTA, holds the fewest rows
    assert all(r < 0 for c in ctas for i, r in enumerate(c) if i and c[i - 1] < 0)  # packed
    assert order == [L.key_first_source_row(c, r, key, heads, gate)
                     for c in range(key) for r in range(ROWS)]


def test_key_first_variant():
    v = L.FusedVariant(True, True, bulk=True, spread=True, key_first=True)
    assert v.name == "skip-zero+early+bulk+spread+key-first" and v in L.FUSED_CANDIDATES
    assert v not in L.TIMING_PROBES and v.tactic() == Tactic(FUSED_WARPS, 1)
    assert v.layout(KEY, 64, 128) == L.key_first_layout(KEY, 64, 128)
    assert v.bulk_tile_bytes(7168) == 8 * (7168 * 2 + 64) + 16  # the key row's own mbarrier
    assert v.token_limit == L.TILE and L.FusedVariant(True, True, spread=True).token_limit is None
    assert v.runs(L.TILE) and not v.runs(L.TILE + 1) and L.FusedVariant().runs(176)
    L.VariantRule(v, 1, L.TILE)
    with pytest.raises(ValueError, match="runs at most 16 tokens, got max_tokens=17"):
        L.VariantRule(v, 1, 17)
    for bad in (dict(spread=True, key_first=True), dict(bulk=True, key_first=True),
                dict(bulk=True, spread=True, key_first=True, exchange=False)):
        with pytest.raises(ValueError, match="key_first needs spread and bulk, with the exchange"):
            L.FusedVariant(True, True, **bad)


def test_stage_x_variant():
    for g in (1, 2):
        v = L.FusedVariant(True, True, split_k=g, stage_x=True)
        assert v.name == f"skip-zero+early+split-k{g if g > 1 else ''}+stage-x"
        assert v in L.FUSED_CANDIDATES and v.runs(L.STAGE_X_MAX_TOKENS) and not v.runs(65)
        # the split variant's sum tree, so its bits
        assert v.tactic() == L.FusedVariant(True, True, split_k=g).tactic() == Tactic(g, 16)
    # 16 token rows of the CTA's K part (7168 / 16 = 448 BF16, 896 B) padded to 64 mod 128
    assert v.x_stage_bytes(16, 7168) == 16 * 960 and L.FusedVariant(True, True).x_stage_bytes(
        16, 7168) == 0
    with pytest.raises(ValueError, match="stage_x needs split_k, got split_k=0"):
        L.FusedVariant(True, True, stage_x=True)
    with pytest.raises(ValueError, match="stage_x must be a bool"):
        L.FusedVariant(True, True, split_k=2, stage_x=1)


def test_spread_variant():
    v = L.FusedVariant(True, True, spread=True)
    assert v.name == "skip-zero+early+spread" and v in L.FUSED_CANDIDATES
    assert v.tactic() == Tactic(FUSED_WARPS, 1)  # the default's sum tree: the same bits
    assert v.layout(KEY, 64, 128) == L.spread_layout(KEY, 64, 128)
    assert L.FusedVariant(True, True).layout(KEY, 64, 128) == L.fused_layout(KEY, 64, 128)
    assert v.gather_bytes(16) == 16 * KEY * 4 and L.FusedVariant().gather_bytes(16) == 0
    for bad in (dict(spread=True), dict(skip_zero=True, spread=True),
                dict(skip_zero=True, early_consts=True, split_k=2, spread=True),
                dict(skip_zero=True, early_consts=True, split_k=1, bulk=True, spread=True)):
        with pytest.raises(ValueError, match="spread needs skip_zero and early_consts"):
            L.FusedVariant(**bad)
    with pytest.raises(ValueError, match="FusedVariant.spread must be a bool, got 1"):
        L.FusedVariant(True, True, spread=1)
    bulk = L.FusedVariant(True, True, bulk=True, spread=True)
    assert bulk.name == "skip-zero+early+bulk+spread" and bulk in L.FUSED_CANDIDATES
    assert bulk.tactic() == Tactic(FUSED_WARPS, 1) and bulk.layout(KEY, 64, 128) == v.layout(KEY, 64, 128)
    assert bulk.bulk_tile_bytes(7168) == 8 * (7168 * 2 + 64)  # the whole-row tile of 8 slots


def test_no_exchange_timing_probes_are_never_candidates_or_picks():
    assert [p.name for p in L.TIMING_PROBES] == ["skip-zero+early+spread+no-exchange",
                                                 "skip-zero+early+bulk+spread+no-exchange"]
    assert not set(L.TIMING_PROBES) & set(L.FUSED_CANDIDATES)
    assert all(p.spread and not p.exchange for p in L.TIMING_PROBES)
    with pytest.raises(ValueError, match="exchange=False .* needs spread, got spread=False"):
        L.FusedVariant(True, True, exchange=False)
    with pytest.raises(ValueError, match="FusedVariant.exchange must be a bool, got 0"):
        L.FusedVariant(True, True, spread=True, exchange=0)
    with pytest.raises(ValueError, match="is a timing probe .* never a table pick"):
        L.VariantRule(L.TIMING_PROBES[0], 1, 1)
    assert L.MAILBOX_SENTINEL == 0xFFFFFFFF and L.MAILBOX_NAN == 0x7FC00000


@pytest.mark.parametrize("args,match", [((0, 64, 128), "key must be a positive"),
                                        ((12, 64, 128), "key must be a multiple of 8, got 12"),
                                        ((128, 0, 128), "heads must be a positive"),
                                        ((128, 64, -1), "gate must be a non-negative"),
                                        ((128.0, 64, 128), "key must be a positive int")])
def test_fused_layout_rejects_bad_shapes(args, match):
    with pytest.raises(ValueError, match=match):
        L.fused_layout(*args)


def test_projection_shape_check_names_the_values():
    L.check_projection_shape(128, 64, 128, 7168)
    L.check_projection_shape(128, 32, 128, 4096)
    with pytest.raises(ValueError, match=r"do not tile: key=128, heads=60, rows=316 .* K=7168"):
        L.check_projection_shape(128, 60, 128, 7168)
    with pytest.raises(ValueError, match=r"K=7000 a multiple of 1024"):
        L.check_projection_shape(128, 64, 128, 7000)
    with pytest.raises(ValueError, match="cluster of 32 CTAs"):
        L.check_projection_shape(256, 64, 128, 7168)


def test_scales():
    assert L.hadamard_scale(128) == 128 ** -0.5
    assert L.head_weight_scale(128 ** -0.5, 64) == 128 ** -0.5 * 64 ** -0.5
    with pytest.raises(ValueError, match="dim must be a power of two"):
        L.hadamard_scale(96)
    with pytest.raises(ValueError, match="softmax_scale"):
        L.head_weight_scale(0.0, 64)


def test_fused_variant():
    assert L.FusedVariant().name == "load-all"
    assert L.FusedVariant(True, True).name == "skip-zero+early"
    assert L.FusedVariant(True, True, True).name == "skip-zero+early+launch"
    assert len(set(L.FUSED_CANDIDATES)) == len(L.FUSED_CANDIDATES)
    assert L.GB300.fused_variant == L.FusedVariant()
    with pytest.raises(ValueError, match="FusedVariant.skip_zero must be a bool, got 1"):
        L.FusedVariant(skip_zero=1)
    with pytest.raises(ValueError, match="fused_variant must be a FusedVariant"):
        dataclasses.replace(L.H200, fused_variant=(True, False))


def test_bulk_variants_size_their_tile_and_need_skip_zero():
    rows = L.FusedVariant(True, True, bulk=True)
    split = L.FusedVariant(True, True, split_k=1, bulk=True)
    assert rows.name == "skip-zero+early+bulk" and rows.tactic() == Tactic(FUSED_WARPS, 1)
    # whole rows: the CTA's 8 rows of 2 K bytes, padded to 64 mod 128; split:
    # the cluster's 128 rows over K / 16
    assert rows.bulk_tile_bytes(7168) == 8 * (7168 * 2 + 64)
    assert split.bulk_tile_bytes(7168) == 128 * (7168 // 16 * 2 + 64)
    assert L.FusedVariant(True, True).bulk_tile_bytes(7168) == 0
    with pytest.raises(ValueError, match="bulk needs skip_zero, got skip_zero=False"):
        L.FusedVariant(bulk=True)


def test_split_k_variants_name_their_tactic():
    assert L.FusedVariant(True, True, split_k=1).name == "skip-zero+early+split-k"
    assert L.FusedVariant(True, True, split_k=2).name == "skip-zero+early+split-k2"
    assert L.FusedVariant(True, True).tactic() == Tactic(FUSED_WARPS, 1)
    assert L.FusedVariant(split_k=1).tactic() == Tactic(1, KEY // ROWS)
    assert L.FusedVariant(split_k=2).tactic(128) == Tactic(2, 16)
    for bad in (3, True, -1):
        with pytest.raises(ValueError, match=f"split_k must be 0, 1 or 2, got {bad!r}"):
            L.FusedVariant(split_k=bad)
    with pytest.raises(ValueError, match="split_k needs a key cluster of 16 CTAs .*got key = 64"):
        L.FusedVariant(split_k=1).tactic(64)


def test_variant_rules_pick_per_cell_and_the_projection_follows():
    t = L.H200
    # the default outside every rule, the rule's variant inside one
    assert t.fused_variant_for(7168, 32, 1) == t.fused_variant
    picks = {(k, heads, tokens): (v.split_k, v.stage_x)
             for (k, heads, tokens) in ((7168, 64, 1), (7168, 64, 16), (7168, 64, 17),
                                        (7168, 32, 16), (4096, 64, 4), (4096, 32, 4),
                                        (4096, 32, 8))
             for v in [t.fused_variant_for(k, heads, tokens)]}
    assert picks == {(7168, 64, 1): (1, True), (7168, 64, 16): (2, True),
                     (7168, 64, 17): (2, False), (7168, 32, 16): (2, False),
                     (4096, 64, 4): (1, True), (4096, 32, 4): (0, False),
                     (4096, 32, 8): (1, True)}
    # the projection alone gives the fused kernel's bits wherever it fuses
    for k in (4096, 7168):
        for heads in (16, 32, 64):
            for tokens in range(1, 129):
                got = t.lookup(tokens, k=k, heads=heads)
                if t.fuse(tokens, heads):
                    assert got == t.fused_variant_for(k, heads, tokens).tactic(), (k, heads, tokens)
                else:
                    assert got == t.lookup(tokens), (k, heads, tokens)
    # a rule outside the fuse range, or not a VariantRule, is refused
    rule = L.VariantRule(L.FusedVariant(split_k=2), 2, 128)
    with pytest.raises(ValueError, match="up to 128 tokens, beyond the fuse rule's 64"):
        dataclasses.replace(t, variant_rules=(rule,))
    with pytest.raises(ValueError, match="is not a VariantRule"):
        dataclasses.replace(t, variant_rules=((1, 2),))
    with pytest.raises(ValueError, match="1 <= min_tokens <= max_tokens, got 3..2"):
        L.VariantRule(L.FusedVariant(), 3, 2)
    with pytest.raises(ValueError, match=r"VariantRule.k must be a tuple of positive ints, got \[7168\]"):
        L.VariantRule(L.FusedVariant(), 1, 2, k=[7168])


def test_roofline_bytes_by_hand():
    # K 7168, key 128, heads 64, gate 128, one token, FP32 head weights
    weights = 320 * 7168 * 2
    inputs = 7168 * 2 + 64 * 128 * 2 + 2 * 128 * 4
    outputs = 64 * 128 + 64 * 4 + 128 * 2 + 128 * 2
    assert L.fused_min_bytes(1, 7168, 128, 64, 128, 64) == weights + inputs + outputs
    # the layout has 80 CTAs x 8 slots for 320 rows: half the slots are zero rows
    assert L.fused_weight_bytes_read(7168, 128, 64, 128, skip_zero=False) == 640 * 7168 * 2
    assert L.fused_weight_bytes_read(7168, 128, 64, 128, skip_zero=True) == weights
    with pytest.raises(ValueError, match="tokens must be a positive int, got 0"):
        L.fused_min_bytes(0, 7168, 128, 64, 128, 64)
