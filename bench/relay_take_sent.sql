-- A relay's transaction (bench/soak.sh): take a batch, "publish" it, mark it sent. An empty
-- take still marks an empty array, so the statement sequence never depends on the outbox.
BEGIN;
SELECT coalesce(array_agg(id), '{}') AS ids FROM idem_outbox_take(50) \gset
SELECT idem_outbox_sent(:ids::uuid[]);
COMMIT;
