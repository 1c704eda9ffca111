//! The claim: one INSERT … ON CONFLICT DO NOTHING into the ledger, in the caller's
//! transaction. A duplicate is a conflict, never an error, so the transaction stays usable;
//! a concurrent uncommitted claim of the same key makes the INSERT wait for that
//! transaction's fate, which is exactly the answer a consumer needs.

use std::collections::{HashMap, HashSet};
use std::ffi::CStr;

use pgrx::datum::{DatumWithOid, TimestampWithTimeZone, Uuid};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::JsonB;

use crate::digest::{fingerprint, parse_key, Scope};
use crate::direct::{self, Insert, Permissions, Target};
use crate::error::{finish, required, sqlstate_entry, IdemError, Result, SqlState};
use crate::plans::Statement;
use crate::retention::check_late_replay;

static INSERT_CLAIM: Statement = Statement {
    sql: "INSERT INTO idempotency.ledger (key_digest, scope_id, fingerprint) VALUES ($1, $2, $3) \
          ON CONFLICT (key_digest) DO NOTHING",
    args: &[pg_sys::UUIDOID, pg_sys::INT8OID, pg_sys::UUIDOID],
};

static READ_CLAIM: Statement = Statement {
    sql: "SELECT claimed_at, fingerprint, result FROM idempotency.ledger \
          WHERE key_digest OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::UUIDOID],
};

static STORE_RESULT: Statement = Statement {
    sql: "UPDATE idempotency.ledger SET result = $2 WHERE key_digest OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::UUIDOID, pg_sys::JSONBOID],
};

// Digests arrive sorted, so two batches that share keys insert them in the same order and
// wait for each other instead of deadlocking.
static INSERT_MANY: Statement = Statement {
    sql: "INSERT INTO idempotency.ledger (key_digest, scope_id) \
          SELECT d, $2 FROM pg_catalog.unnest($1) AS u(d) \
          ON CONFLICT (key_digest) DO NOTHING RETURNING key_digest",
    args: &[pg_sys::UUIDARRAYOID, pg_sys::INT8OID],
};

/// The ledger opened for claims without SPI (see [`crate::direct`]). The SPI statements above
/// stay the way in when a DBA has given the ledger what only the full executor honours:
/// row-level security for tenants, an audit trigger, a rule, an extra column.
struct Ledger {
    target: Target,
    row: *mut pg_sys::TupleTableSlot,
    scratch: *mut pg_sys::TupleTableSlot,
    arbiter: pg_sys::Oid,
}

/// The ledger's columns, in table order, as sql/schema.sql creates them.
const LEDGER_TYPES: [pg_sys::Oid; 5] = [pg_sys::UUIDOID, pg_sys::INT8OID, pg_sys::TIMESTAMPTZOID, pg_sys::UUIDOID, pg_sys::JSONBOID];
const KEY_DIGEST: usize = 0;
const SCOPE_ID: usize = 1;
const CLAIMED_AT: usize = 2;
const FINGERPRINT: usize = 3;

/// The columns a claim names in its INSERT, and so needs INSERT privilege on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Columns {
    /// idem_claim: key_digest, scope_id, fingerprint.
    Single = 0,
    /// idem_claim_many: key_digest, scope_id.
    Batch = 1,
}

impl Columns {
    fn attnums(self) -> &'static [i16] {
        const fn attnum(index: usize) -> i16 {
            index as i16 + 1
        }
        const SINGLE: [i16; 3] = [attnum(KEY_DIGEST), attnum(SCOPE_ID), attnum(FINGERPRINT)];
        const BATCH: [i16; 2] = [attnum(KEY_DIGEST), attnum(SCOPE_ID)];
        match self {
            Columns::Single => &SINGLE,
            Columns::Batch => &BATCH,
        }
    }
}

thread_local! {
    /// The OIDs of schema idempotency and of its ledger, found once per backend and checked
    /// against the opened relation on every use (the extension may be dropped and recreated).
    static LEDGER_OIDS: std::cell::Cell<(pg_sys::Oid, pg_sys::Oid)> =
        const { std::cell::Cell::new((pg_sys::InvalidOid, pg_sys::InvalidOid)) };
    /// The INSERT privilege checks of both kinds of claim, for the ledger they were made for.
    static LEDGER_PERMISSIONS: std::cell::RefCell<Option<(pg_sys::Oid, [Permissions; 2])>> =
        const { std::cell::RefCell::new(None) };
}

/// The permission check of a claim on the ledger `relid`, built once per backend (and again
/// if the extension is recreated; the old one's few bytes stay in TopMemoryContext).
fn ledger_permissions<R>(relid: pg_sys::Oid, columns: Columns, with: impl FnOnce(&Permissions) -> R) -> R {
    LEDGER_PERMISSIONS.with(|cache| {
        let mut cache = cache.borrow_mut();
        if !matches!(&*cache, Some((oid, _)) if *oid == relid) {
            let build = |c: Columns| unsafe {
                Permissions::new(relid, pg_sys::ACL_INSERT, &[], c.attnums(), &[], pg_sys::TopMemoryContext)
            };
            *cache = Some((relid, [build(Columns::Single), build(Columns::Batch)]));
        }
        let (_, permissions) = cache.as_ref().expect("just filled");
        with(&permissions[columns as usize])
    })
}

impl Ledger {
    /// Opens the ledger for claims that write `columns`, after the same privilege checks the
    /// INSERT would get; None when the claim must go through SPI instead.
    fn open(columns: Columns) -> Option<Ledger> {
        unsafe {
            let rel = open_ledger_relation();
            if !direct::is_plain(rel) || !has_ledger_shape(rel) {
                pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
                return None;
            }
            let target = ledger_permissions((*rel).rd_id, columns, |p| {
                p.check(rel);
                Target::begin(rel, p)
            });
            let row = target.virtual_slot();
            let scratch = target.table_slot();
            Some(Ledger { target, row, scratch, arbiter: pg_sys::RelationGetPrimaryKeyIndex(rel) })
        }
    }

    /// Inserts the claim unless (scope, key) is already claimed; true when inserted.
    /// `optimistic` skips the pre-check of the first insertion attempt (see
    /// [`Target::insert_unless_present`]).
    fn claim(&self, digest: Uuid, scope_id: i64, fingerprint: Option<Uuid>, optimistic: bool) -> bool {
        unsafe {
            let row = self.row;
            pg_sys::ExecClearTuple(row);
            let natts = (*(*self.target.rel).rd_att).natts as usize;
            let values = std::slice::from_raw_parts_mut((*row).tts_values, natts);
            let nulls = std::slice::from_raw_parts_mut((*row).tts_isnull, natts);
            nulls.fill(true);
            (values[KEY_DIGEST], nulls[KEY_DIGEST]) = (digest.into_datum().expect("a uuid datum"), false);
            (values[SCOPE_ID], nulls[SCOPE_ID]) = (pg_sys::Datum::from(scope_id), false);
            (values[CLAIMED_AT], nulls[CLAIMED_AT]) = (pg_sys::Datum::from(pg_sys::GetCurrentTransactionStartTimestamp()), false);
            if let Some(fingerprint) = fingerprint {
                (values[FINGERPRINT], nulls[FINGERPRINT]) = (fingerprint.into_datum().expect("a uuid datum"), false);
            }
            pg_sys::ExecStoreVirtualTuple(row);
            matches!(self.target.insert_unless_present(row, self.arbiter, self.scratch, !optimistic), Insert::Inserted)
        }
    }

    fn finish(self) {
        let rel = self.target.rel;
        self.target.finish();
        unsafe { pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE) };
    }
}

/// Opens idempotency.ledger with RowExclusiveLock once the caller may use its schema, the
/// check that resolving the name in SQL would make.
unsafe fn open_ledger_relation() -> pg_sys::Relation {
    let lock = pg_sys::RowExclusiveLock as pg_sys::LOCKMODE;
    let (mut schema, mut oid) = LEDGER_OIDS.get();
    if schema == pg_sys::InvalidOid {
        (schema, oid) = find_ledger();
    }
    loop {
        let usage = pg_sys::pg_namespace_aclcheck(schema, pg_sys::GetUserId(), pg_sys::ACL_USAGE as pg_sys::AclMode);
        if usage != pg_sys::AclResult::ACLCHECK_OK {
            pg_sys::aclcheck_error(usage, pg_sys::ObjectType::OBJECT_SCHEMA, c"idempotency".as_ptr());
        }
        let rel = pg_sys::try_relation_open(oid, lock);
        if !rel.is_null()
            && (*(*rel).rd_rel).relnamespace == schema
            && CStr::from_ptr((*(*rel).rd_rel).relname.data.as_ptr()) == c"ledger"
        {
            return rel;
        }
        // The extension was dropped and created again since this backend last claimed.
        if !rel.is_null() {
            pg_sys::relation_close(rel, lock);
        }
        (schema, oid) = find_ledger();
    }
}

unsafe fn find_ledger() -> (pg_sys::Oid, pg_sys::Oid) {
    let schema = pg_sys::get_namespace_oid(c"idempotency".as_ptr(), false);
    let oid = pg_sys::get_relname_relid(c"ledger".as_ptr(), schema);
    if oid == pg_sys::InvalidOid {
        error!("idempotency: relation idempotency.ledger does not exist; reinstall the extension");
    }
    LEDGER_OIDS.set((schema, oid));
    (schema, oid)
}

/// The columns sql/schema.sql created, and no others still in use: a column a DBA added may
/// have a default that only an INSERT statement would fill in.
unsafe fn has_ledger_shape(rel: pg_sys::Relation) -> bool {
    let desc = &*(*rel).rd_att;
    let attr = |i: usize| &*desc.attrs.as_ptr().add(i);
    desc.natts as usize >= LEDGER_TYPES.len()
        && LEDGER_TYPES.iter().enumerate().all(|(i, &type_oid)| !attr(i).attisdropped && attr(i).atttypid == type_oid)
        && (LEDGER_TYPES.len()..desc.natts as usize).all(|i| attr(i).attisdropped)
}

/// New claims in a row after which this backend expects the next one to be new as well.
const CALM_CLAIMS: u32 = 16;

thread_local! {
    /// Consecutive new single claims of this backend, reset by every duplicate.
    static NEW_IN_A_ROW: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// While a consumer's claims keep being new, a claim skips the pre-check that only pays off
/// for duplicates; the first duplicate brings the pre-check back until the claims have been
/// new for a while again, so a replay of old messages never leaves more than one
/// backed-out insertion behind per CALM_CLAIMS new claims. Batches, which a redelivered
/// poll fills with duplicates, always pre-check.
fn duplicates_are_rare() -> bool {
    NEW_IN_A_ROW.get() >= CALM_CLAIMS
}

fn note_claim(new: bool) {
    NEW_IN_A_ROW.set(if new { NEW_IN_A_ROW.get().saturating_add(1) } else { 0 });
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Wait for a concurrent uncommitted claim to commit or roll back.
    Block,
    /// Raise 55P03 instead, so the consumer can requeue rather than hold a worker.
    NoWait,
}

/// What the ledger says about a key after a claim.
struct Claim {
    claimed: bool,
    claimed_at: Option<TimestampWithTimeZone>,
    result: Option<JsonB>,
}

/// One delivery's arguments to a claim.
struct Delivery<'a> {
    key: Option<&'a str>,
    scope: Option<&'a str>,
    payload: Option<JsonB>,
    sent_at: Option<TimestampWithTimeZone>,
}

fn claim(delivery: Delivery<'_>, wait: Wait, want_replay: bool) -> Result<Claim> {
    let Delivery { key, scope, payload, sent_at } = delivery;
    let key = parse_key(key, "key")?;
    let scope = Scope::parse(scope)?;
    let digest = scope.key_digest(key);
    let fingerprint = payload.as_ref().map(|p| fingerprint(&p.0));

    let args = [
        DatumWithOid::from(digest),
        DatumWithOid::from(scope.id),
        DatumWithOid::from(fingerprint),
    ];
    let insert = || match Ledger::open(Columns::Single) {
        Some(ledger) => {
            let inserted = ledger.claim(digest, scope.id, fingerprint, duplicates_are_rare());
            ledger.finish();
            note_claim(inserted);
            inserted
        }
        None => INSERT_CLAIM.run(&args, |t| t.len() == 1),
    };
    let inserted = match wait {
        Wait::Block => insert(),
        Wait::NoWait => insert_without_waiting(insert, key)?,
    };
    if inserted {
        if let Some(sent_at) = sent_at {
            check_late_replay(&scope, sent_at)?;
        }
        let claimed_at = want_replay.then(transaction_start);
        return Ok(Claim { claimed: true, claimed_at, result: None });
    }
    if fingerprint.is_none() && !want_replay {
        return Ok(Claim { claimed: false, claimed_at: None, result: None });
    }

    // A duplicate: read the first claim (INSERT first, then read; never the reverse).
    let first = READ_CLAIM.run(&[DatumWithOid::from(digest)], |t| {
        t.first().get_three::<TimestampWithTimeZone, Uuid, JsonB>().ok()
    });
    let Some((claimed_at, stored, result)) = first else {
        // Purged between our conflict and our read: still a duplicate, with nothing to replay.
        return Ok(Claim { claimed: false, claimed_at: None, result: None });
    };
    if let (Some(stored), Some(given)) = (stored, fingerprint) {
        if stored != given {
            let when = claimed_at.map(|t| t.to_string()).unwrap_or_default();
            return Err(IdemError::new(
                SqlState::PayloadMismatch,
                format!("key \"{}\" in scope \"{}\" was already claimed with a different payload", abbreviate(key), scope.name),
            )
            .detail(format!("The first claim was made at {when}; this payload's canonical fingerprint differs."))
            .hint("A producer reused a key for another message. Derive keys from the message's business identity."));
        }
    }
    Ok(Claim { claimed: false, claimed_at, result })
}

/// The claim with lock_timeout at its 1 ms minimum for the INSERT alone: PostgreSQL has no
/// NOWAIT for ON CONFLICT, and the wait for another transaction's uncommitted row is a lock
/// wait that lock_timeout ends.
fn insert_without_waiting(insert: impl Fn() -> bool + std::panic::RefUnwindSafe, key: &str) -> Result<bool> {
    struct Restore(i32);
    impl Drop for Restore {
        fn drop(&mut self) {
            unsafe { pg_sys::LockTimeout = self.0 };
        }
    }
    let _restore = Restore(unsafe { pg_sys::LockTimeout });
    unsafe { pg_sys::LockTimeout = 1 };
    PgTryBuilder::new(|| Ok(insert()))
        .catch_when(PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE, |_| {
            Err(IdemError::new(
                SqlState::LockNotAvailable,
                format!("could not claim key \"{}\" without waiting", abbreviate(key)),
            )
            .detail("Another transaction holds an uncommitted claim of this key (or a lock the claim needs) and has not committed or rolled back yet.")
            .hint("Requeue the message; if the other transaction commits its claim, the redelivery is a duplicate."))
        })
        .execute()
}

fn transaction_start() -> TimestampWithTimeZone {
    let ts = unsafe { pg_sys::GetCurrentTransactionStartTimestamp() };
    TimestampWithTimeZone::try_from(ts).expect("the transaction start is a valid timestamp")
}

/// Keys may be megabytes long; messages quote at most the first 64 characters.
fn abbreviate(key: &str) -> String {
    match key.char_indices().nth(64) {
        Some((end, _)) => format!("{}…", &key[..end]),
        None => key.to_string(),
    }
}

fn store_result(key: Option<&str>, result: Option<JsonB>, scope: Option<&str>) -> Result<()> {
    let key = parse_key(key, "key")?;
    let scope = Scope::parse(scope)?;
    let result = required(result, "result")?;
    let args = [DatumWithOid::from(scope.key_digest(key)), DatumWithOid::from(result)];
    if STORE_RESULT.run(&args, |t| t.len()) == 0 {
        return Err(IdemError::new(
            SqlState::NotClaimed,
            format!("key \"{}\" in scope \"{}\" has no claim to store a result for", abbreviate(key), scope.name),
        )
        .hint("Call idem_claim first, in the same transaction."));
    }
    Ok(())
}

fn claim_many(keys: Option<Array<'_, &str>>, scope: Option<&str>) -> Result<Vec<bool>> {
    let keys = required(keys, "keys")?;
    let scope = Scope::parse(scope)?;
    let mut digests = Vec::with_capacity(keys.len());
    for (i, key) in keys.iter().enumerate() {
        let key = parse_key(key, "key").map_err(|e| IdemError { message: format!("keys[{}]: {}", i + 1, e.message), ..e })?;
        digests.push(scope.key_digest(key));
    }
    // The first position of each distinct digest is the one that may report "new".
    let mut first_at: HashMap<[u8; 16], usize> = HashMap::with_capacity(digests.len());
    for (i, d) in digests.iter().enumerate() {
        first_at.entry(*d.as_bytes()).or_insert(i);
    }
    let mut distinct: Vec<[u8; 16]> = first_at.keys().copied().collect();
    if distinct.is_empty() {
        return Ok(Vec::new());
    }
    distinct.sort_unstable();
    let inserted: HashSet<[u8; 16]> = match Ledger::open(Columns::Batch) {
        Some(ledger) => {
            let new = distinct.iter().filter(|d| ledger.claim(Uuid::from_bytes(**d), scope.id, None, false)).copied().collect();
            ledger.finish();
            new
        }
        None => {
            let batch: Vec<Uuid> = distinct.iter().map(|d| Uuid::from_bytes(*d)).collect();
            INSERT_MANY.run(&[DatumWithOid::from(batch), DatumWithOid::from(scope.id)], |table| {
                table.filter_map(|row| row.get::<Uuid>(1).ok().flatten()).map(|d| *d.as_bytes()).collect()
            })
        }
    };
    Ok(digests
        .iter()
        .enumerate()
        .map(|(i, d)| first_at[d.as_bytes()] == i && inserted.contains(d.as_bytes()))
        .collect())
}

#[pg_extern(sql = false)]
fn idem_claim(
    key: Option<&str>,
    scope: Option<&str>,
    payload: Option<JsonB>,
    sent_at: Option<TimestampWithTimeZone>,
) -> Option<bool> {
    finish(claim(Delivery { key, scope, payload, sent_at }, Wait::Block, false).map(|c| c.claimed))
}
sqlstate_entry!(idem_claim_entry, pg_finfo_idem_claim_entry, idem_claim_wrapper);

#[pg_extern(sql = false)]
fn idem_claim_nowait(
    key: Option<&str>,
    scope: Option<&str>,
    payload: Option<JsonB>,
    sent_at: Option<TimestampWithTimeZone>,
) -> Option<bool> {
    finish(claim(Delivery { key, scope, payload, sent_at }, Wait::NoWait, false).map(|c| c.claimed))
}
sqlstate_entry!(idem_claim_nowait_entry, pg_finfo_idem_claim_nowait_entry, idem_claim_nowait_wrapper);

#[pg_extern(sql = false)]
fn idem_claim_replay(
    key: Option<&str>,
    scope: Option<&str>,
    payload: Option<JsonB>,
    sent_at: Option<TimestampWithTimeZone>,
) -> TableIterator<
    'static,
    (
        name!(claimed, Option<bool>),
        name!(first_claimed_at, Option<TimestampWithTimeZone>),
        name!(result, Option<JsonB>),
    ),
> {
    let row = finish(claim(Delivery { key, scope, payload, sent_at }, Wait::Block, true))
        .map(|c| (Some(c.claimed), c.claimed_at, c.result));
    TableIterator::new(row)
}
sqlstate_entry!(idem_claim_replay_entry, pg_finfo_idem_claim_replay_entry, idem_claim_replay_wrapper);

#[pg_extern(sql = false)]
fn idem_set_result(key: Option<&str>, result: Option<JsonB>, scope: Option<&str>) {
    finish(store_result(key, result, scope));
}
sqlstate_entry!(idem_set_result_entry, pg_finfo_idem_set_result_entry, idem_set_result_wrapper);

#[pg_extern(sql = false)]
fn idem_claim_many(keys: Option<Array<'_, &str>>, scope: Option<&str>) -> Option<Vec<bool>> {
    finish(claim_many(keys, scope))
}
sqlstate_entry!(idem_claim_many_entry, pg_finfo_idem_claim_many_entry, idem_claim_many_wrapper);

#[pg_extern(sql = false)]
fn idem_digest(key: Option<&str>, scope: Option<&str>) -> Option<Uuid> {
    finish(parse_key(key, "key").and_then(|k| Ok(Scope::parse(scope)?.key_digest(k))))
}
sqlstate_entry!(idem_digest_entry, pg_finfo_idem_digest_entry, idem_digest_wrapper);

#[pg_extern(sql = false)]
fn idem_scope_id(scope: Option<&str>) -> Option<i64> {
    finish(Scope::parse(scope).map(|s| s.id))
}
sqlstate_entry!(idem_scope_id_entry, pg_finfo_idem_scope_id_entry, idem_scope_id_wrapper);

#[pg_extern(sql = false)]
fn idem_fingerprint(payload: Option<JsonB>) -> Option<Uuid> {
    finish(required(payload, "payload").map(|p| fingerprint(&p.0)))
}
sqlstate_entry!(idem_fingerprint_entry, pg_finfo_idem_fingerprint_entry, idem_fingerprint_wrapper);
