-- How a table is built never changes what a versioned write does.  A plain table is
-- written directly (one index probe, one heap update, no SPI); a table with triggers,
-- foreign keys, generated columns, partitions, or columns that jsonb_populate_record builds
-- from JSON structure takes the generated UPDATE statement instead.  This story runs twice
-- in the suite, with idempotency.direct_writes on and off, against one expected output.

-- Every kind of value a JSON member can carry, into every common column type.
CREATE DOMAIN positive_qty AS int CHECK (VALUE > 0);
CREATE TABLE wide (
  id       int PRIMARY KEY,
  code     varchar(3),
  price    numeric(8,2),
  qty      positive_qty,
  active   boolean,
  seen_at  timestamptz,
  doc      jsonb,
  note     text,
  version  bigint NOT NULL CHECK (version < 1000)
);
INSERT INTO wide (id, version) VALUES (1, 0);
SELECT idem_versioned_update('wide', '{"id": 1}',
  '{"code": "abc", "price": 12.345, "qty": "7", "active": true, "seen_at": "2026-05-01 12:00+00",
    "doc": {"tags": ["a", "b"], "n": 1.50}, "note": {"k": [1, 2]}, "version": 1}') AS every_type;
SELECT id, code, price, qty, active, seen_at AT TIME ZONE 'UTC' AS seen_utc, doc, note, version FROM wide;
-- JSON null sets NULL, in a jsonb column too; a member left out keeps its value.
SELECT idem_versioned_update('wide', '{"id": 1}', '{"note": null, "doc": null, "version": 2}') AS nulls;
SELECT id, code, note IS NULL AS note_null, doc IS NULL AS doc_null, version FROM wide;

-- The errors are PostgreSQL's own, from the column types and constraints, with their codes.
SELECT sqlstate_of($$SELECT idem_versioned_update('wide', '{"id": 1}', '{"code": "abcd", "version": 3}')$$) AS too_long;
SELECT sqlstate_of($$SELECT idem_versioned_update('wide', '{"id": 1}', '{"qty": 0, "version": 3}')$$) AS domain_check;
SELECT sqlstate_of($$SELECT idem_versioned_update('wide', '{"id": 1}', '{"active": "perhaps", "version": 3}')$$) AS bad_boolean;
SELECT sqlstate_of($$SELECT idem_versioned_update('wide', '{"id": 1}', '{"version": 1000}')$$) AS check_constraint;
SELECT sqlstate_of($$SELECT idem_versioned_update('wide', '{"id": 1}', '{"version": 1.5}')$$) AS fractional_version;
SELECT sqlstate_of($$SELECT idem_versioned_update('wide', '{"id": "one"}', '{"version": 3}')$$) AS bad_key;
-- As a client sees it: the failing row, as for the UPDATE statement.
SELECT idem_versioned_update('wide', '{"id": 1}', '{"version": null}');
SELECT idem_versioned_update('read_model', '{"id": 1}', '{"status": null, "version": 300}');
SELECT id, code, qty, version FROM wide;

-- A unique column changed to a taken value is a unique violation, as in SQL.
CREATE TABLE accounts (id int PRIMARY KEY, email text UNIQUE, version int NOT NULL);
INSERT INTO accounts VALUES (1, 'a@example.com', 1), (2, 'b@example.com', 1);
SELECT sqlstate_of($$SELECT idem_versioned_update('accounts', '{"id": 2}', '{"email": "a@example.com", "version": 2}')$$) AS taken;
-- The row can also be found by that other unique key.
SELECT idem_versioned_update('accounts', '{"email": "b@example.com"}', '{"version": 2}') AS by_email;
-- A changed indexed column gets its new index entry: the row is then found by that value.
SELECT idem_versioned_update('accounts', '{"id": 1}', '{"email": "c@example.com", "version": 2}') AS moved;
SELECT idem_versioned_update('accounts', '{"email": "c@example.com"}', '{"version": 3}') AS by_new_email;
SELECT idem_versioned_update('accounts', '{"email": "a@example.com"}', '{"version": 4}') AS by_old_email;
SELECT * FROM accounts ORDER BY id;

-- A column dropped and one added with a default: the row keeps both right.
ALTER TABLE accounts DROP COLUMN email;
ALTER TABLE accounts ADD COLUMN tier text NOT NULL DEFAULT 'basic';
SELECT idem_versioned_update('accounts', '{"id": 1}', '{"version": 4}') AS after_alter;
SELECT * FROM accounts ORDER BY id;

-- Tables that keep the statement, with the same results.
-- Foreign keys: the referencing side is checked, the referenced side is protected.
CREATE TABLE customers (id int PRIMARY KEY, name text, version int);
CREATE TABLE orders (id int PRIMARY KEY, customer int REFERENCES customers, version int);
INSERT INTO customers VALUES (1, 'Ada', 1), (2, 'Bob', 1);
INSERT INTO orders VALUES (10, 1, 1);
SELECT idem_versioned_update('orders', '{"id": 10}', '{"customer": 2, "version": 2}') AS fk_ok;
SELECT sqlstate_of($$SELECT idem_versioned_update('orders', '{"id": 10}', '{"customer": 3, "version": 3}')$$) AS fk_violation;
SELECT idem_versioned_update('customers', '{"id": 2}', '{"name": "Bo", "version": 2}') AS referenced_side;
SELECT * FROM customers ORDER BY id;
-- A generated column is computed.
CREATE TABLE lines (id int PRIMARY KEY, qty int, price numeric, total numeric GENERATED ALWAYS AS (qty * price) STORED, version int);
INSERT INTO lines (id, qty, price, version) VALUES (1, 1, 2.5, 1);
SELECT idem_versioned_update('lines', '{"id": 1}', '{"qty": 4, "version": 2}') AS generated;
SELECT * FROM lines;
-- A partitioned table routes the row.
CREATE TABLE tenant_events (tenant int, id int, state text, version int, PRIMARY KEY (tenant, id)) PARTITION BY LIST (tenant);
CREATE TABLE tenant_events_1 PARTITION OF tenant_events FOR VALUES IN (1);
CREATE TABLE tenant_events_2 PARTITION OF tenant_events FOR VALUES IN (2);
INSERT INTO tenant_events VALUES (1, 1, 'new', 1), (2, 1, 'new', 1);
SELECT idem_versioned_update('tenant_events', '{"tenant": 2, "id": 1}', '{"state": "done", "version": 2}') AS partitioned,
       idem_versioned_update('tenant_events', '{"tenant": 2, "id": 1}', '{"state": "stale", "version": 1}') AS partitioned_stale;
SELECT * FROM tenant_events ORDER BY tenant, id;
-- A table with inheritance children: the row may live in a child, as for UPDATE.
CREATE TABLE shipments (id int, state text, version int);
CREATE TABLE shipments_archive () INHERITS (shipments);
CREATE UNIQUE INDEX shipments_id ON shipments (id);
INSERT INTO shipments_archive VALUES (7, 'archived', 1);
SELECT idem_versioned_update('shipments', '{"id": 7}', '{"state": "restored", "version": 2}') AS in_child;
SELECT tableoid::regclass, * FROM shipments;
-- Arrays, composites and json are built from JSON structure, as jsonb_populate_record does.
CREATE TYPE money_amount AS (currency text, cents int);
CREATE TABLE invoices (id int PRIMARY KEY, lines text[], amount money_amount, raw json, version int);
INSERT INTO invoices VALUES (1, NULL, NULL, NULL, 1);
SELECT idem_versioned_update('invoices', '{"id": 1}',
  '{"lines": ["a", "b"], "amount": {"currency": "EUR", "cents": 995}, "raw": {"x": 1}, "version": 2}') AS structured;
SELECT id, lines, amount, raw::text, version FROM invoices;

-- A table published for logical replication without a replica identity cannot take
-- UPDATEs at all, from a statement or from here.
CREATE TABLE unidentified (id int, version int);
CREATE UNIQUE INDEX unidentified_id ON unidentified (id);
INSERT INTO unidentified VALUES (1, 1);
SET client_min_messages = error;  -- the cluster's wal_level does not matter here
CREATE PUBLICATION everything_updates FOR TABLE unidentified;
RESET client_min_messages;
SELECT sqlstate_of($$SELECT idem_versioned_update('unidentified', '{"id": 1}', '{"version": 2}')$$) AS published;
DROP PUBLICATION everything_updates;
SELECT idem_versioned_update('unidentified', '{"id": 1}', '{"version": 2}') AS unpublished;

-- One statement may bring several versions of a row: each call sees the ones before it.
CREATE TABLE feed (id int PRIMARY KEY, status text, version int);
INSERT INTO feed VALUES (1, 'created', 0);
SELECT v, idem_versioned_update('feed', '{"id": 1}', jsonb_build_object('status', 'v' || v, 'version', v)) AS landed
FROM (VALUES (3), (1), (5), (4), (5)) AS deliveries(v);
SELECT * FROM feed;
