#!/usr/bin/env bash
# Issue 18's GPU check (2 H200s, < 4 min): `python -m jobs trace` of a tp=2
# process-per-GPU all_reduce_norm group (smoke suite, hidden 1024, M 1/3/8/2,
# random inputs, 2 calls each), then the merged trace's rank tracks and
# kernel events per rank, then the multigpu test doing the same check. From
# the repo root, after `source /tmp/site/env.sh && export PYTHONPATH=.:$PYTHONPATH`:
#
#   OUT=/tmp/out timeout 500 bash scripts/gpu/trace_tp2.sh
#
# Writes $OUT/trace_tp2.json (open in https://ui.perfetto.dev), $OUT/trace.txt
# (the job's output) and $OUT/check.txt (tracks, kernels per rank, the test).
set -u
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
timeout 300 "$PY" -m jobs trace --suite smoke --backend gpu --ops all_reduce_norm --tp 2 \
    --hidden 1024 --inputs random --placement process-per-gpu --results /tmp/trace-results \
    --trace-out "$OUT/trace_tp2.json" > "$OUT/trace.txt" 2>&1
echo "trace rc=$?" | tee -a "$OUT/trace.txt"
tail -n 12 "$OUT/trace.txt"
"$PY" - "$OUT/trace_tp2.json" <<'PY' 2>&1 | tee "$OUT/check.txt"
import json, sys
from cluster.tracing import summary
s = summary(json.load(open(sys.argv[1])))
print(f"rank tracks: {len(s['tracks'])}")
for label, c in s["per_rank"].items():
    print(f"{label}: {c['kernels']} kernel events, {c['calls']} lamport.call ranges, "
          f"{c['events']} events")
PY
timeout 150 "$PY" -m pytest -m multigpu tests/gpu/test_trace_gpu.py -q -rfE -p no:warnings \
    2>&1 | tail -n 5 | tee -a "$OUT/check.txt"
