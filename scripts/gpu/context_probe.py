"""How many CUDA contexts one GPU takes at once, per CUDA_DEVICE_MAX_CONNECTIONS.

Starts N processes at once for each connection count; each creates its
context on GPU 0, makes ``--streams`` streams, launches a kernel on each and
holds the context while the others start. Prints, per count, how many
contexts came up and the device's used memory with all of them alive.
Defect 1 of docs/results/nightly_h200_2026-12-01.md (two of sixteen pool
workers failed in ``torch.cuda.set_device`` with "out of memory")::

    python3 scripts/gpu/context_probe.py --connections 32,16,8 --processes 16

With ``--turns`` it compares instead N processes making their contexts at
once against making them in turn (``cluster.procs.one_at_a_time``, as a
pooled worker's warm-up does): when the first, the median and the last
were ready after their start, and the median context's own time::

    python3 scripts/gpu/context_probe.py --turns --processes 16

Exit 0 when every context came up at every count, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CHILD = r"""
import sys, time, torch
try:
    torch.cuda.set_device(0)
    streams = [torch.cuda.Stream() for _ in range(int(sys.argv[1]))]
    x = torch.ones(1024, device="cuda")
    for s in streams:
        with torch.cuda.stream(s):
            x.add_(1)
    torch.cuda.synchronize()
    print("ok", flush=True)
except Exception as err:
    print("FAIL", type(err).__name__, str(err).splitlines()[0], flush=True)
    sys.exit(1)
time.sleep(600)
"""


CHILD_TURNS = r"""
import json, sys, time
import torch
from cluster.procs import one_at_a_time
turns = sys.argv[1] == "1"
with (one_at_a_time("context-probe", timeout_s=60) if turns else __import__("contextlib").nullcontext()):
    t0 = time.time()
    torch.cuda.set_device(0)
    torch.cuda.synchronize()
    t1 = time.time()
print(json.dumps({"ready": t1, "ctx_s": t1 - t0}), flush=True)
time.sleep(600)
"""


def turns(processes: int) -> bool:
    """``processes`` contexts at once, then in turn; a line each."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    all_ok = True
    for mode in ("0", "1"):
        start = time.time()
        procs = [subprocess.Popen([sys.executable, "-c", CHILD_TURNS, mode], env=env,
                                  stdout=subprocess.PIPE, text=True) for _ in range(processes)]
        try:
            rows = []
            for p in procs:
                line = p.stdout.readline().strip()
                if line.startswith("{"):
                    rows.append(json.loads(line))
        finally:
            for p in procs:
                p.kill()
            for p in procs:
                p.wait()
        all_ok &= len(rows) == processes
        if rows:
            ready = sorted(r["ready"] - start for r in rows)
            ctx = sorted(r["ctx_s"] for r in rows)
            print(f"{'in turn' if mode == '1' else 'at once'}: {len(rows)} of {processes} contexts; "
                  f"ready after the start: first {ready[0]:.1f} s, median {ready[len(ready) // 2]:.1f} s, "
                  f"last {ready[-1]:.1f} s; a context's own time, median {ctx[len(ctx) // 2]:.2f} s, "
                  f"largest {ctx[-1]:.2f} s", flush=True)
        time.sleep(2)
    return all_ok


def used_mib() -> str:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", default="32,16,8",
                    help="CUDA_DEVICE_MAX_CONNECTIONS values, comma-separated (default %(default)s)")
    ap.add_argument("--processes", type=positive, default=16, help="contexts at once (default %(default)s)")
    ap.add_argument("--streams", type=positive, default=8, help="streams a context (default %(default)s)")
    ap.add_argument("--turns", action="store_true",
                    help="contexts at once against in turn (one_at_a_time), instead of --connections")
    args = ap.parse_args(argv)
    if args.turns:
        return 0 if turns(args.processes) else 1
    counts = [c.strip() for c in args.connections.split(",") if c.strip()]
    bad = [c for c in counts if not c.isdigit() or not 1 <= int(c) <= 32]
    if bad or not counts:
        ap.error(f"--connections must be whole numbers in 1..32, got {args.connections!r}")
    all_ok = True
    for conn in counts:
        env = {**os.environ, "CUDA_DEVICE_MAX_CONNECTIONS": conn}
        procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(args.streams)], env=env,
                                  stdout=subprocess.PIPE, text=True) for _ in range(args.processes)]
        try:
            lines = [p.stdout.readline().strip() for p in procs]
            ok = sum(line.startswith("ok") for line in lines)
            fails = sorted({line for line in lines if not line.startswith("ok")})
            print(f"CUDA_DEVICE_MAX_CONNECTIONS={conn}: {ok} of {args.processes} contexts up, "
                  f"device memory used {used_mib()}" + (f"; {fails[:2]}" if fails else ""), flush=True)
            all_ok &= ok == args.processes
        finally:
            for p in procs:
                p.kill()
            for p in procs:
                p.wait()
        time.sleep(2)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
