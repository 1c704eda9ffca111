-- The same transaction with the dedup a user writes by hand: a key table of its own, claimed
-- with INSERT … ON CONFLICT DO NOTHING. Every key is new, so the effect always follows.
\set k random(1, 9000000000000000000)
\set acct random(1, 1000)
BEGIN;
INSERT INTO hand_ledger (scope, key) VALUES ('billing', :k::text) ON CONFLICT DO NOTHING;
INSERT INTO consumer_payments (order_id, account, amount) VALUES (:k::text, :acct, 10);
UPDATE consumer_accounts SET balance = balance + 10 WHERE id = :acct;
COMMIT;
