-- The consumers' database, as the README's examples expect it (tests/readme_snippets.sh,
-- tests/failover.sh): payments has an id column first, so an INSERT that relies on column
-- order fails.
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
CREATE TABLE payments (
  id bigserial PRIMARY KEY,
  order_id text NOT NULL,
  amount numeric(12,2) NOT NULL,
  paid_at timestamptz NOT NULL DEFAULT now()
);
