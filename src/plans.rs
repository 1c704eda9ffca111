//! SPI statements, each prepared once per backend and kept for its life. PostgreSQL's plan
//! cache revalidates a kept plan after DDL on the tables it reads, so a kept plan never goes
//! stale; it only saves the parse and plan of every call.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::{self, PgOid};
use pgrx::spi::{OwnedPreparedStatement, Spi, SpiClient, SpiTupleTable};

/// A statement the extension runs. Every name in `sql` is schema-qualified (operators too),
/// so no search_path and no look-alike object can redirect it.
pub struct Statement {
    pub sql: &'static str,
    pub args: &'static [pg_sys::Oid],
}

thread_local! {
    static KEPT: RefCell<HashMap<usize, Rc<OwnedPreparedStatement>>> = RefCell::new(HashMap::new());
}

impl Statement {
    /// Runs the statement and hands its result to `read`, inside one SPI connection.
    pub fn run<R>(
        &'static self,
        args: &[DatumWithOid<'_>],
        read: impl FnOnce(SpiTupleTable<'_>) -> R,
    ) -> R {
        Spi::connect_mut(|client| {
            let plan = self.kept(client);
            let table = client
                .update(&*plan, None, args)
                .unwrap_or_else(|e| panic!("idempotency statement failed: {e}"));
            read(table)
        })
    }

    fn kept(&'static self, client: &SpiClient<'_>) -> Rc<OwnedPreparedStatement> {
        let id = self as *const Statement as usize;
        if let Some(plan) = KEPT.with(|k| k.borrow().get(&id).cloned()) {
            return plan;
        }
        let types: Vec<PgOid> = self.args.iter().map(|oid| PgOid::from(*oid)).collect();
        let plan = Rc::new(
            client
                .prepare_mut(self.sql, &types)
                .unwrap_or_else(|e| panic!("idempotency could not prepare a statement: {e}"))
                .keep(),
        );
        KEPT.with(|k| k.borrow_mut().insert(id, plan.clone()));
        plan
    }
}
