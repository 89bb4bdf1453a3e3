"""The spread probe (``python -m benchmarks.indexer_spread``) without a GPU:
its shapes model the fused kernel's bytes, its sm_90a PTX holds the loads and
the exchange each shape names, its check oracle adds what the kernel adds,
and bad arguments stop before CUDA. Its timings come from the H200 run
(docs/results/indexer_spread_h200_2026-12-04.md)."""

import pytest
import torch

import benchmarks.indexer_spread as spread
from kernels.indexer import layout as L

SHAPES = {s.name: s for s in spread.SHAPES}


def test_every_shape_streams_at_least_the_fused_kernels_weights_at_k_7168():
    weights = L.fused_weight_bytes_read(7168, L.KEY, 64, L.GATE, skip_zero=True)
    for shape in spread.SHAPES:
        shape.validate()
        if shape.name.startswith("tiny"):
            continue
        assert weights <= shape.units * spread.UNIT <= 1.1 * weights, shape.name
    # today's grid is split-k2's: 80 CTAs, the two heavy clusters 112 KiB a CTA
    today = SHAPES["today"]
    assert today.ctas == L.fused_ctas(L.KEY, 64, L.GATE)
    heavy = 128 * (7168 // 16) * 2  # 128 live rows over one CTA's K / 16
    assert today.segments[0] == (32, heavy // spread.UNIT)


def test_the_oracle_adds_each_ctas_share_and_the_exchange_group():
    shape = spread.Shape("t", ((2, 1), (1, 2)), 1, exchange=2)
    w = torch.arange(shape.units * spread.UNIT // 2, dtype=torch.float64).to(torch.bfloat16)
    flat = w.to(torch.float64)
    half = spread.UNIT // 2
    want = torch.tensor([flat[:2 * half].sum(), 0.0, 0.0, flat[2 * half:].sum()],
                        dtype=torch.float64)
    assert torch.equal(spread.expected(shape, w), want)


def test_the_oracle_of_an_early_exchange_splits_each_exchanging_share():
    shape = spread.Shape("t", ((2, 3), (1, 2)), 1, exchange=2, mode="flags", early_units=1)
    w = torch.arange(shape.units * spread.UNIT // 2, dtype=torch.float64).to(torch.bfloat16)
    flat = w.to(torch.float64)
    half = spread.UNIT // 2
    want = torch.tensor([flat[:half].sum() + flat[3 * half:4 * half].sum(),
                         flat[half:3 * half].sum(), flat[4 * half:6 * half].sum(),
                         flat[6 * half:].sum()], dtype=torch.float64)
    assert torch.equal(spread.expected(shape, w), want)


@pytest.mark.parametrize("shape, message", [
    (spread.Shape("e", ((4, 2),), 1, exchange=2, early_units=1), "early_units needs mode"),
    (spread.Shape("f", ((4, 2),), 1, exchange=2, mode="flags", early_units=2), "0 < early_units < 2"),
    (spread.Shape("g", ((4, 2),), 1, mode="flags", early_units=1), "an exchange"),
    (spread.Shape("a", ((3, 1),), 2), "not whole clusters"),
    (spread.Shape("b", ((4, 17),), 1), "units a CTA"),
    (spread.Shape("c", ((4, 1),), 1, exchange=5), "exchange must be in 0..4, got 5"),
    (spread.Shape("d", ((4, 1),), 1, exchange=2, mode="poll"), "mode must be"),
])
def test_a_bad_shape_names_its_field(shape, message):
    with pytest.raises(ValueError, match=message):
        shape.validate()


def test_a_bad_pad_is_refused():
    with pytest.raises(ValueError, match="pad_bytes"):
        spread.SpreadProbe(SHAPES["today"], spread.MAX_PAD_BYTES + 4)


@pytest.mark.parametrize("argv, message", [
    (["--shapes", "today,nope"], "unknown"),
    (["--replays", "1"], "--replays"),
    (["--pad-kb", "999"], "--pad-kb"),
])
def test_bad_arguments_exit_2_before_cuda(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("reached CUDA"))
    with pytest.raises(SystemExit) as exit_:
        spread.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def _ptx(shape, tmp_path):
    import cutlass.cute as cute
    from cutlass import Int64
    from cutlass.cute.runtime import make_fake_stream

    from kernels.lamport.compile import _options

    cute.compile(spread.SpreadProbe(shape, 120 * 1024), *([Int64(0)] * 4), make_fake_stream(),
                 options=_options("sm_90a", str(tmp_path)))
    (ptx,) = tmp_path.glob("*.ptx")
    return ptx.read_text()


@pytest.mark.parametrize("name", ["even-132/1", "even-132/1+exchange", "even-132/1+flags",
                                  "even-132/1+early128"])
def test_the_ptx_streams_before_the_pdl_wait_and_exchanges_as_named(name, tmp_path):
    shape = SHAPES[name]
    ptx = _ptx(shape, tmp_path)
    wait = ptx.index("griddepcontrol.wait")
    loads = [i for i in range(len(ptx)) if ptx.startswith("ld.global.nc", i)]
    assert len(loads) == shape.max_units and max(loads) < wait
    atomic = "atom.acq_rel.gpu.global.add.u32" in ptx
    polls = ptx.count("ld.volatile.global.u32")
    assert atomic == (shape.exchange > 0 and shape.mode == "atomic")
    assert (polls > 0) == (shape.mode == "flags")
    if shape.mode == "flags":
        assert "%globaltimer" in ptx  # the poll gives up: never a hang
