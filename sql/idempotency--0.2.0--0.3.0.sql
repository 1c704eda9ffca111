-- idempotency 0.2.0 -> 0.3.0: the transactional outbox (#11). Nothing stored before changes.
--
-- This script is also the last part of a fresh install's script (src/lib.rs), so it is the
-- outbox's one definition: an update and a new install create the very same objects.

-- Outbox messages. seq orders them: a sender takes it after the lock of its ordering key,
-- which it holds until it commits (see idem_send), so within one ordering key seq follows
-- commit order. A message is pending until a relay marks it sent, or it is set aside.
CREATE SEQUENCE idempotency.outbox_seq AS pg_catalog.int8;
CREATE TABLE idempotency.outbox (
    seq          pg_catalog.int8        NOT NULL,
    id           pg_catalog.uuid        NOT NULL,
    created_at   pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    retry_at     pg_catalog.timestamptz,
    set_aside_at pg_catalog.timestamptz,
    sent_at      pg_catalog.timestamptz,
    attempts     pg_catalog.int4        NOT NULL DEFAULT 0,
    topic        pg_catalog.text        NOT NULL,
    ordering_key pg_catalog.text,
    payload      pg_catalog.jsonb       NOT NULL,
    headers      pg_catalog.jsonb,
    last_error   pg_catalog.text,
    CONSTRAINT outbox_pkey PRIMARY KEY (id)
);
-- What relays search: the pending messages, by ordering key and then in order. (seq has no
-- index of its own: the sequence keeps it unique, and every send would pay for one.)
CREATE INDEX outbox_pending ON idempotency.outbox (ordering_key, seq)
    WHERE sent_at IS NULL AND set_aside_at IS NULL;
COMMENT ON TABLE idempotency.outbox IS
  'Messages written by idem_send in the sender''s transaction, handed to relays by idem_outbox_take in commit order per ordering key.';
COMMENT ON COLUMN idempotency.outbox.seq IS 'Order of the messages: within one ordering key, the order their transactions committed';
COMMENT ON COLUMN idempotency.outbox.id IS 'Deterministic message id (UUID version 8); relays publish it as the broker''s message id';
COMMENT ON COLUMN idempotency.outbox.retry_at IS 'A failed message is not handed out again before this time';
COMMENT ON COLUMN idempotency.outbox.set_aside_at IS 'When the message was set aside after too many failures; it no longer holds back its ordering key';
-- A restore must keep every pending message, and seq must go on from where it was, or new
-- messages would sort before restored ones.
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.outbox_seq', '');
REVOKE ALL ON TABLE idempotency.outbox FROM PUBLIC;
REVOKE ALL ON SEQUENCE idempotency.outbox_seq FROM PUBLIC;

CREATE FUNCTION idem_send(topic text, payload jsonb, headers jsonb DEFAULT NULL,
    ordering_key text DEFAULT NULL, key text DEFAULT NULL)
RETURNS uuid LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'idem_send_entry';
COMMENT ON FUNCTION idem_send(text, jsonb, jsonb, text, text) IS
  'Writes a message to the outbox in the current transaction and returns its id: the n-th message sent after the last successful idem_claim gets an id derived from that claim and n, or from key when given. Sending an id again does nothing.';

CREATE FUNCTION idem_message_id(key text, scope text DEFAULT 'default', n bigint DEFAULT 1)
RETURNS uuid LANGUAGE c IMMUTABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'idem_message_id_entry';
COMMENT ON FUNCTION idem_message_id(text, text, bigint) IS
  'The id idem_send gives the n-th message sent after claiming (scope, key); n = 0 in the default scope is the id of idem_send(..., key => key).';

CREATE FUNCTION idem_outbox_retention()
RETURNS interval LANGUAGE c STABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'idem_outbox_retention_wrapper';
COMMENT ON FUNCTION idem_outbox_retention() IS
  'How long sent messages stay in the outbox before idem_purge removes them: the setting idempotency.outbox_retention.';

-- The relays' interface. A relay calls idem_outbox_take inside a transaction, publishes what
-- it got, marks each message sent or failed, and commits; the row locks it took keep every
-- other relay off those messages, and off their ordering keys, until then. A relay that dies
-- rolls back, and its messages are pending again, untouched.
CREATE FUNCTION idempotency.require_transaction_block(what text)
RETURNS void LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'require_transaction_block_entry';
COMMENT ON FUNCTION idempotency.require_transaction_block(text) IS
  'Raises 25P01 outside a transaction block: a relay''s locks must last until it has published.';

CREATE FUNCTION idempotency.lock_ordering_key(ordering_key text)
RETURNS void LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'lock_ordering_key_entry';
COMMENT ON FUNCTION idempotency.lock_ordering_key(text) IS
  'Takes the lock a sender of this ordering key holds until it commits, as idem_send does before it draws a seq.';

CREATE FUNCTION idem_outbox_take(batch_size integer DEFAULT 100)
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
  IF (SELECT q.seqcache FROM pg_catalog.pg_sequence AS q
      WHERE q.seqrelid = 'idempotency.outbox_seq'::regclass) > 1 THEN
    RAISE EXCEPTION USING ERRCODE = '55000',
      MESSAGE = 'idempotency.outbox_seq has a CACHE above 1, which numbers messages out of commit order',
      HINT = 'ALTER SEQUENCE idempotency.outbox_seq CACHE 1;';
  END IF;
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
  -- end before its first message that is not due yet (one that failed).
  followers := ARRAY(
    SELECT f.id FROM idempotency.outbox AS f
    WHERE f.ordering_key IN (SELECT o.ordering_key FROM idempotency.outbox AS o WHERE o.id = ANY (heads))
      AND f.sent_at IS NULL AND f.set_aside_at IS NULL
      AND f.id <> ALL (heads)
      AND NOT EXISTS (
            SELECT FROM idempotency.outbox AS w
            WHERE w.ordering_key = f.ordering_key AND w.seq <= f.seq
              AND w.sent_at IS NULL AND w.set_aside_at IS NULL AND w.retry_at > clock_timestamp())
    ORDER BY f.seq
    LIMIT batch_size - cardinality(keyless) - cardinality(heads)
    FOR UPDATE);
  RETURN QUERY
    SELECT o.id, o.topic, o.ordering_key, o.payload, o.headers, o.attempts, o.created_at
    FROM idempotency.outbox AS o
    WHERE o.id = ANY (keyless || heads || followers)
    ORDER BY o.seq;
END
$$;
COMMENT ON FUNCTION idem_outbox_take(integer) IS
  'For relays, inside a transaction: up to batch_size pending messages, locked until commit, in order; publish each ordering key''s messages in the order given and stop a key at its first failure.';

CREATE FUNCTION idem_outbox_sent(ids uuid[])
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  early record;
  marked integer;
BEGIN
  PERFORM idempotency.require_transaction_block('idem_outbox_sent');
  IF ids IS NULL OR array_position(ids, NULL) IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004', MESSAGE = 'ids must not be NULL nor hold a NULL';
  END IF;
  -- A key's messages are sent in order: none may be marked while an earlier one is pending.
  SELECT m.id, e.id AS earlier INTO early
  FROM idempotency.outbox AS m
  JOIN idempotency.outbox AS e
    ON e.ordering_key = m.ordering_key AND e.seq < m.seq
   AND e.sent_at IS NULL AND e.set_aside_at IS NULL AND e.id <> ALL (ids)
  WHERE m.id = ANY (ids) AND m.sent_at IS NULL
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
COMMENT ON FUNCTION idem_outbox_sent(uuid[]) IS
  'For relays: marks the messages the broker confirmed as sent; returns how many were pending. Raises 55000 if a key''s earlier message is still pending.';

CREATE FUNCTION idem_outbox_failed(id uuid, reason text, retry_after interval DEFAULT '5 seconds',
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
  IF retry_after < interval '0' OR max_attempts < 1 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('retry_after must not be negative and max_attempts must be at least 1, not %s and %s', retry_after, max_attempts);
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
COMMENT ON FUNCTION idem_outbox_failed(uuid, text, interval, integer) IS
  'For relays: records a failed delivery; the message (and its ordering key) waits retry_after, and is set aside at max_attempts. Returns retry, set aside or not pending.';

CREATE FUNCTION idem_outbox_requeue(id uuid)
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
  RETURN FOUND;
END
$$;
COMMENT ON FUNCTION idem_outbox_requeue(uuid) IS
  'Puts a set-aside message back in the queue, behind every message of its ordering key sent so far: it arrives after them.';

CREATE VIEW idempotency.outbox_set_aside AS
SELECT o.id, o.topic, o.ordering_key, o.attempts, o.last_error, o.set_aside_at, o.created_at, o.payload, o.headers
FROM idempotency.outbox AS o
WHERE o.set_aside_at IS NOT NULL AND o.sent_at IS NULL;
COMMENT ON VIEW idempotency.outbox_set_aside IS
  'Messages set aside after too many failed deliveries, with the last reason; idem_outbox_requeue(id) puts one back.';

CREATE VIEW idempotency.outbox_status AS
SELECT o.topic,
       count(*) FILTER (WHERE o.sent_at IS NULL AND o.set_aside_at IS NULL) AS pending,
       now() - min(o.created_at) FILTER (WHERE o.sent_at IS NULL AND o.set_aside_at IS NULL) AS oldest_pending_age,
       count(*) FILTER (WHERE o.sent_at IS NULL AND o.set_aside_at IS NULL AND o.attempts > 0) AS failed,
       count(*) FILTER (WHERE o.set_aside_at IS NOT NULL AND o.sent_at IS NULL) AS set_aside,
       count(*) FILTER (WHERE o.sent_at >= now() - interval '1 minute') AS sent_last_minute
FROM idempotency.outbox AS o
GROUP BY o.topic;
COMMENT ON VIEW idempotency.outbox_status IS
  'Per topic: pending messages, the oldest one''s age, pending ones that failed at least once, set aside, and sent in the last minute.';

-- Sent messages are kept idempotency.outbox_retention after they were sent (so that sending
-- one of them again still does nothing), then idem_purge removes them: the purge walks the
-- ledger's heap and then the outbox's in ranges of blocks (TID range scans), deleting the
-- claims older than their scope's retention and the messages sent longer ago than the
-- outbox's, and commits after every range: short transactions, row locks only, no table
-- rewrite and no index that every claim or send would have to maintain. Pending and set-aside
-- messages are never purged. Claims and sends wait for nothing; a pause between batches
-- leaves the CPU to them (the scheduled job uses one).
CREATE OR REPLACE PROCEDURE idem_purge(batch_blocks integer DEFAULT 256, pause interval DEFAULT '0',
                            INOUT deleted bigint DEFAULT NULL)
LANGUAGE plpgsql
AS $$
DECLARE
  run bigint;
  ledger_blocks bigint;
  total_blocks bigint;
  done_blocks bigint := 0;
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
  -- Blocks are counted across both tables: the ledger's first, then the outbox's.
  ledger_blocks := pg_catalog.pg_relation_size('idempotency.ledger'::pg_catalog.regclass)
                   OPERATOR(pg_catalog./) pg_catalog.current_setting('block_size')::pg_catalog.int8;
  -- (Operators written OPERATOR(...) all bind alike, left to right: hence the parentheses.)
  total_blocks := ledger_blocks OPERATOR(pg_catalog.+)
                  (pg_catalog.pg_relation_size('idempotency.outbox'::pg_catalog.regclass)
                   OPERATOR(pg_catalog./) pg_catalog.current_setting('block_size')::pg_catalog.int8);
  INSERT INTO idempotency.purge_runs (blocks) VALUES (total_blocks) RETURNING run_id INTO run;
  COMMIT;
  WHILE done_blocks OPERATOR(pg_catalog.<) total_blocks LOOP
    IF done_blocks OPERATOR(pg_catalog.<) ledger_blocks THEN
      first_block := done_blocks;
      last_block := LEAST(first_block OPERATOR(pg_catalog.+) batch_blocks, ledger_blocks);
      DELETE FROM idempotency.ledger AS l
      WHERE l.ctid OPERATOR(pg_catalog.>=) pg_catalog.format('(%s,0)', first_block)::pg_catalog.tid
        AND l.ctid OPERATOR(pg_catalog.<) pg_catalog.format('(%s,0)', last_block)::pg_catalog.tid
        AND l.claimed_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) COALESCE(
              (SELECT s.retention FROM idempotency.scopes AS s WHERE s.scope_id OPERATOR(pg_catalog.=) l.scope_id),
              @extschema@.idem_default_retention()));
      done_blocks := last_block;
    ELSE
      first_block := done_blocks OPERATOR(pg_catalog.-) ledger_blocks;
      last_block := first_block OPERATOR(pg_catalog.+) batch_blocks;
      DELETE FROM idempotency.outbox AS o
      WHERE o.ctid OPERATOR(pg_catalog.>=) pg_catalog.format('(%s,0)', first_block)::pg_catalog.tid
        AND o.ctid OPERATOR(pg_catalog.<) pg_catalog.format('(%s,0)', last_block)::pg_catalog.tid
        AND o.sent_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) @extschema@.idem_outbox_retention());
      done_blocks := LEAST(done_blocks OPERATOR(pg_catalog.+) batch_blocks, total_blocks);
    END IF;
    GET DIAGNOSTICS removed = ROW_COUNT;
    deleted := deleted OPERATOR(pg_catalog.+) removed;
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
END
$$;
COMMENT ON PROCEDURE idem_purge(integer, interval, bigint) IS
  'Deletes expired claims, and outbox messages sent longer than idempotency.outbox_retention ago, in batches of batch_blocks heap blocks, committing (then pausing) after each; CALL it outside a transaction block. Progress: idempotency.purge_progress.';
