#!/usr/bin/env bash
# Detection power of the regression rules on this GPU (issue 66), from the
# repo root on the GPU machine (wheels staged: scripts/gpu/env.sh):
#   NIGHTS=10 PLANT_PCTS= bash scripts/gpu/detection_power.sh           # call 1: A/A
#   KEEP=1 NIGHTS=0 bash scripts/gpu/detection_power.sh                 # call 2: planted
# (extra arguments replace the default filters --ops all_reduce_norm --tp 1:
# the 8 nightly cases of the single kernel, hidden 5120/7168 x M 1/8/16/64).
#
# 1. NIGHTS A/A profile nights of the nightly suite, one tree, into one
#    results folder (/tmp/power-results; trigger nightly, a run id a night).
# 2. For each PCT of PLANT_PCTS (default 3,5,10,1: the targets first, should a
#    call run out of time; 1 % is under every threshold), PLANT_NIGHTS (default 3)
#    planted nights: `jobs profile ... --plant-slowdown PCT --trigger adhoc`,
#    each case's kernel built to spin PCT % of its A/A median before its
#    payload stores (jobs/plant.py; test-only, used by this script alone).
#    Their rows are marked (extra.planted_pct, trigger adhoc): no nightly
#    history, lookback or change point ever reads them as real nights.
# 3. `python -m jobs.power`: false alarms per 1,000 case-nights and the
#    power to catch a +1/3/5/10 % step within 1, 2, 3 nights, for the
#    lookback rule and the change points: steps injected on the recorded
#    noise, and the planted steps as measured (power.md).
#
# Each night runs under NIGHT_TIMEOUT (default 240 s) with its log in $OUT;
# the results folder is tarred into $OUT after every night, so a call cut
# short keeps what it recorded. BUDGET_S (default 540) bounds the whole call:
# a night is not started unless the slowest night so far (NIGHT_EST, default
# 60 s, before the first) still fits, leaving ANALYSIS_S (default 60) for
# step 3 (ANALYSE=0 skips it; it needs ruptures: stage-extra-wheels stages it,
# else run it on the CPU machine from power_results.tgz, as printed).
# KEEP=1 adds to the nights in /tmp/power-results (a second call on the same
# warm machine); if that folder is gone (a fresh machine), SEED=PATH (a
# power_results.tgz carried in the tree, e.g. .dev/power_results.tgz) is
# unpacked first. Leaves under $OUT: power_results.tgz, nights.tgz (every
# night's log, nights.log their exits and times), power.md, power.err.
set -uo pipefail
source "$(dirname "$0")/env.sh"
t_start=$(date +%s)
nights=${NIGHTS:-10}
pcts=${PLANT_PCTS-3,5,10,1}
plant_nights=${PLANT_NIGHTS:-3}
budget=${BUDGET_S:-540}
analysis=${ANALYSIS_S:-60}
est=${NIGHT_EST:-60}
res=/tmp/power-results
logs=/tmp/power-logs
[[ $# -eq 0 ]] && set -- --ops all_reduce_norm --tp 1
if [[ ${KEEP:-0} == 1 ]]; then
  if [[ ! -d $res && -n ${SEED:-} ]]; then
    tar xzf "$SEED" -C /tmp && echo "seeded $res from $SEED"
  fi
  [[ -d $res ]] || echo "KEEP=1: no $res here (a fresh machine?): the planted nights need the A/A ones; pass SEED=PATH"
else
  rm -rf "$res" "$logs"
fi
mkdir -p "$logs"

left() { echo $(( budget - analysis - ($(date +%s) - t_start) )); }
save() {  # the nights so far and their logs, into $OUT
  [[ -d $res ]] && tar czf "$out/power_results.tgz" -C /tmp power-results
  tar czf "$out/nights.tgz" -C /tmp power-logs 2>/dev/null
}
night() {  # NAME EXTRA-ARGS...: one profile night, timed, logged, saved
  local name=$1; shift
  if (( $(left) < est )); then
    echo "$name: not started, $(left) s left of BUDGET_S=$budget (a night takes up to $est s)"
    return 1
  fi
  local t0=$(date +%s) rc
  timeout -k 10 "${NIGHT_TIMEOUT:-240}" python3 -m jobs profile --suite nightly --backend gpu \
    --results "$res" --run-id "$name" "$@" > "$logs/$name.log" 2>&1
  rc=$?
  local dt=$(( $(date +%s) - t0 ))
  (( dt > est )) && est=$dt
  echo "$name: exit $rc in $dt s ($(grep -c '' "$logs/$name.log") log lines)" | tee -a "$logs/nights.log"
  [[ $rc == 2 ]] && tail -3 "$logs/$name.log"
  save
  return 0
}

stamp=$(date -u +%Y%m%dT%H%M%S)
for i in $(seq 1 "$nights"); do
  night "aa$stamp-$i" --trigger nightly "$@" || break
done
for pct in ${pcts//,/ }; do
  for i in $(seq 1 "$plant_nights"); do
    night "plant$pct-$stamp-$i" --trigger adhoc --plant-slowdown "$pct" "$@" || break 2
  done
done
save
echo "nights done after $(( $(date +%s) - t_start )) s; rows: $out/power_results.tgz"

if [[ ${ANALYSE:-1} == 1 && -d $res ]]; then
  if python3 -c "import ruptures" 2>/dev/null; then
    timeout -k 5 "$(( analysis > 10 ? analysis : 10 ))" python3 -m jobs.power --results "$res" \
      --trials "${TRIALS:-100}" --format md > "$out/power.md" 2> "$out/power.err"
    echo "jobs.power: exit $? ($out/power.md)"
    cat "$out/power.md" "$out/power.err"
  else
    echo "ruptures is not installed here (bash scripts/stage-extra-wheels, carry .dev/extra):"
  fi
fi
echo "on the CPU machine: tar xzf power_results.tgz -C /tmp &&"
echo "  python -m jobs.power --results /tmp/power-results --trials 400 --format md"
