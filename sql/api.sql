-- The SQL surface of idempotency. Every function is SECURITY INVOKER: the caller's own
-- privileges on idempotency.ledger decide what it may do (see the README's GRANTs).
-- None is STRICT: a NULL argument raises 22004 instead of quietly returning NULL.

-- Claims ---------------------------------------------------------------------------------

CREATE FUNCTION idem_claim(key text, scope text DEFAULT 'default', payload jsonb DEFAULT NULL)
RETURNS boolean LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'idem_claim_entry';
COMMENT ON FUNCTION idem_claim(text, text, jsonb) IS
  'Claims (scope, key) in the current transaction: true the first time, false for every duplicate. Waits for a concurrent uncommitted claim of the same key.';

CREATE FUNCTION idem_claim_nowait(key text, scope text DEFAULT 'default', payload jsonb DEFAULT NULL)
RETURNS boolean LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'idem_claim_nowait_entry';
COMMENT ON FUNCTION idem_claim_nowait(text, text, jsonb) IS
  'Like idem_claim, but raises 55P03 at once when another transaction holds an uncommitted claim of the key.';

CREATE FUNCTION idem_claim_replay(key text, scope text DEFAULT 'default', payload jsonb DEFAULT NULL)
RETURNS TABLE (claimed boolean, first_claimed_at timestamptz, result jsonb)
LANGUAGE c VOLATILE PARALLEL UNSAFE ROWS 1
AS 'MODULE_PATHNAME', 'idem_claim_replay_entry';
COMMENT ON FUNCTION idem_claim_replay(text, text, jsonb) IS
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
