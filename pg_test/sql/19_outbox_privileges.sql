-- Who may send and who may relay. Nothing is granted to PUBLIC: a sender needs to write the
-- outbox and draw its sequence, a relay to read and update it, and neither can do the other's
-- part.
CREATE ROLE outbox_app NOLOGIN;
CREATE ROLE outbox_relay NOLOGIN;
GRANT USAGE ON SCHEMA idempotency TO outbox_app, outbox_relay;
GRANT SELECT, INSERT ON idempotency.ledger TO outbox_app;

GRANT SELECT, INSERT ON idempotency.outbox TO outbox_app;
GRANT USAGE ON SEQUENCE idempotency.outbox_seq TO outbox_app;
GRANT SELECT, UPDATE ON idempotency.outbox TO outbox_relay;

SET ROLE outbox_app;
BEGIN;
SELECT idem_claim('order-19:paid');
SELECT idem_send('orders.paid', '{"order": 19}') = idem_message_id('order-19:paid') AS sent;
COMMIT;
BEGIN;
SELECT sqlstate_of($$SELECT * FROM idem_outbox_take()$$);
ROLLBACK;
RESET ROLE;

SET ROLE outbox_relay;
SELECT sqlstate_of($$SELECT idem_send('orders.paid', '{}', key => 'relay-sends')$$);
BEGIN;
SELECT topic, payload FROM idem_outbox_take();
SELECT idem_outbox_sent(ARRAY[idem_message_id('order-19:paid')]) AS marked;
COMMIT;
RESET ROLE;

-- Without the sequence a sender is refused too.
REVOKE USAGE ON SEQUENCE idempotency.outbox_seq FROM outbox_app;
SET ROLE outbox_app;
SELECT sqlstate_of($$SELECT idem_send('orders.paid', '{}', key => 'no-sequence')$$);
RESET ROLE;

TRUNCATE idempotency.outbox;
DROP OWNED BY outbox_app, outbox_relay;
DROP ROLE outbox_app, outbox_relay;
