-- What a DBA's monitoring sees of a versioned write is what it sees of the UPDATE it stands
-- for: the same calls in pg_stat_user_functions, and the same notices with the same CONTEXT,
-- whether the write went in directly or through its statement (the suite runs both ways).

-- A version type ordered by functions of the DBA's own: points, by their x.
CREATE FUNCTION mon_cmp(point, point) RETURNS int LANGUAGE sql IMMUTABLE
  AS 'SELECT CASE WHEN $1[0] < $2[0] THEN -1 WHEN $1[0] > $2[0] THEN 1 ELSE 0 END';
-- In PL/pgSQL, which is never inlined, so that the executor calls it and counts the call.
CREATE FUNCTION mon_lt(point, point) RETURNS bool LANGUAGE plpgsql IMMUTABLE AS 'BEGIN RETURN $1[0] < $2[0]; END';
CREATE FUNCTION mon_le(point, point) RETURNS bool LANGUAGE sql IMMUTABLE AS 'SELECT $1[0] <= $2[0]';
CREATE FUNCTION mon_eq(point, point) RETURNS bool LANGUAGE sql IMMUTABLE AS 'SELECT $1[0] = $2[0]';
CREATE FUNCTION mon_ge(point, point) RETURNS bool LANGUAGE sql IMMUTABLE AS 'SELECT $1[0] >= $2[0]';
CREATE FUNCTION mon_gt(point, point) RETURNS bool LANGUAGE sql IMMUTABLE AS 'SELECT $1[0] > $2[0]';
CREATE OPERATOR <<< (LEFTARG = point, RIGHTARG = point, FUNCTION = mon_lt);
CREATE OPERATOR <<= (LEFTARG = point, RIGHTARG = point, FUNCTION = mon_le);
CREATE OPERATOR === (LEFTARG = point, RIGHTARG = point, FUNCTION = mon_eq);
CREATE OPERATOR >>= (LEFTARG = point, RIGHTARG = point, FUNCTION = mon_ge);
CREATE OPERATOR >>> (LEFTARG = point, RIGHTARG = point, FUNCTION = mon_gt);
CREATE OPERATOR CLASS mon_ops DEFAULT FOR TYPE point USING btree AS
  OPERATOR 1 <<<, OPERATOR 2 <<=, OPERATOR 3 ===, OPERATOR 4 >>=, OPERATOR 5 >>>, FUNCTION 1 mon_cmp(point, point);
CREATE TABLE readings (id int PRIMARY KEY, note text, version point);
INSERT INTO readings VALUES (1, 'first', '(1,0)');

-- With track_functions = pl (or all), the executor counts each call of the version's `<`: one
-- per write, newer or stale, for the extension as for the hand-written UPDATE's WHERE. (One
-- transaction: a backend reports its counts only between transactions.)
BEGIN;
SET LOCAL track_functions = 'pl';
SELECT idem_versioned_update('readings', '{"id": 1}', '{"note": "second", "version": "(2,0)"}') AS newer,
       idem_versioned_update('readings', '{"id": 1}', '{"note": "stale", "version": "(0,9)"}') AS stale;
SELECT funcname, calls AS after_the_extension FROM pg_stat_xact_user_functions WHERE funcname LIKE 'mon%';
UPDATE readings SET note = 'third', version = '(3,0)' WHERE id = 1 AND (version IS NULL OR version <<< '(3,0)');
UPDATE readings SET note = 'stale', version = '(0,9)' WHERE id = 1 AND (version IS NULL OR version <<< '(0,9)');
SELECT funcname, calls AS after_the_updates FROM pg_stat_xact_user_functions WHERE funcname LIKE 'mon%';
ROLLBACK;

-- A NOTICE raised by a trigger (a table with triggers always takes the statement) or by a
-- CHECK's function names that function as its context, as the hand-written UPDATE's does, and
-- not the extension's statement.
CREATE FUNCTION mon_announce() RETURNS trigger LANGUAGE plpgsql AS
  $$BEGIN RAISE NOTICE 'reading % becomes %', OLD.note, NEW.note; RETURN NEW; END$$;
CREATE TRIGGER announce BEFORE UPDATE ON readings FOR EACH ROW EXECUTE FUNCTION mon_announce();
CREATE FUNCTION mon_plausible(text) RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS
  $$BEGIN RAISE NOTICE 'checking %', $1; RETURN true; END$$;
CREATE TABLE gauges (id int PRIMARY KEY, note text CHECK (mon_plausible(note)), version int);
INSERT INTO gauges VALUES (1, 'first', 1);
\set SHOW_CONTEXT always
SELECT idem_versioned_update('readings', '{"id": 1}', '{"note": "by trigger", "version": "(5,0)"}') AS updated;
UPDATE readings SET note = 'by hand', version = '(6,0)' WHERE id = 1 AND (version IS NULL OR version <<< '(6,0)');
SELECT idem_versioned_update('gauges', '{"id": 1}', '{"note": "checked", "version": 2}') AS updated;
UPDATE gauges SET note = 'by hand', version = 3 WHERE id = 1 AND (version IS NULL OR version < 3);
\set SHOW_CONTEXT errors
DROP TABLE gauges;
DROP FUNCTION mon_plausible(text);
DROP TABLE readings;
DROP FUNCTION mon_announce();
DROP OPERATOR CLASS mon_ops USING btree;
DROP OPERATOR FAMILY mon_ops USING btree;
DROP OPERATOR <<< (point, point), <<= (point, point), === (point, point), >>= (point, point), >>> (point, point);
DROP FUNCTION mon_cmp, mon_lt, mon_le, mon_eq, mon_ge, mon_gt;
