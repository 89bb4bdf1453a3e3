#!/usr/bin/env bash
# A latency bisect on the GPU (issue 37): a temporary repository made from
# this tree (tests/bisect_repo.py: the project as a base commit, then
# COMMITS note commits, the 4th also slowing all_reduce_norm's GPU publish by
# a spin of about 1 ms), then `jobs bisect` of the nightly's tp=1 case
# (tests.bisect_repo.GPU_LATENCY_KEY) between the base and the last commit,
# timed. Exit: the bisect's (0 found, 1 not reproduced, 2 usage, 3 Ray),
# and 1 when it names another commit than the slow one.
#   source scripts/gpu/env.sh && COMMITS=5 bash scripts/gpu/bisect.sh [DEST]
set -u
py=${PYTHON:-python3}
commits=${COMMITS:-5}
dest=${1:-$(mktemp -d /tmp/bisect-gpu.XXXXXX)/repo}
made=$("$py" -m tests.bisect_repo "$dest" "$commits") || exit 2
field() { "$py" -c "import json, sys; c = json.loads(sys.argv[1]); print($1)" "$made"; }
good=$(field 'c["base"]') bad=$(field 'c["commits"][-1]') slow=$(field 'c["slow"]')
key=$("$py" -c 'from tests.bisect_repo import GPU_LATENCY_KEY; print(GPU_LATENCY_KEY)')
echo "repository $dest: base $good, $commits commits, the slow one $slow"
start=$(date +%s)
"$py" -m jobs bisect --repo "$dest" --suite nightly --case "$key" --good "$good" --bad "$bad" \
    --kind latency --results "$dest-results" | tee "$dest-bisect.log"
rc=${PIPESTATUS[0]}
echo "bisect exit $rc after $(( $(date +%s) - start )) s"
if [ "$rc" -eq 0 ] && ! grep -q "first bad commit: $slow" "$dest-bisect.log"; then
  echo "the bisect named another commit than the slow one ($slow)"; exit 1
fi
exit "$rc"
