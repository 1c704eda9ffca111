-- Watermarks: a consumer of an ordered stream (Kafka partitions, JetStream sequences, CDC
-- positions) keeps one row per partition, advanced in the same transaction as the effect.
-- A message at or below the watermark is a redelivery.
CREATE TABLE ledger_entries (account text, amount numeric, kafka_offset bigint);

-- The first message of partition 0 is new; applying it and advancing commit together.
BEGIN;
SELECT idem_watermark_advance('payments', 0, 41) AS new;
-- new: apply the message; false: a redelivery, so skip its effect (and still commit).
INSERT INTO ledger_entries (account, amount, kafka_offset) VALUES ('acct-1', 10, 41);
COMMIT;

-- The broker redelivers offset 41 (a rebalance before the consumer's offset commit), then an
-- older one: both are duplicates, so the handler skips its effect.
SELECT idem_watermark_advance('payments', 0, 41) AS redelivered, idem_watermark_advance('payments', 0, 7) AS older;

-- A rolled-back transaction leaves the watermark where it was, with its effect.
BEGIN;
SELECT idem_watermark_advance('payments', 0, 42) AS new;
INSERT INTO ledger_entries (account, amount, kafka_offset) VALUES ('acct-1', 99, 42);
ROLLBACK;
SELECT idem_watermark('payments', 0) AS resume_after, count(*) AS entries FROM ledger_entries;

-- Partitions are independent; a numbered partition and its decimal text are one partition,
-- whichever integer type the driver sends.
SELECT idem_watermark_advance('payments', 1, 5) AS p1,
       idem_watermark_advance('payments', '1', 5) AS p1_as_text,
       idem_watermark_advance('payments', 1::smallint, 6) AS p1_as_int2;
SELECT stream, partition, position FROM idempotency.watermarks ORDER BY stream, partition;

-- JetStream's sequences are unsigned 64-bit: numeric holds them all. A position with a zero
-- fraction is that whole number.
SELECT idem_watermark_advance('ORDERS', 'billing', 18446744073709551615) AS max_u64,
       idem_watermark_advance('ORDERS', 'billing', 18446744073709551615.000) AS same_again;
SELECT idem_watermark('ORDERS', 'billing');

-- A change-data-capture consumer advances by LSN and resumes from one.
SELECT idem_watermark_advance_lsn('cdc', 'slot_orders', '0/16B3748') AS new,
       idem_watermark_advance_lsn('cdc', 'slot_orders', '0/16B3740') AS older;
SELECT idem_watermark_lsn('cdc', 'slot_orders'), idem_watermark('cdc', 'slot_orders');
SELECT idem_watermark('cdc', 'never_advanced') IS NULL AS no_position_yet;

-- Bad positions and names are refused with 22023, missing ones with 22004; none is stored.
SELECT sqlstate_of($$SELECT idem_watermark_advance('payments', 0, 42.5)$$);
SELECT sqlstate_of($$SELECT idem_watermark_advance('payments', 0, -1)$$);
SELECT sqlstate_of($$SELECT idem_watermark_advance('payments', 0, 'NaN')$$);
SELECT sqlstate_of($$SELECT idem_watermark_advance('payments', 0, 'Infinity')$$);
SELECT sqlstate_of($$SELECT idem_watermark_advance('', 0, 1)$$);
SELECT sqlstate_of($$SELECT idem_watermark_advance('payments', NULL, 1)$$);
SELECT sqlstate_of($$SELECT idem_watermark_advance('payments', 0, NULL)$$);
SELECT sqlstate_of($$SELECT idem_watermark(NULL, '0')$$);
SELECT sqlstate_of($$SELECT idem_watermark_advance('payments', 0, '12abc')$$);
SELECT sqlstate_of($$SELECT idem_watermark_advance(repeat('s', 1025), 0, 1)$$);
SELECT sqlstate_of($$SELECT idem_watermark_advance('payments', repeat('p', 1025), 1)$$);
SELECT idem_watermark_advance(repeat('s', 1024), repeat('p', 1024), 1) AS longest_names;
SELECT idem_watermark('payments', 0) AS still;

-- Under REPEATABLE READ a watermark another transaction advanced after this one's snapshot
-- is a serialization failure, as the statement's would be (isolation spec watermark_races).

-- A role needs the table's privileges; nothing is granted to PUBLIC.
CREATE ROLE watermark_app NOLOGIN;
GRANT USAGE ON SCHEMA idempotency TO watermark_app;
SET ROLE watermark_app;
SELECT sqlstate_of($$SELECT idem_watermark_advance('payments', 0, 50)$$);
RESET ROLE;
GRANT SELECT, INSERT, UPDATE ON idempotency.watermarks TO watermark_app;
SET ROLE watermark_app;
SELECT idem_watermark_advance('payments', 0, 50) AS granted;
RESET ROLE;
DROP OWNED BY watermark_app;
DROP ROLE watermark_app;
DROP TABLE ledger_entries;
