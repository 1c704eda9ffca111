INSERT INTO hand_ledger (scope, key) VALUES ('default', gen_random_uuid()::text) ON CONFLICT DO NOTHING RETURNING true;
