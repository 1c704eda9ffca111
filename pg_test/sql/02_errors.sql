-- The error contract: bad input raises a documented SQLSTATE, never XX000, and never
-- turns into a silent NULL that a consumer would read as "processed".
--   22004 a required argument is NULL        22023 an argument can never be valid
--   ID001 key reused with another payload    ID002 key missing from the payload
--   ID003 result stored for an unclaimed key 55P03 no-wait claim met a claim in progress

SELECT sqlstate_of($$SELECT idem_claim(NULL)$$);
SELECT sqlstate_of($$SELECT idem_claim('')$$);
SELECT sqlstate_of($$SELECT idem_claim('k', NULL)$$);
SELECT sqlstate_of($$SELECT idem_claim('k', '')$$);
SELECT sqlstate_of($$SELECT idem_claim_nowait(NULL)$$);
SELECT sqlstate_of($$SELECT * FROM idem_claim_replay(NULL)$$);
SELECT sqlstate_of($$SELECT idem_claim_many(NULL)$$);
SELECT sqlstate_of($$SELECT idem_claim_many(ARRAY['a', NULL])$$);
SELECT sqlstate_of($$SELECT idem_claim_many(ARRAY['a', ''])$$);
SELECT sqlstate_of($$SELECT idem_claim_many(ARRAY['a'], NULL)$$);
SELECT sqlstate_of($$SELECT idem_set_result(NULL, '{}')$$);
SELECT sqlstate_of($$SELECT idem_set_result('never-claimed', NULL)$$);
SELECT sqlstate_of($$SELECT idem_set_result('never-claimed', '{}')$$);
SELECT sqlstate_of($$SELECT idem_key(NULL)$$);
SELECT sqlstate_of($$SELECT idem_key('a', NULL)$$);
SELECT sqlstate_of($$SELECT idem_key(VARIADIC ARRAY[]::text[])$$);
SELECT sqlstate_of($$SELECT idem_child_key(NULL, 1)$$);
SELECT sqlstate_of($$SELECT idem_child_key('m', NULL)$$);
SELECT sqlstate_of($$SELECT idem_child_key('m', -1)$$);
SELECT sqlstate_of($$SELECT idem_key_from(NULL, 'id')$$);
SELECT sqlstate_of($$SELECT idem_key_from('{"id": 1}', 'missing')$$);
SELECT sqlstate_of($$SELECT idem_key_from('{"id": null}', 'id')$$);
SELECT sqlstate_of($$SELECT idem_key_from('{"id": 1}', '')$$);
SELECT sqlstate_of($$SELECT idem_key_from('{"id": 1}', NULL)$$);
SELECT sqlstate_of($$SELECT idem_digest(NULL)$$);
SELECT sqlstate_of($$SELECT idem_scope_id('')$$);
SELECT sqlstate_of($$SELECT idem_fingerprint(NULL)$$);

-- A read-only transaction (and so a hot standby) refuses a claim, as it refuses the INSERT.
BEGIN READ ONLY;
SELECT sqlstate_of($$SELECT idem_claim('read-only-1')$$) AS read_only_claim;
SELECT sqlstate_of($$SELECT idem_claim_many(ARRAY['read-only-1'])$$) AS read_only_batch;
SELECT sqlstate_of($$SELECT idem_send('orders', '{}', key => 'read-only-1')$$) AS read_only_send;
SELECT sqlstate_of($$SELECT idem_watermark_advance('read-only', 'p0', 1)$$) AS read_only_watermark;
ROLLBACK;

-- The same errors reach a client with their hint; psql shows them like any driver would.
\set VERBOSITY default
SELECT idem_claim('');
SELECT idem_key_from('{"order": {}}', 'order.id');
