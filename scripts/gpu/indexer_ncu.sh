#!/usr/bin/env bash
# Nsight Compute on the indexer kernels: the fused kernel (the tactic table's
# candidate and the other one, see benchmarks.indexer FUSED_CANDIDATES) and
# the projection kernel at a no-split and a split-K tactic, at TOKENS (default
# 1 and 16), K 7168, heads 64. Sections: SpeedOfLight + MemoryWorkloadAnalysis
# (achieved DRAM bandwidth) + MemoryWorkloadAnalysis_Tables (L1 requests,
# sectors and shared wavefronts of the loads: a split-K CTA's warps load the
# same x, a spread CTA's warp loads carry 2-3 live rows of 8), LaunchStats +
# Occupancy (CTAs, clusters, waves
# against the SMs), WarpStateStats + SchedulerStats (stall reasons; the
# split-K tail shows as barrier stalls of the split builds). Caches are
# flushed before every profiled pass (--cache-control all: cold weights, as in
# the benchmark's rotation); clocks are left alone (--clock-control none).
# ncu serializes kernels, so the PDL overlap with a preceding kernel is not
# in these numbers (the benchmark's graph replay has it).
#
#   OUT=/tmp/x bash scripts/gpu/indexer_ncu.sh      (on the GPU machine, repo root,
#   after `source /tmp/site/env.sh && export PYTHONPATH=.:$PYTHONPATH`)
#
# Writes $OUT/ncu_summary.txt (one block per profiled launch); the full
# report stays in ${NCU_WORK:-/tmp/indexer_ncu}.
set -euo pipefail
OUT=${OUT:?set OUT to the folder for ncu_summary.txt}
WORK=${NCU_WORK:-/tmp/indexer_ncu}
TOKENS=${TOKENS:-1,16}
K=${K:-7168}
HEADS=${HEADS:-64}
PY=${PYTHON:-python3}
# VARIANTS=a,b: only these fused candidates beside the table's (benchmarks.indexer --variants).
VARIANTS=${VARIANTS:+--variants $VARIANTS}
mkdir -p "$OUT" "$WORK"
ncu --clock-control none --cache-control all \
    --kernel-name regex:kernelsindexerkernel \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
    --section LaunchStats \
    --section Occupancy --section WarpStateStats --section SchedulerStats \
    --metrics dram__bytes_read.sum,dram__bytes_read.sum.per_second \
    -f -o "$WORK/report" \
    "$PY" -m benchmarks.indexer --ncu-calls 1 --k "$K" --heads "$HEADS" --tokens "$TOKENS" \
    --ncu-proj 16x1,4x8 $VARIANTS > "$WORK/launches.txt" 2> "$WORK/ncu_stderr.txt" || {
        echo "ncu failed; its stderr:"; tail -n 30 "$WORK/ncu_stderr.txt"; tail -n 30 "$WORK/launches.txt"; exit 1; }
ncu -i "$WORK/report.ncu-rep" --csv --page details > "$WORK/details.csv"
ncu -i "$WORK/report.ncu-rep" --csv --page raw > "$WORK/raw.csv"
"$PY" scripts/gpu/ncu_summary.py "$WORK/launches.txt" "$WORK/details.csv" \
    "$WORK/raw.csv" > "$OUT/ncu_summary.txt"
cat "$OUT/ncu_summary.txt"
