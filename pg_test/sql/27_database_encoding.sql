-- A database whose encoding is not UTF8. Keys, scopes and payloads are digested as UTF-8 text,
-- so that a key means the same in every database and after every restore; in another encoding
-- their bytes would mean something else. Every function refuses such a database with 0A000
-- before it reads an argument: none answers, none writes, none crashes the backend (an
-- unchecked byte 0xff in a SQL_ASCII database once did).
\set SHOW_CONTEXT never
\set regress_db :DBNAME
CREATE DATABASE idem_latin1 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0;
CREATE DATABASE idem_sql_ascii ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0;

\c idem_latin1
CREATE EXTENSION idempotency;
SELECT idem_claim('order-1');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_claim_many(ARRAY['order-1', 'order-2']);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_key('order', '1');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_declare_scope('payments', '1 day');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS ledger_rows FROM idempotency.ledger;

\c idem_sql_ascii
CREATE EXTENSION idempotency;
SELECT idem_key(E'\xff', 'a');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_claim_many(ARRAY[E'\xff']);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_claim(E'caf\xe9', 'default', '{"a": 1}');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS ledger_rows FROM idempotency.ledger;

\c :regress_db
DROP DATABASE idem_latin1;
DROP DATABASE idem_sql_ascii;
-- The same calls in this UTF8 database answer.
SELECT idem_key('order', '1') AS key, idem_claim('encoding-order-1') AS claimed;
DELETE FROM idempotency.ledger WHERE key_digest = idem_digest('encoding-order-1');
