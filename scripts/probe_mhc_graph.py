"""Probe: AllReduceMHC virtual ranks (tp=2, hidden 5120, hc 4), many calls
captured in one CUDA graph, per tuning and M, on the watchdog build (a
stalled consumer gives up after --budget-ns and is reported, no hang).

    python scripts/probe_mhc_graph.py --tuning 5,256,2 --tokens 1,16 --calls 64,1117

Prints per (tuning, M, calls): eager us/call, graph us/call, diagnosis.
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks import int_list


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tuning", action="append", required=True, help="cluster,threads,lanes")
    p.add_argument("--tokens", type=int_list, default=[1, 16])
    p.add_argument("--calls", type=int_list, default=[64, 1117])
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--budget-ns", type=int, default=5_000_000)
    p.add_argument("--rotate", type=int, default=1, help="distinct input sets")
    a = p.parse_args()
    from kernels.all_reduce_mhc import AllReduceMHC, MHCTuning
    tp, hidden, hc, eps = a.tp, 5120, 4, 1e-6
    for spec in a.tuning:
        c, t, r = (int(v) for v in spec.split(","))
        grp = AllReduceMHC.virtual_ranks(tp=tp, hidden_size=hidden, hc_mult=hc,
                                         max_num_tokens=max(a.tokens),
                                         budget_ns=a.budget_ns,
                                         tuning=MHCTuning(c, t, r))
        for m in a.tokens:
            g = torch.Generator(device="cuda").manual_seed(m)
            n = a.rotate
            xs = [torch.randn(n, m, hidden, generator=g, device="cuda").to(torch.bfloat16)
                  for _ in range(tp)]
            res = torch.randn(n, m, hc, hidden, generator=g, device="cuda").to(torch.bfloat16)
            post = 2 * torch.rand(n, m, hc, generator=g, device="cuda")
            comb = torch.rand(n, m, hc, hc, generator=g, device="cuda") / hc
            pre = torch.rand(n, m, hc, generator=g, device="cuda")
            w = torch.ones(hidden, dtype=torch.bfloat16, device="cuda")
            outs = [(torch.empty(n, m, hc, hidden, dtype=torch.bfloat16, device="cuda"),
                     torch.empty(n, m, hidden, dtype=torch.bfloat16, device="cuda"))
                    for _ in range(tp)]

            def call(i):
                i %= n
                grp([x[i] for x in xs], res[i], post[i], comb[i], pre[i], w, eps,
                    outs=[(o[0][i], o[1][i]) for o in outs])

            grp.recover()
            call(0)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(200):
                call(i)
            torch.cuda.synchronize()
            eager = (time.perf_counter() - t0) / 200 * 1e6
            d = grp.diagnose()
            print(f"{spec} M={m} eager {eager:.1f} us/call ok={d.ok} {'' if d.ok else d.summary()[:200]}",
                  flush=True)
            for calls in a.calls:
                grp.recover()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for i in range(calls):
                        call(i)
                for rep in range(3):
                    t0 = time.perf_counter()
                    graph.replay()
                    torch.cuda.synchronize()
                    dt = (time.perf_counter() - t0) / calls * 1e6
                    d = grp.diagnose()
                    print(f"{spec} M={m} graph calls={calls} replay {rep}: {dt:.1f} us/call "
                          f"ok={d.ok} {'' if d.ok else d.summary()[:300]}", flush=True)
                del graph


if __name__ == "__main__":
    main()
