-- Every story in this suite starts from a plain CREATE EXTENSION, as a DBA would run it.
CREATE EXTENSION idempotency;

-- sqlstate_of runs a statement and shows the SQLSTATE and message of the error it raises,
-- so each story can state the exact error contract a client relies on.  Catching it from
-- PL/pgSQL also proves the code is catchable there, not only visible to drivers.
CREATE FUNCTION sqlstate_of(statement text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE statement;
  RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- A business table the consumers in these stories write to.
CREATE TABLE payments (order_id int PRIMARY KEY, amount numeric NOT NULL);
