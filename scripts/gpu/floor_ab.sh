#!/usr/bin/env bash
# The replay floor, A against B, on the two-GPU H200 machine (issue 21;
# docs/results/service_h200x2_2026-11-30.md section 10 says why): the tp=2
# all_reduce_norm profile beside FlashInfer, once as the nightly times it
# (graphs of max(calls, sets) calls) and once with every graph lengthened
# until a replay lasts MIN_REPLAY_MS (default 5), two runs back to back on
# one machine, then each run's latency table with the ranks' own medians.
# From the repo root, after the wheels and FlashInfer's chunks were received:
#   bash scripts/gpu/floor_ab.sh            # HIDDEN=5120,7168 TOKENS=16,64
# Leaves under $OUT: floor_ab.log, floor-ab.tgz (both runs' rows).
set -uo pipefail
source "$(dirname "$0")/env.sh"
floor=${MIN_REPLAY_MS:-5}
results=/tmp/floor-ab
rc_all=0
for ms in 0 "$floor"; do
  suite=/tmp/floor_ab_$ms.toml
  cat > "$suite" <<EOF
format = 1
name = "floor_ab"
version = 1
description = "tp=2 all_reduce_norm beside FlashInfer, min_replay_ms = $ms"

[[profile]]
op = "all_reduce_norm"
mode = "one_shot"
variant = "watchdog"
tp = [2]
hidden = [${HIDDEN:-5120,7168}]
tokens = [${TOKENS:-16,64}]
baselines = ["flashinfer"]
calls = 50
replays = 200
min_replays = 20
min_replay_ms = $ms
EOF
  echo "== min_replay_ms = $ms"
  timeout "${RUN_TIMEOUT_S:-270}" python3 -m jobs profile --config "$suite" --backend gpu \
    --results "$results" --run-id "floor-ab-$ms" >> "$out/floor_ab.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && rc_all=$rc
  [ -d "$results" ] && python3 scripts/gpu/latency_table.py "$results" --run "floor-ab-$ms" --ranks
  echo "run floor-ab-$ms: exit $rc"
done
[ -d "$results" ] && tar czf "$out/floor-ab.tgz" -C /tmp floor-ab
exit $rc_all
