-- Retention: a claim has to outlive every way its message can come back.
-- retention = broker retention + DLQ retention + manual replay window + buffer.
-- Too short and a replayed month-old message runs its side effects again with no error
-- anywhere; no cleanup and the ledger grows forever.

-- Undeclared scopes keep their claims for idempotency.default_retention (7 days).  The
-- setting is known once the library is loaded (by any call), or from postgresql.conf.
SELECT idem_default_retention();
SHOW idempotency.default_retention;

-- Declaring a scope from its broker's settings: an SQS queue keeping messages 4 days,
-- its DLQ 14 days, replays done by hand within a week, and a day of buffer.
SELECT scope, broker_retention, dlq_retention, replay_window, buffer, retention, late_replay
FROM idem_declare_scope('orders', '4 days', '14 days', '7 days', '1 day');
-- Kafka topic retention of 7 days, no DLQ, a 3-day replay window; warn on late replays.
SELECT scope, retention, late_replay
FROM idem_declare_scope('events', broker_retention => '7 days', replay_window => '3 days',
                        buffer => '12 hours', late_replay => 'warn');
SELECT scope, broker_retention, dlq_retention, replay_window, buffer, retention, late_replay, source
FROM idempotency.scope_retention ORDER BY scope;

-- Bad declarations are refused with their SQLSTATE.
SELECT sqlstate_of($$SELECT idem_declare_scope(NULL, '1 day')$$);
SELECT sqlstate_of($$SELECT idem_declare_scope('x', NULL)$$);
SELECT sqlstate_of($$SELECT idem_declare_scope('x', '-1 day')$$);
SELECT sqlstate_of($$SELECT idem_declare_scope('x', '0', buffer => '0')$$);
SELECT sqlstate_of($$SELECT idem_declare_scope('x', '1 day', late_replay => 'ignore')$$);
SELECT sqlstate_of($$SELECT idem_declare_scope('', '1 day')$$);

-- Claims of several ages in three scopes.  (Backdating claimed_at stands in for time
-- passing; only the extension's owner may write the ledger like this.)
CREATE FUNCTION claim_aged(scope text, age interval, n int) RETURNS void LANGUAGE sql AS $$
  SELECT idem_claim(scope || ':' || age || ':' || i, scope) FROM generate_series(1, n) AS i;
  UPDATE idempotency.ledger SET claimed_at = now() - age
  WHERE key_digest IN (SELECT idem_digest(scope || ':' || age || ':' || i, scope) FROM generate_series(1, n) AS i);
$$;
TRUNCATE idempotency.ledger;
SELECT claim_aged('orders', '1 day', 100), claim_aged('orders', '25 days', 100), claim_aged('orders', '27 days', 100),
       claim_aged('events', '9 days', 100), claim_aged('events', '11 days', 100),
       claim_aged('undeclared', '6 days', 100), claim_aged('undeclared', '8 days', 100);
CREATE VIEW ages AS
SELECT s.scope, extract(day FROM now() - l.claimed_at)::int AS age_days, count(*) AS claims
FROM idempotency.ledger AS l
JOIN (VALUES ('orders'), ('events'), ('undeclared')) AS s(scope) ON l.scope_id = idem_scope_id(s.scope)
GROUP BY 1, 2 ORDER BY 1, 2;

-- The purge deletes exactly the claims older than their scope's retention, in batches.
CALL idem_purge(batch_blocks => 1);
SELECT * FROM ages;
SELECT state, blocks_done = blocks AS complete, batches = blocks AS one_batch_per_block, deleted, percent_done
FROM idempotency.purge_progress ORDER BY run_id DESC LIMIT 1;

-- A second purge finds nothing more to delete.
CALL idem_purge();

-- What a policy change does to claims already stored: retention is read at purge time,
-- not stamped on claims.  Shortening it exposes older claims at the next purge;
-- lengthening it protects every claim not purged yet.
SELECT retention FROM idem_declare_scope('orders', '4 days', buffer => '1 day');
CALL idem_purge();
SELECT * FROM ages WHERE scope = 'orders';
SELECT retention FROM idem_declare_scope('events', '30 days');
CALL idem_purge();
SELECT * FROM ages WHERE scope = 'events';

-- The default applies to every undeclared scope, and to a scope whose declaration is forgotten.
-- (Set for the database, where every session reads it; a SET of the purging session's own
-- is nobody else's, and the purge does not shorten anything by it.)
DO $$ BEGIN
  EXECUTE format('ALTER DATABASE %I SET idempotency.default_retention = %L', current_database(), '5d');
END $$;
SET idempotency.default_retention = '1d';
CALL idem_purge();
SELECT * FROM ages WHERE scope = 'undeclared';
SELECT idem_forget_scope('events') AS forgotten, idem_forget_scope('events') AS again;
CALL idem_purge();
SELECT * FROM ages WHERE scope = 'events';
RESET idempotency.default_retention;
DO $$ BEGIN
  EXECUTE format('ALTER DATABASE %I RESET idempotency.default_retention', current_database());
END $$;

SELECT sqlstate_of($$CALL idem_purge(0)$$);
SELECT sqlstate_of($$CALL idem_purge(pause => '-1 s')$$);
SELECT sqlstate_of($$SELECT idem_schedule_purge(pause => NULL)$$);
-- A pause between batches keeps a purge from crowding out the claims.
SELECT claim_aged('paused', '30 days', 300);
CALL idem_purge(batch_blocks => 1, pause => '1 ms');
SELECT state, batches > 1 AS several_batches FROM idempotency.purge_progress ORDER BY run_id DESC LIMIT 1;
-- A run its session no longer runs is interrupted, even while that session's current
-- statement mentions idem_purge (a new CALL, or this query): only a run the current
-- statement started is running. (An interrupted run of this session: it started as the
-- session did.)
INSERT INTO idempotency.purge_runs (blocks, started_at)
SELECT 7, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid();
SELECT state AS earlier_run_of_this_session, 'idem_purge' AS mentioned
FROM idempotency.purge_progress WHERE blocks = 7;
DELETE FROM idempotency.purge_runs WHERE blocks = 7 AND finished_at IS NULL;
-- The purge commits between batches, so it must be called outside a transaction block.
BEGIN;
CALL idem_purge();
ROLLBACK;


-- The late-replay guard: a claim may pass the message's own time.  When that time is older
-- than the scope's retention, its first delivery's claim may be purged already, so a new
-- claim cannot be trusted: ID004 instead of silently processing the message again.
SELECT sqlstate_of($$SELECT idem_claim('late-1', 'orders', NULL, now() - interval '6 days')$$);
SELECT idem_claim('late-1', 'orders', NULL, now() - interval '4 days') AS within_retention;
-- A duplicate is still recognised, however old: the guard only doubts new claims.
SELECT idem_claim('late-1', 'orders', NULL, now() - interval '60 days') AS old_duplicate;
-- Undeclared scopes use the default retention.
SELECT sqlstate_of($$SELECT idem_claim('late-2', 'undeclared', NULL, now() - interval '8 days')$$);
SELECT sqlstate_of($$SELECT * FROM idem_claim_replay('late-2', 'undeclared', NULL, now() - interval '8 days')$$);
SELECT sqlstate_of($$SELECT idem_claim_nowait('late-2', 'undeclared', NULL, now() - interval '8 days')$$);
-- A scope declared with late_replay => 'warn' processes the message and warns with ID004.
SELECT scope FROM idem_declare_scope('audit', '1 day', late_replay => 'warn');
\set VERBOSITY terse
SELECT idem_claim('late-3', 'audit', NULL, now() - interval '3 days') AS processed_with_warning;
-- A future or missing sent_at is never late.
SELECT idem_claim('late-4', 'orders', NULL, now() + interval '1 hour') AS future,
       idem_claim('late-5', 'orders', NULL, NULL) AS no_sent_at;

-- "Older" is measured from the clock, not from the transaction's start: a purge committed
-- while this transaction ran may have removed claims younger than its start. (A message
-- sent as the transaction began is 3 seconds old here, past a 2-second retention.)
SELECT scope FROM idem_declare_scope('brief', '2 seconds', buffer => '0');
BEGIN;
SELECT pg_sleep(3);
SELECT sqlstate_of($$SELECT idem_claim('late-6', 'brief', NULL, now())$$) AS sent_as_the_transaction_began;
ROLLBACK;

-- Retention is reckoned in UTC, so a day is 24 hours whatever the session's TimeZone: the
-- purge's cutoff is the same in every zone (before 0.5.0 a daylight-saving change within
-- the span moved it by an hour), and the guard's agrees with it.
BEGIN;
SET LOCAL TimeZone = 'UTC';
CREATE TEMP TABLE cutoffs ON COMMIT DROP AS
  SELECT 'UTC' AS zone, idempotency.expired_before('60 days') AS cutoff, now() - interval '60 days' AS by_hand;
SET LOCAL TimeZone = 'America/New_York';
INSERT INTO cutoffs SELECT 'America/New_York', idempotency.expired_before('60 days');
SET LOCAL TimeZone = 'Australia/Sydney';
INSERT INTO cutoffs SELECT 'Australia/Sydney', idempotency.expired_before('60 days');
SELECT count(DISTINCT cutoff) AS distinct_cutoffs, bool_and(cutoff = (SELECT by_hand FROM cutoffs WHERE zone = 'UTC')) AS as_in_utc
FROM cutoffs;
COMMIT;
SELECT scope FROM idem_declare_scope('sixty', '60 days', buffer => '0');
SET TimeZone = 'America/New_York';
SELECT sqlstate_of($$SELECT idem_claim('late-7', 'sixty', NULL, idempotency.expired_before('60 days') - interval '1 second')$$) AS just_past;
SELECT idem_claim('late-8', 'sixty', NULL, idempotency.expired_before('60 days') + interval '1 minute') AS just_within;
RESET TimeZone;

-- A role of its own may keep undeclared scopes longer (ALTER ROLE … SET): the purge, whoever
-- runs it, keeps their claims for the longest value any role of this database has.
CREATE ROLE retention_consumer;
DO $$ BEGIN
  EXECUTE format('ALTER ROLE retention_consumer IN DATABASE %I SET idempotency.default_retention = %L',
                 current_database(), '30d');
END $$;
SELECT idempotency.longest_default_retention() AS kept_by_the_purge, idem_default_retention() AS this_session;
TRUNCATE idempotency.ledger;
SELECT claim_aged('undeclared', '10 days', 5), claim_aged('undeclared', '31 days', 5);
CALL idem_purge();
SELECT * FROM ages WHERE scope = 'undeclared';
DROP ROLE retention_consumer;
SELECT idempotency.longest_default_retention() AS without_it;
-- The purging session's own shorter value (its role's, or a SET) is nobody else's either.
SET idempotency.default_retention = '1h';
SELECT idempotency.longest_default_retention() AS despite_a_short_set, idem_default_retention() AS this_session;
RESET idempotency.default_retention;

-- A maintenance role with exactly the README's grants purges too, although it may not read
-- the configuration files: its own value is the server-wide one. Before 0.5.0 its purge was
-- refused with 42501 for pg_show_all_file_settings.
CREATE ROLE purge_maintainer;
GRANT USAGE ON SCHEMA idempotency TO purge_maintainer;
GRANT SELECT, DELETE ON idempotency.ledger, idempotency.outbox, idempotency.external_calls,
                        idempotency.duplicates TO purge_maintainer;
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency.scopes, idempotency.purge_runs TO purge_maintainer;
GRANT SELECT ON idempotency.purge_progress TO purge_maintainer;
TRUNCATE idempotency.ledger;
SELECT claim_aged('undeclared', '3 days', 3), claim_aged('undeclared', '31 days', 4);
SET ROLE purge_maintainer;
SELECT has_function_privilege('pg_catalog.pg_show_all_file_settings()', 'EXECUTE') AS may_read_files,
       idempotency.longest_default_retention() AS kept_by_its_purge;
CALL idem_purge();
RESET ROLE;
SELECT * FROM ages WHERE scope = 'undeclared';
DROP OWNED BY purge_maintainer;
DROP ROLE purge_maintainer;

-- Without pg_cron in this database, scheduling says what to install and configure.
SELECT sqlstate_of($$SELECT idem_schedule_purge()$$);
SELECT idem_unschedule_purge() AS nothing_to_unschedule;
-- A schema named cron that is not pg_cron's is nobody the purge trusts: its functions of
-- pg_cron's names are never called, with the caller's rights or at all.
CREATE SCHEMA cron;
CREATE TABLE cron.job (jobname text);
INSERT INTO cron.job VALUES ('idempotency-purge:' || current_database());
CREATE FUNCTION cron.schedule_in_database(text, text, text, text, text DEFAULT NULL, boolean DEFAULT true)
RETURNS bigint LANGUAGE plpgsql AS $$ BEGIN RAISE NOTICE 'a foreign cron.schedule_in_database ran'; RETURN 1; END $$;
CREATE FUNCTION cron.unschedule(name) RETURNS boolean
LANGUAGE plpgsql AS $$ BEGIN RAISE NOTICE 'a foreign cron.unschedule ran'; RETURN true; END $$;
SELECT sqlstate_of($$SELECT idem_schedule_purge()$$) AS schedule_beside_a_foreign_cron;
SELECT idem_unschedule_purge() AS unschedule_beside_a_foreign_cron;
DROP FUNCTION cron.schedule_in_database(text, text, text, text, text, boolean), cron.unschedule(name);
DROP TABLE cron.job;
DROP SCHEMA cron;

-- A retention that an earlier release took, and idem_declare_scope now refuses, comes along
-- with an update or a restored dump (whose COPY writes idempotency.scopes as it was). Over
-- 1000 years, it keeps every claim of its scope; a negative field counts as zero, so that
-- '1 month -29 days' keeps claims a month. No claim goes before its retention, and the purge
-- and the late-replay guard go on working (before, both failed with 22008 on the first, and
-- the second put the cutoff after now() at the end of some months).
TRUNCATE idempotency.ledger;
INSERT INTO idempotency.scopes (scope, scope_id, broker_retention, dlq_retention, replay_window, buffer, late_replay)
VALUES ('legacy-eon', idem_scope_id('legacy-eon'), '10000 years', '0', '0', '1 day', 'error'),
       ('legacy-negative', idem_scope_id('legacy-negative'), '1 month -29 days', '0', '0', '0', 'error');
SELECT claim_aged('legacy-eon', '400 days', 2), claim_aged('legacy-negative', '20 days', 3),
       claim_aged('legacy-negative', '40 days', 4);
CALL idem_purge();
SELECT s.scope, extract(day FROM now() - l.claimed_at)::int AS age_days, count(*) AS claims
FROM idempotency.ledger AS l
JOIN (VALUES ('legacy-eon'), ('legacy-negative')) AS s(scope) ON l.scope_id = idem_scope_id(s.scope)
GROUP BY 1, 2 ORDER BY 1, 2;
SELECT idempotency.expired_before('10000 years') AS eon_cutoff,
       idempotency.expired_before('1 month -29 days') = idempotency.expired_before('1 month') AS negative_field_dropped,
       idempotency.expired_before('-1 day') AS nothing_kept_keeps_all;
SELECT idem_claim('legacy-late', 'legacy-eon', sent_at => now() - interval '5000 years') AS eon_trusts_an_old_message;
SELECT sqlstate_of($$SELECT idem_claim('legacy-late', 'legacy-negative', sent_at => now() - interval '35 days')$$) AS negative_field_late;
SELECT idem_claim('legacy-recent', 'legacy-negative', sent_at => now() - interval '25 days') AS negative_field_in_time;
DELETE FROM idempotency.ledger WHERE scope_id IN (idem_scope_id('legacy-eon'), idem_scope_id('legacy-negative'));
DELETE FROM idempotency.scopes WHERE scope LIKE 'legacy-%';
