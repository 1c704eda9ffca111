-- The README's SQL, each block exactly as the README prints it (tests/readme_sync.sh fails
-- when a block is in no story), with what it needs around it: a reader who copies a block
-- gets what this story gets. Its tables live in a schema of their own, so that the story runs
-- alone or after any other.
CREATE SCHEMA readme;
SET search_path = readme, public;

-- The opening example.
BEGIN;
SELECT idem_claim('order-42:paid');   -- true the first time; false for every duplicate
-- do the business change only when it returned true
COMMIT;                               -- the claim commits or rolls back with the change

-- Result replay: the first delivery does the work and stores its result; a duplicate gets it.
\set payload '{"amount": 70}'
SELECT claimed, result FROM idem_claim_replay('invoice-7:create', 'api', :'payload');
-- claimed = true : do the work, then
SELECT idem_set_result('invoice-7:create', '{"invoice_id": 7}', scope => 'api');
-- claimed = false: answer with result, as the first delivery did (first_claimed_at says when)
SELECT claimed, result FROM idem_claim_replay('invoice-7:create', 'api', :'payload');
-- claimed = true : do the work, then
SELECT idem_set_result('invoice-7:create', '{"invoice_id": 7}', scope => 'api');
-- claimed = false: answer with result, as the first delivery did (first_claimed_at says when)

-- Versioned writes on a read model.
CREATE TABLE read_model (id int PRIMARY KEY, status text, version int);
INSERT INTO read_model VALUES (42, 'new', 6);
-- UPDATE read_model SET status = 'paid', version = 7 WHERE id = 42 AND version < 7
SELECT idem_versioned_update('read_model', '{"id": 42}', '{"status": "paid", "version": 7}');
-- INSERT … ON CONFLICT (id) DO UPDATE … WHERE read_model.version < EXCLUDED.version
SELECT idem_versioned_upsert('read_model', '{"id": 42, "status": "paid", "version": 7}');
-- From now on, any UPDATE from any client or ORM is a no-op unless it raises the version.
SELECT idem_version_guard('read_model');
SELECT * FROM read_model;
UPDATE read_model SET status = 'stale' WHERE id = 42;
SELECT * FROM read_model;
DROP TABLE read_model;

-- Scopes whose retention covers every way a message can come back.
-- SQS: MessageRetentionPeriod 4 days, the DLQ keeps 14 days, people replay within a week.
SELECT retention FROM idem_declare_scope('orders', broker_retention => '4 days', dlq_retention => '14 days',
                                         replay_window => '7 days', buffer => '1 day');   -- 26 days
-- Kafka: retention.ms = 604800000 (7 days); consumers may reset offsets up to 3 days back.
SELECT retention FROM idem_declare_scope('events', '7 days', replay_window => '3 days', buffer => '12 hours');
-- RabbitMQ: a queue with x-message-ttl 24 h and a dead-letter queue whose TTL is 72 h.
SELECT retention FROM idem_declare_scope('mail', '1 day', dlq_retention => '3 days', replay_window => '2 days');
SELECT scope, broker_retention, dlq_retention, replay_window, buffer, retention, source
FROM idempotency.scope_retention;   -- each scope's parts and total (sizes: see budgets below)

-- The late-replay guard, with a message older than the scope's retention.
\set msg_key 'order-7:paid'
\set msg_sent_at '2000-01-01 00:00:00+00'
SELECT sqlstate_of($$SELECT idem_claim('order-7:paid', 'orders', NULL, sent_at => '2000-01-01 00:00:00+00')$$);
\set msg_sent_at '2100-01-01 00:00:00+00'
SELECT idem_claim(:'msg_key', 'orders', NULL, sent_at => :'msg_sent_at');   -- psql variables; a driver binds them

-- The grants an application role needs.
CREATE ROLE app;
GRANT USAGE ON SCHEMA idempotency TO app;
GRANT SELECT, INSERT, UPDATE ON idempotency.ledger TO app;   -- UPDATE only for idem_set_result
GRANT SELECT ON idempotency.scopes TO app;                    -- for claims that pass sent_at
SET ROLE app;
SELECT idem_claim('granted-1', 'orders') AS claimed, idem_set_result('granted-1', '{"ok": true}', scope => 'orders');
RESET ROLE;
DROP OWNED BY app;
DROP ROLE app;

-- Row-level security keeps each tenant role in its own scope.
CREATE ROLE tenant_a;
GRANT USAGE ON SCHEMA idempotency TO tenant_a;
GRANT SELECT, INSERT ON idempotency.ledger TO tenant_a;
ALTER TABLE idempotency.ledger ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_scope ON idempotency.ledger
  USING (scope_id = idem_scope_id(current_user::text))
  WITH CHECK (scope_id = idem_scope_id(current_user::text));
-- as role tenant_a: idem_claim('order-1', 'tenant_a') works; idem_claim('order-1', 'tenant_b') is 42501
SET ROLE tenant_a;
SELECT idem_claim('order-1', 'tenant_a') AS own_scope;
SELECT sqlstate_of($$SELECT idem_claim('order-1', 'tenant_b')$$) AS other_scope;
RESET ROLE;
DROP POLICY own_scope ON idempotency.ledger;
ALTER TABLE idempotency.ledger DISABLE ROW LEVEL SECURITY;
DROP OWNED BY tenant_a;
DROP ROLE tenant_a;

-- Upgrading: on the current version the update has nothing to do.
SET client_min_messages = warning;
ALTER EXTENSION idempotency UPDATE;
RESET client_min_messages;
SELECT extversion = (SELECT default_version FROM pg_available_extensions WHERE name = 'idempotency') AS current
FROM pg_extension WHERE extname = 'idempotency';
RESET search_path;
DROP SCHEMA readme CASCADE;
