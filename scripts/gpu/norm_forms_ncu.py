"""The program Nsight Compute runs for the AllReduceNorm forms at tp=1: one
call of each form (two kernels: publish then consumer; the single kernel
with each stage agreement: the arrival counter, the cluster barrier at M
2..16, none) per (hidden, M), inside ``cudaProfilerStart/Stop``, after warm-up calls that
compile and load. At tp=1 no kernel waits for a peer, so ncu's
serialization and replays see each kernel's own cost.

    ncu --target-processes application-only --profile-from-start off \\
        --cache-control all --clock-control none \\
        --metrics gpu__time_duration.sum,sm__cycles_active.avg,launch__grid_size \\
        python3 scripts/gpu/norm_forms_ncu.py [--tokens 1,16,64] [--hidden 5120,7168]

Prints ``ncu launch: FORM hidden=H M=M xN`` before each profiled call (N
its kernels, in launch order) and exits non-zero when an output differs
from the reference.
"""

from __future__ import annotations

import argparse
import sys

import torch


def main(argv=None) -> int:
    from benchmarks import int_list
    from kernels.lamport.all_reduce_norm import AllReduceNorm
    from kernels.lamport.norm_tuning import CLUSTER_MAX_TOKENS, FORMS, forced
    from kernels.reference.allreduce import all_reduce_norm
    from kernels.reference.numerics import assert_bit_exact, assert_within_ulp

    p = argparse.ArgumentParser(prog="python3 scripts/gpu/norm_forms_ncu.py")
    p.add_argument("--tokens", type=int_list, default=[1, 16, 64])
    p.add_argument("--hidden", type=int_list, default=[5120, 7168])
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args(argv)
    eps = 1e-6
    for hidden in args.hidden:
        for m in args.tokens:
            g = torch.Generator().manual_seed(m)
            x = torch.randn(m, hidden, generator=g).to(torch.bfloat16).cuda()
            residual = torch.randn(m, hidden, generator=g).to(torch.bfloat16).cuda()
            weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(torch.bfloat16).cuda()
            ref_norm, ref_res = all_reduce_norm([x], residual, weight, eps)
            for form in [f for f in FORMS if f != "auto" and
                         (f != "single+cluster" or 2 <= m <= CLUSTER_MAX_TOKENS)]:
                op = AllReduceNorm(hidden_size=hidden, max_num_tokens=64, eps=eps,
                                   norm_tuning=forced(form))
                out = (torch.empty_like(residual), torch.empty_like(residual))
                for _ in range(args.warmup):
                    op(x, residual, weight, out=out)
                torch.cuda.synchronize()
                assert_bit_exact(out[1], ref_res, f"{form} residual_out")
                assert_within_ulp(out[0], ref_norm, 1, f"{form} norm_out")
                print(f"ncu launch: {form} hidden={hidden} M={m} "
                      f"x{1 if op.form(x) == 'single' else 2}", flush=True)
                torch.cuda.cudart().cudaProfilerStart()
                op(x, residual, weight, out=out)
                torch.cuda.synchronize()
                torch.cuda.cudart().cudaProfilerStop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
