-- Sent messages stay idempotency.outbox_retention after they were sent, so that a handler
-- that runs again still sends nothing new; then idem_purge removes them with the expired
-- claims, in the same short batches. Pending and set-aside messages are never purged.
SHOW idempotency.outbox_retention;
SELECT idem_outbox_retention();

SELECT count(idem_send('t', jsonb_build_object('n', n), key => 'purge-' || n)) FROM generate_series(1, 6) AS n;
BEGIN;
SELECT idem_outbox_sent(ARRAY(SELECT idem_message_id('purge-' || n, 'default', 0) FROM generate_series(1, 4) AS n)) AS marked;
SELECT idem_outbox_failed(idem_message_id('purge-5', 'default', 0), 'poison', '0', max_attempts => 1) AS outcome;
COMMIT;
-- Two of the sent messages were sent two days ago, two just now. (Only the extension's owner
-- may write the outbox like this.)
UPDATE idempotency.outbox SET sent_at = now() - interval '2 days'
WHERE id IN (idem_message_id('purge-1', 'default', 0), idem_message_id('purge-2', 'default', 0));

CALL idem_purge(batch_blocks => 1);
SELECT payload->>'n' AS kept,
       CASE WHEN sent_at IS NOT NULL THEN 'sent recently' WHEN set_aside_at IS NOT NULL THEN 'set aside' ELSE 'pending' END AS why
FROM idempotency.outbox ORDER BY seq;
SELECT deleted, blocks_done = blocks AS walked_everything FROM idempotency.purge_runs ORDER BY run_id DESC LIMIT 1;

-- A shorter retention (a superuser's setting) lets the recent ones go too; nothing unsent does.
SET idempotency.outbox_retention = '1s';
SELECT idem_outbox_retention();
SELECT pg_sleep(1.1);
CALL idem_purge();
SELECT payload->>'n' AS kept FROM idempotency.outbox ORDER BY seq;
RESET idempotency.outbox_retention;

TRUNCATE idempotency.outbox;
