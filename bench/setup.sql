-- Schema for the benchmark database idem_bench (run by bench/run.sh after CREATE EXTENSION).

-- "hand": what an application would write without the extension.
CREATE TABLE hand_ledger (
    scope      text        NOT NULL,
    key        text        NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key)
);

-- "plpgsql": the same claim wrapped in a PL/pgSQL function, over its own identical table.
CREATE TABLE plpgsql_ledger (
    scope      text        NOT NULL,
    key        text        NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key)
);

CREATE FUNCTION plpgsql_claim(k text, s text DEFAULT 'default') RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO plpgsql_ledger (scope, key) VALUES (s, k) ON CONFLICT DO NOTHING;
    RETURN FOUND;
END
$$;

-- Versioned writes: "vupdate_hand" is the conditional UPDATE an application would write,
-- "vupdate_ext" the same write through idem_versioned_update, each over its own identical
-- table so they do not interfere. bench/run.sh fills both with VM_ROWS rows at version 0
-- before every contender (see reset_tables), so both always start from the same state.
CREATE TABLE vm_hand (
    id      int    PRIMARY KEY,
    status  text   NOT NULL,
    version bigint NOT NULL
);
CREATE TABLE vm_ext (
    id      int    PRIMARY KEY,
    status  text   NOT NULL,
    version bigint NOT NULL
);

-- Outbox sends: "send_ext" writes through idem_send, "send_hand" into the outbox table a user
-- would write by hand (#11's reference, with the same wake-up as the extension: none, relays
-- poll). Each writes its business row to a table of its own.
CREATE TABLE hand_outbox (
    id           uuid PRIMARY KEY,
    topic        text NOT NULL,
    ordering_key text,
    payload      jsonb NOT NULL,
    headers      jsonb,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX hand_outbox_topic_created ON hand_outbox (topic, created_at);
CREATE TABLE biz_ext (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, entity int NOT NULL, amount numeric NOT NULL);
CREATE TABLE biz_hand (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, entity int NOT NULL, amount numeric NOT NULL);

-- Watermarks: "watermark_hand" is the offset table and conditional UPDATE an application
-- would write; idem_watermark_advance writes idempotency.watermarks. reset.sql loads both
-- with the same 1000 partitions at position 0 before every run. Positions come from a
-- sequence per contender, so every advance is beyond the stored position, as a consumer's
-- next message is.
CREATE TABLE hand_offsets (
    stream    text   NOT NULL,
    partition int    NOT NULL,
    position  bigint NOT NULL,
    PRIMARY KEY (stream, partition)
);
CREATE SEQUENCE hand_positions;
CREATE SEQUENCE ext_positions;

-- A whole consumer transaction (make bench's "consumer" run, synchronous_commit on): a payment
-- and the account it credits, written with no dedup, with a hand-written dedup table
-- (hand_ledger), with idem_claim as its own statement, and with the claim inside the
-- business statement. reset.sql empties the payments and sets the 1000 accounts to 0.
CREATE TABLE consumer_payments (
    order_id text        PRIMARY KEY,
    account  int         NOT NULL,
    amount   numeric     NOT NULL,
    paid_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE consumer_accounts (
    id      int     PRIMARY KEY,
    balance numeric NOT NULL
);
