-- idempotency 0.3.0 -> 0.4.0: watermarks for ordered streams, keys for external APIs (#12).
-- Nothing stored before changes.
--
-- Like the script before it, this one is also the last part of a fresh install's script
-- (src/lib.rs): an update and a new install create the very same objects.

-- Watermarks: how far each partition of an ordered stream has been applied. One row per
-- (stream, partition), however many messages: nothing to purge. Names compare byte for byte
-- ("C"), as the broker's own names do.
CREATE TABLE idempotency.watermarks (
    stream      pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    partition   pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
    position    pg_catalog.numeric     NOT NULL,
    advanced_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT watermarks_pkey PRIMARY KEY (stream, partition)
);
COMMENT ON TABLE idempotency.watermarks IS
  'The position up to which each (stream, partition) has been applied, advanced by idem_watermark_advance in the consumer''s transaction.';
-- A restored database resumes where the dumped one stood.
SELECT pg_catalog.pg_extension_config_dump('idempotency.watermarks', '');
REVOKE ALL ON TABLE idempotency.watermarks FROM PUBLIC;

CREATE FUNCTION idem_watermark_advance(stream text, partition text, pos numeric)
RETURNS boolean LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'idem_watermark_advance_entry';
COMMENT ON FUNCTION idem_watermark_advance(text, text, numeric) IS
  'Advances (stream, partition) to pos in the current transaction: true when pos is beyond the stored position (or the first one), false for a duplicate or an older position.';

-- Kafka numbers its partitions, and drivers send a number as int2, int4 or int8: partition 3
-- is partition '3'. (An unknown-typed argument resolves to the text form.)
CREATE FUNCTION idem_watermark_advance(stream text, partition bigint, pos numeric)
RETURNS boolean LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'idem_watermark_advance_numbered_entry';
COMMENT ON FUNCTION idem_watermark_advance(text, bigint, numeric) IS
  'idem_watermark_advance with a numbered partition: partition 3 is partition ''3''.';

-- An LSN is a position too, but pg_lsn beside numeric would make an untyped position
-- ambiguous (42725): it has a function of its own, over the same numeric positions.
CREATE FUNCTION idem_watermark_advance_lsn(stream text, partition text, lsn pg_lsn)
RETURNS boolean LANGUAGE sql VOLATILE PARALLEL UNSAFE
RETURN @extschema@.idem_watermark_advance(stream, partition, lsn OPERATOR(pg_catalog.-) '0/0'::pg_catalog.pg_lsn);
COMMENT ON FUNCTION idem_watermark_advance_lsn(text, text, pg_lsn) IS
  'idem_watermark_advance for a change-data-capture position: the LSN''s byte position.';

CREATE FUNCTION idem_watermark(stream text, partition text)
RETURNS numeric LANGUAGE c VOLATILE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'idem_watermark_entry';
COMMENT ON FUNCTION idem_watermark(text, text) IS
  'The position (stream, partition) has been applied up to, to resume after; NULL before its first advance.';

CREATE FUNCTION idem_watermark(stream text, partition bigint)
RETURNS numeric LANGUAGE c VOLATILE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'idem_watermark_numbered_entry';
COMMENT ON FUNCTION idem_watermark(text, bigint) IS
  'idem_watermark with a numbered partition.';

CREATE FUNCTION idem_watermark_lsn(stream text, partition text)
RETURNS pg_lsn LANGUAGE sql VOLATILE PARALLEL SAFE
RETURN '0/0'::pg_catalog.pg_lsn OPERATOR(pg_catalog.+) @extschema@.idem_watermark(stream, partition);
COMMENT ON FUNCTION idem_watermark_lsn(text, text) IS
  'idem_watermark as an LSN.';

-- Keys for external APIs ------------------------------------------------------------------

CREATE FUNCTION idem_external_key(key text, scope text DEFAULT 'default', step text DEFAULT 'default')
RETURNS text LANGUAGE c IMMUTABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'idem_external_key_entry';
COMMENT ON FUNCTION idem_external_key(text, text, text) IS
  'The idempotency key to send an external API for one step of processing (scope, key): the same on every redelivery, replay and backfill. 36 characters: the text of idem_external_uuid.';

CREATE FUNCTION idem_external_uuid(key text, scope text DEFAULT 'default', step text DEFAULT 'default')
RETURNS uuid LANGUAGE c IMMUTABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'idem_external_uuid_entry';
COMMENT ON FUNCTION idem_external_uuid(text, text, text) IS
  'idem_external_key as a uuid, for APIs that take one.';

-- The external-call ledger, for APIs that take no idempotency key. A call is never begun (no
-- row), begun (confirmed_at NULL: it may or may not have happened), or confirmed (its
-- response stored, for every redelivery to reuse). idem_call_begin and idem_call_confirm run
-- in transactions of their own, so that "begun" is committed before the call is made.
CREATE TABLE idempotency.external_calls (
    call_key     pg_catalog.uuid        NOT NULL,
    scope        pg_catalog.text        NOT NULL,
    key          pg_catalog.text        NOT NULL,
    step         pg_catalog.text        NOT NULL,
    begun_at     pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now(),
    confirmed_at pg_catalog.timestamptz,
    response     pg_catalog.jsonb,
    CONSTRAINT external_calls_pkey PRIMARY KEY (call_key)
);
COMMENT ON TABLE idempotency.external_calls IS
  'External calls begun (idem_call_begin) before they were made, and confirmed (idem_call_confirm) with their responses after; call_key is idem_external_uuid(key, scope, step).';
SELECT pg_catalog.pg_extension_config_dump('idempotency.external_calls', '');
REVOKE ALL ON TABLE idempotency.external_calls FROM PUBLIC;

-- The calls to reconcile: begun longer ago than idempotency.unconfirmed_after (one minute
-- unless set) and never confirmed. Each may or may not have happened; someone checks the
-- API and says which with idem_call_resolve.
CREATE VIEW idempotency.unconfirmed_calls AS
SELECT scope, key, step, call_key, begun_at, pg_catalog.now() OPERATOR(pg_catalog.-) begun_at AS waiting
FROM idempotency.external_calls
WHERE confirmed_at IS NULL
  AND begun_at OPERATOR(pg_catalog.<=) (pg_catalog.now() OPERATOR(pg_catalog.-) COALESCE(
        NULLIF(pg_catalog.current_setting('idempotency.unconfirmed_after', true), ''), '1min')::pg_catalog.interval);
COMMENT ON VIEW idempotency.unconfirmed_calls IS
  'External calls begun more than idempotency.unconfirmed_after ago and not confirmed: they may or may not have happened. Resolve each with idem_call_resolve.';
REVOKE ALL ON TABLE idempotency.unconfirmed_calls FROM PUBLIC;

CREATE FUNCTION idem_call_begin(key text, scope text DEFAULT 'default', step text DEFAULT 'default')
RETURNS TABLE (state text, call_key text, response jsonb, begun_at timestamptz)
LANGUAGE c VOLATILE PARALLEL UNSAFE ROWS 1
AS 'MODULE_PATHNAME', 'idem_call_begin_entry';
COMMENT ON FUNCTION idem_call_begin(text, text, text) IS
  'Records that the external call for (key, scope, step) is begun, committed before it returns: state ''new'' (make the call), ''in_doubt'' (begun before and never confirmed: do not call; reconcile) or ''confirmed'' (reuse response). Raises 25001 inside a transaction block.';

CREATE FUNCTION idem_call_confirm(key text, scope text, step text, response jsonb)
RETURNS boolean LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'idem_call_confirm_entry';
COMMENT ON FUNCTION idem_call_confirm(text, text, text, jsonb) IS
  'Stores the response of a begun external call, committed before it returns: true, or false when it was confirmed already (the first response stays). Raises ID003 for a call never begun, 25001 inside a transaction block.';

CREATE FUNCTION idem_call_resolve(key text, scope text, step text, happened boolean, response jsonb DEFAULT NULL)
RETURNS void LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'idem_call_resolve_entry';
COMMENT ON FUNCTION idem_call_resolve(text, text, text, boolean, jsonb) IS
  'Settles an unconfirmed external call: happened => true with the response the API gave, or happened => false to forget it, so that it may be made again.';
