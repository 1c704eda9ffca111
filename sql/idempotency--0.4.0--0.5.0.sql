-- idempotency 0.4.0 -> 0.5.0: hostile input refused where it was taken (#15). Nothing stored
-- before changes.
--
-- Like the scripts before it, this one is also the last part of a fresh install's script
-- (src/lib.rs): an update and a new install create the very same objects.

-- A declared retention is at most 1000 years: the purge and the late-replay guard compute
-- now() - retention, which leaves the timestamp range near 6700 years, and a scope declared
-- with more made every purge of the database fail with 22008 from then on. Parts are checked
-- one by one first, since their sum can leave the interval range, and no field of a part may
-- be negative: '7000 years -2520000 days' compares equal to zero (months count 30 days), yet
-- subtracting it from now() takes the 7000 years first. A scope name is at most
-- 1024 bytes, as a stream's: the scopes table's primary key could not index a longer one.
-- Messages quote at most 64 characters of what they were given, as the functions in C do
-- (with an ASCII "...": the script and its constants must also parse in other encodings).
CREATE OR REPLACE FUNCTION idem_declare_scope(
    scope            text,
    broker_retention interval,
    dlq_retention    interval DEFAULT '0',
    replay_window    interval DEFAULT '0',
    buffer           interval DEFAULT '1 day',
    late_replay      text     DEFAULT 'error')
RETURNS idempotency.scopes
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  declared idempotency.scopes;
  part record;
  longest constant interval := '1000 years';
  total interval;
  -- What messages quote of the scope.
  shown text := CASE WHEN length(scope) > 64 THEN left(scope, 64) || '...' ELSE scope END;
BEGIN
  IF scope IS NULL OR late_replay IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s must not be NULL', CASE WHEN scope IS NULL THEN 'scope' ELSE 'late_replay' END);
  END IF;
  IF octet_length(scope) > 1024 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('a declared scope name is at most 1024 bytes, not %s', octet_length(scope));
  END IF;
  FOR part IN SELECT * FROM (VALUES ('broker_retention', broker_retention), ('dlq_retention', dlq_retention),
                                    ('replay_window', replay_window), ('buffer', buffer)) AS p(name, value) LOOP
    IF part.value IS NULL THEN
      RAISE EXCEPTION USING ERRCODE = '22004', MESSAGE = format('%s must not be NULL', part.name),
        HINT = 'Use ''0'' for a part that does not apply.';
    END IF;
    -- A part with no negative field is never below zero, whatever its total.
    IF extract(year FROM part.value) < 0 OR extract(month FROM part.value) < 0
       OR extract(day FROM part.value) < 0 OR part.value - date_trunc('day', part.value) < interval '0' THEN
      RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('%s must not be negative, not %s', part.name, part.value),
        HINT = 'Each of its years, months, days and time must be zero or more.';
    END IF;
    IF part.value > longest THEN
      RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('%s must be at most %s, not %s', part.name, longest, part.value);
    END IF;
  END LOOP;
  total := broker_retention + dlq_retention + replay_window + buffer;
  IF total <= interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('retention of scope "%s" must be longer than zero', shown);
  END IF;
  IF total > longest THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('retention of scope "%s" must be at most %s, not %s', shown, longest, total);
  END IF;
  IF late_replay NOT IN ('error', 'warn') THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('late_replay must be ''error'' or ''warn'', not %L',
                       CASE WHEN length(late_replay) > 64 THEN left(late_replay, 64) || '...' ELSE late_replay END);
  END IF;
  INSERT INTO idempotency.scopes AS s
         (scope, scope_id, broker_retention, dlq_retention, replay_window, buffer, late_replay)
  VALUES (scope, @extschema@.idem_scope_id(scope), broker_retention, dlq_retention, replay_window, buffer, late_replay)
  ON CONFLICT ON CONSTRAINT scopes_pkey DO UPDATE
     SET broker_retention = EXCLUDED.broker_retention, dlq_retention = EXCLUDED.dlq_retention,
         replay_window = EXCLUDED.replay_window, buffer = EXCLUDED.buffer,
         late_replay = EXCLUDED.late_replay, declared_at = now()
  RETURNING s.* INTO declared;
  RETURN declared;
END
$$;
COMMENT ON FUNCTION idem_declare_scope(text, interval, interval, interval, interval, text) IS
  'Declares (or redeclares) a scope''s retention as broker + DLQ retention + replay window + buffer (at most 1000 years), and what a late replay does.';

-- A NULL scope or target is a caller's mistake, not "there was nothing to remove": 22004, as
-- every other function answers a NULL argument.
CREATE OR REPLACE FUNCTION idem_forget_scope(scope text)
RETURNS boolean LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF scope IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004', MESSAGE = 'scope must not be NULL';
  END IF;
  DELETE FROM idempotency.scopes AS s WHERE s.scope = idem_forget_scope.scope;
  RETURN FOUND;
END
$$;
COMMENT ON FUNCTION idem_forget_scope(text) IS
  'Removes a scope''s declaration; its claims then follow idempotency.default_retention.';

CREATE OR REPLACE FUNCTION idem_version_unguard(target regclass)
RETURNS boolean LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF target IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004', MESSAGE = 'target must not be NULL';
  END IF;
  -- Only the guard: a trigger of the user's own under that name is not ours to drop. The
  -- guard is found through the catalogs, which need no USAGE on schema idempotency (a
  -- regprocedure literal would, and the table's owner may not have it).
  IF NOT EXISTS (SELECT FROM pg_catalog.pg_trigger AS t
                 JOIN pg_catalog.pg_proc AS p ON p.oid = t.tgfoid
                 JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
                 WHERE t.tgrelid = target AND t.tgname = 'idem_version_guard'
                   AND p.proname = 'version_guard' AND n.nspname = 'idempotency') THEN
    RETURN false;
  END IF;
  EXECUTE pg_catalog.format('DROP TRIGGER idem_version_guard ON %s', target);
  RETURN true;
END
$$;
COMMENT ON FUNCTION idem_version_unguard(regclass) IS
  'Removes the version guard of target; false when it had none.';

-- The guard attached by hand without its argument (which it refuses when it fires) made the
-- view fail for every reader with 22011; such a guard is listed with no version column.
CREATE OR REPLACE VIEW idempotency.version_guards AS
SELECT t.tgrelid::pg_catalog.regclass AS target,
       CASE WHEN t.tgnargs OPERATOR(pg_catalog.>) 0
            THEN pg_catalog.convert_from(pg_catalog.substring(t.tgargs, 1,
                     pg_catalog.position(t.tgargs, '\x00'::pg_catalog.bytea) OPERATOR(pg_catalog.-) 1),
                     'UTF8')::pg_catalog.name END AS version_column,
       t.tgenabled OPERATOR(pg_catalog.<>) 'D' AS enabled
FROM pg_catalog.pg_trigger AS t
WHERE t.tgname OPERATOR(pg_catalog.=) 'idem_version_guard'
  AND t.tgfoid OPERATOR(pg_catalog.=) 'idempotency.version_guard()'::pg_catalog.regprocedure;

-- The message names at most 64 characters of the scope: a name that long was never declared.
CREATE OR REPLACE FUNCTION idem_scope_budget(scope text, row_budget bigint)
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
    RAISE EXCEPTION USING ERRCODE = '42704',
      MESSAGE = pg_catalog.format('scope "%s" is not declared',
                                  CASE WHEN length(scope) > 64 THEN left(scope, 64) || '...' ELSE scope END),
      HINT = 'Declare it with idem_declare_scope first: a budget belongs to a declared scope.';
  END IF;
  RETURN declared;
END
$$;
COMMENT ON FUNCTION idem_scope_budget(text, bigint) IS
  'Sets (or, with NULL, removes) the row budget of a declared scope: idem_purge warns with ID005 while the scope holds more claims.';

-- The check the senders make under a key's lock, for the relays' take to make too: one
-- message, in one place.
CREATE FUNCTION idempotency.require_ordered_numbering()
RETURNS void LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'require_ordered_numbering_entry';
COMMENT ON FUNCTION idempotency.require_ordered_numbering() IS
  'Raises 55000 when idempotency.outbox_seq has a CACHE above 1, which would number one ordering key''s messages out of commit order.';

-- A sequence that went back (RESTART, setval, a negative INCREMENT, CYCLE, a restore or a
-- logical replica without it) would number a key's new message before its pending ones, and
-- relays would hand it out first: a send with an ordering key and a requeue refuse that (55000).
CREATE FUNCTION idempotency.require_numbered_last(id uuid)
RETURNS void LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'require_numbered_last_entry';
COMMENT ON FUNCTION idempotency.require_numbered_last(uuid) IS
  'Raises 55000 when idempotency.outbox_seq numbered this pending message at or before another pending message of its ordering key.';

CREATE OR REPLACE FUNCTION idem_outbox_requeue(id uuid)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  message idempotency.outbox;
BEGIN
  IF id IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004', MESSAGE = 'id must not be NULL';
  END IF;
  SELECT o.* INTO message FROM idempotency.outbox AS o
  WHERE o.id = idem_outbox_requeue.id AND o.set_aside_at IS NOT NULL AND o.sent_at IS NULL;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  -- It joins the tail of its key as a new send would, under the key's lock and with a new
  -- seq: back at its old place it would become the head of a key that a relay may hold.
  IF message.ordering_key IS NOT NULL THEN
    PERFORM idempotency.lock_ordering_key(message.ordering_key);
  END IF;
  UPDATE idempotency.outbox AS o
     SET set_aside_at = NULL, attempts = 0, retry_at = NULL, seq = nextval('idempotency.outbox_seq')
   WHERE o.id = idem_outbox_requeue.id AND o.set_aside_at IS NOT NULL AND o.sent_at IS NULL;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  IF message.ordering_key IS NOT NULL THEN
    PERFORM idempotency.require_numbered_last(idem_outbox_requeue.id);
  END IF;
  RETURN true;
END
$$;

-- idem_outbox_take reads each held key's followers through the pending index, up to the room
-- left in the batch (#11): the same messages, in the same order, locked the same way.
CREATE OR REPLACE FUNCTION idem_outbox_take(batch_size integer DEFAULT 100)
RETURNS TABLE (id uuid, topic text, ordering_key text, payload jsonb, headers jsonb,
               attempts integer, created_at timestamptz)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  keyless uuid[];
  after text;
  heads uuid[];
  last_key text;
  followers uuid[];
  room integer;
BEGIN
  PERFORM idempotency.require_transaction_block('idem_outbox_take');
  IF batch_size IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004', MESSAGE = 'batch_size must not be NULL';
  END IF;
  IF batch_size < 1 THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('batch_size must be at least 1, not %s', batch_size);
  END IF;
  -- Under REPEATABLE READ a row another relay marked since the snapshot raises 40001 when it
  -- is locked; READ COMMITTED rechecks it instead.
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION USING ERRCODE = '25000',
      MESSAGE = format('idem_outbox_take needs READ COMMITTED, not %s', upper(current_setting('transaction_isolation'))),
      HINT = 'Start the relay''s transactions with BEGIN ISOLATION LEVEL READ COMMITTED.';
  END IF;
  -- A sequence that hands out cached blocks of values would number one key's messages out of
  -- commit order.
  PERFORM idempotency.require_ordered_numbering();
  -- Messages without an ordering key, oldest first, up to half the batch (rounded down, so a
  -- batch of one goes to a key first): locked, skipping any another relay holds.
  keyless := ARRAY(
    SELECT k.id FROM idempotency.outbox AS k
    WHERE k.ordering_key IS NULL AND k.sent_at IS NULL AND k.set_aside_at IS NULL
      AND (k.retry_at IS NULL OR k.retry_at <= clock_timestamp())
    ORDER BY k.seq
    LIMIT batch_size / 2
    FOR UPDATE SKIP LOCKED);
  -- Then the first pending message (the head) of ordering keys, key after key through the
  -- pending index, locked, skipping any another relay holds; only a head is ever taken this
  -- way, so whoever holds a key's head holds the key. The walk starts after the last key this
  -- session took and wraps around, so every key gets its turn however many there are, and it
  -- stops as soon as the batch is full: a take costs one index probe per key it passes, not
  -- per key with pending messages.
  -- No key yet: '' sorts before every other key, so the walk starts at the first.
  after := coalesce(current_setting('idempotency.outbox_take_after', true), '');
  SELECT coalesce(array_agg(t.id ORDER BY t.lap, t.ordering_key), '{}'),
         (array_agg(t.ordering_key ORDER BY t.lap DESC, t.ordering_key DESC))[1]
    INTO heads, last_key
  FROM (
    WITH RECURSIVE later AS (
      (SELECT h.ordering_key, h.id, h.seq FROM idempotency.outbox AS h
       WHERE h.sent_at IS NULL AND h.set_aside_at IS NULL AND h.ordering_key > after
       ORDER BY h.ordering_key, h.seq LIMIT 1)
      UNION ALL
      SELECT n.ordering_key, n.id, n.seq FROM later AS p CROSS JOIN LATERAL (
        SELECT h.ordering_key, h.id, h.seq FROM idempotency.outbox AS h
        WHERE h.sent_at IS NULL AND h.set_aside_at IS NULL AND h.ordering_key > p.ordering_key
        ORDER BY h.ordering_key, h.seq LIMIT 1) AS n
    ), earlier AS (
      (SELECT h.ordering_key, h.id, h.seq FROM idempotency.outbox AS h
       WHERE h.sent_at IS NULL AND h.set_aside_at IS NULL AND h.ordering_key IS NOT NULL
         AND h.ordering_key <= after
       ORDER BY h.ordering_key, h.seq LIMIT 1)
      UNION ALL
      SELECT n.ordering_key, n.id, n.seq FROM earlier AS p CROSS JOIN LATERAL (
        SELECT h.ordering_key, h.id, h.seq FROM idempotency.outbox AS h
        WHERE h.sent_at IS NULL AND h.set_aside_at IS NULL AND h.ordering_key > p.ordering_key
          AND h.ordering_key <= after
        ORDER BY h.ordering_key, h.seq LIMIT 1) AS n
    ), walk AS (
      SELECT 1 AS lap, later.ordering_key, later.id, later.seq FROM later
      UNION ALL
      SELECT 2, earlier.ordering_key, earlier.id, earlier.seq FROM earlier
    )
    SELECT w.lap, w.ordering_key, l.id FROM walk AS w CROSS JOIN LATERAL (
      -- The same seq as the walk saw: READ COMMITTED rechecks a row this waits for or finds
      -- changed, and a message requeued meanwhile (a new seq, behind its key's other
      -- messages) is no longer the head.
      SELECT o.id FROM idempotency.outbox AS o
      WHERE o.id = w.id AND o.seq = w.seq AND o.sent_at IS NULL AND o.set_aside_at IS NULL
        AND (o.retry_at IS NULL OR o.retry_at <= clock_timestamp())
      FOR UPDATE SKIP LOCKED) AS l
    LIMIT batch_size - cardinality(keyless)) AS t;
  IF last_key IS NOT NULL THEN
    PERFORM set_config('idempotency.outbox_take_after', last_key, false);
  END IF;
  -- Room left by both: more messages without a key.
  IF cardinality(keyless) + cardinality(heads) < batch_size THEN
    keyless := keyless || ARRAY(
      SELECT k.id FROM idempotency.outbox AS k
      WHERE k.ordering_key IS NULL AND k.sent_at IS NULL AND k.set_aside_at IS NULL
        AND (k.retry_at IS NULL OR k.retry_at <= clock_timestamp()) AND k.id <> ALL (keyless)
      ORDER BY k.seq
      LIMIT batch_size - cardinality(keyless) - cardinality(heads)
      FOR UPDATE SKIP LOCKED);
  END IF;
  -- Behind the heads it holds, the next messages of the same keys, in order, to fill the
  -- batch. Nobody else takes them: no other relay holds their key's head. A key's followers
  -- end before its first message that is not due yet (one that failed). Each key is read
  -- through the pending index from its head on, at most as many rows as there is room for,
  -- and cut at the first of them that is not due: testing every pending message of the keys
  -- against all the earlier ones cost 58 ms a take at 50 keys of 100 messages, and held four
  -- relays on 200 keys below one.
  room := batch_size - cardinality(keyless) - cardinality(heads);
  followers := ARRAY(
    SELECT c.id FROM (
      SELECT n.id, n.seq,
             bool_or(n.not_due) OVER (PARTITION BY h.ordering_key ORDER BY n.seq) AS blocked
      FROM (SELECT o.ordering_key, o.seq FROM idempotency.outbox AS o WHERE o.id = ANY (heads)) AS h
      CROSS JOIN LATERAL (
        SELECT f.id, f.seq, coalesce(f.retry_at > clock_timestamp(), false) AS not_due
        FROM idempotency.outbox AS f
        WHERE f.ordering_key = h.ordering_key AND f.seq > h.seq
          AND f.sent_at IS NULL AND f.set_aside_at IS NULL
        ORDER BY f.seq
        LIMIT room) AS n) AS c
    WHERE NOT c.blocked
    ORDER BY c.seq
    LIMIT room);
  -- Locked, and only those: READ COMMITTED rechecks a row that changed since it was read.
  followers := ARRAY(
    SELECT f.id FROM idempotency.outbox AS f
    WHERE f.id = ANY (followers) AND f.sent_at IS NULL AND f.set_aside_at IS NULL
    ORDER BY f.seq
    FOR UPDATE);
  RETURN QUERY
    SELECT o.id, o.topic, o.ordering_key, o.payload, o.headers, o.attempts, o.created_at
    FROM idempotency.outbox AS o
    WHERE o.id = ANY (keyless || heads || followers)
    ORDER BY o.seq;
END
$$;

-- An ids array of more than one dimension is the caller's mistake: 22023, as idem_claim_many
-- answers it, rather than the 0A000 array_position raises for such an array.
CREATE OR REPLACE FUNCTION idem_outbox_sent(ids uuid[])
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  early record;
  marked integer;
BEGIN
  PERFORM idempotency.require_transaction_block('idem_outbox_sent');
  IF ids IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004', MESSAGE = 'ids must not be NULL nor hold a NULL';
  END IF;
  IF array_ndims(ids) > 1 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('ids must be a one-dimensional array, not one of %s dimensions', array_ndims(ids));
  END IF;
  IF array_position(ids, NULL) IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004', MESSAGE = 'ids must not be NULL nor hold a NULL';
  END IF;
  -- A key's messages are sent in order: none may be marked while an earlier one is pending.
  -- Driven by the ids, each found through the primary key: as a join under LIMIT 1 the
  -- planner expected an early match and scanned the whole outbox for the batch's messages.
  SELECT m.id, e.id AS earlier INTO early
  FROM unnest(ids) AS u(id)
  JOIN idempotency.outbox AS m ON m.id = u.id
  CROSS JOIN LATERAL (
    SELECT e.id FROM idempotency.outbox AS e
    WHERE e.ordering_key = m.ordering_key AND e.seq < m.seq
      AND e.sent_at IS NULL AND e.set_aside_at IS NULL AND e.id <> ALL (ids)
    ORDER BY e.seq
    LIMIT 1) AS e
  WHERE m.sent_at IS NULL
  LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION USING ERRCODE = '55000',
      MESSAGE = format('message %s cannot be marked sent before message %s of the same ordering key', early.id, early.earlier),
      HINT = 'Publish a key''s messages in the order idem_outbox_take returns them, and stop the key at its first failure.';
  END IF;
  UPDATE idempotency.outbox AS o SET sent_at = clock_timestamp(), retry_at = NULL
  WHERE o.id = ANY (ids) AND o.sent_at IS NULL AND o.set_aside_at IS NULL;
  GET DIAGNOSTICS marked = ROW_COUNT;
  RETURN marked;
END
$$;


-- Retention is reckoned in UTC: now() - '60 days' in a session whose TimeZone has a
-- daylight-saving change within those days is an hour off, and the purge (pg_cron's session,
-- the server's zone) and a consumer's late-replay guard (a JDBC session, the JVM's zone)
-- disagreed by that hour both ways: a claim purged an hour before it expired, or a late
-- replay trusted an hour after its claim was purged. The guard shares the library's
-- function (src/retention.rs, cutoff). It also keeps the claims of a retention that earlier
-- releases took and idem_declare_scope now refuses (over 1000 years, or with a negative
-- field), which an update or a restored dump brings along: subtracted as it stands, such a
-- span failed every purge with 22008, or put the cutoff after now().
CREATE FUNCTION idempotency.expired_before(span interval) RETURNS timestamptz
LANGUAGE c STABLE STRICT PARALLEL SAFE
AS 'MODULE_PATHNAME', 'expired_before_entry';
COMMENT ON FUNCTION idempotency.expired_before(interval) IS
  'The cutoff of a retention: now() less span, subtracted in UTC whatever the session''s TimeZone; a negative field counts as zero, and a span over 1000 years keeps everything (-infinity).';

-- The retention of undeclared scopes that the purge keeps: the longest of its own session's
-- idempotency.default_retention and every ALTER ROLE / ALTER DATABASE value for this
-- database, since a consumer's role may keep claims longer than the purge's role would.
CREATE FUNCTION idempotency.longest_default_retention() RETURNS interval
LANGUAGE c STABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'idem_longest_default_retention_entry';
COMMENT ON FUNCTION idempotency.longest_default_retention() IS
  'The longest idempotency.default_retention of this session and of every role and database setting for this database: what the purge keeps undeclared scopes'' claims for.';

-- How many claims each purge run moved into buckets: a ledger made before buckets (#13) moves
-- over, batch by batch, run after run.
ALTER TABLE idempotency.purge_runs ADD COLUMN moved pg_catalog.int8 NOT NULL DEFAULT 0;

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
  -- Qualified like every name here: an unqualified type is looked up in pg_temp first.
  over_budget pg_catalog.record;
  first_block bigint;
  last_block bigint;
  removed bigint;
  batch_moved bigint;
  undeclared pg_catalog.interval;
BEGIN
  IF batch_blocks IS NULL OR batch_blocks OPERATOR(pg_catalog.<) 1 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = pg_catalog.format('batch_blocks must be at least 1, not %s', COALESCE(batch_blocks::pg_catalog.text, 'NULL'));
  END IF;
  IF pause IS NULL OR pause OPERATOR(pg_catalog.<) '0'::pg_catalog.interval THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = pg_catalog.format('pause must be zero or more, not %s', COALESCE(pause::pg_catalog.text, 'NULL'));
  END IF;
  -- The ledger's buckets first: expired ones are dropped whole, and the next ones made
  -- before claims need them. Only the ledger's own rows are deleted below.
  SELECT m.dropped_claims INTO deleted FROM idempotency.maintain_ledger_buckets() AS m;
  -- Once per run: it reads the catalog.
  undeclared := idempotency.longest_default_retention();
  -- Blocks are counted across the tables, in the order above.
  FOR phase IN 1 .. pg_catalog.array_length(tables, 1) LOOP
    sizes := sizes OPERATOR(pg_catalog.||) (pg_catalog.pg_relation_size(tables[phase])
             OPERATOR(pg_catalog./) pg_catalog.current_setting('block_size')::pg_catalog.int8);
    total_blocks := total_blocks OPERATOR(pg_catalog.+) sizes[phase];
  END LOOP;
  INSERT INTO idempotency.purge_runs (blocks, deleted) VALUES (total_blocks, deleted) RETURNING run_id INTO run;
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
    batch_moved := 0;
    IF phase OPERATOR(pg_catalog.=) 1 THEN
      DELETE FROM ONLY idempotency.ledger AS l
      WHERE l.ctid OPERATOR(pg_catalog.>=) pg_catalog.format('(%s,0)', first_block)::pg_catalog.tid
        AND l.ctid OPERATOR(pg_catalog.<) pg_catalog.format('(%s,0)', last_block)::pg_catalog.tid
        AND l.claimed_at OPERATOR(pg_catalog.<) idempotency.expired_before(COALESCE(
              (SELECT s.retention FROM idempotency.scopes AS s WHERE s.scope_id OPERATOR(pg_catalog.=) l.scope_id),
              undeclared));
      GET DIAGNOSTICS removed = ROW_COUNT;
      IF idempotency.move_to_buckets(first_block, last_block, prepare => true) OPERATOR(pg_catalog.>) 0 THEN
        COMMIT;
      END IF;
      batch_moved := idempotency.move_to_buckets(first_block, last_block);
    ELSIF phase OPERATOR(pg_catalog.=) 2 THEN
      DELETE FROM idempotency.outbox AS o
      WHERE o.ctid OPERATOR(pg_catalog.>=) pg_catalog.format('(%s,0)', first_block)::pg_catalog.tid
        AND o.ctid OPERATOR(pg_catalog.<) pg_catalog.format('(%s,0)', last_block)::pg_catalog.tid
        AND o.sent_at OPERATOR(pg_catalog.<) idempotency.expired_before(@extschema@.idem_outbox_retention());
    ELSIF phase OPERATOR(pg_catalog.=) 3 THEN
      DELETE FROM idempotency.external_calls AS c
      WHERE c.ctid OPERATOR(pg_catalog.>=) pg_catalog.format('(%s,0)', first_block)::pg_catalog.tid
        AND c.ctid OPERATOR(pg_catalog.<) pg_catalog.format('(%s,0)', last_block)::pg_catalog.tid
        AND c.confirmed_at OPERATOR(pg_catalog.<) idempotency.expired_before(COALESCE(
              (SELECT s.retention FROM idempotency.scopes AS s WHERE s.scope OPERATOR(pg_catalog.=) c.scope),
              undeclared));
    ELSE
      DELETE FROM idempotency.duplicates AS d
      WHERE d.ctid OPERATOR(pg_catalog.>=) pg_catalog.format('(%s,0)', first_block)::pg_catalog.tid
        AND d.ctid OPERATOR(pg_catalog.<) pg_catalog.format('(%s,0)', last_block)::pg_catalog.tid
        AND d.seen_at OPERATOR(pg_catalog.<) idempotency.expired_before(@extschema@.idem_diagnostics_retention());
    END IF;
    IF phase OPERATOR(pg_catalog.>) 1 THEN
      GET DIAGNOSTICS removed = ROW_COUNT;
    END IF;
    deleted := deleted OPERATOR(pg_catalog.+) removed;
    done_blocks := LEAST(table_start OPERATOR(pg_catalog.+) last_block, total_blocks);
    UPDATE idempotency.purge_runs AS p
       SET blocks_done = done_blocks,
           batches = p.batches OPERATOR(pg_catalog.+) 1, deleted = p.deleted OPERATOR(pg_catalog.+) removed,
           moved = p.moved OPERATOR(pg_catalog.+) batch_moved
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

-- A run cancelled in a session that then calls idem_purge again was shown 'running' beside
-- the new run: only a run its session's current statement started is running. That statement
-- is known by when it started, not by its text, which is the DBA's own procedure when the
-- purge runs inside one (the procedure's CALL, the purge's COMMITs and all). Where the
-- reader may not see the session's activity (pg_read_all_stats), the state is 'unknown'.
CREATE OR REPLACE VIEW idempotency.purge_progress AS
SELECT p.run_id, p.pid, p.started_at, p.finished_at,
       CASE WHEN p.finished_at IS NOT NULL THEN 'finished'
            WHEN a.pid IS NULL THEN 'interrupted'
            WHEN a.state IS NULL THEN 'unknown'
            WHEN a.state = 'active' AND a.query_start <= p.started_at THEN 'running'
            ELSE 'interrupted' END AS state,
       p.blocks_done, p.blocks,
       round(100.0 * p.blocks_done / GREATEST(p.blocks, 1), 1) AS percent_done,
       p.batches, p.deleted, p.moved
FROM idempotency.purge_runs AS p
LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid = p.pid AND a.backend_start <= p.started_at;

-- Pinned as the extension's other functions are: their `CASE … WHEN` lists and casts looked
-- operators and types up through the caller's search_path, where a role's own `=` in public,
-- or a type in pg_temp, would have run in place of pg_catalog's.
ALTER FUNCTION idem_diagnostics(interval) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION idempotency.ledger_estimate(interval) SET search_path = pg_catalog, pg_temp;

-- A NULL LSN was reported as "pos must not be NULL", the name of the function this one wrapped;
-- in C it names its own argument, and the position is the same numeric as before.
CREATE OR REPLACE FUNCTION idem_watermark_advance_lsn(stream text, partition text, lsn pg_lsn)
RETURNS boolean LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'idem_watermark_advance_lsn_entry';

-- retry_after '1 month -29 days' compares above zero (a month counts 30 days), yet on 31
-- January it put the retry a day in the past: as for a scope's retention, no field of the
-- interval may be negative.
CREATE OR REPLACE FUNCTION idem_outbox_failed(id uuid, reason text, retry_after interval DEFAULT '5 seconds',
    max_attempts integer DEFAULT 10)
RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  now_ timestamptz := clock_timestamp();
  failed idempotency.outbox;
BEGIN
  PERFORM idempotency.require_transaction_block('idem_outbox_failed');
  IF id IS NULL OR reason IS NULL OR retry_after IS NULL OR max_attempts IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004', MESSAGE = 'id, reason, retry_after and max_attempts must not be NULL';
  END IF;
  IF extract(year FROM retry_after) < 0 OR extract(month FROM retry_after) < 0
     OR extract(day FROM retry_after) < 0 OR retry_after - date_trunc('day', retry_after) < interval '0'
     OR max_attempts < 1 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('retry_after must not be negative and max_attempts must be at least 1, not %s and %s', retry_after, max_attempts),
      HINT = 'Each of retry_after''s years, months, days and time must be zero or more.';
  END IF;
  UPDATE idempotency.outbox AS o
     SET attempts = o.attempts + 1, last_error = reason, retry_at = now_ + retry_after,
         set_aside_at = CASE WHEN o.attempts + 1 >= max_attempts THEN now_ END
   WHERE o.id = idem_outbox_failed.id AND o.sent_at IS NULL AND o.set_aside_at IS NULL
  RETURNING o.* INTO failed;
  RETURN CASE WHEN failed.id IS NULL THEN 'not pending'
              WHEN failed.set_aside_at IS NOT NULL THEN 'set aside'
              ELSE 'retry' END;
END
$$;

-- idempotency.duplicates was the extension's one table without a primary key. Once a
-- publication took every table (FOR ALL TABLES, FOR TABLES IN SCHEMA idempotency), PostgreSQL
-- refused the purge's DELETE of recorded duplicates (55000: no replica identity), so every
-- purge stopped before its budget warnings, and the rows were never removed. A key of its own,
-- from a sequence rather than an identity column, so that both are dumped like outbox_seq: a
-- restored database goes on numbering after the rows it restored, which a dump keeps from now
-- on too (diagnostics were lost by a dump and restore). Adding the column rewrites the table,
-- under a lock that holds back only claims recording a duplicate, and only while it lasts.
CREATE SEQUENCE idempotency.duplicates_id_seq AS pg_catalog.int8;
ALTER TABLE idempotency.duplicates
  ADD COLUMN id pg_catalog.int8 NOT NULL DEFAULT pg_catalog.nextval('idempotency.duplicates_id_seq'::pg_catalog.regclass),
  ADD CONSTRAINT duplicates_pkey PRIMARY KEY (id);
ALTER SEQUENCE idempotency.duplicates_id_seq OWNED BY idempotency.duplicates.id;
SELECT pg_catalog.pg_extension_config_dump('idempotency.duplicates', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.duplicates_id_seq', '');
REVOKE ALL ON SEQUENCE idempotency.duplicates_id_seq FROM PUBLIC;

-- Scheduling found pg_cron by the name cron.schedule_in_database alone. Where pg_cron is not
-- installed, a schema named cron may be anyone's, and a role that made one could have its own
-- function of that name run with the rights of whoever schedules the purge (a superuser,
-- typically); unscheduling read its cron.job and ran its cron.unschedule alike. Only pg_cron's
-- own functions are called now: anything else is "pg_cron is not available".
CREATE FUNCTION idempotency.pg_cron_function(signature text) RETURNS pg_catalog.regprocedure
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
  SELECT p.oid::pg_catalog.regprocedure
    FROM pg_catalog.pg_depend AS d
    JOIN pg_catalog.pg_extension AS e ON e.oid OPERATOR(pg_catalog.=) d.refobjid
    JOIN pg_catalog.pg_proc AS p ON p.oid OPERATOR(pg_catalog.=) d.objid
   WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
     AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
     AND d.deptype OPERATOR(pg_catalog.=) 'e'
     AND e.extname OPERATOR(pg_catalog.=) 'pg_cron'
     AND p.oid OPERATOR(pg_catalog.=) pg_catalog.to_regprocedure(signature);
END;
COMMENT ON FUNCTION idempotency.pg_cron_function(text) IS
  'pg_cron''s own function of this signature (a member of the extension pg_cron), or NULL.';

CREATE OR REPLACE FUNCTION idem_schedule_purge(schedule text DEFAULT '*/10 * * * *', pause interval DEFAULT '100 ms')
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
  IF idempotency.pg_cron_function('cron.schedule_in_database(text,text,text,text,text,boolean)') IS NULL THEN
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

CREATE OR REPLACE FUNCTION idem_unschedule_purge()
RETURNS boolean LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  job_name text := 'idempotency-purge:' || current_database();
  found boolean;
BEGIN
  -- pg_cron's own unschedule makes the schema, and so its cron.job, pg_cron's.
  IF idempotency.pg_cron_function('cron.unschedule(name)') IS NULL THEN
    RETURN false;
  END IF;
  EXECUTE 'SELECT EXISTS (SELECT FROM cron.job WHERE jobname = $1)' INTO found USING job_name;
  IF found THEN
    EXECUTE 'SELECT cron.unschedule($1::pg_catalog.name)' USING job_name;
  END IF;
  RETURN found;
END
$$;

-- The ledger in time buckets (#13) ------------------------------------------------------------
--
-- A digest is uniformly random, so every claim into one ledger of N keys writes a random leaf
-- of an index that grows with N: after each checkpoint that leaf's first change writes a full
-- page to WAL, and the purge deletes row by row. Buckets keep new claims in a small index and
-- let the purge drop whole tables (docs/ledger-layout.md).
--
-- A bucket is a table INHERITS (idempotency.ledger) with its own primary key on key_digest:
-- the ledger stays the table users query, and creating a child locks the parent only in SHARE
-- UPDATE EXCLUSIVE, which no claim waits for. Each bucket holds the claims of one lane (one
-- retention: every scope declared with it, or NULL for undeclared scopes) made by
-- transactions that started within [starts_at, ends_at), so a bucket's rows expire together.
-- Claims that find no bucket for their lane and start go into the ledger itself, as before.
CREATE TABLE idempotency.ledger_buckets (
    bucket    pg_catalog.name        PRIMARY KEY,
    lane      pg_catalog.interval,
    starts_at pg_catalog.timestamptz NOT NULL,
    ends_at   pg_catalog.timestamptz NOT NULL,
    sealed_at pg_catalog.timestamptz,
    CONSTRAINT ledger_buckets_range CHECK (starts_at OPERATOR(pg_catalog.<) ends_at)
);
COMMENT ON TABLE idempotency.ledger_buckets IS
  'Buckets of the ledger (tables in schema idempotency that inherit from it): each holds the claims of scopes of retention lane (NULL: undeclared scopes) whose transactions started in [starts_at, ends_at); sealed_at: since when no new key may enter it, so that claims consult its filter first.';
SELECT pg_catalog.pg_extension_config_dump('idempotency.ledger_buckets', '');
REVOKE ALL ON TABLE idempotency.ledger_buckets FROM PUBLIC;

-- When a scope's retention changed, and from which lane: its claims made before then sit in
-- that lane's buckets, and the purge keeps those buckets for the scope's retention now.
-- The key is random, not a sequence's: a restore copies the scopes, whose trigger records
-- changes of its own, before or after the changes themselves, and a sequence is not restored.
CREATE TABLE idempotency.retention_changes (
    change_id  pg_catalog.uuid        PRIMARY KEY DEFAULT pg_catalog.gen_random_uuid(),
    scope_id   pg_catalog.int8        NOT NULL,
    old_lane   pg_catalog.interval,
    changed_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    -- When a purge first saw it, so after it committed: claims of transactions that began
    -- before then may have gone to the old lane (changed_at is only the change's start).
    seen_at    pg_catalog.timestamptz
);
COMMENT ON TABLE idempotency.retention_changes IS
  'Each declaration, redeclaration and forgetting of a scope since the oldest bucket began, with the lane (retention; NULL: undeclared) its claims went to before: the purge keeps that lane''s older buckets for the scope''s retention now.';
SELECT pg_catalog.pg_extension_config_dump('idempotency.retention_changes', '');
REVOKE ALL ON TABLE idempotency.retention_changes FROM PUBLIC;

-- Claims cache the buckets and each scope's lane per backend; what changes either tells them.
CREATE FUNCTION idempotency.ledger_layout_changed() RETURNS void
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'ledger_layout_changed_entry';
COMMENT ON FUNCTION idempotency.ledger_layout_changed() IS
  'Makes every session read the ledger''s buckets and the scopes'' lanes again, from its next claim.';
REVOKE ALL ON FUNCTION idempotency.ledger_layout_changed() FROM PUBLIC;

-- TRUNCATE is not MVCC-safe: the purge truncates the emptied ledger only once no snapshot can
-- see a version of a row in it, which VACUUM vouches for, called with writers locked out:
-- every block all-visible, and no entry, live or marked dead, in its key index.
CREATE FUNCTION idempotency.ledger_holds_no_row_version() RETURNS boolean
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'ledger_holds_no_row_version_entry';
COMMENT ON FUNCTION idempotency.ledger_holds_no_row_version() IS
  'Whether VACUUM left every block of the ledger itself all-visible and its key index without an entry: then no snapshot sees a row in it.';
REVOKE ALL ON FUNCTION idempotency.ledger_holds_no_row_version() FROM PUBLIC;

-- SECURITY DEFINER: whoever may declare a scope need not write the extension's bookkeeping.
CREATE FUNCTION idempotency.scope_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO idempotency.retention_changes (scope_id, old_lane) VALUES (NEW.scope_id, NULL);
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO idempotency.retention_changes (scope_id, old_lane) VALUES (OLD.scope_id, OLD.retention);
  ELSIF OLD.retention IS DISTINCT FROM NEW.retention OR OLD.scope_id IS DISTINCT FROM NEW.scope_id THEN
    INSERT INTO idempotency.retention_changes (scope_id, old_lane)
    VALUES (OLD.scope_id, OLD.retention), (NEW.scope_id, NULL);
  ELSE
    RETURN NULL;
  END IF;
  PERFORM idempotency.ledger_layout_changed();
  RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION idempotency.scope_changed() FROM PUBLIC;
CREATE TRIGGER scope_changed AFTER INSERT OR UPDATE OR DELETE ON idempotency.scopes
FOR EACH ROW EXECUTE FUNCTION idempotency.scope_changed();

-- A sealed bucket's keys are fixed: claims rule a key out by the bucket's filter, built from
-- them, so a new one (a row inserted by hand, a key changed) would go unseen.
CREATE FUNCTION idempotency.bucket_sealed() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RAISE EXCEPTION USING ERRCODE = '55000',
    MESSAGE = format('bucket %s of the ledger is sealed', TG_TABLE_NAME),
    DETAIL = 'Claims look a key up in a sealed bucket through a filter of the keys it held when it was sealed.',
    HINT = 'Claim through idem_claim; idem_purge moves claims of the ledger itself into their buckets.';
END
$$;

-- The bucket of `lane` (NULL: undeclared scopes, whose retention is `span`) for claims made
-- at `at`, made if there is none, aligned on the epoch and cut short where a bucket of the
-- lane made with another width already covers part of it. Its width is the span in which the
-- lane takes about a million claims, at the rate of the claims the ledger holds now (so that
-- the index new claims write stays small enough to be cached, and a checkpoint's page images
-- few), but at most an eighth of the retention and a week, and at least an hour. Run as the
-- ledger's owner, never by a role itself.
CREATE FUNCTION idempotency.ledger_bucket_as_owner(lane interval, span interval, at timestamptz,
                                                   OUT bucket name, OUT starts timestamptz, OUT ends timestamptz,
                                                   OUT created boolean)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  held float8 := (SELECT sum(greatest(c.reltuples, 0)) FROM pg_class AS c
                  WHERE c.oid = 'idempotency.ledger'::regclass
                     OR c.oid IN (SELECT i.inhrelid FROM pg_inherits AS i
                                  WHERE i.inhparent = 'idempotency.ledger'::regclass));
  -- Whole seconds, so that buckets of the lane begin and end on whole seconds whatever
  -- widths they were made with, and no two begin in the second their names spell.
  width_s float8 := round(greatest(least(extract(epoch FROM span) * 1000000 / greatest(held, 1),
                                         extract(epoch FROM span) / 8, 7 * 86400), 3600));
  sealed boolean;
  lane_seconds numeric;
BEGIN
  -- As the bucket pass does: a purge's move beside another purge's pass would make the
  -- bucket twice.
  LOCK TABLE idempotency.ledger_buckets IN SHARE ROW EXCLUSIVE MODE;
  SELECT x.bucket, x.starts_at, x.ends_at, x.sealed_at IS NOT NULL INTO bucket, starts, ends, sealed
  FROM idempotency.ledger_buckets AS x
  WHERE x.lane IS NOT DISTINCT FROM ledger_bucket_as_owner.lane AND x.starts_at <= at AND at < x.ends_at;
  created := NOT FOUND;
  IF FOUND THEN
    -- A claim moved into a sealed bucket would be missed by its filter: it is unsealed first,
    -- in the move's transaction, so a claim of the key waits for it and then searches it.
    IF sealed THEN
      EXECUTE format('DROP TRIGGER IF EXISTS bucket_sealed ON idempotency.%I', bucket);
      UPDATE idempotency.ledger_buckets AS x SET sealed_at = NULL WHERE x.bucket = ledger_bucket_as_owner.bucket;
    END IF;
    RETURN;
  END IF;
  starts := to_timestamp(floor(extract(epoch FROM at) / width_s) * width_s);
  ends := to_timestamp((floor(extract(epoch FROM at) / width_s) + 1) * width_s);
  -- Seconds as float8 round: `at` on a boundary may fall just outside the range computed.
  IF starts > at THEN
    starts := starts - width_s * interval '1 second';
  END IF;
  IF ends <= at THEN
    ends := ends + width_s * interval '1 second';
  END IF;
  starts := greatest(starts, (SELECT max(x.ends_at) FROM idempotency.ledger_buckets AS x
                              WHERE x.lane IS NOT DISTINCT FROM ledger_bucket_as_owner.lane AND x.ends_at <= at));
  ends := least(ends, (SELECT min(x.starts_at) FROM idempotency.ledger_buckets AS x
                       WHERE x.lane IS NOT DISTINCT FROM ledger_bucket_as_owner.lane AND x.starts_at > at));
  -- Lanes are told apart as intervals compare ('1 year' is not '365 days 6 hours', though
  -- both are 31557600 seconds), so the name spells the lane's months, days and seconds, or
  -- microseconds where the seconds are not whole ('8 days 0.6 seconds' is not '8 days 0.7
  -- seconds').
  lane_seconds := extract(epoch FROM lane - date_trunc('day', lane));
  bucket := format('ledger_%s_%s',
                   CASE WHEN lane IS NULL THEN 'default'
                        ELSE format('%sm%sd%s', extract(year FROM lane)::bigint * 12 + extract(month FROM lane)::bigint,
                                    extract(day FROM lane)::bigint,
                                    CASE WHEN lane_seconds = trunc(lane_seconds) THEN lane_seconds::bigint || 's'
                                         ELSE (lane_seconds * 1000000)::bigint || 'us' END) END,
                   to_char(starts AT TIME ZONE 'UTC', 'YYYYMMDD"t"HH24MISS')
                   -- A bucket made by hand may end within a second: the next one's name
                   -- then spells its microseconds too.
                   || CASE WHEN date_trunc('second', starts AT TIME ZONE 'UTC') <> starts AT TIME ZONE 'UTC'
                           THEN to_char(starts AT TIME ZONE 'UTC', '"_"US') ELSE '' END);
  EXECUTE format('CREATE TABLE idempotency.%I (CONSTRAINT %I PRIMARY KEY (key_digest)) INHERITS (idempotency.ledger)',
                 bucket, bucket || '_pkey');
  INSERT INTO idempotency.ledger_buckets (bucket, lane, starts_at, ends_at)
  VALUES (ledger_bucket_as_owner.bucket, lane, starts, ends);
END
$$;
REVOKE ALL ON FUNCTION idempotency.ledger_bucket_as_owner(interval, interval, timestamptz) FROM PUBLIC;

-- Run as the ledger's owner by idempotency.maintain_ledger_buckets, never by a role itself.
-- With `make_buckets`, each lane gets the current bucket and the next two. A bucket is
-- dropped once its every claim has expired, by its lane's retention while a scope has it (else
-- the undeclared scopes'), and by the retention now of every scope that left the lane since
-- the bucket began. (An UPDATE of scope_id also counts
-- the new one as coming from undeclared scopes, whose claims it may have made under that
-- name.) A drop waits at most 50 ms for claims that still hold the bucket and is tried again
-- by the next run.
CREATE FUNCTION idempotency.maintain_ledger_buckets_as_owner(make_buckets boolean, undeclared interval,
                                                             OUT created integer, OUT dropped integer,
                                                             OUT dropped_claims bigint)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  b record;
  n bigint;
  at timestamptz;
  made boolean;
  untracked boolean;
  oldest_start timestamptz;
BEGIN
  -- One bucket pass at a time (a scheduled purge beside one called by hand): two would make,
  -- seal or drop the same bucket, and the second fail with 42P07, 42710 or 42P01. Claims
  -- only read ledger_buckets, which this lock lets them do.
  LOCK TABLE idempotency.ledger_buckets IN SHARE ROW EXCLUSIVE MODE;
  -- A bucket dropped by hand (its claims went with it) is forgotten: its time range gets a
  -- bucket again, and claims of the ledger itself made then have somewhere to move.
  DELETE FROM idempotency.ledger_buckets AS x
  WHERE to_regclass(format('idempotency.%I', x.bucket)) IS NULL;
  created := 0;
  IF make_buckets THEN
    FOR b IN SELECT DISTINCT s.retention AS lane, s.retention AS span FROM idempotency.scopes AS s
             UNION ALL SELECT NULL::interval, undeclared LOOP
      at := statement_timestamp();
      FOR i IN 1 .. 3 LOOP
        -- A bucket made by hand may run to 'infinity': nothing comes after it.
        EXIT WHEN NOT isfinite(at);
        SELECT m.ends, m.created INTO at, made FROM idempotency.ledger_bucket_as_owner(b.lane, b.span, at) AS m;
        created := created + made::integer;
      END LOOP;
    END LOOP;
  END IF;
  -- Sealing: a bucket ended before every transaction still running in this database began,
  -- so none can claim into it any more (a claim goes to the bucket of its transaction's
  -- start). Its trigger keeps every other new key out. Other databases' sessions and
  -- autovacuum's workers never claim here: a long VACUUM elsewhere holds back no seal. Only a
  -- role that sees every session's transaction (a superuser, or one with pg_read_all_stats's
  -- privileges: a NOINHERIT member sees NULLs) can know that, and only while every session reports when its transaction began (a session with
  -- track_activities off shows 'disabled'); else the buckets stay unsealed. Nor while the
  -- ledger itself holds claims, which the purge is still moving into buckets (a move into a
  -- sealed bucket unseals it, under a lock that claims of it would wait for).
  SELECT bool_or(a.state = 'disabled'), min(a.xact_start) INTO untracked, oldest_start
    FROM pg_stat_activity AS a
   WHERE a.datname = current_database()
     AND a.backend_type IS DISTINCT FROM 'autovacuum worker';
  IF ((SELECT r.rolsuper FROM pg_roles AS r WHERE r.rolname = current_user)
      OR pg_has_role(current_user, 'pg_read_all_stats', 'USAGE'))
     AND NOT untracked
     AND NOT EXISTS (SELECT FROM ONLY idempotency.ledger) THEN
    FOR b IN SELECT x.bucket FROM idempotency.ledger_buckets AS x
             WHERE x.sealed_at IS NULL AND x.ends_at < oldest_start
             ORDER BY x.starts_at LOOP
      BEGIN
        PERFORM set_config('lock_timeout', '50ms', true);
        EXECUTE format('CREATE TRIGGER bucket_sealed BEFORE INSERT OR UPDATE OF key_digest ON idempotency.%I '
                       'FOR EACH ROW EXECUTE FUNCTION idempotency.bucket_sealed()', b.bucket);
        -- clock_timestamp(), not now(): a bucket unsealed and sealed again in one transaction
        -- gets a seal of its own, which tells each session's filter that its keys changed.
        UPDATE idempotency.ledger_buckets AS x SET sealed_at = clock_timestamp() WHERE x.bucket = b.bucket;
      EXCEPTION WHEN lock_not_available THEN
        NULL;
      END;
    END LOOP;
  END IF;
  UPDATE idempotency.retention_changes AS c SET seen_at = statement_timestamp() WHERE c.seen_at IS NULL;
  dropped := 0;
  dropped_claims := 0;
  FOR b IN SELECT x.bucket, x.ends_at,
                  -- A lane no scope has now was left by scopes forgotten or redeclared
                  -- (recorded below), or emptied by a TRUNCATE (not recorded): either way its
                  -- claims follow the default retention now, or their scopes' new ones.
                  greatest(CASE WHEN x.lane IS NOT NULL
                                 AND EXISTS (SELECT FROM idempotency.scopes AS s WHERE s.retention = x.lane)
                                THEN x.lane ELSE undeclared END,
                           (SELECT max(coalesce(s.retention, undeclared))
                            FROM idempotency.retention_changes AS c
                            LEFT JOIN idempotency.scopes AS s ON s.scope_id = c.scope_id
                            WHERE x.starts_at <= c.seen_at AND c.old_lane IS NOT DISTINCT FROM x.lane)) AS kept_for
           FROM idempotency.ledger_buckets AS x ORDER BY x.starts_at LOOP
    CONTINUE WHEN b.ends_at > idempotency.expired_before(b.kept_for);
    BEGIN
      -- Until the function returns, which sets back what its SET clause saved.
      PERFORM set_config('lock_timeout', '50ms', true);
      EXECUTE format('LOCK TABLE idempotency.%I IN ACCESS EXCLUSIVE MODE', b.bucket);
      EXECUTE format('SELECT count(*) FROM ONLY idempotency.%I', b.bucket) INTO n;
      EXECUTE format('DROP TABLE idempotency.%I', b.bucket);
      DELETE FROM idempotency.ledger_buckets AS x WHERE x.bucket = b.bucket;
      dropped := dropped + 1;
      dropped_claims := dropped_claims + n;
    EXCEPTION WHEN lock_not_available THEN
      NULL;
    END;
  END LOOP;
  DELETE FROM idempotency.retention_changes AS c
  WHERE c.seen_at < coalesce((SELECT min(x.starts_at) FROM idempotency.ledger_buckets AS x), now());
  -- Once every claim of the ledger itself has moved into buckets, it still holds the pages
  -- they took (a btree never gives pages back, and VACUUM cuts a table's empty blocks off
  -- only when no claim holds it for a moment): truncated under a lock that waits at most
  -- 50 ms, as a drop does. TRUNCATE is not MVCC-safe: a snapshot older than the move would
  -- see the moved claims neither here nor in their buckets. So only once VACUUM removed every
  -- version of its rows and their index entries, and marked every block all-visible, which it
  -- does only when no snapshot of this server can see one (a standby's queries that could
  -- are cancelled, or held it back through hot_standby_feedback). Not under
  -- old_snapshot_threshold (15, 16): VACUUM then removes versions old snapshots see, which
  -- fail with 72000 when they read the page, where a truncated table would answer nothing.
  -- A foreign key of yours that references the ledger keeps it as it is (0A000); so do a
  -- cursor of this session on it (55006) and a serializable conflict (40001).
  IF EXISTS (SELECT FROM idempotency.ledger_buckets)
     AND coalesce(pg_relation_size(to_regclass('idempotency.ledger_pkey')), 0) > 8 * 1024 * 1024
     AND coalesce(current_setting('old_snapshot_threshold', true), '-1') = '-1'
     AND idempotency.ledger_holds_no_row_version() THEN
    BEGIN
      PERFORM set_config('lock_timeout', '50ms', true);
      LOCK TABLE ONLY idempotency.ledger IN ACCESS EXCLUSIVE MODE;
      IF idempotency.ledger_holds_no_row_version() THEN
        TRUNCATE ONLY idempotency.ledger;
      END IF;
    EXCEPTION WHEN lock_not_available OR feature_not_supported OR object_in_use OR serialization_failure THEN
      NULL;
    END;
  END IF;
END
$$;
REVOKE ALL ON FUNCTION idempotency.maintain_ledger_buckets_as_owner(boolean, interval) FROM PUBLIC;

-- Moves the claims of the ledger itself in blocks [first_block, last_block) that have not
-- expired into their buckets (by the scope's lane and the claim's time), once the ledger has
-- buckets and no trigger or rule of its own: a ledger made before buckets, or claims that
-- found no bucket ready. In two steps, each its own transaction: `prepare` makes (or
-- unseals) the buckets the claims go to, and commits, so that every claim that searches from
-- then on knows them as they are; the move then passes each key's lock before it deletes the
-- key's row from the ledger, so a claim that took the lock earlier has finished its search
-- (it found the row), and one that takes it later meets the row deleted by a transaction in
-- progress, waits for the move, and then finds the key in its bucket. Run as the ledger's
-- owner.
CREATE FUNCTION idempotency.move_to_buckets_as_owner(first_block bigint, last_block bigint, undeclared interval,
                                                     prepare boolean)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  claim record;
  target record;
  n bigint;
  done bigint := 0;
  first_tid tid := format('(%s,0)', first_block)::tid;
  last_tid tid := format('(%s,0)', last_block)::tid;
BEGIN
  IF NOT EXISTS (SELECT FROM idempotency.ledger_buckets)
     OR EXISTS (SELECT FROM pg_trigger AS t WHERE t.tgrelid = 'idempotency.ledger'::regclass)
     OR EXISTS (SELECT FROM pg_rewrite AS r WHERE r.ev_class = 'idempotency.ledger'::regclass) THEN
    RETURN 0;
  END IF;
  -- One bucket at a time, found from a claim whose bucket is not ready (prepare) or is (the
  -- move): a range of blocks holds claims of few buckets.
  LOOP
    SELECT s.retention AS lane, coalesce(s.retention, undeclared) AS span, l.claimed_at,
           b.bucket, b.starts_at, b.ends_at INTO claim
    FROM ONLY idempotency.ledger AS l
    LEFT JOIN idempotency.scopes AS s ON s.scope_id = l.scope_id
    LEFT JOIN idempotency.ledger_buckets AS b
           ON b.lane IS NOT DISTINCT FROM s.retention AND b.starts_at <= l.claimed_at
          AND l.claimed_at < b.ends_at AND b.sealed_at IS NULL
    WHERE l.ctid >= first_tid AND l.ctid < last_tid
      AND l.claimed_at >= idempotency.expired_before(coalesce(s.retention, undeclared))
      AND (b.bucket IS NULL) = prepare
    LIMIT 1;
    EXIT WHEN NOT FOUND;
    IF prepare THEN
      PERFORM idempotency.ledger_bucket_as_owner(claim.lane, claim.span, claim.claimed_at);
      done := done + 1;
      CONTINUE;
    END IF;
    EXECUTE format(
      'WITH moved AS (
         DELETE FROM ONLY idempotency.ledger AS l
         WHERE l.ctid >= $1 AND l.ctid < $2 AND l.claimed_at >= $3 AND l.claimed_at < $4
           AND (SELECT s.retention FROM idempotency.scopes AS s WHERE s.scope_id = l.scope_id) IS NOT DISTINCT FROM $5
           AND idempotency.key_barrier(l.key_digest)
         RETURNING l.*)
       INSERT INTO idempotency.%I SELECT * FROM moved ON CONFLICT (key_digest) DO NOTHING', claim.bucket)
    USING first_tid, last_tid, claim.starts_at, claim.ends_at, claim.lane;
    GET DIAGNOSTICS n = ROW_COUNT;
    -- Nothing moved: a concurrent change took the claim; the next run sees it anew.
    EXIT WHEN n = 0;
    done := done + n;
  END LOOP;
  RETURN done;
END
$$;
REVOKE ALL ON FUNCTION idempotency.move_to_buckets_as_owner(bigint, bigint, interval, boolean) FROM PUBLIC;

-- Waits for any claim holding the key's lock to finish, then lets it go: a claim holds it
-- from its search to its insert (src/postgres/unique.rs).
CREATE FUNCTION idempotency.key_barrier(key_digest uuid) RETURNS boolean
LANGUAGE c VOLATILE STRICT PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'key_barrier_entry';
REVOKE ALL ON FUNCTION idempotency.key_barrier(uuid) FROM PUBLIC;

CREATE FUNCTION idempotency.maintain_ledger_buckets()
RETURNS TABLE (created integer, dropped integer, dropped_claims bigint)
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'maintain_ledger_buckets_entry';
CREATE FUNCTION idempotency.move_to_buckets(first_block bigint, last_block bigint, prepare boolean DEFAULT false)
RETURNS bigint
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'move_to_buckets_entry';
COMMENT ON FUNCTION idempotency.move_to_buckets(bigint, bigint, boolean) IS
  'Moves the unexpired claims of the ledger itself in blocks [first_block, last_block) into their buckets, once it has buckets; with prepare, only makes or unseals those buckets, which must be committed before the move. For a role that may DELETE from idempotency.ledger; idem_purge runs both after each batch of the ledger.';

COMMENT ON FUNCTION idempotency.maintain_ledger_buckets() IS
  'Drops the ledger''s buckets whose claims have all expired (dropped_claims: how many), and makes the next ones once the ledger holds idempotency.ledger_buckets_from claims; for a role that may DELETE from idempotency.ledger. idem_purge runs it first.';

-- The estimate samples the ledger with its buckets, so its share is of all their blocks.
CREATE OR REPLACE FUNCTION idempotency.ledger_estimate(since interval)
RETURNS TABLE (scope_id bigint, claims bigint, claims_since bigint, bytes bigint)
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  tables regclass[] := ARRAY(SELECT 'idempotency.ledger'::regclass
                             UNION ALL
                             SELECT i.inhrelid::regclass FROM pg_inherits AS i
                             WHERE i.inhparent = 'idempotency.ledger'::regclass);
  blocks float8 := GREATEST((SELECT sum(pg_relation_size(t)) FROM unnest(tables) AS t)
                            / current_setting('block_size')::float8, 1);
  total_bytes float8 := (SELECT sum(pg_total_relation_size(t)) FROM unnest(tables) AS t);
  percent float8 := LEAST(100, 100 * 10000 / blocks);
BEGIN
  RETURN QUERY
  WITH sampled AS (
    SELECT l.scope_id AS id, count(*) AS n,
           count(*) FILTER (WHERE l.claimed_at >= (now() - since)) AS n_since
    FROM idempotency.ledger AS l TABLESAMPLE SYSTEM (percent)
    GROUP BY l.scope_id
  )
  SELECT x.id,
         round(x.n * 100 / percent)::int8,
         round(x.n_since * 100 / percent)::int8,
         round(total_bytes * x.n::float8 / (sum(x.n) OVER ()))::int8
  FROM sampled AS x;
END
$$;
