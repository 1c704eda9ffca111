-- Payload fingerprints: a claim may pass the message's payload.  Its canonical fingerprint
-- is stored, and a later claim of the same key with a different payload raises ID001
-- (the key was reused for another message) instead of silently dropping that message.

SELECT idem_claim('evt-1', 'default', '{"order": 42, "amount": 10.50}') AS first;

-- The same payload, however it is written: key order, whitespace, trailing zeros.
SELECT idem_claim('evt-1', 'default', '{ "amount" : 10.5,
                                         "order" : 42 }') AS same_payload_reformatted;

-- A duplicate without a payload is not checked.
SELECT idem_claim('evt-1') AS duplicate_without_payload;

-- Another payload under the same key: ID001, and the message is not lost silently.
SELECT sqlstate_of($$SELECT idem_claim('evt-1', 'default', '{"order": 42, "amount": 11}')$$);
SELECT sqlstate_of($$SELECT * FROM idem_claim_replay('evt-1', 'default', '{"order": 43, "amount": 10.5}')$$);

-- The fingerprint of a claim made without a payload is not checked later either.
SELECT idem_claim('evt-2') AS first_without_payload,
       idem_claim('evt-2', 'default', '{"any": "thing"}') AS later_with_payload;

-- idem_fingerprint shows the canonical form's digest: equal for equal JSON values ...
SELECT idem_fingerprint('{"a": 1, "b": [1.0, 2.50]}') = idem_fingerprint('{"b":[1,2.5],"a":1}') AS reordered_equal,
       idem_fingerprint('{"a": 1, "a": 2}') = idem_fingerprint('{"a": 2}') AS last_duplicate_key_wins,
       idem_fingerprint('{"n": -0.0}') = idem_fingerprint('{"n": 0}') AS negative_zero;
-- ... and different for anything else.
SELECT idem_fingerprint('{"a": 1}') = idem_fingerprint('{"a": "1"}') AS number_vs_string,
       idem_fingerprint('[1, 2]') = idem_fingerprint('[2, 1]') AS array_order,
       idem_fingerprint('{"a": null}') = idem_fingerprint('{}') AS null_vs_absent,
       idem_fingerprint('1.000000000000000000001') = idem_fingerprint('1') AS precision_kept;
-- It is stable across sessions and releases:
SELECT idem_fingerprint('{"order": 42, "amount": 10.5}');
