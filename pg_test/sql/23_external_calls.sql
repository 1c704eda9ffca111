-- The external-call ledger, for APIs that take no idempotency key. "Begun" is committed
-- before the call is made, so a redelivery after a crash between the call and its
-- confirmation knows the call may have happened: it is in doubt, never silently repeated.
-- (tests/external_calls.py runs the whole sequence against a fake API, with a real kill.)

-- Never begun: the first delivery gets 'new' and makes the call.
SELECT state, call_key = idem_external_key('order-31:paid', 'billing', 'charge') AS call_key_is_the_external_key,
       response
FROM idem_call_begin('order-31:paid', 'billing', 'charge');

-- Begun, not confirmed: the consumer died after the call. A redelivery gets 'in_doubt' and
-- must not call again.
SELECT state, response FROM idem_call_begin('order-31:paid', 'billing', 'charge');

-- Calls in doubt for longer than idempotency.unconfirmed_after (one minute unless set) are
-- listed for reconciliation.
SELECT count(*) AS listed_after_a_minute FROM idempotency.unconfirmed_calls;
SET idempotency.unconfirmed_after = 0;
SELECT scope, key, step, call_key::text = idem_external_key(key, scope, step) AS same_key,
       consumer_connected
FROM idempotency.unconfirmed_calls;

-- Someone checked the API: the charge happened. The next redelivery reuses its response.
SELECT idem_call_resolve('order-31:paid', 'billing', 'charge', happened => true,
                         response => '{"charge_id": "ch_31"}');
SELECT state, response FROM idem_call_begin('order-31:paid', 'billing', 'charge');
SELECT count(*) AS still_listed FROM idempotency.unconfirmed_calls;

-- Confirmed by the consumer itself, the usual way: the first response stays.
SELECT state FROM idem_call_begin('order-32:paid', 'billing', 'charge');
SELECT idem_call_confirm('order-32:paid', 'billing', 'charge', '{"charge_id": "ch_32"}') AS confirmed;
SELECT idem_call_confirm('order-32:paid', 'billing', 'charge', '{"charge_id": "other"}') AS confirmed_again;
SELECT state, response FROM idem_call_begin('order-32:paid', 'billing', 'charge');

-- Resolved as never made: the call is forgotten and may be made again.
SELECT state FROM idem_call_begin('order-33:paid', 'billing', 'charge');
SELECT idem_call_resolve('order-33:paid', 'billing', 'charge', happened => false);
SELECT state FROM idem_call_begin('order-33:paid', 'billing', 'charge');

-- Inside a transaction block "begun" would not be committed before the call, and would die
-- with a rollback: both steps refuse with 25001, and record nothing.
BEGIN;
SELECT sqlstate_of($$SELECT * FROM idem_call_begin('order-34:paid', 'billing', 'charge')$$);
SELECT sqlstate_of($$SELECT idem_call_confirm('order-32:paid', 'billing', 'charge', '{}')$$);
COMMIT;
-- A multi-statement query string is one implicit transaction block too.
SELECT 1 AS first_statement\; SELECT sqlstate_of($$SELECT * FROM idem_call_begin('order-34:paid', 'billing', 'charge')$$);
SELECT count(*) AS recorded FROM idempotency.external_calls WHERE key = 'order-34:paid';

-- So does a PL/pgSQL exception block (a subtransaction), which may still roll it back.
SELECT sqlstate_of($$SELECT * FROM idem_call_begin('order-34:paid', 'billing', 'charge')$$);

-- Misuse gets documented errors. (The steps cannot run in sqlstate_of's exception block, so
-- psql shows their errors.)
\set VERBOSITY sqlstate
SELECT idem_call_confirm('order-35:paid', 'billing', 'charge', '{}');
\echo :LAST_ERROR_MESSAGE
SELECT idem_call_confirm('order-32:paid', 'billing', 'charge', NULL);
\echo :LAST_ERROR_MESSAGE
\set VERBOSITY default
SELECT sqlstate_of($$SELECT idem_call_resolve('order-35:paid', 'billing', 'charge', true, '{}')$$);
SELECT sqlstate_of($$SELECT idem_call_resolve('order-32:paid', 'billing', 'charge', false)$$);
SELECT sqlstate_of($$SELECT idem_call_resolve('order-32:paid', 'billing', 'charge', true, NULL)$$);
SELECT sqlstate_of($$SELECT idem_call_resolve('order-32:paid', 'billing', 'charge', NULL)$$);
SELECT sqlstate_of($$SELECT idem_call_resolve('order-31:paid', 'billing', 'charge', false, '{}')$$);
\set VERBOSITY sqlstate
SELECT * FROM idem_call_begin('order-36:paid', 'billing', '');
\echo :LAST_ERROR_MESSAGE
SELECT * FROM idem_call_begin(NULL);
\echo :LAST_ERROR_MESSAGE
\set VERBOSITY default

-- A consumer role needs the ledger's SELECT, INSERT and UPDATE; whoever resolves calls as
-- never made needs DELETE.
CREATE ROLE calls_app NOLOGIN;
GRANT USAGE ON SCHEMA idempotency TO calls_app;
SET ROLE calls_app;
\set VERBOSITY sqlstate
SELECT * FROM idem_call_begin('order-37:paid', 'billing', 'charge');
\echo :LAST_ERROR_MESSAGE
\set VERBOSITY default
RESET ROLE;
GRANT SELECT, INSERT, UPDATE ON idempotency.external_calls TO calls_app;
SET ROLE calls_app;
SELECT state FROM idem_call_begin('order-37:paid', 'billing', 'charge');
SELECT sqlstate_of($$SELECT idem_call_resolve('order-37:paid', 'billing', 'charge', false)$$);
RESET ROLE;
DROP OWNED BY calls_app;
DROP ROLE calls_app;

-- A confirmation or resolution that cannot change the call records nothing, and says so
-- (55000): here a DBA's BEFORE trigger that drops every UPDATE and DELETE of the ledger. The
-- call stays in doubt; it is not reported confirmed.
SELECT state FROM idem_call_begin('order-39:paid', 'billing', 'charge');
CREATE FUNCTION drop_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER frozen BEFORE UPDATE OR DELETE ON idempotency.external_calls FOR EACH ROW EXECUTE FUNCTION drop_row();
SELECT idem_call_confirm('order-39:paid', 'billing', 'charge', '{"charge_id": "ch_39"}');
SELECT idem_call_resolve('order-39:paid', 'billing', 'charge', happened => true, response => '{"charge_id": "ch_39"}');
SELECT idem_call_resolve('order-39:paid', 'billing', 'charge', happened => false);
SELECT state, response FROM idem_call_begin('order-39:paid', 'billing', 'charge');
DROP TRIGGER frozen ON idempotency.external_calls;
DROP FUNCTION drop_row();
SELECT idem_call_confirm('order-39:paid', 'billing', 'charge', '{"charge_id": "ch_39"}') AS confirmed_without_it;

-- A DBA who drops begun_at's NOT NULL (and its default) gets calls without a begin time, not
-- an internal error.
ALTER TABLE idempotency.external_calls ALTER begun_at DROP NOT NULL, ALTER begun_at DROP DEFAULT;
SELECT state, begun_at FROM idem_call_begin('order-40:paid', 'billing', 'charge');
SELECT state, begun_at FROM idem_call_begin('order-40:paid', 'billing', 'charge');
DELETE FROM idempotency.external_calls WHERE key = 'order-40:paid';
ALTER TABLE idempotency.external_calls ALTER begun_at SET DEFAULT pg_catalog.now(), ALTER begun_at SET NOT NULL;

-- idem_purge deletes confirmed calls older than their scope's retention (7 days for an
-- undeclared scope), as it does claims; a call never confirmed stays until it is resolved.
SELECT state FROM idem_call_begin('order-38:paid', 'billing', 'charge');
UPDATE idempotency.external_calls
   SET begun_at = begun_at - interval '8 days', confirmed_at = confirmed_at - interval '8 days'
 WHERE key IN ('order-32:paid', 'order-38:paid');
\o /dev/null
CALL idem_purge();
\o
SELECT key, confirmed_at IS NOT NULL AS confirmed FROM idempotency.external_calls
WHERE key IN ('order-32:paid', 'order-38:paid') ORDER BY key;
RESET idempotency.unconfirmed_after;
TRUNCATE idempotency.external_calls;
