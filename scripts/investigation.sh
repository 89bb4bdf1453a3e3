#!/usr/bin/env bash
# An ad-hoc investigation against a standing pool, timed end to end as a user
# waits on it (issue 31's "investigation" figure): a head and a standing pool
# started once, then the same small correctness command RUNS times with
# --pool NAME and once with --pool off (fresh rank actors), each line's exit
# status and wall; then the pool's status, and everything stopped again.
#   scripts/investigation.sh                        # the issue's 6 cases, auto backend
#   RUNS=5 scripts/investigation.sh --backend gpu   # extra arguments go to every run
#   PROFILE=/tmp/inv.prof scripts/investigation.sh  # and one more pool run under cProfile
# On the GPU machine `source scripts/gpu/env.sh` first (PYTHON=python3).
# Exit 0 when every command did; a head or pool that does not start ends it
# there (with that step's status), and whatever it started is stopped.
set -u
py=${PYTHON:-.venv/bin/python}
[ -x "$py" ] || py=python3
runs=${RUNS:-3}
name=${POOL_NAME:-investigation}
case "$runs" in ''|*[!0-9]*|0) echo "investigation.sh: RUNS must be a whole number >= 1, got '$runs'" >&2; exit 2;; esac
export LAMPORT_HEAD_DIR=${LAMPORT_HEAD_DIR:-$(mktemp -d /tmp/investigation-head.XXXXXX)}
mkdir -p "$LAMPORT_HEAD_DIR" || exit 2
log=$(mktemp /tmp/investigation-step.XXXXXX) || exit 2
pool_up='' head_up=''
cleanup() {  # whatever a failed step left running is stopped too
  [ -n "$pool_up" ] && "$py" -m jobs pool stop --name "$name" > /dev/null 2>&1
  [ -n "$head_up" ] && "$py" -m jobs head stop > /dev/null 2>&1
  rm -f "$log"
}
trap cleanup EXIT
case_args=(correctness --suite nightly --ops all_reduce_norm --tp 1 --hidden 7168 --tokens 8 --no-results)
rc_all=0
step() {  # step LABEL CMD...: run, print exit and wall
  local label=$1; shift
  local start cs rc
  start=$(date +%s%N)
  "$@" > "$log" 2>&1
  rc=$?
  cs=$(( ($(date +%s%N) - start) / 10000000 ))  # hundredths of a second
  [ $rc -ne 0 ] && rc_all=$rc
  printf '%-34s exit %3d  %4d.%02d s   %s\n' "$label" "$rc" $((cs / 100)) $((cs % 100)) \
    "$(grep -E 'pass, .* fail|head:|pool .*worker|stopped' "$log" | tail -n 1 | cut -c1-110)"
  [ $rc -ne 0 ] && tail -n 5 "$log" | sed 's/^/    /'
  return $rc
}
head_up=1
step "jobs head start" "$py" -m jobs head start || exit $?
pool_up=1
step "jobs pool start --name $name" "$py" -m jobs pool start --name "$name" || exit $?
for i in $(seq 1 "$runs"); do
  step "correctness --pool $name ($i)" "$py" -m jobs "${case_args[@]}" --pool "$name" "$@"
done
if [ -n "${PROFILE:-}" ]; then  # where a pool run's seconds go (slower under the profiler)
  step "correctness --pool $name (cProfile)" "$py" -m cProfile -o "$PROFILE" -m jobs \
    "${case_args[@]}" --pool "$name" "$@"
  "$py" -c "import pstats, sys; pstats.Stats(sys.argv[1]).sort_stats('cumtime').print_stats(40)" \
    "$PROFILE" > "$PROFILE.txt" 2>&1
fi
step "correctness --pool off" "$py" -m jobs "${case_args[@]}" --pool off "$@"
"$py" -m jobs pool status --name "$name" 2>&1 | sed 's/^/    /' | cut -c1-160
step "jobs pool stop --name $name" "$py" -m jobs pool stop --name "$name" && pool_up=''
step "jobs head stop" "$py" -m jobs head stop && head_up=''
exit $rc_all
