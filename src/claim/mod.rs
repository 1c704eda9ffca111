//! The claim: one INSERT … ON CONFLICT DO NOTHING into the ledger, in the caller's
//! transaction. A duplicate is a conflict, never an error, so the transaction stays usable;
//! a concurrent uncommitted claim of the same key makes the INSERT wait for that
//! transaction's fate, which is exactly the answer a consumer needs.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};

use pgrx::datum::{DatumWithOid, TimestampWithTimeZone, Uuid};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::JsonB;

use crate::digest::{abbreviate, fingerprint, parse_key, Scope};
use crate::error::{finish, required, sqlstate_entry, IdemError, Result, SqlState};
use crate::postgres::spi::{Statement, StoredJsonb};
use crate::postgres::time;
use crate::postgres::write::{
    attnum, open_owned, ColumnDefault, DirectInsert, InsertPrivileges, PermissionCache, Shape,
};
use crate::retention::check_late_replay;

mod buckets;
mod filters;

pub use buckets::forget_layout;

pub fn define_settings() {
    buckets::define_settings();
    filters::define_settings();
}
use buckets::{Decision, Mode};

// The statements a claim stands for, and the reference the differential tester compares
// direct claims with: the columns a claim does not name keep their defaults.
static INSERT_CLAIM: Statement = Statement {
    sql: "INSERT INTO idempotency.ledger (key_digest, scope_id) VALUES ($1, $2) \
          ON CONFLICT (key_digest) DO NOTHING",
    args: &[pg_sys::UUIDOID, pg_sys::INT8OID],
};

static INSERT_CLAIM_WITH_FINGERPRINT: Statement = Statement {
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

/// The ledger opened for claims without SPI (see [`crate::postgres::write`]). The SPI
/// statements above stay the way in whenever the ledger is not exactly as sql/schema.sql
/// made it: row-level security for tenants, an audit trigger, a rule, an extra column, a
/// changed default, no unique index on key_digest.
struct Ledger(DirectInsert);

const KEY_DIGEST: usize = 0;
const SCOPE_ID: usize = 1;
const CLAIMED_AT: usize = 2;
const FINGERPRINT: usize = 3;

/// The ledger's columns, in table order, and claimed_at's default, as sql/schema.sql creates them.
static LEDGER_SHAPE: Shape = Shape {
    columns: &[
        (c"key_digest", pg_sys::UUIDOID),
        (c"scope_id", pg_sys::INT8OID),
        (c"claimed_at", pg_sys::TIMESTAMPTZOID),
        (c"fingerprint", pg_sys::UUIDOID),
        (c"result", pg_sys::JSONBOID),
    ],
    defaults: &[(attnum(CLAIMED_AT), ColumnDefault::Now)],
};

/// The columns a claim names in its INSERT, and so needs INSERT privilege on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Columns {
    /// key_digest, scope_id: a claim without a payload, and every batch.
    Key = 0,
    /// key_digest, scope_id, fingerprint: a claim with a payload.
    KeyAndFingerprint = 1,
}

/// Both kinds of claim, by [`Columns`], as `INSERT … ON CONFLICT (key_digest)`.
const CLAIM_PRIVILEGES: [InsertPrivileges; 2] = [
    InsertPrivileges { inserted: &[attnum(KEY_DIGEST), attnum(SCOPE_ID)], arbiter: &[attnum(KEY_DIGEST)] },
    InsertPrivileges {
        inserted: &[attnum(KEY_DIGEST), attnum(SCOPE_ID), attnum(FINGERPRINT)],
        arbiter: &[attnum(KEY_DIGEST)],
    },
];

/// The ledger, with RowExclusiveLock, once the caller may use its schema.
///
/// # Safety
/// The caller closes it.
pub(super) unsafe fn open_ledger() -> Result<pg_sys::Relation> {
    Ok(LEDGER_OIDS.with(|oids| open_owned(c"idempotency", c"ledger", oids))?)
}

/// A bucket with RowExclusiveLock, or null if it was dropped meanwhile.
///
/// # Safety
/// The caller closes it.
unsafe fn open_bucket(bucket: pg_sys::Oid) -> Result<pg_sys::Relation> {
    Ok(crate::postgres::catch(|| {
        crate::postgres::ffi::try_relation_open(bucket, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE)
    })?)
}

/// The checks the INSERT into the ledger makes before it writes (a read-only transaction,
/// the role's privileges), for a claim the statement on its bucket writes, as the bucket's
/// owner: the role needs the ledger's privileges, as for any claim, and none on the bucket.
fn check_ledger_privileges(columns: Columns) -> Result<()> {
    // SAFETY: the ledger is open between the two calls; closing it keeps its lock.
    unsafe {
        let rel = open_ledger()?;
        let checked = LEDGER_PERMISSIONS
            .with(|cache| cache.with((*rel).rd_id, &CLAIM_PRIVILEGES, columns as usize, |p| p.check(rel)));
        pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        Ok(checked?)
    }
}

thread_local! {
    /// The OIDs of schema idempotency and of its ledger (see [`open_owned`]).
    pub(super) static LEDGER_OIDS: Cell<(pg_sys::Oid, pg_sys::Oid)> = const { Cell::new((pg_sys::InvalidOid, pg_sys::InvalidOid)) };
    static LEDGER_PERMISSIONS: PermissionCache = const { PermissionCache::new() };
}

impl Ledger {
    /// Opens the ledger for claims that write `columns`, after the same privilege checks the
    /// INSERT would get; None when the claim must go through SPI instead. With a bucket, the
    /// rows go into it, checked as the INSERT into the ledger is: the bucket is where the
    /// ledger keeps them.
    fn open(columns: Columns, bucket: Option<&buckets::Bucket>) -> Result<Option<Ledger>> {
        // SAFETY: the relation stays open until finish(), or until an error's abort.
        unsafe {
            let (ledger, rel) = match bucket {
                // The claim opened the ledger to choose the bucket, with the schema's checks;
                // the ledger's privileges are checked below by its OID.
                Some(bucket) => (bucket.ledger, open_bucket(bucket.relid)?),
                None => {
                    let rel = open_ledger()?;
                    ((*rel).rd_id, rel)
                }
            };
            if rel.is_null() {
                return Ok(None);
            }
            let insert = LEDGER_PERMISSIONS.with(|cache| {
                cache.with(ledger, &CLAIM_PRIVILEGES, columns as usize, |p| {
                    DirectInsert::open(rel, &LEDGER_SHAPE, p, &[attnum(KEY_DIGEST)])
                })
            })?;
            Ok(insert.map(Ledger))
        }
    }

    /// Inserts the claim unless (scope, key) is already claimed; true when inserted, None
    /// where the statement must decide ([`crate::postgres::write::Insert::ToStatement`]).
    fn claim(&self, digest: Uuid, scope_id: i64, fingerprint: Option<Uuid>) -> Result<Option<bool>> {
        let inserted = self.0.insert(|values, nulls| {
            (values[KEY_DIGEST], nulls[KEY_DIGEST]) = (digest.into_datum().expect("a uuid datum"), false);
            (values[SCOPE_ID], nulls[SCOPE_ID]) = (pg_sys::Datum::from(scope_id), false);
            if let Some(fingerprint) = fingerprint {
                (values[FINGERPRINT], nulls[FINGERPRINT]) = (fingerprint.into_datum().expect("a uuid datum"), false);
            }
        })?;
        Ok(inserted.decided())
    }

    fn finish(self) -> Result<()> {
        Ok(self.0.finish()?)
    }
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
    result: Option<StoredJsonb>,
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

    // Whether the claim went in directly: only then is claimed_at known to be now(), the
    // default the direct path requires.
    let direct = Cell::new(false);
    let insert_into = |bucket: Option<&buckets::Bucket>| {
        let (inserted, directly) = insert_claim(bucket, digest, scope.id, fingerprint)?;
        direct.set(directly);
        Ok::<bool, IdemError>(inserted)
    };
    let insert = || -> Result<bool> {
        match buckets::mode()? {
            Mode::Single => {
                let inserted = insert_into(None)?;
                if inserted {
                    buckets::recheck(&[digest])?;
                }
                Ok(inserted)
            }
            Mode::Buckets(ledger) => match ledger.decide(digest, scope.id)? {
                Decision::Duplicate => Ok(false),
                Decision::Insert(place) => {
                    let inserted = insert_into(place.bucket.as_ref())?;
                    place.release()?;
                    Ok(inserted)
                }
            },
        }
    };
    let inserted = match wait {
        Wait::Block => insert()?,
        Wait::NoWait => insert_without_waiting(insert, key)?,
    };
    if inserted {
        if let Some(sent_at) = sent_at {
            check_late_replay(&scope, sent_at)?;
        }
        crate::outbox::claimed(digest);
        // A DBA's own default for claimed_at (see "Extending the ledger") is what duplicates
        // will be told, so the first delivery is told the same: it is read back.
        let claimed_at = match (want_replay, direct.get()) {
            (false, _) => None,
            (true, true) => Some(
                TimestampWithTimeZone::try_from(time::transaction_start())
                    .expect("the transaction start is a valid timestamp"),
            ),
            (true, false) => READ_CLAIM
                .run(&[DatumWithOid::from(digest)], |rows| {
                    (!rows.is_empty()).then(|| rows.get::<TimestampWithTimeZone>(0, 1))
                })?
                .flatten(),
        };
        return Ok(Claim { claimed: true, claimed_at, result: None });
    }
    crate::diagnostics::duplicates(&scope, || vec![digest])?;
    if fingerprint.is_none() && !want_replay {
        return Ok(Claim { claimed: false, claimed_at: None, result: None });
    }

    // A duplicate: read the first claim (INSERT first, then read; never the reverse).
    let first = READ_CLAIM.run(&[DatumWithOid::from(digest)], |rows| {
        (!rows.is_empty())
            .then(|| (rows.get::<TimestampWithTimeZone>(0, 1), rows.get::<Uuid>(0, 2), rows.get_jsonb(0, 3)))
    })?;
    let Some((claimed_at, stored, result)) = first else {
        // Purged between our conflict and our read: still a duplicate, with nothing to replay.
        return Ok(Claim { claimed: false, claimed_at: None, result: None });
    };
    if let (Some(stored), Some(given)) = (stored, fingerprint) {
        if stored != given {
            let when = claimed_at.map(|t| t.to_string()).unwrap_or_default();
            return Err(IdemError::new(
                SqlState::PayloadMismatch,
                format!(
                    "key \"{}\" in scope \"{}\" was already claimed with a different payload",
                    abbreviate(key),
                    abbreviate(scope.name)
                ),
            )
            .detail(format!("The first claim was made at {when}; this payload's canonical fingerprint differs."))
            .hint("A producer reused a key for another message. Derive keys from the message's business identity."));
        }
    }
    Ok(Claim { claimed: false, claimed_at, result })
}

/// Inserts a claim into `bucket`, or the ledger itself: directly where it may, else by the
/// statement. Whether it went in, and whether directly.
fn insert_claim(
    bucket: Option<&buckets::Bucket>,
    digest: Uuid,
    scope_id: i64,
    fingerprint: Option<Uuid>,
) -> Result<(bool, bool)> {
    let columns = if fingerprint.is_some() { Columns::KeyAndFingerprint } else { Columns::Key };
    if let Some(ledger) = Ledger::open(columns, bucket)? {
        let inserted = ledger.claim(digest, scope_id, fingerprint)?;
        ledger.finish()?;
        if let Some(inserted) = inserted {
            return Ok((inserted, true));
        }
    }
    let mut args = vec![DatumWithOid::from(digest), DatumWithOid::from(scope_id)];
    args.extend(fingerprint.map(DatumWithOid::from));
    if let Some(bucket) = bucket {
        check_ledger_privileges(columns)?;
        if let Some(inserted) = bucket.insert(columns == Columns::KeyAndFingerprint, &args)? {
            return Ok((inserted, false));
        }
    }
    // Into the ledger itself: without buckets, or where its bucket was dropped since the
    // claim chose it (still under the key's lock, after the same search).
    let inserted = match fingerprint {
        Some(_) => INSERT_CLAIM_WITH_FINGERPRINT.run(&args, |rows| rows.len() == 1)?,
        None => INSERT_CLAIM.run(&args, |rows| rows.len() == 1)?,
    };
    Ok((inserted, false))
}

/// The claim with lock_timeout at its 1 ms minimum for the INSERT alone: PostgreSQL has no
/// NOWAIT for ON CONFLICT, and the wait for another transaction's uncommitted row is a lock
/// wait that lock_timeout ends.
fn insert_without_waiting(insert: impl Fn() -> Result<bool>, key: &str) -> Result<bool> {
    struct Restore(i32);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: a backend-local setting, restored to what it was.
            unsafe { pg_sys::LockTimeout = self.0 };
        }
    }
    // SAFETY: as above.
    let _restore = Restore(unsafe { pg_sys::LockTimeout });
    unsafe { pg_sys::LockTimeout = 1 };
    match insert() {
        Err(IdemError::Postgres(e)) if e.sqlerrcode() == PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE as i32 => Err(IdemError::new(
            SqlState::LockNotAvailable,
            format!("could not claim key \"{}\" without waiting", abbreviate(key)),
        )
        .detail("Another transaction holds an uncommitted claim of this key (or a lock the claim needs) and has not committed or rolled back yet.")
        .hint("Requeue the message; if the other transaction commits its claim, the redelivery is a duplicate.")),
        other => other,
    }
}

fn store_result(key: Option<&str>, result: Option<JsonB>, scope: Option<&str>) -> Result<()> {
    let key = parse_key(key, "key")?;
    let scope = Scope::parse(scope)?;
    let result = required(result, "result")?;
    let args = [DatumWithOid::from(scope.key_digest(key)), DatumWithOid::from(result)];
    if STORE_RESULT.run(&args, |rows| rows.len())? == 0 {
        return Err(IdemError::new(
            SqlState::NotClaimed,
            format!(
                "key \"{}\" in scope \"{}\" has no claim to store a result for",
                abbreviate(key),
                abbreviate(scope.name)
            ),
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
        let key = parse_key(key, "key").map_err(|e| e.within(&format!("keys[{}]", i + 1)))?;
        digests.push(scope.key_digest(key));
    }
    // The first position of each distinct digest is the one that may report "new".
    let mut first_at: HashMap<[u8; 16], usize> = HashMap::with_capacity(digests.len());
    for (i, d) in digests.iter().enumerate() {
        first_at.entry(*d.as_bytes()).or_insert(i);
    }
    let mut distinct: Vec<[u8; 16]> = first_at.keys().copied().collect();
    if distinct.is_empty() {
        // The statement of no rows still checks what any INSERT does (privileges, a
        // read-only transaction); the direct path checks them only on its way to a row.
        INSERT_MANY.run(&[DatumWithOid::from(Vec::<Uuid>::new()), DatumWithOid::from(scope.id)], |_| ())?;
        return Ok(Vec::new());
    }
    distinct.sort_unstable();
    let mut inserted: HashSet<[u8; 16]> = HashSet::with_capacity(distinct.len());
    if let Mode::Buckets(ledger) = buckets::mode()? {
        // One decision per key, in digest order.
        for d in &distinct {
            let digest = Uuid::from_bytes(*d);
            let Decision::Insert(place) = ledger.decide(digest, scope.id)? else { continue };
            let (new, _) = insert_claim(place.bucket.as_ref(), digest, scope.id, None)?;
            place.release()?;
            if new {
                inserted.insert(*d);
            }
        }
        return report_many(&scope, &digests, &first_at, &inserted);
    }
    // Directly while the ledger allows it; the statement takes the rest from the first digest
    // the direct path leaves to it, or all of them.
    let mut rest = &distinct[..];
    if let Some(ledger) = Ledger::open(Columns::Key, None)? {
        while let Some((d, after)) = rest.split_first() {
            match ledger.claim(Uuid::from_bytes(*d), scope.id, None)? {
                Some(new) => {
                    if new {
                        inserted.insert(*d);
                    }
                    rest = after;
                }
                None => break,
            }
        }
        ledger.finish()?;
    }
    if !rest.is_empty() {
        let batch: Vec<Uuid> = rest.iter().map(|d| Uuid::from_bytes(*d)).collect();
        INSERT_MANY.run(&[DatumWithOid::from(batch), DatumWithOid::from(scope.id)], |rows| {
            inserted.extend((0..rows.len()).filter_map(|i| rows.get::<Uuid>(i, 1)).map(|d| *d.as_bytes()))
        })?;
    }
    let new: Vec<Uuid> = inserted.iter().map(|d| Uuid::from_bytes(*d)).collect();
    buckets::recheck(&new)?;
    report_many(&scope, &digests, &first_at, &inserted)
}

/// Each key's answer, "new" only at the first position of a digest that went in; and the
/// duplicates recorded for diagnostics.
fn report_many(
    scope: &Scope<'_>,
    digests: &[Uuid],
    first_at: &HashMap<[u8; 16], usize>,
    inserted: &HashSet<[u8; 16]>,
) -> Result<Vec<bool>> {
    let claimed: Vec<bool> = digests
        .iter()
        .enumerate()
        .map(|(i, d)| first_at[d.as_bytes()] == i && inserted.contains(d.as_bytes()))
        .collect();
    crate::diagnostics::duplicates(scope, || {
        digests.iter().zip(&claimed).filter(|(_, new)| !**new).map(|(d, _)| *d).collect()
    })?;
    Ok(claimed)
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
sqlstate_entry!(
    idem_claim_entry,
    pg_finfo_idem_claim_entry,
    idem_claim_wrapper,
    checks = [crate::error::Check::Jsonb(2, "payload")]
);

#[pg_extern(sql = false)]
fn idem_claim_nowait(
    key: Option<&str>,
    scope: Option<&str>,
    payload: Option<JsonB>,
    sent_at: Option<TimestampWithTimeZone>,
) -> Option<bool> {
    finish(claim(Delivery { key, scope, payload, sent_at }, Wait::NoWait, false).map(|c| c.claimed))
}
sqlstate_entry!(
    idem_claim_nowait_entry,
    pg_finfo_idem_claim_nowait_entry,
    idem_claim_nowait_wrapper,
    checks = [crate::error::Check::Jsonb(2, "payload")]
);

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
        name!(result, Option<StoredJsonb>),
    ),
> {
    let row = finish(claim(Delivery { key, scope, payload, sent_at }, Wait::Block, true))
        .map(|c| (Some(c.claimed), c.claimed_at, c.result));
    TableIterator::new(row)
}
sqlstate_entry!(
    idem_claim_replay_entry,
    pg_finfo_idem_claim_replay_entry,
    idem_claim_replay_wrapper,
    checks = [crate::error::Check::Jsonb(2, "payload")]
);

#[pg_extern(sql = false)]
fn idem_set_result(key: Option<&str>, result: Option<JsonB>, scope: Option<&str>) {
    finish(store_result(key, result, scope));
}
sqlstate_entry!(
    idem_set_result_entry,
    pg_finfo_idem_set_result_entry,
    idem_set_result_wrapper,
    checks = [crate::error::Check::Jsonb(1, "result")]
);

#[pg_extern(sql = false)]
fn idem_claim_many(keys: Option<Array<'_, &str>>, scope: Option<&str>) -> Option<Vec<bool>> {
    finish(claim_many(keys, scope))
}
sqlstate_entry!(
    idem_claim_many_entry,
    pg_finfo_idem_claim_many_entry,
    idem_claim_many_wrapper,
    checks = [crate::error::Check::OneBasedList(0, "keys")]
);

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
sqlstate_entry!(
    idem_fingerprint_entry,
    pg_finfo_idem_fingerprint_entry,
    idem_fingerprint_wrapper,
    checks = [crate::error::Check::Jsonb(0, "payload")]
);
