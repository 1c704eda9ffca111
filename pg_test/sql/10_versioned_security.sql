-- Versioned writes run with the caller's privileges, and row-level security applies:
-- they are a convenience, never a way around a GRANT or a policy.  Names are quoted and
-- values are parameters, so nothing in a key, a change or a name can inject SQL.

CREATE ROLE idem_reader;
CREATE ROLE idem_writer;
GRANT SELECT ON read_model TO idem_reader;
GRANT SELECT, UPDATE, INSERT ON read_model TO idem_writer;

SET ROLE idem_reader;
SELECT sqlstate_of($$SELECT idem_versioned_update('read_model', '{"id": 1}', '{"status": "x", "version": 99}')$$);
SELECT sqlstate_of($$SELECT idem_versioned_upsert('read_model', '{"id": 7, "status": "x", "version": 1}')$$);
RESET ROLE;

-- Row-level security: the writer may only touch rows whose id is even.
ALTER TABLE read_model ENABLE ROW LEVEL SECURITY;
CREATE POLICY even_rows ON read_model USING (id % 2 = 0) WITH CHECK (id % 2 = 0);
SET ROLE idem_writer;
SELECT idem_versioned_update('read_model', '{"id": 1}', '{"status": "odd: hidden", "version": 99}') AS odd_row,
       idem_versioned_update('read_model', '{"id": 2}', '{"status": "even: allowed", "version": 99}') AS even_row;
SELECT sqlstate_of($$SELECT idem_versioned_upsert('read_model', '{"id": 3, "status": "odd insert", "version": 1}')$$);
RESET ROLE;
ALTER TABLE read_model DISABLE ROW LEVEL SECURITY;
SELECT * FROM read_model ORDER BY id;

-- Hostile names: quotes, semicolons and comment markers in table and column names.
CREATE TABLE "we""ird; DROP TABLE read_model; --" (
  "id'; --" int PRIMARY KEY,
  "val"" = 1; --" text,
  "v/*" int
);
INSERT INTO "we""ird; DROP TABLE read_model; --" VALUES (1, 'a', 1);
SELECT idem_versioned_update('"we""ird; DROP TABLE read_model; --"',
                             '{"id''; --": 1}',
                             '{"val\" = 1; --": "b''); DROP TABLE read_model; --", "v/*": 2}',
                             'v/*') AS hostile_update,
       idem_versioned_upsert('"we""ird; DROP TABLE read_model; --"',
                             '{"id''; --": 2, "val\" = 1; --": "*/ c", "v/*": 1}', 'v/*') AS hostile_upsert;
SELECT * FROM "we""ird; DROP TABLE read_model; --" ORDER BY 1;
SELECT idem_version_guard('"we""ird; DROP TABLE read_model; --"', 'v/*');
UPDATE "we""ird; DROP TABLE read_model; --" SET "v/*" = 0;
SELECT * FROM "we""ird; DROP TABLE read_model; --" ORDER BY 1;
SELECT target, version_column FROM idempotency.version_guards;
SELECT count(*) AS read_model_still_there FROM read_model;

-- Column privileges count column by column, as for the UPDATE statement: the key and the
-- version must be readable, the changed columns writable.
CREATE ROLE idem_columns;
CREATE ROLE idem_blind;
GRANT SELECT (id, version), UPDATE (status, version) ON read_model TO idem_columns;
GRANT SELECT (id), UPDATE (status, version) ON read_model TO idem_blind;
SET ROLE idem_columns;
SELECT idem_versioned_update('read_model', '{"id": 2}', '{"status": "by column grant", "version": 120}') AS column_grants;
RESET ROLE;
SET ROLE idem_blind;
SELECT sqlstate_of($$SELECT idem_versioned_update('read_model', '{"id": 2}', '{"status": "blind", "version": 121}')$$) AS version_not_readable;
RESET ROLE;
SELECT id, status, version FROM read_model WHERE id = 2;

DROP OWNED BY idem_reader, idem_writer, idem_columns, idem_blind;
DROP ROLE idem_reader;
DROP ROLE idem_writer;
DROP ROLE idem_columns;
DROP ROLE idem_blind;

-- The guard is a trigger function that any role with USAGE on the schema can attach by hand
-- to a table of its own, with any timing, event and arguments. Each misuse is refused with
-- 39P01 before a tuple or an argument is read; a version column whose type lost its ordering
-- after the guard was installed is 42883. Before 0.5.0 each of these crashed the server.
CREATE ROLE idem_tenant;
GRANT USAGE ON SCHEMA idempotency TO idem_tenant;
GRANT CREATE ON SCHEMA public TO idem_tenant;
-- Attaches the guard to tenant_rows as `event` … FOR EACH `level` with `arguments`, runs
-- `statement`, and answers its SQLSTATE and message.
CREATE FUNCTION guard_attached(event text, level text, arguments text, statement text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  answer text;
BEGIN
  EXECUTE format('CREATE TRIGGER by_hand %s ON tenant_rows FOR EACH %s EXECUTE FUNCTION idempotency.version_guard(%s)',
                 event, level, arguments);
  answer := sqlstate_of(statement);
  DROP TRIGGER by_hand ON tenant_rows;
  RETURN answer;
END $$;
SET ROLE idem_tenant;
CREATE TABLE tenant_rows (id int PRIMARY KEY, v int);
INSERT INTO tenant_rows VALUES (1, 1);
SELECT attached, guard_attached(event, level, arguments, statement) AS answer
FROM (VALUES ('without an argument', 'BEFORE UPDATE', 'ROW', '', 'UPDATE tenant_rows SET v = 2'),
             ('with two arguments', 'BEFORE UPDATE', 'ROW', '''v'', ''id''', 'UPDATE tenant_rows SET v = 2'),
             ('before insert', 'BEFORE INSERT', 'ROW', '''v''', 'INSERT INTO tenant_rows VALUES (2, 1)'),
             ('for each statement', 'BEFORE UPDATE', 'STATEMENT', '''v''', 'UPDATE tenant_rows SET v = 2'),
             ('after update', 'AFTER UPDATE', 'ROW', '''v''', 'UPDATE tenant_rows SET v = 2'),
             ('after delete', 'AFTER DELETE', 'ROW', '''v''', 'DELETE FROM tenant_rows'),
             ('before truncate', 'BEFORE TRUNCATE', 'STATEMENT', '''v''', 'TRUNCATE tenant_rows'))
     AS misuse(attached, event, level, arguments, statement);
SELECT sqlstate_of('SELECT idempotency.version_guard()') AS called_directly;
SELECT idem_version_guard('tenant_rows', 'v');
ALTER TABLE tenant_rows ALTER COLUMN v TYPE point USING point(v, 0);
SELECT sqlstate_of('UPDATE tenant_rows SET v = point(5, 0)') AS version_without_ordering;
SELECT id, v FROM tenant_rows;
RESET ROLE;
DROP OWNED BY idem_tenant;
DROP ROLE idem_tenant;
DROP FUNCTION guard_attached(text, text, text, text);
