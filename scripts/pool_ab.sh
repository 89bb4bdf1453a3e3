#!/usr/bin/env bash
# The README's main job without and with the worker pool, back to back on one
# machine from one tree (--pool off, then --pool job): each job's closing line
# and each run's wall time. Extra arguments go to both runs, e.g.
#   scripts/pool_ab.sh                       # the emulated smoke nightly
#   scripts/pool_ab.sh --backend gpu         # on a GPU machine (source scripts/gpu/env.sh)
# Results and pages under ${AB_DIR:-/tmp/pool-ab}/{off,job}.
set -u
py=${PYTHON:-.venv/bin/python}
[ -x "$py" ] || py=python3
dir=${AB_DIR:-/tmp/pool-ab}
rc=0
for pool in off job; do
  rm -rf "$dir/$pool"; mkdir -p "$dir/$pool"
  start=$(date +%s.%N)
  "$py" -m jobs nightly --suite smoke --pool "$pool" --results "$dir/$pool/results" \
    --site "$dir/$pool/site" "$@" > "$dir/$pool/log" 2>&1 || rc=$?
  wall=$(echo "$(date +%s.%N) - $start" | bc)
  echo "--pool $pool: exit ${rc}, wall ${wall%.*} s"
  grep -E "^== |^   \(|^pool .*lease|pass, .* fail" "$dir/$pool/log" | sed 's/^/    /'
done
exit $rc
