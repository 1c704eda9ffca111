-- Retention: declared scopes, the batched purge and its pg_cron schedule.

-- idem_declare_scope and idem_forget_scope are defined in sql/idempotency--0.4.0--0.5.0.sql,
-- which runs after this file in a fresh install: their one live definition.

-- Every scope's retention and where it comes from, with one row for all undeclared scopes.
CREATE VIEW idempotency.scope_retention AS
SELECT s.scope, s.broker_retention, s.dlq_retention, s.replay_window, s.buffer,
       s.retention, s.late_replay, 'declared'::text AS source
FROM idempotency.scopes AS s
UNION ALL
SELECT '(undeclared scopes)', NULL, NULL, NULL, NULL,
       @extschema@.idem_default_retention(), 'error', 'idempotency.default_retention';
COMMENT ON VIEW idempotency.scope_retention IS 'Each declared scope''s retention, its parts and total, and the default of undeclared scopes.';

-- idem_purge, the batched purge of expired claims (and, from 0.3.0, of sent outbox messages),
-- was defined in sql/idempotency--0.2.0--0.3.0.sql and redefined in
-- sql/idempotency--0.3.0--0.4.0.sql: the live definition is the last one.

-- A run that was cancelled or failed keeps finished_at NULL; whether it is still running is
-- told by its backend: alive and executing a purge.
CREATE VIEW idempotency.purge_progress AS
SELECT p.run_id, p.pid, p.started_at, p.finished_at,
       CASE WHEN p.finished_at IS NOT NULL THEN 'finished'
            WHEN a.pid IS NULL THEN 'interrupted'
            WHEN a.query IS NULL OR a.query = '<insufficient privilege>' THEN 'unknown'
            WHEN a.state = 'active' AND a.query ~* 'idem_purge' THEN 'running'
            ELSE 'interrupted' END AS state,
       p.blocks_done, p.blocks,
       round(100.0 * p.blocks_done / GREATEST(p.blocks, 1), 1) AS percent_done,
       p.batches, p.deleted
FROM idempotency.purge_runs AS p
LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid = p.pid AND a.backend_start <= p.started_at;
COMMENT ON VIEW idempotency.purge_progress IS
  'Each purge run and its state: running, finished, or interrupted (cancelled or failed; its deletions so far are committed).';

-- pg_cron: one job per database, under a stable name, so scheduling twice keeps one job.
CREATE FUNCTION idem_schedule_purge(schedule text DEFAULT '*/10 * * * *', pause interval DEFAULT '100 ms')
RETURNS bigint LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  job_name text := 'idempotency-purge:' || current_database();
  command text := format('CALL %I.idem_purge(pause => %L)', '@extschema@', pause);
  job bigint;
BEGIN
  IF schedule IS NULL OR pause IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s must not be NULL', CASE WHEN schedule IS NULL THEN 'schedule' ELSE 'pause' END);
  END IF;
  IF pause < interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('pause must be zero or more, not %s', pause);
  END IF;
  IF to_regprocedure('cron.schedule_in_database(text,text,text,text,text,boolean)') IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '55000',
      MESSAGE = 'pg_cron is not available in this database',
      DETAIL = 'idem_schedule_purge registers the purge as a pg_cron job, and pg_cron (1.4 or later) is not installed here.',
      HINT = format('Install it (apt-get install postgresql-%s-cron), set shared_preload_libraries = ''pg_cron'' '
                    'and cron.database_name = %L in postgresql.conf, restart, then CREATE EXTENSION pg_cron. '
                    'If pg_cron lives in another database, run there: SELECT cron.schedule_in_database(%L, %L, %L, %L);',
                    current_setting('server_version_num')::int / 10000, current_database(),
                    job_name, schedule, command, current_database());
  END IF;
  EXECUTE 'SELECT cron.schedule_in_database($1, $2, $3, $4)' INTO job
    USING job_name, schedule, command, current_database();
  RETURN job;
END
$$;
COMMENT ON FUNCTION idem_schedule_purge(text, interval) IS
  'Schedules CALL idem_purge(pause => ...) with pg_cron under the job name idempotency-purge:<database>; calling it again replaces the schedule.';

CREATE FUNCTION idem_unschedule_purge()
RETURNS boolean LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  job_name text := 'idempotency-purge:' || current_database();
  found boolean;
BEGIN
  IF to_regclass('cron.job') IS NULL THEN
    RETURN false;
  END IF;
  EXECUTE 'SELECT EXISTS (SELECT FROM cron.job WHERE jobname = $1)' INTO found USING job_name;
  IF found THEN
    EXECUTE 'SELECT cron.unschedule($1::text)' USING job_name;
  END IF;
  RETURN found;
END
$$;
COMMENT ON FUNCTION idem_unschedule_purge() IS 'Removes the purge job of this database; false when there was none.';
