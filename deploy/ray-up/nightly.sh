#!/usr/bin/env bash
# The nightly on the `ray up` cluster (deploy/ray-up/cluster.yaml), from cron
# on the machine that launched it (docs/deploy.md):
#   0 2 * * * cd /path/to/lamport-lab && deploy/ray-up/nightly.sh >> nightly.log 2>&1
# It brings the cluster up (a no-op when it is up, but it syncs this checkout
# and reruns its setup), runs the nightly on the head against the whole
# cluster, and copies the dashboard back into $LAMPORT_SITE_DIR for your web
# server. Its exit status is the nightly's (jobs/exits.py: 1 a red nightly,
# 3 Ray could not be reached).
set -uo pipefail
cd "$(dirname "$0")/../.."
config=${LAMPORT_RAY_UP_CONFIG:-deploy/ray-up/cluster.yaml}
site_dir=${LAMPORT_SITE_DIR:-/var/www/lamport-lab}
ray=$(command -v .venv/bin/ray || command -v ray)
"$ray" up --yes --no-restart "$config" || exit 3
"$ray" exec "$config" 'cd ~/lamport-lab && RAY_AUTH_MODE=token .venv/bin/python -m jobs nightly --suite nightly --backend gpu --trigger nightly --address auto --results ~/lamport-data/results --site ~/lamport-data/site'
status=$?
mkdir -p "$site_dir"
if ! "$ray" rsync-down "$config" '~/lamport-data/site/' "$site_dir/" && [ "$status" = 0 ]; then
  status=3  # the nightly passed but its dashboard could not be fetched
fi
exit "$status"
