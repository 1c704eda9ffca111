-- Relays: each takes a batch inside a transaction, publishes it, marks every message sent
-- or failed, and commits. What a relay holds is locked until then; what it does not mark
-- stays pending.

-- Three steps of three orders, each order's steps under its ordering key, and two messages
-- without a key.
SELECT count(*) FROM (
  SELECT idem_send('orders', jsonb_build_object('order', o, 'step', s), ordering_key => 'order-' || o,
                   key => format('order-%s-step-%s', o, s))
  FROM generate_series(1, 3) AS s, generate_series(1, 3) AS o
  ORDER BY s, o) AS sent;
SELECT idem_send('audit', jsonb_build_object('n', n), key => 'audit-' || n) IS NOT NULL AS sent
FROM generate_series(1, 2) AS n;

-- Outside a transaction block a relay's locks would end with the statement: 25P01.
\set VERBOSITY sqlstate
SELECT * FROM idem_outbox_take();
SELECT idem_outbox_sent(ARRAY[]::uuid[]);
SELECT idem_outbox_failed(gen_random_uuid(), 'x');
\set VERBOSITY default

-- A batch lists each key's messages in the order they were sent (their transactions'
-- commit order), and the keyless ones.
BEGIN;
SELECT topic, ordering_key, payload->>'step' AS step FROM idem_outbox_take(100);
ROLLBACK;

-- A small batch takes the keyless messages, oldest first, up to half of it, then the heads of
-- keys, key after key, and then the messages behind the heads it took, as far as it has room.
BEGIN;
SELECT ordering_key, payload->>'step' AS step FROM idem_outbox_take(4);
ROLLBACK;
BEGIN;
SELECT ordering_key, payload->>'step' AS step FROM idem_outbox_take(6);
ROLLBACK;

-- Step 1 of order-1 is published; step 2 fails. The failure holds back order-1 (step 3 is not
-- handed out) until its retry time; the other keys go on.
BEGIN;
SELECT idem_outbox_sent(ARRAY[idem_message_id('order-1-step-1', 'default', 0)]) AS marked;
SELECT idem_outbox_failed(idem_message_id('order-1-step-2', 'default', 0), 'NACK: queue full', '1 hour') AS outcome;
COMMIT;
BEGIN;
SELECT ordering_key, payload->>'step' AS step FROM idem_outbox_take(100) WHERE ordering_key IS NOT NULL;
ROLLBACK;
SELECT topic, pending, failed, set_aside, sent_last_minute FROM idempotency.outbox_status ORDER BY topic;

-- A key's messages are marked sent in order, or not at all: 55000 names the earlier one, the
-- earliest pending when several are.
BEGIN;
SELECT sqlstate_of($$SELECT idem_outbox_sent(ARRAY[idem_message_id('order-2-step-2', 'default', 0)])$$) ~ '^55000' AS refused;
SELECT sqlstate_of($$SELECT idem_outbox_sent(ARRAY[idem_message_id('order-3-step-3', 'default', 0)])$$)
       = format('55000: message %s cannot be marked sent before message %s of the same ordering key',
                idem_message_id('order-3-step-3', 'default', 0), idem_message_id('order-3-step-1', 'default', 0))
       AS names_the_earliest;
SELECT idem_outbox_sent(ARRAY[idem_message_id('order-2-step-2', 'default', 0), idem_message_id('order-2-step-1', 'default', 0)]) AS marked;
-- Marking again changes nothing.
SELECT idem_outbox_sent(ARRAY[idem_message_id('order-2-step-1', 'default', 0)]) AS marked_again;
COMMIT;

-- Due again, the failed step comes back first; after max_attempts it is set aside, with its
-- reason, and no longer holds its key back.
UPDATE idempotency.outbox SET retry_at = now() WHERE id = idem_message_id('order-1-step-2', 'default', 0);
BEGIN;
SELECT payload->>'step' AS step, attempts FROM idem_outbox_take(100) WHERE ordering_key = 'order-1';
SELECT idem_outbox_failed(idem_message_id('order-1-step-2', 'default', 0), 'NACK: poison', '0', max_attempts => 2) AS outcome;
SELECT idem_outbox_failed(idem_message_id('order-1-step-2', 'default', 0), 'again', '0') AS outcome;
COMMIT;
SELECT ordering_key, payload->>'step' AS step, attempts, last_error FROM idempotency.outbox_set_aside;
BEGIN;
SELECT payload->>'step' AS step FROM idem_outbox_take(100) WHERE ordering_key = 'order-1';
ROLLBACK;

-- Requeued, it is pending again from scratch, behind the messages of its key so far: it
-- joins the tail, as a new send would (at its old place it would be the head of a key that a
-- relay may be holding).
SELECT idem_outbox_requeue(idem_message_id('order-1-step-2', 'default', 0)) AS requeued,
       idem_outbox_requeue(idem_message_id('order-1-step-2', 'default', 0)) AS requeued_twice;
SELECT attempts, retry_at, set_aside_at FROM idempotency.outbox WHERE id = idem_message_id('order-1-step-2', 'default', 0);
BEGIN;
SELECT payload->>'step' AS step FROM idem_outbox_take(100) WHERE ordering_key = 'order-1';
ROLLBACK;

-- A key's messages stop at its first one that is not due: step 1 of order-3 failed with no
-- wait, step 2 with an hour's; the relay gets step 1 alone.
BEGIN;
SELECT idem_outbox_failed(idem_message_id('order-3-step-1', 'default', 0), 'timeout', '0') AS outcome;
SELECT idem_outbox_failed(idem_message_id('order-3-step-2', 'default', 0), 'timeout', '1 hour') AS outcome;
COMMIT;
BEGIN;
SELECT payload->>'step' AS step FROM idem_outbox_take(100) WHERE ordering_key = 'order-3';
ROLLBACK;

-- Relays run at READ COMMITTED: at REPEATABLE READ a message another relay marked since the
-- snapshot would raise 40001 when locked.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT sqlstate_of($$SELECT * FROM idem_outbox_take()$$);
ROLLBACK;

-- A cached sequence would number one key's messages out of commit order: relays refuse it,
-- and so do a send and a requeue of a message with an ordering key, so that no message is
-- numbered so meanwhile (a message without one keeps no order, and is sent).
ALTER SEQUENCE idempotency.outbox_seq CACHE 20;
BEGIN;
SELECT sqlstate_of($$SELECT * FROM idem_outbox_take()$$);
ROLLBACK;
BEGIN;
SELECT idem_claim('cached-1') AS claimed;
SELECT sqlstate_of($$SELECT idem_send('orders', '{"step": "cached"}', ordering_key => 'order-cached')$$) AS keyed_send;
SELECT idem_send('audit', '{"step": "cached"}') IS NOT NULL AS unkeyed_send;
ROLLBACK;
ALTER SEQUENCE idempotency.outbox_seq CACHE 1;
BEGIN;
SELECT idem_send('orders', '{"step": "set aside"}', ordering_key => 'order-requeue', key => 'requeue-1') AS requeue_id \gset
UPDATE idempotency.outbox SET set_aside_at = now() WHERE id = :'requeue_id';
ALTER SEQUENCE idempotency.outbox_seq CACHE 20;
SELECT sqlstate_of(format($$SELECT idem_outbox_requeue(%L)$$, :'requeue_id')) AS keyed_requeue;
ROLLBACK;

-- Senders serialize on a key's bytes, relays group keys by the column's collation: under a
-- nondeterministic one, 'k' and 'K' would be two keys to the senders and one to the relays,
-- numbered out of commit order. A keyed send, a requeue and a take refuse it, naming the
-- collation; a message without a key keeps no order to break. (The extension's view of
-- set-aside messages reads the column, so a DBA must take it out of the extension first.)
CREATE COLLATION case_blind (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
BEGIN;
SELECT idem_send('orders', '{"step": "blind"}', ordering_key => 'order-blind', key => 'blind-1') AS blind_id \gset
UPDATE idempotency.outbox SET set_aside_at = now() WHERE id = :'blind_id';
ALTER EXTENSION idempotency DROP VIEW idempotency.outbox_set_aside;
DROP VIEW idempotency.outbox_set_aside;
ALTER TABLE idempotency.outbox ALTER COLUMN ordering_key TYPE text COLLATE case_blind;
SELECT idem_claim('blind-2') AS claimed;
SELECT sqlstate_of($$SELECT idem_send('orders', '{"step": "blind"}', ordering_key => 'Order-Blind')$$) AS keyed_send;
SELECT sqlstate_of(format($$SELECT idem_outbox_requeue(%L)$$, :'blind_id')) AS keyed_requeue;
SELECT sqlstate_of($$SELECT * FROM idem_outbox_take()$$) AS take;
SELECT idem_send('audit', '{"step": "blind"}') IS NOT NULL AS unkeyed_send;
ROLLBACK;
DROP COLLATION case_blind;

-- A sequence that went back (RESTART, setval, a negative INCREMENT, CYCLE, or a restore or
-- logical replica that did not carry it over) would number a key's new message before its
-- pending ones, and relays would hand it out first: a keyed send and a requeue refuse it; a
-- key with nothing pending, and a message without a key, keep no order to break.
BEGIN;
SELECT idem_send('orders', '{"n": 1}', ordering_key => 'order-back', key => 'back-1') AS back_1 \gset
SELECT idem_send('orders', '{"n": 2}', ordering_key => 'order-back', key => 'back-2') AS back_2 \gset
SELECT setval('idempotency.outbox_seq', (SELECT min(seq) FROM idempotency.outbox WHERE ordering_key = 'order-back') - 1) IS NOT NULL AS set_back;
-- (The message's id and the numbers, which depend on what ran before, are masked.)
CREATE FUNCTION masked(text) RETURNS text LANGUAGE sql RETURN regexp_replace($1, '[0-9a-f]{8}-[0-9a-f-]{27}|(?<=number |above )[0-9]+', '…', 'g');
SELECT masked(sqlstate_of($$SELECT idem_send('orders', '{"n": 3}', ordering_key => 'order-back', key => 'back-3')$$)) AS keyed_send_after_setval;
SELECT idem_send('orders', '{"n": 1}', ordering_key => 'order-fresh', key => 'back-fresh') IS NOT NULL AS fresh_key_sends,
       idem_send('audit', '{"n": 1}', key => 'back-unkeyed') IS NOT NULL AS unkeyed_sends;
SELECT count(*) AS back_3_rows FROM idempotency.outbox WHERE id = idem_message_id('back-3', 'default', 0);
-- The same for a requeue: set aside the key's first message, then move the sequence back.
UPDATE idempotency.outbox SET set_aside_at = now() WHERE id = :'back_1';
SELECT setval('idempotency.outbox_seq', (SELECT max(seq) FROM idempotency.outbox)) IS NOT NULL AS set_ahead;
SELECT idem_outbox_requeue(:'back_1') AS requeued_at_the_tail;
UPDATE idempotency.outbox SET set_aside_at = now() WHERE id = :'back_1';
SELECT setval('idempotency.outbox_seq', 1) IS NOT NULL AS set_back_again;
SELECT masked(sqlstate_of(format($$SELECT idem_outbox_requeue(%L)$$, :'back_1'))) AS requeue_after_setval;
ROLLBACK;

-- The check reads only pending messages, from the new number on: a number equal to a pending
-- one's is refused too, and sent or set-aside messages numbered later hold nothing back.
BEGIN;
CREATE FUNCTION masked(text) RETURNS text LANGUAGE sql RETURN regexp_replace($1, '[0-9a-f]{8}-[0-9a-f-]{27}|(?<=number |above )[0-9]+', '…', 'g');
SELECT idem_send('orders', '{"n": 1}', ordering_key => 'order-equal', key => 'equal-1') AS equal_1 \gset
SELECT setval('idempotency.outbox_seq', (SELECT seq FROM idempotency.outbox WHERE id = :'equal_1') - 1) IS NOT NULL AS set_to_just_before;
SELECT masked(sqlstate_of($$SELECT idem_send('orders', '{"n": 2}', ordering_key => 'order-equal', key => 'equal-2')$$)) AS send_at_an_equal_number;
UPDATE idempotency.outbox SET sent_at = now() WHERE id = :'equal_1';
SELECT setval('idempotency.outbox_seq', (SELECT seq FROM idempotency.outbox WHERE id = :'equal_1') - 1) IS NOT NULL AS set_back_before_sent;
SELECT idem_send('orders', '{"n": 3}', ordering_key => 'order-equal', key => 'equal-3') IS NOT NULL AS sends_before_a_sent_message;
UPDATE idempotency.outbox SET set_aside_at = now() WHERE id = idem_message_id('equal-3', 'default', 0);
SELECT setval('idempotency.outbox_seq', (SELECT seq FROM idempotency.outbox WHERE id = :'equal_1') - 1) IS NOT NULL AS set_back_before_set_aside;
SELECT idem_send('orders', '{"n": 4}', ordering_key => 'order-equal', key => 'equal-4') IS NOT NULL AS sends_before_a_set_aside_message;
ROLLBACK;

-- A direct send probes the pending index while it is the one the extension made; an index a
-- DBA rebuilt otherwise, or none, leaves the check to its query, with the same refusal.
BEGIN;
CREATE FUNCTION masked(text) RETURNS text LANGUAGE sql RETURN regexp_replace($1, '[0-9a-f]{8}-[0-9a-f-]{27}|(?<=number |above )[0-9]+', '…', 'g');
SELECT idem_send('orders', '{"n": 1}', ordering_key => 'order-rebuilt', key => 'rebuilt-1') AS rebuilt_1 \gset
DROP INDEX idempotency.outbox_pending;
CREATE INDEX outbox_pending ON idempotency.outbox (ordering_key, seq) WHERE sent_at IS NULL;
SELECT setval('idempotency.outbox_seq', (SELECT seq FROM idempotency.outbox WHERE id = :'rebuilt_1') - 1) IS NOT NULL AS set_back;
SELECT masked(sqlstate_of($$SELECT idem_send('orders', '{"n": 2}', ordering_key => 'order-rebuilt', key => 'rebuilt-2')$$)) AS with_another_predicate;
DROP INDEX idempotency.outbox_pending;
CREATE INDEX outbox_pending ON idempotency.outbox (ordering_key COLLATE "C", seq) WHERE sent_at IS NULL AND set_aside_at IS NULL;
SELECT setval('idempotency.outbox_seq', (SELECT seq FROM idempotency.outbox WHERE id = :'rebuilt_1') - 1) IS NOT NULL AS set_back;
SELECT masked(sqlstate_of($$SELECT idem_send('orders', '{"n": 2}', ordering_key => 'order-rebuilt', key => 'rebuilt-2')$$)) AS with_another_collation;
DROP INDEX idempotency.outbox_pending;
SELECT setval('idempotency.outbox_seq', (SELECT seq FROM idempotency.outbox WHERE id = :'rebuilt_1') - 1) IS NOT NULL AS set_back;
SELECT masked(sqlstate_of($$SELECT idem_send('orders', '{"n": 2}', ordering_key => 'order-rebuilt', key => 'rebuilt-2')$$)) AS without_the_index;
ROLLBACK;

-- The check reads as the outbox's owner. An owner that cannot read it (a DBA gave the table
-- to a role without USAGE on the schema, or revoked its SELECT) fails a keyed send with 42501
-- whichever way the row was written; a message without a key needs no check.
BEGIN;
CREATE ROLE idem_regress_outbox_owner NOLOGIN;
ALTER TABLE idempotency.outbox OWNER TO idem_regress_outbox_owner;
SELECT sqlstate_of($$SELECT idem_send('orders', '{"n": 1}', ordering_key => 'order-owner', key => 'owner-1')$$) AS owner_without_usage;
GRANT USAGE ON SCHEMA idempotency TO idem_regress_outbox_owner;
REVOKE SELECT ON idempotency.outbox FROM idem_regress_outbox_owner;
SELECT sqlstate_of($$SELECT idem_send('orders', '{"n": 2}', ordering_key => 'order-owner', key => 'owner-2')$$) AS owner_without_select;
SELECT idem_send('audit', '{"n": 3}', key => 'owner-3') IS NOT NULL AS unkeyed_sends;
ROLLBACK;

-- Bad arguments.
BEGIN;
SELECT sqlstate_of($$SELECT * FROM idem_outbox_take(0)$$);
SELECT sqlstate_of($$SELECT * FROM idem_outbox_take(NULL)$$);
SELECT sqlstate_of($$SELECT idem_outbox_sent(ARRAY[NULL]::uuid[])$$);
SELECT sqlstate_of($$SELECT idem_outbox_sent(NULL)$$);
-- More than one dimension is refused as idem_claim_many refuses it (before 0.5.0: 0A000);
-- other lower bounds are fine, as = ANY reads them.
SELECT sqlstate_of($$SELECT idem_outbox_sent(ARRAY[ARRAY[gen_random_uuid()], ARRAY[gen_random_uuid()]])$$);
SELECT sqlstate_of($$SELECT idem_outbox_sent(ARRAY[ARRAY[NULL::uuid]])$$);
SELECT idem_outbox_sent('[5:5]={00000000-0000-0000-0000-000000000000}'::uuid[]) AS marked_from_subscript_5;
SELECT sqlstate_of($$SELECT idem_outbox_failed(NULL, 'x')$$);
SELECT sqlstate_of($$SELECT idem_outbox_failed(gen_random_uuid(), 'x', '-1 s')$$);
SELECT idem_outbox_failed(gen_random_uuid(), 'unknown id') AS outcome;
ROLLBACK;

TRUNCATE idempotency.outbox;

-- Many keys, small batches: a take walks the keys from the one after the last key this
-- session took (idempotency.outbox_take_after, kept when the take commits) and wraps around,
-- so every key gets its turn, however many keys have messages waiting.
SELECT count(idem_send('orders', jsonb_build_object('n', n), ordering_key => 'key-' || (n % 5), key => 'turn-' || n))
FROM generate_series(1, 10) AS n;
SET idempotency.outbox_take_after = '';
BEGIN;
SELECT string_agg(ordering_key || ':' || (payload->>'n'), ' ' ORDER BY ordering_key) AS first_take FROM idem_outbox_take(2);
COMMIT;
SHOW idempotency.outbox_take_after;
BEGIN;
SELECT string_agg(ordering_key || ':' || (payload->>'n'), ' ' ORDER BY ordering_key) AS second_take FROM idem_outbox_take(2);
COMMIT;
BEGIN;
SELECT string_agg(ordering_key || ':' || (payload->>'n'), ' ' ORDER BY ordering_key) AS third_take_wraps FROM idem_outbox_take(2);
COMMIT;
-- A take rolled back leaves the session where it was.
BEGIN;
SELECT string_agg(ordering_key, ' ') AS rolled_back FROM idem_outbox_take(2);
ROLLBACK;
SHOW idempotency.outbox_take_after;
RESET idempotency.outbox_take_after;
TRUNCATE idempotency.outbox;
