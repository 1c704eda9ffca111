-- The consumers' database, as the README's examples expect it (tests/readme_snippets.sh,
-- tests/failover.sh, tests/e2e/e2e.py): payments has an id column first, so an INSERT that
-- relies on column order fails.
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
CREATE TABLE payments (
  id bigserial PRIMARY KEY,
  order_id text NOT NULL,
  amount numeric(12,2) NOT NULL,
  paid_at timestamptz NOT NULL DEFAULT now()
);
-- Each insert sleeps payments.insert_delay seconds (a database setting, none by default), so
-- that a test can time a kill to land inside a payment's transaction.
CREATE FUNCTION slow_payment() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN PERFORM pg_sleep(coalesce(current_setting('payments.insert_delay', true), '0')::float8); RETURN NEW; END $$;
CREATE TRIGGER slow_payment BEFORE INSERT ON payments FOR EACH ROW EXECUTE FUNCTION slow_payment();
