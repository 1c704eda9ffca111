//! SPI statements, each prepared once per backend and kept for its life. PostgreSQL's plan
//! cache revalidates a kept plan after DDL on the tables it reads, so a kept plan never goes
//! stale; it only saves the parse and plan of every call.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::{self, PgOid};
use pgrx::spi::{OwnedPreparedStatement, Spi, SpiTupleTable};

/// A fixed statement the extension runs. Every name in `sql` is schema-qualified (operators
/// too), so no search_path and no look-alike object can redirect it.
pub struct Statement {
    pub sql: &'static str,
    pub args: &'static [pg_sys::Oid],
}

thread_local! {
    static KEPT: RefCell<HashMap<usize, Rc<OwnedPreparedStatement>>> = RefCell::new(HashMap::new());
}

impl Statement {
    /// Runs the statement and hands its result to `read`.
    pub fn run<R>(&'static self, args: &[DatumWithOid<'_>], read: impl FnOnce(SpiTupleTable<'_>) -> R) -> R {
        execute(&self.kept(), args, read)
    }

    fn kept(&'static self) -> Rc<OwnedPreparedStatement> {
        let id = self as *const Statement as usize;
        if let Some(plan) = KEPT.with(|k| k.borrow().get(&id).cloned()) {
            return plan;
        }
        let plan = Rc::new(prepare(self.sql, self.args));
        KEPT.with(|k| k.borrow_mut().insert(id, plan.clone()));
        plan
    }
}

/// Prepares and keeps a statement (fixed or generated) for the rest of the backend's life.
pub fn prepare(sql: &str, args: &[pg_sys::Oid]) -> OwnedPreparedStatement {
    let types: Vec<PgOid> = args.iter().map(|oid| PgOid::from(*oid)).collect();
    Spi::connect(|client| {
        client
            .prepare_mut(sql, &types)
            .unwrap_or_else(|e| panic!("idempotency could not prepare a statement: {e}"))
            .keep()
    })
}

/// Runs a kept plan in its own SPI connection and hands the result to `read`.
pub fn execute<R>(
    plan: &OwnedPreparedStatement,
    args: &[DatumWithOid<'_>],
    read: impl FnOnce(SpiTupleTable<'_>) -> R,
) -> R {
    Spi::connect_mut(|client| {
        let table = client
            .update(plan, None, args)
            .unwrap_or_else(|e| panic!("idempotency statement failed: {e}"));
        read(table)
    })
}
