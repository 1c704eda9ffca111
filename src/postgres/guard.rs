//! PostgreSQL errors kept whole.
//!
//! pgrx's guard around each `pg_sys` call turns an ERROR into a Rust panic that carries only
//! the SQLSTATEs it knows (others become XX000), the message, detail and hint: the schema,
//! table, column, datatype and constraint names and the CONTEXT are lost. [`catch`] is
//! PostgreSQL's own PG_TRY/PG_CATCH instead: it copies the whole ErrorData, and the entry
//! point raises it again with ReThrowError once every Rust frame has returned (see
//! [`crate::error`]). A caught error is never swallowed: the transaction it aborts is not
//! cleaned up by a subtransaction, so it must reach the client, as itself or replaced by one
//! of the extension's documented errors.

use std::mem::MaybeUninit;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use pgrx::pg_sys;

use super::ffi;

/// An error PostgreSQL raised, copied with every field into the caller's memory context.
#[derive(Debug)]
pub struct PgError(*mut pg_sys::ErrorData);

impl PgError {
    /// The SQLSTATE, packed as PostgreSQL packs it.
    pub fn sqlerrcode(&self) -> i32 {
        // SAFETY: the pointer comes from CopyErrorData and lives until the call ends.
        unsafe { (*self.0).sqlerrcode }
    }

    /// Drops the CONTEXT line, and the internal query, that SPI adds for one of the
    /// extension's own statements: the statement a user would have written has neither, and
    /// the generated SQL is ours.
    pub fn without_statement_line(self, sql: &str) -> PgError {
        // SAFETY: as above; the new context is palloc'd in the current memory context, which
        // lives as long as the copied error.
        unsafe {
            // An error raised while the statement was parsed also names it as the internal
            // query, which a driver shows (QUERY, LINE); the caller's own statement has none.
            let internal = (*self.0).internalquery;
            if !internal.is_null() && std::ffi::CStr::from_ptr(internal).to_bytes() == sql.as_bytes() {
                (*self.0).internalquery = std::ptr::null_mut();
                (*self.0).internalpos = 0;
            }
            let context = (*self.0).context;
            if context.is_null() {
                return self;
            }
            let text = std::ffi::CStr::from_ptr(context).to_string_lossy();
            let quoted = format!("\"{sql}\"");
            let kept: Vec<&str> = text.lines().filter(|line| !line.ends_with(&quoted)).collect();
            if kept.len() != text.lines().count() {
                (*self.0).context = if kept.is_empty() {
                    std::ptr::null_mut()
                } else {
                    let joined = std::ffi::CString::new(kept.join("\n")).expect("a C string's lines hold no NUL");
                    pg_sys::pstrdup(joined.as_ptr())
                };
            }
            self
        }
    }

    /// The same error, copied into the transaction's memory. A set-returning function's
    /// per-call memory, where [`catch`] copied it, is freed when the function returns, before
    /// the entry point raises the error again (an assert-enabled server wipes it and TRAPs in
    /// ReThrowError); the transaction's memory lasts until that raise aborts it.
    pub fn persist(self) -> PgError {
        // SAFETY: inside a function call there is a transaction; ReThrowError raises at once,
        // catch copies the error into the current (transaction) context, and the context is
        // switched back on both paths before anything else runs.
        unsafe {
            let caller = pg_sys::MemoryContextSwitchTo(pg_sys::TopTransactionContext);
            let copied = catch(|| ffi::ReThrowError(self.0));
            pg_sys::MemoryContextSwitchTo(caller);
            match copied {
                Err(error) => error,
                Ok(never) => never,
            }
        }
    }

    /// Raises the error again exactly as it was raised.
    ///
    /// # Safety
    /// Every Rust frame between here and PostgreSQL's handler is skipped: the caller must hold
    /// no value with a destructor.
    pub unsafe fn rethrow(self) -> ! {
        ffi::ReThrowError(self.0)
    }
}

/// Runs `step` as PG_TRY would: an ERROR raised inside comes back as [`PgError`] instead of
/// jumping past the caller. A Rust panic inside passes through unchanged.
///
/// PostgreSQL functions called inside should be the unguarded ones of [`ffi`]; a pgrx-guarded
/// one still works, but its error arrives as pgrx's partial panic.
///
/// # Safety
/// An error longjmps out of `step`'s frames without running destructors: `step` must hold
/// no value with a destructor across a call that can raise.
pub unsafe fn catch<T>(step: impl FnOnce() -> T) -> Result<T, PgError> {
    let caller_context = pg_sys::CurrentMemoryContext;
    let outer_handler = pg_sys::PG_exception_stack;
    let outer_context_stack = pg_sys::error_context_stack;
    let mut outcome = MaybeUninit::uninit();
    let jumped = cee_scape::call_with_sigsetjmp(false, |buffer| {
        // SAFETY: the buffer lives until call_with_sigsetjmp returns, and the outer handler is
        // restored below on both paths before anything else can raise.
        pg_sys::PG_exception_stack = buffer as *const cee_scape::SigJmpBufFields as *mut pg_sys::sigjmp_buf;
        outcome.write(catch_unwind(AssertUnwindSafe(step)));
        0
    });
    pg_sys::PG_exception_stack = outer_handler;
    pg_sys::error_context_stack = outer_context_stack;
    if jumped != 0 {
        // PG_CATCH: leave ErrorContext, take the error out of the error stack.
        pg_sys::CurrentMemoryContext = caller_context;
        let data = ffi::CopyErrorData();
        ffi::FlushErrorState();
        return Err(PgError(data));
    }
    // SAFETY: without a longjmp the closure ran to its end and wrote the outcome.
    match outcome.assume_init() {
        Ok(value) => Ok(value),
        Err(panic) => resume_unwind(panic),
    }
}
