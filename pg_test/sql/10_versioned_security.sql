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
