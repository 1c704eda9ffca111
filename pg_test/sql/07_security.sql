-- Safety: functions run with the caller's privileges (SECURITY INVOKER), every internal
-- reference is schema-qualified, and the ledger is reachable only through GRANTs. (Claims
-- record duplicates, while diagnostics are on, as the owner of idempotency.duplicates, with no
-- SECURITY DEFINER function that another role could call: 24_diagnostics.)

SELECT p.proname, p.prosecdef AS security_definer
FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
ORDER BY 1;

-- The extension's storage has a fixed schema; the functions are callable unqualified.
SELECT extrelocatable FROM pg_extension WHERE extname = 'idempotency';

-- A role without the GRANTs is refused (42501), not silently deduplicated.
CREATE ROLE idem_stranger;
SET ROLE idem_stranger;
SELECT sqlstate_of($$SELECT idem_claim('stranger-1')$$);
SELECT sqlstate_of($$SELECT idem_claim_many(ARRAY['stranger-1'])$$);
RESET ROLE;

-- The README's GRANTs are exactly what an application role needs.
CREATE ROLE idem_app;
GRANT USAGE ON SCHEMA idempotency TO idem_app;
GRANT SELECT, INSERT, UPDATE ON idempotency.ledger TO idem_app;
SET ROLE idem_app;
SELECT idem_claim('app-1') AS first, idem_claim('app-1') AS duplicate;
SELECT claimed FROM idem_claim_replay('app-1');
SELECT idem_set_result('app-1', '{"ok": true}');
SELECT idem_claim_many(ARRAY['app-1', 'app-2']) AS batch;
-- It cannot delete processed keys: only retention (run by its owner) does that.
SELECT sqlstate_of($$DELETE FROM idempotency.ledger$$);
-- A claim that passes sent_at reads its scope's retention, which takes one more GRANT.
SELECT sqlstate_of($$SELECT idem_claim('app-3', 'default', NULL, now())$$);
RESET ROLE;
GRANT SELECT ON idempotency.scopes TO idem_app;
SET ROLE idem_app;
SELECT idem_claim('app-3', 'default', NULL, now()) AS with_sent_at;
RESET ROLE;

-- A look-alike object earlier on the search_path cannot redirect a claim: a "ledger"
-- table and a rigged uuid "=" operator in a schema searched first are never used.
CREATE SCHEMA trap;
CREATE TABLE trap.ledger (key_digest uuid, scope_id int8, claimed_at timestamptz,
                          fingerprint uuid, result jsonb);
CREATE FUNCTION trap.always_equal(uuid, uuid) RETURNS boolean LANGUAGE sql AS 'SELECT true';
CREATE OPERATOR trap.= (LEFTARG = uuid, RIGHTARG = uuid, FUNCTION = trap.always_equal);
SET search_path = trap, public;
SELECT idem_claim('trap-1') AS claimed, idem_claim('trap-2') AS other_key_not_confused;
SELECT claimed, result FROM idem_claim_replay('app-1');
SELECT count(*) AS rows_in_trap FROM trap.ledger;
RESET search_path;
SELECT count(*) AS rows_in_ledger FROM idempotency.ledger
WHERE key_digest IN (idem_digest('trap-1'), idem_digest('trap-2'));

-- Nor when the role lists its schema before pg_catalog, where its own "=" on text, bigint
-- and uuid comes first for whatever names an operator without its schema (CASE … WHEN and
-- IS NOT DISTINCT FROM do), or with types "text" and "record" in pg_temp, which come first
-- for type names: no trap fires, and the calls work. Before 0.5.0 the diagnostics and a send
-- repeated with the same id ran the role's "=", a claim that passed sent_at failed with
-- 42846, and the purge ran the CHECK of the role's "record".
CREATE FUNCTION trap.loud_text_eq(text, text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN RAISE WARNING 'trap: text = text'; RETURN $1 OPERATOR(pg_catalog.=) $2; END $$;
CREATE OPERATOR trap.= (LEFTARG = text, RIGHTARG = text, FUNCTION = trap.loud_text_eq);
CREATE FUNCTION trap.loud_int8_eq(int8, int8) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN RAISE WARNING 'trap: int8 = int8'; RETURN $1 OPERATOR(pg_catalog.=) $2; END $$;
CREATE OPERATOR trap.= (LEFTARG = int8, RIGHTARG = int8, FUNCTION = trap.loud_int8_eq);
CREATE TABLE public.trap_rows (id int PRIMARY KEY, label text, version int);
INSERT INTO public.trap_rows VALUES (1, 'a', 1);
CREATE DOMAIN pg_temp.record AS text CHECK (trap.loud_text_eq(VALUE, VALUE));
CREATE DOMAIN pg_temp.text AS int4;
SET search_path = trap, pg_catalog, public;
SELECT count(*) OPERATOR(pg_catalog.>=) 0 AS diagnostics FROM idem_diagnostics();
SELECT count(*) OPERATOR(pg_catalog.>=) 0 AS diagnostics_view FROM idempotency.diagnostics;
BEGIN;
SELECT idem_send('trap.topic', '{"n": 1}', ordering_key => 'trap-key', key => 'trap-send')
       OPERATOR(pg_catalog.=) idem_send('trap.topic', '{"n": 1}', ordering_key => 'trap-key', key => 'trap-send') AS resent_same_id,
       idem_send('trap.topic', '{"n": 1}', key => 'trap-keyless')
       OPERATOR(pg_catalog.=) idem_send('trap.topic', '{"n": 1}', key => 'trap-keyless') AS resent_keyless;
ROLLBACK;
SELECT idem_claim('trap-3', 'default', NULL, now()) AS claimed_with_sent_at;
SELECT idem_versioned_update('public.trap_rows', '{"id": 1}', '{"label": "b", "version": 2}') AS versioned_update,
       idem_versioned_upsert('public.trap_rows', '{"id": 2, "label": "c", "version": 1}') AS versioned_upsert;
SELECT idem_version_guard('public.trap_rows', 'version');
CALL idem_purge();
RESET search_path;
DROP DOMAIN pg_temp.text, pg_temp.record;
SELECT * FROM trap_rows ORDER BY id;
DROP TABLE trap_rows;

DROP OWNED BY idem_app, idem_stranger;
DROP ROLE idem_app;
DROP ROLE idem_stranger;
