-- The claim inside the business statement: one round trip fewer than the claim on its own.
-- The statement's row count says whether the message was new; a duplicate inserts nothing.
-- Each story runs on its own: the tables are made and dropped here.
CREATE TABLE charges (order_id text PRIMARY KEY, account int NOT NULL, amount numeric NOT NULL);
CREATE TABLE wallets (id int PRIMARY KEY, balance numeric NOT NULL);
INSERT INTO wallets (id, balance) VALUES (1, 0), (2, 0);

BEGIN;
INSERT INTO charges (order_id, account, amount)
SELECT 'order-1', 1, 10 WHERE idem_claim('msg-1', 'billing');
UPDATE wallets SET balance = balance + 10 WHERE id = 1;  -- only when the INSERT said INSERT 0 1
COMMIT;

-- The row count the consumer reads: 1 for a new message (here a second one)...
BEGIN;
INSERT INTO charges (order_id, account, amount)
SELECT 'order-5', 1, 10 WHERE idem_claim('msg-5', 'billing');
\echo rows inserted: :ROW_COUNT
ROLLBACK;
-- ...and 0 for the duplicate, so the consumer commits nothing more and acks.
BEGIN;
INSERT INTO charges (order_id, account, amount)
SELECT 'order-1', 1, 10 WHERE idem_claim('msg-1', 'billing');
\echo rows inserted: :ROW_COUNT
COMMIT;

-- The whole effect in one statement: claim, payment and credit. Sent alone, or with BEGIN and
-- COMMIT in one pipeline, it is one round trip; a duplicate changes nothing.
WITH claimed AS (SELECT idem_claim('msg-2', 'billing') AS new),
     paid AS (INSERT INTO charges (order_id, account, amount)
              SELECT 'order-2', 2, 25 FROM claimed WHERE new RETURNING account, amount)
UPDATE wallets AS a SET balance = a.balance + paid.amount FROM paid WHERE a.id = paid.account;
WITH claimed AS (SELECT idem_claim('msg-2', 'billing') AS new),
     paid AS (INSERT INTO charges (order_id, account, amount)
              SELECT 'order-2', 2, 25 FROM claimed WHERE new RETURNING account, amount)
UPDATE wallets AS a SET balance = a.balance + paid.amount FROM paid WHERE a.id = paid.account;

-- An UPDATE alone: the claim in a WITH query, never in the UPDATE's WHERE, which PostgreSQL
-- may evaluate twice (pg_test/isolation/specs/one_statement_update.spec shows the race).
WITH claimed AS (SELECT idem_claim('msg-6', 'billing') AS new)
UPDATE wallets SET balance = balance + 10 FROM claimed WHERE id = 1 AND new;
WITH claimed AS (SELECT idem_claim('msg-6', 'billing') AS new)
UPDATE wallets SET balance = balance + 10 FROM claimed WHERE id = 1 AND new;

SELECT order_id, account, amount FROM charges ORDER BY order_id;
SELECT id, balance FROM wallets ORDER BY id;

-- A failure after the claim rolls the claim back with the statement: the message is new again.
CREATE FUNCTION refuse_big() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN IF NEW.amount > 1000 THEN RAISE EXCEPTION 'amount too large'; END IF; RETURN NEW; END $$;
CREATE TRIGGER refuse_big BEFORE INSERT ON charges FOR EACH ROW EXECUTE FUNCTION refuse_big();
INSERT INTO charges (order_id, account, amount)
SELECT 'order-3', 1, 5000 WHERE idem_claim('msg-3', 'billing');
SELECT idem_claim('msg-3', 'billing') AS new_again;

-- For many rows, claim in a WITH query: PostgreSQL runs a WITH query that calls a volatile
-- function once, whereas a subquery in FROM may run again for every row of a join.
WITH claimed AS (SELECT idem_claim('msg-4', 'billing') AS new)
INSERT INTO charges (order_id, account, amount)
SELECT 'order-4-' || g, 1, 1 FROM claimed, generate_series(1, 3) AS g WHERE new;
WITH claimed AS (SELECT idem_claim('msg-4', 'billing') AS new)
INSERT INTO charges (order_id, account, amount)
SELECT 'order-4-' || g, 1, 1 FROM claimed, generate_series(1, 3) AS g WHERE new;
SELECT count(*) AS rows_of_msg_4 FROM charges WHERE order_id LIKE 'order-4-%';

DROP TABLE charges, wallets;
DROP FUNCTION refuse_big();
