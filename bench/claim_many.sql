SELECT idem_claim_many(ARRAY(SELECT gen_random_uuid()::text FROM generate_series(1,500)));
