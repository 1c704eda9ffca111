//! Relcache invalidations for the extension's per-backend caches keyed by a table's OID (the
//! direct writes' plans and shapes). A backend has room for ten relcache callbacks
//! (MAX_RELCACHE_CALLBACKS), shared by every library it loads, and running out is FATAL: so
//! the extension registers one, when it is loaded, and that one tells each cache.

use std::cell::Cell;

use pgrx::pg_sys;

/// What forgets a cache's entries for a table, or for every table when the OID is 0.
pub type Forget = fn(pg_sys::Oid);

thread_local! {
    static LISTENERS: Cell<&'static [Forget]> = const { Cell::new(&[]) };
}

/// Registers the one callback, which calls each of `listeners` on every invalidation.
pub fn listen(listeners: &'static [Forget]) {
    LISTENERS.with(|l| l.set(listeners));
    // SAFETY: called once, from _PG_init; the callback only clears thread-local caches.
    unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(invalidated), pg_sys::Datum::from(0)) };
}

unsafe extern "C-unwind" fn invalidated(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    for forget in LISTENERS.with(Cell::get) {
        forget(relid);
    }
}
