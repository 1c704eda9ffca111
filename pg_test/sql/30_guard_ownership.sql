-- The version guard acts only on what is its own, and refuses a column it could not guard.
-- A DBA's schema may already hold a trigger named idem_version_guard, or a generated version
-- column, or a partitioned table; none of them may turn UPDATEs into silent no-ops or lose a
-- user's trigger.

-- A user's own trigger that happens to have the guard's name is neither dropped nor replaced.
CREATE TABLE audited (id int PRIMARY KEY, version int, note text);
INSERT INTO audited VALUES (1, 1, 'first');
CREATE FUNCTION audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN NEW.note := NEW.note || ' (audited)'; RETURN NEW; END $$;
CREATE TRIGGER idem_version_guard BEFORE UPDATE ON audited FOR EACH ROW EXECUTE FUNCTION audit_row();
SELECT idem_version_unguard('audited') AS unguarded_a_foreign_trigger;
SELECT sqlstate_of($$SELECT idem_version_guard('audited')$$) AS guard_over_a_foreign_trigger;
SELECT tgfoid::regproc AS still_the_users_function FROM pg_trigger
WHERE tgrelid = 'audited'::regclass AND tgname = 'idem_version_guard';
UPDATE audited SET version = 0, note = 'second';
SELECT id, version, note FROM audited;
SELECT count(*) AS listed_as_guarded FROM idempotency.version_guards WHERE target = 'audited'::regclass;

-- The guard attached by hand without its argument: the view still answers, for every reader.
CREATE TABLE guarded_by_hand (id int PRIMARY KEY, version int);
CREATE TRIGGER idem_version_guard BEFORE UPDATE ON guarded_by_hand
  FOR EACH ROW EXECUTE FUNCTION idempotency.version_guard();
SELECT target, version_column, enabled FROM idempotency.version_guards
WHERE target = 'guarded_by_hand'::regclass;
SELECT idem_version_unguard('guarded_by_hand') AS unguarded;

-- A generated version column is computed after BEFORE triggers: the guard would read NULL as
-- the new version and skip every UPDATE, so it is refused when attached and when it fires.
CREATE TABLE computed (id int PRIMARY KEY, x int, version int GENERATED ALWAYS AS (x * 2) STORED);
INSERT INTO computed (id, x) VALUES (1, 1);
SELECT sqlstate_of($$SELECT idem_version_guard('computed')$$) AS guard_on_a_generated_column;
SELECT count(*) AS guards FROM idempotency.version_guards WHERE target = 'computed'::regclass;
CREATE TABLE recomputed (id int PRIMARY KEY, x int, version int);
INSERT INTO recomputed VALUES (1, 1, 1);
SELECT idem_version_guard('recomputed');
ALTER TABLE recomputed DROP COLUMN version;
ALTER TABLE recomputed ADD COLUMN version int GENERATED ALWAYS AS (x * 2) STORED;
SELECT sqlstate_of('UPDATE recomputed SET x = 5') AS update_under_a_generated_guard;
SELECT id, x, version FROM recomputed;

-- A partitioned table's guard reaches its partitions; a partition's own copy is PostgreSQL's
-- to manage, and it says so (42710, 2BP01).
CREATE TABLE ledger_parts (id int PRIMARY KEY, version int) PARTITION BY RANGE (id);
CREATE TABLE ledger_parts_low PARTITION OF ledger_parts FOR VALUES FROM (0) TO (100);
INSERT INTO ledger_parts VALUES (1, 5);
SELECT idem_version_guard('ledger_parts');
UPDATE ledger_parts SET version = 4 WHERE id = 1;
UPDATE ledger_parts SET version = 6 WHERE id = 1;
SELECT id, version FROM ledger_parts;
SELECT sqlstate_of($$SELECT idem_version_guard('ledger_parts_low', 'id')$$) AS guard_a_partition;
SELECT sqlstate_of($$SELECT idem_version_unguard('ledger_parts_low')$$) AS unguard_a_partition;
SELECT idem_version_unguard('ledger_parts') AS unguarded_the_parent;
-- A partition's own trigger under the guard's name would be replaced by the parent's guard.
CREATE TRIGGER idem_version_guard BEFORE UPDATE ON ledger_parts_low FOR EACH ROW EXECUTE FUNCTION audit_row();
SELECT sqlstate_of($$SELECT idem_version_guard('ledger_parts')$$) AS guard_over_a_partitions_trigger;
SELECT tgfoid::regproc AS partition_keeps FROM pg_trigger
WHERE tgrelid = 'ledger_parts_low'::regclass AND tgname = 'idem_version_guard';
DROP TRIGGER idem_version_guard ON ledger_parts_low;
SELECT count(*) AS guards_left FROM idempotency.version_guards
WHERE target IN ('ledger_parts'::regclass, 'ledger_parts_low'::regclass);

-- Unguarding needs no USAGE on schema idempotency: a table's owner may drop its own guard.
CREATE ROLE idem_table_owner;
CREATE SCHEMA owned AUTHORIZATION idem_table_owner;
SET ROLE idem_table_owner;
CREATE TABLE owned.rows (id int PRIMARY KEY, version int);
SELECT idem_version_unguard('owned.rows') AS unguarded_without_usage;
CREATE TRIGGER idem_version_guard BEFORE UPDATE ON owned.rows FOR EACH ROW EXECUTE FUNCTION pg_catalog.suppress_redundant_updates_trigger();
SELECT idem_version_unguard('owned.rows') AS left_its_own_trigger;
DROP TRIGGER idem_version_guard ON owned.rows;
RESET ROLE;
SELECT idem_version_guard('owned.rows');
SET ROLE idem_table_owner;
SELECT idem_version_unguard('owned.rows') AS unguarded_by_its_owner;
RESET ROLE;
DROP SCHEMA owned CASCADE;
DROP ROLE idem_table_owner;

DROP TABLE audited, guarded_by_hand, computed, recomputed, ledger_parts;
DROP FUNCTION audit_row();
