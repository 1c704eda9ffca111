\pset footer off
\echo
\echo '== idempotency demo: one message, three deliveries, one effect =='
\echo
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS idem_demo CASCADE;
CREATE EXTENSION IF NOT EXISTS idempotency;
CREATE SCHEMA idem_demo;
SET search_path = idem_demo, public;

CREATE TABLE payments (order_id int PRIMARY KEY, amount numeric NOT NULL, paid_at timestamptz NOT NULL);
CREATE TABLE deliveries (n int, message_id text, outcome text);

-- What every consumer does, in any language: claim, then change the business data only
-- when the claim was new, all in one transaction.  Here as a function for the demo.
CREATE FUNCTION handle(n int, message_id text, body jsonb) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  k text := idem_key('payment', body->>'order_id');   -- the business key, not the message id
  r record;
BEGIN
  SELECT * INTO r FROM idem_claim_replay(k, 'billing', body);
  IF r.claimed THEN
    INSERT INTO idem_demo.payments VALUES ((body->>'order_id')::int, (body->>'amount')::numeric, now());
    PERFORM idem_set_result(k, jsonb_build_object('receipt', 'R-' || (body->>'order_id')), scope => 'billing');
    INSERT INTO idem_demo.deliveries VALUES (n, message_id, 'processed');
    RETURN 'processed';
  END IF;
  INSERT INTO idem_demo.deliveries
  VALUES (n, message_id, format('duplicate of the claim at %s, replayed %s', r.first_claimed_at::time(0), r.result));
  RETURN 'duplicate';
END $$;

-- A consumer treats ID001 (the key was reused for another payload) as a poison message.
CREATE FUNCTION deliver(n int, message_id text, body jsonb) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  RETURN idem_demo.handle(n, message_id, body);
EXCEPTION WHEN SQLSTATE 'ID001' THEN
  RETURN format('refused, SQLSTATE %s: %s', SQLSTATE, SQLERRM);
END $$;

\echo 'Delivery 1: the broker delivers "order 42 paid" (message m-1).'
SELECT deliver(1, 'm-1', '{"order_id": 42, "amount": 99.50}') AS outcome;
\echo 'Delivery 2: the ack was lost, so the broker redelivers m-1.'
SELECT deliver(2, 'm-1', '{"order_id": 42, "amount": 99.50}') AS outcome;
\echo 'Delivery 3: an operator replays the DLQ; the replay carries a new message id, m-7.'
SELECT deliver(3, 'm-7', '{"amount": 99.5, "order_id": 42}') AS outcome;

\echo
\echo 'What happened, delivery by delivery:'
SELECT n AS delivery, message_id, outcome FROM deliveries ORDER BY n;
\echo 'The business effect, exactly once:'
SELECT order_id, amount FROM payments;

\echo 'A fourth delivery reuses the key for a different payment: refused with SQLSTATE ID001.'
SELECT deliver(4, 'm-8', '{"order_id": 42, "amount": 5}') AS outcome;
\echo
\echo 'Splitter children and keys from payloads are deterministic, never random:'
SELECT idem_child_key('order-42', 0) AS first_line,
       idem_key_from('{"order": {"id": 42}, "type": "paid"}', 'order.id', 'type') AS key_from_payload;
DROP SCHEMA idem_demo CASCADE;
