-- The ledger in time buckets (#13). A digest is random, so one ledger of N keys takes every
-- new claim into a random leaf of an index that grows with N: after each checkpoint that
-- leaf's first change writes a full page to WAL, and the purge deletes row by row. Once the
-- ledger holds idempotency.ledger_buckets_from claims (1,000,000 by default), the purge keeps
-- new claims in buckets: tables that inherit from the ledger, one per lane (retention) and
-- time range, each with its own small primary key, dropped whole once its claims expire.
-- The story runs in a database of its own, from a ledger without buckets.
\set SHOW_CONTEXT never
\set regress_db :DBNAME
CREATE DATABASE idem_buckets TEMPLATE template0 ENCODING 'UTF8';
\c idem_buckets
CREATE EXTENSION idempotency;
CREATE FUNCTION sqlstate_of(statement text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE statement;
  RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;
-- Which table of the ledger holds a key: the ledger itself, or a bucket of which lane.
CREATE FUNCTION held_in(key text, scope text DEFAULT 'default') RETURNS text LANGUAGE sql AS $$
  SELECT CASE WHEN l.tableoid = 'idempotency.ledger'::regclass THEN 'ledger'
              ELSE 'bucket of lane ' || COALESCE(b.lane::text, 'undeclared') END
  FROM idempotency.ledger AS l
  JOIN pg_class AS c ON c.oid = l.tableoid
  LEFT JOIN idempotency.ledger_buckets AS b ON b.bucket = c.relname
  WHERE l.key_digest = idem_digest(key, scope) $$;

SHOW idempotency.ledger_buckets_from;
SELECT idem_claim('before-buckets') AS claimed;
CALL idem_purge();
-- A small ledger stays one table: the purge made no bucket.
SELECT count(*) AS buckets FROM idempotency.ledger_buckets;

-- From the first purge on, at any size:
SET idempotency.ledger_buckets_from = 0;
SELECT (idem_declare_scope('orders', '4 days')).retention AS declared;
SELECT * FROM idempotency.maintain_ledger_buckets();
-- Each lane (a declared retention, or the undeclared scopes') has the current bucket and the
-- next two, an eighth of its retention wide (an hour to a week). A second run makes none.
SELECT lane, count(*) AS buckets, min(ends_at - starts_at) AS width,
       bool_or(starts_at <= now() AND now() < ends_at) AS has_current
FROM idempotency.ledger_buckets GROUP BY lane ORDER BY lane NULLS FIRST;
SELECT * FROM idempotency.maintain_ledger_buckets();

-- Claims go into the current bucket of their scope's lane; a key is a duplicate wherever it
-- is, the ledger itself included.
SELECT idem_claim('o-1', 'orders') AS first, idem_claim('o-1', 'orders') AS again,
       idem_claim('before-buckets') AS old_key, idem_claim('u-1') AS undeclared;
SELECT held_in('o-1', 'orders') AS "o-1", held_in('before-buckets') AS "before-buckets",
       held_in('u-1') AS "u-1";
-- The ledger is still the table to query, and replay and results read through it.
SELECT count(*) AS found FROM idempotency.ledger WHERE key_digest = idem_digest('o-1', 'orders');
BEGIN;
SELECT idem_claim('o-2', 'orders', '{"total": 5}') AS claimed;
SELECT idem_set_result('o-2', '{"receipt": 7}', 'orders');
COMMIT;
SELECT claimed, first_claimed_at IS NOT NULL AS has_time, result
FROM idem_claim_replay('o-2', 'orders', '{"total": 5}');
SELECT sqlstate_of($$SELECT idem_claim('o-2', 'orders', '{"total": 6}')$$) AS other_payload;
SELECT idem_claim_many(ARRAY['o-1', 'o-3', 'o-3', 'o-4'], 'orders') AS batch;
SELECT held_in('o-3', 'orders') AS "o-3";

-- The key's lock is held only from the search to the insert, not to the end of the
-- transaction: a batch does not fill the lock table.
BEGIN;
SELECT idem_claim_many(ARRAY['l-1', 'l-2', 'l-3']) AS batch;
SELECT count(*) AS key_locks_held FROM pg_locks
WHERE locktype = 'object' AND classid = 'idempotency.ledger'::regclass AND pid = pg_backend_pid();
COMMIT;

-- A scope redeclared with another retention claims into its new lane; its earlier keys are
-- still duplicates in the old one.
SELECT (idem_declare_scope('orders', '20 days')).retention AS redeclared;
SELECT * FROM idempotency.maintain_ledger_buckets();
SELECT idem_claim('o-1', 'orders') AS old_key, idem_claim('o-5', 'orders') AS new_key;
SELECT held_in('o-1', 'orders') AS "o-1", held_in('o-5', 'orders') AS "o-5";

-- Without direct writes (or under pgaudit's write logging, or pg_stat_statements tracking
-- all statements) the claim is the INSERT statement on the same bucket, under the same lock
-- and after the same search, run as the bucket's owner once the role's privileges on the
-- ledger are checked.
SET idempotency.direct_writes = off;
SELECT idem_claim('o-1', 'orders') AS old_key, idem_claim('o-6', 'orders') AS new_key;
SELECT held_in('o-6', 'orders') AS "o-6";
RESET idempotency.direct_writes;

-- While a trigger, a rule or a policy is on the ledger, a claim is the statement on the
-- ledger itself: they apply to statements on it, not on its buckets.
CREATE TABLE claim_audit (key_digest uuid);
CREATE FUNCTION audit_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO claim_audit VALUES (NEW.key_digest); RETURN NEW; END $$;
CREATE TRIGGER audit AFTER INSERT ON idempotency.ledger FOR EACH ROW EXECUTE FUNCTION audit_claim();
SELECT idem_claim('o-7', 'orders') AS claimed, idem_claim('o-3', 'orders') AS in_bucket;
SELECT held_in('o-7', 'orders') AS "o-7",
       (SELECT count(*) FROM claim_audit WHERE key_digest = idem_digest('o-7', 'orders')) AS audited;
DROP TRIGGER audit ON idempotency.ledger;

-- An application role with the README's GRANTs claims into buckets: the privileges checked
-- are the ledger's, as for the INSERT it stands for. Without INSERT it is refused, naming
-- the ledger; only a role that may purge may keep the buckets.
CREATE ROLE bucket_app;
CREATE ROLE bucket_reader;
GRANT USAGE ON SCHEMA idempotency TO bucket_app, bucket_reader;
GRANT SELECT, INSERT, UPDATE ON idempotency.ledger TO bucket_app;
GRANT SELECT ON idempotency.ledger TO bucket_reader;
SET ROLE bucket_app;
SELECT idem_claim('a-1', 'orders') AS claimed, idem_claim('o-1', 'orders') AS duplicate;
SELECT sqlstate_of($$SELECT * FROM idempotency.maintain_ledger_buckets()$$) AS maintain;
SET ROLE bucket_reader;
SELECT sqlstate_of($$SELECT idem_claim('r-1', 'orders')$$) AS claim;
RESET ROLE;
SELECT held_in('a-1', 'orders') AS "a-1";

-- A child of the ledger that holds rows but cannot be searched by key is refused, never
-- skipped. (An empty one holds nothing to find.)
CREATE TABLE idempotency.ledger_by_hand () INHERITS (idempotency.ledger);
SELECT sqlstate_of($$SELECT idem_claim('h-1', 'orders')$$) AS claim_while_empty;
INSERT INTO idempotency.ledger_by_hand (key_digest, scope_id) VALUES (idem_digest('h-0', 'orders'), idem_scope_id('orders'));
SELECT sqlstate_of($$SELECT idem_claim('h-2', 'orders')$$) AS claim;
DO $$ DECLARE hint text; BEGIN
  PERFORM idem_claim('h-2', 'orders');
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS hint = PG_EXCEPTION_HINT;
  RAISE NOTICE 'hint: %', hint;
END $$;
DROP TABLE idempotency.ledger_by_hand;
SELECT idem_claim('h-2', 'orders') AS claimed;

-- The purge drops a bucket once all its claims have expired: by its lane's retention, and by
-- the retention now of any scope whose retention changed since the bucket began. (Buckets
-- from the past stand in for time passing.)
CREATE FUNCTION old_bucket(name text, lane interval, age interval, key text, scope text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE format('CREATE TABLE idempotency.%I (PRIMARY KEY (key_digest)) INHERITS (idempotency.ledger)', name);
  INSERT INTO idempotency.ledger_buckets VALUES (name, lane, now() - age, now() - age + '1 day');
  EXECUTE format('INSERT INTO idempotency.%I (key_digest, scope_id, claimed_at) VALUES ($1, $2, $3)', name)
    USING idem_digest(key, scope), idem_scope_id(scope), now() - age;
  PERFORM idempotency.ledger_layout_changed();
END $$;
SELECT (idem_declare_scope('short', '2 days')).retention AS declared;
SELECT (idem_declare_scope('lengthened', '4 days')).retention AS declared;
-- Declared before the buckets below began: their claims have always had 3 and 5 days
-- (with a day's buffer).
UPDATE idempotency.retention_changes SET changed_at = now() - interval '30 days', seen_at = now() - interval '30 days';
SELECT old_bucket('ledger_past_short', '3 days', '10 days', 's-1', 'short');
SELECT old_bucket('ledger_past_lengthened', '5 days', '10 days', 'g-1', 'lengthened');
SELECT idem_claim('s-1', 'short') AS s_1, idem_claim('g-1', 'lengthened') AS g_1;
-- 'lengthened' now keeps its claims 20 days, those made in its old lane too. (So does every
-- scope of that lane until those buckets go: a lane's buckets are kept for the longest
-- retention any of their claims may have.)
SELECT (idem_declare_scope('lengthened', '20 days')).retention AS redeclared;
CALL idem_purge();
SELECT bucket FROM idempotency.ledger_buckets WHERE bucket LIKE 'ledger_past%' ORDER BY bucket;
SELECT to_regclass('idempotency.ledger_past_short') AS dropped_table;
-- The expired key is new again; the kept one is still a duplicate.
SELECT idem_claim('s-1', 'short') AS s_1, idem_claim('g-1', 'lengthened') AS g_1;

-- The purge counts a dropped bucket's claims as deleted, and moves the claims of the ledger
-- itself (made before buckets, or while a trigger kept them there) into their buckets.
SELECT deleted, moved FROM idempotency.purge_progress ORDER BY run_id DESC LIMIT 1;
SELECT held_in('before-buckets') AS "before-buckets", held_in('o-7', 'orders') AS "o-7",
       (SELECT count(*) FROM ONLY idempotency.ledger) AS left_in_ledger;

-- Once the ledger itself is empty, the purge seals every bucket that ended before every
-- transaction still running began: no claim can go into it any more, and a trigger keeps any
-- other new key out. A claim then asks a sealed bucket's filter (built from its keys, in each
-- session, the first time it needs it) before it searches it.
SELECT dropped_claims FROM idempotency.maintain_ledger_buckets();
SELECT bucket, sealed_at IS NOT NULL AS sealed FROM idempotency.ledger_buckets
WHERE bucket LIKE 'ledger_past%' ORDER BY bucket;
SELECT count(*) FILTER (WHERE sealed_at IS NOT NULL AND ends_at > now()) AS sealed_current_buckets
FROM idempotency.ledger_buckets;
SELECT idem_claim('g-1', 'lengthened') AS in_sealed, idem_claim('g-2', 'lengthened') AS new_key;
SELECT sqlstate_of($$INSERT INTO idempotency.ledger_past_lengthened (key_digest, scope_id)
                     VALUES (idem_digest('g-3', 'lengthened'), idem_scope_id('lengthened'))$$) AS by_hand;
-- A session whose transactions go unreported (track_activities off) could still be in one
-- that began in a bucket: nothing is sealed while one is connected.
SELECT old_bucket('ledger_past_quiet', '21 days', '12 days', 'q-1', 'lengthened');
SET track_activities = off;
SELECT dropped FROM idempotency.maintain_ledger_buckets();
RESET track_activities;
SELECT sealed_at IS NOT NULL AS sealed FROM idempotency.ledger_buckets WHERE bucket = 'ledger_past_quiet';
SELECT dropped FROM idempotency.maintain_ledger_buckets();
SELECT sealed_at IS NOT NULL AS sealed FROM idempotency.ledger_buckets WHERE bucket = 'ledger_past_quiet';
SELECT idem_claim('q-1', 'lengthened') AS q_1;

-- A claim of the ledger itself goes to the bucket of its scope's lane now and its time,
-- made in the past if need be; moved into a sealed bucket, it unseals it first.
INSERT INTO idempotency.ledger (key_digest, scope_id, claimed_at)
VALUES (idem_digest('g-4', 'lengthened'), idem_scope_id('lengthened'), now() - interval '10 days');
CALL idem_purge();
SELECT held_in('g-4', 'lengthened') AS "g-4";
SELECT dropped FROM idempotency.maintain_ledger_buckets();
SELECT b.sealed_at IS NOT NULL AS sealed
FROM idempotency.ledger AS l
JOIN pg_class AS c ON c.oid = l.tableoid JOIN idempotency.ledger_buckets AS b ON b.bucket = c.relname
WHERE l.key_digest = idem_digest('g-4', 'lengthened');
INSERT INTO idempotency.ledger (key_digest, scope_id, claimed_at)
VALUES (idem_digest('g-5', 'lengthened'), idem_scope_id('lengthened'), now() - interval '10 days');
CALL idem_purge();
SELECT b.sealed_at IS NOT NULL AS sealed, count(*) AS claims
FROM idempotency.ledger AS l
JOIN pg_class AS c ON c.oid = l.tableoid JOIN idempotency.ledger_buckets AS b ON b.bucket = c.relname
WHERE l.key_digest IN (idem_digest('g-4', 'lengthened'), idem_digest('g-5', 'lengthened'))
GROUP BY 1;
SELECT idem_claim('g-4', 'lengthened') AS g_4, idem_claim('g-5', 'lengthened') AS g_5;

-- Drops a lane's buckets, so that the stories after one that made them see none.
CREATE FUNCTION drop_lane(lane interval) RETURNS void LANGUAGE plpgsql AS $$
DECLARE b name;
BEGIN
  FOR b IN DELETE FROM idempotency.ledger_buckets AS x WHERE x.lane = drop_lane.lane RETURNING bucket LOOP
    EXECUTE format('DROP TABLE idempotency.%I', b);
  END LOOP;
  PERFORM idempotency.ledger_layout_changed();
END $$;
-- Buckets of a lane begin and end on whole seconds, whatever width each was made with (it
-- follows the number of claims held), so no two begin in the second their names spell. After
-- a bucket made by hand that ends within a second, the next one's name spells the
-- microseconds too. (At 100 M claims, widths in fractions of a second once gave two buckets
-- one name, and the purge failed with 42P07.)
CREATE TABLE idempotency.ledger_by_hand_odd (PRIMARY KEY (key_digest)) INHERITS (idempotency.ledger);
INSERT INTO idempotency.ledger_buckets
VALUES ('ledger_by_hand_odd', '9 days', '2026-01-01 00:00:00+00'::timestamptz - interval '1 hour',
        '2026-01-01 00:00:00.5+00');
SELECT bucket, created FROM idempotency.ledger_bucket_as_owner('9 days', '1 day', '2026-01-01 00:00:00.7+00');
DROP TABLE idempotency.ledger_by_hand_odd;
DELETE FROM idempotency.ledger_buckets WHERE bucket = 'ledger_by_hand_odd';
SELECT bucket, created FROM idempotency.ledger_bucket_as_owner('9 days', '1 day', '2026-01-01 00:00:00.2+00');
SELECT bucket, created FROM idempotency.ledger_bucket_as_owner('9 days', '1 day 12 seconds', '2026-01-01 03:00:01+00');
SELECT bucket, extract(epoch FROM ends_at - starts_at) AS seconds
FROM idempotency.ledger_buckets WHERE lane = '9 days' ORDER BY starts_at;
SELECT drop_lane('9 days');

-- Lanes that differ by a fraction of a second have names of their own: the name spells the
-- lane's microseconds where its seconds are not whole.
SELECT (idem_declare_scope('fraction-6', '7 days 0.6 seconds')).retention AS declared,
       (idem_declare_scope('fraction-7', '7 days 0.7 seconds')).retention AS declared;
SELECT created > 0 AS made FROM idempotency.maintain_ledger_buckets();
SELECT DISTINCT lane, substring(bucket FROM '^ledger_[^_]*') AS named
FROM idempotency.ledger_buckets WHERE lane > '8 days' AND lane < '8 days 1 second' ORDER BY lane;
SELECT idem_forget_scope('fraction-6'), idem_forget_scope('fraction-7');
SELECT drop_lane('8 days 0.6 seconds'), drop_lane('8 days 0.7 seconds');

-- A session keeps one filter for every sealed bucket, and asks it once per claim. A session
-- without memory for it searches each sealed bucket instead, with the same answers.
\c idem_buckets
SET idempotency.ledger_filter_memory = 0;
SELECT idem_claim('g-1', 'lengthened') AS g_1, idem_claim('g-4', 'lengthened') AS g_4,
       idem_claim('g-6', 'lengthened') AS g_6;
\c idem_buckets
SELECT idem_claim('g-1', 'lengthened') AS g_1, idem_claim('g-4', 'lengthened') AS g_4,
       idem_claim('g-6', 'lengthened') AS g_6, idem_claim('g-7', 'lengthened') AS g_7;

-- The filter is sized for the sealed buckets a session meets, with room for more; a bigger
-- bucket sealed later makes it grow, and the buckets it covered are read into it again: their
-- keys are still duplicates.
CREATE TABLE idempotency.ledger_past_big (PRIMARY KEY (key_digest)) INHERITS (idempotency.ledger);
INSERT INTO idempotency.ledger_buckets
VALUES ('ledger_past_big', '21 days', now() - interval '11 days', now() - interval '10 days');
INSERT INTO idempotency.ledger_past_big (key_digest, scope_id, claimed_at)
SELECT idem_digest('big-' || i, 'lengthened'), idem_scope_id('lengthened'), now() - interval '11 days'
FROM generate_series(1, 6000) AS i;
SELECT idempotency.ledger_layout_changed();
SELECT dropped FROM idempotency.maintain_ledger_buckets();
SELECT sealed_at IS NOT NULL AS sealed FROM idempotency.ledger_buckets WHERE bucket = 'ledger_past_big';
SELECT idem_claim('big-1', 'lengthened') AS big_1, idem_claim('big-6000', 'lengthened') AS big_6000,
       idem_claim('g-1', 'lengthened') AS g_1, idem_claim('g-4', 'lengthened') AS g_4,
       idem_claim('big-6001', 'lengthened') AS big_6001;
-- A session reads the filter from the buckets' indexes page by page, in their order on
-- disk: every key is in it, after updates that added index entries (not HOT) and split its
-- pages too.
SELECT pg_relation_size('idempotency.ledger_past_big_pkey') AS index_bytes \gset
UPDATE idempotency.ledger_past_big SET result = jsonb_build_object('note', repeat('x', 100));
SELECT pg_relation_size('idempotency.ledger_past_big_pkey') > :index_bytes AS index_grew;
\c idem_buckets
SELECT count(*) FILTER (WHERE idem_claim('big-' || i, 'lengthened')) AS new_among_6000
FROM generate_series(1, 6000) AS i;

-- A bucket dropped by hand takes its claims with it: they are new again. The next purge
-- forgets it, makes its time range a bucket again and moves the claims made meanwhile (into
-- the ledger itself, as no bucket was there for them) into it.
SELECT bucket AS current_bucket FROM idempotency.ledger_buckets
WHERE lane IS NULL AND starts_at <= now() AND now() < ends_at \gset
SELECT idem_claim('dropped-1') AS claimed;
DROP TABLE idempotency.:"current_bucket";
SELECT idem_claim('dropped-1') AS new_again, idem_claim('dropped-2') AS claimed;
SELECT held_in('dropped-1') AS "dropped-1";
CALL idem_purge();
SELECT held_in('dropped-1') AS "dropped-1", held_in('dropped-2') AS "dropped-2",
       (SELECT count(*) FROM idempotency.ledger_buckets
        WHERE lane IS NULL AND starts_at <= now() AND now() < ends_at) AS current_buckets;
SELECT idem_claim('dropped-2') AS duplicate, idem_claim('dropped-3') AS claimed, held_in('dropped-3') AS "dropped-3";

-- pg_dump keeps every bucket with its rows (tests/dump_restore.sh); the isolation specs
-- ledger_buckets and bucket_drop race claims across a bucket boundary and against a drop.
-- Buckets are made at run time, so they are not the extension's own (pg_dump would then
-- leave them out): DROP EXTENSION refuses while they stand, and CASCADE drops them too.
SELECT sqlstate_of('DROP EXTENSION idempotency') AS drop_extension;
SET client_min_messages = warning;
DROP EXTENSION idempotency CASCADE;
RESET client_min_messages;
SELECT count(*) AS tables_left FROM pg_tables WHERE schemaname = 'idempotency';
\c :regress_db
DROP DATABASE idem_buckets;
DROP ROLE bucket_app;
DROP ROLE bucket_reader;
