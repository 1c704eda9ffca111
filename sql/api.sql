-- The SQL surface of idempotency. Every function is SECURITY INVOKER: the caller's own
-- privileges on idempotency.ledger decide what it may do (see the README's GRANTs).
-- None is STRICT: a NULL argument raises 22004 instead of quietly returning NULL.

-- Claims ---------------------------------------------------------------------------------

CREATE FUNCTION idem_claim(key text, scope text DEFAULT 'default', payload jsonb DEFAULT NULL,
    sent_at timestamptz DEFAULT NULL)
RETURNS boolean LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'idem_claim_entry';
COMMENT ON FUNCTION idem_claim(text, text, jsonb, timestamptz) IS
  'Claims (scope, key) in the current transaction: true the first time, false for every duplicate. Waits for a concurrent uncommitted claim of the same key.';

CREATE FUNCTION idem_claim_nowait(key text, scope text DEFAULT 'default', payload jsonb DEFAULT NULL,
    sent_at timestamptz DEFAULT NULL)
RETURNS boolean LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'idem_claim_nowait_entry';
COMMENT ON FUNCTION idem_claim_nowait(text, text, jsonb, timestamptz) IS
  'Like idem_claim, but raises 55P03 at once when another transaction holds an uncommitted claim of the key.';

CREATE FUNCTION idem_claim_replay(key text, scope text DEFAULT 'default', payload jsonb DEFAULT NULL,
    sent_at timestamptz DEFAULT NULL)
RETURNS TABLE (claimed boolean, first_claimed_at timestamptz, result jsonb)
LANGUAGE c VOLATILE PARALLEL UNSAFE ROWS 1
AS 'MODULE_PATHNAME', 'idem_claim_replay_entry';
COMMENT ON FUNCTION idem_claim_replay(text, text, jsonb, timestamptz) IS
  'Claims like idem_claim; a duplicate also gets the time of the first claim and the result it stored. Call it in FROM.';

CREATE FUNCTION idem_set_result(key text, result jsonb, scope text DEFAULT 'default')
RETURNS void LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'idem_set_result_entry';
COMMENT ON FUNCTION idem_set_result(text, jsonb, text) IS
  'Stores the result of processing a claimed key, in the same transaction, for idem_claim_replay to return to duplicates.';

CREATE FUNCTION idem_claim_many(keys text[], scope text DEFAULT 'default')
RETURNS boolean[] LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'idem_claim_many_entry';
COMMENT ON FUNCTION idem_claim_many(text[], text) IS
  'Claims a batch: element i is true when keys[i] is new and is its first occurrence in the batch.';

-- Deterministic keys ---------------------------------------------------------------------

CREATE FUNCTION idem_key(VARIADIC parts text[])
RETURNS text LANGUAGE c IMMUTABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'idem_key_entry';
COMMENT ON FUNCTION idem_key(text[]) IS
  'A business key from its parts: joined by | with \ and | escaped, so different parts never give the same key.';

-- Since 0.2.0 (sql/idempotency--0.1.0--0.2.0.sql): parts of any type, each in a fixed text
-- form, so that idem_key('payment', 42) needs no cast. Calls with text parts still resolve
-- to the text[] form, which gives the same key.
CREATE FUNCTION idem_key(VARIADIC parts "any")
RETURNS text LANGUAGE c IMMUTABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'idem_key_any_entry';
COMMENT ON FUNCTION idem_key("any") IS
  'A business key from parts of any type: integers in decimal, numeric normalized, uuid lowercase, timestamptz in UTC ISO 8601, boolean true/false, text unchanged.';

CREATE FUNCTION idem_child_key(parent text, "position" integer)
RETURNS text LANGUAGE c IMMUTABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'idem_child_key_entry';
COMMENT ON FUNCTION idem_child_key(text, integer) IS
  'The stable key of a splitter''s child message: parent || ''#'' || position.';

CREATE FUNCTION idem_key_from(payload jsonb, VARIADIC paths text[])
RETURNS text LANGUAGE c IMMUTABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'idem_key_from_entry';
COMMENT ON FUNCTION idem_key_from(jsonb, text[]) IS
  'A business key from values in a payload, by dotted paths (digits index arrays); raises ID002 when one is missing.';

-- What the ledger stores -----------------------------------------------------------------

CREATE FUNCTION idem_digest(key text, scope text DEFAULT 'default')
RETURNS uuid LANGUAGE c IMMUTABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'idem_digest_entry';
COMMENT ON FUNCTION idem_digest(text, text) IS
  'The ledger''s key_digest for (scope, key): find a key with WHERE key_digest = idem_digest(...).';

CREATE FUNCTION idem_scope_id(scope text)
RETURNS bigint LANGUAGE c IMMUTABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'idem_scope_id_entry';
COMMENT ON FUNCTION idem_scope_id(text) IS 'The ledger''s scope_id for a scope name.';

CREATE FUNCTION idem_fingerprint(payload jsonb)
RETURNS uuid LANGUAGE c IMMUTABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'idem_fingerprint_entry';
COMMENT ON FUNCTION idem_fingerprint(jsonb) IS
  'The canonical fingerprint of a payload: key order, whitespace and trailing zeros of numbers do not change it.';

-- Versioned writes -----------------------------------------------------------------------

CREATE FUNCTION idem_versioned_update(target regclass, key jsonb, changes jsonb, version_column name DEFAULT 'version')
RETURNS boolean LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'idem_versioned_update_entry';
COMMENT ON FUNCTION idem_versioned_update(regclass, jsonb, jsonb, name) IS
  'Updates the row found by key (the columns of a unique index) only when changes carries a newer version; true when a row changed.';

CREATE FUNCTION idem_versioned_upsert(target regclass, "row" jsonb, version_column name DEFAULT 'version')
RETURNS boolean LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'idem_versioned_upsert_entry';
COMMENT ON FUNCTION idem_versioned_upsert(regclass, jsonb, name) IS
  'Inserts the row, or updates it by primary key only when its version is newer; true when written.';

CREATE FUNCTION idempotency.version_guard()
RETURNS trigger LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'idem_version_guard_trigger';
COMMENT ON FUNCTION idempotency.version_guard() IS
  'BEFORE UPDATE row trigger installed by idem_version_guard: skips an UPDATE whose version is not newer.';

CREATE FUNCTION idem_version_guard(target regclass, version_column name DEFAULT 'version')
RETURNS void LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'idem_version_guard_entry';
COMMENT ON FUNCTION idem_version_guard(regclass, name) IS
  'From now on every UPDATE of target, from any client, is a no-op unless it makes version_column newer. Calling it again replaces the guard.';

-- idem_version_unguard is defined in sql/idempotency--0.4.0--0.5.0.sql (it refuses a NULL
-- target from 0.5.0).

-- The tables whose UPDATEs are guarded, and by which column.
CREATE VIEW idempotency.version_guards AS
SELECT t.tgrelid::pg_catalog.regclass AS target,
       pg_catalog.convert_from(pg_catalog.substring(t.tgargs, 1,
           pg_catalog.position(t.tgargs, '\x00'::pg_catalog.bytea) - 1), 'UTF8')::pg_catalog.name AS version_column,
       t.tgenabled <> 'D' AS enabled
FROM pg_catalog.pg_trigger AS t
WHERE t.tgname = 'idem_version_guard'
  AND t.tgfoid = 'idempotency.version_guard()'::pg_catalog.regprocedure;
COMMENT ON VIEW idempotency.version_guards IS 'Tables guarded by idem_version_guard and their version column.';

-- Retention setting ----------------------------------------------------------------------

CREATE FUNCTION idem_default_retention()
RETURNS interval LANGUAGE c STABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'idem_default_retention_wrapper';
COMMENT ON FUNCTION idem_default_retention() IS
  'The retention of undeclared scopes: the setting idempotency.default_retention (7 days unless set).';
