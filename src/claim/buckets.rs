//! The ledger's buckets (#13, docs/ledger-layout.md): tables that inherit from
//! idempotency.ledger, each holding the claims of one lane (one retention) made by
//! transactions that started within its time range. New claims write only the current
//! bucket's small index, and the purge drops a bucket whole once its claims have expired.
//!
//! No index spans the buckets, so once the ledger has any, a claim is one decision under the
//! key's lock ([`crate::postgres::unique`]): every table is searched for the key, and the
//! claim inserts into its bucket only where none holds it. A claim that found the ledger
//! without buckets inserts into the ledger itself without the lock, and looks again
//! afterwards: a bucket made meanwhile may hold the key from a claimer that could not see
//! this one's row ([`recheck`]).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use pgrx::datum::{DatumWithOid, Interval, TimestampWithTimeZone, Uuid};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

use crate::error::{finish, required, sqlstate_entry, Result};
use crate::postgres::spi::{self, Kept, Statement};
use crate::postgres::unique::{self, KeyLock, Seen};

use super::filters;
use crate::postgres::{catch, ffi, relcache, role, time};

// Every child of the ledger, with its place if it is one of the buckets.
static CHILDREN: Statement = Statement {
    sql: "SELECT i.inhrelid, b.lane, b.starts_at, b.ends_at, c.relname::pg_catalog.text, b.sealed_at, c.relfilenode \
          FROM pg_catalog.pg_inherits AS i \
          JOIN pg_catalog.pg_class AS c ON c.oid OPERATOR(pg_catalog.=) i.inhrelid \
          LEFT JOIN idempotency.ledger_buckets AS b \
            ON b.bucket OPERATOR(pg_catalog.=) c.relname AND c.relnamespace OPERATOR(pg_catalog.=) $2 \
          WHERE i.inhparent OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::OIDOID, pg_sys::OIDOID],
};

static LANE: Statement = Statement {
    sql: "SELECT s.retention FROM idempotency.scopes AS s WHERE s.scope_id OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::INT8OID],
};

// Buckets are made once the ledger holds `idempotency.ledger_buckets_from` claims (0: always),
// and from then on.
static MAINTAIN: Statement = Statement {
    sql: "SELECT m.created, m.dropped, m.dropped_claims FROM idempotency.maintain_ledger_buckets_as_owner( \
            $1 OPERATOR(pg_catalog.=) 0 \
            OR EXISTS (SELECT FROM idempotency.ledger_buckets) \
            OR (SELECT c.reltuples FROM pg_catalog.pg_class AS c WHERE c.oid OPERATOR(pg_catalog.=) $2) \
               OPERATOR(pg_catalog.>=) $1, \
            idempotency.longest_default_retention()) AS m",
    args: &[pg_sys::INT4OID, pg_sys::OIDOID],
};

/// `idempotency.ledger_buckets_from`: below this many claims one table serves as well, its
/// index small enough to stay in memory, and claims need not search several tables.
pub static BUCKETS_FROM: GucSetting<i32> = GucSetting::<i32>::new(1_000_000);

pub fn define_settings() {
    GucRegistry::define_int_guc(
        c"idempotency.ledger_buckets_from",
        c"How many claims the ledger holds before idem_purge starts keeping new ones in time buckets.",
        c"0 keeps them in buckets from the first purge on. Buckets, once made, stay in use.",
        &BUCKETS_FROM,
        0,
        i32::MAX,
        GucContext::Suset,
        GucFlags::default(),
    );
}

/// A lane: a retention compared as PostgreSQL compares intervals (a month as 30 days, a day
/// as 24 hours), or None for undeclared scopes.
type Lane = Option<i128>;

fn lane_of(retention: Option<Interval>) -> Lane {
    retention.map(|r| (i128::from(r.months()) * 30 + i128::from(r.days())) * 86_400_000_000 + i128::from(r.micros()))
}

/// A bucket of the layout: its lane, and the transactions' starts its claims come from.
struct Placed {
    relid: pg_sys::Oid,
    name: String,
    lane: Lane,
    starts_at: pg_sys::TimestampTz,
    ends_at: pg_sys::TimestampTz,
    /// When the purge sealed it (no new key can enter it since, so a filter of its keys
    /// stands for it), and the relfilenode its rows were in then.
    sealed: Option<Sealed>,
}

/// What a backend knows of the layout, until the ledger's next relcache invalidation (a new
/// or dropped bucket, a scope's changed retention: idempotency.ledger_layout_changed) or a
/// bucket's.
struct Layout {
    ledger: pg_sys::Oid,
    /// Every child of the ledger, as pg_inherits lists them, with its seal if it is a sealed
    /// bucket: each is searched, whether or not it is a bucket of ours.
    children: Vec<Table>,
    buckets: Vec<Placed>,
    lanes: HashMap<i64, Lane>,
    /// The INSERT statement on a bucket, without and with a fingerprint.
    statements: HashMap<(pg_sys::Oid, bool), Rc<Kept>>,
}

thread_local! {
    static LAYOUT: RefCell<Option<Layout>> = const { RefCell::new(None) };
    /// Whether the ledger of this OID keeps its claims ([`Opened::keeps_claims`]), until its
    /// relcache entry is invalidated: what decides it (a trigger, a rule, row-level security,
    /// an index) changes only with one.
    static KEEPS_CLAIMS: Cell<Option<(pg_sys::Oid, bool)>> = const { Cell::new(None) };
}

/// Forgets the layout when the ledger's relcache entry, a child's, or every one is
/// invalidated.
pub fn forget_layout(relid: pg_sys::Oid) {
    if relid == pg_sys::InvalidOid || KEEPS_CLAIMS.with(Cell::get).is_some_and(|(ledger, _)| ledger == relid) {
        KEEPS_CLAIMS.with(|k| k.set(None));
    }
    let forgotten = LAYOUT.with(|layout| {
        let mut layout = layout.borrow_mut();
        if relid == pg_sys::InvalidOid
            || layout.as_ref().is_some_and(|l| l.ledger == relid || l.children.iter().any(|&(child, _)| child == relid))
        {
            layout.take()
        } else {
            None
        }
    });
    // Its plans are freed once the layout is no longer borrowed.
    drop(forgotten);
}

/// The ledger as a claim opens it (RowExclusiveLock).
struct Opened {
    oid: pg_sys::Oid,
    owner: pg_sys::Oid,
    /// Whether it has (or had) children.
    has_children: bool,
    /// Whether a claim must be the statement on the ledger itself: a trigger, a rule or a
    /// row-level security policy applies only to statements on it, not on its buckets; and
    /// without a unique index on key_digest the statement raises the error a claim gets.
    keeps_claims: bool,
}

fn ledger() -> Result<Opened> {
    // SAFETY: the relation is open between the calls; closing it keeps its lock.
    unsafe {
        let rel = super::open_ledger()?;
        let class = &*(*rel).rd_rel;
        let mut opened = Opened {
            oid: (*rel).rd_id,
            owner: class.relowner,
            has_children: class.relhassubclass,
            keeps_claims: false,
        };
        if let Some((_, keeps_claims)) = KEEPS_CLAIMS.with(Cell::get).filter(|&(ledger, _)| ledger == opened.oid) {
            opened.keeps_claims = keeps_claims;
        } else if opened.has_children {
            opened.keeps_claims = catch(|| {
                let searchable = {
                    let index = unique::open_key_index(rel, c"key_digest");
                    if !index.is_null() {
                        ffi::index_close(index, pg_sys::NoLock as pg_sys::LOCKMODE);
                    }
                    !index.is_null()
                };
                !(*rel).trigdesc.is_null() || !(*rel).rd_rules.is_null() || class.relrowsecurity || !searchable
            })?;
            KEEPS_CLAIMS.with(|k| k.set(Some((opened.oid, opened.keeps_claims))));
        }
        pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        Ok(opened)
    }
}

fn load(ledger: pg_sys::Oid, owner: pg_sys::Oid) -> Result<Layout> {
    // SAFETY: reads the relation's schema from the syscache.
    let schema = unsafe { ffi::get_rel_namespace(ledger) };
    // As the owner, and with the newest snapshot: a bucket another claimer inserts into must
    // be known here whatever this transaction's snapshot.
    let rows = role::as_user(owner, || {
        CHILDREN.run_latest(&[DatumWithOid::from(ledger), DatumWithOid::from(schema)], |rows| {
            (0..rows.len())
                .map(|i| {
                    (
                        rows.get::<pg_sys::Oid>(i, 1).unwrap_or(pg_sys::InvalidOid),
                        rows.get::<Interval>(i, 2),
                        rows.get::<TimestampWithTimeZone>(i, 3),
                        rows.get::<TimestampWithTimeZone>(i, 4),
                        rows.get::<String>(i, 5).unwrap_or_default(),
                        rows.get::<TimestampWithTimeZone>(i, 6),
                        rows.get::<pg_sys::Oid>(i, 7).unwrap_or(pg_sys::InvalidOid),
                    )
                })
                .collect::<Vec<_>>()
        })
    })?;
    let children: Vec<pg_sys::Oid> = rows.iter().map(|row| row.0).collect();
    let buckets: Vec<Placed> = rows
        .into_iter()
        .filter_map(|(relid, lane, starts_at, ends_at, name, sealed_at, relfilenode)| {
            Some(Placed {
                relid,
                name,
                lane: lane_of(lane),
                starts_at: starts_at?.into_inner(),
                ends_at: ends_at?.into_inner(),
                sealed: sealed_at.map(|at| Sealed { at: at.into_inner(), relfilenode }),
            })
        })
        .collect();
    let seals: HashMap<pg_sys::Oid, Sealed> = buckets.iter().filter_map(|b| Some((b.relid, b.sealed?))).collect();
    filters::keep_only(|relid| seals.contains_key(&relid));
    let children = children.into_iter().map(|relid| (relid, seals.get(&relid).copied())).collect();
    Ok(Layout { ledger, children, buckets, lanes: HashMap::new(), statements: HashMap::new() })
}

/// Runs `with` on the layout, loading it first if it was forgotten. What was read while an
/// invalidation came in is used once and not kept ([`relcache::generation`]).
fn with_layout<R>(ledger: pg_sys::Oid, owner: pg_sys::Oid, with: impl FnOnce(&mut Layout) -> Result<R>) -> Result<R> {
    let before = relcache::generation();
    let cached = LAYOUT.with(|l| l.borrow_mut().take());
    let mut layout = match cached {
        Some(layout) if layout.ledger == ledger => layout,
        _ => load(ledger, owner)?,
    };
    let result = with(&mut layout)?;
    if relcache::generation() == before {
        LAYOUT.with(|l| *l.borrow_mut() = Some(layout));
    }
    Ok(result)
}

impl Layout {
    /// The bucket a claim of scope `scope_id` made now inserts into, if there is one.
    fn bucket_for(&mut self, scope_id: i64, owner: pg_sys::Oid) -> Result<Option<pg_sys::Oid>> {
        if self.buckets.is_empty() {
            return Ok(None);
        }
        let lane = match self.lanes.get(&scope_id) {
            Some(lane) => *lane,
            None => {
                let retention = role::as_user(owner, || {
                    LANE.run_latest(&[DatumWithOid::from(scope_id)], |rows| {
                        (!rows.is_empty()).then(|| rows.get::<Interval>(0, 1)).flatten()
                    })
                })?;
                let lane = lane_of(retention);
                self.lanes.insert(scope_id, lane);
                lane
            }
        };
        let started = time::transaction_start();
        Ok(self
            .buckets
            .iter()
            .find(|b| b.lane == lane && b.starts_at <= started && started < b.ends_at)
            .map(|b| b.relid))
    }

    /// The claim's INSERT on bucket `relid`, prepared once per layout; None once the bucket is
    /// gone from it (dropped since the claim chose it: its claims had all expired).
    fn statement(&mut self, relid: pg_sys::Oid, with_fingerprint: bool) -> Result<Option<Rc<Kept>>> {
        if let Some(kept) = self.statements.get(&(relid, with_fingerprint)) {
            return Ok(Some(kept.clone()));
        }
        let Some(bucket) = self.buckets.iter().find(|b| b.relid == relid) else { return Ok(None) };
        let name = &bucket.name;
        let quoted = name.replace('"', "\"\"");
        let sql = if with_fingerprint {
            format!(
                "INSERT INTO idempotency.\"{quoted}\" (key_digest, scope_id, fingerprint) VALUES ($1, $2, $3) \
                 ON CONFLICT (key_digest) DO NOTHING"
            )
        } else {
            format!(
                "INSERT INTO idempotency.\"{quoted}\" (key_digest, scope_id) VALUES ($1, $2) \
                 ON CONFLICT (key_digest) DO NOTHING"
            )
        };
        let args: &[pg_sys::Oid] = if with_fingerprint {
            &[pg_sys::UUIDOID, pg_sys::INT8OID, pg_sys::UUIDOID]
        } else {
            &[pg_sys::UUIDOID, pg_sys::INT8OID]
        };
        let kept = Rc::new(spi::prepare(&sql, args)?);
        self.statements.insert((relid, with_fingerprint), kept.clone());
        Ok(Some(kept))
    }
}

/// The bucket a claim inserts into.
pub struct Bucket {
    pub relid: pg_sys::Oid,
    pub ledger: pg_sys::Oid,
    owner: pg_sys::Oid,
}

impl Bucket {
    /// The claim's `INSERT … ON CONFLICT (key_digest) DO NOTHING` on the bucket, run as its
    /// owner (the caller checked the role's privileges on the ledger): whether it inserted, or
    /// None when the bucket is gone.
    pub fn insert(&self, with_fingerprint: bool, args: &[DatumWithOid<'_>]) -> Result<Option<bool>> {
        let kept = with_layout(self.ledger, self.owner, |layout| layout.statement(self.relid, with_fingerprint))?;
        let Some(kept) = kept else { return Ok(None) };
        Ok(Some(role::as_user(self.owner, || spi::execute(&kept, args, |rows| rows.len() == 1))?))
    }
}

/// The ledger as a claim finds it.
pub enum Mode {
    /// No buckets: claims insert into the ledger itself, its unique index decides, and
    /// [`recheck`] covers a bucket made meanwhile.
    Single,
    /// Buckets: each claim decides under its key's lock ([`Buckets::decide`]).
    Buckets(Buckets),
}

pub struct Buckets {
    ledger: Opened,
}

/// Whether the ledger has buckets (or other children, which are searched all the same).
pub fn mode() -> Result<Mode> {
    if known_without_children()? {
        return Ok(Mode::Single);
    }
    let ledger = ledger()?;
    Ok(if ledger.has_children { Mode::Buckets(Buckets { ledger }) } else { Mode::Single })
}

/// Whether the ledger this backend opened before is still it and has no child, as the catalog
/// says once every invalidation committed so far is in: most ledgers never have buckets, and
/// their claims must not pay for opening it twice. False when unknown.
fn known_without_children() -> Result<bool> {
    Ok(known_ledger()?.is_some_and(|(_, has_children)| !has_children))
}

/// The ledger this backend opened before, if the catalog still names it idempotency.ledger
/// once every invalidation committed so far is in, and whether it has children: a syscache
/// lookup, where opening it again would also check the schema's privileges.
fn known_ledger() -> Result<Option<(pg_sys::Oid, bool)>> {
    let (schema, ledger) = super::LEDGER_OIDS.with(std::cell::Cell::get);
    if ledger == pg_sys::InvalidOid {
        return Ok(None);
    }
    // SAFETY: a syscache lookup, released at once; its fields are read before.
    Ok(unsafe {
        catch(|| {
            ffi::AcceptInvalidationMessages();
            let tuple = ffi::SearchSysCache1(pg_sys::SysCacheIdentifier::RELOID as i32, pg_sys::Datum::from(ledger));
            if tuple.is_null() {
                return None;
            }
            let class = &*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_class>(tuple);
            let same =
                class.relnamespace == schema && std::ffi::CStr::from_ptr(class.relname.data.as_ptr()) == c"ledger";
            let has_children = class.relhassubclass;
            ffi::ReleaseSysCache(tuple);
            same.then_some((ledger, has_children))
        })?
    })
}

/// Where a claim inserts, under its key's lock until [`Place::release`].
pub struct Place {
    /// The bucket to insert into; None for the ledger itself.
    pub bucket: Option<Bucket>,
    lock: KeyLock,
}

impl Place {
    /// The insert is done: later claimers of the key will find its row.
    pub fn release(self) -> Result<()> {
        Ok(self.lock.release()?)
    }
}

/// What a claim is to do.
pub enum Decision {
    /// Some table already holds the key.
    Duplicate,
    Insert(Place),
}

impl Buckets {
    /// Decides a claim of `digest` in scope `scope_id`: a duplicate, or where to insert it.
    /// Waits for a claimer of the key still in progress, outside the lock, as ON CONFLICT
    /// waits; a row this transaction's snapshot cannot see is ON CONFLICT's 40001. Where
    /// the ledger keeps its claims itself, the search leaves it to the statement on it.
    pub fn decide(&self, digest: Uuid, scope_id: i64) -> Result<Decision> {
        let Opened { oid: ledger, owner, keeps_claims, .. } = self.ledger;
        loop {
            let lock = KeyLock::take(ledger, digest.as_bytes())?;
            // The search runs outside the layout: opening a table takes in every invalidation,
            // and one of any table would make the layout be read again.
            let (tables, bucket) = with_layout(ledger, owner, |layout| {
                let bucket = if keeps_claims { None } else { layout.bucket_for(scope_id, owner)? };
                // The ledger first: before the migration ends, most claims are still there.
                let ledger_searched = (!keeps_claims).then_some((ledger, None));
                Ok((ledger_searched.into_iter().chain(layout.children.iter().copied()).collect::<Vec<Table>>(), bucket))
            })?;
            match search(&tables, digest)? {
                Seen::Absent => {
                    let bucket = bucket.map(|relid| Bucket { relid, ledger, owner });
                    return Ok(Decision::Insert(Place { bucket, lock }));
                }
                Seen::Duplicate => {
                    lock.release()?;
                    return Ok(Decision::Duplicate);
                }
                Seen::Invisible => return Err(unique::serialization_failure().into()),
                Seen::Busy(busy) => {
                    lock.release()?;
                    busy.wait()?;
                }
            }
        }
    }
}

/// A sealed bucket's seal.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Sealed {
    pub at: pg_sys::TimestampTz,
    pub relfilenode: pg_sys::Oid,
}

/// A table to search, and its seal if it is a sealed bucket.
type Table = (pg_sys::Oid, Option<Sealed>);

/// The first of `tables` that holds `digest`, as [`unique::look_up`] sees it; a sealed bucket
/// whose filter rules the key out is not searched.
fn search(tables: &[Table], digest: Uuid) -> Result<Seen> {
    let key = digest.into_datum().expect("a uuid datum");
    filters::cover(tables.iter().filter_map(|&(table, sealed)| Some((table, sealed?))))?;
    let ruled_out = filters::ruled_out(digest.as_bytes());
    for &(table, sealed) in tables {
        if sealed.is_some_and(|sealed| ruled_out(table, sealed)) {
            continue;
        }
        match unique::look_up(table, c"key_digest", key)? {
            Seen::Absent => {}
            seen => return Ok(seen),
        }
    }
    Ok(Seen::Absent)
}

/// After claims found the ledger without buckets and inserted `digests` into it as new: a
/// bucket made since may hold one of them from a claimer that searched the ledger before
/// this row was there, so both would count as new. This claim then fails with a
/// serialization failure (40001), which undoes its row; a claimer still in progress is
/// waited for first, and if it rolls back, this claim stands.
pub fn recheck(digests: &[Uuid]) -> Result<()> {
    if digests.is_empty() || known_without_children()? {
        return Ok(());
    }
    let Opened { oid: ledger, owner, has_children, .. } = ledger()?;
    if !has_children {
        return Ok(());
    }
    for &digest in digests {
        loop {
            // Under the key's lock, as every claimer searches: one that searched the ledger
            // before this row was there either holds it still (and is waited for) or has
            // inserted its own row, which this search then meets.
            let lock = KeyLock::take(ledger, digest.as_bytes())?;
            let children = with_layout(ledger, owner, |layout| Ok(layout.children.clone()))?;
            let seen = search(&children, digest)?;
            lock.release()?;
            match seen {
                Seen::Absent => break,
                Seen::Busy(busy) => busy.wait()?,
                Seen::Duplicate | Seen::Invisible => return Err(unique::serialization_failure().into()),
            }
        }
    }
    Ok(())
}

/// The ledger, once the role may purge it (DELETE, as the purge's statements need): else
/// 42501, as the DELETE would raise.
fn may_purge() -> Result<Opened> {
    let ledger = ledger()?;
    // SAFETY: a privilege check that raises 42501 as the statement's would.
    unsafe {
        catch(|| {
            let allowed = ffi::pg_class_aclcheck(ledger.oid, ffi::GetUserId(), pg_sys::ACL_DELETE as pg_sys::AclMode);
            if allowed != pg_sys::AclResult::ACLCHECK_OK {
                ffi::aclcheck_error(allowed, pg_sys::ObjectType::OBJECT_TABLE, c"ledger".as_ptr());
            }
        })?;
    }
    Ok(ledger)
}

/// idempotency.maintain_ledger_buckets: the purge's upkeep of the buckets, for a role that may
/// purge, run as the ledger's owner, who owns the buckets.
fn maintain() -> Result<(i32, i32, i64)> {
    let Opened { oid: ledger, owner, .. } = may_purge()?;
    let counts = role::as_user(owner, || {
        MAINTAIN.run(&[DatumWithOid::from(BUCKETS_FROM.get()), DatumWithOid::from(ledger)], |rows| {
            (rows.get::<i32>(0, 1).unwrap_or(0), rows.get::<i32>(0, 2).unwrap_or(0), rows.get::<i64>(0, 3).unwrap_or(0))
        })
    })?;
    layout_changed(ledger)?;
    Ok(counts)
}

/// Sends the ledger's relcache invalidation at commit: every backend forgets its layout.
fn layout_changed(ledger: pg_sys::Oid) -> Result<()> {
    // SAFETY: queues an invalidation of an existing relation.
    Ok(unsafe { catch(|| ffi::CacheInvalidateRelcacheByRelid(ledger)) }?)
}

#[pg_extern(sql = false)]
fn maintain_ledger_buckets() -> TableIterator<
    'static,
    (name!(created, Option<i32>), name!(dropped, Option<i32>), name!(dropped_claims, Option<i64>)),
> {
    TableIterator::new(
        finish(maintain()).map(|(created, dropped, claims)| (Some(created), Some(dropped), Some(claims))),
    )
}
sqlstate_entry!(maintain_ledger_buckets_entry, pg_finfo_maintain_ledger_buckets_entry, maintain_ledger_buckets_wrapper);

#[pg_extern(sql = false)]
fn ledger_layout_changed() {
    finish(ledger().and_then(|ledger| layout_changed(ledger.oid)));
}
sqlstate_entry!(ledger_layout_changed_entry, pg_finfo_ledger_layout_changed_entry, ledger_layout_changed_wrapper);

/// idempotency.ledger_holds_no_row_version: whether no snapshot can see a row version in the
/// ledger itself, so that the purge may truncate it (under a lock that keeps writers out).
#[pg_extern(sql = false)]
fn ledger_holds_no_row_version() -> Option<bool> {
    finish(ledger().and_then(|ledger| Ok(unique::holds_no_row_version(ledger.oid, c"key_digest")?.unwrap_or(false))))
}
sqlstate_entry!(
    ledger_holds_no_row_version_entry,
    pg_finfo_ledger_holds_no_row_version_entry,
    ledger_holds_no_row_version_wrapper
);

static MOVE: Statement = Statement {
    sql: "SELECT idempotency.move_to_buckets_as_owner($1, $2, idempotency.longest_default_retention(), $3)",
    args: &[pg_sys::INT8OID, pg_sys::INT8OID, pg_sys::BOOLOID],
};

/// idempotency.move_to_buckets: the purge's move of the ledger's own claims in a range of its
/// blocks into their buckets, for a role that may purge, as the ledger's owner.
fn move_claims(first_block: Option<i64>, last_block: Option<i64>, prepare: Option<bool>) -> Result<i64> {
    let first_block = required(first_block, "first_block")?;
    let last_block = required(last_block, "last_block")?;
    let prepare = required(prepare, "prepare")?;
    let Opened { oid: ledger, owner, .. } = may_purge()?;
    let args = [DatumWithOid::from(first_block), DatumWithOid::from(last_block), DatumWithOid::from(prepare)];
    let moved = role::as_user(owner, || MOVE.run(&args, |rows| rows.get::<i64>(0, 1).unwrap_or(0)))?;
    if moved > 0 {
        layout_changed(ledger)?;
    }
    Ok(moved)
}

#[pg_extern(sql = false)]
fn move_to_buckets(first_block: Option<i64>, last_block: Option<i64>, prepare: Option<bool>) -> Option<i64> {
    finish(move_claims(first_block, last_block, prepare))
}
sqlstate_entry!(move_to_buckets_entry, pg_finfo_move_to_buckets_entry, move_to_buckets_wrapper);

/// idempotency.key_barrier: the move's wait for a claim of the key in its search.
fn barrier(digest: Option<Uuid>) -> Result<bool> {
    let digest = required(digest, "key_digest")?;
    // The move calls it once per key it moves: the ledger is looked up once per backend.
    let ledger = match known_ledger()? {
        Some((ledger, _)) => ledger,
        None => ledger()?.oid,
    };
    KeyLock::take(ledger, digest.as_bytes())?.release()?;
    Ok(true)
}

#[pg_extern(sql = false)]
fn key_barrier(key_digest: Option<Uuid>) -> Option<bool> {
    finish(barrier(key_digest))
}
sqlstate_entry!(key_barrier_entry, pg_finfo_key_barrier_entry, key_barrier_wrapper);
