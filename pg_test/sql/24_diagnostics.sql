-- Diagnostics: where duplicates come from. With idempotency.diagnostics on, each duplicate a
-- claim suppresses is recorded with its first claim's time; the delay between them names the
-- likely source. A scripted run: duplicates 0.2 s after their first claim (a producer retry),
-- 30 s after (SQS's visibility timeout) and 2 days after (a DLQ replay). The long delays are
-- made by ageing the first claim's recorded time.

-- Off by default: a duplicate records nothing, and takes no transaction id.
BEGIN;
SELECT idem_claim('diag-off', 'diag_off') AS first;
COMMIT;
SHOW idempotency.diagnostics;
BEGIN;
SELECT idem_claim('diag-off', 'diag_off') AS duplicate, pg_current_xact_id_if_assigned() IS NULL AS no_xid;
COMMIT;
SELECT count(*) AS recorded FROM idempotency.duplicates;

SET idempotency.diagnostics = on;

-- 0.2 s: claimed, then claimed again once the first commits.
SELECT count(*) FILTER (WHERE idem_claim('retry-' || i, 'payments_api')) AS first_claims FROM generate_series(1, 10) AS i;
SELECT pg_sleep(0.2);
SELECT count(*) FILTER (WHERE NOT idem_claim('retry-' || i, 'payments_api')) AS duplicates FROM generate_series(1, 10) AS i;

-- 30 s: the first claims aged by 30 seconds, as if the message came back when its visibility
-- timeout ran out.
SELECT count(*) FILTER (WHERE idem_claim('sqs-' || i, 'orders_sqs')) AS first_claims FROM generate_series(1, 10) AS i;
UPDATE idempotency.ledger SET claimed_at = claimed_at - interval '30 seconds'
WHERE scope_id = idem_scope_id('orders_sqs');
SELECT count(*) FILTER (WHERE NOT idem_claim('sqs-' || i, 'orders_sqs')) AS duplicates FROM generate_series(1, 10) AS i;

-- 2 days: a DLQ replayed, through a batch claim.
SELECT count(*) FILTER (WHERE idem_claim('dlq-' || i, 'invoices')) AS first_claims FROM generate_series(1, 10) AS i;
UPDATE idempotency.ledger SET claimed_at = claimed_at - interval '2 days'
WHERE scope_id = idem_scope_id('invoices');
SELECT count(*) FILTER (WHERE NOT c) AS duplicates
FROM unnest(idem_claim_many(ARRAY(SELECT 'dlq-' || i FROM generate_series(1, 10) AS i), 'invoices')) AS c;

-- A duplicate now takes a transaction id and writes one row, in the claimer's transaction: a
-- rollback records nothing.
BEGIN;
SELECT idem_claim('retry-1', 'payments_api') AS duplicate, pg_current_xact_id_if_assigned() IS NOT NULL AS took_xid;
ROLLBACK;

-- The view names each scope's source. (The 0.2 s delays are measured, so only their bucket is
-- shown; the aged ones are exact to the second.)
SELECT scope, first_claims, duplicates, likely_source,
       CASE WHEN scope = 'payments_api' THEN delay_max < interval '1 second'
            ELSE date_trunc('second', delay_p50) = date_trunc('second', delay_max) END AS delays_cluster,
       date_trunc('second', delay_p50) AS p50_to_the_second
FROM idempotency.diagnostics
WHERE scope IN ('payments_api', 'orders_sqs', 'invoices')
ORDER BY scope;
SELECT scope, hint FROM idempotency.diagnostics WHERE scope IN ('payments_api', 'orders_sqs', 'invoices') ORDER BY scope;

-- Delays spread over no single deadline (1 h, 10 s, 3 h, and one within a second): no source
-- is named.
SELECT count(*) FILTER (WHERE idem_claim('mixed-' || i, 'mixed')) AS first_claims FROM generate_series(1, 4) AS i;
UPDATE idempotency.ledger AS l SET claimed_at = l.claimed_at - aged.by
FROM (VALUES ('mixed-1', interval '1 hour'), ('mixed-2', interval '10 seconds'), ('mixed-3', interval '3 hours')) AS aged(key, by)
WHERE l.key_digest = idem_digest(aged.key, 'mixed');
SELECT count(*) FILTER (WHERE NOT idem_claim('mixed-' || i, 'mixed')) AS duplicates FROM generate_series(1, 4) AS i;
SELECT scope, duplicates, likely_source IS NULL AS no_source, hint IS NULL AS no_hint FROM idempotency.diagnostics WHERE scope = 'mixed';

-- A consumer role needs no privilege on idempotency.duplicates for its duplicates to be recorded.
CREATE ROLE diag_app NOLOGIN;
GRANT USAGE ON SCHEMA idempotency TO diag_app;
GRANT SELECT, INSERT ON idempotency.ledger TO diag_app;
SET ROLE diag_app;
SELECT idem_claim('role-1', 'diag_role') AS first, idem_claim('role-1', 'diag_role') AS duplicate;
SELECT sqlstate_of($$SELECT count(*) FROM idempotency.duplicates$$);
RESET ROLE;
SELECT count(*) AS recorded_for_the_role FROM idempotency.duplicates WHERE scope = 'diag_role';
DROP OWNED BY diag_app;
DROP ROLE diag_app;

-- Recorded duplicates are kept idempotency.diagnostics_retention (30 days), then idem_purge
-- removes them.
SHOW idempotency.diagnostics_retention;
UPDATE idempotency.duplicates SET seen_at = seen_at - interval '31 days' WHERE scope = 'invoices';
\o /dev/null
CALL idem_purge();
\o
SELECT scope, count(*) AS recorded FROM idempotency.duplicates GROUP BY scope ORDER BY scope;

-- Every table of the extension has a primary key, so a publication of every table (for
-- change-data capture, or an upgrade by logical replication) leaves the purge working: the
-- DELETE of recorded duplicates needs a replica identity (55000 without one).
SET client_min_messages = error;  -- the server's wal_level is not logical: a WARNING
CREATE PUBLICATION diag_everything FOR ALL TABLES;
RESET client_min_messages;
SELECT c.relname AS without_primary_key
FROM pg_depend AS d JOIN pg_class AS c ON c.oid = d.objid
WHERE d.classid = 'pg_class'::regclass AND d.deptype = 'e' AND c.relkind = 'r'
  AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
  AND NOT EXISTS (SELECT FROM pg_index AS i WHERE i.indrelid = c.oid AND i.indisprimary);
UPDATE idempotency.duplicates SET seen_at = seen_at - interval '31 days' WHERE scope = 'diag_role';
\o /dev/null
CALL idem_purge();
\o
SELECT scope, count(*) AS recorded FROM idempotency.duplicates GROUP BY scope ORDER BY scope;
DROP PUBLICATION diag_everything;

SELECT sqlstate_of($$SELECT * FROM idem_diagnostics('0')$$);
SELECT sqlstate_of($$SELECT * FROM idem_diagnostics(NULL)$$);
RESET idempotency.diagnostics;
TRUNCATE idempotency.duplicates;
