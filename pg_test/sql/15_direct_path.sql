-- The direct path is really taken, on every PostgreSQL major the suite runs on: the other
-- stories get the same output either way, so they alone cannot tell a direct write from a
-- silent fall-back to SPI.  Each SPI statement is prepared on first use and kept for the
-- backend's life, and a kept plan owns a memory context named CachedPlanSource whose
-- identifier is its SQL; a direct write prepares none.  This story sets the switch itself,
-- so it reads the same in both runs of the suite.
\c
CREATE TABLE path_probe (id int PRIMARY KEY, state text, version int NOT NULL);
INSERT INTO path_probe VALUES (1, 'new', 1);
CREATE FUNCTION kept_plans() RETURNS TABLE (claim_insert bigint, versioned_update bigint) LANGUAGE sql AS $$
  SELECT count(*) FILTER (WHERE ident LIKE 'INSERT INTO idempotency.ledger (key_digest, scope_id)%'),
         count(*) FILTER (WHERE ident LIKE 'UPDATE %path_probe% AS t SET %')
  FROM pg_backend_memory_contexts WHERE name = 'CachedPlanSource'
$$;

SET idempotency.direct_writes = on;
SELECT idem_claim('path-direct') AS claimed,
       idem_versioned_update('path_probe', '{"id": 1}', '{"state": "direct", "version": 2}') AS updated;
SELECT * FROM kept_plans();

SET idempotency.direct_writes = off;
SELECT idem_claim('path-statement') AS claimed,
       idem_versioned_update('path_probe', '{"id": 1}', '{"state": "statement", "version": 3}') AS updated;
SELECT * FROM kept_plans();

SELECT * FROM path_probe;
RESET idempotency.direct_writes;
DROP FUNCTION kept_plans();
DROP TABLE path_probe;

-- From 16 an update that changes only BRIN-indexed columns can stay HOT, and then only the
-- summarizing indexes get an entry for the new version.  An entry in the primary key too
-- would point at a heap-only version: scans that visit the heap, the unique check and
-- amcheck all pass over it, but an index-only scan, once VACUUM has marked the page
-- all-visible, counts it.
CREATE TABLE summarized (id int PRIMARY KEY, seen int, version int NOT NULL);
CREATE INDEX summarized_seen ON summarized USING brin (seen);
INSERT INTO summarized VALUES (1, 10, 1);
BEGIN;
SELECT idem_versioned_update('summarized', '{"id": 1}', '{"seen": 20, "version": 2}') AS summarized_only;
-- The update was HOT from 16 on, so the case above was met; 15 never makes it HOT.
SELECT n_tup_upd AS updates,
       n_tup_hot_upd = CASE WHEN current_setting('server_version_num')::int >= 160000 THEN 1 ELSE 0 END AS hot_as_expected
FROM pg_stat_xact_user_tables WHERE relid = 'summarized'::regclass;
COMMIT;
VACUUM (INDEX_CLEANUP on) summarized;
SET enable_seqscan = off;
SET enable_bitmapscan = off;
SELECT count(*) AS primary_key_entries FROM summarized WHERE id = 1;
RESET enable_bitmapscan;
SELECT * FROM summarized WHERE seen = 20;
RESET enable_seqscan;
DROP TABLE summarized;

-- The send takes the direct path as well, unless the outbox has a CHECK (or an index
-- expression or predicate) that calls a function that is not immutable: such a function may
-- read tables, and it must read them as the statement does through SPI, under a new snapshot.
CREATE FUNCTION kept_send_plans() RETURNS bigint LANGUAGE sql AS $$
  SELECT count(*) FROM pg_backend_memory_contexts
  WHERE name = 'CachedPlanSource' AND ident LIKE 'INSERT INTO idempotency.outbox (seq, id,%'
$$;
SET idempotency.direct_writes = on;
BEGIN;
SELECT idem_send('path', '{}', key => 'path-direct') IS NOT NULL AS sent;
SELECT kept_send_plans() AS send_plans;
ROLLBACK;
CREATE FUNCTION outbox_rows() RETURNS bigint STABLE LANGUAGE sql AS 'SELECT count(*) FROM idempotency.outbox';
ALTER TABLE idempotency.outbox ADD CONSTRAINT outbox_reads CHECK (outbox_rows() < 1);
BEGIN;
SELECT idem_send('path', '{}', key => 'path-check-1') IS NOT NULL AS sent;
SELECT kept_send_plans() AS send_plans;
-- The second send's CHECK sees the first row, as the statement's would.
SELECT sqlstate_of($$SELECT idem_send('path', '{}', key => 'path-check-2')$$) AS second_send;
ROLLBACK;
ALTER TABLE idempotency.outbox DROP CONSTRAINT outbox_reads;
DROP FUNCTION outbox_rows(), kept_send_plans();
RESET idempotency.direct_writes;

-- The extension's tables are found by name on every call, as the statement finds them: a
-- session that claimed before the schema was renamed, and another schema made under its
-- name, writes to the new one, as a new connection does. Before 0.5.0 the direct path kept
-- writing to the renamed schema's tables, and a key could be claimed twice.
SET idempotency.direct_writes = on;
SELECT idem_claim('rename-warm') AS warmed, idem_watermark_advance('rename', 'p', 1) AS advanced;
ALTER SCHEMA idempotency RENAME TO idempotency_renamed;
CREATE SCHEMA idempotency;
CREATE TABLE idempotency.ledger (LIKE idempotency_renamed.ledger INCLUDING ALL);
CREATE TABLE idempotency.watermarks (LIKE idempotency_renamed.watermarks INCLUDING ALL);
SELECT idem_claim('rename-order') AS claimed,
       idem_watermark_advance('rename', 'p', 11) AS first_advance,
       idem_watermark_advance('rename', 'p', 12) AS second_advance;
SELECT (SELECT count(*) FROM idempotency.ledger) AS claims_in_the_new_ledger,
       (SELECT count(*) FROM idempotency_renamed.ledger
        WHERE key_digest = idem_digest('rename-order', 'default')) AS in_the_renamed_one,
       (SELECT position FROM idempotency.watermarks) AS new_watermark,
       (SELECT position FROM idempotency_renamed.watermarks WHERE stream = 'rename') AS renamed_watermark;
DROP SCHEMA idempotency CASCADE;
ALTER SCHEMA idempotency_renamed RENAME TO idempotency;
SELECT idem_claim('rename-order') AS new_in_the_original_ledger;
DELETE FROM idempotency.watermarks WHERE stream = 'rename';
RESET idempotency.direct_writes;
