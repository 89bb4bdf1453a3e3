#!/usr/bin/env bash
# The README's test command N times in a row on a fresh clone, with a one-core
# busy loop beside it (a neighbour's build, a noisy CI runner): the flakiness
# check of docs/results/tests_cpu_*.md. Usage, from a checkout:
#   scripts/busy_runs.sh 5 [DIR]     # clone HEAD into DIR (default /tmp/busy-runs)
#   scripts/busy_runs.sh 5 DIR 4     # go on with runs 4 and 5 in DIR's clone as it is
#                                    # (a batch longer than a sitting: same tree, same venv)
# Each run's log is DIR.<i>.log, a line a test as it ends (-v: a run cut short
# still names what failed) and the 40 slowest at its end; one line a run:
# exit, wall, pytest's summary.
# Exit 0 only when every run passed. Stopped (SIGINT, SIGTERM), it stops the run
# under way, Ray clusters included, before it exits. Tests' scratch directories
# are under DIR.tmp (pytest --basetemp): a process still running from one after
# a run (a Ray head a doc command started in a session of its own) is named and
# killed.
set -u
n=${1:?usage: busy_runs.sh N [DIR [FIRST]]}
dir=${2:-/tmp/busy-runs}
first=${3:-1}
for v in "N=$n" "FIRST=$first"; do
  case "${v#*=}" in ''|*[!0-9]*) echo "busy_runs.sh: ${v%%=*} must be a whole number, got '${v#*=}'" >&2; exit 2;; esac
done
if [ "$first" -lt 1 ] || [ "$first" -gt "$n" ]; then
  echo "busy_runs.sh: FIRST must be in 1..N=$n, got $first" >&2; exit 2
fi
if [ "$first" -eq 1 ]; then
  src=$(git rev-parse --show-toplevel) || exit 2
  rm -rf "$dir" && git clone -q "$src" "$dir" && cd "$dir" || exit 2
  echo "tree $(git rev-parse --short=12 HEAD), $(nproc) cores"
  scripts/setup --dev > "$dir.setup.log" 2>&1 || { echo "setup failed: $dir.setup.log" >&2; exit 2; }
else  # the clone and venv of runs 1..FIRST-1, untouched
  [ -x "$dir/.venv/bin/python" ] || { echo "busy_runs.sh: no set-up clone in $dir to go on in" >&2; exit 2; }
  cd "$dir" || exit 2
  echo "tree $(git rev-parse --short=12 HEAD) (going on from run $first), $(nproc) cores"
fi
python3 -c "while True: pass" & hog=$!
# Each run is a session of its own (pytest, its xdist workers and the Ray
# clusters its tests start), so stopping this script stops all of it.
run=''
sweep() {  # processes whose working directory is a test's scratch directory
  local pids p
  pids=$(for p in /proc/[0-9]*; do
    case "$(readlink "$p/cwd" 2>/dev/null)" in "$dir.tmp"/*) echo "${p#/proc/}";; esac
  done)
  [ -z "$pids" ] && return 0
  echo "left behind: $(ps -o pid=,args= -p "$(echo $pids | tr ' ' ,)" | cut -c1-100 | paste -sd';')"
  kill -TERM $pids 2>/dev/null; sleep 2; kill -KILL $pids 2>/dev/null
  return 0
}
stop() {
  kill "$hog" 2>/dev/null
  if [ -n "$run" ]; then
    kill -TERM -- "-$run" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 -- "-$run" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$run" 2>/dev/null
  fi
  sweep
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
rc_all=0
for i in $(seq "$first" "$n"); do
  start=$(date +%s)
  setsid timeout -k 30 3600 .venv/bin/python -m pytest -n 2 --dist loadgroup -v -p no:cacheprovider \
    --durations=40 --basetemp "$dir.tmp" > "$dir.$i.log" 2>&1 &
  run=$!
  wait "$run"
  rc=$?
  run=''
  [ $rc -ne 0 ] && rc_all=1
  echo "run $i: exit $rc, wall $(( $(date +%s) - start )) s, $(grep -E '(passed|failed|error)' "$dir.$i.log" | tail -1)"
  sweep
done
exit $rc_all
