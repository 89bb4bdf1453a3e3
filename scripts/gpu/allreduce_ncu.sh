#!/usr/bin/env bash
# Nsight Compute on the fused all-reduce + residual add + RMSNorm at tp=2 over
# NVLink (two GPUs, process per GPU): ours (watchdog and plain builds) and
# FlashInfer's one-shot trtllm_allreduce_fusion, rank 0 profiled with its
# peer's publish already landed (scripts/gpu/allreduce_ncu.py says why).
# Two ncu passes over the same program:
#   1. duration and DRAM bytes only (one counter pass: no kernel replay), for
#      TOKENS x HIDDEN;
#   2. the sections (SpeedOfLight, MemoryWorkloadAnalysis, LaunchStats,
#      Occupancy, WarpStateStats, SchedulerStats and the NVLink sections this
#      ncu has), kernel replay, for TOKENS x SECTION_HIDDEN.
# Caches are flushed before every profiled pass (--cache-control all), clocks
# left alone (--clock-control none).
#
#   OUT=/tmp/x bash scripts/gpu/allreduce_ncu.sh   (on the two-GPU machine, repo root,
#   after `source /tmp/site/env.sh; source /tmp/flashinfer-site/env.sh;
#   export PYTHONPATH=.:$PYTHONPATH`)
#
# Writes $OUT/allreduce_ncu_{durations,sections}.txt (one block per profiled
# launch); the reports stay in ${NCU_WORK:-/tmp/allreduce_ncu}.
set -uo pipefail
OUT=${OUT:?set OUT to the folder for the summaries}
WORK=${NCU_WORK:-/tmp/allreduce_ncu}
TOKENS=${TOKENS:-1,64}
HIDDEN=${HIDDEN:-7168,5120}
SECTION_HIDDEN=${SECTION_HIDDEN:-7168}
IMPLS=${IMPLS:-ours_watchdog,ours_plain,flashinfer_oneshot}
PY=${PYTHON:-python3}
mkdir -p "$OUT" "$WORK"
nvl=()
for s in $(ncu --list-sections 2>/dev/null | awk '{print $1}' | grep -i nvlink); do nvl+=(--section "$s"); done
echo "NVLink sections of this ncu: ${nvl[*]:-none}"
common=(--target-processes application-only --profile-from-start off
        --clock-control none --cache-control all -f)
run() {  # name, seconds, ncu args..., -- program args...
  local name=$1 limit=$2; shift 2
  local ncu_args=() prog_args=()
  while [[ $# -gt 0 && $1 != -- ]]; do ncu_args+=("$1"); shift; done
  shift; prog_args=("$@")
  echo "== $name $(date -u +%H:%M:%S)"
  timeout "$limit" ncu "${common[@]}" "${ncu_args[@]}" -o "$WORK/$name" \
    "$PY" scripts/gpu/allreduce_ncu.py --impls "$IMPLS" "${prog_args[@]}" \
    > "$WORK/$name.launches.txt" 2> "$WORK/$name.stderr.txt"
  local rc=$?
  echo "$name: ncu rc=$rc $(date -u +%H:%M:%S)"
  if [[ ! -f "$WORK/$name.ncu-rep" ]]; then
    echo "$name: no report; the program's output and ncu's stderr:"
    tail -n 25 "$WORK/$name.launches.txt"; tail -n 25 "$WORK/$name.stderr.txt"
    return 1
  fi
  ncu -i "$WORK/$name.ncu-rep" --csv --page details > "$WORK/$name.details.csv"
  ncu -i "$WORK/$name.ncu-rep" --csv --page raw > "$WORK/$name.raw.csv"
  "$PY" scripts/gpu/ncu_summary.py "$WORK/$name.launches.txt" "$WORK/$name.details.csv" \
    "$WORK/$name.raw.csv" > "$OUT/allreduce_ncu_$name.txt"
  grep -E "^skipped|==WARNING|==ERROR" "$WORK/$name.launches.txt" "$WORK/$name.stderr.txt" | head -n 10
  cat "$OUT/allreduce_ncu_$name.txt"
  return $rc
}
run durations "${DURATIONS_LIMIT_S:-120}" \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size,launch__registers_per_thread \
  -- --tokens "$TOKENS" --hidden "$HIDDEN"
rc1=$?
run sections "${SECTIONS_LIMIT_S:-300}" \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats \
  --section Occupancy --section WarpStateStats --section SchedulerStats "${nvl[@]}" \
  --metrics dram__bytes_read.sum,dram__bytes_write.sum \
  -- --tokens "$TOKENS" --hidden "$SECTION_HIDDEN"
rc2=$?
tar czf "$OUT/allreduce_ncu_reports.tgz" -C "$WORK" . 2>/dev/null
exit $(( rc1 || rc2 ))
