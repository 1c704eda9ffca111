BEGIN;
SET LOCAL idempotency.diagnostics = on;
SELECT idem_claim(gen_random_uuid()::text);
COMMIT;
