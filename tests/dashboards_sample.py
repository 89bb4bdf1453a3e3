"""A small results dataset for the dashboard tests, written with ResultsWriter.

Six nightly runs, a day apart. Every run times 18 all_reduce_norm cases
(tp 2/4/8 x unicast/multicast x tokens 1/16/128) and 4 finalize_publish
cases (tp 4/8, multicast, tokens 1/128) against a baseline; the baseline's
own rows (variant ``baseline:nccl+torch``, as jobs/profile.py writes them) for
the 6 tp=2 all_reduce_norm cases. The latest run also has:
- a regression: all_reduce_norm tp=4 unicast tokens=16 is 30 % slower;
- a failure: all_reduce_norm tp=8 multicast tokens=128 (ULP 3, 17 mismatches,
  no timing);
- a skipped case (tp=16) and two injected faults: a killed rank that hangs
  (diagnosed: rank 3 missing at token 5, fragment 2, stage 1) and a corrupted
  flag detected as expected (pass);
- a baseline row 30 % slower (baselines are judged but never count as a
  regression);
- a new driver version;
- text meant to inject HTML in a variant, a reason and a diagnosis.
Rows carry their ``job`` (the timed cases as correctness rows, the
baseline's as profile rows, the injected faults as fault rows) and the
topology JSON of a made-up node of 8 NVLinked H200s.
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

from cluster.topology import Topology, fake_node
from jobs.results import ResultsWriter, runs

INJECT = '<img src=x onerror="window.__xss=1">'
SCRIPT = "<script>window.__xss=2</script>"
RUNS = 6
DAY0 = dt.datetime(2026, 11, 20, 2, 0, tzinfo=dt.timezone.utc)
AR_TP, AR_TRANSPORTS, AR_TOKENS = (2, 4, 8), ("unicast", "multicast"), (1, 16, 128)
FP_TP, FP_TOKENS = (4, 8), (1, 128)
REGRESSED = {"op": "all_reduce_norm", "tp": 4, "transport": "unicast", "tokens": 16}
FAILED = {"op": "all_reduce_norm", "tp": 8, "transport": "multicast", "tokens": 128}
FP_VARIANT = "publish/" + INJECT
BASELINE = "baseline:nccl+torch"
BASELINE_ROWS = 6  # per run

ENV = dict(nodes=1, gpu_model="NVIDIA H200", gpu_count=8, cuda="13.0", torch="2.11.0",
           cute_dsl="4.8.1", ray="2.60.0", pyarrow="26.0.1", python="3.11.7",
           hostname="h200-a", multicast_supported=True,
           topology=Topology((fake_node("h200-a", 8, multicast=True),)).to_json())
TOPOLOGY_BRIEF = "1 node, 8x H200, NVLink between all 8, multicast capable"


def latency(op: str, tp: int, transport: str, tokens: int, run: int) -> float:
    base = 6.0 + 0.05 * tokens + 1.5 * tp + (2.0 if op == "finalize_publish" else 0.0)
    base *= 0.8 if transport == "multicast" else 1.0
    return base * (1 + 0.004 * math.sin(run * 1.7 + tp + tokens))


def _timed(op, tp, transport, tokens, run, slow=1.0) -> dict:
    median = latency(op, tp, transport, tokens, run) * slow
    base = latency(op, tp, transport, tokens, 0) * 1.6
    return dict(t_n=100, t_min_us=median * 0.95, t_median_us=median, t_mean_us=median * 1.01,
                t_p90_us=median * 1.08, t_p99_us=median * 1.15, t_stdev_us=median * 0.03,
                t_max_over_ranks_median_us=median * 1.04, baseline="nccl+torch",
                baseline_median_us=base, ratio=median / base)


def write_sample(root: Path) -> list[str]:
    """Write the dataset under ``root``; returns the run ids, oldest first."""
    run_ids = []
    for run in range(RUNS):
        latest = run == RUNS - 1
        run_id = f"20261{120 + run}T020000Z-run{run}"
        run_ids.append(run_id)
        when = DAY0 + dt.timedelta(days=run)
        env = dict(ENV, driver="580.95" if latest else "580.82", git_commit=f"{run:x}" * 40)
        rows = []
        clock = when
        for op, tps, transports, tokens_list in (
                ("all_reduce_norm", AR_TP, AR_TRANSPORTS, AR_TOKENS),
                ("finalize_publish", FP_TP, ("multicast",), FP_TOKENS)):
            for tp in tps:
                for transport in transports:
                    for tokens in tokens_list:
                        clock += dt.timedelta(seconds=2)
                        case = {"op": op, "tp": tp, "transport": transport, "tokens": tokens}
                        row = dict(case, started_at=clock, finished_at=clock + dt.timedelta(seconds=1),
                                   variant=FP_VARIANT if op == "finalize_publish" else "fused/default",
                                   backend="gpu", placement="process-per-gpu", hidden=7168,
                                   job="correctness", dtype="bfloat16", outcome="pass", max_ulp=1.0,
                                   max_abs_err=0.0078, mismatches=0,
                                   elements=tokens * 7168 * tp, **env)
                        if latest and case == FAILED:
                            row.update(outcome="fail", max_ulp=3.0, mismatches=17,
                                       reason="17 elements beyond 1 ULP " + SCRIPT,
                                       repro_command="python -m jobs correctness --op "
                                                     "all_reduce_norm --tp 8 --tokens 128")
                        else:
                            slow = 1.3 if latest and case == REGRESSED else 1.0
                            row.update(_timed(op, tp, transport, tokens, run, slow))
                        rows.append(row)
                        if op == "all_reduce_norm" and tp == 2:
                            slow = 1.3 if latest and transport == "unicast" and tokens == 1 else 1
                            base = latency(op, tp, transport, tokens, run) * 1.6 * slow
                            rows.append(dict(row, variant=BASELINE, outcome="pass", job="profile",
                                             t_n=100, t_median_us=base, t_p99_us=base * 1.1,
                                             baseline=None, baseline_median_us=None, ratio=None,
                                             max_ulp=None, mismatches=None))
        if latest:
            clock += dt.timedelta(seconds=2)
            rows.append(dict(op="all_reduce_norm", variant="fused/default", backend="gpu",
                             placement="process-per-gpu", transport="multicast", tp=16,
                             hidden=7168, tokens=1, dtype="bfloat16", outcome="skipped",
                             job="correctness",
                             reason="needs 16 GPUs, 8 present", started_at=clock, **env))
        writer = ResultsWriter(root, suite="nightly", run_id=run_id, trigger="nightly",
                               date=when.date())
        writer.append(rows)
        if latest:
            fault = dict(op="all_reduce_norm", variant="fused/watchdog", backend="gpu",
                         placement="process-per-gpu", transport="multicast", tp=8, hidden=7168,
                         tokens=32, dtype="bfloat16", job="faults", **env)
            clock += dt.timedelta(seconds=2)
            faults = [
                dict(fault, started_at=clock, outcome="hang", fault_kind="kill_rank",
                     fault_expected="hang-detected", fault_seen="hang-detected",
                     missing_ranks=[3], fault_token=5, fault_fragment=2, fault_stage=1,
                     diagnosis="rank 3 never published generation 1 " + INJECT,
                     reason="watchdog fired after 1000000 ns",
                     repro_command="python -m jobs faults --kind kill_rank --tp 8"),
                dict(fault, started_at=clock + dt.timedelta(seconds=3), outcome="pass",
                     fault_kind="corrupt_flag", fault_expected="detected",
                     fault_seen="detected", diagnosis="flag mismatch caught at token 0"),
            ]
            ResultsWriter(root, suite="faults", run_id=run_id, trigger="nightly",
                          date=when.date()).append(faults)
            runs.begin(root, run_id, trigger="nightly")
            for entry in ACCOUNTING:
                runs.add_accounting(root, run_id, entry)
            runs.finish(root, run_id)
    return run_ids


ACCOUNTING = [  # the latest run's manifest: a run in two parts, correctness in both
    {"job": "correctness", "wall_s": 168.0, "cases": 576, "work_s": 12.55, "overhead": 13.39,
     "work": "summed kernel call time", "peak_groups": 2,
     "phases_s": {"inputs": 21.4, "load": 3.02, "call": 14.1, "readback": 6.0, "check": 40.25}},
    {"job": "faults", "wall_s": 271.1, "cases": 180, "work_s": 26.6, "overhead": 10.19,
     "work": "summed kernel call time", "peak_groups": 2, "rebuilt_cases": 18,
     "rebuilt_s": 204.6, "build_s": 96.3, "prepare_s": 41.5},
    {"job": "correctness", "wall_s": 104.6, "cases": 71, "work_s": 13.2, "overhead": 7.92,
     "work": "summed kernel call time", "peak_groups": 2},
    {"job": "profile", "wall_s": 90.6, "cases": 8, "work_s": 49.9, "overhead": 1.82,
     "work": "timed CUDA-graph replays", "peak_groups": None, "interrupted": True},
]
