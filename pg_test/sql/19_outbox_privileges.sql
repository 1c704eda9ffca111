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
GRANT USAGE ON SEQUENCE idempotency.outbox_seq TO outbox_relay;

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

-- The lock that orders a key's senders is taken only for a role that may write the outbox:
-- idempotency.lock_ordering_key, which idem_outbox_requeue calls and every role may execute,
-- is 42501 for any other role, so that no role can hold a key's senders up.
CREATE ROLE outbox_stranger NOLOGIN;
GRANT USAGE ON SCHEMA idempotency TO outbox_stranger;
SET ROLE outbox_stranger;
SELECT sqlstate_of($$SELECT idempotency.lock_ordering_key('order-19')$$) AS stranger_locks;
RESET ROLE;
-- A column-level GRANT is a GRANT: such a sender may lock.
GRANT INSERT (topic, payload) ON idempotency.outbox TO outbox_stranger;
SET ROLE outbox_stranger;
SELECT sqlstate_of($$SELECT idempotency.lock_ordering_key('order-19')$$) AS column_grant_locks;
RESET ROLE;
SET ROLE outbox_relay;
BEGIN;
SELECT idempotency.lock_ordering_key('order-19') AS relay_locks;
SELECT count(*) AS locks_held FROM pg_locks
WHERE locktype = 'object' AND classid = 'idempotency.outbox'::regclass AND pid = pg_backend_pid();
ROLLBACK;
RESET ROLE;
DROP OWNED BY outbox_stranger;
DROP ROLE outbox_stranger;
-- The relay's role with the README's grants requeues a set-aside message (its lock and its
-- new position).
BEGIN;
SELECT idem_send('orders.refunded', '{"order": 19}', ordering_key => 'order-19', key => 'refund-19') AS refund_id \gset
COMMIT;
BEGIN;
SELECT count(*) AS taken FROM idem_outbox_take() WHERE id = :'refund_id';
SELECT idem_outbox_failed(:'refund_id', 'broker refused', max_attempts => 1) AS set_aside;
COMMIT;
SET ROLE outbox_relay;
SELECT idem_outbox_requeue(:'refund_id') AS requeued;
RESET ROLE;

-- Without the sequence a sender is refused too.
REVOKE USAGE ON SEQUENCE idempotency.outbox_seq FROM outbox_app;
SET ROLE outbox_app;
SELECT sqlstate_of($$SELECT idem_send('orders.paid', '{}', key => 'no-sequence')$$);
RESET ROLE;

GRANT USAGE ON SEQUENCE idempotency.outbox_seq TO outbox_app;

-- A message already in the outbox that a policy hides from the sender: its INSERT conflicts
-- and writes nothing, and its read finds nothing. That is 55000 after three tries, never a
-- send reported done (nor a call that spins until a timeout).
ALTER TABLE idempotency.outbox ENABLE ROW LEVEL SECURITY;
CREATE POLICY add_any ON idempotency.outbox FOR INSERT WITH CHECK (true);
CREATE POLICY see_own ON idempotency.outbox FOR SELECT USING (headers ->> 'tenant' = current_user);
SELECT idem_send('orders.paid', '{}', headers => '{"tenant": "postgres"}', key => 'hidden-1') IS NOT NULL AS sent_by_owner;
SET ROLE outbox_app;
SET statement_timeout = '20s';
SELECT sqlstate_of($$SELECT idem_send('orders.paid', '{}', headers => '{"tenant": "outbox_app"}', key => 'hidden-1')$$) AS hidden_message;
SELECT idem_send('orders.paid', '{}', headers => '{"tenant": "outbox_app"}', key => 'visible-1') IS NOT NULL AS own_message;
RESET statement_timeout;
RESET ROLE;
DROP POLICY add_any ON idempotency.outbox;
DROP POLICY see_own ON idempotency.outbox;
ALTER TABLE idempotency.outbox DISABLE ROW LEVEL SECURITY;

-- So does a BEFORE trigger of the DBA's that drops the row, on either write path.
CREATE FUNCTION drop_message() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER drop_message BEFORE INSERT ON idempotency.outbox FOR EACH ROW EXECUTE FUNCTION drop_message();
SELECT sqlstate_of($$SELECT idem_send('orders.dropped', '{}', key => 'dropped-1')$$) AS dropped_by_trigger;
SET idempotency.direct_writes = off;
SELECT sqlstate_of($$SELECT idem_send('orders.dropped', '{}', key => 'dropped-1')$$) AS dropped_by_trigger_statement;
RESET idempotency.direct_writes;
DROP TRIGGER drop_message ON idempotency.outbox;
DROP FUNCTION drop_message();
SELECT topic, headers ->> 'tenant' AS tenant, count(*) FROM idempotency.outbox
WHERE headers ? 'tenant' OR topic = 'orders.dropped' GROUP BY 1, 2 ORDER BY 1, 2;

TRUNCATE idempotency.outbox;
DROP OWNED BY outbox_app, outbox_relay;
DROP ROLE outbox_app, outbox_relay;
