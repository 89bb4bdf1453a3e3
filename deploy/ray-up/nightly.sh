#!/usr/bin/env bash
# The nightly on the `ray up` cluster (deploy/ray-up/cluster.yaml), from cron
# on the machine that launched it (docs/deploy.md):
#   0 2 * * * cd /path/to/lamport-lab && deploy/ray-up/nightly.sh >> nightly.log 2>&1
# It brings the cluster up (a no-op when it is up, but it syncs this checkout
# and reruns its setup), then submits the nightly to the head's Ray job
# server (`python -m jobs submit --no-wait`, on the head over ssh): the job
# runs under Ray there, so a dropped ssh session, or this script killed,
# does not stop it. It follows the job's log to its end (again over ssh,
# retried if the session drops), copies the dashboard back into
# $LAMPORT_SITE_DIR for your web server, and exits with the job's status
# (jobs/exits.py: 1 a red nightly, 3 Ray could not be reached or the job not
# followed to its end). The job's log stays on the head; read it later
# with (JOB_ID: the `job:` line this script printed)
#   ray exec deploy/ray-up/cluster.yaml 'cd ~/lamport-lab && .venv/bin/python -m jobs logs JOB_ID --address http://127.0.0.1:8265'
set -uo pipefail
cd "$(dirname "$0")/../.."
config=${LAMPORT_RAY_UP_CONFIG:-deploy/ray-up/cluster.yaml}
site_dir=${LAMPORT_SITE_DIR:-/var/www/lamport-lab}
job_id=${LAMPORT_NIGHTLY_JOB_ID:-lamport-nightly-$(date -u +%Y%m%dT%H%M%SZ)}
retry_s=${LAMPORT_NIGHTLY_RETRY_S:-60}
ray=$(command -v .venv/bin/ray || command -v ray)
# On the head, in the checkout `ray up` synced there; its job server is the
# dashboard cluster.yaml's head serves on 127.0.0.1 (Ray's port, 8265).
jobs='.venv/bin/python -m jobs'
server='--address http://127.0.0.1:8265'
on_head() { "$ray" exec "$config" "cd ~/lamport-lab && $1"; }

"$ray" up --yes --no-restart "$config" || exit 3
on_head "$jobs submit $server --no-wait --submission-id $job_id -- nightly --suite nightly --backend gpu --trigger nightly --results \$HOME/lamport-data/results --site \$HOME/lamport-data/site" || exit 3
followed=
for attempt in 1 2 3 4 5 6; do
  if on_head "$jobs logs $job_id $server --follow"; then
    followed=yes
    break
  fi
  echo "nightly.sh: following job $job_id broke off (attempt $attempt); the job goes on" >&2
  sleep "$retry_s"
done
if [ -z "$followed" ]; then
  echo "nightly.sh: job $job_id not followed to its end; its log: see the header of $0" >&2
  exit 3
fi
# `ray exec` says 1 for any failure: the job's own status comes back as a line.
out=$(on_head "$jobs status $job_id $server; echo \"nightly.sh: exit status \$?\"")
printf '%s\n' "$out"
status=$(printf '%s\n' "$out" | tr -d '\r' | sed -n 's/^nightly\.sh: exit status \([0-9][0-9]*\)$/\1/p' | tail -n 1)
status=${status:-3}  # not asked: ssh failed
mkdir -p "$site_dir"
if ! "$ray" rsync-down "$config" '~/lamport-data/site/' "$site_dir/" && [ "$status" = 0 ]; then
  status=3  # the nightly passed but its dashboard could not be fetched
fi
exit "$status"
