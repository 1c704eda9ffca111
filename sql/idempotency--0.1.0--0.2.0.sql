-- idempotency 0.1.0 -> 0.2.0. Nothing stored changes: every claim, result, scope and
-- versioned row stays as it is, and every key derived under 0.1.0 is derived alike.

-- idem_key with parts of any type (#10). The text[] form stays: calls with text parts keep
-- resolving to it, and objects a user built on it (views, generated columns, indexes)
-- keep their dependency.
CREATE FUNCTION idem_key(VARIADIC parts "any")
RETURNS text LANGUAGE c IMMUTABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'idem_key_any_entry';
COMMENT ON FUNCTION idem_key("any") IS
  'A business key from parts of any type: integers in decimal, numeric normalized, uuid lowercase, timestamptz in UTC ISO 8601, boolean true/false, text unchanged.';
