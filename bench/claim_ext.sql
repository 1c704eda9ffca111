SELECT idem_claim(gen_random_uuid()::text);
