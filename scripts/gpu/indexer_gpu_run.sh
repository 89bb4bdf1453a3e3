#!/usr/bin/env bash
# Issue 19 in one H200 run (< 6 min): the indexer GPU tests (every fused
# variant of FUSED_CANDIDATES against the projection kernel, bit for bit),
# the benchmark's fused-variant and projection-tactic sweep with the roofline
# columns (tokens 1-16, K 7168/4096, heads 64/32), and Nsight Compute on the
# fused kernel at tokens 1 and 16. From the repo root, after
# `source /tmp/site/env.sh && export PYTHONPATH=.:$PYTHONPATH`:
#
#   OUT=/tmp/out timeout 400 bash scripts/gpu/indexer_gpu_run.sh
#
# Writes $OUT/tests.txt, $OUT/bench.txt (rows as each case ends) and
# $OUT/ncu_summary.txt; prints the test summary, the table and the ncu summary.
set -u
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
echo "== tests $(date -u +%H:%M:%S)"
timeout 110 "$PY" -m pytest -m gpu tests/gpu/test_indexer_gpu.py -q -rfE -p no:warnings \
    -n 4 > "$OUT/tests.txt" 2>&1
echo "tests rc=$?" | tee -a "$OUT/tests.txt"
tail -n 15 "$OUT/tests.txt"
echo "== bench $(date -u +%H:%M:%S)"
timeout 190 "$PY" -m benchmarks.indexer --k 7168,4096 --heads 64,32 --tokens 1,2,4,8,16 \
    --replays 20 --no-stock --sweep --sweep-tokens 1,16 2>&1 | tee "$OUT/bench.txt"
echo "bench rc=${PIPESTATUS[0]}"
echo "== ncu $(date -u +%H:%M:%S)"
OUT="$OUT" timeout 80 bash scripts/gpu/indexer_ncu.sh
echo "ncu rc=$? $(date -u +%H:%M:%S)"
