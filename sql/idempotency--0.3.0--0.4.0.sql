-- idempotency 0.3.0 -> 0.4.0: watermarks for ordered streams, keys for external APIs (#12).
-- Nothing stored before changes.
--
-- Like the script before it, this one is also the last part of a fresh install's script
-- (src/lib.rs): an update and a new install create the very same objects.

-- Watermarks: how far each partition of an ordered stream has been applied. One row per
-- (stream, partition), however many messages: nothing to purge. Names compare byte for byte
-- ("C"), as the broker's own names do.
CREATE TABLE idempotency.watermarks (
    stream      pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    partition   pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    position    pg_catalog.numeric     NOT NULL,
    advanced_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT watermarks_pkey PRIMARY KEY (stream, partition)
);
COMMENT ON TABLE idempotency.watermarks IS
  'The position up to which each (stream, partition) has been applied, advanced by idem_watermark_advance in the consumer''s transaction.';
-- A restored database resumes where the dumped one stood.
SELECT pg_catalog.pg_extension_config_dump('idempotency.watermarks', '');
REVOKE ALL ON TABLE idempotency.watermarks FROM PUBLIC;

CREATE FUNCTION idem_watermark_advance(stream text, partition text, pos numeric)
RETURNS boolean LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'idem_watermark_advance_entry';
COMMENT ON FUNCTION idem_watermark_advance(text, text, numeric) IS
  'Advances (stream, partition) to pos in the current transaction: true when pos is beyond the stored position (or the first one), false for a duplicate or an older position.';

-- Kafka numbers its partitions, and drivers send a number as int2, int4 or int8: partition 3
-- is partition '3'. (An unknown-typed argument resolves to the text form.)
CREATE FUNCTION idem_watermark_advance(stream text, partition bigint, pos numeric)
RETURNS boolean LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'idem_watermark_advance_numbered_entry';
COMMENT ON FUNCTION idem_watermark_advance(text, bigint, numeric) IS
  'idem_watermark_advance with a numbered partition: partition 3 is partition ''3''.';

-- An LSN is a position too, but pg_lsn beside numeric would make an untyped position
-- ambiguous (42725): it has a function of its own, over the same numeric positions.
CREATE FUNCTION idem_watermark_advance_lsn(stream text, partition text, lsn pg_lsn)
RETURNS boolean LANGUAGE sql VOLATILE PARALLEL UNSAFE
RETURN @extschema@.idem_watermark_advance(stream, partition, lsn OPERATOR(pg_catalog.-) '0/0'::pg_catalog.pg_lsn);
COMMENT ON FUNCTION idem_watermark_advance_lsn(text, text, pg_lsn) IS
  'idem_watermark_advance for a change-data-capture position: the LSN''s byte position.';

CREATE FUNCTION idem_watermark(stream text, partition text)
RETURNS numeric LANGUAGE c VOLATILE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'idem_watermark_entry';
COMMENT ON FUNCTION idem_watermark(text, text) IS
  'The position (stream, partition) has been applied up to, to resume after; NULL before its first advance.';

CREATE FUNCTION idem_watermark(stream text, partition bigint)
RETURNS numeric LANGUAGE c VOLATILE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'idem_watermark_numbered_entry';
COMMENT ON FUNCTION idem_watermark(text, bigint) IS
  'idem_watermark with a numbered partition.';

CREATE FUNCTION idem_watermark_lsn(stream text, partition text)
RETURNS pg_lsn LANGUAGE sql VOLATILE PARALLEL SAFE
RETURN '0/0'::pg_catalog.pg_lsn OPERATOR(pg_catalog.+) @extschema@.idem_watermark(stream, partition);
COMMENT ON FUNCTION idem_watermark_lsn(text, text) IS
  'idem_watermark as an LSN.';

-- Keys for external APIs ------------------------------------------------------------------

CREATE FUNCTION idem_external_key(key text, scope text DEFAULT 'default', step text DEFAULT 'default')
RETURNS text LANGUAGE c IMMUTABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'idem_external_key_entry';
COMMENT ON FUNCTION idem_external_key(text, text, text) IS
  'The idempotency key to send an external API for one step of processing (scope, key): the same on every redelivery, replay and backfill. 36 characters: the text of idem_external_uuid.';

CREATE FUNCTION idem_external_uuid(key text, scope text DEFAULT 'default', step text DEFAULT 'default')
RETURNS uuid LANGUAGE c IMMUTABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'idem_external_uuid_entry';
COMMENT ON FUNCTION idem_external_uuid(text, text, text) IS
  'idem_external_key as a uuid, for APIs that take one.';

-- The external-call ledger, for APIs that take no idempotency key. A call is never begun (no
-- row), begun (confirmed_at NULL: it may or may not have happened), or confirmed (its
-- response stored, for every redelivery to reuse). idem_call_begin and idem_call_confirm run
-- in transactions of their own, so that "begun" is committed before the call is made.
CREATE TABLE idempotency.external_calls (
    call_key     pg_catalog.uuid        NOT NULL,
    scope        pg_catalog.text        NOT NULL,
    key          pg_catalog.text        NOT NULL,
    step         pg_catalog.text        NOT NULL,
    begun_at     pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    confirmed_at pg_catalog.timestamptz,
    response     pg_catalog.jsonb,
    pid          pg_catalog.int4        NOT NULL,
    backend_start pg_catalog.timestamptz NOT NULL,
    CONSTRAINT external_calls_pkey PRIMARY KEY (call_key)
);
COMMENT ON TABLE idempotency.external_calls IS
  'External calls begun (idem_call_begin) before they were made, and confirmed (idem_call_confirm) with their responses after; call_key is idem_external_uuid(key, scope, step).';
SELECT pg_catalog.pg_extension_config_dump('idempotency.external_calls', '');
REVOKE ALL ON TABLE idempotency.external_calls FROM PUBLIC;

-- The calls to reconcile: begun longer ago than idempotency.unconfirmed_after (one minute
-- unless set) and never confirmed. Each may or may not have happened; someone checks the
-- API and says which with idem_call_resolve. consumer_connected: whether the session that
-- began the call is still connected (so perhaps still calling); NULL where this role may not
-- see that session (pg_read_all_stats may).
CREATE VIEW idempotency.unconfirmed_calls AS
SELECT c.scope, c.key, c.step, c.call_key, c.begun_at, pg_catalog.now() OPERATOR(pg_catalog.-) c.begun_at AS waiting,
       CASE WHEN a.pid IS NULL THEN false ELSE a.backend_start OPERATOR(pg_catalog.=) c.backend_start END AS consumer_connected
FROM idempotency.external_calls AS c
LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid OPERATOR(pg_catalog.=) c.pid
WHERE c.confirmed_at IS NULL
  AND c.begun_at OPERATOR(pg_catalog.<=) (pg_catalog.now() OPERATOR(pg_catalog.-) COALESCE(
        NULLIF(pg_catalog.current_setting('idempotency.unconfirmed_after', true), ''), '1min')::pg_catalog.interval);
COMMENT ON VIEW idempotency.unconfirmed_calls IS
  'External calls begun more than idempotency.unconfirmed_after ago and not confirmed: they may or may not have happened. Resolve each with idem_call_resolve.';
REVOKE ALL ON TABLE idempotency.unconfirmed_calls FROM PUBLIC;

CREATE FUNCTION idem_call_begin(key text, scope text DEFAULT 'default', step text DEFAULT 'default')
RETURNS TABLE (state text, call_key text, response jsonb, begun_at timestamptz)
LANGUAGE c VOLATILE PARALLEL UNSAFE ROWS 1
AS 'MODULE_PATHNAME', 'idem_call_begin_entry';
COMMENT ON FUNCTION idem_call_begin(text, text, text) IS
  'Records that the external call for (key, scope, step) is begun, committed before it returns: state ''new'' (make the call), ''in_doubt'' (begun before and never confirmed: do not call; reconcile) or ''confirmed'' (reuse response). Raises 25001 inside a transaction block.';

CREATE FUNCTION idem_call_confirm(key text, scope text, step text, response jsonb)
RETURNS boolean LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'idem_call_confirm_entry';
COMMENT ON FUNCTION idem_call_confirm(text, text, text, jsonb) IS
  'Stores the response of a begun external call, committed before it returns: true, or false when it was confirmed already (the first response stays). Raises ID003 for a call never begun, 25001 inside a transaction block.';

CREATE FUNCTION idem_call_resolve(key text, scope text, step text, happened boolean, response jsonb DEFAULT NULL)
RETURNS void LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'idem_call_resolve_entry';
COMMENT ON FUNCTION idem_call_resolve(text, text, text, boolean, jsonb) IS
  'Settles an unconfirmed external call: happened => true with the response the API gave, or happened => false to forget it, so that it may be made again.';

-- Ledger estimates -------------------------------------------------------------------------

-- Per scope: the claims the ledger holds, those made in the last `since`, and their share of
-- its bytes, counted in a sample of at most 10,000 of its blocks (all of them when it is
-- smaller, so small ledgers are counted exactly), never by a full scan of a large one.
CREATE FUNCTION idempotency.ledger_estimate(since interval)
RETURNS TABLE (scope_id bigint, claims bigint, claims_since bigint, bytes bigint)
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
DECLARE
  blocks pg_catalog.float8 := GREATEST(pg_catalog.pg_relation_size('idempotency.ledger'::pg_catalog.regclass)
                                        OPERATOR(pg_catalog./) pg_catalog.current_setting('block_size')::pg_catalog.float8, 1);
  percent pg_catalog.float8 := LEAST(100, 100 OPERATOR(pg_catalog.*) 10000 OPERATOR(pg_catalog./) blocks);
BEGIN
  RETURN QUERY
  WITH sampled AS (
    SELECT l.scope_id AS id, pg_catalog.count(*) AS n,
           pg_catalog.count(*) FILTER (WHERE l.claimed_at OPERATOR(pg_catalog.>=) (pg_catalog.now() OPERATOR(pg_catalog.-) since)) AS n_since
    FROM idempotency.ledger AS l TABLESAMPLE SYSTEM (percent)
    GROUP BY l.scope_id
  )
  SELECT x.id,
         pg_catalog.round(x.n OPERATOR(pg_catalog.*) 100 OPERATOR(pg_catalog./) percent)::pg_catalog.int8,
         pg_catalog.round(x.n_since OPERATOR(pg_catalog.*) 100 OPERATOR(pg_catalog./) percent)::pg_catalog.int8,
         pg_catalog.round(pg_catalog.pg_total_relation_size('idempotency.ledger'::pg_catalog.regclass)
               OPERATOR(pg_catalog.*) x.n::pg_catalog.float8 OPERATOR(pg_catalog./) (pg_catalog.sum(x.n) OVER ()))::pg_catalog.int8
  FROM sampled AS x;
END
$$;
COMMENT ON FUNCTION idempotency.ledger_estimate(interval) IS
  'Per scope_id: claims held, claims made in the last `since`, and their share of the ledger''s bytes, from a sample of at most 10,000 blocks.';

-- Diagnostics --------------------------------------------------------------------------------

-- Every duplicate a claim suppressed while idempotency.diagnostics was on: one row each, so no
-- row is written by every consumer of a scope. The delay from the first claim to a duplicate
-- names its likely source (idem_diagnostics). idem_purge keeps idempotency.diagnostics_retention.
-- Only claims write it (src/diagnostics.rs), as the table's owner: no role needs a privilege.
CREATE TABLE idempotency.duplicates (
    seen_at          pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    first_claimed_at pg_catalog.timestamptz NOT NULL,
    scope_id         pg_catalog.int8        NOT NULL,
    key_digest       pg_catalog.uuid        NOT NULL,
    scope            pg_catalog.text        NOT NULL
);
CREATE INDEX duplicates_seen_at ON idempotency.duplicates (seen_at);
COMMENT ON TABLE idempotency.duplicates IS
  'Duplicates suppressed by claims while idempotency.diagnostics was on: when, the first claim''s time, and which key (key_digest = idem_digest(key, scope)).';
REVOKE ALL ON TABLE idempotency.duplicates FROM PUBLIC;


-- Per scope over the last `since`: first claims (counted in the ledger, from a sample of at
-- most 10,000 of its blocks when it is larger), duplicates, the delay from first claim to
-- duplicate, and the source that the delays point to when at least half of them cluster near
-- one of the deadlines below.
CREATE FUNCTION idem_diagnostics(since interval DEFAULT '1 day')
RETURNS TABLE (scope text, first_claims bigint, duplicates bigint,
               delay_p50 interval, delay_p95 interval, delay_p99 interval, delay_max interval,
               likely_source text, hint text)
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
BEGIN
  IF since IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004', MESSAGE = 'since must not be NULL';
  END IF;
  IF since OPERATOR(pg_catalog.<=) '0'::pg_catalog.interval THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = pg_catalog.format('since must be a positive interval, not %s', COALESCE(since::pg_catalog.text, 'NULL'));
  END IF;
  RETURN QUERY
  WITH d AS (
    SELECT x.scope_id, x.scope, x.seen_at OPERATOR(pg_catalog.-) x.first_claimed_at AS delay
    FROM idempotency.duplicates AS x
    WHERE x.seen_at OPERATOR(pg_catalog.>=) (pg_catalog.now() OPERATOR(pg_catalog.-) since)
  ), bucketed AS (
    SELECT d.*, CASE
      WHEN d.delay OPERATOR(pg_catalog.<) '1 second' THEN 'retry'
      WHEN d.delay OPERATOR(pg_catalog.>=) '20 seconds' AND d.delay OPERATOR(pg_catalog.<) '45 seconds' THEN 'sqs'
      WHEN d.delay OPERATOR(pg_catalog.>=) '4 minutes' AND d.delay OPERATOR(pg_catalog.<) '7 minutes' THEN 'kafka'
      WHEN d.delay OPERATOR(pg_catalog.>=) '25 minutes' AND d.delay OPERATOR(pg_catalog.<) '40 minutes' THEN 'rabbitmq'
      WHEN d.delay OPERATOR(pg_catalog.>=) '1 day' THEN 'replay'
    END AS bucket
    FROM d
  ), per_scope AS (
    SELECT b.scope_id, pg_catalog.max(b.scope) AS scope, pg_catalog.count(*) AS duplicates,
           pg_catalog.percentile_disc(0.5) WITHIN GROUP (ORDER BY b.delay) AS p50,
           pg_catalog.percentile_disc(0.95) WITHIN GROUP (ORDER BY b.delay) AS p95,
           pg_catalog.percentile_disc(0.99) WITHIN GROUP (ORDER BY b.delay) AS p99,
           pg_catalog.max(b.delay) AS dmax
    FROM bucketed AS b GROUP BY b.scope_id
  ), top_bucket AS (
    SELECT DISTINCT ON (b.scope_id) b.scope_id, b.bucket, pg_catalog.count(*) AS n
    FROM bucketed AS b WHERE b.bucket IS NOT NULL
    GROUP BY b.scope_id, b.bucket
    ORDER BY b.scope_id, pg_catalog.count(*) DESC, b.bucket
  ), claims AS (
    SELECT e.scope_id, e.claims_since AS n FROM idempotency.ledger_estimate(since) AS e
    WHERE e.claims_since OPERATOR(pg_catalog.>) 0
  )
  SELECT COALESCE(p.scope, s.scope, c.scope_id::pg_catalog.text),
         COALESCE(c.n, 0), COALESCE(p.duplicates, 0), p.p50, p.p95, p.p99, p.dmax,
         CASE t.bucket
           WHEN 'retry' THEN 'producer retry or concurrent redelivery'
           WHEN 'sqs' THEN 'SQS visibility timeout'
           WHEN 'kafka' THEN 'Kafka max.poll.interval.ms'
           WHEN 'rabbitmq' THEN 'RabbitMQ consumer_timeout'
           WHEN 'replay' THEN 'DLQ replay or backfill'
         END,
         CASE WHEN t.bucket IS NOT NULL THEN
         pg_catalog.format('%s%% of duplicates came %s the first claim: %s', pg_catalog.round(100.0 OPERATOR(pg_catalog.*) t.n OPERATOR(pg_catalog./) p.duplicates),
           CASE t.bucket
             WHEN 'retry' THEN 'within a second of'
             WHEN 'sqs' THEN 'about 30 s after'
             WHEN 'kafka' THEN 'about 5 min after'
             WHEN 'rabbitmq' THEN 'about 30 min after'
             WHEN 'replay' THEN 'a day or more after'
           END,
           CASE t.bucket
             WHEN 'retry' THEN 'a producer sent the message twice (publish retried after a lost confirm), or the broker redelivered it to a second consumer at once. Both are expected; the claim handles them.'
             WHEN 'sqs' THEN 'processing outlasts the queue''s visibility timeout (SQS: 30 s by default), so the message becomes visible again. Raise the timeout above the longest handler run, or extend it while processing.'
             WHEN 'kafka' THEN 'a consumer exceeded max.poll.interval.ms (5 min by default) and was removed from the group, so its partitions were reassigned and replayed from the last committed offset. Poll more often or take smaller batches.'
             WHEN 'rabbitmq' THEN 'a delivery stayed unacknowledged past RabbitMQ''s consumer_timeout (30 min by default), which closes the channel and requeues it. Ack sooner or raise the timeout.'
             WHEN 'replay' THEN 'messages were replayed from a dead-letter queue or a backfill. Check that retention covers the replay window (idem_declare_scope).'
           END) END
  FROM per_scope AS p
  FULL JOIN claims AS c ON c.scope_id OPERATOR(pg_catalog.=) p.scope_id
  LEFT JOIN idempotency.scopes AS s ON s.scope_id OPERATOR(pg_catalog.=) COALESCE(p.scope_id, c.scope_id)
  LEFT JOIN top_bucket AS t ON t.scope_id OPERATOR(pg_catalog.=) p.scope_id
       AND t.n OPERATOR(pg_catalog.*) 2 OPERATOR(pg_catalog.>=) p.duplicates
  ORDER BY 1;
END
$$;
COMMENT ON FUNCTION idem_diagnostics(interval) IS
  'Per scope over the last `since`: first claims, duplicates suppressed (recorded while idempotency.diagnostics is on), percentiles of the delay from first claim to duplicate, and the likely source of the duplicates when their delays cluster near a known deadline.';

CREATE VIEW idempotency.diagnostics AS SELECT * FROM @extschema@.idem_diagnostics();
COMMENT ON VIEW idempotency.diagnostics IS 'idem_diagnostics() over the last day.';

-- Size budgets ---------------------------------------------------------------------------------

-- Retention bounds a claim's age, not the ledger's size: at a high enough rate, claims younger
-- than the retention alone can outgrow the disk. A declared scope may set a row budget;
-- idempotency.scope_sizes shows each scope's size now and where its rate takes it, and
-- idem_purge warns (ID005) about every scope over its budget.
ALTER TABLE idempotency.scopes ADD COLUMN row_budget pg_catalog.int8
    CONSTRAINT scopes_row_budget_check CHECK (row_budget OPERATOR(pg_catalog.>=) 1);

CREATE FUNCTION idem_scope_budget(scope text, row_budget bigint)
RETURNS idempotency.scopes
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  declared idempotency.scopes;
BEGIN
  IF scope IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004', MESSAGE = 'scope must not be NULL';
  END IF;
  IF row_budget OPERATOR(pg_catalog.<) 1 THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pg_catalog.format('row_budget must be at least 1, not %s', row_budget),
      HINT = 'Pass NULL to remove the budget.';
  END IF;
  UPDATE idempotency.scopes AS s SET row_budget = idem_scope_budget.row_budget
   WHERE s.scope OPERATOR(pg_catalog.=) idem_scope_budget.scope
  RETURNING s.* INTO declared;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = '42704', MESSAGE = pg_catalog.format('scope "%s" is not declared', scope),
      HINT = 'Declare it with idem_declare_scope first: a budget belongs to a declared scope.';
  END IF;
  RETURN declared;
END
$$;
COMMENT ON FUNCTION idem_scope_budget(text, bigint) IS
  'Sets (or, with NULL, removes) the row budget of a declared scope: idem_purge warns with ID005 while the scope holds more claims.';

-- Each scope's size beside its retention: claims and bytes now, claims of the last day, the
-- steady state they lead to (claims per day x retention), and the budget. A view of its own,
-- so that reading idempotency.scope_retention stays cheap and needs no privilege it did not
-- need before; this one reads the ledger with its owner's rights, from a sample of at most
-- 10,000 blocks (all of them when it is smaller: small ledgers are counted exactly).
CREATE VIEW idempotency.scope_sizes AS
WITH p AS (
  SELECT LEAST(100, 100 OPERATOR(pg_catalog.*) 10000 OPERATOR(pg_catalog./)
               GREATEST(pg_catalog.pg_relation_size('idempotency.ledger'::pg_catalog.regclass)
                        OPERATOR(pg_catalog./) pg_catalog.current_setting('block_size')::pg_catalog.float8, 1)) AS percent
), sampled AS (
  SELECT l.scope_id, pg_catalog.count(*) AS n,
         pg_catalog.count(*) FILTER (WHERE l.claimed_at OPERATOR(pg_catalog.>=)
                                     (pg_catalog.now() OPERATOR(pg_catalog.-) '1 day'::pg_catalog.interval)) AS n_day
  FROM idempotency.ledger AS l TABLESAMPLE SYSTEM ((SELECT p.percent FROM p))
  GROUP BY l.scope_id
), e AS (
  SELECT x.scope_id,
         pg_catalog.round(x.n OPERATOR(pg_catalog.*) 100 OPERATOR(pg_catalog./) p.percent)::pg_catalog.int8 AS claims,
         pg_catalog.round(x.n_day OPERATOR(pg_catalog.*) 100 OPERATOR(pg_catalog./) p.percent)::pg_catalog.int8 AS claims_day,
         pg_catalog.round(pg_catalog.pg_total_relation_size('idempotency.ledger'::pg_catalog.regclass)
               OPERATOR(pg_catalog.*) x.n::pg_catalog.float8 OPERATOR(pg_catalog./) (pg_catalog.sum(x.n) OVER ()))::pg_catalog.int8 AS bytes
  FROM sampled AS x, p
)
SELECT s.scope, s.retention,
       COALESCE(e.claims, 0) AS claims_now, COALESCE(e.bytes, 0) AS bytes_now,
       COALESCE(e.claims_day, 0) AS claims_per_day,
       pg_catalog.round(COALESCE(e.claims_day, 0) OPERATOR(pg_catalog.*)
             pg_catalog.date_part('epoch', s.retention) OPERATOR(pg_catalog./) 86400)::pg_catalog.int8 AS projected_claims,
       s.row_budget,
       COALESCE(e.claims, 0) OPERATOR(pg_catalog.>) s.row_budget AS over_budget
FROM idempotency.scopes AS s
LEFT JOIN e ON e.scope_id OPERATOR(pg_catalog.=) s.scope_id
UNION ALL
SELECT '(undeclared scopes)', @extschema@.idem_default_retention(),
       COALESCE(pg_catalog.sum(e.claims), 0)::pg_catalog.int8, COALESCE(pg_catalog.sum(e.bytes), 0)::pg_catalog.int8,
       COALESCE(pg_catalog.sum(e.claims_day), 0)::pg_catalog.int8,
       pg_catalog.round(COALESCE(pg_catalog.sum(e.claims_day), 0) OPERATOR(pg_catalog.*)
             pg_catalog.date_part('epoch', @extschema@.idem_default_retention()) OPERATOR(pg_catalog./) 86400)::pg_catalog.int8,
       NULL, NULL
FROM e
WHERE NOT EXISTS (SELECT FROM idempotency.scopes AS s WHERE s.scope_id OPERATOR(pg_catalog.=) e.scope_id);
COMMENT ON VIEW idempotency.scope_sizes IS
  'Per declared scope (and for all undeclared ones): estimated claims and bytes now, claims of the last day, the steady-state claims they lead to (claims per day x retention), the row budget and whether it is exceeded.';
REVOKE ALL ON TABLE idempotency.scope_sizes FROM PUBLIC;

CREATE FUNCTION idem_diagnostics_retention()
RETURNS interval LANGUAGE c STABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'idem_diagnostics_retention_wrapper';
COMMENT ON FUNCTION idem_diagnostics_retention() IS
  'How long recorded duplicates stay in idempotency.duplicates before idem_purge removes them: the setting idempotency.diagnostics_retention.';

-- The purge, from 0.4.0 over four tables, each walked in ranges of heap blocks with a commit
-- after every range (see 0.3.0's definition for why): expired claims; outbox messages sent
-- longer than idempotency.outbox_retention ago; external calls confirmed longer ago than their
-- scope's retention (a redelivery up to then must still find the response; calls never
-- confirmed are kept until someone resolves them); duplicates recorded longer than
-- idempotency.diagnostics_retention ago.
CREATE OR REPLACE PROCEDURE idem_purge(batch_blocks integer DEFAULT 256, pause interval DEFAULT '0',
                            INOUT deleted bigint DEFAULT NULL)
LANGUAGE plpgsql
AS $$
DECLARE
  tables pg_catalog.regclass[] := ARRAY['idempotency.ledger', 'idempotency.outbox', 'idempotency.external_calls',
                                        'idempotency.duplicates']::pg_catalog.regclass[];
  sizes pg_catalog.int8[] := '{}';
  run bigint;
  total_blocks bigint := 0;
  done_blocks bigint := 0;
  table_start bigint;
  phase integer;
  over_budget record;
  first_block bigint;
  last_block bigint;
  removed bigint;
BEGIN
  IF batch_blocks IS NULL OR batch_blocks OPERATOR(pg_catalog.<) 1 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = pg_catalog.format('batch_blocks must be at least 1, not %s', COALESCE(batch_blocks::pg_catalog.text, 'NULL'));
  END IF;
  IF pause IS NULL OR pause OPERATOR(pg_catalog.<) '0'::pg_catalog.interval THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = pg_catalog.format('pause must be zero or more, not %s', COALESCE(pause::pg_catalog.text, 'NULL'));
  END IF;
  deleted := 0;
  -- Blocks are counted across the tables, in the order above.
  FOR phase IN 1 .. pg_catalog.array_length(tables, 1) LOOP
    sizes := sizes OPERATOR(pg_catalog.||) (pg_catalog.pg_relation_size(tables[phase])
             OPERATOR(pg_catalog./) pg_catalog.current_setting('block_size')::pg_catalog.int8);
    total_blocks := total_blocks OPERATOR(pg_catalog.+) sizes[phase];
  END LOOP;
  INSERT INTO idempotency.purge_runs (blocks) VALUES (total_blocks) RETURNING run_id INTO run;
  COMMIT;
  phase := 1;
  table_start := 0;
  WHILE done_blocks OPERATOR(pg_catalog.<) total_blocks LOOP
    -- (Operators written OPERATOR(...) all bind alike, left to right: hence the parentheses.)
    WHILE done_blocks OPERATOR(pg_catalog.>=) (table_start OPERATOR(pg_catalog.+) sizes[phase]) LOOP
      table_start := table_start OPERATOR(pg_catalog.+) sizes[phase];
      phase := phase OPERATOR(pg_catalog.+) 1;
    END LOOP;
    first_block := done_blocks OPERATOR(pg_catalog.-) table_start;
    -- The last table's range is open-ended: it catches the blocks it grew by meanwhile.
    last_block := CASE WHEN phase OPERATOR(pg_catalog.=) pg_catalog.array_length(tables, 1)
                       THEN first_block OPERATOR(pg_catalog.+) batch_blocks
                       ELSE LEAST(first_block OPERATOR(pg_catalog.+) batch_blocks, sizes[phase]) END;
    IF phase OPERATOR(pg_catalog.=) 1 THEN
      DELETE FROM idempotency.ledger AS l
      WHERE l.ctid OPERATOR(pg_catalog.>=) pg_catalog.format('(%s,0)', first_block)::pg_catalog.tid
        AND l.ctid OPERATOR(pg_catalog.<) pg_catalog.format('(%s,0)', last_block)::pg_catalog.tid
        AND l.claimed_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) COALESCE(
              (SELECT s.retention FROM idempotency.scopes AS s WHERE s.scope_id OPERATOR(pg_catalog.=) l.scope_id),
              @extschema@.idem_default_retention()));
    ELSIF phase OPERATOR(pg_catalog.=) 2 THEN
      DELETE FROM idempotency.outbox AS o
      WHERE o.ctid OPERATOR(pg_catalog.>=) pg_catalog.format('(%s,0)', first_block)::pg_catalog.tid
        AND o.ctid OPERATOR(pg_catalog.<) pg_catalog.format('(%s,0)', last_block)::pg_catalog.tid
        AND o.sent_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) @extschema@.idem_outbox_retention());
    ELSIF phase OPERATOR(pg_catalog.=) 3 THEN
      DELETE FROM idempotency.external_calls AS c
      WHERE c.ctid OPERATOR(pg_catalog.>=) pg_catalog.format('(%s,0)', first_block)::pg_catalog.tid
        AND c.ctid OPERATOR(pg_catalog.<) pg_catalog.format('(%s,0)', last_block)::pg_catalog.tid
        AND c.confirmed_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) COALESCE(
              (SELECT s.retention FROM idempotency.scopes AS s WHERE s.scope OPERATOR(pg_catalog.=) c.scope),
              @extschema@.idem_default_retention()));
    ELSE
      DELETE FROM idempotency.duplicates AS d
      WHERE d.ctid OPERATOR(pg_catalog.>=) pg_catalog.format('(%s,0)', first_block)::pg_catalog.tid
        AND d.ctid OPERATOR(pg_catalog.<) pg_catalog.format('(%s,0)', last_block)::pg_catalog.tid
        AND d.seen_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) @extschema@.idem_diagnostics_retention());
    END IF;
    GET DIAGNOSTICS removed = ROW_COUNT;
    deleted := deleted OPERATOR(pg_catalog.+) removed;
    done_blocks := LEAST(table_start OPERATOR(pg_catalog.+) last_block, total_blocks);
    UPDATE idempotency.purge_runs AS p
       SET blocks_done = done_blocks,
           batches = p.batches OPERATOR(pg_catalog.+) 1, deleted = p.deleted OPERATOR(pg_catalog.+) removed
     WHERE p.run_id OPERATOR(pg_catalog.=) run;
    COMMIT;
    IF pause OPERATOR(pg_catalog.>) '0'::pg_catalog.interval
       AND done_blocks OPERATOR(pg_catalog.<) total_blocks THEN
      PERFORM pg_catalog.pg_sleep(pg_catalog.date_part('epoch', pause));
    END IF;
  END LOOP;
  UPDATE idempotency.purge_runs AS p SET finished_at = pg_catalog.clock_timestamp()
   WHERE p.run_id OPERATOR(pg_catalog.=) run;
  -- The history keeps a month of runs, interrupted ones included.
  DELETE FROM idempotency.purge_runs AS p
   WHERE p.started_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) '30 days'::pg_catalog.interval);
  COMMIT;
  -- What is left once everything expired is gone: a scope still over its budget keeps
  -- growing faster than its retention lets it shrink.
  -- (Read from the scopes and the ledger, which a maintenance role may read, not through a view.)
  FOR over_budget IN
      SELECT sc.scope, e.claims, sc.row_budget,
             pg_catalog.round(e.claims_since OPERATOR(pg_catalog.*) pg_catalog.date_part('epoch', sc.retention)
                              OPERATOR(pg_catalog./) 86400)::pg_catalog.int8 AS projected
      FROM idempotency.scopes AS sc
      JOIN idempotency.ledger_estimate('1 day') AS e ON e.scope_id OPERATOR(pg_catalog.=) sc.scope_id
      WHERE e.claims OPERATOR(pg_catalog.>) sc.row_budget LOOP
    RAISE WARNING USING ERRCODE = 'ID005',
      MESSAGE = pg_catalog.format('scope "%s" holds about %s claims, over its budget of %s',
                                  over_budget.scope, over_budget.claims, over_budget.row_budget),
      DETAIL = pg_catalog.format('At its rate of the last day it would hold about %s claims for its retention.', over_budget.projected),
      HINT = 'Its claims arrive faster than they expire. Shorten its retention (idem_declare_scope), raise the budget (idem_scope_budget), or find out why its rate grew (idem_diagnostics).';
  END LOOP;
END
$$;
COMMENT ON PROCEDURE idem_purge(integer, interval, bigint) IS
  'Deletes expired claims, outbox messages sent longer than idempotency.outbox_retention ago, external calls confirmed longer ago than their scope''s retention, and duplicates recorded longer than idempotency.diagnostics_retention ago, in batches of batch_blocks heap blocks, committing (then pausing) after each; then warns (ID005) about every scope over its row budget. CALL it outside a transaction block. Progress: idempotency.purge_progress.';
