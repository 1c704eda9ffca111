//! The error contract: every failure a caller can provoke carries a documented SQLSTATE.
//!
//! pgrx can only raise the SQLSTATEs in its own enum and turns any other code into XX000, so
//! our own class `ID` could not pass through it. Instead a failing call stashes its error and
//! returns; a thin C entry point (see [`sqlstate_entry!`]) raises the stash once every Rust
//! frame of the call has returned, with the exact code, message, detail and hint.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CString};

use pgrx::pg_sys;

use crate::postgres::{ffi, PgError};

/// The SQLSTATEs this extension raises; tests/sqlstate_table.sh checks that README.md's error table lists each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SqlState {
    /// 22004: a required argument was NULL.
    NullValueNotAllowed,
    /// 22023: an argument has a value that can never be valid (empty key, negative position).
    InvalidParameterValue,
    /// 55P03: a no-wait claim met an uncommitted claim of the same key.
    LockNotAvailable,
    /// 42703: a named column does not exist.
    UndefinedColumn,
    /// 42P10: the key columns match no unique index (or the table has no primary key).
    InvalidColumnReference,
    /// 42883: the version column's type has no ordering.
    UndefinedFunction,
    /// 42P01: the target table does not exist.
    UndefinedTable,
    /// 42804: a key part of a type that has no promised text form (cast it to text).
    DatatypeMismatch,
    /// 42809: the target is not a table (a view, a sequence, …).
    WrongObjectType,
    /// 25P01: a relay's call outside a transaction block, where its locks would not last.
    NoActiveTransaction,
    /// 25001: a step of the external-call ledger inside a transaction block, where what it
    /// records would not be committed before the external call is made.
    ActiveTransaction,
    /// 55000: resolving an external call that is already confirmed.
    ObjectNotInPrerequisiteState,
    /// 428C9: a version guard on a generated column, which BEFORE triggers cannot see.
    GeneratedAlways,
    /// 42710: a table's trigger already has the guard's name but is not the guard.
    DuplicateObject,
    /// 0A000: the database's encoding is not UTF8.
    FeatureNotSupported,
    /// 54001: a jsonb argument nests deeper than the extension reads.
    StatementTooComplex,
    /// XX001: a jsonb argument whose lengths point outside it, which PostgreSQL's own
    /// functions never make; the in-place reader refuses it rather than read past it.
    DataCorrupted,
    /// ID001: the key was claimed before with a different payload, or a message id was sent
    /// before with another message.
    PayloadMismatch,
    /// ID002: the payload has no value at a path that makes up its key.
    KeyMissingFromPayload,
    /// ID003: a result was stored for a key that has no claim, a message sent without a
    /// claim to derive its id from, or an external call confirmed or resolved that was never
    /// begun.
    NotClaimed,
    /// ID004: a new claim for a message older than its scope's retention: its record may
    /// already have been purged, so it may be a duplicate that can no longer be recognised.
    LateReplay,
}

impl SqlState {
    pub const fn code(self) -> &'static [u8; 5] {
        match self {
            SqlState::NullValueNotAllowed => b"22004",
            SqlState::InvalidParameterValue => b"22023",
            SqlState::LockNotAvailable => b"55P03",
            SqlState::NoActiveTransaction => b"25P01",
            SqlState::ActiveTransaction => b"25001",
            SqlState::ObjectNotInPrerequisiteState => b"55000",
            SqlState::GeneratedAlways => b"428C9",
            SqlState::DuplicateObject => b"42710",
            SqlState::UndefinedColumn => b"42703",
            SqlState::InvalidColumnReference => b"42P10",
            SqlState::UndefinedFunction => b"42883",
            SqlState::WrongObjectType => b"42809",
            SqlState::UndefinedTable => b"42P01",
            SqlState::DatatypeMismatch => b"42804",
            SqlState::FeatureNotSupported => b"0A000",
            SqlState::StatementTooComplex => b"54001",
            SqlState::DataCorrupted => b"XX001",
            SqlState::PayloadMismatch => b"ID001",
            SqlState::KeyMissingFromPayload => b"ID002",
            SqlState::NotClaimed => b"ID003",
            SqlState::LateReplay => b"ID004",
        }
    }
}

/// A failure of a call: one of the extension's own documented errors, or an error PostgreSQL
/// raised on the way (a user's trigger, a constraint, a lock timeout), kept whole so that
/// the client sees it exactly as the equivalent statement would raise it.
#[derive(Debug)]
pub enum IdemError {
    Own(Report),
    Postgres(PgError),
}

/// One of the extension's own errors.
#[derive(Debug)]
pub struct Report {
    pub state: SqlState,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

pub type Result<T> = std::result::Result<T, IdemError>;

impl IdemError {
    pub fn new(state: SqlState, message: impl Into<String>) -> Self {
        IdemError::Own(Report { state, message: message.into(), detail: None, hint: None })
    }
    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        if let IdemError::Own(report) = &mut self {
            report.detail = Some(detail.into());
        }
        self
    }
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        if let IdemError::Own(report) = &mut self {
            report.hint = Some(hint.into());
        }
        self
    }
    /// The message prefixed with where in the arguments the error was found.
    pub fn within(mut self, place: &str) -> Self {
        if let IdemError::Own(report) = &mut self {
            report.message = format!("{place}: {}", report.message);
        }
        self
    }
    /// The extension's own SQLSTATE, or None for an error PostgreSQL raised.
    #[cfg(any(test, feature = "pg_test"))]
    pub fn state(&self) -> Option<SqlState> {
        match self {
            IdemError::Own(report) => Some(report.state),
            IdemError::Postgres(_) => None,
        }
    }
}

impl From<PgError> for IdemError {
    fn from(error: PgError) -> Self {
        IdemError::Postgres(error)
    }
}

/// An argument that must not be NULL. Functions are not STRICT so that a NULL is refused
/// loudly instead of silently turning the call into NULL (and the message into "processed").
pub fn required<T>(value: Option<T>, name: &str) -> Result<T> {
    value.ok_or_else(|| IdemError::new(SqlState::NullValueNotAllowed, format!("{name} must not be NULL")))
}

thread_local! {
    static PENDING: RefCell<Option<IdemError>> = const { RefCell::new(None) };
}

/// Ends a pgrx-wrapped call: the value on success, NULL with the error stashed otherwise.
pub fn finish<T>(result: Result<T>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(error) => {
            let error = match error {
                IdemError::Postgres(error) => IdemError::Postgres(error.persist()),
                own => own,
            };
            PENDING.with(|p| *p.borrow_mut() = Some(error));
            None
        }
    }
}

#[cfg_attr(target_os = "windows", link(name = "postgres"))]
unsafe extern "C-unwind" {
    fn errstart(elevel: c_int, domain: *const c_char) -> bool;
    fn errcode(sqlerrcode: c_int) -> c_int;
    fn errmsg(fmt: *const c_char, ...) -> c_int;
    fn errdetail(fmt: *const c_char, ...) -> c_int;
    fn errhint(fmt: *const c_char, ...) -> c_int;
    fn errfinish(filename: *const c_char, lineno: c_int, funcname: *const c_char);
}

/// Raises the stashed error, if any. Called from a C entry point after the pgrx wrapper has
/// returned: the only frame errfinish's longjmp skips is that entry point, which owns nothing.
///
/// # Safety
/// Must be called from a function that holds no value with a destructor.
#[inline]
pub unsafe fn raise_pending() {
    if let Some(error) = PENDING.with(|p| p.borrow_mut().take()) {
        raise(error);
    }
}

/// Raises one of the extension's errors at once, as an ERROR PostgreSQL itself raises: inside
/// [`crate::postgres::catch`] it is caught like any other.
///
/// # Safety
/// The caller's frames are skipped: they must hold no value with a destructor. A Postgres
/// error passed here is raised again as it was.
pub unsafe fn raise(error: IdemError) -> ! {
    match error {
        IdemError::Own(report) => {
            emit(pg_sys::PGERROR as c_int, report);
            unreachable!("errfinish returned from an ERROR");
        }
        IdemError::Postgres(error) => error.rethrow(),
    }
}

/// An argument (0-based position, name) that a function's entry point checks before pgrx
/// converts it, where a bad value would otherwise be a panic (XX000) or a wrong answer.
pub enum Check {
    /// A jsonb argument: pgrx reads it through serde_json, whose recursion limit refuses 128
    /// levels with a panic.
    Jsonb(usize, &'static str),
    /// An array whose answers line up with its elements: pgrx reads any array as a list
    /// from 1, so `result[i]` would not answer `keys[i]` for other subscripts or dimensions.
    OneBasedList(usize, &'static str),
}

/// How deep a jsonb argument may nest (see [`Check::Jsonb`]).
pub const JSONB_DEPTH_LIMIT: usize = 127;

/// What every call checks before pgrx converts its arguments: that the database is UTF8
/// (keys, scopes and payloads are digested as UTF-8 text; pgrx takes text as Rust strings,
/// and array elements unchecked, so other encodings' bytes would be read as invalid strings:
/// a backend crashed on `idem_key` in a SQL_ASCII database), and its [`Check`]s.
///
/// Everything here runs before pgrx's guard, so it calls PostgreSQL only through
/// [`crate::postgres::ffi`], whose ERRORs jump instead of unwinding, and holds nothing with a
/// destructor while it may raise.
///
/// # Safety
/// `fcinfo` is the call's, and each check names an argument of the type it reads.
pub unsafe fn check_arguments(fcinfo: pg_sys::FunctionCallInfo, checks: &[Check]) {
    if ffi::GetDatabaseEncoding() != pg_sys::pg_enc::PG_UTF8 as c_int {
        // Built in a block of its own: raise() jumps away, and no String may be left to drop.
        let error = {
            let encoding = std::ffi::CStr::from_ptr(ffi::GetDatabaseEncodingName()).to_string_lossy();
            IdemError::new(SqlState::FeatureNotSupported, format!("idempotency needs a UTF8 database, and this one is {encoding}"))
                .detail("Keys, scopes and payloads are digested as UTF-8 text, so that a key means the same in every database and after every restore.")
                .hint("Keep the ledger in a database created with ENCODING 'UTF8' (TEMPLATE template0).")
        };
        raise(error);
    }
    let args = (*fcinfo).args.as_slice((*fcinfo).nargs as usize);
    let value = |index: usize| args.get(index).filter(|a| !a.isnull).map(|a| a.value);
    for check in checks {
        match *check {
            Check::Jsonb(index, name) => {
                if value(index).is_some_and(|v| crate::jsonb::nests_deeper_than(v, JSONB_DEPTH_LIMIT)) {
                    raise(
                        IdemError::new(SqlState::StatementTooComplex, format!("{name} nests more than {JSONB_DEPTH_LIMIT} levels deep"))
                            .hint(format!("Payloads, results and responses are read as JSON values, to at most {JSONB_DEPTH_LIMIT} levels of arrays and objects.")),
                    );
                }
            }
            Check::OneBasedList(index, name) => {
                if value(index).is_some_and(|v| !crate::postgres::args::is_one_based_list(v)) {
                    raise(
                        IdemError::new(SqlState::InvalidParameterValue, format!("{name} must be a one-dimensional array with subscripts from 1"))
                            .detail("The answers are an array from 1, one per element, in order; other subscripts would not line up with them.")
                            .hint("Pass the elements as a plain array, e.g. ARRAY['a', 'b'] or array_agg(…)."),
                    );
                }
            }
        }
    }
}

/// Reports one of the extension's errors as a WARNING with its own SQLSTATE; a warning
/// returns, so it is safe anywhere.
pub fn warn(warning: IdemError) {
    if let IdemError::Own(report) = warning {
        // SAFETY: a WARNING returns from errfinish, so no frame is skipped.
        unsafe { emit(pg_sys::WARNING as c_int, report) }
    }
}

unsafe fn emit(level: c_int, report: Report) {
    let sqlstate = encode_sqlstate(report.state.code());
    let message = palloc_cstr(Some(report.message));
    let detail = palloc_cstr(report.detail);
    let hint = palloc_cstr(report.hint);
    if errstart(level, std::ptr::null()) {
        errcode(sqlstate);
        errmsg(c"%s".as_ptr(), message);
        if !detail.is_null() {
            errdetail(c"%s".as_ptr(), detail);
        }
        if !hint.is_null() {
            errhint(c"%s".as_ptr(), hint);
        }
        errfinish(std::ptr::null(), 0, std::ptr::null());
    }
}

/// PostgreSQL's MAKE_SQLSTATE: five characters packed six bits each.
const fn encode_sqlstate(code: &[u8; 5]) -> c_int {
    let mut packed = 0;
    let mut i = 0;
    while i < 5 {
        packed |= (((code[i] as c_int) - ('0' as c_int)) & 0x3F) << (6 * i);
        i += 1;
    }
    packed
}

/// Copies into the current memory context, which the error cleanup releases, so that no Rust
/// allocation is alive when errfinish jumps away.
fn palloc_cstr(text: Option<String>) -> *mut c_char {
    let Some(text) = text else { return std::ptr::null_mut() };
    let c = CString::new(text.replace('\0', "\\0")).expect("NUL bytes were replaced");
    // SAFETY: c is a NUL-terminated string alive for the call; pstrdup copies it.
    unsafe { pg_sys::pstrdup(c.as_ptr()) }
}

/// Declares the C entry point that SQL calls for a `#[pg_extern(sql = false)]` function: it
/// runs pgrx's wrapper (argument conversion, panic and error guard) and then raises a stashed
/// error with its own SQLSTATE.
/// `checks = [Check::…, …]` lists the arguments to check before pgrx converts them (see
/// [`check_arguments`]).
macro_rules! sqlstate_entry {
    ($entry:ident, $finfo:ident, $wrapper:path) => {
        $crate::error::sqlstate_entry!($entry, $finfo, $wrapper, checks = []);
    };
    ($entry:ident, $finfo:ident, $wrapper:path, checks = [$($check:expr),*]) => {
        $crate::error::v1_finfo!($finfo);

        #[no_mangle]
        #[doc(hidden)]
        pub unsafe extern "C-unwind" fn $entry(fcinfo: ::pgrx::pg_sys::FunctionCallInfo) -> ::pgrx::pg_sys::Datum {
            $crate::error::check_arguments(fcinfo, &[$($check),*]);
            let datum = $wrapper(fcinfo);
            $crate::error::raise_pending();
            datum
        }
    };
}
pub(crate) use sqlstate_entry;

/// The `pg_finfo_*` record that tells PostgreSQL a hand-declared C function uses the V1
/// calling convention.
macro_rules! v1_finfo {
    ($finfo:ident) => {
        #[no_mangle]
        #[doc(hidden)]
        pub extern "C" fn $finfo() -> &'static ::pgrx::pg_sys::Pg_finfo_record {
            const V1: ::pgrx::pg_sys::Pg_finfo_record = ::pgrx::pg_sys::Pg_finfo_record { api_version: 1 };
            &V1
        }
    };
}
pub(crate) use v1_finfo;
