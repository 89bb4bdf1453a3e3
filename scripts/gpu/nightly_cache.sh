#!/usr/bin/env bash
# The nightly suite on the GPU machine with a cold, then a warm compile cache,
# split into parts that each fit one 10-minute device call and join one run
# (`python -m jobs nightly --jobs ... --run-id`). Run from the repo root once
# the wheels are received (it sources scripts/gpu/env.sh), with
# LAMPORT_GIT_COMMIT set to the tree's commit (the device's .git may be stale):
#   bash scripts/gpu/nightly_cache.sh cold 1   # empties the cache and the results first
#   bash scripts/gpu/nightly_cache.sh cold 2   # ... parts 2, 3, 4 join the same run
#   bash scripts/gpu/nightly_cache.sh warm 1   # same parts, cache kept
# Parts: 1 self-check, compile check, correctness of all_reduce_norm;
# 2 correctness of the other ops; 3 the fault campaign; 4 the profile (the
# dashboard is rebuilt from the whole run after each part); "all" runs 1-4
# in one invocation. RESUME=1 completes a part that was cut short (its
# cases already in the run are not rerun; part 1 then keeps the cache and
# the results). Prints each job's heading and closing line (wall time,
# cases, service overhead, peak groups at once), the compile-check line
# (compiled vs served from the cache) and how many kernels the cache holds;
# each part's full log goes to $OUT/nightly_<pass>_<part>.log, and the rows
# and pages so far to $OUT/results-<pass>.tgz. OPS=a,b narrows a part to
# those ops; GROUPS_PER_GPU=N lets N one-GPU groups share a GPU in the
# correctness parts (1, 2; `--groups-per-gpu`, default 1; the fault campaign
# keeps whole GPUs: its hangs would slow a neighbour's calls);
# PART_TIMEOUT_S (default 570) bounds each part (timeout's SIGTERM reaches the
# driver and its Ray cluster at once: the driver writes its closing line and
# accounting and exits 143 within jobs.embedded.TERM_GRACE_S, 20 s, inside the
# 30 s before `-k 30`'s SIGKILL: the part's exit is then timeout's 124; 137
# would mean the SIGKILL was needed); CALL_BUDGET_S
# bounds the whole invocation (each part gets what is left, none starts with
# less than 60 s), so that one device call runs `all` as far as it goes and
# the next `RESUME=1 ... all` picks up there (a finished part's cases are
# held: it only restarts Ray and rebuilds the dashboard). Cold, on two H200s, nightly v7 (2026-11-30,
# docs/results/service_h200x2_2026-11-30.md section 12): part 1 345 s,
# part 2 ~355 s, part 3 328 s, part 4 ~340 s, 1,387 s in three device calls;
# a part cut by PART_TIMEOUT_S is completed with RESUME=1. A run
# takes rows from one tree only (a part from another commit is refused):
# start a new RUN_ID after changing the tree.
set -u
pass=${1:?usage: nightly_cache.sh cold|warm [1|2|3|4|all]}
part=${2:-all}
case "$pass" in cold|warm) ;; *) echo "nightly_cache.sh: pass must be cold or warm, got '$pass'" >&2; exit 2;; esac
case "$part" in 1|2|3|4|all) ;; *) echo "nightly_cache.sh: part must be 1, 2, 3, 4 or all, got '$part'" >&2; exit 2;; esac
source "$(dirname "$0")/env.sh"
export LAMPORT_COMPILE_CACHE=${LAMPORT_COMPILE_CACHE:-/tmp/lamport-compile-cache}
out=${OUT:-/tmp}
run_id=${RUN_ID:-h200-nightly-$pass}
if { [ "$part" = 1 ] || [ "$part" = all ]; } && [ -z "${RESUME:-}" ]; then
  if [ "$pass" = cold ]; then rm -rf "$LAMPORT_COMPILE_CACHE"; fi
  rm -rf "/tmp/results-$pass" "/tmp/site-$pass"
fi
args_of() {
  case "$1" in
    1) echo "--jobs selfcheck,compile-check,correctness --ops ${OPS:-all_reduce_norm} --groups-per-gpu ${GROUPS_PER_GPU:-1}" ;;
    2) echo "--jobs correctness --ops ${OPS:-finalize_publish,embed_norm,all_reduce_mhc,indexer} --groups-per-gpu ${GROUPS_PER_GPU:-1}" ;;
    3) echo "--jobs faults ${OPS:+--ops $OPS}" ;;
    4) echo "--jobs profile ${OPS:+--ops $OPS}" ;;
  esac
}
rc_all=0
call_start=$(date +%s)
for p in $( [ "$part" = all ] && echo 1 2 3 4 || echo "$part" ); do
  limit=${PART_TIMEOUT_S:-570}
  if [ -n "${CALL_BUDGET_S:-}" ]; then
    left=$(( CALL_BUDGET_S - ($(date +%s) - call_start) ))
    if [ "$left" -lt 60 ]; then
      echo "$pass: ${left} s of CALL_BUDGET_S left: part $p and later not started (rerun with RESUME=1)"
      rc_all=124
      break
    fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  before=$(find "$LAMPORT_COMPILE_CACHE" -name meta.json 2>/dev/null | wc -l)
  start=$(date +%s)
  # shellcheck disable=SC2046
  timeout -k 30 "$limit" python3 -m jobs nightly --suite nightly --backend gpu $(args_of "$p") --run-id "$run_id" ${RESUME:+--resume} \
    --results "/tmp/results-$pass" --site "/tmp/site-$pass" > "$out/nightly_${pass}_$p.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && rc_all=$rc
  after=$(find "$LAMPORT_COMPILE_CACHE" -name meta.json 2>/dev/null | wc -l)
  grep -E "^== |^   \(|variants: .* compiled|failing case|pass, .* fail|^dashboard" "$out/nightly_${pass}_$p.log"
  echo "$pass part $p: exit $rc, wall $(( $(date +%s) - start )) s; compile cache $LAMPORT_COMPILE_CACHE: $before -> $after kernels ($(( after - before )) compiled and stored by this part)"
  # The machine may be given back between calls (30 s idle): bring the rows home every part.
  [ -n "${OUT:-}" ] && tar czf "$OUT/results-$pass.tgz" -C /tmp "results-$pass" "site-$pass" 2>/dev/null
done
exit $rc_all
