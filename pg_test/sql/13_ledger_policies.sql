-- The ledger is an ordinary table a DBA may extend: row-level security that keeps each
-- tenant in its own scope, an audit trigger, an extra column with a default.  Claims honour
-- all of them (they then go through the INSERT statement instead of the direct write), and
-- go back to the direct write once the ledger is plain again.

-- Tenants: each role may claim, and see claims, only in the scope named after it.
CREATE ROLE tenant_a;
CREATE ROLE tenant_b;
GRANT USAGE ON SCHEMA idempotency TO tenant_a, tenant_b;
GRANT SELECT, INSERT, UPDATE ON idempotency.ledger TO tenant_a, tenant_b;
ALTER TABLE idempotency.ledger ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_scope ON idempotency.ledger
  USING (scope_id = idem_scope_id(current_user::text))
  WITH CHECK (scope_id = idem_scope_id(current_user::text));

SET ROLE tenant_a;
SELECT idem_claim('order-1', 'tenant_a') AS first, idem_claim('order-1', 'tenant_a') AS duplicate;
SELECT idem_claim_many(ARRAY['order-2', 'order-1', 'order-2'], 'tenant_a') AS batch;
-- Another tenant's scope is refused by the policy, not silently claimed.
SELECT sqlstate_of($$SELECT idem_claim('order-1', 'tenant_b')$$) AS other_scope;
SELECT sqlstate_of($$SELECT idem_claim_many(ARRAY['order-9'], 'tenant_b')$$) AS other_scope_batch;
RESET ROLE;
SET ROLE tenant_b;
SELECT idem_claim('order-1', 'tenant_b') AS own_scope;
SELECT count(*) AS claims_tenant_b_sees FROM idempotency.ledger;
RESET ROLE;
SELECT count(*) AS claims_in_all FROM idempotency.ledger
WHERE scope_id IN (idem_scope_id('tenant_a'), idem_scope_id('tenant_b'));
-- pg_dump does not carry the policy: the README's check after a restore, here before one.
SELECT c.relname, c.relrowsecurity, count(p.polname) AS policies
FROM pg_class AS c LEFT JOIN pg_policy AS p ON p.polrelid = c.oid
WHERE c.relnamespace = 'idempotency'::regnamespace AND c.relkind = 'r'
GROUP BY 1, 2 ORDER BY 1;
DROP POLICY own_scope ON idempotency.ledger;
ALTER TABLE idempotency.ledger DISABLE ROW LEVEL SECURITY;

-- An audit trigger sees every new claim, single or batched, and no duplicate.
CREATE TABLE claim_audit (key_digest uuid, scope_id bigint);
CREATE FUNCTION audit_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO claim_audit VALUES (NEW.key_digest, NEW.scope_id);
  RETURN NEW;
END $$;
CREATE TRIGGER audit_claims AFTER INSERT ON idempotency.ledger FOR EACH ROW EXECUTE FUNCTION audit_claim();
SELECT idem_claim('audited-1') AS first, idem_claim('audited-1') AS duplicate;
SELECT idem_claim_many(ARRAY['audited-2', 'audited-1', 'audited-3']) AS batch;
SELECT count(*) AS audited, count(*) FILTER (WHERE key_digest = idem_digest('audited-1')) AS audited_once
FROM claim_audit;
DROP TRIGGER audit_claims ON idempotency.ledger;

-- An extra column: its default is filled in, as an INSERT would.
ALTER TABLE idempotency.ledger ADD COLUMN claimed_by text DEFAULT current_user;
SELECT idem_claim('with-column-1') AS claimed;
SELECT claimed_by FROM idempotency.ledger WHERE key_digest = idem_digest('with-column-1');
-- Once dropped, it leaves nothing behind that a claim would trip over.
ALTER TABLE idempotency.ledger DROP COLUMN claimed_by;
SELECT idem_claim('after-drop-1') AS claimed, idem_claim('after-drop-1') AS duplicate,
       idem_claim_many(ARRAY['after-drop-1', 'after-drop-2']) AS batch;
SELECT count(*) AS rows_after_drop FROM idempotency.ledger
WHERE key_digest IN (idem_digest('after-drop-1'), idem_digest('after-drop-2'));

DROP TABLE claim_audit;
DROP FUNCTION audit_claim();
DROP OWNED BY tenant_a, tenant_b;
DROP ROLE tenant_a;
DROP ROLE tenant_b;

-- The extension dropped and created again under a session that has claimed and written:
-- the session's next calls find the new ledger and the tables as they are now.
SELECT idem_claim('before-recreate') AS before_recreate,
       idem_versioned_update('feed', '{"id": 1}', '{"status": "v6", "version": 6}') AS write_before;
SET client_min_messages = warning;
DROP EXTENSION idempotency CASCADE;
CREATE EXTENSION idempotency;
RESET client_min_messages;
SELECT idem_claim('before-recreate') AS new_again, idem_claim('before-recreate') AS duplicate,
       idem_versioned_update('feed', '{"id": 1}', '{"status": "v7", "version": 7}') AS write_after;
SELECT * FROM feed;

-- A column's type changed under the extension: a duplicate that reads it back is 42804,
-- never the bytes of one type read as another (a text fingerprint read as a uuid called the
-- same payload a different one, and a json result failed inside the extension).
BEGIN;
SELECT idem_claim('typed-1', 'default', '{"a": 1}') AS first;
ALTER TABLE idempotency.ledger ALTER COLUMN fingerprint TYPE text;
SELECT sqlstate_of($$SELECT idem_claim('typed-1', 'default', '{"a": 1}')$$) AS text_fingerprint;
ROLLBACK;
BEGIN;
SELECT idem_claim('typed-2') AS first;
ALTER TABLE idempotency.ledger ALTER COLUMN result TYPE json;
SELECT sqlstate_of($$SELECT claimed FROM idem_claim_replay('typed-2')$$) AS json_result;
ROLLBACK;
-- Changed back, the same duplicate is read as before.
SELECT idem_claim('typed-3', 'default', '{"a": 1}') AS first;
ALTER TABLE idempotency.ledger ALTER COLUMN fingerprint TYPE text;
ALTER TABLE idempotency.ledger ALTER COLUMN fingerprint TYPE uuid USING fingerprint::uuid;
SELECT idem_claim('typed-3', 'default', '{"a": 1}') AS duplicate;
-- key_digest's type changed: the claims still decide (the INSERT assigns a digest to text),
-- and each lookup by key_digest is 42883, as the statement it runs has no text = uuid.
BEGIN;
ALTER TABLE idempotency.ledger ALTER COLUMN key_digest TYPE text;
SELECT idem_claim('typed-4') AS first, idem_claim('typed-4') AS duplicate;
SELECT sqlstate_of($$SELECT claimed FROM idem_claim_replay('typed-4')$$) AS text_digest_replay;
SELECT sqlstate_of($$SELECT idem_set_result('typed-4', '{}')$$) AS text_digest_result;
ROLLBACK;

-- A default of the DBA's on claimed_at: the first delivery's replay reports the stored time,
-- as every duplicate's does (before 0.5.0 it reported the transaction's start).
BEGIN;
ALTER TABLE idempotency.ledger ALTER COLUMN claimed_at SET DEFAULT '2001-02-03 04:05:06+00';
SELECT claimed, first_claimed_at = '2001-02-03 04:05:06+00' AS stored_time FROM idem_claim_replay('defaulted-1');
SELECT claimed, first_claimed_at = '2001-02-03 04:05:06+00' AS stored_time FROM idem_claim_replay('defaulted-1');
ROLLBACK;
-- With the default as the extension made it, the first delivery is told its transaction's start.
BEGIN;
SELECT claimed, first_claimed_at = now() AS transaction_start FROM idem_claim_replay('defaulted-2');
SELECT claimed, first_claimed_at = now() AS transaction_start FROM idem_claim_replay('defaulted-2');
ROLLBACK;
