#!/usr/bin/env bash
# The whole GPU test suite on the GPU machine, part by part (one pytest per
# test file, each under its own timeout -s KILL, a JUnit XML and a log):
# see scripts/gpu/suite.py for the options. From the repo root, once the
# wheels are received:
#   bash scripts/gpu/suite.sh                      # the default run (no slow tests)
#   bash scripts/gpu/suite.sh --lanes 3            # ... three parts at once (see suite.py)
#   BUDGET_S=540 bash scripts/gpu/suite.sh --slow  # ... with them, then --resume
# The parts share one compile cache (kept while the machine stays up).
set -u
source "$(dirname "$0")/env.sh"
export LAMPORT_COMPILE_CACHE=${LAMPORT_COMPILE_CACHE:-/tmp/lamport-compile-cache-suite}
export PYTHONUNBUFFERED=1
exec python3 "$(dirname "$0")/suite.py" "$@"
