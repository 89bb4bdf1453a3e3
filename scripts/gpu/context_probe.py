"""How many CUDA contexts one GPU takes at once, per CUDA_DEVICE_MAX_CONNECTIONS.

Starts N processes at once for each connection count; each creates its
context on GPU 0, makes ``--streams`` streams, launches a kernel on each and
holds the context while the others start. Prints, per count, how many
contexts came up and the device's used memory with all of them alive.
Defect 1 of docs/results/nightly_h200_2026-12-01.md (two of sixteen pool
workers failed in ``torch.cuda.set_device`` with "out of memory")::

    python3 scripts/gpu/context_probe.py --connections 32,16,8 --processes 16

Exit 0 when every context came up at every count, 1 otherwise.
"""

from __future__ import annotations

import argparse
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
    args = ap.parse_args(argv)
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
