#!/usr/bin/env bash
# The nightly suite on the GPU machine with a cold, then a warm compile cache.
# Run from the repo root after `source /tmp/site/env.sh && export PYTHONPATH=.:$PYTHONPATH`:
#   bash scripts/gpu/nightly_cache.sh cold    # empties the cache first
#   bash scripts/gpu/nightly_cache.sh warm    # same command, cache kept
# (two device calls: each must end within 10 minutes). Prints each job's
# heading and closing line (wall time, cases, service overhead, peak groups
# at once), the compile-check line (compiled vs served from the cache) and
# how many kernels the cache holds; the full log goes to $OUT/nightly_<pass>.log.
set -u
pass=${1:?usage: nightly_cache.sh cold|warm}
case "$pass" in cold|warm) ;; *) echo "nightly_cache.sh: pass must be cold or warm, got '$pass'" >&2; exit 2;; esac
export LAMPORT_COMPILE_CACHE=/tmp/lamport-compile-cache
out=${OUT:-/tmp}
if [ "$pass" = cold ]; then rm -rf "$LAMPORT_COMPILE_CACHE"; fi
rm -rf "/tmp/results-$pass" "/tmp/site-$pass"
before=$(find "$LAMPORT_COMPILE_CACHE" -name meta.json 2>/dev/null | wc -l)
start=$(date +%s)
timeout 580 python3 -m jobs nightly --suite nightly --backend gpu --results "/tmp/results-$pass" \
  --site "/tmp/site-$pass" > "$out/nightly_$pass.log" 2>&1
rc=$?
after=$(find "$LAMPORT_COMPILE_CACHE" -name meta.json 2>/dev/null | wc -l)
grep -E "^== |^   \(|variants: .* compiled|failing case|pass, .* fail" "$out/nightly_$pass.log"
echo "$pass: exit $rc, wall $(( $(date +%s) - start )) s; compile cache $LAMPORT_COMPILE_CACHE: $before -> $after kernels ($(( after - before )) compiled and stored by this run)"
