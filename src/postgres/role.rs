//! Steps run as another role: the extension's own bookkeeping that a consumer role must not
//! need privileges for, done as the owner of the table it writes, the way a SECURITY DEFINER
//! function would run it, but without a function that any role could call.

use std::cell::Cell;
use std::ffi::CStr;

use pgrx::pg_sys;

use super::write::open_owned;
use super::PgError;

/// The owner of `schema`.`name`, a table the extension owns (see [`open_owned`]; `cached`
/// keeps its OIDs). Takes RowExclusiveLock on it, which the caller's write needs anyway.
pub fn owner_of(schema: &CStr, name: &CStr, cached: &Cell<(pg_sys::Oid, pg_sys::Oid)>) -> Result<pg_sys::Oid, PgError> {
    // SAFETY: the relation is open between the two calls, and closing it keeps its lock.
    unsafe {
        let rel = open_owned(schema, name, cached)?;
        let owner = (*(*rel).rd_rel).relowner;
        pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        Ok(owner)
    }
}

/// Runs `step` as `user`, in a security-restricted operation (as SECURITY DEFINER functions
/// and maintenance commands run), then gives the caller back its own role, on every path:
/// an error's abort would also restore it, and a Rust error or panic drops the guard.
pub fn as_user<R>(user: pg_sys::Oid, step: impl FnOnce() -> R) -> R {
    struct Restore(pg_sys::Oid, i32);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: sets back what GetUserIdAndSecContext returned below.
            unsafe { pg_sys::SetUserIdAndSecContext(self.0, self.1) };
        }
    }
    let (mut saved_user, mut saved_context) = (pg_sys::InvalidOid, 0);
    // SAFETY: reads and sets backend-local state; neither call raises.
    let _restore = unsafe {
        pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_context);
        let restricted = (pg_sys::SECURITY_LOCAL_USERID_CHANGE | pg_sys::SECURITY_RESTRICTED_OPERATION) as i32;
        pg_sys::SetUserIdAndSecContext(user, saved_context | restricted);
        Restore(saved_user, saved_context)
    };
    step()
}
