-- Versioned writes refuse bad input with a clear message naming the column or table and a
-- documented SQLSTATE; the transaction and the table stay intact.
--   42703 unknown column          42P10 key matches no unique index / no primary key
--   22004 NULL version or key     22023 version missing, key column altered
--   42883 version type without ordering          42809 target is not a table

SELECT sqlstate_of($$SELECT idem_versioned_update('read_model', '{"id": 1}', '{"colour": "red", "version": 20}')$$);
SELECT sqlstate_of($$SELECT idem_versioned_update('read_model', '{"idx": 1}', '{"version": 20}')$$);
SELECT sqlstate_of($$SELECT idem_versioned_update('read_model', '{"status": "x"}', '{"version": 20}')$$);
SELECT sqlstate_of($$SELECT idem_versioned_update('stock', '{"warehouse": "north"}', '{"qty": 1, "version": 20}')$$);
SELECT sqlstate_of($$SELECT idem_versioned_update('read_model', '{}', '{"version": 20}')$$);
SELECT sqlstate_of($$SELECT idem_versioned_update('read_model', '{"id": 1}', '{"status": "no version"}')$$);
SELECT sqlstate_of($$SELECT idem_versioned_update('read_model', '{"id": 1}', '{"version": null}')$$);
SELECT sqlstate_of($$SELECT idem_versioned_update('read_model', '{"id": null}', '{"version": 20}')$$);
SELECT sqlstate_of($$SELECT idem_versioned_update('read_model', '{"id": 1}', '{"id": 2, "version": 20}')$$);
SELECT sqlstate_of($$SELECT idem_versioned_update('read_model', '{"id": 1}', '{"version": 20}', 'missing_column')$$);
SELECT sqlstate_of($$SELECT idem_versioned_update('read_model', '[1]', '{"version": 20}')$$);
SELECT sqlstate_of($$SELECT idem_versioned_update(NULL, '{"id": 1}', '{"version": 20}')$$);
SELECT sqlstate_of($$SELECT idem_versioned_update('read_model', '{"id": 1}', '{"version": "soon"}')$$);
SELECT sqlstate_of($$SELECT idem_versioned_upsert('read_model', '{"status": "no id", "version": 1}')$$);
SELECT sqlstate_of($$SELECT idem_versioned_upsert('stock', '{"warehouse": "w", "sku": "s", "qty": 1, "version": 1}')$$);
SELECT sqlstate_of($$SELECT idem_versioned_upsert('read_model', '{"id": 3, "status": "x"}')$$);

-- A version type without ordering.
CREATE TABLE unordered (id int PRIMARY KEY, version point);
INSERT INTO unordered VALUES (1, '(0,0)');
SELECT sqlstate_of($$SELECT idem_versioned_update('unordered', '{"id": 1}', '{"version": "(1,1)"}')$$);
SELECT sqlstate_of($$SELECT idem_version_guard('unordered')$$);

-- A JSON array nested deeper than an array column's 6 dimensions: 54000, as the
-- jsonb_populate_record the write stands for reports it.
CREATE TABLE arrays (id int PRIMARY KEY, version int, cells int[]);
INSERT INTO arrays VALUES (1, 1, NULL);
SELECT sqlstate_of($$SELECT idem_versioned_update('arrays', '{"id": 1}', '{"version": 2, "cells": [[[[[[[1]]]]]]]}')$$) AS seven_dimensions;
SELECT sqlstate_of($$SELECT (jsonb_populate_record(NULL::arrays, '{"cells": [[[[[[[1]]]]]]]}')).cells$$) AS seven_dimensions_by_hand;
SELECT idem_versioned_update('arrays', '{"id": 1}', '{"version": 2, "cells": [[[[[[1]]]]]]}') AS six_dimensions;
DROP TABLE arrays;

-- A view is not a target; neither is a sequence.
CREATE VIEW read_model_view AS SELECT * FROM read_model;
CREATE SEQUENCE some_sequence;
SELECT sqlstate_of($$SELECT idem_versioned_update('read_model_view', '{"id": 1}', '{"version": 20}')$$);
SELECT sqlstate_of($$SELECT idem_versioned_upsert('some_sequence', '{"version": 1}')$$);
SELECT sqlstate_of($$SELECT idem_version_guard('read_model_view')$$);

-- The same errors as a client sees them.
\set VERBOSITY default
SELECT idem_versioned_update('read_model', '{"status": "x"}', '{"version": 20}');
SELECT idem_versioned_update('read_model_view', '{"id": 1}', '{"version": 20}');

-- After all of that the table is intact, and a failed call inside a transaction is an
-- ordinary error: roll back (or to a savepoint) and carry on.
SELECT * FROM read_model ORDER BY id;
BEGIN;
SAVEPOINT s;
SELECT idem_versioned_update('read_model', '{"id": 1}', '{"colour": "red", "version": 20}');
ROLLBACK TO SAVEPOINT s;
SELECT idem_versioned_update('read_model', '{"id": 1}', '{"status": "after error", "version": 20}') AS still_usable;
COMMIT;

-- A read-only transaction refuses a versioned write, as it refuses the UPDATE; a temporary
-- table stays writable, as it does for the UPDATE.
BEGIN READ ONLY;
SELECT sqlstate_of($$SELECT idem_versioned_update('read_model', '{"id": 1}', '{"version": 50}')$$) AS read_only_update;
ROLLBACK;
CREATE TEMP TABLE scratch (id int PRIMARY KEY, version int);
INSERT INTO scratch VALUES (1, 1);
BEGIN READ ONLY;
SELECT idem_versioned_update('scratch', '{"id": 1}', '{"version": 2}') AS temp_table_in_read_only;
ROLLBACK;
