//! idempotency: the Idempotent Receiver pattern as one call inside the consumer's own
//! PostgreSQL transaction. One module per concept; the SQL surface is declared by hand in
//! `sql/api.sql`, so that the contract a user reads is the contract the code implements.

use pgrx::prelude::*;

mod claim;
mod diagnostics;
mod digest;
mod error;
mod external;
mod jsonb;
mod keys;
mod outbox;
mod postgres;
mod retention;
mod versioned;
mod watermarks;

::pgrx::pg_module_magic!(name, version);

extension_sql_file!("../sql/schema.sql", name = "schema", bootstrap);
extension_sql_file!("../sql/api.sql", name = "api");
extension_sql_file!("../sql/retention.sql", name = "retention", requires = ["api"]);
// Each release's upgrade script after 0.2.0 is also the tail of a fresh install's script, so
// that what it creates is defined once.
extension_sql_file!("../sql/idempotency--0.2.0--0.3.0.sql", name = "outbox", requires = ["retention"]);
extension_sql_file!("../sql/idempotency--0.3.0--0.4.0.sql", name = "streams", requires = ["outbox"]);
extension_sql_file!("../sql/idempotency--0.4.0--0.5.0.sql", name = "hostile_input", finalize);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    postgres::relcache::listen(&[
        postgres::write::forget_shape,
        claim::forget_layout,
        versioned::forget_plans,
        watermarks::forget_direct_move,
    ]);
    postgres::spi::install_executor_start_hook();
    retention::define_settings();
    claim::define_settings();
    postgres::write::define_settings();
    outbox::init();
    external::define_settings();
    diagnostics::define_settings();
}

#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
