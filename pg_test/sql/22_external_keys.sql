-- Keys for external APIs. The API never joins the transaction; what the consumer can do is
-- send it the same idempotency key for the same step of the same business message, on every
-- redelivery, DLQ replay and backfill. The key depends on (key, scope, step) alone.
SELECT idem_external_key('order-7:paid', 'billing', 'charge') AS idempotency_key;
SELECT idem_external_uuid('order-7:paid', 'billing', 'charge')::text
       = idem_external_key('order-7:paid', 'billing', 'charge') AS same_key_as_uuid;

-- Each step of one message, and the same step in another scope, has its own key.
SELECT count(DISTINCT k) AS distinct_keys
FROM (VALUES (idem_external_key('order-7:paid', 'billing', 'charge')),
             (idem_external_key('order-7:paid', 'billing', 'receipt')),
             (idem_external_key('order-7:paid', 'shipping', 'charge')),
             (idem_external_key('order-8:paid', 'billing', 'charge'))) AS keys(k);

-- Version 8 (name-based) UUIDs, pinned: a key sent to an API must never change between
-- releases. The defaults are scope 'default' and step 'default'.
SELECT idem_external_uuid('order-7:paid') AS default_scope_and_step,
       substr(idem_external_uuid('order-7:paid')::text, 15, 1) AS version;
SELECT idem_external_key('order-7:paid', step => 'charge') = idem_external_key('order-7:paid', 'default', 'charge') AS named;
SELECT length(idem_external_key(repeat('k', 100000), 'billing', 'charge')) AS length_for_a_long_key;

SELECT sqlstate_of($$SELECT idem_external_key('order-7:paid', 'billing', '')$$);
SELECT sqlstate_of($$SELECT idem_external_key('order-7:paid', 'billing', NULL)$$);
SELECT sqlstate_of($$SELECT idem_external_key('', 'billing', 'charge')$$);
SELECT sqlstate_of($$SELECT idem_external_uuid(NULL)$$);
SELECT sqlstate_of($$SELECT idem_external_uuid('k', '')$$);
