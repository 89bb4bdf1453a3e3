"""cluster.measure on CPU: rotation sizing, statistics, the max over ranks,
the harness's per-implementation logic (skipped, failed, ranks agreeing)
with a fake workload and a fake timer, each op's check against its
reference with stand-in kernels, and FlashInfer's contract diff."""

from __future__ import annotations

import concurrent.futures
import inspect
import statistics
import sys
import threading
import time

import pytest
import torch

from cluster import ops
from cluster.measure import timing, workloads
from cluster.measure.graph import (FIT_ROUNDS, MAX_FLOOR_FACTOR, MAX_SETS, floor_calls,
                                   graph_calls, refine_calls, rotating, rotation_sets,
                                   scaled_replays)
from cluster.measure.stats import bandwidth, max_over_ranks, median_p10_p90, stats
from cluster.measure.workload import Call, RankContext, Spec, Unavailable, Workload
from cluster.measure.workloads import flashinfer as fi
from cluster.ops.spec import resolve

SPEC = dict(op="all_reduce_norm", hidden=64, tokens=3, calls=4, replays=5, rotate_mb=0.01,
            eps=1e-6, baselines=["unfused"], seed=7, budget_ns=0)


# ---------------------------------------------------------------- rotation, stats
def test_rotation_sets_span_the_rotation_and_are_capped():
    assert rotation_sets(120, 2**20) == 120
    assert rotation_sets(120, 2**20 + 1) == 120  # ceil: 120 sets of a bit more span >= 120 MB
    assert rotation_sets(1, 2**30) == 2  # at least two sets
    assert rotation_sets(1e6, 16) == MAX_SETS
    assert graph_calls(50, 8) == 50 and graph_calls(50, 120) == 120
    for bad in ((0, 10), (10, 0)):
        with pytest.raises(ValueError, match="must be > 0"):
            rotation_sets(*bad)
    seen = []
    step = rotating(seen.append, 3)
    for _ in range(7):
        step()
    assert seen == [0, 1, 2, 0, 1, 2, 0]


def test_a_replay_floor_lengthens_short_graphs_by_whole_rotations():
    # 50 calls of 8 us = 400 us a replay: a 5 ms floor needs 625 calls, rounded
    # up to whole rotations over 33 sets
    assert floor_calls(50, 33, 400.0, 5000.0) == 627
    assert floor_calls(3072, 3072, 10_000.0, 5000.0) == 3072  # long enough already
    assert floor_calls(50, 33, 400.0, 0.0) == 50              # no floor asked
    assert floor_calls(50, 33, 0.0, 5000.0) == 5016           # at most 100x, whole rotations
    with pytest.raises(ValueError, match="must be >= 0"):
        floor_calls(50, 33, 400.0, -1.0)
    with pytest.raises(ValueError, match="min_replay_ms must be >= 0"):
        Spec.of({**SPEC, "min_replay_ms": -1})


def test_a_longer_graph_is_replayed_proportionally_fewer_times():
    # 200 replays of 50 calls = 10,000 calls; a graph of 3072 calls (the
    # rotation at M = 1) needs 4 replays for as many, but at least 20
    assert scaled_replays(200, 50, 3072, 20) == 20
    assert scaled_replays(200, 50, 192, 20) == 53      # ceil(10,000 / 192)
    assert scaled_replays(200, 50, 50, 20) == 200      # the graph asked for
    assert scaled_replays(10, 50, 3072, 20) == 10      # never more than replays
    assert scaled_replays(200, 50, 3072, 0) == 200     # off
    with pytest.raises(ValueError, match="min_replays must be >= 0"):
        scaled_replays(200, 50, 3072, -1)
    with pytest.raises(ValueError, match="min_replays must be >= 0, got -2"):
        Spec.of({**SPEC, "min_replays": -2})


def test_refined_floor_reaches_the_floor_despite_a_fixed_replay_cost():
    # A replay costs 15 us of launch + 0.85 us a call (about what one H200
    # showed for a tiny kernel): rescaling once from 8 calls gives 184 calls
    # (171 us) for a 500 us floor; remeasuring reaches it.
    measured = []

    def replay_us_of(n):
        measured.append(n)
        return 15.0 + 0.85 * n
    assert 15.0 + 0.85 * floor_calls(8, 4, replay_us_of(8), 500.0) < 500.0
    measured.clear()
    n = refine_calls(8, 4, 500.0, replay_us_of)
    assert 15.0 + 0.85 * n >= 500.0 and n % 4 == 0 and len(measured) <= FIT_ROUNDS
    # capped at MAX_FLOOR_FACTOR times the calls asked for, however many rounds
    assert refine_calls(8, 4, 1e6, replay_us_of) == 8 * MAX_FLOOR_FACTOR
    measured.clear()
    assert refine_calls(8, 4, 0.0, replay_us_of) == 8 and measured == []  # no floor: no replay


def test_stats_are_the_results_timing_columns():
    times = [float(x) for x in range(1, 101)]
    s = stats(times)
    assert s["t_n"] == 100 and s["t_min_us"] == 1.0 and s["t_median_us"] == 50.5
    assert s["t_mean_us"] == 50.5 and s["t_p90_us"] == 90.0 and s["t_p99_us"] == 99.0
    assert s["t_stdev_us"] == pytest.approx(statistics.stdev(times))
    assert stats([3.0])["t_stdev_us"] == 0.0
    with pytest.raises(ValueError):
        stats([])
    med, p10, p90 = median_p10_p90(times)
    assert med == 50.5 and p10 < 12 and p90 > 89


def test_max_over_ranks_and_bandwidth():
    assert max_over_ranks([[3.0, 5.0, 3.0], [4.0, 3.0, 3.5]]) == [4.0, 5.0, 3.5]
    with pytest.raises(ValueError, match="different replay counts"):
        max_over_ranks([[1.0], [1.0, 2.0]])
    bw = bandwidth(1_000_000, 1.0, 10.0)  # 1 MB in 10 us = 100 GB/s
    assert bw["algbw_GBps"] == pytest.approx(100.0) and bw["busbw_GBps"] == pytest.approx(100.0)
    assert bandwidth(1_000_000, 0.5, 10.0)["busbw_GBps"] == pytest.approx(50.0)


def test_spec_names_what_is_missing_or_unknown():
    assert Spec.of(SPEC).tokens == 3
    with pytest.raises(ValueError, match=r"lacks \['seed'\]"):
        Spec.of({k: v for k, v in SPEC.items() if k != "seed"})
    with pytest.raises(ValueError, match="unknown keys"):
        Spec.of({**SPEC, "bogus": 1})
    with pytest.raises(ValueError, match="tokens must be >= 1"):
        Spec.of({**SPEC, "tokens": 0})


# ---------------------------------------------------------------- the harness
class FakeCtx(RankContext):
    """A rank of a group without GPUs: ``elsewhere`` other ranks report a
    failure at each agreement."""

    def __init__(self, elsewhere: int = 0, tp: int = 2):
        super().__init__(rank=0, tp=tp, device=torch.device("cpu"), capacity=64, dist=True)
        self.elsewhere, self.agreements = elsewhere, 0

    def barrier(self):
        pass

    def gather(self, t):
        return [t] * self.tp

    def failed_elsewhere(self, failed):
        self.agreements += 1
        return int(failed) + self.elsewhere


CALLS: list = []
CHECK = {"wrong": False}


def fake_workload(ctx, spec) -> Workload:
    """Stands in for an op's declared workload builder (timing.time_case's workload=)."""
    def fused():
        return Call(lambda i: CALLS.append(("fused", i)))

    def check():
        if CHECK["wrong"]:
            raise AssertionError("residual_out is not bit-exact")

    def unavailable():
        raise Unavailable("flashinfer is not importable here")

    def broken():
        raise RuntimeError("no symmetric memory in this torch")

    def wrong():
        raise AssertionError("outputs beyond its tolerance")

    return Workload("all_reduce_norm", sets=3, set_bytes=100, bytes_moved=384, bus_factor=1.0,
                    fused=fused, check=check,
                    baselines={"unfused": lambda: Call(lambda i: None, {"all_reduce": "nccl"}),
                               "symm_mem": broken, "flashinfer_oneshot": unavailable,
                               "flashinfer_twoshot": wrong})


@pytest.fixture
def no_gpu(monkeypatch):
    timed = []

    def time_graph(fn, calls, replays, before_replay=None):
        timed.append(calls)
        return [float(replays)] * replays

    monkeypatch.setattr(timing, "time_graph", time_graph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake GPU")
    monkeypatch.setattr(timing, "nvtx_range", lambda *a: _Null())
    CHECK["wrong"] = False
    return timed


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


WORKLOAD = f"{__name__}.fake_workload"


def test_time_case_times_fused_and_baselines_and_says_why_not(no_gpu):
    spec = {**SPEC, "baselines": ["unfused", "symm_mem", "flashinfer", "nonesuch"]}
    out = timing.time_case(FakeCtx(), spec, WORKLOAD)
    impls = out["impls"]
    assert list(impls) == ["fused", "unfused", "symm_mem", "flashinfer_oneshot",
                           "flashinfer_twoshot", "nonesuch"]
    assert impls["fused"]["times_us"] == [5.0] * 5 and impls["fused"]["compile_s"] >= 0
    assert impls["unfused"]["extra"] == {"all_reduce": "nccl"}
    assert impls["symm_mem"]["skipped"].startswith("symm_mem unavailable: RuntimeError")
    assert impls["flashinfer_oneshot"] == {"skipped": "flashinfer is not importable here"}
    assert "outputs beyond its tolerance" in impls["flashinfer_twoshot"]["failed"]
    assert "has no nonesuch baseline" in impls["nonesuch"]["skipped"]
    assert no_gpu == [4, 4]  # fused and unfused timed, graphs of max(calls, sets) calls
    assert out["sets"] == 3 and out["bytes_moved"] == 384 and out["device"] == "fake GPU"


def test_a_replay_floor_fits_each_implementation_s_graph(no_gpu, monkeypatch):
    """min_replay_ms: every implementation's graph length comes from
    fit_calls, with the ranks agreeing through the max over ranks."""
    seen = []

    def fit_calls(fn, calls, sets, min_replay_us, before_replay=None, agree=None):
        seen.append((calls, sets, min_replay_us, agree(1.0)))
        return 600
    monkeypatch.setattr(timing, "fit_calls", fit_calls)
    ctx = FakeCtx()
    ctx.max_over_ranks = lambda v: v + 1.0  # stands in for the all-reduce
    out = timing.time_case(ctx, {**SPEC, "min_replay_ms": 5}, WORKLOAD)
    assert seen == [(4, 3, 5000.0, 2.0)] * 2  # fused and unfused (the others do not run)
    assert out["impls"]["fused"]["calls"] == out["impls"]["unfused"]["calls"] == 600
    assert no_gpu == [600, 600] and out["calls"] == 4
    assert len(out["impls"]["fused"]["times_us"]) == 5  # min_replays unset: every replay
    out = timing.time_case(ctx, {**SPEC, "min_replay_ms": 5, "min_replays": 2}, WORKLOAD)
    assert [len(out["impls"][n]["times_us"]) for n in ("fused", "unfused")] == [2, 2]


def test_fused_wrong_answer_or_failure_elsewhere_stops_every_rank(no_gpu):
    CHECK["wrong"] = True
    ctx = FakeCtx()
    with pytest.raises(AssertionError, match="not bit-exact"):
        timing.time_case(ctx, SPEC, WORKLOAD)
    # agreed after building, after the first call and after checking
    assert ctx.agreements == 3 and no_gpu == []
    CHECK["wrong"] = False
    CALLS.clear()
    with pytest.raises(timing.PeerFailed, match="failed on 1 other rank"):
        timing.time_case(FakeCtx(elsewhere=1), SPEC, WORKLOAD)
    assert no_gpu == [] and CALLS == []  # a peer failed to build: no first call either


class ThreadCtx(FakeCtx):
    """One of ``tp`` ranks run as threads: agreements are real (every rank
    waits for the others and sees their flags)."""

    def __init__(self, rank, shared):
        super().__init__(tp=len(shared["flags"]))
        self.rank, self.shared = rank, shared

    def failed_elsewhere(self, failed):
        shared = self.shared
        shared["flags"][self.rank] = int(failed)
        shared["barrier"].wait(timeout=10)
        total = sum(shared["flags"])
        shared["barrier"].wait(timeout=10)
        return total


def test_every_rank_builds_before_any_makes_the_first_call(no_gpu):
    """A slow compile on one rank must not eat the first call's watchdog
    budget on the other (seen on two H200s: the first case of a fresh group
    failed on the rank whose peer was still compiling)."""
    events, lock = [], threading.Lock()

    def workload(ctx, spec):
        def fused():
            time.sleep(0.3 if ctx.rank == 1 else 0.0)  # rank 1 compiles longer
            with lock:
                events.append(("built", ctx.rank))

            def call(i):
                with lock:
                    events.append(("call", ctx.rank))
            return Call(call)
        return Workload("all_reduce_norm", sets=1, set_bytes=1, bytes_moved=1, bus_factor=1.0,
                        fused=fused, check=lambda: None, baselines={})

    shared = {"flags": [0, 0], "barrier": threading.Barrier(2)}
    module = sys.modules[__name__]
    module._two_rank_workload = workload
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(lambda r: timing.time_case(
            ThreadCtx(r, shared), SPEC, f"{__name__}._two_rank_workload"), [0, 1]))
    first_call = events.index(next(e for e in events if e[0] == "call"))
    assert sorted(events[:first_call]) == [("built", 0), ("built", 1)], events
    assert all("times_us" in o["impls"]["fused"] for o in outs)


def test_the_row_carries_the_failing_rank_s_own_error():
    from cluster.group import own_error

    class TaskError(Exception):  # what ray.get raises: the actor's exception as .cause
        def __init__(self, cause):
            super().__init__(str(cause))
            self.cause = cause

    echo = TaskError(timing.PeerFailed("rank 0: the fused op failed on 1 other rank(s)"))
    own = TaskError(AssertionError("fused: watchdog: missing ranks {0}"))
    assert own_error([echo, own]) is own
    assert own_error([echo]) is echo
    assert own_error([RuntimeError("actor died"), echo]).args == ("actor died",)


def test_a_baseline_another_rank_cannot_run_is_skipped_on_every_rank(no_gpu, monkeypatch):
    ctx = FakeCtx()
    calls = {"n": 0}

    def failed_elsewhere(failed):
        calls["n"] += 1
        return int(failed) + (calls["n"] > 3)  # fused agrees (3 calls), then peers fail
    ctx.failed_elsewhere = failed_elsewhere
    out = timing.time_case(ctx, {**SPEC, "baselines": ["unfused"]}, WORKLOAD)
    assert out["impls"]["unfused"] == {"skipped": "unfused could not run on 1 other rank(s) "
                                                  "of the group"}


def test_unknown_op_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown op 'nonesuch'; known: "):
        timing.time_case(FakeCtx(), {**SPEC, "op": "nonesuch"})
    bare = ops.OpSpec(name="untimed", summary="", collective=False, impl="x", inputs=("random",))
    with pytest.raises(ValueError, match="op untimed declares no timed workload"):
        bare.workload_builder()


def test_every_builder_survives_its_modules_being_imported():
    """A process times many cases: once a case has imported the workload
    submodules, every profiled op must still resolve to its builder (a
    submodule named like an op replaces that op's builder on the package)."""
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(workloads.__path__):
        importlib.import_module(f"{workloads.__name__}.{info.name}")
    for op in ops.profiled():
        assert inspect.isfunction(ops.get(op).workload_builder()), op


def test_a_workload_module_that_fails_to_import_says_why(monkeypatch, tmp_path):
    (tmp_path / "broken_workload.py").write_text("import nonexistent_dependency_xyz\n"
                                                 "def build(ctx, spec): ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="nonexistent_dependency_xyz"):
        resolve("broken_workload.build", "timing workload of op 'all_reduce_norm'")
    with pytest.raises(ValueError, match="timing workload of op 'x': nothing callable at "
                                         "'absent_mod_xyz.build'"):
        resolve("absent_mod_xyz.build", "timing workload of op 'x'")
    with pytest.raises(ValueError, match="'build' is not a dotted"):
        resolve("build", "timing workload of op 'x'")


# ---------------------------------------------------------------- the workloads' checks
class _Reference:
    """Stands in for a kernel class: writes the reference outputs (tp=1);
    ``wrong`` flips the last bit of one residual element."""
    wrong = False

    def __init__(self, **kw):
        self.kw = kw
        self.tuning = type("T", (), {"rank_lanes": 1, "cluster_size": 1, "threads": 128})

    def __call__(self, x, *args, out):
        from kernels.moe import MoEOutput
        from kernels.reference.allreduce import all_reduce_norm
        from kernels.reference.mhc import all_reduce_mhc
        from kernels.reference.moe import all_reduce_norm_finalize
        eps = self.kw["eps"] if "eps" in self.kw else args[5]
        if isinstance(x, MoEOutput):
            norm, res = all_reduce_norm_finalize([x.to_partial()], *args[:2], eps)
            res_out, other = out[1], out[0]
            res_out.copy_(res), other.copy_(norm)
        elif "hc_mult" in self.kw:
            res, layer = all_reduce_mhc([x], *args[:5], eps)
            res_out = out[0]
            out[0].copy_(res), out[1].copy_(layer)
        else:
            norm, res = all_reduce_norm([x], *args[:2], eps)
            res_out = out[1]
            out[0].copy_(norm), out[1].copy_(res)
        if type(self).wrong:
            res_out.view(torch.int16).view(-1)[5] += 1

    def form(self, x):
        return "reference"

    def variant(self, x):
        return "reference"

    embed_form = form
    embed_variant = variant

    def prepare_embedding(self, table, start, rows):
        self.table = (table, start)

    def embed_norm(self, ids, positions, previous, table, enorm, hnorm, out):
        from kernels.reference.embed import embed_norm
        out.copy_(embed_norm(ids, positions, previous, [self.table], enorm, hnorm,
                             self.kw["eps"]))
        if type(self).wrong:
            out[0, 0] += 1.0


@pytest.mark.parametrize("op", ["all_reduce_norm", "finalize_publish", "all_reduce_mhc",
                                "embed_norm"])
def test_each_op_checks_its_fused_outputs_against_the_reference(op, monkeypatch):
    import kernels.lamport.all_reduce_mhc as mhc_mod
    import kernels.lamport.all_reduce_norm as norm_mod
    monkeypatch.setattr(norm_mod, "AllReduceNorm", _Reference)
    monkeypatch.setattr(mhc_mod, "AllReduceMHC", _Reference)
    _Reference.wrong = False
    ctx = RankContext(rank=0, tp=1, device=torch.device("cpu"), capacity=8, dist=False)
    spec = Spec.of({**SPEC, "op": op, "hc": 4, "top_k": 2,
                    "baselines": ["unfused"]})
    work = ops.get(op).workload_builder()(ctx, spec)
    assert work.sets >= 2 and work.bytes_moved == spec.tokens * spec.hidden * 2
    call = work.fused()
    call.fn(0)
    work.check()
    _Reference.wrong = True
    call.fn(0)
    with pytest.raises(AssertionError):
        work.check()
    base = work.baselines["unfused"]()
    assert base.extra == {"all_reduce": "identity (tp=1)"}
    got = base.fn(0)
    assert all(t.dtype == torch.bfloat16 for t in (got if isinstance(got, tuple) else (got,)))


def test_capacity_and_missing_op_parameters_are_refused():
    ctx = RankContext(rank=0, tp=1, device=torch.device("cpu"), capacity=2, dist=False)
    with pytest.raises(ValueError, match=r"tokens must be in 1..capacity=2, got 3"):
        ops.get("all_reduce_norm").workload_builder()(ctx, Spec.of(SPEC))
    ctx = RankContext(rank=0, tp=1, device=torch.device("cpu"), capacity=8, dist=False)
    with pytest.raises(ValueError, match="needs top_k"):
        ops.get("finalize_publish").workload_builder()(
            ctx, Spec.of({**SPEC, "op": "finalize_publish"}))
    with pytest.raises(ValueError, match="tp=2 needs a torch.distributed group"):
        RankContext(rank=0, tp=2, device=None, capacity=8, dist=False)


# ---------------------------------------------------------------- FlashInfer
def _norm_case(tp=2, m=4, h=64, seed=3):
    from kernels.reference.allreduce import all_reduce_norm
    g = torch.Generator().manual_seed(seed)
    partials = [torch.randn(m, h, generator=g).to(torch.bfloat16) for _ in range(tp)]
    residual = torch.randn(m, h, generator=g).to(torch.bfloat16)
    weight = (1 + 0.1 * torch.randn(h, generator=g)).to(torch.bfloat16)
    norm, res = all_reduce_norm(partials, residual, weight, 1e-6)
    return partials, residual, weight, norm, res


def test_contract_diff_counts_elements_off_our_bit_exact_contract():
    from kernels.reference.allreduce import rms_norm
    partials, residual, weight, norm, res = _norm_case()
    d = fi.contract_diff(norm, res, partials, residual, weight, 1e-6)
    assert d == {"elements": 256, "residual_out_differs": 0, "norm_out_differs": 0,
                 "residual_out_max_ulp": 0.0, "norm_out_max_ulp": 0.0}
    # Another arithmetic (the FP32 reduction added to the residual unrounded;
    # ours rounds it to BF16 first): within the tolerance, counted where the
    # bits differ from our contract.
    theirs = (partials[0].float() + partials[1].float() + residual.float()).to(torch.bfloat16)
    d = fi.contract_diff(rms_norm(theirs, weight, 1e-6), theirs, partials, residual, weight, 1e-6)
    differs = int((theirs.view(torch.int16) != res.view(torch.int16)).sum())
    assert d["residual_out_differs"] == differs and differs > 0
    far = res.clone()
    far[1, 2] += 4.0
    with pytest.raises(AssertionError, match="residual_out: 1 elements beyond"):
        fi.contract_diff(norm, far, partials, residual, weight, 1e-6)
    off = norm.clone()
    off.view(torch.int16)[0, 0] += 3
    with pytest.raises(AssertionError, match="norm_out: 3.0 BF16 ULP"):
        fi.contract_diff(off, res, partials, residual, weight, 1e-6)


def test_flashinfer_modes_and_absence_are_skips_with_the_reason(monkeypatch):
    import sys
    assert "tp >= 2" not in (fi.mode_applies("oneshot", 1, 2) or "")
    assert "TP group of >= 2" in fi.mode_applies("oneshot", 8, 1)
    assert fi.mode_applies("twoshot", 2, 2) == ("flashinfer two-shot needs M > tp "
                                                "(token_num > world_size): M=2, tp=2")
    assert fi.mode_applies("twoshot", 3, 2) is None
    with pytest.raises(ValueError, match="mode must be one of"):
        fi.mode_applies("threeshot", 3, 2)
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    with pytest.raises(Unavailable, match="^flashinfer is not importable here"):
        fi.flashinfer_comm()
    ctx = FakeCtx()
    partials, residual, weight, _, _ = _norm_case()
    makers = fi.flashinfer_baselines(ctx, Spec.of({**SPEC, "tokens": 4}), torch.stack(partials),
                                     torch.stack([residual] * 2), weight)
    assert sorted(makers) == ["flashinfer_oneshot", "flashinfer_twoshot"]
    with pytest.raises(Unavailable, match="^flashinfer is not importable here"):
        makers["flashinfer_oneshot"]()


def test_workload_inputs_on_the_cpu_are_the_generator_s_draws():
    """cluster.measure.workloads.common.randn on a CPU device: the CPU
    generator's own normal draws (scaled, shifted, rounded to BF16), so a
    seed gives the same tensor every time; on a GPU they are drawn there
    (tests/gpu/test_timing_gpu.py)."""
    from cluster.measure.workloads.common import randn
    g, again = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    got = randn((4, 9), g, "cpu", scale=0.1, offset=1.0)
    assert got.dtype == torch.bfloat16 and got.device.type == "cpu"
    assert torch.equal(got, (1.0 + 0.1 * torch.randn((4, 9), generator=again)).to(torch.bfloat16))
