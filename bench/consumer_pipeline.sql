-- The whole effect in one statement (claim, payment, credit), sent with BEGIN and COMMIT in
-- one pipeline: one round trip. A duplicate claims nothing, so it inserts and credits nothing.
\set k random(1, 9000000000000000000)
\set acct random(1, 1000)
\startpipeline
BEGIN;
WITH claimed AS (SELECT idem_claim(:k::text, 'billing') AS new),
     paid AS (INSERT INTO consumer_payments (order_id, account, amount) SELECT :k::text, :acct, 10 FROM claimed WHERE new RETURNING account, amount)
UPDATE consumer_accounts AS a SET balance = a.balance + paid.amount FROM paid WHERE a.id = paid.account;
COMMIT;
\endpipeline
