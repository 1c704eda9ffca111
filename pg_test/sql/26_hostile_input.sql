-- Hostile input: every public function of the extension fed what a broken or malicious
-- producer, driver or DBA can send: NULL in each argument, empty strings, 1 MB keys, JSON
-- nested 10,000 levels deep and 10 MB payloads, targets that are not plain tables,
-- identifiers built to break generated SQL, and numbers beyond every integer type. Each case
-- ends in an answer or in an error with a documented SQLSTATE (README.md, "Errors"), never
-- XX000, and the transaction around it stays usable.

-- hostile(label, statement) runs one case in a subtransaction (the EXCEPTION block) and
-- returns one row: 'ok' with the first column of the first row the statement returned, or
-- the SQLSTATE and message of the error it raised (cut at 80 characters: some quote a 1 MB
-- argument). Every outcome is kept in hostile_outcomes for the checks at the end.
CREATE TABLE hostile_outcomes (n serial, label text, sqlstate text, message_length int);
CREATE FUNCTION hostile(case_label text, statement text)
RETURNS TABLE (label text, sqlstate text, outcome text) LANGUAGE plpgsql AS $f$
DECLARE
  answer text;
  code text := 'ok';
  said text;
BEGIN
  BEGIN
    EXECUTE statement INTO answer;
    said := 'ok: ' || coalesce(answer, 'NULL');
  EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, said = MESSAGE_TEXT;
  END;
  INSERT INTO hostile_outcomes (label, sqlstate, message_length) VALUES (case_label, code, length(said));
  RETURN QUERY SELECT case_label, code, CASE WHEN length(said) > 80 THEN left(said, 80) || '…' ELSE said END;
END $f$;

-- Claims ---------------------------------------------------------------------------------
-- A NULL must never read as "processed", and a key is a digest in the ledger, so a 1 MB key
-- is claimed like any other and a 10 MB payload is compared by its fingerprint.
BEGIN;
SELECT h.* FROM (VALUES
  ('idem_claim: NULL key', $$SELECT idem_claim(NULL, 'hostile')$$),
  ('idem_claim: NULL scope', $$SELECT idem_claim('c-1', NULL)$$),
  ('idem_claim: NULL payload is no payload', $$SELECT idem_claim('c-1', 'hostile', NULL)$$),
  ('idem_claim: NULL sent_at is no check', $$SELECT idem_claim('c-2', 'hostile', NULL, NULL)$$),
  ('idem_claim: empty key', $$SELECT idem_claim('', 'hostile')$$),
  ('idem_claim: empty scope', $$SELECT idem_claim('c-1', '')$$),
  ('idem_claim: 1 MB key', $$SELECT idem_claim(repeat('k', 1048576), 'hostile')$$),
  ('idem_claim: 1 MB key again', $$SELECT idem_claim(repeat('k', 1048576), 'hostile')$$),
  ('idem_claim: 1 MB key, last byte differs', $$SELECT idem_claim(repeat('k', 1048575) || 'x', 'hostile')$$),
  ('idem_claim: 1 MB scope', $$SELECT idem_claim('c-1', repeat('s', 1048576))$$),
  ('idem_claim: 10 MB payload', $$SELECT idem_claim('c-big', 'hostile', jsonb_build_object('blob', repeat('x', 10485760)))$$),
  ('idem_claim: same 10 MB payload again', $$SELECT idem_claim('c-big', 'hostile', jsonb_build_object('blob', repeat('x', 10485760)))$$),
  ('idem_claim: other 10 MB payload', $$SELECT idem_claim('c-big', 'hostile', jsonb_build_object('blob', repeat('x', 10485759) || 'y'))$$),
  ('idem_claim: JSON null payload', $$SELECT idem_claim('c-null-json', 'hostile', 'null')$$),
  ('idem_claim: sent at -infinity', $$SELECT idem_claim('c-3', 'hostile', NULL, '-infinity')$$),
  ('idem_claim: sent at infinity', $$SELECT idem_claim('c-4', 'hostile', NULL, 'infinity')$$),
  ('idem_claim_nowait: NULL key', $$SELECT idem_claim_nowait(NULL, 'hostile')$$),
  ('idem_claim_nowait: NULL scope', $$SELECT idem_claim_nowait('c-1', NULL)$$),
  ('idem_claim_nowait: NULL payload and sent_at', $$SELECT idem_claim_nowait('c-5', 'hostile', NULL, NULL)$$),
  ('idem_claim_nowait: empty key', $$SELECT idem_claim_nowait('', 'hostile')$$),
  ('idem_claim_nowait: empty scope', $$SELECT idem_claim_nowait('c-1', '')$$),
  ('idem_claim_nowait: 1 MB key, a duplicate', $$SELECT idem_claim_nowait(repeat('k', 1048576), 'hostile')$$),
  ('idem_claim_replay: NULL key', $$SELECT claimed FROM idem_claim_replay(NULL, 'hostile')$$),
  ('idem_claim_replay: NULL scope', $$SELECT claimed FROM idem_claim_replay('c-1', NULL)$$),
  ('idem_claim_replay: NULL payload and sent_at', $$SELECT claimed FROM idem_claim_replay('c-6', 'hostile', NULL, NULL)$$),
  ('idem_claim_replay: empty key', $$SELECT claimed FROM idem_claim_replay('', 'hostile')$$),
  ('idem_claim_replay: empty scope', $$SELECT claimed FROM idem_claim_replay('c-1', '')$$),
  ('idem_claim_replay: 1 MB key, a duplicate', $$SELECT claimed FROM idem_claim_replay(repeat('k', 1048576), 'hostile')$$),
  ('idem_claim_replay: other 10 MB payload', $$SELECT claimed FROM idem_claim_replay('c-big', 'hostile', jsonb_build_object('blob', repeat('y', 10485760)))$$),
  ('idem_set_result: NULL key', $$SELECT idem_set_result(NULL, '{}', 'hostile')$$),
  ('idem_set_result: NULL result', $$SELECT idem_set_result('c-1', NULL, 'hostile')$$),
  ('idem_set_result: NULL scope', $$SELECT idem_set_result('c-1', '{}', NULL)$$),
  ('idem_set_result: empty key', $$SELECT idem_set_result('', '{}', 'hostile')$$),
  ('idem_set_result: empty scope', $$SELECT idem_set_result('c-1', '{}', '')$$),
  ('idem_set_result: 1 MB key never claimed', $$SELECT idem_set_result(repeat('q', 1048576), '{}', 'hostile')$$),
  ('idem_set_result: 10 MB result', $$SELECT idem_set_result('c-1', jsonb_build_object('blob', repeat('r', 10485760)), 'hostile')$$),
  ('idem_claim_replay: replays the 10 MB result', $$SELECT length(result ->> 'blob') FROM idem_claim_replay('c-1', 'hostile')$$),
  ('idem_claim_many: NULL array', $$SELECT idem_claim_many(NULL, 'hostile')$$),
  ('idem_claim_many: NULL element', $$SELECT idem_claim_many(ARRAY['m-1', NULL], 'hostile')$$),
  ('idem_claim_many: NULL scope', $$SELECT idem_claim_many(ARRAY['m-1'], NULL)$$),
  ('idem_claim_many: empty element', $$SELECT idem_claim_many(ARRAY['m-1', ''], 'hostile')$$),
  ('idem_claim_many: empty scope', $$SELECT idem_claim_many(ARRAY['m-1'], '')$$),
  ('idem_claim_many: empty array', $$SELECT idem_claim_many('{}', 'hostile')$$),
  ('idem_claim_many: 1 MB keys, one claimed, one twice', $$SELECT idem_claim_many(ARRAY[repeat('k', 1048576), repeat('m', 1048576), repeat('m', 1048576)], 'hostile')$$),
  ('idem_claim_many: 1 MB scope', $$SELECT idem_claim_many(ARRAY['m-1', 'm-2'], repeat('s', 1048576))$$),
  -- The answers are a list from 1: keys with other subscripts would not line up with them.
  ('idem_claim_many: subscripts from 0', $$SELECT idem_claim_many('[0:1]={m-0,m-9}'::text[], 'hostile')$$),
  ('idem_claim_many: two dimensions', $$SELECT idem_claim_many('{{m-7,m-8},{m-9,m-10}}'::text[], 'hostile')$$),
  ('idem_claim_many: explicit subscripts from 1', $$SELECT idem_claim_many('[1:2]={m-7,m-8}'::text[], 'hostile')$$)
) AS c(label, statement), LATERAL hostile(c.label, c.statement) AS h;
-- The transaction survived every error above: it still claims a fresh key.
SELECT idem_claim('fresh-after-claims', 'hostile') AS still_claims;
COMMIT;
-- The 1 MB key is a 16-byte digest in the ledger.
SELECT pg_column_size(key_digest) AS digest_bytes FROM idempotency.ledger
WHERE key_digest = idem_digest(repeat('k', 1048576), 'hostile');

-- Keys and digests -------------------------------------------------------------------------
-- Pure functions: the same refusals, and keys of any length or numeric extreme.
BEGIN;
SELECT h.* FROM (VALUES
  ('idem_key: NULL', $$SELECT idem_key(NULL)$$),
  ('idem_key: NULL array', $$SELECT idem_key(VARIADIC NULL::text[])$$),
  ('idem_key: no parts', $$SELECT idem_key(VARIADIC '{}'::text[])$$),
  ('idem_key: NULL second part', $$SELECT idem_key('a', NULL)$$),
  ('idem_key: empty parts are parts', $$SELECT idem_key('', '')$$),
  ('idem_key: 1 MB parts full of separators', $$SELECT length(idem_key(repeat('k', 1048576), repeat('|', 1048576)))$$),
  ('idem_key any: NULL int part', $$SELECT idem_key('a', NULL::int)$$),
  ('idem_key any: NULL array', $$SELECT idem_key(VARIADIC NULL::int[])$$),
  ('idem_key any: no parts', $$SELECT idem_key(VARIADIC '{}'::int[])$$),
  ('idem_key any: beyond bigint both ways', $$SELECT idem_key('a', 9223372036854775808, -9223372036854775809)$$),
  ('idem_key any: bigint and smallint limits', $$SELECT idem_key('a', (-9223372036854775808)::int8, 32767::int2)$$),
  ('idem_key any: 1e400', $$SELECT length(idem_key('a', 1e400))$$),
  ('idem_key any: numeric NaN and infinities', $$SELECT idem_key('a', 'NaN'::numeric, 'Infinity'::numeric, '-Infinity'::numeric)$$),
  ('idem_key any: float8 NaN', $$SELECT idem_key('a', 'NaN'::float8)$$),
  ('idem_key any: timestamptz infinities', $$SELECT idem_key('a', 'infinity'::timestamptz, '-infinity'::timestamptz)$$),
  ('idem_key any: an array part', $$SELECT idem_key('a', ARRAY[1])$$),
  ('idem_child_key: NULL parent', $$SELECT idem_child_key(NULL, 1)$$),
  ('idem_child_key: NULL position', $$SELECT idem_child_key('p', NULL)$$),
  ('idem_child_key: empty parent', $$SELECT idem_child_key('', 1)$$),
  ('idem_child_key: int4 minimum', $$SELECT idem_child_key('p', -2147483648)$$),
  ('idem_child_key: int4 maximum', $$SELECT idem_child_key('p', 2147483647)$$),
  ('idem_child_key: beyond int4', $$SELECT idem_child_key('p', '2147483648')$$),
  ('idem_child_key: 1 MB parent', $$SELECT length(idem_child_key(repeat('k', 1048576), 1))$$),
  ('idem_key_from: NULL payload', $$SELECT idem_key_from(NULL, 'a')$$),
  ('idem_key_from: empty string is no JSON', $$SELECT idem_key_from('', 'a')$$),
  ('idem_key_from: NULL paths', $$SELECT idem_key_from('{"a": 1}', VARIADIC NULL::text[])$$),
  ('idem_key_from: NULL path', $$SELECT idem_key_from('{"a": 1}', 'a', NULL)$$),
  ('idem_key_from: no paths', $$SELECT idem_key_from('{"a": 1}', VARIADIC '{}'::text[])$$),
  ('idem_key_from: empty path', $$SELECT idem_key_from('{"a": 1}', '')$$),
  ('idem_key_from: empty segment names an empty key', $$SELECT idem_key_from('{"a": {"": {"b": 1}}}', 'a..b')$$),
  ('idem_key_from: scalar payload', $$SELECT idem_key_from('"a"', 'a')$$),
  ('idem_key_from: index beyond any array', $$SELECT idem_key_from('[1]', '99999999999999999999999')$$),
  ('idem_key_from: negative index', $$SELECT idem_key_from('[1]', '-1')$$),
  ('idem_key_from: 1 MB path', $$SELECT idem_key_from('{"a": 1}', repeat('k', 1048576))$$),
  ('idem_key_from: 1e400 value', $$SELECT length(idem_key_from('{"a": 1e400}', 'a'))$$),
  ('idem_key_from: 10 MB payload', $$SELECT length(idem_key_from(jsonb_build_object('id', repeat('x', 10485760)), 'id'))$$),
  ('idem_digest: NULL key', $$SELECT idem_digest(NULL, 'hostile')$$),
  ('idem_digest: NULL scope', $$SELECT idem_digest('k', NULL)$$),
  ('idem_digest: empty key', $$SELECT idem_digest('', 'hostile')$$),
  ('idem_digest: empty scope', $$SELECT idem_digest('k', '')$$),
  ('idem_digest: 1 MB key and scope', $$SELECT idem_digest(repeat('k', 1048576), repeat('s', 1048576))$$),
  ('idem_scope_id: NULL', $$SELECT idem_scope_id(NULL)$$),
  ('idem_scope_id: empty', $$SELECT idem_scope_id('')$$),
  ('idem_scope_id: 1 MB', $$SELECT idem_scope_id(repeat('s', 1048576))$$),
  ('idem_fingerprint: NULL', $$SELECT idem_fingerprint(NULL)$$),
  ('idem_fingerprint: JSON null', $$SELECT idem_fingerprint('null')$$),
  ('idem_fingerprint: 1e400 = 10e399', $$SELECT idem_fingerprint('{"a": 1e400}') = idem_fingerprint('{"a": 10e399}')$$),
  ('idem_fingerprint: 10 MB', $$SELECT idem_fingerprint(jsonb_build_object('blob', repeat('x', 10485760)))$$),
  ('idem_message_id: NULL key', $$SELECT idem_message_id(NULL, 'hostile', 1)$$),
  ('idem_message_id: NULL scope', $$SELECT idem_message_id('k', NULL, 1)$$),
  ('idem_message_id: NULL n', $$SELECT idem_message_id('k', 'hostile', NULL)$$),
  ('idem_message_id: empty key', $$SELECT idem_message_id('', 'hostile', 1)$$),
  ('idem_message_id: empty scope', $$SELECT idem_message_id('k', '', 1)$$),
  ('idem_message_id: int8 minimum', $$SELECT idem_message_id('k', 'hostile', -9223372036854775808)$$),
  ('idem_message_id: int8 maximum', $$SELECT idem_message_id('k', 'hostile', 9223372036854775807)$$),
  ('idem_message_id: beyond int8', $$SELECT idem_message_id('k', 'hostile', '9223372036854775808')$$),
  ('idem_message_id: 1 MB key and scope', $$SELECT idem_message_id(repeat('k', 1048576), repeat('s', 1048576), 1)$$),
  ('idem_external_key: NULL key', $$SELECT idem_external_key(NULL, 'hostile', 'step')$$),
  ('idem_external_key: NULL scope', $$SELECT idem_external_key('k', NULL, 'step')$$),
  ('idem_external_key: NULL step', $$SELECT idem_external_key('k', 'hostile', NULL)$$),
  ('idem_external_key: empty key', $$SELECT idem_external_key('', 'hostile', 'step')$$),
  ('idem_external_key: empty scope', $$SELECT idem_external_key('k', '', 'step')$$),
  ('idem_external_key: empty step', $$SELECT idem_external_key('k', 'hostile', '')$$),
  ('idem_external_key: 1 MB each', $$SELECT idem_external_key(repeat('k', 1048576), repeat('s', 1048576), repeat('t', 1048576))$$),
  ('idem_external_uuid: NULL key', $$SELECT idem_external_uuid(NULL, 'hostile', 'step')$$),
  ('idem_external_uuid: NULL scope', $$SELECT idem_external_uuid('k', NULL, 'step')$$),
  ('idem_external_uuid: NULL step', $$SELECT idem_external_uuid('k', 'hostile', NULL)$$),
  ('idem_external_uuid: empty key', $$SELECT idem_external_uuid('', 'hostile', 'step')$$),
  ('idem_external_uuid: empty scope', $$SELECT idem_external_uuid('k', '', 'step')$$),
  ('idem_external_uuid: empty step', $$SELECT idem_external_uuid('k', 'hostile', '')$$),
  ('idem_external_uuid: 1 MB each', $$SELECT idem_external_uuid(repeat('k', 1048576), repeat('s', 1048576), repeat('t', 1048576))$$)
) AS c(label, statement), LATERAL hostile(c.label, c.statement) AS h;
SELECT idem_claim('fresh-after-keys', 'hostile') AS still_claims;
COMMIT;

-- Versioned writes: arguments ------------------------------------------------------------
-- The key and changes are jsonb whose members become column values by each type's input
-- rules: a value too large for its column is 22003 as in the UPDATE, on either write path,
-- and a 10,000-level array or a 10 MB document is just a jsonb value.
CREATE TABLE hostile_rows (id int PRIMARY KEY, status text, body jsonb, version int);
INSERT INTO hostile_rows VALUES (1, 'new', '{}', 1);
BEGIN;
SELECT h.* FROM (VALUES
  ('idem_versioned_update: NULL target', $$SELECT idem_versioned_update(NULL, '{"id": 1}', '{"version": 2}')$$),
  ('idem_versioned_update: NULL key', $$SELECT idem_versioned_update('hostile_rows', NULL, '{"version": 2}')$$),
  ('idem_versioned_update: NULL changes', $$SELECT idem_versioned_update('hostile_rows', '{"id": 1}', NULL)$$),
  ('idem_versioned_update: NULL version_column', $$SELECT idem_versioned_update('hostile_rows', '{"id": 1}', '{"version": 2}', NULL)$$),
  ('idem_versioned_update: empty version_column', $$SELECT idem_versioned_update('hostile_rows', '{"id": 1}', '{"": 2}', '')$$),
  ('idem_versioned_update: empty column name in key', $$SELECT idem_versioned_update('hostile_rows', '{"": 1}', '{"version": 2}')$$),
  ('idem_versioned_update: empty key object', $$SELECT idem_versioned_update('hostile_rows', '{}', '{"version": 2}')$$),
  ('idem_versioned_update: key is an array', $$SELECT idem_versioned_update('hostile_rows', '[]', '{"version": 2}')$$),
  ('idem_versioned_update: key is JSON null', $$SELECT idem_versioned_update('hostile_rows', 'null', '{"version": 2}')$$),
  ('idem_versioned_update: changes is a string', $$SELECT idem_versioned_update('hostile_rows', '{"id": 1}', '"x"')$$),
  ('idem_versioned_update: empty changes', $$SELECT idem_versioned_update('hostile_rows', '{"id": 1}', '{}')$$),
  ('idem_versioned_update: JSON null key value', $$SELECT idem_versioned_update('hostile_rows', '{"id": null}', '{"version": 2}')$$),
  ('idem_versioned_update: JSON null version', $$SELECT idem_versioned_update('hostile_rows', '{"id": 1}', '{"version": null}')$$),
  ('idem_versioned_update: 100-byte version_column', $$SELECT idem_versioned_update('hostile_rows', '{"id": 1}', jsonb_build_object(repeat('v', 100), 2), repeat('v', 100))$$),
  ('idem_versioned_update: key beyond int4', $$SELECT idem_versioned_update('hostile_rows', '{"id": 2147483648}', '{"version": 2}')$$),
  ('idem_versioned_update: key 1e400', $$SELECT idem_versioned_update('hostile_rows', '{"id": 1e400}', '{"version": 2}')$$),
  ('idem_versioned_update: key a 10,000-level array', $$SELECT idem_versioned_update('hostile_rows', jsonb_build_object('id', (repeat('[', 10000) || repeat(']', 10000))::jsonb), '{"version": 2}')$$),
  ('idem_versioned_update: version beyond int4', $$SELECT idem_versioned_update('hostile_rows', '{"id": 1}', '{"version": 2147483648}')$$),
  ('idem_versioned_update: version -9223372036854775809', $$SELECT idem_versioned_update('hostile_rows', '{"id": 1}', '{"version": -9223372036854775809}')$$),
  ('idem_versioned_update: 10,000-level array body', $$SELECT idem_versioned_update('hostile_rows', '{"id": 1}', jsonb_build_object('body', (repeat('[', 10000) || repeat(']', 10000))::jsonb, 'version', 2))$$),
  ('idem_versioned_update: 10 MB body, 1 MB status', $$SELECT idem_versioned_update('hostile_rows', '{"id": 1}', jsonb_build_object('body', jsonb_build_object('blob', repeat('x', 10485760)), 'status', repeat('s', 1048576), 'version', 3))$$),
  ('idem_versioned_upsert: NULL target', $$SELECT idem_versioned_upsert(NULL, '{"id": 2, "version": 1}')$$),
  ('idem_versioned_upsert: NULL row', $$SELECT idem_versioned_upsert('hostile_rows', NULL)$$),
  ('idem_versioned_upsert: NULL version_column', $$SELECT idem_versioned_upsert('hostile_rows', '{"id": 2, "version": 1}', NULL)$$),
  ('idem_versioned_upsert: empty row', $$SELECT idem_versioned_upsert('hostile_rows', '{}')$$),
  ('idem_versioned_upsert: row is an array', $$SELECT idem_versioned_upsert('hostile_rows', '[1]')$$),
  ('idem_versioned_upsert: key beyond int4', $$SELECT idem_versioned_upsert('hostile_rows', '{"id": 2147483648, "version": 1}')$$),
  ('idem_versioned_upsert: 10,000-level array body', $$SELECT idem_versioned_upsert('hostile_rows', jsonb_build_object('id', 2, 'body', (repeat('[', 10000) || repeat(']', 10000))::jsonb, 'version', 1))$$),
  ('idem_version_guard: NULL target', $$SELECT idem_version_guard(NULL)$$),
  ('idem_version_guard: NULL version_column', $$SELECT idem_version_guard('hostile_rows', NULL)$$),
  ('idem_version_guard: empty version_column', $$SELECT idem_version_guard('hostile_rows', '')$$),
  ('idem_version_unguard: NULL target', $$SELECT idem_version_unguard(NULL)$$)
) AS c(label, statement), LATERAL hostile(c.label, c.statement) AS h;
SELECT idem_claim('fresh-after-versioned', 'hostile') AS still_claims;
COMMIT;
SELECT id, octet_length(status) AS status_bytes, jsonb_typeof(body) AS body, octet_length(body::text) AS body_bytes, version
FROM hostile_rows ORDER BY id;

-- Versioned writes: version columns of the wrong type ------------------------------------
-- A type without ordering is refused; any ordered type is compared by its own ordering, so
-- text puts '10' before '9', and NaN sorts above every number: after a NaN version no
-- version is newer (as in UPDATE ... WHERE version < $v).
CREATE TABLE hostile_versions (id int PRIMARY KEY, v_point point, v_json json, v_text text, v_bool boolean,
                               v_num numeric, v_float float8, v_int2 int2, v_int8 int8, v_array int[]);
INSERT INTO hostile_versions (id, v_text, v_num, v_float, v_int2, v_int8) VALUES (1, '9', 1, 1, 1, 1);
BEGIN;
SELECT h.* FROM (VALUES
  ('point version: update', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"v_point": "(1,1)"}', 'v_point')$$),
  ('point version: upsert', $$SELECT idem_versioned_upsert('hostile_versions', '{"id": 1, "v_point": "(1,1)"}', 'v_point')$$),
  ('point version: guard', $$SELECT idem_version_guard('hostile_versions', 'v_point')$$),
  ('json version: update', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"v_json": 2}', 'v_json')$$),
  ('system column xmin as version', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"xmin": 2}', 'xmin')$$),
  ('system column ctid as key', $$SELECT idem_versioned_update('hostile_versions', '{"ctid": "(0,1)"}', '{"v_int8": 2}', 'v_int8')$$),
  ('text version: 10 after 9', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"v_text": 10}', 'v_text')$$),
  ('text version: 90 after 9', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"v_text": 90}', 'v_text')$$),
  ('boolean version: true after NULL', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"v_bool": true}', 'v_bool')$$),
  ('boolean version: "yes" after true', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"v_bool": "yes"}', 'v_bool')$$),
  ('boolean version: 2', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"v_bool": 2}', 'v_bool')$$),
  ('numeric version: 1e400', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"v_num": 1e400}', 'v_num')$$),
  ('numeric version: "NaN"', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"v_num": "NaN"}', 'v_num')$$),
  ('numeric version: "Infinity" after NaN', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"v_num": "Infinity"}', 'v_num')$$),
  ('float8 version: 1e400', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"v_float": 1e400}', 'v_float')$$),
  ('float8 version: 1e-400', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"v_float": 1e-400}', 'v_float')$$),
  ('float8 version: "Infinity"', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"v_float": "Infinity"}', 'v_float')$$),
  ('float8 version: "NaN" after Infinity', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"v_float": "NaN"}', 'v_float')$$),
  ('float8 version: "Infinity" after NaN', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"v_float": "Infinity"}', 'v_float')$$),
  ('int2 version: 32768', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"v_int2": 32768}', 'v_int2')$$),
  ('int8 version: 9223372036854775808', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"v_int8": 9223372036854775808}', 'v_int8')$$),
  ('int8 version: -9223372036854775809', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"v_int8": -9223372036854775809}', 'v_int8')$$),
  ('int8 version: 1e400', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"v_int8": 1e400}', 'v_int8')$$),
  ('int8 version: 1.5', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"v_int8": 1.5}', 'v_int8')$$),
  ('int8 version: "NaN"', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"v_int8": "NaN"}', 'v_int8')$$),
  ('int8 version: an object', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"v_int8": {"a": 1}}', 'v_int8')$$),
  ('int8 version: 9223372036854775807', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"v_int8": 9223372036854775807}', 'v_int8')$$),
  ('int8 version: upsert beyond int8', $$SELECT idem_versioned_upsert('hostile_versions', '{"id": 2, "v_int8": 9223372036854775808}', 'v_int8')$$),
  ('int[] version: [1, 2]', $$SELECT idem_versioned_update('hostile_versions', '{"id": 1}', '{"v_array": [1, 2]}', 'v_array')$$)
) AS c(label, statement), LATERAL hostile(c.label, c.statement) AS h;
SELECT idem_claim('fresh-after-version-types', 'hostile') AS still_claims;
COMMIT;
SELECT v_text, v_bool, v_num, v_float, v_int2, v_int8, v_array FROM hostile_versions;

-- Versioned writes: targets that are not plain tables --------------------------------------
-- A view, a materialized view, a foreign table, a sequence, an index, a composite type and a
-- TOAST table are refused with 42809, even for the superuser; a partitioned table, one of
-- its partitions and a temporary table are tables, and are written as UPDATE writes them.
-- A system catalog is a table too: the superuser's versioned update of pg_class does what
-- its UPDATE does; its guard is refused as CREATE TRIGGER on a catalog is.
CREATE VIEW hostile_view AS SELECT * FROM hostile_rows;
CREATE MATERIALIZED VIEW hostile_matview AS SELECT * FROM hostile_rows;
CREATE FOREIGN DATA WRAPPER hostile_dummy;
CREATE SERVER hostile_nowhere FOREIGN DATA WRAPPER hostile_dummy;
CREATE FOREIGN TABLE hostile_foreign (id int, status text, version int) SERVER hostile_nowhere;
CREATE SEQUENCE hostile_sequence;
CREATE TYPE hostile_type AS (id int, version int);
CREATE TABLE hostile_parted (id int, region text, status text, version int, PRIMARY KEY (id, region))
  PARTITION BY LIST (region);
CREATE TABLE hostile_parted_eu PARTITION OF hostile_parted FOR VALUES IN ('eu');
INSERT INTO hostile_parted VALUES (1, 'eu', 'new', 1);
CREATE TEMP TABLE hostile_temp (id int PRIMARY KEY, status text, version int);
INSERT INTO hostile_temp VALUES (1, 'new', 1);
BEGIN;
SELECT h.* FROM (VALUES
  ('view: update', $$SELECT idem_versioned_update('hostile_view', '{"id": 1}', '{"version": 9}')$$),
  ('view: upsert', $$SELECT idem_versioned_upsert('hostile_view', '{"id": 1, "version": 9}')$$),
  ('view: guard', $$SELECT idem_version_guard('hostile_view')$$),
  ('view: unguard', $$SELECT idem_version_unguard('hostile_view')$$),
  ('materialized view: update', $$SELECT idem_versioned_update('hostile_matview', '{"id": 1}', '{"version": 9}')$$),
  ('foreign table: update', $$SELECT idem_versioned_update('hostile_foreign', '{"id": 1}', '{"version": 9}')$$),
  ('foreign table: upsert', $$SELECT idem_versioned_upsert('hostile_foreign', '{"id": 1, "version": 9}')$$),
  ('foreign table: guard', $$SELECT idem_version_guard('hostile_foreign')$$),
  ('foreign table: unguard', $$SELECT idem_version_unguard('hostile_foreign')$$),
  ('sequence: update', $$SELECT idem_versioned_update('hostile_sequence', '{"id": 1}', '{"version": 9}')$$),
  ('index: update', $$SELECT idem_versioned_update('hostile_rows_pkey', '{"id": 1}', '{"version": 9}')$$),
  ('composite type: update', $$SELECT idem_versioned_update(typrelid::regclass, '{"id": 1}', '{"version": 9}') FROM pg_type WHERE typname = 'hostile_type'$$),
  ('TOAST table: update', $$SELECT idem_versioned_update('pg_toast.pg_toast_1255', '{"chunk_id": 1, "chunk_seq": 0}', '{"version": 9}')$$),
  ('no such OID: update', $$SELECT idem_versioned_update(4000000000::oid::regclass, '{"id": 1}', '{"version": 9}')$$),
  ('no such OID: upsert', $$SELECT idem_versioned_upsert(4000000000::oid::regclass, '{"id": 1, "version": 9}')$$),
  ('no such OID: guard', $$SELECT idem_version_guard(4000000000::oid::regclass)$$),
  ('no such OID: unguard', $$SELECT idem_version_unguard(4000000000::oid::regclass)$$),
  ('partitioned: update', $$SELECT idem_versioned_update('hostile_parted', '{"id": 1, "region": "eu"}', '{"status": "paid", "version": 2}')$$),
  ('partitioned: update, same version', $$SELECT idem_versioned_update('hostile_parted', '{"id": 1, "region": "eu"}', '{"status": "late", "version": 2}')$$),
  ('partitioned: upsert', $$SELECT idem_versioned_upsert('hostile_parted', '{"id": 2, "region": "eu", "status": "new", "version": 1}')$$),
  ('partitioned: upsert, no partition for it', $$SELECT idem_versioned_upsert('hostile_parted', '{"id": 3, "region": "us", "status": "new", "version": 1}')$$),
  ('partitioned: guard', $$SELECT idem_version_guard('hostile_parted')$$),
  ('partitioned: unguard', $$SELECT idem_version_unguard('hostile_parted')$$),
  ('partition: update', $$SELECT idem_versioned_update('hostile_parted_eu', '{"id": 1, "region": "eu"}', '{"status": "shipped", "version": 3}')$$),
  ('temporary table: update', $$SELECT idem_versioned_update('hostile_temp', '{"id": 1}', '{"status": "paid", "version": 2}')$$),
  ('temporary table: upsert', $$SELECT idem_versioned_upsert('hostile_temp', '{"id": 2, "status": "new", "version": 1}')$$),
  ('temporary table: guard', $$SELECT idem_version_guard('hostile_temp')$$),
  ('temporary table: unguard', $$SELECT idem_version_unguard('hostile_temp')$$),
  ('pg_class: update', $$SELECT idem_versioned_update('pg_class', jsonb_build_object('oid', 'hostile_view'::regclass::oid), '{"relpages": 1000}', 'relpages')$$),
  ('pg_class: update, same version', $$SELECT idem_versioned_update('pg_class', jsonb_build_object('oid', 'hostile_view'::regclass::oid), '{"relpages": 1000}', 'relpages')$$),
  ('pg_class: update of no row', $$SELECT idem_versioned_update('pg_class', '{"oid": 0}', '{"relpages": 1}', 'relpages')$$),
  ('pg_class: no version column', $$SELECT idem_versioned_update('pg_class', '{"oid": 0}', '{"version": 1}')$$),
  ('pg_class: guard', $$SELECT idem_version_guard('pg_class', 'relpages')$$),
  ('pg_class: unguard', $$SELECT idem_version_unguard('pg_class')$$)
) AS c(label, statement), LATERAL hostile(c.label, c.statement) AS h;
SELECT idem_claim('fresh-after-targets', 'hostile') AS still_claims;
COMMIT;
SELECT * FROM hostile_parted ORDER BY id;
SELECT * FROM hostile_temp ORDER BY id;
SELECT relpages FROM pg_class WHERE oid = 'hostile_view'::regclass;

-- Identifiers built to break generated SQL -------------------------------------------------
-- Quotes, semicolons, comment markers and dollar quotes in table, column and key names: every
-- identifier is quoted and every value stays a parameter, so nothing is injected, and a name
-- the table does not have is 42703 with the name quoted as given.
CREATE TABLE "hostile a""b;--c" ("id;'k" int PRIMARY KEY, "v;/*x*/" bigint, "note$$" text, "-- c" text);
INSERT INTO "hostile a""b;--c" VALUES (1, 1, 'new', NULL);
BEGIN;
SELECT h.* FROM (VALUES
  ('quoted names: update', $q$SELECT idem_versioned_update('"hostile a""b;--c"', '{"id;''k": 1}', '{"v;/*x*/": 2, "note$$": "x''); DROP TABLE hostile_rows; --", "-- c": "*/"}', 'v;/*x*/')$q$),
  ('quoted names: upsert', $q$SELECT idem_versioned_upsert('"hostile a""b;--c"', '{"id;''k": 2, "v;/*x*/": 1, "note$$": "$$; DROP TABLE hostile_rows; $$"}', 'v;/*x*/')$q$),
  ('quoted names: guard', $q$SELECT idem_version_guard('"hostile a""b;--c"', 'v;/*x*/')$q$),
  ('quoted names: a stale UPDATE is skipped', $q$WITH u AS (UPDATE "hostile a""b;--c" SET "v;/*x*/" = 0 WHERE "id;'k" = 1 RETURNING 1) SELECT count(*) FROM u$q$),
  ('quoted names: unguard', $q$SELECT idem_version_unguard('"hostile a""b;--c"')$q$),
  ('injected column name', $q$SELECT idem_versioned_update('"hostile a""b;--c"', '{"id;''k": 1}', '{"v;/*x*/": 3, "x\" = 1; DROP TABLE hostile_rows; --": 1}', 'v;/*x*/')$q$),
  ('injected version_column', $q$SELECT idem_versioned_update('"hostile a""b;--c"', '{"id;''k": 1}', '{"version\"; --": 3}', 'version"; --')$q$),
  ('injected guard column', $q$SELECT idem_version_guard('"hostile a""b;--c"', 'v'');DROP TABLE hostile_rows;--')$q$),
  ('injected key column', $q$SELECT idem_versioned_update('"hostile a""b;--c"', '{"id;''k\" OR true; --": 1}', '{"v;/*x*/": 3}', 'v;/*x*/')$q$)
) AS c(label, statement), LATERAL hostile(c.label, c.statement) AS h;
SELECT idem_claim('fresh-after-identifiers', 'hostile') AS still_claims;
COMMIT;
SELECT * FROM "hostile a""b;--c" ORDER BY 1;
SELECT to_regclass('hostile_rows') IS NOT NULL AS hostile_rows_still_there;

-- Retention, purge and schedule ------------------------------------------------------------
-- The purge commits between batches, so inside this block (a subtransaction) a call with
-- valid arguments is 2D000: its arguments are checked first.
BEGIN;
SELECT h.* FROM (VALUES
  ('idem_declare_scope: NULL scope', $$SELECT retention FROM idem_declare_scope(NULL, '1 day')$$),
  ('idem_declare_scope: NULL broker_retention', $$SELECT retention FROM idem_declare_scope('hostile-declared', NULL)$$),
  ('idem_declare_scope: NULL dlq_retention', $$SELECT retention FROM idem_declare_scope('hostile-declared', '1 day', NULL)$$),
  ('idem_declare_scope: NULL replay_window', $$SELECT retention FROM idem_declare_scope('hostile-declared', '1 day', '0', NULL)$$),
  ('idem_declare_scope: NULL buffer', $$SELECT retention FROM idem_declare_scope('hostile-declared', '1 day', '0', '0', NULL)$$),
  ('idem_declare_scope: NULL late_replay', $$SELECT retention FROM idem_declare_scope('hostile-declared', '1 day', late_replay => NULL)$$),
  ('idem_declare_scope: empty scope', $$SELECT retention FROM idem_declare_scope('', '1 day')$$),
  ('idem_declare_scope: negative part', $$SELECT retention FROM idem_declare_scope('hostile-declared', '-1 day')$$),
  ('idem_declare_scope: zero in all', $$SELECT retention FROM idem_declare_scope('hostile-declared', '0', buffer => '0')$$),
  ('idem_declare_scope: empty late_replay', $$SELECT retention FROM idem_declare_scope('hostile-declared', '1 day', late_replay => '')$$),
  ('idem_declare_scope: 1 MB late_replay', $$SELECT retention FROM idem_declare_scope('hostile-declared', '1 day', late_replay => repeat('w', 1048576))$$),
  -- now() - retention must stay a timestamp, or every purge of the database would fail.
  ('idem_declare_scope: 10000 years', $$SELECT retention FROM idem_declare_scope('hostile-declared', '10000 years')$$),
  ('idem_declare_scope: parts past the interval range', $$SELECT retention FROM idem_declare_scope('hostile-declared', '178000000 years', '178000000 years')$$),
  -- Months count 30 days in a comparison, but now() - retention takes them first.
  ('idem_declare_scope: a negative field', $$SELECT retention FROM idem_declare_scope('hostile-declared', '7000 years -2520000 days')$$),
  ('idem_declare_scope: negative hours', $$SELECT retention FROM idem_declare_scope('hostile-declared', '2 days -1 hour')$$),
  ('idem_declare_scope: 1000 years in all', $$SELECT retention FROM idem_declare_scope('hostile-declared', '999 years', buffer => '1 year')$$),
  ('idem_declare_scope: 1000 years and a day', $$SELECT retention FROM idem_declare_scope('hostile-declared', '1000 years')$$),
  ('idem_declare_scope: 1 MB scope', $$SELECT retention FROM idem_declare_scope(repeat('s', 1048576), '1 day')$$),
  ('idem_declare_scope: 1024-byte scope', $$SELECT octet_length(scope) FROM idem_declare_scope(repeat('é', 512), '1 day')$$),
  ('idem_forget_scope: 1024-byte scope', $$SELECT idem_forget_scope(repeat('é', 512))$$),
  ('idem_declare_scope: valid', $$SELECT retention FROM idem_declare_scope('hostile-declared', '1 day')$$),
  ('idem_scope_budget: NULL scope', $$SELECT row_budget FROM idem_scope_budget(NULL, 1)$$),
  ('idem_scope_budget: empty scope', $$SELECT row_budget FROM idem_scope_budget('', 1)$$),
  ('idem_scope_budget: 1 MB scope', $$SELECT row_budget FROM idem_scope_budget(repeat('s', 1048576), 1)$$),
  ('idem_scope_budget: zero', $$SELECT row_budget FROM idem_scope_budget('hostile-declared', 0)$$),
  ('idem_scope_budget: int8 minimum', $$SELECT row_budget FROM idem_scope_budget('hostile-declared', -9223372036854775808)$$),
  ('idem_scope_budget: beyond int8', $$SELECT row_budget FROM idem_scope_budget('hostile-declared', '9223372036854775808')$$),
  ('idem_scope_budget: int8 maximum', $$SELECT row_budget FROM idem_scope_budget('hostile-declared', 9223372036854775807)$$),
  ('idem_scope_budget: NULL removes it', $$SELECT row_budget FROM idem_scope_budget('hostile-declared', NULL)$$),
  ('idem_forget_scope: NULL scope', $$SELECT idem_forget_scope(NULL)$$),
  ('idem_forget_scope: empty', $$SELECT idem_forget_scope('')$$),
  ('idem_forget_scope: 1 MB', $$SELECT idem_forget_scope(repeat('s', 1048576))$$),
  ('idem_default_retention', $$SELECT idem_default_retention()$$),
  ('idem_purge: NULL batch_blocks', $$CALL idem_purge(NULL)$$),
  ('idem_purge: zero batch_blocks', $$CALL idem_purge(0)$$),
  ('idem_purge: batch_blocks beyond int4', $$CALL idem_purge('2147483648')$$),
  ('idem_purge: NULL pause', $$CALL idem_purge(1, NULL)$$),
  ('idem_purge: negative pause', $$CALL idem_purge(1, '-1 s')$$),
  ('idem_purge: valid, in a block', $$CALL idem_purge(2147483647, '1 s')$$),
  ('idem_purge: NULL deleted, in a block', $$CALL idem_purge(1, '0', NULL)$$),
  ('idem_schedule_purge: NULL schedule', $$SELECT idem_schedule_purge(NULL)$$),
  ('idem_schedule_purge: NULL pause', $$SELECT idem_schedule_purge('* * * * *', NULL)$$),
  ('idem_schedule_purge: negative pause', $$SELECT idem_schedule_purge('* * * * *', '-1 s')$$),
  ('idem_schedule_purge: empty schedule', $$SELECT idem_schedule_purge('')$$),
  ('idem_schedule_purge: 1 MB schedule', $$SELECT idem_schedule_purge(repeat('*', 1048576))$$),
  ('idem_unschedule_purge', $$SELECT idem_unschedule_purge()$$)
) AS c(label, statement), LATERAL hostile(c.label, c.statement) AS h;
SELECT idem_claim('fresh-after-retention', 'hostile') AS still_claims;
COMMIT;

-- Outbox -----------------------------------------------------------------------------------
-- A message's payload and headers go to the outbox as they are: 10 MB or 10,000 levels deep.
BEGIN;
SELECT idem_claim('hostile-sender', 'hostile') AS sender;
SELECT h.* FROM (VALUES
  ('idem_send: NULL topic', $$SELECT idem_send(NULL, '{}')$$),
  ('idem_send: NULL payload', $$SELECT idem_send('hostile.t', NULL)$$),
  ('idem_send: empty topic', $$SELECT idem_send('', '{}')$$),
  ('idem_send: empty ordering key', $$SELECT idem_send('hostile.t', '{}', ordering_key => '')$$),
  ('idem_send: 1 MB ordering key', $$SELECT idem_send('hostile.t', '{}', ordering_key => repeat('o', 1048576))$$),
  ('idem_send: empty key', $$SELECT idem_send('hostile.t', '{}', key => '')$$),
  ('idem_send: 1 MB topic', $$SELECT idem_send('hostile.' || repeat('t', 1048576), '{}')$$),
  ('idem_send: 10 MB payload and headers', $$SELECT idem_send('hostile.t', jsonb_build_object('blob', repeat('x', 10485760)), jsonb_build_object('h', repeat('h', 10485760)))$$),
  ('idem_send: 10,000-level payload', $$SELECT idem_send('hostile.t', (repeat('[', 10000) || repeat(']', 10000))::jsonb)$$),
  ('idem_send: 10,000-level headers', $$SELECT idem_send('hostile.t', '{}', headers => ('{"h": ' || repeat('[', 10000) || repeat(']', 10000) || '}')::jsonb)$$),
  ('idem_send: 1 MB key, 10,000-level payload', $$SELECT idem_send('hostile.t', (repeat('[', 10000) || repeat(']', 10000))::jsonb, key => repeat('k', 1048576))$$),
  ('idem_send: the same again', $$SELECT idem_send('hostile.t', (repeat('[', 10000) || repeat(']', 10000))::jsonb, key => repeat('k', 1048576))$$),
  ('idem_send: one level deeper, same key', $$SELECT idem_send('hostile.t', (repeat('[', 10001) || repeat(']', 10001))::jsonb, key => repeat('k', 1048576))$$),
  ('idem_send: NULL headers, ordering key and key', $$SELECT idem_send('hostile.t', '{}', NULL, NULL, NULL)$$),
  ('idem_outbox_take: NULL', $$SELECT count(*) FROM idem_outbox_take(NULL)$$),
  ('idem_outbox_take: zero', $$SELECT count(*) FROM idem_outbox_take(0)$$),
  ('idem_outbox_take: int4 minimum', $$SELECT count(*) FROM idem_outbox_take(-2147483648)$$),
  ('idem_outbox_take: beyond int4', $$SELECT count(*) FROM idem_outbox_take('2147483648')$$),
  ('idem_outbox_take: int4 maximum', $$SELECT count(*) >= 6 FROM idem_outbox_take(2147483647)$$),
  ('idem_outbox_sent: NULL', $$SELECT idem_outbox_sent(NULL)$$),
  ('idem_outbox_sent: a NULL id', $$SELECT idem_outbox_sent(ARRAY[NULL]::uuid[])$$),
  ('idem_outbox_sent: no ids', $$SELECT idem_outbox_sent('{}')$$),
  ('idem_outbox_sent: unknown id', $$SELECT idem_outbox_sent(ARRAY['00000000-0000-0000-0000-000000000000'::uuid])$$),
  ('idem_outbox_sent: the 1 MB topic', $$SELECT idem_outbox_sent(ARRAY[idem_message_id('hostile-sender', 'hostile', 1)])$$),
  ('idem_outbox_failed: NULL id', $$SELECT idem_outbox_failed(NULL, 'r')$$),
  ('idem_outbox_failed: NULL reason', $$SELECT idem_outbox_failed(idem_message_id('hostile-sender', 'hostile', 2), NULL)$$),
  ('idem_outbox_failed: NULL retry_after', $$SELECT idem_outbox_failed(idem_message_id('hostile-sender', 'hostile', 2), 'r', NULL)$$),
  ('idem_outbox_failed: NULL max_attempts', $$SELECT idem_outbox_failed(idem_message_id('hostile-sender', 'hostile', 2), 'r', '1 s', NULL)$$),
  ('idem_outbox_failed: negative retry_after', $$SELECT idem_outbox_failed(idem_message_id('hostile-sender', 'hostile', 2), 'r', '-1 s')$$),
  ('idem_outbox_failed: retry_after with a negative field', $$SELECT idem_outbox_failed(idem_message_id('hostile-sender', 'hostile', 2), 'r', '1 month -29 days')$$),
  ('idem_outbox_failed: zero max_attempts', $$SELECT idem_outbox_failed(idem_message_id('hostile-sender', 'hostile', 2), 'r', '1 s', 0)$$),
  ('idem_outbox_failed: max_attempts beyond int4', $$SELECT idem_outbox_failed(idem_message_id('hostile-sender', 'hostile', 2), 'r', '1 s', '2147483648')$$),
  ('idem_outbox_failed: unknown id', $$SELECT idem_outbox_failed('00000000-0000-0000-0000-000000000000', 'r')$$),
  ('idem_outbox_failed: 1 MB reason', $$SELECT idem_outbox_failed(idem_message_id('hostile-sender', 'hostile', 2), repeat('r', 1048576))$$),
  ('idem_outbox_failed: empty reason, int4 maximum', $$SELECT idem_outbox_failed(idem_message_id('hostile-sender', 'hostile', 3), '', '1 s', 2147483647)$$),
  ('idem_outbox_requeue: NULL', $$SELECT idem_outbox_requeue(NULL)$$),
  ('idem_outbox_requeue: unknown id', $$SELECT idem_outbox_requeue('00000000-0000-0000-0000-000000000000')$$),
  ('idem_outbox_retention', $$SELECT idem_outbox_retention()$$)
) AS c(label, statement), LATERAL hostile(c.label, c.statement) AS h;
SELECT idem_claim('fresh-after-outbox', 'hostile') AS still_claims;
COMMIT;
SELECT octet_length(topic) AS topic_bytes, jsonb_typeof(payload) AS payload, octet_length(payload::text) AS payload_bytes,
       octet_length(headers::text) AS header_bytes, sent_at IS NOT NULL AS sent, attempts, octet_length(last_error) AS error_bytes
FROM idempotency.outbox WHERE topic LIKE 'hostile.%' ORDER BY seq;

-- Watermarks -------------------------------------------------------------------------------
-- Positions are whole numbers from 0 up with no upper bound (numeric): past every integer
-- type is a position, NaN and the infinities are not.
BEGIN;
SELECT h.* FROM (VALUES
  ('idem_watermark_advance: NULL stream', $$SELECT idem_watermark_advance(NULL, 'p', 1)$$),
  ('idem_watermark_advance: NULL partition', $$SELECT idem_watermark_advance('hostile', NULL, 1)$$),
  ('idem_watermark_advance: NULL position', $$SELECT idem_watermark_advance('hostile', 'p', NULL)$$),
  ('idem_watermark_advance: empty stream', $$SELECT idem_watermark_advance('', 'p', 1)$$),
  ('idem_watermark_advance: empty partition name', $$SELECT idem_watermark_advance('hostile', '', 1)$$),
  ('idem_watermark_advance: 1 MB stream', $$SELECT idem_watermark_advance(repeat('s', 1048576), 'p', 1)$$),
  ('idem_watermark_advance: 1 MB partition', $$SELECT idem_watermark_advance('hostile', repeat('p', 1048576), 1)$$),
  ('idem_watermark_advance: 9223372036854775808', $$SELECT idem_watermark_advance('hostile', 'p', 9223372036854775808)$$),
  ('idem_watermark_advance: 18446744073709551616', $$SELECT idem_watermark_advance('hostile', 'p', 18446744073709551616)$$),
  ('idem_watermark_advance: 1e400', $$SELECT idem_watermark_advance('hostile', 'p', 1e400)$$),
  ('idem_watermark_advance: 1e400 again', $$SELECT idem_watermark_advance('hostile', 'p', 1e400)$$),
  ('idem_watermark_advance: -9223372036854775809', $$SELECT idem_watermark_advance('hostile', 'p', -9223372036854775809)$$),
  ('idem_watermark_advance: 1e-400', $$SELECT idem_watermark_advance('hostile', 'p', 1e-400)$$),
  ('idem_watermark_advance: NaN', $$SELECT idem_watermark_advance('hostile', 'p', 'NaN')$$),
  ('idem_watermark_advance: Infinity', $$SELECT idem_watermark_advance('hostile', 'p', 'Infinity')$$),
  ('idem_watermark_advance: -Infinity', $$SELECT idem_watermark_advance('hostile', 'p', '-Infinity')$$),
  ('idem_watermark_advance numbered: NULL partition', $$SELECT idem_watermark_advance('hostile', NULL::bigint, 1)$$),
  ('idem_watermark_advance numbered: NULL stream', $$SELECT idem_watermark_advance(NULL, 0::bigint, 1)$$),
  ('idem_watermark_advance numbered: NULL position', $$SELECT idem_watermark_advance('hostile', 0::bigint, NULL)$$),
  ('idem_watermark_advance numbered: int8 minimum', $$SELECT idem_watermark_advance('hostile', -9223372036854775808, 1)$$),
  ('idem_watermark_advance numbered: int8 maximum', $$SELECT idem_watermark_advance('hostile', 9223372036854775807, 1)$$),
  ('idem_watermark_advance: beyond int8 is a name', $$SELECT idem_watermark_advance('hostile', '9223372036854775808', 1)$$),
  ('idem_watermark_advance_lsn: NULL stream', $$SELECT idem_watermark_advance_lsn(NULL, 'lsn', '0/1')$$),
  ('idem_watermark_advance_lsn: NULL partition', $$SELECT idem_watermark_advance_lsn('hostile', NULL, '0/1')$$),
  ('idem_watermark_advance_lsn: NULL lsn', $$SELECT idem_watermark_advance_lsn('hostile', 'lsn', NULL)$$),
  ('idem_watermark_advance_lsn: empty lsn', $$SELECT idem_watermark_advance_lsn('hostile', 'lsn', '')$$),
  ('idem_watermark_advance_lsn: largest LSN', $$SELECT idem_watermark_advance_lsn('hostile', 'lsn', 'FFFFFFFF/FFFFFFFF')$$),
  ('idem_watermark: NULL stream', $$SELECT idem_watermark(NULL, 'p')$$),
  ('idem_watermark: NULL partition', $$SELECT idem_watermark('hostile', NULL)$$),
  ('idem_watermark: empty stream', $$SELECT idem_watermark('', 'p')$$),
  ('idem_watermark: 1 MB partition', $$SELECT idem_watermark('hostile', repeat('p', 1048576))$$),
  ('idem_watermark: never advanced', $$SELECT idem_watermark('hostile', 'never')$$),
  ('idem_watermark: at 1e400', $$SELECT length(idem_watermark('hostile', 'p')::text)$$),
  ('idem_watermark numbered: NULL partition', $$SELECT idem_watermark('hostile', NULL::bigint)$$),
  ('idem_watermark numbered: NULL stream', $$SELECT idem_watermark(NULL, 0::bigint)$$),
  ('idem_watermark numbered: int8 minimum', $$SELECT idem_watermark('hostile', -9223372036854775808)$$),
  ('idem_watermark_lsn: NULL stream', $$SELECT idem_watermark_lsn(NULL, 'lsn')$$),
  ('idem_watermark_lsn: NULL partition', $$SELECT idem_watermark_lsn('hostile', NULL)$$),
  ('idem_watermark_lsn: largest LSN', $$SELECT idem_watermark_lsn('hostile', 'lsn')$$),
  ('idem_watermark_lsn: 1e400 is no LSN', $$SELECT idem_watermark_lsn('hostile', 'p')$$)
) AS c(label, statement), LATERAL hostile(c.label, c.statement) AS h;
SELECT idem_claim('fresh-after-watermarks', 'hostile') AS still_claims;
COMMIT;

-- External calls ---------------------------------------------------------------------------
-- Arguments are checked before the transaction state: inside this block (and inside the
-- harness's subtransaction) a begin or confirm with valid arguments is 25001.
BEGIN;
SELECT h.* FROM (VALUES
  ('idem_call_begin: NULL key', $$SELECT state FROM idem_call_begin(NULL, 'hostile', 'charge')$$),
  ('idem_call_begin: NULL scope', $$SELECT state FROM idem_call_begin('k', NULL, 'charge')$$),
  ('idem_call_begin: NULL step', $$SELECT state FROM idem_call_begin('k', 'hostile', NULL)$$),
  ('idem_call_begin: empty key', $$SELECT state FROM idem_call_begin('', 'hostile', 'charge')$$),
  ('idem_call_begin: empty scope', $$SELECT state FROM idem_call_begin('k', '', 'charge')$$),
  ('idem_call_begin: empty step', $$SELECT state FROM idem_call_begin('k', 'hostile', '')$$),
  ('idem_call_begin: valid, in a block', $$SELECT state FROM idem_call_begin('k', 'hostile', 'charge')$$),
  ('idem_call_confirm: NULL key', $$SELECT idem_call_confirm(NULL, 'hostile', 'charge', '{}')$$),
  ('idem_call_confirm: NULL scope', $$SELECT idem_call_confirm('k', NULL, 'charge', '{}')$$),
  ('idem_call_confirm: NULL step', $$SELECT idem_call_confirm('k', 'hostile', NULL, '{}')$$),
  ('idem_call_confirm: NULL response', $$SELECT idem_call_confirm('k', 'hostile', 'charge', NULL)$$),
  ('idem_call_confirm: empty step', $$SELECT idem_call_confirm('k', 'hostile', '', '{}')$$),
  ('idem_call_confirm: valid, in a block', $$SELECT idem_call_confirm('k', 'hostile', 'charge', '{}')$$),
  ('idem_call_resolve: NULL key', $$SELECT idem_call_resolve(NULL, 'hostile', 'charge', false)$$),
  ('idem_call_resolve: NULL scope', $$SELECT idem_call_resolve('k', NULL, 'charge', false)$$),
  ('idem_call_resolve: NULL step', $$SELECT idem_call_resolve('k', 'hostile', NULL, false)$$),
  ('idem_call_resolve: NULL happened', $$SELECT idem_call_resolve('k', 'hostile', 'charge', NULL)$$),
  ('idem_call_resolve: happened, NULL response', $$SELECT idem_call_resolve('k', 'hostile', 'charge', true, NULL)$$),
  ('idem_call_resolve: not happened, a response', $$SELECT idem_call_resolve('k', 'hostile', 'charge', false, '{}')$$),
  ('idem_call_resolve: empty scope', $$SELECT idem_call_resolve('k', '', 'charge', false)$$),
  ('idem_call_resolve: never begun', $$SELECT idem_call_resolve('k', 'hostile', 'charge', false)$$),
  ('idem_call_resolve: 1 MB each, never begun', $$SELECT idem_call_resolve(repeat('k', 1048576), repeat('s', 1048576), repeat('t', 1048576), true, jsonb_build_object('blob', repeat('x', 10485760)))$$)
) AS c(label, statement), LATERAL hostile(c.label, c.statement) AS h;
SELECT idem_claim('fresh-after-external-calls', 'hostile') AS still_claims;
COMMIT;
-- Outside a block, as its own statements: a 1 MB key and a 10 MB response.
SELECT state, length(call_key) AS call_key_length FROM idem_call_begin(repeat('k', 1048576), 'hostile', 'charge');
SELECT idem_call_confirm(repeat('k', 1048576), 'hostile', 'charge', jsonb_build_object('blob', repeat('x', 10485760))) AS confirmed;
SELECT state, length(response ->> 'blob') AS response_length FROM idem_call_begin(repeat('k', 1048576), 'hostile', 'charge');
SELECT * FROM hostile('idem_call_resolve: already confirmed', $$SELECT idem_call_resolve(repeat('k', 1048576), 'hostile', 'charge', false)$$);

-- Diagnostics ------------------------------------------------------------------------------
BEGIN;
SELECT h.* FROM (VALUES
  ('idem_diagnostics: NULL since', $$SELECT count(*) FROM idem_diagnostics(NULL)$$),
  ('idem_diagnostics: zero since', $$SELECT count(*) FROM idem_diagnostics('0')$$),
  ('idem_diagnostics: negative since', $$SELECT count(*) FROM idem_diagnostics('-1 day')$$),
  ('idem_diagnostics: one microsecond', $$SELECT count(*) >= 0 FROM idem_diagnostics('1 microsecond')$$),
  ('idem_diagnostics_retention', $$SELECT idem_diagnostics_retention()$$)
) AS c(label, statement), LATERAL hostile(c.label, c.statement) AS h;
SELECT idem_claim('fresh-after-diagnostics', 'hostile') AS still_claims;
COMMIT;

-- Nesting ---------------------------------------------------------------------------------
-- Payloads, results and responses are read as JSON values, which nest at most 127 levels:
-- 127 is read, 128 and 10,000 are refused with 54001 before anything is written, and the
-- depth of nested objects counts as much as that of arrays.
CREATE FUNCTION hostile_nest(depth int) RETURNS jsonb LANGUAGE sql
RETURN (repeat('[', depth - 1) || '{"a":1}' || repeat(']', depth - 1))::jsonb;
BEGIN;
SELECT h.* FROM (VALUES
  ('idem_claim: payload 127 deep', $$SELECT idem_claim('n-1', 'hostile', hostile_nest(127))$$),
  ('idem_claim: same payload 127 deep again', $$SELECT idem_claim('n-1', 'hostile', hostile_nest(127))$$),
  ('idem_claim: payload 128 deep', $$SELECT idem_claim('n-2', 'hostile', hostile_nest(128))$$),
  ('idem_claim: payload 128 deep in objects', $$SELECT idem_claim('n-2', 'hostile', (repeat('{"a":', 128) || '1' || repeat('}', 128))::jsonb)$$),
  ('idem_claim: payload 10,000 deep', $$SELECT idem_claim('n-2', 'hostile', hostile_nest(10000))$$),
  ('idem_claim_nowait: payload 128 deep', $$SELECT idem_claim_nowait('n-2', 'hostile', hostile_nest(128))$$),
  ('idem_claim_replay: payload 128 deep', $$SELECT claimed FROM idem_claim_replay('n-2', 'hostile', hostile_nest(128))$$),
  ('idem_fingerprint: 127 deep', $$SELECT idem_fingerprint(hostile_nest(127)) = idem_fingerprint(hostile_nest(127))$$),
  ('idem_fingerprint: 128 deep', $$SELECT idem_fingerprint(hostile_nest(128))$$),
  ('idem_set_result: result 127 deep', $$SELECT idem_set_result('n-1', hostile_nest(127), 'hostile')$$),
  ('idem_claim_replay: replays the result 127 deep', $$SELECT result = hostile_nest(127) FROM idem_claim_replay('n-1', 'hostile')$$),
  ('idem_set_result: result 128 deep', $$SELECT idem_set_result('n-1', hostile_nest(128), 'hostile')$$),
  ('idem_key_from: payload 127 deep', $$SELECT idem_key_from(jsonb_build_object('a', 'x', 'deep', hostile_nest(126)), 'a')$$),
  ('idem_key_from: payload 128 deep', $$SELECT idem_key_from(jsonb_build_object('a', 'x', 'deep', hostile_nest(127)), 'a')$$),
  ('idem_call_confirm: response 128 deep', $$SELECT idem_call_confirm('n-3', 'hostile', 'charge', hostile_nest(128))$$),
  ('idem_call_resolve: response 128 deep', $$SELECT idem_call_resolve('n-3', 'hostile', 'charge', true, hostile_nest(128))$$)
) AS c(label, statement), LATERAL hostile(c.label, c.statement) AS h;
-- A payload read from a table may be compressed or stored out of line: measured all the same.
CREATE TABLE hostile_stored (storage text, payload jsonb);
INSERT INTO hostile_stored VALUES ('compressed', hostile_nest(5000));
ALTER TABLE hostile_stored ALTER COLUMN payload SET STORAGE EXTERNAL;
INSERT INTO hostile_stored VALUES ('external', hostile_nest(5000));
SELECT storage, pg_column_compression(payload) IS NOT NULL AS compressed FROM hostile_stored ORDER BY storage;
SELECT h.* FROM hostile_stored AS s,
  LATERAL hostile('idem_claim: 5000 deep, ' || s.storage,
                  format($$SELECT idem_claim('n-2', 'hostile', payload) FROM hostile_stored WHERE storage = %L$$, s.storage)) AS h
ORDER BY s.storage;
DROP TABLE hostile_stored;
-- Nothing was claimed by the refused calls.
SELECT count(*) AS refused_keys_claimed FROM idempotency.ledger WHERE key_digest = idem_digest('n-2', 'hostile');
SELECT idem_claim('fresh-after-nesting', 'hostile') AS still_claims;
-- A result stored deeper by other means (an UPDATE of the ledger) replays whole, as the bytes
-- the table holds: nothing on the way back reads it as a JSON value.
UPDATE idempotency.ledger SET result = hostile_nest(10000) WHERE key_digest = idem_digest('n-1', 'hostile');
SELECT h.* FROM (VALUES
  ('idem_claim_replay: replays a result 10,000 deep', $$SELECT result = hostile_nest(10000) FROM idem_claim_replay('n-1', 'hostile')$$),
  ('idem_claim_replay: replays it with a payload given', $$SELECT result = hostile_nest(10000) FROM idem_claim_replay('n-1', 'hostile', hostile_nest(127))$$)
) AS c(label, statement), LATERAL hostile(c.label, c.statement) AS h;
COMMIT;
-- So does a response, out of line and compressed or not.
SELECT state FROM idem_call_begin('n-4', 'hostile', 'charge');
SELECT state FROM idem_call_begin('n-5', 'hostile', 'charge');
UPDATE idempotency.external_calls SET response = hostile_nest(10000), confirmed_at = now() WHERE key = 'n-4';
UPDATE idempotency.external_calls SET response = (SELECT jsonb_agg(g) FROM generate_series(1, 100000) AS g), confirmed_at = now()
WHERE key = 'n-5';
-- (idem_call_begin refuses a transaction block, so not through hostile(), whose exception
-- block is one.)
SELECT state, response = hostile_nest(10000) AS replayed_whole FROM idem_call_begin('n-4', 'hostile', 'charge');
SELECT state, jsonb_array_length(response) AS replayed_elements FROM idem_call_begin('n-5', 'hostile', 'charge');
DELETE FROM idempotency.external_calls WHERE scope = 'hostile' AND key IN ('n-4', 'n-5');
DROP FUNCTION hostile_nest(int);

-- After all of it -------------------------------------------------------------------------
-- No case raised an internal error.
SELECT n, label, sqlstate FROM hostile_outcomes WHERE sqlstate = 'XX000' ORDER BY n;
-- Every SQLSTATE is one of README.md's table ("Errors").
SELECT DISTINCT sqlstate AS undocumented FROM hostile_outcomes
WHERE sqlstate <> 'ok' AND sqlstate <> ALL ('{22004,22023,55P03,42703,42P10,42883,42804,42809,42704,42P01,55000,25000,25P01,25001,2D000,40001,42501,22P02,22001,22003,23502,23503,23505,23514,27000,ID001,ID002,ID003,ID004,ID005,54001,0A000}');
SELECT sqlstate, count(*) FROM hostile_outcomes GROUP BY sqlstate ORDER BY sqlstate;
-- No message quotes a megabyte back at the log: keys, scopes, steps, paths and names are cut.
-- (PostgreSQL's own coercion errors quote the value as the statement would: 20 kB for the
-- 10,000-level array.)
SELECT n, label, message_length FROM hostile_outcomes WHERE sqlstate <> 'ok' AND message_length > 100000 ORDER BY n;
-- The ledger holds exactly the claims that answered true, each once: none was lost and none
-- was left behind by a case that failed.
SELECT count(*) AS hostile_claims FROM idempotency.ledger WHERE scope_id = idem_scope_id('hostile');
SELECT count(*) AS claims_in_1mb_scope FROM idempotency.ledger WHERE scope_id = idem_scope_id(repeat('s', 1048576));

-- Clean up.
DELETE FROM idempotency.ledger WHERE scope_id IN (idem_scope_id('hostile'), idem_scope_id(repeat('s', 1048576)));
DELETE FROM idempotency.outbox WHERE topic LIKE 'hostile.%';
DELETE FROM idempotency.watermarks WHERE stream = 'hostile';
DELETE FROM idempotency.external_calls WHERE scope = 'hostile';
SELECT idem_forget_scope('hostile-declared');
DROP TABLE "hostile a""b;--c", hostile_temp, hostile_parted, hostile_versions, hostile_outcomes;
DROP MATERIALIZED VIEW hostile_matview;
DROP VIEW hostile_view;
DROP TABLE hostile_rows;
DROP FOREIGN TABLE hostile_foreign;
DROP SERVER hostile_nowhere;
DROP FOREIGN DATA WRAPPER hostile_dummy;
DROP SEQUENCE hostile_sequence;
DROP TYPE hostile_type;
DROP FUNCTION hostile(text, text);
