//! Diagnostics: where duplicates come from. The delay between a key's first claim and a
//! duplicate names the likely source (a producer retry, a visibility timeout, a poll interval,
//! a consumer timeout, a replay), so with `idempotency.diagnostics` on, every duplicate a claim
//! suppresses is recorded with its first claim's time, in `idempotency.duplicates`, one row per
//! duplicate: no row that every consumer of a scope would update. `idem_diagnostics` (sql/)
//! turns them into per-scope counts, delay percentiles and a hint.
//!
//! Recording is a write in the claimer's transaction, so it is off by default: while off, a
//! duplicate claim does exactly what its statement does and nothing more.

use std::cell::Cell;

use pgrx::datum::{DatumWithOid, Interval, Uuid};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

use crate::digest::Scope;
use crate::error::Result;
use crate::postgres::role;
use crate::postgres::spi::Statement;

pub static DIAGNOSTICS: GucSetting<bool> = GucSetting::<bool>::new(false);

/// Thirty days: a month of duplicates to compare a week with the one before.
pub static RETENTION: GucSetting<i32> = GucSetting::<i32>::new(30 * 24 * 3600);

pub fn define_settings() {
    GucRegistry::define_bool_guc(
        c"idempotency.diagnostics",
        c"Record every duplicate a claim suppresses, for idem_diagnostics.",
        c"Each duplicate then writes a row in its claimer's transaction (and so takes a transaction id).",
        &DIAGNOSTICS,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"idempotency.diagnostics_retention",
        c"How long recorded duplicates are kept before idem_purge may delete them.",
        c"Keep it at least as long as the longest window you ask idem_diagnostics about.",
        &RETENTION,
        1,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
}

#[pg_extern(sql = false)]
fn idem_diagnostics_retention() -> Interval {
    crate::retention::seconds_interval(RETENTION.get())
}

// Run as the table's owner: a consumer role needs no privilege on idempotency.duplicates, so
// turning diagnostics on cannot make its claims fail with 42501, and no role can write the
// table but the claims. seen_at is the clock's time, not the transaction's start, so that a
// delay is never shorter than the time between the first claim and this one.
static RECORD: Statement = Statement {
    sql: "INSERT INTO idempotency.duplicates (seen_at, first_claimed_at, scope_id, key_digest, scope) \
          SELECT pg_catalog.clock_timestamp(), l.claimed_at, l.scope_id, l.key_digest, $1 \
          FROM pg_catalog.unnest($3) AS d(key_digest) \
          JOIN idempotency.ledger AS l ON l.key_digest OPERATOR(pg_catalog.=) d.key_digest \
          WHERE l.scope_id OPERATOR(pg_catalog.=) $2",
    args: &[pg_sys::TEXTOID, pg_sys::INT8OID, pg_sys::UUIDARRAYOID],
};

thread_local! {
    /// The OIDs of schema idempotency and of idempotency.duplicates (see `open_owned`).
    static DUPLICATES_OIDS: Cell<(pg_sys::Oid, pg_sys::Oid)> = const { Cell::new((pg_sys::InvalidOid, pg_sys::InvalidOid)) };
}

/// Records the duplicates of `scope` among `digests` (claims that found their key claimed
/// already), when diagnostics are on.
pub fn duplicates(scope: &Scope<'_>, digests: impl FnOnce() -> Vec<Uuid>) -> Result<()> {
    if !DIAGNOSTICS.get() {
        return Ok(());
    }
    let digests = digests();
    if digests.is_empty() {
        return Ok(());
    }
    let owner = DUPLICATES_OIDS.with(|oids| role::owner_of(c"idempotency", c"duplicates", oids))?;
    let args = [DatumWithOid::from(scope.name), DatumWithOid::from(scope.id), DatumWithOid::from(digests)];
    Ok(role::as_user(owner, || RECORD.run(&args, |_| ()))?)
}
