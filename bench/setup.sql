-- Schema for the benchmark database idem_bench (run by bench/run.sh after CREATE EXTENSION).

-- "hand": what an application would write without the extension.
CREATE TABLE hand_ledger (
    scope      text        NOT NULL,
    key        text        NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key)
);

-- "plpgsql": the same claim wrapped in a PL/pgSQL function, over its own identical table.
CREATE TABLE plpgsql_ledger (
    scope      text        NOT NULL,
    key        text        NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key)
);

CREATE FUNCTION plpgsql_claim(k text, s text DEFAULT 'default') RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO plpgsql_ledger (scope, key) VALUES (s, k) ON CONFLICT DO NOTHING;
    RETURN FOUND;
END
$$;
