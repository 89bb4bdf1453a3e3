#!/usr/bin/env bash
# The indexer on one H200 in one device call (under 9 min): the indexer GPU tests
# (every fused variant of FUSED_CANDIDATES against the projection kernel, bit
# for bit, and the no-exchange timing probes), the benchmark's fused variants
# with the roofline columns (K 7168/4096, heads 64/32, TOKENS), Nsight
# Compute on the fused kernel at tokens 1 and 16 and, on request, the spread
# probe's shapes and the same variants with their weights in L2. From the
# repo root, after `source /tmp/site/env.sh && export PYTHONPATH=.:$PYTHONPATH`:
#
#   OUT=/tmp/out timeout -s KILL 580 bash scripts/gpu/indexer_gpu_run.sh
#
# Knobs (environment):
#   TOKENS=1,2,4,8,16   the benchmark's token counts
#   VARIANTS=a,b        time these fused candidates / timing probes beside the
#                       table's (benchmarks.indexer --variants; ncu profiles them
#                       too) instead of the whole sweep with the projection tactics
#   SHAPES=a,b          also run benchmarks.indexer_spread --pad-kb 120 --shapes a,b
#   L2=1                also time the variants at K 7168, heads 64, M 1 with the
#                       weights in L2 (--rotate-mb 1)
#
# Writes $OUT/tests.txt, $OUT/bench.txt (rows as each case ends), and where
# asked $OUT/spread_probe.txt and $OUT/bench_l2.txt, and $OUT/ncu_summary.txt;
# prints each step's rc, the test summary and the benchmark's table.
set -u
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
TOKENS=${TOKENS:-1,2,4,8,16}
if [ -n "${VARIANTS:-}" ]; then pick=(--variants "$VARIANTS"); else pick=(--sweep --sweep-tokens 1,16); fi
echo "== tests $(date -u +%H:%M:%S)"
timeout -s KILL 150 "$PY" -m pytest -m gpu tests/gpu/test_indexer_gpu.py -q -rfE -p no:warnings \
    -n 4 > "$OUT/tests.txt" 2>&1
echo "tests rc=$?" | tee -a "$OUT/tests.txt"
tail -n 15 "$OUT/tests.txt"
echo "== bench $(date -u +%H:%M:%S)"
timeout -s KILL 190 "$PY" -m benchmarks.indexer --k 7168,4096 --heads 64,32 --tokens "$TOKENS" \
    --replays 20 --no-stock "${pick[@]}" 2>&1 | tee "$OUT/bench.txt"
echo "bench rc=${PIPESTATUS[0]}"
if [ -n "${L2:-}" ]; then
  echo "== bench, weights in L2 $(date -u +%H:%M:%S)"
  timeout -s KILL 60 "$PY" -m benchmarks.indexer --k 7168 --heads 64 --tokens 1 --replays 20 \
      --no-stock --rotate-mb 1 "${pick[@]}" > "$OUT/bench_l2.txt" 2>&1
  echo "bench_l2 rc=$?"
fi
if [ -n "${SHAPES:-}" ]; then
  echo "== spread probe $(date -u +%H:%M:%S)"
  timeout -s KILL 60 "$PY" -m benchmarks.indexer_spread --replays 20 --pad-kb 120 \
      --shapes "$SHAPES" > "$OUT/spread_probe.txt" 2>&1
  echo "spread_probe rc=$?"
fi
echo "== ncu $(date -u +%H:%M:%S)"
OUT="$OUT" VARIANTS="${VARIANTS:-}" timeout -s KILL 120 bash scripts/gpu/indexer_ncu.sh > "$OUT/ncu_run.txt" 2>&1
echo "ncu rc=$? $(date -u +%H:%M:%S)"
