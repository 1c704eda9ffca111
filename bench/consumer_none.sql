-- A consumer's whole transaction without dedup (make bench's "consumer" run): a payment and
-- the account it credits. Four round trips.
\set k random(1, 9000000000000000000)
\set acct random(1, 1000)
BEGIN;
INSERT INTO consumer_payments (order_id, account, amount) VALUES (:k::text, :acct, 10);
UPDATE consumer_accounts SET balance = balance + 10 WHERE id = :acct;
COMMIT;
