#!/usr/bin/env bash
# One command for the H200 machine (from the repo root, after the wheels and,
# for the flashinfer rows, scripts/stage-flashinfer's chunks were received):
#   bash scripts/gpu/profile.sh [python -m jobs profile filters...]
# runs `python -m jobs profile --suite nightly --backend gpu` with the given
# filters into /tmp/results, prints the latency table (ours beside every
# baseline) and leaves under $OUT: results.tgz, latency.md and, when
# FlashInfer JIT-built its module, flashinfer-jit.tgz (carry it back in as
# .dev/fi-jit/flashinfer-jit.tgz). Example, issue 21's table:
#   bash scripts/gpu/profile.sh --ops all_reduce_norm --tp 2 --hidden 5120,7168 --tokens 1,8,16,64
set -uo pipefail
source "$(dirname "$0")/env.sh"
timeout 560 python3 -m jobs profile --suite nightly --backend gpu --results /tmp/results \
  --trigger adhoc "$@" > "$out/profile.log" 2>&1
rc=$?
tail -n 40 "$out/profile.log"
python3 scripts/gpu/latency_table.py /tmp/results --markdown "$out/latency.md"
tar czf "$out/results.tgz" -C /tmp results
[[ -d /tmp/flashinfer ]] && tar czf "$out/flashinfer-jit.tgz" -C /tmp flashinfer
echo "profile exit $rc"
exit $rc
