//! Relcache invalidations for the extension's per-backend caches keyed by a table's OID (the
//! direct writes' plans and shapes). A backend has room for ten relcache callbacks
//! (MAX_RELCACHE_CALLBACKS), shared by every library it loads, and running out is FATAL: so
//! the extension registers one, when it is loaded, and that one tells each cache.
//!
//! What a cached entry was made from goes beyond the table's own relcache entry, and changes
//! without invalidating it: a schema's name and privileges (a generated statement names its
//! table by schema, and PostgreSQL re-reads a kept plan from that text), a function's
//! volatility (a CHECK calling it decides the direct path), a cast from text (which decides
//! how a value is made). A change to any schema, function or cast forgets every entry: such
//! changes are DDL, rare beside the writes the caches serve.
//!
//! DDL that must not act on a stale catalog reads the relcache too ([`triggers_named`]).

use std::cell::Cell;
use std::ffi::CStr;

use pgrx::pg_sys;

use super::{catch, ffi, PgError};

/// What forgets a cache's entries for a table, or for every table when the OID is 0.
pub type Forget = fn(pg_sys::Oid);

thread_local! {
    static LISTENERS: Cell<&'static [Forget]> = const { Cell::new(&[]) };
    static GENERATION: Cell<u64> = const { Cell::new(0) };
}

/// Counts invalidations. Building an entry reads the catalog, which can take in an
/// invalidation of the very table it is for: a cache keeps what it built only if the count
/// did not move meanwhile, and otherwise uses it once.
pub fn generation() -> u64 {
    GENERATION.with(Cell::get)
}

/// Registers the one callback, which calls each of `listeners` on every invalidation.
pub fn listen(listeners: &'static [Forget]) {
    LISTENERS.with(|l| l.set(listeners));
    // SAFETY: called once, from _PG_init; the callbacks only clear thread-local caches.
    unsafe {
        pg_sys::CacheRegisterRelcacheCallback(Some(invalidated), pg_sys::Datum::from(0));
        for cache in [
            pg_sys::SysCacheIdentifier::NAMESPACEOID,
            pg_sys::SysCacheIdentifier::PROCOID,
            pg_sys::SysCacheIdentifier::CASTSOURCETARGET,
        ] {
            pg_sys::CacheRegisterSyscacheCallback(cache as i32, Some(catalog_changed), pg_sys::Datum::from(0));
        }
    }
}

unsafe extern "C-unwind" fn catalog_changed(_arg: pg_sys::Datum, _cache: i32, _hash: u32) {
    invalidated(pg_sys::Datum::from(0), pg_sys::InvalidOid);
}

unsafe extern "C-unwind" fn invalidated(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    GENERATION.with(|g| g.set(g.get() + 1));
    for forget in LISTENERS.with(Cell::get) {
        forget(relid);
    }
}

/// The triggers named `name` on `tables`, as (table, trigger function), once each of them is
/// locked in `mode`. Read from the relcache, which takes in every change committed before the
/// lock was granted: a query would read the catalog by the transaction's snapshot, which
/// under REPEATABLE READ misses a trigger committed after it was taken. A table dropped
/// meanwhile is skipped.
pub fn triggers_named(
    tables: &[pg_sys::Oid],
    name: &CStr,
    mode: pg_sys::LOCKMODE,
) -> Result<Vec<(pg_sys::Oid, pg_sys::Oid)>, PgError> {
    let mut found = Vec::new();
    for &relid in tables {
        // SAFETY: an error opening the table (a failed lock) is caught; the relcache entry is
        // only read, and closed, keeping its lock, before the next table.
        unsafe {
            // It locks first, then looks the table up: what it opens is as committed by then.
            let rel = catch(|| ffi::try_relation_open(relid, mode))?;
            if rel.is_null() {
                continue;
            }
            let triggers = (*rel).trigdesc;
            if !triggers.is_null() {
                for trigger in std::slice::from_raw_parts((*triggers).triggers, (*triggers).numtriggers as usize) {
                    if CStr::from_ptr(trigger.tgname) == name {
                        found.push((relid, trigger.tgfoid));
                    }
                }
            }
            ffi::relation_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        }
    }
    Ok(found)
}
