-- send_ext.sql with a NOTIFY before COMMIT, as a sender that woke idle relays would: what the
-- commit-time lock of NOTIFY costs (the relays poll instead; see the README's Outbox section).
\set k random(1, 200)
BEGIN;
SELECT idem_claim(gen_random_uuid()::text);
INSERT INTO biz_ext (entity, amount) VALUES (:k, 10);
SELECT idem_send('orders.paid', '{"amount": 10}', ordering_key => 'order-' || :k);
NOTIFY idempotency_outbox;
COMMIT;
