\set k random(1, 10000)
BEGIN;
SET LOCAL idempotency.diagnostics = off;
SELECT idem_claim('dup-' || :k);
COMMIT;
