//! Backend-local values that belong to the current transaction: gone when it ends, and put
//! back as they were when a savepoint they were changed under is rolled back to, exactly as
//! the rows written next to them are.
//!
//! A value changed in subtransaction S is kept as a stack entry labelled S over the value
//! it replaced. Rolling back to S drops S's entries and those of every subtransaction
//! started after it (subtransaction ids only grow within a transaction); releasing S hands
//! its newest value to its parent. The end of the top-level transaction, by commit, abort or
//! PREPARE TRANSACTION, empties the stack.

use std::cell::RefCell;
use std::thread::LocalKey;

use pgrx::pg_sys;
use pgrx::prelude::*;
use sha2::{Digest, Sha256};

use super::{catch, ffi};
use crate::error::{IdemError, SqlState};

/// A value of the current transaction. Declare it in a `thread_local!` and [`register`] it.
pub struct TransactionLocal<T: Clone + 'static> {
    /// (subtransaction that set it, value), oldest first.
    stack: RefCell<Vec<(pg_sys::SubTransactionId, T)>>,
}

impl<T: Clone + 'static> TransactionLocal<T> {
    pub const fn new() -> TransactionLocal<T> {
        TransactionLocal { stack: RefCell::new(Vec::new()) }
    }

    /// The value in force, if this transaction set one.
    pub fn get(&self) -> Option<T> {
        self.stack.borrow().last().map(|(_, value)| value.clone())
    }

    /// Sets the value for the rest of the transaction, or until the current savepoint is
    /// rolled back to.
    pub fn set(&self, value: T) {
        // SAFETY: reads the current subtransaction's id; a set only runs inside a transaction.
        let current = unsafe { pg_sys::GetCurrentSubTransactionId() };
        let mut stack = self.stack.borrow_mut();
        match stack.last_mut() {
            Some((id, top)) if *id == current => *top = value,
            _ => stack.push((current, value)),
        }
    }

    fn end_of_transaction(&self) {
        self.stack.borrow_mut().clear();
    }

    fn rolled_back(&self, sub: pg_sys::SubTransactionId) {
        self.stack.borrow_mut().retain(|(id, _)| *id < sub);
    }

    fn released(&self, sub: pg_sys::SubTransactionId, parent: pg_sys::SubTransactionId) {
        let mut stack = self.stack.borrow_mut();
        let Some(first) = stack.iter().position(|(id, _)| *id >= sub) else { return };
        let (_, newest) = stack.pop().expect("an entry at or after first");
        stack.truncate(first);
        match stack.last_mut() {
            Some((id, top)) if *id == parent => *top = newest,
            _ => stack.push((parent, newest)),
        }
    }
}

/// Something the transaction callbacks reach: a `TransactionLocal` behind its `LocalKey`.
trait Registered {
    fn end_of_transaction(&'static self);
    fn rolled_back(&'static self, sub: pg_sys::SubTransactionId);
    fn released(&'static self, sub: pg_sys::SubTransactionId, parent: pg_sys::SubTransactionId);
}

impl<T: Clone + 'static> Registered for LocalKey<TransactionLocal<T>> {
    fn end_of_transaction(&'static self) {
        self.with(TransactionLocal::end_of_transaction);
    }
    fn rolled_back(&'static self, sub: pg_sys::SubTransactionId) {
        self.with(|local| local.rolled_back(sub));
    }
    fn released(&'static self, sub: pg_sys::SubTransactionId, parent: pg_sys::SubTransactionId) {
        self.with(|local| local.released(sub, parent));
    }
}

thread_local! {
    static REGISTERED: RefCell<Vec<&'static dyn Registered>> = const { RefCell::new(Vec::new()) };
}

/// Makes the transaction's end and its savepoints reach `local`; once per backend, from
/// `_PG_init`.
pub fn register<T: Clone + 'static>(local: &'static LocalKey<TransactionLocal<T>>) {
    REGISTERED.with(|all| {
        let mut all = all.borrow_mut();
        if all.is_empty() {
            // SAFETY: registers plain functions for the life of the backend, once.
            unsafe {
                pg_sys::RegisterXactCallback(Some(on_transaction), std::ptr::null_mut());
                pg_sys::RegisterSubXactCallback(Some(on_subtransaction), std::ptr::null_mut());
            }
        }
        all.push(local);
    });
}

fn each(f: impl Fn(&'static dyn Registered)) {
    REGISTERED.with(|all| all.borrow().iter().for_each(|local| f(*local)));
}

#[pg_guard]
unsafe extern "C-unwind" fn on_transaction(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    if matches!(
        event,
        XACT_EVENT_COMMIT
            | XACT_EVENT_ABORT
            | XACT_EVENT_PREPARE
            | XACT_EVENT_PARALLEL_COMMIT
            | XACT_EVENT_PARALLEL_ABORT
    ) {
        each(|local| local.end_of_transaction());
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn on_subtransaction(
    event: pg_sys::SubXactEvent::Type,
    sub: pg_sys::SubTransactionId,
    parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    use pg_sys::SubXactEvent::*;
    match event {
        SUBXACT_EVENT_ABORT_SUB => each(|local| local.rolled_back(sub)),
        SUBXACT_EVENT_COMMIT_SUB => each(|local| local.released(sub, parent)),
        _ => {}
    }
}

/// Whether a parallel query runs, in which PostgreSQL refuses every write (25000): a worker,
/// or its leader, which also counts as inside a transaction block.
pub fn in_parallel_mode() -> bool {
    // SAFETY: reads the transaction state.
    unsafe { ffi::IsInParallelMode() }
}

/// Whether the caller is inside BEGIN … COMMIT, where what it locks stays locked between
/// statements.
pub fn in_transaction_block() -> bool {
    // SAFETY: reads the transaction state.
    unsafe { pg_sys::IsTransactionBlock() }
}

/// Who asks for an ordering key's lock (see [`lock_ordering_key`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// idem_send, which writes the outbox next.
    Sender,
    /// Whoever calls the SQL function.
    Anyone,
}

/// Takes the lock of an outbox ordering key, held until the transaction ends (or the current
/// savepoint is rolled back to): an exclusive lock on the object (idempotency.outbox, the
/// first 48 bits of SHA-256 over the key), as pg_locks shows it. Two keys share a lock only
/// when their hashes collide, which orders them together and changes nothing else. Waits as
/// any lock does: lock_timeout, deadlock detection (40P01) and cancel apply.
///
/// `Caller::Anyone` is the SQL function idempotency.lock_ordering_key, which every role may
/// execute: it takes the lock only for a role that may write the outbox (INSERT or UPDATE, on
/// the table or on a column), as the senders and requeuers it is for can, so that no other
/// role can hold up a key's senders. idem_send's own INSERT checks its privilege after the
/// lock, and its error ends the lock with the transaction or savepoint.
///
/// Under the lock, before a sender or a requeue draws the message's number, it refuses what
/// would number one key's messages out of commit order (55000, see [`order_hazard`]); the
/// relays refuse to take meanwhile, or they would deliver them so once it is put back.
pub fn lock_ordering_key(key: &[u8], caller: Caller) -> Result<(), IdemError> {
    let hash = Sha256::digest(key);
    let objid = u32::from_be_bytes(hash[..4].try_into().expect("SHA-256 has 32 bytes"));
    let objsubid = u16::from_be_bytes(hash[4..6].try_into().expect("SHA-256 has 32 bytes"));
    // SAFETY: looks names up (raising 3F000 or 42P01 as SQL would), waits for a lock and
    // reads a catalog row; it holds nothing with a destructor across them.
    let hazard = unsafe {
        catch(|| {
            let schema = ffi::get_namespace_oid(c"idempotency".as_ptr(), false);
            let outbox = ffi::get_relname_relid(c"outbox".as_ptr(), schema);
            if outbox == pg_sys::InvalidOid {
                pgrx::ereport!(
                    ERROR,
                    PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
                    "relation \"idempotency.outbox\" does not exist"
                );
            }
            let (user, write) = (ffi::GetUserId(), (pg_sys::ACL_INSERT | pg_sys::ACL_UPDATE) as pg_sys::AclMode);
            // On the table, or on any of its columns, as a column-level GRANT lets a role send.
            if caller == Caller::Anyone
                && ffi::pg_class_aclmask(outbox, user, write, pg_sys::AclMaskHow::ACLMASK_ANY) == 0
                && ffi::pg_attribute_aclcheck_all(outbox, user, write, pg_sys::AclMaskHow::ACLMASK_ANY)
                    != pg_sys::AclResult::ACLCHECK_OK
            {
                ffi::aclcheck_error(
                    pg_sys::AclResult::ACLCHECK_NO_PRIV,
                    pg_sys::ObjectType::OBJECT_TABLE,
                    c"outbox".as_ptr(),
                );
            }
            ffi::LockDatabaseObject(
                outbox,
                pg_sys::Oid::from(objid),
                objsubid,
                pg_sys::AccessExclusiveLock as pg_sys::LOCKMODE,
            );
            order_hazard(schema, outbox)
        })
    }?;
    refuse(hazard)
}

/// What a relay's take checks before it hands anything out: what may have numbered one key's
/// messages out of commit order (55000, see [`order_hazard`]) must not be passed on.
pub fn require_ordered_numbering() -> Result<(), IdemError> {
    // SAFETY: looks names up (raising 3F000 as SQL would) and reads catalog rows; it holds
    // nothing with a destructor across them.
    let hazard = unsafe {
        catch(|| {
            let schema = ffi::get_namespace_oid(c"idempotency".as_ptr(), false);
            order_hazard(schema, ffi::get_relname_relid(c"outbox".as_ptr(), schema))
        })
    }?;
    refuse(hazard)
}

/// What breaks the promise that one key's messages are numbered in commit order.
enum Hazard {
    /// `idempotency.outbox_seq` with a CACHE above 1: each session numbers from a block of its
    /// own.
    SequenceCache,
    /// `ordering_key` under a nondeterministic collation, named: the lock hashes a key's bytes,
    /// so `'k'` and `'K'` would serialize apart while the relays group them as one key.
    Collation(String),
}

/// The first hazard of the outbox in `schema` (`outbox` may be InvalidOid). Unguarded.
unsafe fn order_hazard(schema: pg_sys::Oid, outbox: pg_sys::Oid) -> Option<Hazard> {
    if sequence_cache(ffi::get_relname_relid(c"outbox_seq".as_ptr(), schema)) > 1 {
        return Some(Hazard::SequenceCache);
    }
    let collation = column_collation(outbox, c"ordering_key");
    if collation == pg_sys::InvalidOid || ffi::get_collation_isdeterministic(collation) {
        return None;
    }
    let name = std::ffi::CStr::from_ptr(ffi::get_collation_name(collation));
    Some(Hazard::Collation(name.to_string_lossy().into_owned()))
}

fn refuse(hazard: Option<Hazard>) -> Result<(), IdemError> {
    match hazard {
        None => Ok(()),
        Some(Hazard::SequenceCache) => Err(IdemError::new(
            SqlState::ObjectNotInPrerequisiteState,
            "idempotency.outbox_seq has a CACHE above 1, which numbers messages out of commit order",
        )
        .hint("ALTER SEQUENCE idempotency.outbox_seq CACHE 1;")),
        Some(Hazard::Collation(name)) => Err(IdemError::new(
            SqlState::ObjectNotInPrerequisiteState,
            format!("idempotency.outbox.ordering_key has the nondeterministic collation \"{name}\", under which keys that differ would be ordered as one"),
        )
        .detail("Senders serialize on a key's bytes, relays group keys by the column's collation: two keys equal only under the collation would be numbered apart and delivered as one, out of commit order.")
        .hint("ALTER TABLE idempotency.outbox ALTER COLUMN ordering_key TYPE text COLLATE \"default\";")),
    }
}

/// The collation of column `name` of `relid`, in one catalog lookup (a keyed send makes it),
/// or InvalidOid for no such table or column, or one of a type without collations. Unguarded.
unsafe fn column_collation(relid: pg_sys::Oid, name: &std::ffi::CStr) -> pg_sys::Oid {
    if relid == pg_sys::InvalidOid {
        return pg_sys::InvalidOid;
    }
    let tuple = ffi::SearchSysCacheAttName(relid, name.as_ptr());
    if tuple.is_null() {
        return pg_sys::InvalidOid;
    }
    let collation = (*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_attribute>(tuple)).attcollation;
    ffi::ReleaseSysCache(tuple);
    collation
}

/// pg_sequence's row (catalog/pg_sequence.h, unchanged since PostgreSQL 10), which pgrx does
/// not bind.
#[repr(C)]
struct PgSequenceRow {
    seqrelid: pg_sys::Oid,
    seqtypid: pg_sys::Oid,
    seqstart: i64,
    seqincrement: i64,
    seqmax: i64,
    seqmin: i64,
    seqcache: i64,
    seqcycle: bool,
}

/// A sequence's CACHE, or 1 for no sequence. Unguarded.
unsafe fn sequence_cache(sequence: pg_sys::Oid) -> i64 {
    if sequence == pg_sys::InvalidOid {
        return 1;
    }
    let tuple = ffi::SearchSysCache1(pg_sys::SysCacheIdentifier::SEQRELID as i32, pg_sys::Datum::from(sequence));
    if tuple.is_null() {
        return 1;
    }
    let cache = (*pg_sys::heap_tuple_get_struct::<PgSequenceRow>(tuple)).seqcache;
    ffi::ReleaseSysCache(tuple);
    cache
}
