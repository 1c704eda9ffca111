SELECT plpgsql_claim(gen_random_uuid()::text);
