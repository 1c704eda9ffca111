-- The outbox: a handler writes its downstream messages in the same transaction as its claim
-- and its business change; relays publish them after commit. Message ids are derived from
-- the claim, so a handler that runs again emits the same ids.

-- The n-th message after a claim gets the id of (scope, key, n): the same as
-- idem_message_id, a UUID of version 8 whose text never changes across releases.
BEGIN;
SELECT idem_claim('order-17:paid', 'billing');
INSERT INTO payments (order_id, amount) VALUES (17, 40.00);
SELECT idem_send('orders.paid', '{"order": 17}') AS first_id;
SELECT idem_send('emails.receipt', '{"order": 17}', headers => '{"traceparent": "00-a"}') AS second_id;
SELECT idem_message_id('order-17:paid', 'billing', 1) AS expected_first,
       idem_message_id('order-17:paid', 'billing', 2) AS expected_second;
COMMIT;
SELECT topic, ordering_key, payload, headers, attempts, sent_at IS NULL AS pending
FROM idempotency.outbox ORDER BY seq;

-- The handler runs again for the same business key (its claim purged and made anew, or a
-- backfill): the same ids, and sending an id again does nothing.
DELETE FROM idempotency.ledger WHERE key_digest = idem_digest('order-17:paid', 'billing');
DELETE FROM payments WHERE order_id = 17;
BEGIN;
SELECT idem_claim('order-17:paid', 'billing');
INSERT INTO payments (order_id, amount) VALUES (17, 40.00);
SELECT idem_send('orders.paid', '{"order": 17}') = idem_message_id('order-17:paid', 'billing', 1) AS same_first;
-- Headers are not part of a message's identity: a new trace id is no new message.
SELECT idem_send('emails.receipt', '{"order": 17}', headers => '{"traceparent": "00-b"}')
       = idem_message_id('order-17:paid', 'billing', 2) AS same_second;
COMMIT;
SELECT count(*) AS messages, min(headers->>'traceparent') AS first_headers_kept FROM idempotency.outbox;

-- The same id with another payload, topic or ordering key would be another message under a
-- used id: ID001, as for a claim's payload, and the first one stays.
SELECT idem_send('orders.paid', '{"order": 17}', key => 'k') = idem_message_id('k', 'default', 0) AS sent;
SELECT sqlstate_of($$SELECT idem_send('orders.paid', '{"order": 18}', key => 'k')$$);
SELECT sqlstate_of($$SELECT idem_send('orders.refunded', '{"order": 17}', key => 'k')$$);
SELECT sqlstate_of($$SELECT idem_send('orders.paid', '{"order": 17}', ordering_key => 'o', key => 'k')$$);
SELECT idem_send('orders.paid', '{"order": 17}', key => 'k') = idem_message_id('k', 'default', 0) AS same_again;
SELECT topic, ordering_key, payload FROM idempotency.outbox WHERE id = idem_message_id('k', 'default', 0);

-- Which claim counts: the last successful single claim of the transaction. A duplicate
-- (false) changes nothing; a new claim starts counting again from 1.
BEGIN;
SELECT idem_claim('a', 'which');
SELECT idem_send('t', '{}') = idem_message_id('a', 'which', 1) AS from_a_1;
SELECT idem_claim('a', 'which') AS duplicate;
SELECT idem_send('t', '{}') = idem_message_id('a', 'which', 2) AS still_from_a_2;
SELECT idem_claim('b', 'which');
SELECT idem_send('t', '{}') = idem_message_id('b', 'which', 1) AS from_b_1;
-- A batch claim is not a single claim: the count goes on from b.
SELECT idem_claim_many(ARRAY['c', 'd'], 'which');
SELECT idem_send('t', '{}') = idem_message_id('b', 'which', 2) AS still_from_b_2;
-- idem_claim_nowait and idem_claim_replay are single claims too.
SELECT claimed FROM idem_claim_replay('e', 'which');
SELECT idem_send('t', '{}') = idem_message_id('e', 'which', 1) AS from_e_1;
ROLLBACK;

-- A message sent in a savepoint that is rolled back to does not use up its position, and
-- neither does a claim made there; a savepoint that is released keeps both.
BEGIN;
SELECT idem_claim('f', 'savepoints');
SAVEPOINT s1;
SELECT idem_send('t', '{"try": 1}') = idem_message_id('f', 'savepoints', 1) AS tried_1;
ROLLBACK TO s1;
SELECT idem_send('t', '{"try": 2}') = idem_message_id('f', 'savepoints', 1) AS again_1;
SAVEPOINT s2;
SELECT idem_claim('g', 'savepoints');
SAVEPOINT s3;
SELECT idem_send('t', '{}') = idem_message_id('g', 'savepoints', 1) AS from_g_1;
RELEASE s3;
ROLLBACK TO s2;
SELECT idem_send('t', '{}') = idem_message_id('f', 'savepoints', 2) AS back_to_f_2;
SAVEPOINT s4;
SELECT idem_send('t', '{}') = idem_message_id('f', 'savepoints', 3) AS f_3;
RELEASE s4;
SELECT idem_send('t', '{}') = idem_message_id('f', 'savepoints', 4) AS f_4;
ROLLBACK;

-- The next transaction starts with no claim: the count does not leak across transactions.
SELECT sqlstate_of($$SELECT idem_send('t', '{}')$$);

-- An explicit key gives the id of (default scope, key, 0), whatever was claimed.
SELECT idem_send('t', '{"explicit": true}', key => 'invoice-9') = idem_message_id('invoice-9', 'default', 0) AS explicit;

-- Bad input.
SELECT sqlstate_of($$SELECT idem_send(NULL, '{}', key => 'x')$$);
SELECT sqlstate_of($$SELECT idem_send('t', NULL, key => 'x')$$);
SELECT sqlstate_of($$SELECT idem_send('', '{}', key => 'x')$$);
SELECT sqlstate_of($$SELECT idem_send('t', '{}', ordering_key => '', key => 'x')$$);
SELECT sqlstate_of($$SELECT idem_send('t', '{}', key => '')$$);
SELECT sqlstate_of($$SELECT idem_send('t', '{}', ordering_key => repeat('k', 1025), key => 'x')$$);
-- Headers are a JSON object, or NULL: the relay makes a header of each member, and anything
-- else would reach the broker without them (before 0.5.0 it was stored).
SELECT sqlstate_of($$SELECT idem_send('t', '{}', headers => '[1, 2]', key => 'x')$$);
SELECT sqlstate_of($$SELECT idem_send('t', '{}', headers => 'null', key => 'x')$$);
SELECT sqlstate_of($$SELECT idem_send('t', '{}', headers => '"h"', key => 'x')$$);
SELECT sqlstate_of($$SELECT idem_message_id('k', 'default', -1)$$);
SELECT sqlstate_of($$SELECT idem_message_id('k', 'default', NULL)$$);

-- Pinned: these ids are a promise across releases.
SELECT idem_message_id('order-1', 'default', 1) AS order_1_first,
       idem_message_id('order-1', 'billing', 2) AS billing_second,
       idem_message_id('invoice-9', 'default', 0) AS explicit_invoice_9;

TRUNCATE idempotency.outbox;
