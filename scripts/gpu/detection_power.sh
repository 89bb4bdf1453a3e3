#!/usr/bin/env bash
# Detection power of the regression rules on this GPU's own noise (issue 66),
# from the repo root on the GPU machine:
#   NIGHTS=8 bash scripts/gpu/detection_power.sh [python -m jobs profile filters...]
# (default filters: --ops all_reduce_norm --tp 1). Runs NIGHTS A/A profile
# nights of the nightly suite, one tree, into one results folder
# (/tmp/power-results; trigger nightly, a run id per night), then
# `python -m jobs.power` on them: false alarms per 1,000 case-nights and the
# probability of catching a +1/3/5/10 % step within 1, 2, 3 nights, for the
# lookback rule and the change points, the steps injected multiplicatively
# on the recorded nights' noise (jobs/power.py). No slowdown is planted on
# the GPU (no kernel variant is built for it): the steps are injected.
# KEEP=1 adds the nights to those already in /tmp/power-results (a second
# call on the same warm machine: more nights than one 10-minute command holds).
# Leaves under $OUT: power_results.tgz (the nights), night-N.log, power.md.
# Where ruptures is not installed here the analysis is left to the CPU
# machine: tar xzf power_results.tgz -C /tmp &&
#   python -m jobs.power --results /tmp/power-results --format md
set -uo pipefail
source "$(dirname "$0")/env.sh"
nights=${NIGHTS:-8}
res=/tmp/power-results
[[ $# -eq 0 ]] && set -- --ops all_reduce_norm --tp 1
[[ ${KEEP:-0} == 1 ]] || rm -rf "$res"
for i in $(seq 1 "$nights"); do
  t0=$(date +%s)
  timeout "${NIGHT_TIMEOUT:-300}" python3 -m jobs profile --suite nightly --backend gpu \
    --results "$res" --trigger nightly --run-id "aa$(date -u +%Y%m%dT%H%M%S)-$i" "$@" \
    > "$out/night-$i.log" 2>&1
  echo "night $i/$nights: exit $? in $(( $(date +%s) - t0 )) s"
done
tar czf "$out/power_results.tgz" -C /tmp power-results
if python3 -c "import ruptures" 2>/dev/null; then
  python3 -m jobs.power --results "$res" --trials "${TRIALS:-400}" --format md | tee "$out/power.md"
else
  echo "ruptures is not installed here: run the analysis where it is:"
  echo "  tar xzf power_results.tgz -C /tmp && python -m jobs.power --results /tmp/power-results --format md"
fi
