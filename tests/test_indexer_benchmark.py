"""The indexer benchmark's table without a GPU: every kernel call and timing
stubbed (CPU tensors, a fixed time per call), so the argument checks, the
candidate rows, the roofline columns and the --ncu-calls launch list are
exercised on CPU. The numbers are the stubs'; the GPU run gives real ones."""

import pytest
import torch

import benchmarks.indexer as bench
from kernels.indexer import layout as L
from kernels.indexer import projection as P
from kernels.indexer import stage as S


@pytest.fixture
def cpu_gpu(monkeypatch):
    """torch.cuda stubs, CPU modules, kernels recorded instead of launched."""
    calls = []
    real = S.Indexer

    def indexer(**kw):
        kw["device"] = "cpu"
        return real(**kw)

    monkeypatch.setattr(S, "Indexer", indexer)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "stub")
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **kw: self)
    monkeypatch.setattr(P.IndexerProjection, "fused",
                        lambda self, x, *a, variant=None, **kw: calls.append(
                            ("fused", x.shape[0], variant)))
    monkeypatch.setattr(P.IndexerProjection, "__call__",
                        lambda self, x, tactic=None, early_launch=False, **kw: calls.append(
                            ("proj", x.shape[0], tactic) + (("launch",) if early_launch else ())))
    monkeypatch.setattr(bench, "read_bandwidth", lambda: 4.0e12)
    monkeypatch.setattr(bench, "graph_node_us", lambda replays: 1.0)

    def time_graph(step, calls_, replays, warmup=3):
        step(0)
        return 2.0
    monkeypatch.setattr(bench, "time_calls", time_graph)
    return calls


def test_roofline_columns_and_sweep_rows(cpu_gpu, tmp_path, capsys):
    out = tmp_path / "bench.md"
    rc = bench.main(["--k", "1024", "--heads", "64", "--tokens", "1,16", "--no-stock",
                     "--sweep", "--sweep-tokens", "1", "--replays", "1", "--rotate-mb", "1",
                     "--markdown", str(out)])
    assert rc == 0
    text = out.read_text()
    rows = [ln.split() for ln in text.splitlines() if ln.startswith(" 1024")]
    # each token count: the table's variant of the cell (marked *) then the others
    names = [r[3] for r in rows]
    want = []
    for m in (1, 16):
        table = L.H200.fused_variant_for(1024, 64, m)
        want += [table.name + "*"] + [v.name for v in L.FUSED_CANDIDATES if v != table]
    assert names == want and len(want) == 2 * len(L.FUSED_CANDIDATES)
    for r in rows:
        m, us = int(r[2]), float(r[4])
        skip = r[3].startswith("skip")
        w_mb, mb, roof, x_roof, tbs = map(float, r[5:10])
        want = L.fused_min_bytes(m, 1024, 128, 64, 128, 64)
        assert mb == pytest.approx(want / 1e6, abs=0.006)
        assert w_mb == pytest.approx(
            L.fused_weight_bytes_read(1024, 128, 64, 128, skip_zero=skip) / 1e6, abs=0.006)
        assert roof == pytest.approx(want / bench.HBM_PEAK * 1e6, abs=0.006)
        assert x_roof == pytest.approx(us / (want / bench.HBM_PEAK * 1e6), abs=0.006)
        assert tbs == pytest.approx(want / (us * 1e-6) / 1e12, abs=0.006)
    # the projection sweep at M=1: every tactic that tiles K = 1024, as built
    # and with launch_dependents first
    sweep = [ln for ln in text.splitlines() if ln.startswith("K=1024")]
    assert len(sweep) == 1
    tiling = [f"w{w}s{s}" for w, s in bench.SWEEP_TACTICS if 1024 % (32 * w * s) == 0]
    assert sorted(t.split()[0] for t in sweep[0].split(": ")[1].split(", ")) == sorted(
        tiling + [t + "+launch" for t in tiling])
    launched = [c for c in cpu_gpu if c[0] == "proj" and c[-1] == "launch"]
    assert len(launched) == len(tiling)
    assert {c[2] for c in cpu_gpu if c[0] == "fused"} == set(L.FUSED_CANDIDATES)


def test_ncu_calls_times_nothing(cpu_gpu, capsys):
    rc = bench.main(["--k", "1024", "--heads", "32", "--tokens", "1", "--ncu-calls", "2",
                     "--ncu-proj", "16x1,4x8"])
    assert rc == 0
    out = capsys.readouterr().out
    n = len(L.FUSED_CANDIDATES)
    assert "TB/s" not in out and out.count("ncu launch:") == n + 2
    table = L.H200.fused_variant_for(1024, 32, 1)
    assert [c[2] for c in cpu_gpu if c[0] == "fused"] == (
        [table] * 2 + [v for v in L.FUSED_CANDIDATES if v != table for _ in range(2)])
    assert [c[2] for c in cpu_gpu if c[0] == "proj"] == [L.Tactic(16, 1)] * 2 + [L.Tactic(4, 8)] * 2


def test_variants_take_candidates_and_timing_probes(cpu_gpu, capsys):
    probe = L.TIMING_PROBES[0]
    rc = bench.main(["--k", "1024", "--heads", "32", "--tokens", "1", "--ncu-calls", "1",
                     "--ncu-proj", "16x1", "--variants", f"skip-zero+early+split-k2,{probe.name}"])
    assert rc == 0
    table = L.H200.fused_variant_for(1024, 32, 1)
    assert [c[2] for c in cpu_gpu if c[0] == "fused"] == [
        table, L.FusedVariant(True, True, split_k=2), probe]
    # past one token tile the key-first candidate is left out, the others run
    cpu_gpu.clear()
    first = next(v for v in L.FUSED_CANDIDATES if v.key_first)
    assert bench.main(["--k", "1024", "--heads", "32", "--tokens", "16,17", "--ncu-calls", "1",
                       "--ncu-proj", "16x1", "--variants", f"{first.name},{probe.name}"]) == 0
    assert [(c[2], c[1]) for c in cpu_gpu if c[0] == "fused"] == [
        (L.H200.fused_variant_for(1024, 32, 16), 16), (first, 16), (probe, 16),
        (L.H200.fused_variant_for(1024, 32, 17), 17), (probe, 17)]
    with pytest.raises(SystemExit):
        bench.main(["--variants", "skip-zero+early+nope"])
    assert "--variants: unknown ['skip-zero+early+nope']" in capsys.readouterr().err


@pytest.mark.parametrize("argv,match", [(["--tokens", "0"], "--tokens must be positive"),
                                        (["--ncu-proj", "3"], "--ncu-proj must be WARPSxSPLIT"),
                                        (["--replays", "0"], "--replays must be >= 1")])
def test_bad_arguments_are_named(argv, match, capsys):
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert match in capsys.readouterr().err
