"""The host cost of one rank's correctness check (``cluster.cases.check_outputs``
on outputs that pass: the reference and the comparison), per op at tp = 2,
M = 64, median of 5 seeds; the ``check`` phase of a correctness row
(``extra.phases_s``) is this on the rank's host.

    PYTHONPATH=. .venv/bin/python scripts/check_cost.py [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from cluster import ops
from cluster.cases import bits_from_bf16, case_inputs, check_outputs, make_case

CASES = [("all_reduce_norm", {}, 7168), ("finalize_publish", {"top_k": 6}, 7168),
         ("all_reduce_mhc", {"hc": 4}, 4096), ("embed_norm", {}, 7168)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tp, m = 2, 64
    print("| op | hidden | check_outputs, median of 5 (ms) |\n| --- | --- | --- |")
    for op, fields, hidden in CASES:
        seconds = []
        for seed in range(4, 9):
            case = make_case(capacity=m, tokens=m, op=op, inputs="random", seed=seed,
                             budget_ns=10**9, **fields)
            expected = ops.get(op).module().expected(
                case, case_inputs(case, tp=tp, hidden=hidden), tp=tp, facts={"rank": 0})
            outputs = {name: bits_from_bf16(ref) for name, (ref, _) in expected.items()}
            inputs = case_inputs(case, tp=tp, hidden=hidden)  # fresh: no reference cached
            t0 = time.perf_counter()
            report = check_outputs(case, tp=tp, hidden=hidden, outputs=outputs, rank=0,
                                   inputs=inputs)
            seconds.append(time.perf_counter() - t0)
            assert report["ok"], report
        print(f"| {op} | {hidden} | {statistics.median(seconds) * 1e3:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
