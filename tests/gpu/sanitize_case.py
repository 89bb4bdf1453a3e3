"""A small tp=2 virtual-rank AllReduceNorm run for compute-sanitizer:

    CUDA_DEVICE_MAX_CONNECTIONS=32 timeout 300 compute-sanitizer --tool memcheck \
        python tests/gpu/sanitize_case.py

Exits 0 when the results match the reference and the mailbox is clean.
``BUDGET_NS`` (env, default 0: the plain consumer) compiles the watchdog
consumer with that budget (it was ``WATCHDOG_NS`` before the budget had
one name).
The consumers wait on every publish event, so the run does not depend on
kernels of different streams running concurrently (sanitizers serialize).
"""

import os
import sys

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import torch  # noqa: E402

from kernels.all_reduce_norm import AllReduceNorm  # noqa: E402
from kernels.reference.allreduce import all_reduce_norm  # noqa: E402
from kernels.reference.numerics import (assert_bit_exact, assert_within_ulp,  # noqa: E402
                                        random_partials)


def main() -> int:
    tp, hidden, eps = 2, 2560, 1e-6
    grp = AllReduceNorm.virtual_ranks(tp=tp, hidden_size=hidden, max_num_tokens=8, eps=eps,
                                      budget_ns=int(os.environ.get("BUDGET_NS", "0")))
    weight = torch.ones(hidden, dtype=torch.bfloat16, device="cuda")
    for call, m in enumerate((3, 8, 1, 5)):
        xs = list(random_partials(tp, m, hidden, seed=call, device="cuda"))
        residual = torch.randn(m, hidden, device="cuda").to(torch.bfloat16)
        outs = grp([x.contiguous() for x in xs], [residual.clone() for _ in range(tp)], weight)
        torch.cuda.synchronize()
        ref_norm, ref_res = all_reduce_norm(xs, residual, weight, eps)
        for norm_out, res_out in outs:
            assert_bit_exact(res_out, ref_res, f"call {call} residual_out")
            assert_within_ulp(norm_out, ref_norm, 1, f"call {call} norm_out")
    assert grp.is_all_sentinel() and grp.diagnose().ok
    print("sanitize_case: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
