-- What every benchmark run starts from (bench/run.sh, bench/instructions.sh): empty ledgers,
-- the two versioned-update tables refilled with the same 10000 rows at version 0, and both
-- offset tables with the same 1000 partitions at position 0, and the consumer run's 1000 accounts
-- at balance 0 with no payments, so
-- neither contender meets more stale versions or more dead tuples than the other; then a
-- fresh checkpoint. psql runs each statement on its own, as VACUUM needs.
TRUNCATE idempotency.ledger, hand_ledger, plpgsql_ledger, vm_hand, vm_ext, idempotency.outbox, hand_outbox, biz_ext, biz_hand,
         idempotency.watermarks, hand_offsets, idempotency.duplicates, consumer_payments, consumer_accounts;
INSERT INTO vm_hand (id, status, version) SELECT g, 's0', 0 FROM generate_series(1, 10000) AS g;
INSERT INTO vm_ext (id, status, version) SELECT g, 's0', 0 FROM generate_series(1, 10000) AS g;
INSERT INTO consumer_accounts (id, balance) SELECT g, 0 FROM generate_series(1, 1000) AS g;
INSERT INTO hand_offsets (stream, partition, position) SELECT 'orders', g, 0 FROM generate_series(0, 999) AS g;
INSERT INTO idempotency.watermarks (stream, partition, position) SELECT 'orders', g::text, 0 FROM generate_series(0, 999) AS g;
-- The keys whose claims the duplicate contenders repeat (bench/dup_diag_*.sql).
SELECT count(idem_claim('dup-' || g)) FROM generate_series(1, 10000) AS g;
VACUUM ANALYZE vm_hand, vm_ext, hand_offsets, idempotency.watermarks, idempotency.ledger;
CHECKPOINT;
