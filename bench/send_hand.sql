-- The same transaction with a hand-written outbox INSERT instead of idem_send (see setup.sql).
\set k random(1, 200)
BEGIN;
SELECT idem_claim(gen_random_uuid()::text);
INSERT INTO biz_hand (entity, amount) VALUES (:k, 10);
INSERT INTO hand_outbox (id, topic, ordering_key, payload) VALUES (gen_random_uuid(), 'orders.paid', 'order-' || :k, '{"amount": 10}');
COMMIT;
