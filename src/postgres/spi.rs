//! SPI statements, each prepared once per backend and kept for its life. PostgreSQL's plan
//! cache revalidates a kept plan after DDL on the tables it reads, so a kept plan never goes
//! stale; it only saves the parse and plan of every call.
//!
//! SPI is called through the unguarded declarations inside [`catch`], so an error a user's
//! trigger, constraint or policy raises in a statement reaches the client whole, without the
//! CONTEXT line naming the extension's own SQL (see [`install_executor_start_hook`]).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, CString};
use std::ptr;
use std::rc::Rc;

use pgrx::datum::{DatumWithOid, FromDatum, IntoDatum};
use pgrx::pg_sys;

use super::{catch, ffi, PgError};

/// How many times an INSERT that met a conflict and the read of the row it met are tried
/// together. The row can vanish in between (purged, resolved, deleted by hand), and then the
/// INSERT is new again; a row that is neither inserted nor readable every time is hidden
/// from the role (a policy) or dropped (a BEFORE trigger), and tries end with an error.
pub const CONFLICT_TRIES: usize = 3;

/// A fixed statement the extension runs. Every name in `sql` is schema-qualified (operators
/// too), so no search_path and no look-alike object can redirect it.
pub struct Statement {
    pub sql: &'static str,
    pub args: &'static [pg_sys::Oid],
}

/// A plan kept for the backend's life, or until its owner drops it.
pub struct Kept {
    plan: pg_sys::SPIPlanPtr,
    sql: String,
    /// Whether the statement names objects in the extension's schema (see [`execute`]).
    in_extension_schema: bool,
}

impl Drop for Kept {
    fn drop(&mut self) {
        // SAFETY: the plan was kept by SPI_keepplan and is freed once, here.
        unsafe { ffi::SPI_freeplan(self.plan) };
    }
}

thread_local! {
    static KEPT: RefCell<HashMap<usize, Rc<Kept>>> = RefCell::new(HashMap::new());
    /// The text of the extension's statement that SPI_execute_plan is about to start.
    static STARTING: Cell<*const c_char> = const { Cell::new(ptr::null()) };
    static PREVIOUS_EXECUTOR_START: Cell<pg_sys::ExecutorStart_hook_type> = const { Cell::new(None) };
}

/// SPI names the statement it runs in the CONTEXT of every message raised meanwhile, as
/// `SQL statement "…"`. The hand-written statement has no such line: an error's is removed
/// once caught ([`PgError::without_statement_line`]), but a trigger's NOTICE or WARNING is
/// sent as it is raised. So, as the extension's own statement starts, SPI's context callback
/// is taken off the stack: SPI pushed it just before, and restores the stack below it itself
/// when the statement ends.
pub fn install_executor_start_hook() {
    // SAFETY: called once, from _PG_init, before any statement of this backend runs.
    unsafe {
        PREVIOUS_EXECUTOR_START.with(|p| p.set(pg_sys::ExecutorStart_hook));
        pg_sys::ExecutorStart_hook = Some(executor_start);
    }
}

/// Not behind pgrx's guard, which would catch every statement's error raised further down
/// (a permission check's, say) and raise a copy of it with fields changed: the hook only reads
/// pointers, and an error of the executor passes through it untouched.
unsafe extern "C-unwind" fn executor_start(query: *mut pg_sys::QueryDesc, eflags: c_int) {
    let ours = STARTING.with(Cell::get);
    if !ours.is_null() && (*query).sourceText == ours {
        STARTING.with(|s| s.set(ptr::null()));
        // SPI's callback argument starts with the statement's text (SPICallbackArg, 14+).
        let top = pg_sys::error_context_stack;
        if !top.is_null() && !(*top).arg.is_null() && *(*top).arg.cast::<*const c_char>() == ours {
            pg_sys::error_context_stack = (*top).previous;
        }
    }
    let previous = PREVIOUS_EXECUTOR_START.with(Cell::get);
    // SAFETY: no value with a destructor is alive here, so an error's longjmp out of the
    // executor skips nothing of this frame.
    match previous {
        Some(previous) => previous(query, eflags),
        None => ffi::standard_ExecutorStart(query, eflags),
    }
}

impl Statement {
    /// Runs the statement and hands its result to `read`.
    pub fn run<R>(&'static self, args: &[DatumWithOid<'_>], read: impl FnOnce(&Rows) -> R) -> Result<R, PgError> {
        execute_with(&*self.kept()?, args, false, read)
    }

    /// Runs the statement as a check that must see every transaction committed before it:
    /// under REPEATABLE READ and SERIALIZABLE with the newest snapshot, not the transaction's,
    /// as PostgreSQL's foreign key checks read there (ri_PerformCheck); as run() otherwise.
    pub fn run_latest<R>(
        &'static self,
        args: &[DatumWithOid<'_>],
        read: impl FnOnce(&Rows) -> R,
    ) -> Result<R, PgError> {
        execute_with(&*self.kept()?, args, true, read)
    }

    fn kept(&'static self) -> Result<Rc<Kept>, PgError> {
        let id = self as *const Statement as usize;
        if let Some(plan) = KEPT.with(|k| k.borrow().get(&id).cloned()) {
            return Ok(plan);
        }
        let mut kept = prepare(self.sql, self.args)?;
        // The fixed statements name the extension's tables as `idempotency.…`.
        kept.in_extension_schema = self.sql.contains("idempotency.");
        let plan = Rc::new(kept);
        KEPT.with(|k| k.borrow_mut().insert(id, plan.clone()));
        Ok(plan)
    }
}

/// Prepares and keeps a statement (fixed or generated). Its plan is always the generic one:
/// a custom plan would fold the arguments into constants while planning, which changes
/// which of two bad values is reported first, and when (see versioned writes' gating
/// condition); a generic plan evaluates them when it runs, in the order the statement says.
pub fn prepare(sql: &str, args: &[pg_sys::Oid]) -> Result<Kept, PgError> {
    let text = CString::new(sql).expect("the extension's SQL holds no NUL");
    let mut types = args.to_vec();
    // SAFETY: the C string and the type array outlive the step, which owns nothing.
    let plan = unsafe {
        catch(|| {
            connect();
            let plan = ffi::SPI_prepare_cursor(
                text.as_ptr(),
                types.len() as i32,
                types.as_mut_ptr(),
                pg_sys::CURSOR_OPT_GENERIC_PLAN as i32,
            );
            if !plan.is_null() {
                ffi::SPI_keepplan(plan);
            }
            ffi::SPI_finish();
            plan
        })
    }
    .map_err(|e| e.without_statement_line(sql))?;
    assert!(!plan.is_null(), "idempotency could not prepare: {sql}");
    Ok(Kept { plan, sql: sql.to_string(), in_extension_schema: false })
}

fn connect() {
    // SAFETY: called inside a catch; SPI_connect fails only from a wrong nesting, a bug.
    let status = unsafe { ffi::SPI_connect() };
    assert_eq!(status, pg_sys::SPI_OK_CONNECT as i32, "SPI_connect failed");
}

/// Runs a kept plan in its own SPI connection and hands the rows to `read`, which copies out
/// what it needs: they are gone when the connection closes.
///
/// The statement typed by hand is parsed on every run, and parsing takes in the invalidations
/// other sessions committed (a REVOKE, an ALTER) and checks USAGE on each schema it names. A
/// kept plan is neither re-parsed when the role changes (SET ROLE, a SECURITY DEFINER caller)
/// nor made to look at new invalidations while its tables stay locked, so both are done here.
/// (A versioned write's target schema is checked when the target is opened.)
pub fn execute<R>(plan: &Kept, args: &[DatumWithOid<'_>], read: impl FnOnce(&Rows) -> R) -> Result<R, PgError> {
    execute_with(plan, args, false, read)
}

fn execute_with<R>(
    plan: &Kept,
    args: &[DatumWithOid<'_>],
    latest: bool,
    read: impl FnOnce(&Rows) -> R,
) -> Result<R, PgError> {
    let datums: Vec<Option<pg_sys::Datum>> = args.iter().map(|a| a.datum().map(|d| d.sans_lifetime())).collect();
    let mut values: Vec<pg_sys::Datum> = datums.iter().map(|d| d.unwrap_or(pg_sys::Datum::from(0))).collect();
    let nulls: Vec<c_char> = datums.iter().map(|d| if d.is_some() { b' ' } else { b'n' } as c_char).collect();
    // SAFETY: the argument arrays outlive the step, which owns nothing.
    let status = unsafe {
        catch(|| {
            ffi::AcceptInvalidationMessages();
            if plan.in_extension_schema {
                let schema = ffi::get_namespace_oid(c"idempotency".as_ptr(), true);
                if schema != pg_sys::InvalidOid {
                    super::write::check_schema_usage(schema);
                }
            }
            connect();
            let source =
                pg_sys::list_nth(ffi::SPI_plan_get_plan_sources(plan.plan), 0).cast::<pg_sys::CachedPlanSource>();
            STARTING.with(|s| s.set((*source).query_string));
            match if latest { super::write::check_snapshot() } else { None } {
                // Not read-only, so SPI copies the snapshot and advances its command counter:
                // the statement sees this transaction's own writes, as run() does.
                Some(snapshot) => ffi::SPI_execute_snapshot(
                    plan.plan,
                    values.as_mut_ptr(),
                    nulls.as_ptr(),
                    snapshot,
                    ptr::null_mut(),
                    false,
                    true,
                    0,
                ),
                None => ffi::SPI_execute_plan(plan.plan, values.as_mut_ptr(), nulls.as_ptr(), false, 0),
            }
        })
    };
    STARTING.with(|s| s.set(ptr::null()));
    let status = status.map_err(|e| e.without_statement_line(&plan.sql))?;
    assert!(status >= 0, "idempotency statement failed with SPI status {status}: {}", plan.sql);
    // SAFETY: SPI_execute_plan just set both; they stay valid until SPI_finish.
    let rows = unsafe { Rows { table: pg_sys::SPI_tuptable, count: pg_sys::SPI_processed as usize } };
    let result = read(&rows);
    // SAFETY: closes the connection opened above.
    unsafe { catch(|| ffi::SPI_finish())? };
    Ok(result)
}

/// Runs a statement once, unprepared: for DDL the extension issues on a user's behalf.
pub fn run_once(sql: &str) -> Result<(), PgError> {
    let text = CString::new(sql).expect("the extension's SQL holds no NUL");
    // SAFETY: the C string outlives the step, which owns nothing.
    let status = unsafe {
        catch(|| {
            connect();
            let status = ffi::SPI_execute(text.as_ptr(), false, 0);
            ffi::SPI_finish();
            status
        })
    }
    .map_err(|e| e.without_statement_line(sql))?;
    assert!(status >= 0, "idempotency statement failed with SPI status {status}: {sql}");
    Ok(())
}

/// The rows a statement returned, valid while its SPI connection is open.
pub struct Rows {
    table: *mut pg_sys::SPITupleTable,
    count: usize,
}

impl Rows {
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Column `column` (1-based) of row `row` (0-based), copied into Rust.
    pub fn get<T: FromDatum + IntoDatum>(&self, row: usize, column: i32) -> Option<T> {
        let (datum, null, type_oid) = self.value(row, column, T::type_oid());
        // SAFETY: the value is of T's type or binary-coercible to it (see value).
        unsafe { T::from_polymorphic_datum(datum, null, type_oid) }
    }

    /// A jsonb column (1-based) of row `row` (0-based), detoasted and copied into the memory
    /// of the caller's function call, so that it outlives the connection.
    pub fn get_jsonb(&self, row: usize, column: i32) -> Option<StoredJsonb> {
        let (datum, null, _) = self.value(row, column, pg_sys::JSONBOID);
        // SAFETY: a jsonb value (see value). SPI_palloc allocates in the memory of the
        // procedure that connected, which SPI_finish keeps.
        unsafe {
            if null {
                return None;
            }
            let value = pg_sys::pg_detoast_datum_packed(datum.cast_mut_ptr());
            let size = pgrx::varlena::varsize_any(value);
            let copy = pg_sys::SPI_palloc(size);
            std::ptr::copy_nonoverlapping(value.cast::<u8>(), copy.cast::<u8>(), size);
            Some(StoredJsonb(pg_sys::Datum::from(copy)))
        }
    }

    /// The value, whether it is NULL, and its type, once the type is known to read as
    /// `expected`. The statements read the extension's own tables, whose column types a DBA
    /// can still change: reading a text column's bytes as a uuid would give a wrong answer,
    /// so that is 42804 instead, as a statement that cannot coerce a column raises it.
    fn value(&self, row: usize, column: i32, expected: pg_sys::Oid) -> (pg_sys::Datum, bool, pg_sys::Oid) {
        assert!(row < self.count, "row {row} of {}", self.count);
        // SAFETY: the row exists, the table is live (see the type), and the column number is
        // the caller's statement's own; reading a value raises nothing. The type check's ERROR
        // is pgrx's panic, which unwinds through destructors; the (sub)transaction's abort
        // pops the SPI connection it leaves open.
        unsafe {
            let tuple = *(*self.table).vals.add(row);
            let desc = (*self.table).tupdesc;
            let type_oid = pg_sys::SPI_gettypeid(desc, column);
            if type_oid != expected && !pg_sys::IsBinaryCoercible(type_oid, expected) {
                let name = |oid| std::ffi::CStr::from_ptr(pg_sys::format_type_be(oid)).to_string_lossy().into_owned();
                pg_sys::panic::ErrorReport::new(
                    pgrx::PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
                    format!(
                        "column \"{}\" of the extension's table is of type {}, not {}",
                        std::ffi::CStr::from_ptr(pg_sys::SPI_fname(desc, column)).to_string_lossy(),
                        name(type_oid),
                        name(expected)
                    ),
                    "idempotency",
                )
                .set_hint("Its type was changed after CREATE EXTENSION; change it back with ALTER TABLE … ALTER COLUMN … TYPE.")
                .report(pgrx::PgLogLevel::ERROR);
            }
            let mut null = false;
            let datum = pg_sys::SPI_getbinval(tuple, desc, column, &mut null);
            (datum, null, type_oid)
        }
    }
}

/// A jsonb value handed back to the caller as the bytes the table holds. pgrx's JsonB goes
/// through serde_json, which stops at 128 levels of nesting: a result stored deeper (an UPDATE of
/// the ledger can store one) could not be replayed.
pub struct StoredJsonb(pg_sys::Datum);

impl IntoDatum for StoredJsonb {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(self.0)
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

pgrx::impl_sql_translatable!(StoredJsonb, "jsonb");

// SAFETY: the datum is a jsonb value in the memory of the call that returns it (see
// Rows::get_jsonb), returned as pgrx returns its own varlena types.
unsafe impl pgrx::callconv::BoxRet for StoredJsonb {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut pgrx::callconv::FcInfo<'fcx>) -> pgrx::datum::Datum<'fcx> {
        fcinfo.return_raw_datum(self.0)
    }
}
