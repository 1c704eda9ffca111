BEGIN;
SET LOCAL idempotency.diagnostics = off;
SELECT idem_claim(gen_random_uuid()::text);
COMMIT;
