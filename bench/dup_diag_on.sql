\set k random(1, 10000)
BEGIN;
SET LOCAL idempotency.diagnostics = on;
SELECT idem_claim('dup-' || :k);
COMMIT;
