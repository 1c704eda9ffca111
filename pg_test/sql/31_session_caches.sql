-- A pooled connection lives for days, and the extension keeps per-backend state for it:
-- prepared statements, the decision whether a table may be written directly, the plan of each
-- versioned write. Whatever a DBA changes meanwhile, the next call in that same session answers
-- as a new session would. Here one session plays the pool's connection and the DBA both.

-- A table reached by OID needs USAGE on its schema, as the statement naming it does.
CREATE ROLE idem_no_usage;
CREATE SCHEMA locked;
CREATE TABLE locked.accounts (id int PRIMARY KEY, val text, version int);
INSERT INTO locked.accounts VALUES (1, 'v', 1);
GRANT SELECT, INSERT, UPDATE ON locked.accounts TO idem_no_usage;
SELECT 'locked.accounts'::regclass::oid AS locked_oid \gset
SET ROLE idem_no_usage;
SELECT sqlstate_of(format($$SELECT idem_versioned_update(%s::regclass, '{"id": 1}', '{"val": "x", "version": 5}')$$,
                          :locked_oid)) AS update_by_oid;
SELECT sqlstate_of(format($$SELECT idem_versioned_upsert(%s::regclass, '{"id": 1, "val": "x", "version": 5}')$$,
                          :locked_oid)) AS upsert_by_oid;
SELECT sqlstate_of($$UPDATE locked.accounts SET val = 'x', version = 5 WHERE id = 1$$) AS hand_written;
RESET ROLE;
SELECT id, val, version FROM locked.accounts;

-- A statement kept while one role ran it is not a way in for the next role of the session.
CREATE ROLE idem_outsider;
GRANT SELECT, INSERT, UPDATE ON idempotency.ledger TO idem_outsider;
BEGIN;
SELECT idem_claim('kept-plan-1') AS claimed;
SELECT idem_set_result('kept-plan-1', '{"by": "owner"}');
SET LOCAL ROLE idem_outsider;
SELECT sqlstate_of($$SELECT idem_set_result('kept-plan-1', '{"by": "outsider"}')$$) AS result_without_usage;
RESET ROLE;
SELECT result FROM idempotency.ledger WHERE key_digest = idem_digest('kept-plan-1');
ROLLBACK;
REVOKE ALL ON idempotency.ledger FROM idem_outsider;
DROP ROLE idem_outsider;

-- A schema renamed, and another made under its name: writes keep going to the table they name.
CREATE SCHEMA shop;
CREATE TABLE shop.orders (id int PRIMARY KEY, state text, version int);
INSERT INTO shop.orders VALUES (1, 'a', 1);
SELECT idem_versioned_upsert('shop.orders', '{"id": 1, "state": "b", "version": 2}') AS upserted,
       idem_versioned_update('shop.orders', '{"id": 1}', '{"state": "c", "version": 3}') AS updated;
ALTER SCHEMA shop RENAME TO shop_old;
CREATE SCHEMA shop;
CREATE TABLE shop.orders (id int PRIMARY KEY, state text, version int);
INSERT INTO shop.orders VALUES (1, 'new', 1);
SELECT idem_versioned_upsert('shop_old.orders', '{"id": 1, "state": "d", "version": 4}') AS upserted,
       idem_versioned_update('shop_old.orders', '{"id": 1}', '{"state": "e", "version": 5}') AS updated;
SELECT 'shop_old' AS schema, id, state, version FROM shop_old.orders
UNION ALL SELECT 'shop', id, state, version FROM shop.orders ORDER BY schema;
DROP SCHEMA shop, shop_old CASCADE;

-- A function a ledger CHECK calls, made STABLE after the ledger was written directly: from then
-- on claims run the statement, whose new snapshot sees the transaction's earlier claim.
CREATE FUNCTION scope_unclaimed(s bigint) RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN RETURN NOT EXISTS (SELECT FROM idempotency.ledger WHERE scope_id = s); END $$;
ALTER TABLE idempotency.ledger ADD CONSTRAINT one_claim_per_scope CHECK (scope_unclaimed(scope_id)) NOT VALID;
SELECT idem_claim('volatility-warm', 'volatility-warm') AS warmed;
ALTER FUNCTION scope_unclaimed(bigint) STABLE;
BEGIN;
SELECT sqlstate_of($$SELECT idem_claim('volatility-1', 'volatility') AND idem_claim('volatility-2', 'volatility')$$)
  AS two_claims_in_one_scope;
ROLLBACK;
ALTER TABLE idempotency.ledger DROP CONSTRAINT one_claim_per_scope;
DROP FUNCTION scope_unclaimed(bigint);

-- A ledger column renamed: the claim that names it fails as its INSERT does.
SELECT idem_claim('column-rename-warm', payload => '{"n": 1}') AS warmed;
ALTER TABLE idempotency.ledger RENAME COLUMN fingerprint TO fp;
SELECT sqlstate_of($$SELECT idem_claim('column-rename-1', payload => '{"n": 1}')$$) AS claim_naming_a_renamed_column;
ALTER TABLE idempotency.ledger RENAME COLUMN fp TO fingerprint;
SELECT idem_claim('column-rename-1', payload => '{"n": 1}') AS claimed_after_the_rename_back;

-- Inside a parallel query (a wrapper wrongly marked PARALLEL SAFE) a write is refused as the
-- statement refuses it, 25000, whichever process runs it.
CREATE FUNCTION claim_in_parallel(k text) RETURNS boolean PARALLEL SAFE LANGUAGE plpgsql AS $$
BEGIN RETURN idem_claim(k); END $$;
CREATE FUNCTION advance_in_parallel(n int) RETURNS boolean PARALLEL SAFE LANGUAGE plpgsql AS $$
BEGIN RETURN idem_watermark_advance('parallel', 'p', n); END $$;
-- An external call's steps too, which otherwise refuse a transaction block (25001): a parallel
-- query counts as one, but the step is refused as its statement refuses it.
CREATE FUNCTION call_in_parallel(k text) RETURNS text PARALLEL SAFE LANGUAGE plpgsql AS $$
BEGIN RETURN (SELECT state FROM idem_call_begin(k)); END $$;
CREATE FUNCTION confirm_in_parallel(k text) RETURNS boolean PARALLEL SAFE LANGUAGE plpgsql AS $$
BEGIN RETURN idem_call_confirm(k, 'default', 'default', '{}'); END $$;
CREATE TABLE parallel_rows AS SELECT g AS id FROM generate_series(1, 1000) g;
ANALYZE parallel_rows;
SELECT idem_watermark_advance('parallel', 'p', 1) AS first_position;
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;
SELECT sqlstate_of($$SELECT count(*) FROM parallel_rows WHERE claim_in_parallel('parallel-' || id)$$) AS claims;
SELECT sqlstate_of($$SELECT count(*) FROM parallel_rows WHERE advance_in_parallel(id + 1)$$) AS advances;
SELECT sqlstate_of($$SELECT count(*) FROM parallel_rows WHERE call_in_parallel('parallel-' || id) IS NOT NULL$$) AS call_begins;
SELECT sqlstate_of($$SELECT count(*) FROM parallel_rows WHERE confirm_in_parallel('parallel-' || id)$$) AS call_confirms;
RESET parallel_setup_cost;
RESET parallel_tuple_cost;
RESET min_parallel_table_scan_size;
RESET max_parallel_workers_per_gather;
SELECT count(*) AS parallel_claims FROM idempotency.ledger WHERE key_digest = idem_digest('parallel-1');
DROP TABLE parallel_rows;
DROP FUNCTION claim_in_parallel(text), advance_in_parallel(int), call_in_parallel(text), confirm_in_parallel(text);

-- Every set of member names is a plan of its own; a session cycling through many keeps a
-- bounded number of them.
CREATE TABLE shape_churn (id int PRIMARY KEY, version int, c0 text, c1 text, c2 text, c3 text, c4 text,
                          c5 text, c6 text, c7 text, c8 text);
INSERT INTO shape_churn (id, version) VALUES (1, 0);
SELECT count(*) FILTER (WHERE idem_versioned_upsert('shape_churn', jsonb_build_object('id', 1, 'version', g)
         || (SELECT jsonb_object_agg('c' || b, 'v') FROM generate_series(0, 8) b WHERE (g >> b) & 1 = 1)))
       AS upserts_of_300_shapes
FROM generate_series(1, 300) g;
SELECT count(*) BETWEEN 1 AND 256 AS plans_kept_within_bound
FROM pg_backend_memory_contexts WHERE name = 'CachedPlanSource' AND ident LIKE '%public.shape_churn%';
DROP TABLE shape_churn;

DROP SCHEMA locked CASCADE;
DROP ROLE idem_no_usage;
DELETE FROM idempotency.ledger;
