-- Deterministic keys.  A key names the fact a message carries, so a replay or a backfill
-- that arrives with a new message id still finds its claim.  Never gen_random_uuid():
-- a random key differs on every delivery and dedup silently does nothing.

-- Business keys: parts joined by |, with \ and | escaped, so no two part lists collide.
SELECT idem_key('order', '42', 'paid') AS business_key;
SELECT idem_key('a|b', 'c') AS left_pipe, idem_key('a', 'b|c') AS right_pipe,
       idem_key('a|b', 'c') <> idem_key('a', 'b|c') AS distinct_keys;
SELECT idem_key('a\', 'b') AS trailing_backslash, idem_key('a', '\b') AS leading_backslash;
SELECT idem_key('a', '') AS empty_last_part, idem_key('a') AS single_part;
SELECT idem_key(VARIADIC ARRAY['order', '42']) AS from_an_array;

-- Splitter children: the same parent and position always give the same child key.
SELECT idem_child_key('order-42', 0) AS first_line, idem_child_key('order-42', 17) AS line_17;
SELECT idem_child_key(idem_child_key('batch-9', 3), 1) AS grandchild;

-- Keys from a payload, by dotted paths (digits index arrays), like Powertools'
-- event_key_jmespath: scalars give their text, objects and arrays their canonical JSON.
SELECT idem_key_from('{"order": {"id": 42}, "type": "paid"}', 'order.id', 'type') AS from_payload;
SELECT idem_key_from('{"items": [{"sku": "A-1"}, {"sku": "B|2"}]}', 'items.1.sku') AS array_index;
-- Only digits: '+1' is no index (0.5.0; before, it read element 1).
SELECT sqlstate_of($$SELECT idem_key_from('{"items": [10, 20]}', 'items.+1')$$) AS signed_index;
SELECT idem_key_from('{"amount": 10.50, "ok": true}', 'amount', 'ok') AS number_and_bool;
SELECT idem_key_from('{"ref": {"b": 1, "a": [1.0]}}', 'ref') AS canonical_object;
-- The same key however the JSON was written.
SELECT idem_key_from('{"type":"paid","order":{"id":42}}', 'order.id', 'type')
     = idem_key('42', 'paid') AS same_as_business_key;

-- Keys compose with claims: the payment of order 42 takes effect once, whether it comes
-- from the live channel, a DLQ replay with a new message id, or a manual backfill.
SELECT idem_claim(idem_key_from('{"msg_id": "m-1", "order": {"id": 42}, "type": "paid"}', 'order.id', 'type')) AS live,
       idem_claim(idem_key_from('{"msg_id": "m-9", "order": {"id": 42}, "type": "paid"}', 'order.id', 'type')) AS replay_with_new_id;

-- Keys and digests are part of the on-disk format: these values never change across
-- sessions or releases (a change would make every stored claim unreachable).
SELECT idem_digest('order-42:paid') AS digest_default_scope,
       idem_digest('order-42:paid', 'billing') AS digest_billing,
       idem_scope_id('default') AS default_scope_id;
-- The scope is length-prefixed inside the digest, so scope and key cannot trade bytes.
SELECT idem_digest('c', 'ab') <> idem_digest('bc', 'a') AS no_boundary_collision;

-- Key functions are IMMUTABLE, so a table can keep the key in a generated column.
CREATE TABLE events (payload jsonb, k text GENERATED ALWAYS AS (idem_key_from(payload, 'id')) STORED);
INSERT INTO events (payload) VALUES ('{"id": "e-1"}');
SELECT k FROM events;
