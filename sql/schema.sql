-- The ledger: one row per claimed (scope, key), written in the claimer's transaction.
--
-- Row layout is chosen for bytes per retained key: a 128-bit digest of (scope, key) is the
-- only indexed column, so a 1 MB key costs the same as a 36-character one and btree's
-- row-size limit never applies. Column order keeps every fixed-width column aligned
-- without padding: 16 + 8 + 8 bytes of data after the tuple header.
CREATE SCHEMA idempotency;
COMMENT ON SCHEMA idempotency IS 'Storage of the idempotency extension: the ledger of claimed keys';

CREATE TABLE idempotency.ledger (
    key_digest  pg_catalog.uuid        NOT NULL,
    scope_id    pg_catalog.int8        NOT NULL,
    claimed_at  pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    fingerprint pg_catalog.uuid,
    result      pg_catalog.jsonb,
    CONSTRAINT ledger_pkey PRIMARY KEY (key_digest)
);
COMMENT ON TABLE idempotency.ledger IS
  'One row per claimed (scope, key). key_digest = idem_digest(key, scope); scope_id = idem_scope_id(scope).';
COMMENT ON COLUMN idempotency.ledger.key_digest IS 'First 128 bits of SHA-256 over the scope and the key bytes';
COMMENT ON COLUMN idempotency.ledger.scope_id IS 'First 64 bits of SHA-256 over the scope name';
COMMENT ON COLUMN idempotency.ledger.claimed_at IS 'Start of the transaction that made the first claim';
COMMENT ON COLUMN idempotency.ledger.fingerprint IS 'Canonical fingerprint of the payload passed with the first claim, if any';
COMMENT ON COLUMN idempotency.ledger.result IS 'Result stored by the first delivery with idem_set_result, replayed to duplicates';

-- pg_dump must keep every processed key, or a restore would process them all again.
SELECT pg_catalog.pg_extension_config_dump('idempotency.ledger', '');

-- Nothing is granted to PUBLIC: an application role needs the GRANTs shown in the README.
REVOKE ALL ON SCHEMA idempotency FROM PUBLIC;
REVOKE ALL ON TABLE idempotency.ledger FROM PUBLIC;

-- Declared scopes: how long each scope's claims must be kept. A claim has to outlive every
-- way its message can come back, so retention is the sum of the broker's retention, the
-- DLQ's retention, the window in which people replay messages by hand, and a buffer.
CREATE TABLE idempotency.scopes (
    scope            pg_catalog.text     PRIMARY KEY,
    scope_id         pg_catalog.int8     NOT NULL UNIQUE,
    broker_retention pg_catalog.interval NOT NULL,
    dlq_retention    pg_catalog.interval NOT NULL,
    replay_window    pg_catalog.interval NOT NULL,
    buffer           pg_catalog.interval NOT NULL,
    retention        pg_catalog.interval NOT NULL
        GENERATED ALWAYS AS (broker_retention + dlq_retention + replay_window + buffer) STORED,
    late_replay      pg_catalog.text     NOT NULL CHECK (late_replay IN ('error', 'warn')),
    declared_at      pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE idempotency.scopes IS
  'Declared scopes (idem_declare_scope): retention = broker + DLQ retention + replay window + buffer.';
SELECT pg_catalog.pg_extension_config_dump('idempotency.scopes', '');
REVOKE ALL ON TABLE idempotency.scopes FROM PUBLIC;

-- One row per purge run, updated and committed after every batch, so a running purge's
-- progress can be watched from any session.
CREATE TABLE idempotency.purge_runs (
    run_id      pg_catalog.int8 GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pid         pg_catalog.int4 NOT NULL DEFAULT pg_catalog.pg_backend_pid(),
    started_at  pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    finished_at pg_catalog.timestamptz,
    blocks      pg_catalog.int8 NOT NULL,
    blocks_done pg_catalog.int8 NOT NULL DEFAULT 0,
    batches     pg_catalog.int8 NOT NULL DEFAULT 0,
    deleted     pg_catalog.int8 NOT NULL DEFAULT 0
);
COMMENT ON TABLE idempotency.purge_runs IS
  'Progress and history of idem_purge runs: blocks_done of blocks scanned, deleted so far; finished_at is NULL while it runs.';
REVOKE ALL ON TABLE idempotency.purge_runs FROM PUBLIC;
