-- The claim: the first delivery of a message returns true, every duplicate false, and the
-- claim commits or rolls back together with the business change.

-- A consumer receives "order 42 paid" three times (producer retry, redelivery after a
-- visibility timeout, a DLQ replay).  Only the first has an effect.
BEGIN;
SELECT idem_claim('order-42:paid') AS first_delivery;
INSERT INTO payments VALUES (42, 99.50);
COMMIT;

BEGIN;
SELECT idem_claim('order-42:paid') AS redelivery;
-- A duplicate is not an error: the transaction is still usable and can go on (or ack).
SELECT count(*) AS payments_so_far FROM payments;
COMMIT;

SELECT idem_claim('order-42:paid') AS dlq_replay;
SELECT count(*) AS payments FROM payments;

-- Claiming twice inside one transaction is also a duplicate.
BEGIN;
SELECT idem_claim('order-43:paid') AS first, idem_claim('order-43:paid') AS second;
ROLLBACK;

-- A rolled-back transaction leaves no claim behind, so the redelivery is processed.
SELECT idem_claim('order-43:paid') AS after_rollback;

-- A savepoint rolled back takes its claim with it, like any other row.
BEGIN;
SAVEPOINT handler;
SELECT idem_claim('order-44:paid') AS in_savepoint;
ROLLBACK TO SAVEPOINT handler;
SELECT idem_claim('order-44:paid') AS after_savepoint_rollback;
COMMIT;

-- Scopes are independent namespaces: two consumer groups each process the message once.
SELECT idem_claim('order-42:paid', 'billing') AS billing,
       idem_claim('order-42:paid', 'shipping') AS shipping,
       idem_claim('order-42:paid', 'billing') AS billing_again;

-- Keys are compared byte for byte: no collation, no case folding, no Unicode normalisation.
SELECT idem_claim('Order-42') AS upper, idem_claim('order-42') AS lower,
       idem_claim(U&'caf\00E9') AS nfc, idem_claim(U&'cafe\0301') AS nfd,
       idem_claim('order-42 ') AS trailing_space;

-- A key of any length: a 1 MB key is stored as the same 16-byte digest as a short one.
SELECT idem_claim(repeat('k', 1024 * 1024)) AS one_megabyte_key,
       idem_claim(repeat('k', 1024 * 1024)) AS again,
       idem_claim(repeat('k', 1024 * 1024 - 1) || 'j') AS last_byte_differs;

-- What the ledger holds for a claim: the digest, the scope id and the claim's time.
BEGIN;
SELECT idem_claim('order-45:paid');
SELECT l.scope_id = idem_scope_id('default') AS scope_matches,
       l.claimed_at = now() AS claimed_at_transaction_start,
       l.fingerprint IS NULL AS no_payload, l.result IS NULL AS no_result
FROM idempotency.ledger AS l WHERE l.key_digest = idem_digest('order-45:paid');
COMMIT;

-- The ledger keeps one fixed-size row per claim, whatever the key's length.
SELECT count(*) AS ledger_rows, max(pg_column_size(l)) AS widest_row_bytes
FROM idempotency.ledger AS l;
