#!/usr/bin/env bash
# pg_cron for real: the throwaway cluster preloads pg_cron (cron.database_name = postgres);
# idem_schedule_purge registers one job, the job runs within a minute and deletes the
# expired claims, and nothing inside its retention.
set -euo pipefail
q() { psql -qXAt -v ON_ERROR_STOP=1 -d postgres "$@"; }
q <<'SQL' >/dev/null
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS idempotency;
CREATE EXTENSION IF NOT EXISTS pg_cron;
CREATE EXTENSION idempotency;
SELECT idem_claim('cron-' || i) FROM generate_series(1, 1000) AS i;
UPDATE idempotency.ledger SET claimed_at = now() - interval '30 days';
SELECT idem_claim('fresh-' || i) FROM generate_series(1, 10) AS i;
SQL
q -c "SELECT idem_schedule_purge('* * * * *')" >/dev/null
q -c "SELECT idem_schedule_purge('* * * * *')" >/dev/null
jobs=$(q -c "SELECT count(*) FROM cron.job WHERE jobname = 'idempotency-purge:postgres'")
[[ $jobs == 1 ]] || { echo "pg_cron: expected one job after scheduling twice, found $jobs"; exit 1; }
echo "pg_cron: one job after two idem_schedule_purge calls; waiting for it to run (pg_cron schedules by the minute)"
for _ in $(seq 1 150); do
  left=$(q -c "SELECT count(*) FROM idempotency.ledger")
  [[ $left == 10 ]] && break
  sleep 1
done
status=$(q -c "SELECT string_agg(DISTINCT status, ',') FROM cron.job_run_details d JOIN cron.job j USING (jobid) WHERE j.jobname = 'idempotency-purge:postgres'")
if [[ $left != 10 ]]; then
  echo "pg_cron: the job did not purge: $left claims left (expected 10); runs: ${status:-none}"
  q -c "SELECT status, return_message FROM cron.job_run_details ORDER BY runid DESC LIMIT 3"
  exit 1
fi
fresh=$(q -c "SELECT count(*) FILTER (WHERE NOT idem_claim('fresh-' || i)) FROM generate_series(1, 10) AS i")
[[ $fresh == 10 ]] || { echo "pg_cron: the purge deleted claims inside their retention"; exit 1; }
removed=$(q -c "SELECT idem_unschedule_purge()")
again=$(q -c "SELECT idem_unschedule_purge()")
[[ $removed == t && $again == f ]] || { echo "pg_cron: unschedule answered $removed then $again"; exit 1; }
echo "pg_cron: the scheduled purge ran (${status}), deleted 1000 expired claims, kept 10 fresh ones; unscheduled"
q -c "DROP EXTENSION idempotency; DROP EXTENSION pg_cron" >/dev/null
