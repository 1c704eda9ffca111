-- idempotency 0.4.0 -> 0.5.0: hostile input refused where it was taken (#15). Nothing stored
-- before changes.
--
-- Like the scripts before it, this one is also the last part of a fresh install's script
-- (src/lib.rs): an update and a new install create the very same objects.

-- A declared retention is at most 1000 years: the purge and the late-replay guard compute
-- now() - retention, which leaves the timestamp range near 6700 years, and a scope declared
-- with more made every purge of the database fail with 22008 from then on. Parts are checked
-- one by one first, since their sum can leave the interval range, and no field of a part may
-- be negative: '7000 years -2520000 days' compares equal to zero (months count 30 days), yet
-- subtracting it from now() takes the 7000 years first. A scope name is at most
-- 1024 bytes, as a stream's: the scopes table's primary key could not index a longer one.
-- Messages quote at most 64 characters of what they were given, as the functions in C do
-- (with an ASCII "...": the script and its constants must also parse in other encodings).
CREATE OR REPLACE FUNCTION idem_declare_scope(
    scope            text,
    broker_retention interval,
    dlq_retention    interval DEFAULT '0',
    replay_window    interval DEFAULT '0',
    buffer           interval DEFAULT '1 day',
    late_replay      text     DEFAULT 'error')
RETURNS idempotency.scopes
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  declared idempotency.scopes;
  part record;
  longest constant interval := '1000 years';
  total interval;
  -- What messages quote of the scope.
  shown text := CASE WHEN length(scope) > 64 THEN left(scope, 64) || '...' ELSE scope END;
BEGIN
  IF scope IS NULL OR late_replay IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004',
      MESSAGE = format('%s must not be NULL', CASE WHEN scope IS NULL THEN 'scope' ELSE 'late_replay' END);
  END IF;
  IF octet_length(scope) > 1024 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('a declared scope name is at most 1024 bytes, not %s', octet_length(scope));
  END IF;
  FOR part IN SELECT * FROM (VALUES ('broker_retention', broker_retention), ('dlq_retention', dlq_retention),
                                    ('replay_window', replay_window), ('buffer', buffer)) AS p(name, value) LOOP
    IF part.value IS NULL THEN
      RAISE EXCEPTION USING ERRCODE = '22004', MESSAGE = format('%s must not be NULL', part.name),
        HINT = 'Use ''0'' for a part that does not apply.';
    END IF;
    -- A part with no negative field is never below zero, whatever its total.
    IF extract(year FROM part.value) < 0 OR extract(month FROM part.value) < 0
       OR extract(day FROM part.value) < 0 OR part.value - date_trunc('day', part.value) < interval '0' THEN
      RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('%s must not be negative, not %s', part.name, part.value),
        HINT = 'Each of its years, months, days and time must be zero or more.';
    END IF;
    IF part.value > longest THEN
      RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('%s must be at most %s, not %s', part.name, longest, part.value);
    END IF;
  END LOOP;
  total := broker_retention + dlq_retention + replay_window + buffer;
  IF total <= interval '0' THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('retention of scope "%s" must be longer than zero', shown);
  END IF;
  IF total > longest THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('retention of scope "%s" must be at most %s, not %s', shown, longest, total);
  END IF;
  IF late_replay NOT IN ('error', 'warn') THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = format('late_replay must be ''error'' or ''warn'', not %L',
                       CASE WHEN length(late_replay) > 64 THEN left(late_replay, 64) || '...' ELSE late_replay END);
  END IF;
  INSERT INTO idempotency.scopes AS s
         (scope, scope_id, broker_retention, dlq_retention, replay_window, buffer, late_replay)
  VALUES (scope, @extschema@.idem_scope_id(scope), broker_retention, dlq_retention, replay_window, buffer, late_replay)
  ON CONFLICT ON CONSTRAINT scopes_pkey DO UPDATE
     SET broker_retention = EXCLUDED.broker_retention, dlq_retention = EXCLUDED.dlq_retention,
         replay_window = EXCLUDED.replay_window, buffer = EXCLUDED.buffer,
         late_replay = EXCLUDED.late_replay, declared_at = now()
  RETURNING s.* INTO declared;
  RETURN declared;
END
$$;
COMMENT ON FUNCTION idem_declare_scope(text, interval, interval, interval, interval, text) IS
  'Declares (or redeclares) a scope''s retention as broker + DLQ retention + replay window + buffer (at most 1000 years), and what a late replay does.';

-- A NULL scope or target is a caller's mistake, not "there was nothing to remove": 22004, as
-- every other function answers a NULL argument.
CREATE OR REPLACE FUNCTION idem_forget_scope(scope text)
RETURNS boolean LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF scope IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004', MESSAGE = 'scope must not be NULL';
  END IF;
  DELETE FROM idempotency.scopes AS s WHERE s.scope = idem_forget_scope.scope;
  RETURN FOUND;
END
$$;
COMMENT ON FUNCTION idem_forget_scope(text) IS
  'Removes a scope''s declaration; its claims then follow idempotency.default_retention.';

CREATE OR REPLACE FUNCTION idem_version_unguard(target regclass)
RETURNS boolean LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF target IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004', MESSAGE = 'target must not be NULL';
  END IF;
  IF NOT EXISTS (SELECT FROM pg_catalog.pg_trigger
                 WHERE tgrelid = target AND tgname = 'idem_version_guard') THEN
    RETURN false;
  END IF;
  EXECUTE pg_catalog.format('DROP TRIGGER idem_version_guard ON %s', target);
  RETURN true;
END
$$;
COMMENT ON FUNCTION idem_version_unguard(regclass) IS
  'Removes the version guard of target; false when it had none.';

-- The message names at most 64 characters of the scope: a name that long was never declared.
CREATE OR REPLACE FUNCTION idem_scope_budget(scope text, row_budget bigint)
RETURNS idempotency.scopes
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  declared idempotency.scopes;
BEGIN
  IF scope IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22004', MESSAGE = 'scope must not be NULL';
  END IF;
  IF row_budget OPERATOR(pg_catalog.<) 1 THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = pg_catalog.format('row_budget must be at least 1, not %s', row_budget),
      HINT = 'Pass NULL to remove the budget.';
  END IF;
  UPDATE idempotency.scopes AS s SET row_budget = idem_scope_budget.row_budget
   WHERE s.scope OPERATOR(pg_catalog.=) idem_scope_budget.scope
  RETURNING s.* INTO declared;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = '42704',
      MESSAGE = pg_catalog.format('scope "%s" is not declared',
                                  CASE WHEN length(scope) > 64 THEN left(scope, 64) || '...' ELSE scope END),
      HINT = 'Declare it with idem_declare_scope first: a budget belongs to a declared scope.';
  END IF;
  RETURN declared;
END
$$;
COMMENT ON FUNCTION idem_scope_budget(text, bigint) IS
  'Sets (or, with NULL, removes) the row budget of a declared scope: idem_purge warns with ID005 while the scope holds more claims.';
