-- Batch claims: a consumer that polls 500 messages claims them in one call and learns
-- which are new.  Element i answers for keys[i]; a key repeated inside the batch counts
-- once, at its first position.

SELECT idem_claim('poll-2');
SELECT idem_claim_many(ARRAY['poll-1', 'poll-2', 'poll-3', 'poll-1', 'poll-3']) AS new_keys;
SELECT idem_claim_many(ARRAY['poll-1', 'poll-4']) AS second_poll;

-- The typical use: process only the new ones, in one statement.
CREATE TABLE inbox (msg_key text, body text);
INSERT INTO inbox VALUES ('m-1', 'a'), ('m-2', 'b'), ('m-1', 'a again'), ('poll-1', 'old');
WITH batch AS (SELECT array_agg(msg_key ORDER BY ctid) AS keys FROM inbox),
     answers AS (SELECT k, is_new FROM batch,
                 unnest(batch.keys, idem_claim_many(batch.keys)) AS u(k, is_new))
SELECT k, is_new FROM answers;

-- Batches share the ledger with single claims and respect scopes.
SELECT idem_claim('m-1') AS single_after_batch,
       idem_claim_many(ARRAY['m-1', 'm-2'], 'replica') AS other_scope;

-- An empty batch claims nothing, and is refused where its INSERT of no rows would be: in a
-- read-only transaction, and for a role without the ledger's privileges.
SELECT idem_claim_many(ARRAY[]::text[]) AS empty;
BEGIN READ ONLY;
SELECT sqlstate_of($$SELECT idem_claim_many(ARRAY[]::text[])$$) AS empty_read_only;
ROLLBACK;
CREATE ROLE batch_outsider;
SET ROLE batch_outsider;
SELECT sqlstate_of($$SELECT idem_claim_many(ARRAY[]::text[])$$) AS empty_without_privileges;
RESET ROLE;
DROP ROLE batch_outsider;

-- A batch is one statement: if the transaction rolls back, none of its claims remain.
BEGIN;
SELECT idem_claim_many(ARRAY['b-1', 'b-2']);
ROLLBACK;
SELECT idem_claim_many(ARRAY['b-2', 'b-1']) AS after_rollback;
