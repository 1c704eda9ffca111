-- A consumer's transaction: claim, business insert, and a downstream message through the
-- outbox (ordering key over 200 entities).
\set k random(1, 200)
BEGIN;
SELECT idem_claim(gen_random_uuid()::text);
INSERT INTO biz_ext (entity, amount) VALUES (:k, 10);
SELECT idem_send('orders.paid', '{"amount": 10}', ordering_key => 'order-' || :k);
COMMIT;
