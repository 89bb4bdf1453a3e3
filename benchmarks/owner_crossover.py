"""Benchmark: owner mode (reduce-scatter + RMSNorm) vs one-shot (all-reduce +
RMSNorm) on a process-per-GPU TP group over NVLink, in one run.

    python -m benchmarks.owner_crossover [--tp 2] [--tokens 1,2,4,...,512]
        [--hidden 5120,7168] [--calls 50] [--replays 100] [--markdown PATH]

Spawns ``--tp`` processes, one per GPU (NCCL + torch symmetric memory
mailboxes). Per hidden size and token count M, each rank builds both
``AllReduceNorm(mode="one_shot")`` and ``AllReduceNorm(mode="owner")`` (the
plain consumer, as production runs it) on the same group and times each with
the harness the profile job uses (:mod:`cluster.measure`): one CUDA graph of
back-to-back calls over rotating input sets spanning ``--rotate-mb`` per
rank, ``--replays`` replays each started after the group's barrier, and per
replay the max over ranks (:func:`cluster.measure.stats.max_over_ranks`);
reported: median, p10 and p90 of those maxima in microseconds per call.

The two modes do different work by design: one-shot leaves every token's
rows on every rank (each rank stores every token tp times), owner mode leaves
each rank its ``ceil(M / tp)`` owned rows (each token stored once). Before
timing, every rank checks both modes' first call against the references
(watchdog consumers, so a broken kernel is a diagnosed error, not a hang).
The summary gives, per hidden size, the smallest M from which owner mode is
faster at every larger M measured, and its speedup (one_shot / owner) at
M = 256 and 512. Virtual ranks would not measure this (their peer stores
land in one GPU's L2); this needs ``--tp`` GPUs.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import tempfile

from cluster.measure.stats import median_p10_p90

DEFAULT_TOKENS = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512)
MODES = ("one_shot", "owner")


def _parse(argv):
    from benchmarks import int_list

    p = argparse.ArgumentParser(prog="python -m benchmarks.owner_crossover")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--tokens", type=int_list, default=list(DEFAULT_TOKENS))
    p.add_argument("--hidden", type=int_list, default=[5120, 7168])
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--replays", type=int, default=100)
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--rotate-mb", type=float, default=120.0)
    p.add_argument("--check-budget-ns", type=int, default=500_000_000,
                   help="budget of the watchdog consumers of the correctness check")
    p.add_argument("--markdown", default=None, help="also write the table here")
    return p.parse_args(argv)


def _check(op_wd, rank, tp, m, hidden, eps, device) -> None:
    """One call of a watchdog instance against the reference (every rank's
    partial all-gathered); raises AssertionError naming what differs."""
    import torch
    import torch.distributed as dist

    from kernels.reference.allreduce import (all_reduce_norm, owner_all_reduce_norm,
                                             owner_view)
    from kernels.reference.numerics import assert_bit_exact, assert_within_ulp

    g = torch.Generator().manual_seed(1000 + m)
    xs = torch.randn(tp, m, hidden, generator=g).to(torch.bfloat16).to(device)
    residual = torch.randn(m, hidden, generator=g).to(torch.bfloat16).to(device)
    weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(torch.bfloat16).to(device)
    own = owner_view(residual, tp, rank).contiguous() if op_wd.mode == "owner" else residual
    out = op_wd(xs[rank].contiguous(), own, weight)
    torch.cuda.synchronize(device)
    op_wd.check()  # collective: LamportTimeout with the group diagnosis
    if op_wd.mode == "owner":
        ref_norm, ref_res = owner_all_reduce_norm(xs, own, weight, eps, owner=rank)
    else:
        ref_norm, ref_res = all_reduce_norm(xs, residual, weight, eps)
    what = f"rank {rank} {op_wd.mode} hidden={hidden} M={m}"
    assert_bit_exact(out[1], ref_res, f"{what} residual_out")
    assert_within_ulp(out[0], ref_norm, 1, f"{what} norm_out")
    dist.barrier(device_ids=[device.index])


def _rank(rank: int, args, port: int, result_path: str) -> None:
    import torch
    import torch.distributed as dist

    from cluster.measure.graph import graph_calls, rotating, rotation_sets, time_graph
    from cluster.measure.stats import max_over_ranks
    from cluster.measure.workload import RankContext
    from kernels.all_reduce_norm import AllReduceNorm
    from kernels.lamport.protocol import owner_rows

    tp = args.tp
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=rank, world_size=tp, device_id=device)
    group = dist.group.WORLD

    cap = max(args.tokens)
    barrier = RankContext(rank=rank, tp=tp, device=device, capacity=cap, dist=True).barrier
    rows = []
    for hidden in args.hidden:
        ops = {mode: AllReduceNorm(hidden_size=hidden, max_num_tokens=cap, eps=args.eps,
                                   group=group, mode=mode) for mode in MODES}
        for mode in MODES:
            wd = AllReduceNorm(hidden_size=hidden, max_num_tokens=cap, eps=args.eps, group=group,
                               mode=mode, budget_ns=args.check_budget_ns)
            for m in sorted({1, tp + 1, cap}):
                _check(wd, rank, tp, m, hidden, args.eps, device)
        for m in args.tokens:
            g = torch.Generator().manual_seed(m * 7919 + rank)
            sets = rotation_sets(args.rotate_mb, 4 * m * hidden * 2)
            calls = graph_calls(args.calls, sets)
            xs = torch.randn(sets, m, hidden, generator=g).to(torch.bfloat16).to(device)
            weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(torch.bfloat16).to(device)
            result = {"hidden": hidden, "m": m, "sets": sets, "calls": calls}
            for mode in MODES:
                op = ops[mode]
                r = owner_rows(m, tp) if mode == "owner" else m
                residuals = torch.randn(sets, r, hidden, generator=g).to(torch.bfloat16)
                residuals = residuals.to(device)
                outs = torch.empty(2, sets, r, hidden, dtype=torch.bfloat16, device=device)

                def call(i, op=op, residuals=residuals, outs=outs):
                    op(xs[i], residuals[i], weight, out=(outs[0, i], outs[1, i]))
                barrier()
                times = time_graph(rotating(call, sets), calls, args.replays,
                                   before_replay=barrier)
                every = [None] * tp
                dist.all_gather_object(every, times, group=group)
                result[mode] = max_over_ranks(every)
                assert op.mailbox.is_all_sentinel(), f"rank {rank} {mode} M={m}: not sentinel"
                del residuals, outs
            rows.append(result)
            if rank == 0:
                print(_format_row(result), flush=True)
    if rank == 0:
        import json
        with open(result_path, "w") as f:
            json.dump(rows, f)
    dist.barrier(device_ids=[device.index])
    dist.destroy_process_group()


HEADER = (f"{'hidden':>6} {'M':>4} {'one_shot_us':>11} {'p10':>7} {'p90':>7} "
          f"{'owner_us':>9} {'p10':>7} {'p90':>7} {'speedup':>7} {'calls':>5}")


def _format_row(r) -> str:
    a, b = median_p10_p90(r["one_shot"]), median_p10_p90(r["owner"])
    return (f"{r['hidden']:>6} {r['m']:>4} {a[0]:>11.2f} {a[1]:>7.2f} {a[2]:>7.2f} "
            f"{b[0]:>9.2f} {b[1]:>7.2f} {b[2]:>7.2f} {a[0] / b[0]:>7.2f} {r['calls']:>5}")


def summarize(rows) -> list[str]:
    """Per hidden: the crossover (smallest measured M from which owner mode's
    median is below one-shot's at every larger measured M) and the speedups
    at M = 256 and 512 (where measured)."""
    out = []
    for hidden in sorted({r["hidden"] for r in rows}):
        mine = sorted((r for r in rows if r["hidden"] == hidden), key=lambda r: r["m"])
        speed = {r["m"]: median_p10_p90(r["one_shot"])[0] / median_p10_p90(r["owner"])[0]
                 for r in mine}
        crossover = None
        for r in reversed(mine):
            if speed[r["m"]] <= 1.0:
                break
            crossover = r["m"]
        at = ", ".join(f"M={m}: {speed[m]:.2f}x" for m in (256, 512) if m in speed)
        out.append(f"hidden {hidden}: owner mode faster from M={crossover} on"
                   if crossover is not None else
                   f"hidden {hidden}: owner mode not faster at the largest M measured")
        out[-1] += f" (speedup one_shot/owner {at})" if at else ""
    return out


def main(argv=None) -> int:
    args = _parse(argv)
    import torch

    if torch.cuda.device_count() < args.tp:
        print(f"owner_crossover: needs {args.tp} GPUs (process per GPU), found "
              f"{torch.cuda.device_count()}", file=sys.stderr)
        return 2
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(HEADER)
    print("-" * len(HEADER), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rows.json")
        mp.start_processes(_rank, args=(args, port, path), nprocs=args.tp, join=True,
                           start_method="spawn")
        import json
        with open(path) as f:
            rows = json.load(f)
    summary = summarize(rows)
    meta = (f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}, "
            f"{args.tp} x {torch.cuda.get_device_name()}, process per GPU, torch "
            f"{torch.__version__}; graph replay, calls/graph = max({args.calls}, input sets), "
            f"replays={args.replays}, inputs rotated over >= {args.rotate_mb:g} MB per rank, "
            f"per-replay max over ranks; plain consumers")
    print("-" * len(HEADER))
    for line in summary:
        print(line)
    print(meta)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("```\n" + "\n".join([HEADER, "-" * len(HEADER)]
                                        + [_format_row(r) for r in rows]) + "\n```\n\n"
                    + "\n".join(f"- {s}" for s in summary) + f"\n\n{meta}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
