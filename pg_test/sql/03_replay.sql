-- Result replay: the first delivery stores what it produced; every duplicate gets that
-- result and the time of the first claim from the same single call, and can answer the
-- sender exactly as the first time (Stripe's Idempotent-Replayed, Powertools' data).
-- claimed = false is the "this is a replay" flag.

BEGIN;
SELECT claimed, first_claimed_at = now() AS at_this_transaction, result
FROM idem_claim_replay('invoice-7:create');
-- ... the business change, then the answer the sender should get ...
SELECT idem_set_result('invoice-7:create', '{"invoice_id": 7, "status": "created"}');
COMMIT;

SELECT claimed, first_claimed_at < now() AS earlier, result
FROM idem_claim_replay('invoice-7:create');

-- A first delivery that stored no result replays NULL.
SELECT idem_claim('invoice-8:create');
SELECT claimed, result FROM idem_claim_replay('invoice-8:create');

-- The result is part of the transaction: rolled back, it is gone with the claim.
BEGIN;
SELECT claimed FROM idem_claim_replay('invoice-9:create');
SELECT idem_set_result('invoice-9:create', '{"invoice_id": 9}');
ROLLBACK;
SELECT claimed, result FROM idem_claim_replay('invoice-9:create');

-- Results are per scope, like claims.
SELECT claimed, result FROM idem_claim_replay('invoice-7:create', 'audit');
