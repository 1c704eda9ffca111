-- The same transaction with idem_claim as its own statement. Five round trips, as by hand.
\set k random(1, 9000000000000000000)
\set acct random(1, 1000)
BEGIN;
SELECT idem_claim(:k::text, 'billing');
INSERT INTO consumer_payments (order_id, account, amount) VALUES (:k::text, :acct, 10);
UPDATE consumer_accounts SET balance = balance + 10 WHERE id = :acct;
COMMIT;
