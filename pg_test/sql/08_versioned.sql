-- Versioned writes: the most underrated idempotence.  A write lands only when its version
-- is newer than the stored one, so duplicates, out-of-order delivery and concurrent writers
-- settle on the newest state with no ledger at all.  false means "duplicate or stale", and
-- doing nothing is then right.

CREATE TABLE read_model (id int PRIMARY KEY, status text NOT NULL, version bigint NOT NULL);
INSERT INTO read_model VALUES (1, 'created', 1);

-- Out of order: versions 4, 2, 3 arrive; the row ends at 4.
SELECT idem_versioned_update('read_model', '{"id": 1}', '{"status": "shipped", "version": 4}') AS v4;
SELECT idem_versioned_update('read_model', '{"id": 1}', '{"status": "paid", "version": 2}') AS v2_stale;
SELECT idem_versioned_update('read_model', '{"id": 1}', '{"status": "packed", "version": 3}') AS v3_stale;
-- A duplicate of version 4 changes nothing either.
SELECT idem_versioned_update('read_model', '{"id": 1}', '{"status": "shipped", "version": 4}') AS v4_again;
SELECT * FROM read_model;

-- A missing row is not created: false.
SELECT idem_versioned_update('read_model', '{"id": 99}', '{"status": "x", "version": 1}') AS missing_row;

-- Values are coerced by PostgreSQL's own input rules, as jsonb_populate_record does:
-- a number as text, a version as a string.
SELECT idem_versioned_update('read_model', '{"id": "1"}', '{"status": "delivered", "version": "5"}') AS coerced;
SELECT * FROM read_model;

-- Composite keys: any unique index, in any key order.
CREATE TABLE stock (warehouse text, sku text, qty int NOT NULL, version numeric NOT NULL,
                    UNIQUE (warehouse, sku));
INSERT INTO stock VALUES ('north', 'A-1', 10, 1.5);
SELECT idem_versioned_update('stock', '{"sku": "A-1", "warehouse": "north"}', '{"qty": 7, "version": 1.75}') AS numeric_newer,
       idem_versioned_update('stock', '{"warehouse": "north", "sku": "A-1"}', '{"qty": 9, "version": 1.7}') AS numeric_older;
SELECT * FROM stock;

-- An event time as the version: timestamptz orders the writes.
CREATE TABLE sensor (id int PRIMARY KEY, reading numeric, observed_at timestamptz);
INSERT INTO sensor VALUES (1, 20.0, '2026-01-01 10:00+00');
SELECT idem_versioned_update('sensor', '{"id": 1}', '{"reading": 21.5, "observed_at": "2026-01-01 10:05+00"}', 'observed_at') AS later,
       idem_versioned_update('sensor', '{"id": 1}', '{"reading": 19.0, "observed_at": "2026-01-01 10:01+00"}', 'observed_at') AS earlier;
SELECT id, reading, observed_at AT TIME ZONE 'UTC' AS observed_utc FROM sensor;

-- A row whose stored version is NULL takes any version.
INSERT INTO sensor VALUES (2, 0, NULL);
SELECT idem_versioned_update('sensor', '{"id": 2}', '{"reading": 1, "observed_at": "2026-01-01 00:00+00"}', 'observed_at') AS from_null;

-- Upsert: insert when absent, update only when newer (INSERT … ON CONFLICT DO UPDATE … WHERE).
SELECT idem_versioned_upsert('read_model', '{"id": 2, "status": "created", "version": 1}') AS inserted,
       idem_versioned_upsert('read_model', '{"id": 2, "status": "created", "version": 1}') AS duplicate,
       idem_versioned_upsert('read_model', '{"id": 2, "status": "paid", "version": 3}') AS newer,
       idem_versioned_upsert('read_model', '{"id": 2, "status": "created", "version": 2}') AS older;
SELECT * FROM read_model ORDER BY id;

-- The declarative guard: from now on every UPDATE of the table, from any client or ORM,
-- is a no-op unless it makes the version newer.
SELECT idem_version_guard('read_model');
SELECT * FROM idempotency.version_guards;
UPDATE read_model SET status = 'newer write', version = 4 WHERE id = 2;     -- newer (4 > 3): lands
UPDATE read_model SET status = 'replayed write', version = 4 WHERE id = 2;  -- same version: skipped
UPDATE read_model SET status = 'no version bump' WHERE id = 2;              -- version unchanged: skipped
UPDATE read_model SET status = 'late write', version = 1 WHERE id = 2;      -- older: skipped
SELECT * FROM read_model WHERE id = 2;
-- Several rows in one statement: each row is judged on its own version.
UPDATE read_model SET status = 'bulk', version = 5;
SELECT * FROM read_model ORDER BY id;
-- Guarding twice leaves one guard; unguarding removes it and says whether there was one.
SELECT idem_version_guard('read_model');
SELECT count(*) AS guards FROM pg_trigger WHERE tgrelid = 'read_model'::regclass AND NOT tgisinternal;
SELECT idem_version_unguard('read_model') AS removed, idem_version_unguard('read_model') AS again;
UPDATE read_model SET status = 'unguarded', version = 0 WHERE id = 1;
SELECT * FROM read_model WHERE id = 1;
SELECT count(*) AS guarded_tables FROM idempotency.version_guards;

-- The statement is prepared once per (table, column set) and follows the table's changes:
-- renamed table, renamed column, added and dropped columns.
ALTER TABLE read_model RENAME TO orders_view;
SELECT idem_versioned_update('orders_view', '{"id": 1}', '{"status": "after rename", "version": 10}') AS after_table_rename;
ALTER TABLE orders_view RENAME COLUMN status TO state;
SELECT idem_versioned_update('orders_view', '{"id": 1}', '{"state": "after column rename", "version": 11}') AS after_column_rename;
ALTER TABLE orders_view ADD COLUMN note text;
SELECT idem_versioned_update('orders_view', '{"id": 1}', '{"state": "with note", "note": "n", "version": 12}') AS after_add;
ALTER TABLE orders_view DROP COLUMN note;
SELECT idem_versioned_update('orders_view', '{"id": 1}', '{"state": "note dropped", "version": 13}') AS after_drop;
SELECT * FROM orders_view WHERE id = 1;
ALTER TABLE orders_view RENAME TO read_model;
ALTER TABLE read_model RENAME COLUMN state TO status;
