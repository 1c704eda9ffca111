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
