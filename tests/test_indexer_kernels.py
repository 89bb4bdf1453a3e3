"""The indexer kernels without a GPU: compile both archs and check the PTX,
the checks catch mutations, bad inputs raise ValueError before any launch,
the host-side fused weights and slot codes, the stage's stock path."""

import pytest
import torch

from cluster import ops
from jobs import compile_check as cc
from kernels.indexer import checks
from kernels.indexer.layout import DIM, ROWS, Tactic, fused_layout, slot_codes


# --- compile + PTX ----------------------------------------------------------

def test_compile_check_both_archs(capsys):
    rc = cc.main(["--no-results", "--ops", "indexer", "--arch", "sm_90a,sm_100a"])
    out = capsys.readouterr().out
    assert rc == 0, out
    n = len(checks.PROJECTION_VARIANTS) + len(checks.FUSED_VARIANTS)
    assert out.count(" ok ") == 2 * n, out


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ptx"))
    variants = ops.get("indexer").variants([], [])
    return {(v.kernel, v.detail): cc.run_variant(v, "sm_90a", root, i)
            for i, v in enumerate(variants)}


def _row(rows, kernel, split=None):
    for (name, detail), row in rows.items():
        if name == kernel and (split is None or f"split={split}" in detail):
            return row
    raise KeyError(kernel)


def test_ptx_facts(rows):
    assert all(not r.errors for r in rows.values()), {k: r.errors for k, r in rows.items()}
    fused = _row(rows, "fusedf32").lines
    proj = _row(rows, "proj16x1").lines
    wait = next(i for i, ln in enumerate(proj) if "griddepcontrol.wait" in ln)
    assert sum(ln.startswith("ld.global.nc") for ln in proj[:wait]) == 7168 // 16 // 32
    assert sum(ln.startswith("mma.sync") for ln in proj) == 2 * 7168 // 16 // 32
    assert any("st.async" in ln for ln in fused) and any("mbarrier.try_wait" in ln for ln in fused)


def test_no_spills(rows):
    """Every indexer build fits its threads' registers (512-thread fused CTAs:
    at most 128) with no local memory: a stack frame there is ptxas spilling
    the accumulators or fragments, which costs more than any tactic saves."""
    for (kernel, detail), r in rows.items():
        assert r.resources is not None, (kernel, detail)
        assert r.resources.registers <= 128 and r.resources.stack_bytes == 0, (
            kernel, detail, r.resources)


def test_checks_catch_mutations(rows):
    proj = _row(rows, "proj16x1")
    split = _row(rows, "proj8x4", split=4)
    fused = _row(rows, "fusedf32")
    v = proj.variant
    # a weight load moved after the PDL wait
    wait = next(i for i, ln in enumerate(proj.lines) if "griddepcontrol.wait" in ln)
    nc = next(ln for ln in reversed(proj.lines[:wait]) if ln.startswith("ld.global.nc"))
    moved = proj.lines[:wait + 1] + [nc] + proj.lines[wait + 1:]
    assert any("after griddepcontrol.wait" in e for e in checks.check_projection(moved, v))
    # an input load hoisted above it
    x_load = next(ln for ln in proj.lines if ln.startswith("ld.global.v4"))
    assert any("before griddepcontrol.wait" in e
               for e in checks.check_projection([x_load] + proj.lines, v))
    # no mma
    assert checks.check_projection([ln for ln in proj.lines if "mma" not in ln], v)
    # launch_dependents before wait
    swapped = [ln.replace("griddepcontrol.wait", "X").replace(
        "griddepcontrol.launch_dependents", "griddepcontrol.wait").replace(
        "X", "griddepcontrol.launch_dependents") for ln in proj.lines]
    assert checks.check_projection(swapped, v)
    # DSMEM in a no-split build / missing in a split build
    assert checks.check_projection(proj.lines + ["mapa.shared::cluster.u32 r, a, b;"], v)
    assert checks.check_projection([ln for ln in split.lines if "mapa" not in ln],
                                   split.variant)
    # the projection's early-launch build with launch_dependents back after
    # the wait, and a plain build with it moved first
    early = _row(rows, "proj2x16launch")
    assert not early.errors
    back = [ln for ln in early.lines if "launch_dependents" not in ln]
    back.insert(next(i for i, ln in enumerate(back) if "griddepcontrol.wait" in ln) + 1,
                "griddepcontrol.launch_dependents;")
    assert any("launch_dependents" in e for e in checks.check_projection(back, early.variant))
    first = ["griddepcontrol.launch_dependents;"] + [
        ln for ln in proj.lines if "launch_dependents" not in ln]
    assert any("launch_dependents" in e for e in checks.check_projection(first, v))
    # the early-launch build with launch_dependents back after the wait, and
    # the fused builds' early/late slot-code loads and predicated weight loads
    launch = _row(rows, "fusedlaunch")
    late = [ln.replace("griddepcontrol.wait", "X").replace(
        "griddepcontrol.launch_dependents", "griddepcontrol.wait").replace(
        "X", "griddepcontrol.launch_dependents") for ln in launch.lines]
    assert not checks.check_fused(launch.lines, launch.variant)
    assert any("must follow" in e for e in checks.check_fused(late, launch.variant))
    assert checks.check_fused(fused.lines + ["@p ld.global.nc.L1::no_allocate.v4.u32 {a}, [b];"],
                              fused.variant)
    early = _row(rows, "fusedearly")
    assert checks.check_fused(early.lines + ["ld.global.u32 %r1, [%rd1];"], early.variant)
    # the fused kernel without its st.async pushes or its FP8 conversion
    assert checks.check_fused([ln for ln in fused.lines if "st.async" not in ln], fused.variant)
    assert checks.check_fused([ln for ln in fused.lines if "e4m3x2" not in ln], fused.variant)
    # the spread build: no cluster ops; the mailbox stores and the poll
    # after the PDL wait, with a deadline
    spread = _row(rows, "fusedspread")
    sv = spread.variant
    assert not spread.errors and not checks.check_fused(spread.lines, sv)
    wait = next(i for i, ln in enumerate(spread.lines) if "griddepcontrol.wait" in ln)
    poll = next(ln for ln in spread.lines if ln.startswith("ld.volatile.global.u32"))
    assert any("poll" in e for e in checks.check_fused(
        [ln for ln in spread.lines if not ln.startswith("ld.volatile.global.u32")], sv))
    assert any("poll" in e for e in checks.check_fused(
        [ln for ln in spread.lines if "%globaltimer" not in ln], sv))
    store = next(ln for ln in spread.lines if ln.startswith("st.volatile.global.u32"))
    early = spread.lines[:wait] + [store] + spread.lines[wait:]
    assert any("before griddepcontrol.wait" in e for e in checks.check_fused(early, sv))
    assert any("cluster" in e for e in checks.check_fused(
        spread.lines + ["barrier.cluster.arrive.relaxed.aligned;"], sv))
    assert any("poll" in e for e in checks.check_fused(
        [poll] + [ln for ln in spread.lines if ln != poll], sv))
    assert checks.check_fused([ln for ln in spread.lines if "e4m3x2" not in ln], sv)
    # its whole-row bulk build: the copies before the PDL wait, no register
    # weight loads, a CTA-local mbarrier but no cluster op; and the
    # no-exchange timing probe: no mailbox access at all
    sbulk = _row(rows, "fusedspreadbulk")
    bv = sbulk.variant
    assert not sbulk.errors and not checks.check_fused(sbulk.lines, bv)
    copy = next(ln for ln in sbulk.lines if ln.startswith("cp.async.bulk."))
    bwait = next(i for i, ln in enumerate(sbulk.lines) if "griddepcontrol.wait" in ln)
    late = [ln for ln in sbulk.lines if ln != copy]
    late.insert(bwait + 1, copy)
    assert any("bulk build" in e for e in checks.check_fused(late, bv))
    assert any("register weight loads" in e for e in checks.check_fused(
        sbulk.lines + ["ld.global.nc.L1::no_allocate.v4.u32 {a}, [b];"], bv))
    assert any("cluster" in e for e in checks.check_fused(
        sbulk.lines + ["mapa.shared::cluster.u32 r, a, b;"], bv))
    assert any("mbarrier" in e for e in checks.check_fused(
        spread.lines + ["mbarrier.init.shared.b64 [a], 32;"], sv))
    nox = _row(rows, "fusedspreadnox")
    assert not nox.errors and not checks.check_fused(nox.lines, nox.variant)
    assert not any("volatile" in ln for ln in nox.lines)
    assert any("no-exchange" in e for e in checks.check_fused(nox.lines + [poll], nox.variant))
    # the key-first build: the exchange between the key row's wait and the
    # other rows', each GEMV pass after its wait
    kf = _row(rows, "fusedkeyfirst")
    kv = kf.variant
    assert not kf.errors and not checks.check_fused(kf.lines, kv)
    waits = [i for i, ln in enumerate(kf.lines) if ln.startswith("mbarrier.try_wait")]
    late_store = [ln for ln in kf.lines if not ln.startswith("st.volatile.global.u32")]
    late_store.insert(waits[-1] + 1, "st.volatile.global.u32 [a], b;")
    assert any("not between" in e for e in checks.check_fused(late_store, kv))
    one_wait = [ln for i, ln in enumerate(kf.lines) if i != waits[-1]]
    assert any("two mbarrier waits" in e for e in checks.check_fused(one_wait, kv))
    no_first_pass = [ln for i, ln in enumerate(kf.lines)
                     if not (ln.startswith("mma.sync") and waits[0] < i < waits[-1])]
    assert any("mma not after" in e for e in checks.check_fused(no_first_pass, kv))
    # the stage-x builds: the x loads, the tile stores, the barrier, then the
    # fragment reads and the mma; no tile stores in any other build
    for name in ("fusedstagex", "fusedstagex1"):
        sx = _row(rows, name)
        xv = sx.variant
        assert not sx.errors and not checks.check_fused(sx.lines, xv)
        bar = next(i for i, ln in enumerate(sx.lines) if ln.startswith("bar.sync"))
        x_load = next(ln for ln in sx.lines if ln.startswith("ld.global.v4"))
        late_load = sx.lines[:bar + 1] + [x_load] + sx.lines[bar + 1:]
        assert any("x loads" in e for e in checks.check_fused(late_load, xv))
        no_bar = [ln for i, ln in enumerate(sx.lines) if i != bar]
        assert any("barrier" in e for e in checks.check_fused(no_bar, xv))
        mma = next(i for i, ln in enumerate(sx.lines) if i > bar and ln.startswith("mma.sync"))
        no_reads = [ln for i, ln in enumerate(sx.lines)
                    if not (bar < i < mma and ln.startswith("ld.shared.v4"))]
        assert any("order broken" in e for e in checks.check_fused(no_reads, xv))
    sk2 = _row(rows, "fusedsplitk2")
    assert any("not stage-x" in e for e in checks.check_fused(
        sk2.lines + ["st.shared.v4.u32 [a], {b, c, d, e};"], sk2.variant))


# --- host classes (CPU tensors: validation happens before any launch) --------

def _indexer(k=1024, heads=16, gate=128, **kw):
    from kernels.indexer.stage import Indexer

    return Indexer(hidden=k, q_lora_rank=32, heads=heads, gate=gate, **kw)


@pytest.fixture(scope="module")
def proj():
    from kernels.indexer.projection import IndexerProjection

    return IndexerProjection(_indexer(), arch="sm_90")


def test_fused_weight_and_slots(proj):
    order, first = fused_layout(proj.key, proj.heads, proj.gate)
    assert first == proj.first_head == proj.key // ROWS
    assert proj.slots.tolist() == slot_codes(order, proj.key, proj.heads)
    for slot, row in enumerate(order):
        want = proj.weight[row] if row >= 0 else torch.zeros_like(proj.weight[0])
        assert torch.equal(proj.fused_weight[slot], want)
    assert proj.fused_ctas % (proj.key // ROWS) == 0


def test_spread_slots_and_mailbox(proj):
    from kernels.indexer.compile import FusedConfig
    from kernels.indexer.layout import (MAILBOX_SENTINEL, FusedVariant, key_first_layout,
                                        spread_layout)

    order, first = spread_layout(proj.key, proj.heads, proj.gate)
    assert first == proj.spread_first_head and len(order) // ROWS == proj.spread_ctas
    assert proj.spread_slots.tolist() == slot_codes(order, proj.key, proj.heads)
    assert proj.key_mailbox.shape == (proj.fused_max_tokens * proj.key,)
    assert bool((proj.key_mailbox.to(torch.int64) & 0xFFFFFFFF == MAILBOX_SENTINEL).all())
    spread = FusedVariant(True, True, spread=True)
    with pytest.raises(ValueError, match="needs key to divide its 512 threads, got key = 24"):
        FusedConfig(key=24, heads=16, gate=0, k=1024, tokens=1, padded=64, variant=spread).validate()
    with pytest.raises(ValueError, match="tokens must be >= 1, got 0"):
        FusedConfig(key=128, heads=16, gate=0, k=1024, tokens=0, padded=64).validate()
    first = FusedVariant(True, True, bulk=True, spread=True, key_first=True)
    with pytest.raises(ValueError, match="runs one token tile: tokens must be <= 16, got 17"):
        FusedConfig(key=128, heads=16, gate=0, k=1024, tokens=17, padded=64,
                    variant=first).validate()
    with pytest.raises(ValueError, match="needs heads <= key = 128, got heads=136"):
        FusedConfig(key=128, heads=136, gate=0, k=1024, tokens=1, padded=136,
                    variant=first).validate()
    order, _ = key_first_layout(proj.key, proj.heads, proj.gate)
    assert proj.key_first_slots.tolist() == slot_codes(order, proj.key, proj.heads)
    with pytest.raises(ValueError, match="padded must be >= heads = 16, got 8"):
        FusedConfig(key=128, heads=16, gate=0, k=1024, tokens=1, padded=8).validate()


def test_rows_or_k_do_not_tile():
    from kernels.indexer.projection import IndexerProjection

    with pytest.raises(ValueError, match="rows or K do not tile"):
        IndexerProjection(_indexer(k=1000), arch="sm_90")
    with pytest.raises(ValueError, match="rows or K do not tile"):
        IndexerProjection(_indexer(heads=12), arch="sm_90")
    with pytest.raises(ValueError, match="arch must be one of"):
        IndexerProjection(_indexer(), arch="sm_80")


def _x(m, k=1024, dtype=torch.bfloat16):
    return torch.zeros(m, k, dtype=dtype)


@pytest.mark.parametrize("bad, match", [
    (lambda: _x(2, dtype=torch.float32), "x must be torch.bfloat16"),
    (lambda: _x(2, k=2048), r"x must have shape \[\*, 1024\]"),
    (lambda: _x(2, k=2048)[:, :1024], "x must be contiguous"),
    (lambda: _x(3).view(-1)[1:1 + 2048].view(2, 1024), "16-byte aligned"),
    (lambda: _x(0), "at least one token"),
    (lambda: _x(513), "outside tactic table"),
])
def test_projection_rejects_bad_inputs(proj, bad, match):
    with pytest.raises(ValueError, match=match):
        proj(bad())


def test_projection_rejects_bad_tactic_and_out(proj):
    with pytest.raises(ValueError, match="rows or K do not tile"):
        proj(_x(2), tactic=Tactic(16, 4))  # 32 * 16 * 4 = 2048 does not divide 1024
    with pytest.raises(ValueError, match="Tactic or None"):
        proj(_x(2), tactic=(16, 1))
    with pytest.raises(ValueError, match="shared memory"):
        proj(_x(512), tactic=Tactic(16, 1))
    out = (torch.empty(2, proj.key, dtype=torch.bfloat16), torch.empty(2, proj.heads),
           torch.empty(2, proj.gate, dtype=torch.float32))
    with pytest.raises(ValueError, match=r"out\[2\] \(gate\) must be torch.bfloat16"):
        proj(_x(2), out=out)
    with pytest.raises(ValueError, match="tuple of 3"):
        proj(_x(2), out=out[:2])


def test_fused_rejects_bad_inputs(proj):
    ind = _indexer()
    q = torch.zeros(2, proj.heads * DIM, dtype=torch.bfloat16)
    norm = ind.k_norm
    ok = dict(x=_x(2), q=q, norm=norm, scale=0.1, padded=64)

    def call(**kw):
        args = {**ok, **kw}
        return proj.fused(args.pop("x"), args.pop("q"), args.pop("norm"), args.pop("scale"),
                          args.pop("padded"), **args)

    with pytest.raises(ValueError, match="q must have shape"):
        call(q=torch.zeros(2, proj.heads, 64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="q must be torch.bfloat16"):
        call(q=q.float())
    with pytest.raises(ValueError, match="padded must be an int >= heads"):
        call(padded=8)
    with pytest.raises(ValueError, match="scale must be a positive finite"):
        call(scale=float("nan"))
    with pytest.raises(ValueError, match="weights_dtype"):
        call(weights_dtype=torch.float16)
    with pytest.raises(ValueError, match="variant must be a FusedVariant or None, got True"):
        call(variant=True)
    bf16_norm = torch.nn.LayerNorm(proj.key, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="norm.weight must be torch.float32"):
        call(norm=bf16_norm)
    with pytest.raises(ValueError, match="fused kernel takes at most"):
        call(x=_x(proj.fused_max_tokens + 1),
             q=torch.zeros(proj.fused_max_tokens + 1, proj.heads * DIM, dtype=torch.bfloat16))


def test_stage_rejects_rope_and_runs_stock_outside_planned_steps():
    from kernels.indexer.stage import IndexerStage, planned, planned_step
    from kernels.reference.indexer import indexer_fused

    ind = _indexer()
    ind.rope_dim = 64
    with pytest.raises(ValueError, match="NoPE"):
        IndexerStage(ind)
    ind.rope_dim = 0
    stage = IndexerStage(ind)
    assert not planned()
    with planned_step():
        assert planned()
    assert not planned()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 1024, generator=g).to(torch.bfloat16)
    qr = torch.randn(3, 32, generator=g).to(torch.bfloat16)
    got = ind.forward(x, qr)  # outside a planned step: the stock chain, on the CPU
    stage.uninstall()
    q, _ = ind.wq_b(qr)
    weight = torch.cat([ind.wk_weights_proj.weight, ind.index_kpool_compress_gate]).detach()
    ref_q, ref_w, ref_key, ref_gate = indexer_fused(
        x, weight, q.detach(), ind.k_norm.weight.detach(), ind.k_norm.bias.detach(),
        key=128, heads=16, eps=ind.k_norm.eps, scale=ind.softmax_scale * 16 ** -0.5,
        padded=64, ue8m0=True)
    assert got["q_fp8"].shape == ref_q.shape and got["weights"].shape == ref_w.shape
    assert not got["q_fp8"][:, 16:].view(torch.uint8).any() and not got["weights"][:, 16:].any()
    same = (got["q_fp8"].view(torch.uint8) == ref_q.view(torch.uint8)).float().mean()
    assert same > 0.99, same  # the stock Hadamard is a GEMM: rare last-bit differences
    torch.testing.assert_close(got["weights"], ref_w, rtol=1e-3, atol=1e-6)
    torch.testing.assert_close(got["gate_score"].float(), ref_gate.float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(got["k"].float(), ref_key.float(), rtol=2e-2, atol=2e-2)
