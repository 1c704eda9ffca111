//! The transactional outbox: a message is written in the sender's transaction, next to the
//! claim and the business change, and relays publish it after commit (sql's idem_outbox_*).
//!
//! Message ids are deterministic, so a handler that runs again for the same business key
//! (a DLQ replay, a backfill, a claim purged and made anew) emits the same ids:
//! - after a successful single claim (idem_claim, idem_claim_nowait, idem_claim_replay that
//!   returned true) in the transaction, the n-th message sent gets the id of (its scope, its
//!   key, n), counting from 1. The last such claim counts; a duplicate's false, a batch, and a
//!   claim that raised change nothing. A message sent in a savepoint that is rolled back to
//!   does not use up its position, since its row is gone too.
//! - `key => k` gives the id of (default scope, k, 0) instead, whatever was claimed.
//!
//! The id is a UUID (version 8) made of the first 122 bits of SHA-256 over a fixed label, the
//! claim's key digest and n: its text form is 36 bytes, and it never changes across releases.
//!
//! Order: messages of one ordering key are handed out in the order their transactions
//! committed. A sender locks its ordering key (a lock on the object (idempotency.outbox,
//! hash of the key)) before it takes the message's seq, and holds the lock until it commits
//! or rolls back, so the next sender of that key takes a greater seq only after this one's
//! fate is known. Senders of one key queue on that lock, so a transaction should send its
//! keyed messages last; two transactions that lock two keys in opposite orders deadlock, and
//! one of them gets 40P01.

use pgrx::datum::{DatumWithOid, Interval, Uuid};
use pgrx::fcinfo::{pg_getarg, pg_getarg_datum};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};
use sha2::{Digest, Sha256};
use std::cell::Cell;

use crate::digest::{parse_key, uuid_v8, Scope};
use crate::error::{finish, required, sqlstate_entry, IdemError, Result, SqlState};
use crate::postgres::role;
use crate::postgres::spi::{Statement, CONFLICT_TRIES};
use crate::postgres::write::{
    attnum, open_owned, ColumnDefault, DirectInsert, IndexShape, InsertPrivileges, PermissionCache, Shape,
};
use crate::postgres::xact::{self, TransactionLocal};
use crate::postgres::{catch, ffi};

static INSERT_MESSAGE: Statement = Statement {
    sql: "INSERT INTO idempotency.outbox (seq, id, topic, ordering_key, payload, headers) \
          VALUES (pg_catalog.nextval('idempotency.outbox_seq'::pg_catalog.regclass), $1, $2, $3, $4, $5) \
          ON CONFLICT (id) DO NOTHING",
    args: &[pg_sys::UUIDOID, pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::JSONBOID, pg_sys::JSONBOID],
};

/// The outbox's columns, in table order, and their defaults, as sql/ creates them.
static OUTBOX_SHAPE: Shape = Shape {
    columns: &[
        (c"seq", pg_sys::INT8OID),
        (c"id", pg_sys::UUIDOID),
        (c"created_at", pg_sys::TIMESTAMPTZOID),
        (c"retry_at", pg_sys::TIMESTAMPTZOID),
        (c"set_aside_at", pg_sys::TIMESTAMPTZOID),
        (c"sent_at", pg_sys::TIMESTAMPTZOID),
        (c"attempts", pg_sys::INT4OID),
        (c"topic", pg_sys::TEXTOID),
        (c"ordering_key", pg_sys::TEXTOID),
        (c"payload", pg_sys::JSONBOID),
        (c"headers", pg_sys::JSONBOID),
        (c"last_error", pg_sys::TEXTOID),
    ],
    defaults: &[(attnum(CREATED_AT), ColumnDefault::Now), (attnum(ATTEMPTS), ColumnDefault::Int4(0))],
};
const SEQ: usize = 0;
const ID: usize = 1;
const CREATED_AT: usize = 2;
const SET_ASIDE_AT: usize = 4;
const SENT_AT: usize = 5;
const ATTEMPTS: usize = 6;
const TOPIC: usize = 7;
const ORDERING_KEY: usize = 8;
const PAYLOAD: usize = 9;
const HEADERS: usize = 10;

/// The pending index as sql/ makes it (outbox_pending): a probe of it finds exactly what
/// NUMBERED_AFTER's subquery selects.
static PENDING: IndexShape = IndexShape {
    columns: &[(attnum(ORDERING_KEY), pg_sys::TEXT_BTREE_FAM_OID), (attnum(SEQ), pg_sys::INTEGER_BTREE_FAM_OID)],
    null_columns: &[attnum(SENT_AT), attnum(SET_ASIDE_AT)],
};

/// INSERT_MESSAGE's privileges.
const SEND_PRIVILEGES: [InsertPrivileges; 1] = [InsertPrivileges {
    inserted: &[attnum(SEQ), attnum(ID), attnum(TOPIC), attnum(ORDERING_KEY), attnum(PAYLOAD), attnum(HEADERS)],
    arbiter: &[attnum(ID)],
}];

thread_local! {
    /// The OIDs of schema idempotency and of its outbox (see [`open_owned`]).
    static OUTBOX_OIDS: Cell<(pg_sys::Oid, pg_sys::Oid)> = const { Cell::new((pg_sys::InvalidOid, pg_sys::InvalidOid)) };
    static OUTBOX_PERMISSIONS: PermissionCache = const { PermissionCache::new() };
}

/// A message's values as INSERT_MESSAGE takes them.
struct Row {
    id: pg_sys::Datum,
    topic: pg_sys::Datum,
    ordering_key: Option<pg_sys::Datum>,
    payload: pg_sys::Datum,
    headers: Option<pg_sys::Datum>,
}

impl Row {
    /// INSERT_MESSAGE's arguments, of which SAME_MESSAGE takes the first four.
    fn args(&self) -> [DatumWithOid<'_>; 5] {
        // SAFETY: each datum is of its statement argument's type and lives as long as the row.
        unsafe {
            let optional = |d: Option<pg_sys::Datum>, oid| match d {
                Some(d) => DatumWithOid::new(d, oid),
                None => DatumWithOid::null_oid(oid),
            };
            [
                DatumWithOid::new(self.id, pg_sys::UUIDOID),
                DatumWithOid::new(self.topic, pg_sys::TEXTOID),
                optional(self.ordering_key, pg_sys::TEXTOID),
                DatumWithOid::new(self.payload, pg_sys::JSONBOID),
                optional(self.headers, pg_sys::JSONBOID),
            ]
        }
    }
}

/// The outbox opened for INSERT_MESSAGE without SPI (see [`crate::postgres::write`]), while
/// it is exactly as sql/ made it.
struct Outbox {
    insert: DirectInsert,
    seq: pg_sys::Oid,
}

impl Outbox {
    fn open() -> Result<Option<Outbox>> {
        // SAFETY: the relation stays open until finish(), or until an error's abort.
        unsafe {
            let rel = OUTBOX_OIDS.with(|oids| open_owned(c"idempotency", c"outbox", oids))?;
            // The statement finds the sequence by name when it is planned, before anything
            // else; without it, it is the statement's 42P01.
            let seq = pg_sys::get_relname_relid(c"outbox_seq".as_ptr(), (*(*rel).rd_rel).relnamespace);
            if seq == pg_sys::InvalidOid {
                pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
                return Ok(None);
            }
            let insert = OUTBOX_PERMISSIONS.with(|cache| {
                cache.with((*rel).rd_id, &SEND_PRIVILEGES, 0, |p| {
                    DirectInsert::open(rel, &OUTBOX_SHAPE, p, &[attnum(ID)])
                })
            })?;
            Ok(insert.map(|insert| Outbox { insert, seq }))
        }
    }

    /// INSERT_MESSAGE's steps after its privilege checks: the next seq (nextval's own
    /// privilege check included), then the row unless its id is present, and for a keyed
    /// message the numbering check. None where the statement must decide
    /// ([`crate::postgres::write::Insert::ToStatement`]).
    fn insert(&self, row: &Row) -> Result<Option<Sent>> {
        // SAFETY: nextval(regclass), the statement's own function, raises (no privilege, a
        // read-only transaction, the sequence exhausted) inside catch.
        let seq = unsafe {
            catch(|| {
                ffi::DirectFunctionCall1Coll(Some(ffi::nextval_oid), pg_sys::InvalidOid, self.seq.into()).value() as i64
            })?
        };
        let optional = |d: Option<pg_sys::Datum>| (d.unwrap_or(pg_sys::Datum::from(0)), d.is_none());
        let inserted = self.insert.insert(|values, nulls| {
            (values[SEQ], nulls[SEQ]) = (pg_sys::Datum::from(seq), false);
            (values[ID], nulls[ID]) = (row.id, false);
            (values[TOPIC], nulls[TOPIC]) = (row.topic, false);
            (values[ORDERING_KEY], nulls[ORDERING_KEY]) = optional(row.ordering_key);
            (values[PAYLOAD], nulls[PAYLOAD]) = (row.payload, false);
            (values[HEADERS], nulls[HEADERS]) = optional(row.headers);
        })?;
        let numbering = match (inserted.decided(), row.ordering_key) {
            (Some(false), _) => return Ok(Some(Sent::Present)),
            (None, _) => return Ok(None),
            (Some(true), None) => Numbering::Last,
            (Some(true), Some(key)) => {
                let bounds = [
                    (pg_sys::BTEqualStrategyNumber as u16, key),
                    (pg_sys::BTGreaterEqualStrategyNumber as u16, pg_sys::Datum::from(seq)),
                ];
                let later =
                    self.insert.probe(&PENDING, &bounds, |other| Some(other.value(attnum(SEQ)).0.value() as i64))?;
                match later {
                    Some(Some(later)) => Numbering::After { seq, later },
                    Some(None) => Numbering::Last,
                    None => Numbering::Unknown,
                }
            }
        };
        Ok(Some(Sent::Inserted(numbering)))
    }

    fn finish(self) -> Result<()> {
        Ok(self.insert.finish()?)
    }
}

/// What a send's INSERT did.
enum Sent {
    /// A message with its id was there already; nothing was written.
    Present,
    Inserted(Numbering),
}

/// Where a new message's number stands among the pending messages of its ordering key.
enum Numbering {
    /// After all of them (or the message has no key).
    Last,
    /// At or before `later`, which a pending message of the key holds (see NUMBERED_AFTER).
    After { seq: i64, later: i64 },
    /// Not checked yet: NUMBERED_AFTER decides.
    Unknown,
}

impl Numbering {
    fn require_last(self, id: Uuid) -> Result<()> {
        match self {
            Numbering::Last => Ok(()),
            Numbering::After { seq, later } => Err(numbered_before(id, seq, later)),
            Numbering::Unknown => require_numbered_last(id, true),
        }
    }
}

/// INSERT_MESSAGE, directly where the outbox allows it.
fn insert_message(row: &Row) -> Result<Sent> {
    if let Some(outbox) = Outbox::open()? {
        let sent = outbox.insert(row)?;
        outbox.finish()?;
        // Where the statement decides, it draws its own seq: the one drawn here is a gap,
        // as a rolled-back send leaves one.
        if let Some(sent) = sent {
            return Ok(sent);
        }
    }
    let inserted = INSERT_MESSAGE.run(&row.args(), |rows| rows.len() == 1)?;
    Ok(match (inserted, row.ordering_key) {
        (false, _) => Sent::Present,
        (true, None) => Sent::Inserted(Numbering::Last),
        (true, Some(_)) => Sent::Inserted(Numbering::Unknown),
    })
}

/// Whether the stored message with this id is the same message: topic, ordering key and
/// payload. Headers may differ (a trace id, say); the first ones stay. Not `IS NOT DISTINCT
/// FROM`, which finds its `=` through the caller's search_path.
static SAME_MESSAGE: Statement = Statement {
    sql: "SELECT o.topic OPERATOR(pg_catalog.=) $2 \
             AND COALESCE(o.ordering_key OPERATOR(pg_catalog.=) $3, o.ordering_key IS NULL AND $3 IS NULL) \
             AND o.payload OPERATOR(pg_catalog.=) $4 \
          FROM idempotency.outbox AS o WHERE o.id OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::UUIDOID, pg_sys::TEXTOID, pg_sys::TEXTOID, pg_sys::JSONBOID],
};

/// The first pending message of the same ordering key numbered at or after this one (first
/// by number, so that the error names the same one whichever way it was found): only a sequence
/// that went back numbers so, since a sender draws its number under the key's lock, after
/// every earlier sender of the key committed. Through the pending index, from this message's
/// number on, which is where the key's pending messages end. A direct send probes that index
/// itself ([`DirectInsert::probe`]) while it is the one sql/ made.
static NUMBERED_AFTER: Statement = Statement {
    // A subquery, not a join: its key and number are parameters of each probe, so they are
    // always the pending index's bounds, where a join planned for the freshly truncated
    // outbox's statistics read the whole index (5 ms at 13,000 pending messages).
    sql: "SELECT m.seq, (SELECT e.seq FROM idempotency.outbox AS e \
                         WHERE e.ordering_key OPERATOR(pg_catalog.=) m.ordering_key \
                           AND e.seq OPERATOR(pg_catalog.>=) m.seq AND e.id OPERATOR(pg_catalog.<>) m.id \
                           AND e.sent_at IS NULL AND e.set_aside_at IS NULL \
                         ORDER BY e.seq LIMIT 1) \
          FROM idempotency.outbox AS m WHERE m.id OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::UUIDOID],
};

/// Refuses (55000) a message that `idempotency.outbox_seq` numbered at or before a pending
/// message of its key: relays would hand it out first, though it committed last. A sequence
/// goes back when it is restarted, set back with setval, given a negative INCREMENT or CYCLE,
/// or left behind by a restore or a logical replica that did not carry it over. The check
/// reads with the newest snapshot at every isolation level, as foreign key checks do: under
/// REPEATABLE READ, the transaction's snapshot would miss a message of the key that committed
/// after it was taken, though the key's lock waited for exactly that message.
///
/// A send reads as the outbox's owner: the statement it stands for needs no privilege beyond
/// INSERT and SELECT on `id`, and the check must not ask for more. The SQL function that a
/// requeue calls reads as its caller, who has read the message already: no role may call a
/// function that reads the outbox with another role's rights.
fn require_numbered_last(id: Uuid, as_owner: bool) -> Result<()> {
    // SAFETY: a uuid datum, alive for the call.
    let args = [unsafe { DatumWithOid::new(id.into_datum().expect("a uuid datum"), pg_sys::UUIDOID) }];
    let probe = || {
        NUMBERED_AFTER.run_latest(&args, |rows| {
            if rows.is_empty() {
                return None;
            }
            Some((rows.get::<i64>(0, 1)?, rows.get::<i64>(0, 2)?))
        })
    };
    let clash = if as_owner {
        let owner = OUTBOX_OIDS.with(|oids| role::owner_of(c"idempotency", c"outbox", oids))?;
        role::as_user(owner, probe)?
    } else {
        probe()?
    };
    match clash {
        Some((seq, later)) => Err(numbered_before(id, seq, later)),
        None => Ok(()),
    }
}

fn numbered_before(id: Uuid, seq: i64, later: i64) -> IdemError {
    IdemError::new(
        SqlState::ObjectNotInPrerequisiteState,
        format!(
            "idempotency.outbox_seq gave message {id} the number {seq}, not above {later}, which a pending message of its ordering key holds"
        ),
    )
    .detail("The sequence went back (RESTART, setval, a negative INCREMENT, CYCLE, or a restore or logical replica that did not carry it over); relays would hand this message out before one that committed earlier.")
    .hint("SELECT setval('idempotency.outbox_seq', (SELECT max(seq) FROM idempotency.outbox)); and keep its INCREMENT positive, without CYCLE.")
}

/// The claim the next derived id counts from, and how many messages it has sent.
#[derive(Clone, Copy)]
struct Sender {
    digest: Uuid,
    sent: i64,
}

thread_local! {
    static SENDER: TransactionLocal<Sender> = const { TransactionLocal::new() };
}

/// One day: sending a sent message again does nothing for that long after it was sent. Keep
/// it at least as long as handlers can run again for the same business key (a DLQ replay, a
/// backfill), or consumers downstream must recognise the repeats by id on their own.
pub static OUTBOX_RETENTION: GucSetting<i32> = GucSetting::<i32>::new(24 * 3600);

pub fn init() {
    xact::register(&SENDER);
    GucRegistry::define_int_guc(
        c"idempotency.outbox_retention",
        c"How long sent outbox messages are kept before idem_purge may delete them.",
        c"Pending and set-aside messages are never purged.",
        &OUTBOX_RETENTION,
        1,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
}

/// Called by every successful single claim: the messages sent after it count from it.
pub fn claimed(digest: Uuid) {
    SENDER.with(|s| s.set(Sender { digest, sent: 0 }));
}

/// The id of the n-th message after claiming `digest`; n = 0 for a message sent with an
/// explicit key.
fn message_id(digest: Uuid, n: i64) -> Uuid {
    let mut hasher = Sha256::new();
    hasher.update(b"idempotency message id\0");
    hasher.update(digest.as_bytes());
    hasher.update(n.to_be_bytes());
    uuid_v8(&hasher.finalize())
}

const MAX_ORDERING_KEY: usize = 1024;

struct Message {
    topic: String,
    payload: pg_sys::Datum,
    headers: Option<pg_sys::Datum>,
    ordering_key: Option<String>,
}

fn send(message: Message, key: Option<&str>) -> Result<Uuid> {
    if message.topic.is_empty() {
        return Err(IdemError::new(SqlState::InvalidParameterValue, "topic must not be empty"));
    }
    match message.ordering_key.as_deref().map(str::len) {
        Some(0) => {
            return Err(IdemError::new(SqlState::InvalidParameterValue, "ordering_key must not be empty")
                .hint("Pass NULL for a message that need not keep an order."))
        }
        // The pending-messages index holds the key; btree refuses entries of about 2.7 kB.
        Some(len) if len > MAX_ORDERING_KEY => {
            return Err(IdemError::new(
                SqlState::InvalidParameterValue,
                format!("ordering_key must be at most {MAX_ORDERING_KEY} bytes, not {len}"),
            )
            .hint("Order by an entity's id, not by its content."))
        }
        _ => {}
    }
    // The relay makes a broker header of each member: anything but an object would reach the
    // broker without its headers.
    if let Some(headers) = message.headers {
        // SAFETY: a jsonb argument of the call, alive until it returns.
        unsafe { crate::jsonb::object_members(headers, "headers")? };
    }
    let id = match key {
        Some(key) => message_id(Scope::parse(Some("default"))?.key_digest(parse_key(Some(key), "key")?), 0),
        None => {
            let Some(sender) = SENDER.with(TransactionLocal::get) else {
                return Err(IdemError::new(
                    SqlState::NotClaimed,
                    "no key was claimed in this transaction to derive the message id from",
                )
                .hint("Call idem_claim first in the same transaction, or pass key => a key of the message's own."));
            };
            let n = sender.sent + 1;
            SENDER.with(|s| s.set(Sender { sent: n, ..sender }));
            message_id(sender.digest, n)
        }
    };
    if let Some(ordering_key) = &message.ordering_key {
        xact::lock_ordering_key(ordering_key.as_bytes(), xact::Caller::Sender)?;
    }
    let text = |value: &str| value.into_datum().expect("a text datum");
    let row = Row {
        id: id.into_datum().expect("a uuid datum"),
        topic: text(&message.topic),
        ordering_key: message.ordering_key.as_deref().map(text),
        payload: message.payload,
        headers: message.headers,
    };
    // A duplicate's row can vanish (purged, or deleted by hand) between the INSERT that met it
    // and the read that compares it: the INSERT is tried again then. Only a row that is neither
    // inserted nor readable, every time, ends the tries: a BEFORE trigger of the DBA's that
    // returns NULL, or a policy that hides it.
    for _ in 0..CONFLICT_TRIES {
        if let Sent::Inserted(numbering) = insert_message(&row)? {
            numbering.require_last(id)?;
            return Ok(id);
        }
        let same = SAME_MESSAGE.run(&row.args()[..4], |rows| (!rows.is_empty()).then(|| rows.get::<bool>(0, 1)))?;
        match same {
            None => continue,
            Some(Some(true)) => return Ok(id),
            Some(_) => {
                return Err(IdemError::new(
                    SqlState::PayloadMismatch,
                    format!("message {id} was already sent with another topic, ordering key or payload"),
                )
                .detail("A message id stands for one message: the outbox keeps the first, and consumers downstream would drop the second as a repeat.")
                .hint("Derive the ids of different messages from different claims or keys, or send one message per position after a claim."))
            }
        }
    }
    Err(IdemError::new(
        SqlState::ObjectNotInPrerequisiteState,
        format!("message {id} was neither written to idempotency.outbox nor found there"),
    )
    .detail("The INSERT wrote no row and met no conflict it could read, three times.")
    .hint("A BEFORE INSERT trigger on idempotency.outbox that returns NULL, or a row-level security policy that hides the row from this role, would do this; the message is not sent."))
}

// The jsonb arguments are read as raw datums and go to the statement unconverted.
#[pg_extern(sql = false)]
fn idem_send(fcinfo: pg_sys::FunctionCallInfo) -> Option<Uuid> {
    // SAFETY: the SQL declaration gives these five arguments these types (text, jsonb, jsonb,
    // text, text); a NULL comes back as None.
    let (topic, payload, headers, ordering_key, key) = unsafe {
        (
            pg_getarg::<String>(fcinfo, 0),
            pg_getarg_datum(fcinfo, 1),
            pg_getarg_datum(fcinfo, 2),
            pg_getarg::<String>(fcinfo, 3),
            pg_getarg::<String>(fcinfo, 4),
        )
    };
    finish((|| {
        let message =
            Message { topic: required(topic, "topic")?, payload: required(payload, "payload")?, headers, ordering_key };
        send(message, key.as_deref())
    })())
}
sqlstate_entry!(idem_send_entry, pg_finfo_idem_send_entry, idem_send_wrapper);

#[pg_extern(sql = false)]
fn idem_message_id(key: Option<&str>, scope: Option<&str>, n: Option<i64>) -> Option<Uuid> {
    finish((|| {
        let digest = Scope::parse(scope)?.key_digest(parse_key(key, "key")?);
        let n = required(n, "n")?;
        if n < 0 {
            return Err(IdemError::new(SqlState::InvalidParameterValue, format!("n must not be negative, not {n}"))
                .hint("n counts the messages sent after a claim from 1; 0 is the id of a message sent with key =>."));
        }
        Ok(message_id(digest, n))
    })())
}
sqlstate_entry!(idem_message_id_entry, pg_finfo_idem_message_id_entry, idem_message_id_wrapper);

#[pg_extern(sql = false)]
fn ordering_key_lock(ordering_key: Option<&str>) {
    finish(
        required(ordering_key, "ordering_key")
            .and_then(|k| xact::lock_ordering_key(k.as_bytes(), xact::Caller::Anyone)),
    );
}
sqlstate_entry!(lock_ordering_key_entry, pg_finfo_lock_ordering_key_entry, ordering_key_lock_wrapper);

#[pg_extern(sql = false)]
fn idem_outbox_retention() -> Interval {
    crate::retention::seconds_interval(OUTBOX_RETENTION.get())
}

#[pg_extern(sql = false)]
fn numbered_last(id: Option<Uuid>) {
    finish(required(id, "id").and_then(|id| require_numbered_last(id, false)));
}
sqlstate_entry!(require_numbered_last_entry, pg_finfo_require_numbered_last_entry, numbered_last_wrapper);

#[pg_extern(sql = false)]
fn require_ordered_numbering() {
    finish(xact::require_ordered_numbering());
}
sqlstate_entry!(
    require_ordered_numbering_entry,
    pg_finfo_require_ordered_numbering_entry,
    require_ordered_numbering_wrapper
);

#[pg_extern(sql = false)]
fn require_transaction_block(what: Option<&str>) {
    if !xact::in_transaction_block() {
        let what = what.unwrap_or("this function");
        finish::<()>(Err(IdemError::new(
            SqlState::NoActiveTransaction,
            format!("{what} must run inside a transaction block"),
        )
        .detail("The messages it locks must stay locked until the relay has published them and commits.")
        .hint("Run BEGIN first, and COMMIT after marking the messages sent or failed.")));
    }
}
sqlstate_entry!(
    require_transaction_block_entry,
    pg_finfo_require_transaction_block_entry,
    require_transaction_block_wrapper
);
