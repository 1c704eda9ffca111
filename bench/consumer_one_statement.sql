-- The claim inside the business statement: the INSERT's row count says whether the message
-- is new, and the UPDATE follows only then. One round trip fewer than the claim on its own.
\set k random(1, 9000000000000000000)
\set acct random(1, 1000)
BEGIN;
INSERT INTO consumer_payments (order_id, account, amount) SELECT :k::text, :acct, 10 WHERE idem_claim(:k::text, 'billing');
UPDATE consumer_accounts SET balance = balance + 10 WHERE id = :acct;
COMMIT;
