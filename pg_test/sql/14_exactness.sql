-- A direct write is exactly the statement it replaces.  Each case below once differed
-- between the direct path and the INSERT or UPDATE a user would write; this story runs
-- twice (direct writes on and off) against one expected output, and each case sets the
-- extension's answer beside the hand-written statement's, field by field.

-- error_fields runs a statement and shows every field of the error it raises, as a driver
-- sees them (psql's VERBOSITY verbose shows the same, with a LOCATION that varies).
CREATE FUNCTION error_fields(statement text) RETURNS TABLE (field text, value text)
LANGUAGE plpgsql AS $$
DECLARE
  state text; msg text; detail text; hint text; ctx text;
  sch text; tab text; col text; typ text; con text;
BEGIN
  EXECUTE statement;
  RETURN QUERY SELECT 'error', 'none';
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
    detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT, ctx = PG_EXCEPTION_CONTEXT,
    sch = SCHEMA_NAME, tab = TABLE_NAME, col = COLUMN_NAME, typ = PG_DATATYPE_NAME,
    con = CONSTRAINT_NAME;
  -- From this function's EXECUTE on, CONTEXT tells who ran the statement, and its
  -- "SQL statement" line quotes the statement: neither is part of what it raised.
  ctx := regexp_replace(ctx, '\n?PL/pgSQL function error_fields\(text\) line \d+ at EXECUTE.*$', '');
  ctx := trim(trailing E'\n' FROM replace(ctx, 'SQL statement "' || statement || '"', ''));
  RETURN QUERY SELECT * FROM (VALUES ('sqlstate', state), ('message', msg), ('detail', detail),
    ('hint', hint), ('schema', sch), ('table', tab), ('column', col), ('datatype', typ),
    ('constraint', con), ('context', ctx)) AS f(k, v) WHERE v <> '';
END $$;

-- same_error says whether two statements raise the same error in every field.
CREATE FUNCTION same_error(ours text, theirs text) RETURNS boolean LANGUAGE sql AS $$
  SELECT array_agg(o ORDER BY o) IS NOT DISTINCT FROM
         (SELECT array_agg(t ORDER BY t) FROM error_fields(theirs) AS t)
  FROM error_fields(ours) AS o
$$;

-- 1. JSON null into a column whose domain is NOT NULL, or CHECKs VALUE IS NOT NULL.
CREATE DOMAIN required_text AS text NOT NULL;
CREATE DOMAIN checked_qty AS int CHECK (VALUE IS NOT NULL);
CREATE TABLE exact_stock (id int PRIMARY KEY, label required_text, qty checked_qty, version int);
INSERT INTO exact_stock VALUES (1, 'bolt', 5, 1);
SELECT * FROM error_fields($$SELECT idem_versioned_update('exact_stock', '{"id": 1}', '{"label": null, "version": 2}')$$);
SELECT same_error($$SELECT idem_versioned_update('exact_stock', '{"id": 1}', '{"label": null, "version": 2}')$$,
                  $$UPDATE exact_stock SET label = NULL::required_text, version = 2 WHERE id = 1 AND (version IS NULL OR version < 2)$$) AS not_null_domain;
SELECT same_error($$SELECT idem_versioned_update('exact_stock', '{"id": 1}', '{"qty": null, "version": 2}')$$,
                  $$UPDATE exact_stock SET qty = NULL::checked_qty, version = 2 WHERE id = 1 AND (version IS NULL OR version < 2)$$) AS checked_domain;
-- A domain's own checks run when the row is written, as for the hand-written statement:
-- no row, no domain error.
SELECT idem_versioned_update('exact_stock', '{"id": 99}', '{"qty": null, "version": 9}') AS no_row_no_domain_check;
WITH u AS (UPDATE exact_stock SET qty = NULL::checked_qty, version = 9 WHERE id = 99 AND (version IS NULL OR version < 9) RETURNING 1)
SELECT count(*) AS hand_written FROM u;
SELECT * FROM exact_stock;

-- 2. A second unique index on the ledger's key_digest, as REINDEX CONCURRENTLY builds one:
-- a duplicate is still false, never 23505, however many new claims came before it.
CREATE UNIQUE INDEX ledger_key_again ON idempotency.ledger (key_digest);
SELECT count(*) FILTER (WHERE idem_claim('two-indexes-' || g)) AS new_claims FROM generate_series(1, 20) AS g;
SELECT idem_claim('two-indexes-3') AS duplicate, idem_claim('two-indexes-21') AS new;
DROP INDEX idempotency.ledger_key_again;
REINDEX INDEX CONCURRENTLY idempotency.ledger_pkey;
SELECT idem_claim('two-indexes-4') AS duplicate_after_reindex;

-- 3. A GENERATED ALWAYS identity column may only be set to DEFAULT.
CREATE TABLE exact_tickets (id int PRIMARY KEY, seq int GENERATED ALWAYS AS IDENTITY, version int);
INSERT INTO exact_tickets (id, version) VALUES (1, 1), (2, 1);
SELECT * FROM error_fields($$SELECT idem_versioned_update('exact_tickets', '{"id": 1}', '{"seq": 2, "version": 2}')$$);
SELECT same_error($$SELECT idem_versioned_update('exact_tickets', '{"id": 1}', '{"seq": 2, "version": 2}')$$,
                  $$UPDATE exact_tickets SET seq = 2, version = 2 WHERE id = 1 AND (version IS NULL OR version < 2)$$) AS identity_always;
SELECT * FROM exact_tickets ORDER BY id;

-- 4. A unique index that compares case-insensitively on a case-sensitive column: the key
-- is compared with the column's collation, as the statement compares it.
CREATE COLLATION case_blind (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
CREATE TABLE exact_accounts (code text, balance int, version int);
CREATE UNIQUE INDEX accounts_code ON exact_accounts (code COLLATE case_blind);
INSERT INTO exact_accounts VALUES ('ABC', 10, 1);
SELECT idem_versioned_update('exact_accounts', '{"code": "abc"}', '{"balance": 99, "version": 2}') AS other_case;
WITH u AS (UPDATE exact_accounts SET balance = 99, version = 2 WHERE code = 'abc' AND (version IS NULL OR version < 2) RETURNING 1)
SELECT count(*) AS hand_written FROM u;
SELECT idem_versioned_update('exact_accounts', '{"code": "ABC"}', '{"balance": 20, "version": 2}') AS same_case;
SELECT * FROM exact_accounts;

-- 5. INSERT … ON CONFLICT (key_digest) reads key_digest, so a claim needs SELECT on it:
-- without it a role could learn which keys exist.
CREATE ROLE blind_writer;
GRANT USAGE ON SCHEMA idempotency TO blind_writer;
GRANT INSERT ON idempotency.ledger TO blind_writer;
SET ROLE blind_writer;
SELECT * FROM error_fields($$SELECT idem_claim('blind-1')$$);
SELECT same_error($$SELECT idem_claim('blind-1')$$,
                  $$INSERT INTO idempotency.ledger (key_digest, scope_id) VALUES (idem_digest('blind-1'), idem_scope_id('default')) ON CONFLICT (key_digest) DO NOTHING$$) AS insert_without_select;
RESET ROLE;
GRANT SELECT (key_digest) ON idempotency.ledger TO blind_writer;
SET ROLE blind_writer;
SELECT idem_claim('blind-1') AS with_select_on_the_key, idem_claim('blind-1') AS duplicate;
RESET ROLE;
REVOKE ALL ON idempotency.ledger FROM blind_writer;
REVOKE ALL ON SCHEMA idempotency FROM blind_writer;
DROP ROLE blind_writer;

-- 6. The primary key replaced by a UNIQUE constraint still arbitrates; with no unique
-- index at all, the statement's 42P10.
ALTER TABLE idempotency.ledger DROP CONSTRAINT ledger_pkey;
ALTER TABLE idempotency.ledger ADD CONSTRAINT ledger_key UNIQUE (key_digest);
SELECT idem_claim('replaced-key') AS new, idem_claim('replaced-key') AS duplicate;
ALTER TABLE idempotency.ledger DROP CONSTRAINT ledger_key;
SELECT * FROM error_fields($$SELECT idem_claim('no-key')$$);
SELECT same_error($$SELECT idem_claim('no-key')$$,
                  $$INSERT INTO idempotency.ledger (key_digest, scope_id) VALUES (idem_digest('no-key'), idem_scope_id('default')) ON CONFLICT (key_digest) DO NOTHING$$) AS no_unique_index;
-- The arbiter is missing before any privilege is checked, as when the statement is planned.
CREATE ROLE insert_only;
GRANT USAGE ON SCHEMA idempotency TO insert_only;
GRANT INSERT ON idempotency.ledger TO insert_only;
SET ROLE insert_only;
SELECT same_error($$SELECT idem_claim('no-key')$$,
                  $$INSERT INTO idempotency.ledger (key_digest, scope_id) VALUES (idem_digest('no-key'), idem_scope_id('default')) ON CONFLICT (key_digest) DO NOTHING$$) AS no_unique_index_before_privileges;
RESET ROLE;
REVOKE ALL ON idempotency.ledger FROM insert_only;
REVOKE ALL ON SCHEMA idempotency FROM insert_only;
DROP ROLE insert_only;
ALTER TABLE idempotency.ledger ADD CONSTRAINT ledger_pkey PRIMARY KEY (key_digest);

-- 7. A version column with a typmod: the new version is compared as given, then stored
-- rounded, as the statement does.
CREATE TABLE exact_prices (id int PRIMARY KEY, amount int, version numeric(10,0));
INSERT INTO exact_prices VALUES (1, 100, 5);
SELECT idem_versioned_update('exact_prices', '{"id": 1}', '{"amount": 101, "version": 5.4}') AS fraction_newer;
WITH u AS (UPDATE exact_prices SET amount = 102, version = 5.4 WHERE id = 1 AND (version IS NULL OR version < 5.4::numeric) RETURNING 1)
SELECT count(*) AS hand_written FROM u;
SELECT * FROM exact_prices;

-- 8. Defaults a DBA set on the ledger's columns fill the columns a claim does not name.
ALTER TABLE idempotency.ledger ALTER claimed_at SET DEFAULT '2001-02-03 04:05:06+00',
  ALTER result SET DEFAULT '{"filled": "by default"}', ALTER fingerprint SET DEFAULT '00000000-0000-0000-0000-000000000001';
SELECT idem_claim('defaults-1') AS plain, idem_claim('defaults-2', 'default', '{"a": 1}') AS with_payload,
       idem_claim_many(ARRAY['defaults-3']) AS batch;
INSERT INTO idempotency.ledger (key_digest, scope_id) VALUES (idem_digest('defaults-hand'), idem_scope_id('default'))
  ON CONFLICT (key_digest) DO NOTHING;
SELECT k, l.claimed_at AT TIME ZONE 'UTC' AS claimed_utc, l.fingerprint = idem_fingerprint('{"a": 1}') AS payload_fingerprint,
       l.fingerprint, l.result
FROM unnest(ARRAY['defaults-1', 'defaults-2', 'defaults-3', 'defaults-hand']) AS k
JOIN idempotency.ledger AS l ON l.key_digest = idem_digest(k) ORDER BY k;
ALTER TABLE idempotency.ledger ALTER claimed_at SET DEFAULT now(), ALTER result DROP DEFAULT, ALTER fingerprint DROP DEFAULT;

-- 9 and 10. A duplicate writes nothing: no transaction id, no counted insertion, however
-- many new claims the session made before it (SERIALIZABLE's side is in the isolation
-- spec serializable_claims).
SELECT count(*) FILTER (WHERE idem_claim('quiet-' || g)) AS new_claims FROM generate_series(1, 20) AS g;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT n_tup_ins AS inserted_before, n_tup_del AS deleted_before
FROM pg_stat_xact_user_tables WHERE relid = 'idempotency.ledger'::regclass \gset
SELECT idem_claim('quiet-7') AS duplicate, idem_claim_many(ARRAY['quiet-8', 'quiet-9']) AS duplicates;
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_xid,
       n_tup_ins - :inserted_before AS inserted, n_tup_del - :deleted_before AS deleted
FROM pg_stat_xact_user_tables WHERE relid = 'idempotency.ledger'::regclass;
COMMIT;

-- 11. A CHECK constraint on the ledger may read tableoid.
ALTER TABLE idempotency.ledger ADD CONSTRAINT in_the_ledger CHECK (tableoid = 'idempotency.ledger'::regclass);
SELECT idem_claim('tableoid-1') AS new, idem_claim_many(ARRAY['tableoid-2', 'tableoid-1']) AS batch;
ALTER TABLE idempotency.ledger DROP CONSTRAINT in_the_ledger;

-- Errors arrive whole.  A trigger's own SQLSTATE, DETAIL and CONTEXT, on the ledger and on
-- a versioned target:
CREATE FUNCTION refuse_quota() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'quota exceeded' USING ERRCODE = 'Q0001', DETAIL = 'quota 100', HINT = 'wait for tomorrow';
END $$;
CREATE TRIGGER quota BEFORE INSERT ON idempotency.ledger FOR EACH ROW EXECUTE FUNCTION refuse_quota();
SELECT * FROM error_fields($$SELECT idem_claim('quota-1')$$);
SELECT same_error($$SELECT idem_claim('quota-1')$$,
                  $$INSERT INTO idempotency.ledger (key_digest, scope_id) VALUES (idem_digest('quota-1'), idem_scope_id('default')) ON CONFLICT (key_digest) DO NOTHING$$) AS trigger_on_ledger;
DROP TRIGGER quota ON idempotency.ledger;
CREATE TRIGGER quota BEFORE UPDATE ON exact_stock FOR EACH ROW EXECUTE FUNCTION refuse_quota();
SELECT same_error($$SELECT idem_versioned_update('exact_stock', '{"id": 1}', '{"qty": 6, "version": 2}')$$,
                  $$UPDATE exact_stock SET qty = 6, version = 2 WHERE id = 1 AND (version IS NULL OR version < 2)$$) AS trigger_on_target;
DROP TRIGGER quota ON exact_stock;

-- A unique violation carries its schema, table and constraint, which ORMs map errors by.
CREATE TABLE exact_members (id int PRIMARY KEY, email text CONSTRAINT members_email_key UNIQUE, version int);
INSERT INTO exact_members VALUES (1, 'a@example.com', 1), (2, 'b@example.com', 1);
SELECT * FROM error_fields($$SELECT idem_versioned_update('exact_members', '{"id": 2}', '{"email": "a@example.com", "version": 2}')$$);
SELECT same_error($$SELECT idem_versioned_update('exact_members', '{"id": 2}', '{"email": "a@example.com", "version": 2}')$$,
                  $$UPDATE exact_members SET email = 'a@example.com', version = 2 WHERE id = 2 AND (version IS NULL OR version < 2)$$) AS unique_violation;
-- Input functions and CHECK constraints, with their datatype, column and constraint names.
ALTER TABLE exact_members ADD CONSTRAINT email_has_at CHECK (email LIKE '%@%');
SELECT same_error($$SELECT idem_versioned_update('exact_members', '{"id": 2}', '{"email": "nobody", "version": 2}')$$,
                  $$UPDATE exact_members SET email = 'nobody', version = 2 WHERE id = 2 AND (version IS NULL OR version < 2)$$) AS check_violation;
SELECT same_error($$SELECT idem_versioned_update('exact_members', '{"id": 2}', '{"version": "two"}')$$,
                  $$UPDATE exact_members SET version = 'two' WHERE id = 2 AND (version IS NULL OR version < 'two')$$) AS bad_input;
SELECT same_error($$SELECT idem_versioned_upsert('exact_members', '{"id": 3, "email": "a@example.com", "version": 1}')$$,
                  $$INSERT INTO exact_members AS t (id, email, version) VALUES (3, 'a@example.com', 1) ON CONFLICT (id) DO UPDATE SET email = EXCLUDED.email, version = EXCLUDED.version WHERE t.version IS NULL OR t.version < EXCLUDED.version$$) AS upsert_unique_violation;
SELECT * FROM exact_members ORDER BY id;

-- Values are values before any row is read: a bad value is an error for a stale or a
-- missing row too, as the hand-written statement's literal is (exact_members goes direct, exact_prices
-- takes the statement); of two bad values, the same one is reported.
SELECT same_error($$SELECT idem_versioned_update('exact_members', '{"id": 2}', '{"email": "stale", "version": "one"}')$$,
                  $$UPDATE exact_members SET email = 'stale', version = 'one' WHERE id = 2 AND (version IS NULL OR version < 'one')$$) AS stale_bad_value;
SELECT same_error($$SELECT idem_versioned_update('exact_members', '{"id": 99}', '{"version": 5, "email": "nobody"}')$$,
                  $$UPDATE exact_members SET version = 5, email = 'nobody' WHERE id = 99 AND (version IS NULL OR version < 5)$$) AS missing_row_check;
SELECT same_error($$SELECT idem_versioned_update('exact_prices', '{"id": 1}', '{"amount": "lots", "version": 1}')$$,
                  $$UPDATE exact_prices SET amount = 'lots', version = 1 WHERE id = 1 AND (version IS NULL OR version < 1::numeric)$$) AS stale_bad_value_statement;
SELECT same_error($$SELECT idem_versioned_update('exact_prices', '{"id": "nine"}', '{"amount": "lots", "version": 9}')$$,
                  $$UPDATE exact_prices SET amount = 'lots', version = 9 WHERE id = 'nine' AND (version IS NULL OR version < 9::numeric)$$) AS two_bad_values_statement;
SELECT same_error($$SELECT idem_versioned_update('exact_members', '{"id": "nine"}', '{"version": "nine"}')$$,
                  $$UPDATE exact_members SET version = 'nine' WHERE id = 'nine' AND (version IS NULL OR version < 'nine')$$) AS two_bad_values;
-- Arrays and composites too, which the statement builds from the JSON's structure (a JSON
-- string through the type's input function): a bad one is the error for a missing or a
-- stale row, before a later column's bad value, and before any privilege is checked.
CREATE TYPE exact_pair AS (x int, y int);
CREATE TABLE exact_tags (id int PRIMARY KEY, tags text[], pair exact_pair, n int, version int);
INSERT INTO exact_tags VALUES (1, '{a}', '(1,2)', 1, 5);
SELECT same_error($$SELECT idem_versioned_update('exact_tags', '{"id": 99}', '{"tags": "notarray", "version": 6}')$$,
                  $$UPDATE exact_tags SET tags = 'notarray', version = 6 WHERE id = 99 AND (version IS NULL OR version < 6)$$) AS missing_row_bad_array;
SELECT same_error($$SELECT idem_versioned_update('exact_tags', '{"id": 1}', '{"pair": "garbage", "version": 1}')$$,
                  $$UPDATE exact_tags SET pair = 'garbage', version = 1 WHERE id = 1 AND (version IS NULL OR version < 1)$$) AS stale_bad_composite;
SELECT same_error($$SELECT idem_versioned_update('exact_tags', '{"id": 1}', '{"tags": ["a", "b"], "pair": {"x": "q"}, "n": "x", "version": 7}')$$,
                  $$UPDATE exact_tags SET tags = '{a,b}', pair = '(q,)', n = 'x', version = 7 WHERE id = 1 AND (version IS NULL OR version < 7)$$) AS bad_composite_before_bad_integer;
CREATE ROLE exact_reader;
GRANT SELECT (id, version), UPDATE (version) ON exact_tags TO exact_reader;
SET ROLE exact_reader;
SELECT same_error($$SELECT idem_versioned_update('exact_tags', '{"id": 1}', '{"tags": "notarray", "version": 9}')$$,
                  $$UPDATE exact_tags SET tags = 'notarray', version = 9 WHERE id = 1 AND (version IS NULL OR version < 9)$$) AS bad_array_before_privileges;
SELECT same_error($$SELECT idem_versioned_upsert('exact_tags', '{"id": 1, "tags": "notarray", "version": 9}')$$,
                  $$INSERT INTO exact_tags AS t (id, tags, version) VALUES (1, 'notarray', 9) ON CONFLICT (id) DO UPDATE SET tags = EXCLUDED.tags, version = EXCLUDED.version WHERE t.version IS NULL OR t.version < EXCLUDED.version$$) AS upsert_bad_array_before_privileges;
RESET ROLE;
SELECT idem_versioned_update('exact_tags', '{"id": 1}', '{"tags": ["b", "c"], "pair": {"x": 3, "y": 4}, "version": 10}') AS good_values;
SELECT * FROM exact_tags;
-- A composite type altered in the session: its values are made by its new layout, as the
-- next statement makes them (the table itself is not invalidated by ALTER TYPE).
ALTER TYPE exact_pair DROP ATTRIBUTE y;
SELECT idem_versioned_update('exact_tags', '{"id": 1}', '{"pair": {"x": 5, "y": "gone"}, "version": 11}') AS new_layout;
SELECT pair FROM exact_tags;
DROP TABLE exact_tags;
DROP TYPE exact_pair;
-- An array column's typmod is applied as the assignment applies it, after the elements are
-- made without it, as for a literal: a bare number is seconds for interval year[] too.
CREATE TABLE exact_spans (id int PRIMARY KEY, spans interval year[], version int);
INSERT INTO exact_spans VALUES (1, NULL, 0);
SELECT idem_versioned_update('exact_spans', '{"id": 1}', '{"spans": ["200000000"], "version": 1}') AS bare_number;
UPDATE exact_spans SET spans = '{200000000}', version = 2 WHERE id = 1 AND (version IS NULL OR version < 2);
SELECT spans, version FROM exact_spans;
DROP TABLE exact_spans;
DROP ROLE exact_reader;

-- A deferred unique constraint may hold two rows with the same key until COMMIT, and the
-- statement updates both: its recheck trigger sends the table to the statement, and a key
-- is only ever looked up through an immediate unique index.
CREATE TABLE exact_deferred (code text CONSTRAINT exact_deferred_code UNIQUE DEFERRABLE INITIALLY DEFERRED, note text, version int);
BEGIN;
INSERT INTO exact_deferred VALUES ('x', 'first', 1), ('x', 'second', 1);
SELECT idem_versioned_update('exact_deferred', '{"code": "x"}', '{"note": "both", "version": 2}') AS deferred_key;
SELECT * FROM exact_deferred ORDER BY note;
ROLLBACK;
DROP TABLE exact_deferred;

-- A covering index's INCLUDE columns are not part of its key: the key is (id), as
-- ON CONFLICT (id) and WHERE id = … take it, and (id, status) is no key at all.
CREATE TABLE exact_covering (id int, status text, version int,
                             CONSTRAINT exact_covering_pkey PRIMARY KEY (id) INCLUDE (status));
INSERT INTO exact_covering VALUES (1, 'new', 1);
SELECT idem_versioned_update('exact_covering', '{"id": 1}', '{"status": "paid", "version": 2}') AS covering_update,
       idem_versioned_upsert('exact_covering', '{"id": 1, "status": "shipped", "version": 3}') AS covering_upsert;
SELECT sqlstate_of($$SELECT idem_versioned_update('exact_covering', '{"id": 1, "status": "shipped"}', '{"version": 4}')$$) AS included_column_as_key;
SELECT * FROM exact_covering;

-- Values are read by each type's input function, as a literal and jsonb_populate_record read
-- them, including where the cast from text is another function: regclass takes an OID,
-- "char" an octal escape. A NOT NULL domain among the other columns does not get in the way
-- of an array's conversion.
CREATE DOMAIN exact_required AS varchar(4) NOT NULL;
CREATE TABLE exact_cells (rel regclass PRIMARY KEY, letter "char", tag exact_required, cells int[], version int);
INSERT INTO exact_cells VALUES ('pg_class', 'q', 'a', NULL, 1);
SELECT idem_versioned_update('exact_cells', '{"rel": "1259"}', '{"letter": "\\101", "cells": [1, 2], "version": 2}') AS by_input_functions;
SELECT idem_versioned_upsert('exact_cells', '{"rel": "1255", "letter": "b", "tag": "t", "cells": [3], "version": 1}') AS upserted_by_oid;
SELECT rel, letter, letter = '\101'::"char" AS letter_as_literal, tag, cells, version FROM exact_cells ORDER BY rel::text;
-- Under domains over domains, and domains over json and jsonb, the same rules hold as for
-- the type beneath them all (before, a JSON string was 22P02, and a composite or regclass
-- two domains down was read as text).
CREATE TYPE exact_point AS (x int, y text);
CREATE DOMAIN exact_point_d AS exact_point;
CREATE DOMAIN exact_point_dd AS exact_point_d;
CREATE DOMAIN exact_rel_d AS regclass;
CREATE DOMAIN exact_rel_dd AS exact_rel_d;
CREATE DOMAIN exact_jsonb_d AS jsonb;
CREATE DOMAIN exact_json_d AS json;
CREATE TABLE exact_nested (id int PRIMARY KEY, version int, p exact_point_dd, r exact_rel_dd, j exact_jsonb_d, k exact_json_d);
INSERT INTO exact_nested VALUES (1, 1, NULL, NULL, NULL, NULL);
SELECT idem_versioned_update('exact_nested', '{"id": 1}', '{"version": 2, "p": {"x": 1, "y": "a"}, "r": "1259", "j": "abc", "k": "def"}') AS nested_domains;
SELECT p, r, j, k FROM exact_nested;
SELECT (jsonb_populate_record(NULL::exact_nested, '{"p": {"x": 1, "y": "a"}, "r": "1259", "j": "abc", "k": "def"}')).*;
-- An interval's fields are how its input reads a number: '1' is a year in interval year,
-- as in the hand-written UPDATE with an untyped literal (before, the statement path read a
-- second and the field made it 00:00:00); a domain's fields too.
CREATE DOMAIN exact_years AS interval year;
CREATE TABLE exact_spans (id int PRIMARY KEY, version int, y interval year, s interval minute to second(0),
                          d exact_years, plain interval);
INSERT INTO exact_spans VALUES (1, 1, NULL, NULL, NULL, NULL), (2, 1, NULL, NULL, NULL, NULL);
SELECT idem_versioned_update('exact_spans', '{"id": 1}', '{"version": 2, "y": "1", "s": "1.6", "d": "1", "plain": "1"}') AS spans;
UPDATE exact_spans SET version = 2, y = '1', s = '1.6', d = '1', plain = '1' WHERE id = 2 AND version < 2;
SELECT idem_versioned_upsert('exact_spans', '{"id": 3, "version": 1, "y": "2", "s": "62.4", "d": "3", "plain": "4"}') AS upserted_spans;
SELECT * FROM exact_spans ORDER BY id;
DROP TABLE exact_covering, exact_cells, exact_nested, exact_spans;
DROP DOMAIN exact_years;
DROP DOMAIN exact_required, exact_point_dd, exact_point_d, exact_rel_dd, exact_rel_d, exact_jsonb_d, exact_json_d;
DROP TYPE exact_point;

-- A domain that fits its values to a typmod refuses a value too long for it (22001), as the
-- assignment in the hand-written statement, a driver's parameter and jsonb_populate_record
-- do. Before 0.5.0 both paths cut it, as a cast to the domain would; trailing spaces are cut
-- by both.
CREATE DOMAIN exact_sku AS varchar(3);
CREATE TABLE exact_skus (id int PRIMARY KEY, sku exact_sku, version int);
INSERT INTO exact_skus VALUES (1, 'abc', 1);
SELECT * FROM error_fields($$SELECT idem_versioned_update('exact_skus', '{"id": 1}', '{"sku": "abcdef", "version": 2}')$$);
SELECT same_error($$SELECT idem_versioned_update('exact_skus', '{"id": 1}', '{"sku": "abcdef", "version": 2}')$$,
                  $$UPDATE exact_skus SET sku = 'abcdef', version = 2 WHERE id = 1 AND (version IS NULL OR version < 2)$$) AS too_long_update;
SELECT same_error($$SELECT idem_versioned_upsert('exact_skus', '{"id": 1, "sku": "wxyz", "version": 5}')$$,
                  $$INSERT INTO exact_skus AS t (id, sku, version) VALUES (1, 'wxyz', 5) ON CONFLICT (id) DO UPDATE SET sku = EXCLUDED.sku, version = EXCLUDED.version WHERE t.version IS NULL OR t.version < EXCLUDED.version$$) AS too_long_upsert;
SELECT idem_versioned_update('exact_skus', '{"id": 1}', '{"sku": "xyz   ", "version": 3}') AS trailing_spaces;
SELECT id, sku, octet_length(sku) AS bytes, version FROM exact_skus;

-- A table of events keyed by (id, version): a row of key columns alone is inserted once and
-- is false after that, as INSERT … ON CONFLICT DO NOTHING (before 0.5.0, 42601).
CREATE TABLE exact_events (id int, version int, PRIMARY KEY (id, version));
SELECT idem_versioned_upsert('exact_events', '{"id": 1, "version": 2}') AS first,
       idem_versioned_upsert('exact_events', '{"id": 1, "version": 2}') AS again,
       idem_versioned_upsert('exact_events', '{"id": 1, "version": 3}') AS next_version;
SELECT * FROM exact_events ORDER BY version;
DROP TABLE exact_skus, exact_events;
DROP DOMAIN exact_sku;

-- A key or a version whose column has a domain is compared as the type beneath the domain,
-- without the domain's typmod and CHECKs, as WHERE compares a literal: 'abcdef' matches no
-- 'abc' (before 0.5.0 the statement cut it to 'abc' and updated that row), a key that fails
-- the domain's CHECK matches nothing and is no error, and in a numeric(5,0) domain 1.4 is
-- newer than 1 (then stored rounded), as for a plain numeric(5,0) version.
CREATE DOMAIN exact_code AS varchar(3) CHECK (VALUE <> 'zz');
CREATE DOMAIN exact_whole AS numeric(5,0);
CREATE TABLE exact_codes (code exact_code PRIMARY KEY, version exact_whole, label text);
INSERT INTO exact_codes VALUES ('abc', 1, 'first'), ('abd', 1, 'first');
SELECT idem_versioned_update('exact_codes', '{"code": "abcdef"}', '{"label": "cut", "version": 2}') AS too_long_key,
       idem_versioned_update('exact_codes', '{"code": "zz"}', '{"label": "checked", "version": 2}') AS key_failing_check,
       idem_versioned_update('exact_codes', '{"code": "abc"}', '{"label": "fraction", "version": 1.4}') AS fraction_newer;
WITH u AS (UPDATE exact_codes SET label = 'cut', version = 2 WHERE code = 'abcdef' AND (version IS NULL OR version < 2) RETURNING 1),
     c AS (UPDATE exact_codes SET label = 'checked', version = 2 WHERE code = 'zz' AND (version IS NULL OR version < 2) RETURNING 1),
     f AS (UPDATE exact_codes SET label = 'fraction', version = '1.4' WHERE code = 'abd' AND (version IS NULL OR version < '1.4') RETURNING 1)
SELECT (SELECT count(*) FROM u) AS hand_too_long_key, (SELECT count(*) FROM c) AS hand_key_failing_check,
       (SELECT count(*) FROM f) AS hand_fraction_newer;
SELECT * FROM exact_codes ORDER BY code;
DROP TABLE exact_codes;
DROP DOMAIN exact_code, exact_whole;

-- The extension dropped and created again under a session that claimed before: the next
-- claim finds the new ledger, for any role.
CREATE ROLE recreated_app;
SELECT idem_claim('claimed-before-recreate') AS before;
DROP EXTENSION idempotency CASCADE;
CREATE EXTENSION idempotency;
GRANT USAGE ON SCHEMA idempotency TO recreated_app;
GRANT SELECT, INSERT ON idempotency.ledger TO recreated_app;
SET ROLE recreated_app;
SELECT idem_claim('claimed-after-recreate') AS after, idem_claim('claimed-after-recreate') AS duplicate;
RESET ROLE;
REVOKE ALL ON idempotency.ledger FROM recreated_app;
REVOKE ALL ON SCHEMA idempotency FROM recreated_app;
DROP ROLE recreated_app;

DROP TABLE exact_stock, exact_tickets, exact_accounts, exact_prices, exact_members;
DROP DOMAIN required_text, checked_qty;
DROP COLLATION case_blind;
DROP FUNCTION refuse_quota();
