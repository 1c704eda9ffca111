-- Key parts of any type (0.2.0). Drivers send numbers as numbers: psycopg sends a Python int
-- as an integer, so idem_key('payment', order_id) must not need a cast. Each type's text in
-- a key is a compatibility promise, fixed whatever the session's settings, so idem_key stays
-- IMMUTABLE and an index or generated column built on it never changes.

-- Settings that change how values print must not change a key.
SET TimeZone = 'Pacific/Chatham';
SET DateStyle = 'SQL, DMY';
SET extra_float_digits = 3;

-- Integers in decimal whatever their width, and the same key as the text '42'.
SELECT idem_key('payment', 42::int2) AS int2, idem_key('payment', 42) AS int4,
       idem_key('payment', 42::int8) AS int8, idem_key('payment', 42::numeric) AS numeric,
       idem_key('payment', '42') AS text;
SELECT idem_key('payment', 42) = idem_key('payment', '42') AS int_equals_text,
       idem_key(-9223372036854775808) AS int8_min;

-- numeric normalized: no trailing zeros after the point.
SELECT idem_key(42.0) AS "42.0", idem_key(42.50::numeric(10,3)) AS "42.500", idem_key(-0.00) AS "-0.00",
       idem_key(1e20) AS "1e20", idem_key(0.000100) AS "0.000100";
SELECT idem_key('NaN'::numeric) AS nan, idem_key('Infinity'::numeric) AS inf, idem_key('-Infinity'::numeric) AS neg_inf;

-- uuid in lowercase canonical form, however it was written.
SELECT idem_key('A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'::uuid) AS upper,
       idem_key('{a0eebc999c0b4ef8bb6d6bb9bd380a11}'::uuid) AS braces;

-- timestamptz in UTC, ISO 8601 with microseconds, whatever TimeZone and DateStyle say.
SELECT idem_key('2024-01-02 03:04:05+02'::timestamptz) AS whole_second,
       idem_key('2024-01-02 03:04:05.123456789+00'::timestamptz) AS rounded_to_micro;
SELECT idem_key('infinity'::timestamptz) AS inf, idem_key('-infinity'::timestamptz) AS neg_inf,
       idem_key('4713-01-01 00:00:00+00 BC'::timestamptz) AS earliest,
       idem_key('0001-01-01 00:00:00+00'::timestamptz) AS year_1,
       idem_key('10000-01-01 00:00:00+00'::timestamptz) AS year_10000;
RESET TimeZone;
SELECT idem_key('2024-01-02 03:04:05+02'::timestamptz) = idem_key('2024-01-02 01:04:05+00'::timestamptz) AS same_instant;

-- boolean as true or false.
SELECT idem_key(true, false) AS booleans, idem_key('yes'::boolean) AS from_yes;

-- text unchanged: keys made under 0.1.0 from text parts are made alike, and char(n) loses
-- its padding as its cast to text does.
SELECT idem_key('a|b', 'c'::varchar, 'pad  '::char(6), 'n'::name, 7) AS text_like;
SELECT idem_key('order', 42, 'paid') = idem_key(VARIADIC ARRAY['order', '42', 'paid']) AS as_in_0_1_0;
-- "char" as its cast to text writes it, whichever form of idem_key the other parts select:
-- beside text parts PostgreSQL picks the text[] form through that implicit cast.
SELECT idem_key(7, 'a'::"char", E'\\351'::"char", ''::"char") AS char_parts,
       idem_key('7', 'a'::"char", E'\\351'::"char", ''::"char") AS char_beside_text;

-- A domain counts as its base type.
CREATE DOMAIN order_id AS int8 CHECK (VALUE > 0);
SELECT idem_key('payment', 42::order_id) AS domain_over_int8;
DROP DOMAIN order_id;

-- An array passed whole with VARIADIC.
SELECT idem_key(VARIADIC ARRAY[1, 2, 3]) AS int_array, idem_key(VARIADIC ARRAY[true]) AS bool_array;

-- Any other type has no fixed text (a float's depends on extra_float_digits, a date's on
-- DateStyle): 42804, with a hint to cast it. A NULL part is 22004, as for text parts.
SELECT sqlstate_of($$SELECT idem_key('x', 1.5::float8)$$);
SELECT sqlstate_of($$SELECT idem_key('x', current_date)$$);
SELECT sqlstate_of($$SELECT idem_key('x', '{"a": 1}'::jsonb)$$);
SELECT sqlstate_of($$SELECT idem_key('x', NULL::int)$$);
SELECT sqlstate_of($$SELECT idem_key(VARIADIC NULL::int[])$$);
SELECT sqlstate_of($$SELECT idem_key(VARIADIC ARRAY[1, NULL])$$);

-- The same key from a prepared statement, whichever integer type the driver bound.
PREPARE by_int8(int8) AS SELECT idem_key('payment', $1);
PREPARE by_numeric(numeric) AS SELECT idem_key('payment', $1);
EXECUTE by_int8(42);
EXECUTE by_numeric(42.000);
DEALLOCATE by_int8;
DEALLOCATE by_numeric;

-- Immutable, so it can define an index or a generated column.
SELECT provolatile, proparallel FROM pg_proc WHERE oid = 'idem_key("any")'::regprocedure;
CREATE TABLE keyed_payments (order_id int8, key text GENERATED ALWAYS AS (idem_key('payment', order_id)) STORED);
INSERT INTO keyed_payments (order_id) VALUES (42);
SELECT key, key = idem_key('payment', '42') AS same_as_text FROM keyed_payments;
DROP TABLE keyed_payments;
