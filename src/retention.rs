//! Retention: how long a claim must outlive its message. Retention = broker retention + DLQ
//! retention + replay window + buffer, declared per scope (sql/retention.sql); undeclared
//! scopes use `idempotency.default_retention`. The purge itself is SQL (a procedure that
//! commits between batches); here live the setting and the late-replay guard of a claim.

use pgrx::datum::{DatumWithOid, Interval, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

use crate::digest::{abbreviate, Scope};
use crate::error::{warn, IdemError, Result, SqlState};
use crate::postgres::spi::Statement;

/// Seven days, NServiceBus's KeepDeduplicationDataFor default: long enough for a week-end's
/// DLQ to be replayed on Monday. Production scopes should declare their own.
pub const DEFAULT_RETENTION_SECONDS: i32 = 7 * 24 * 3600;

pub static DEFAULT_RETENTION: GucSetting<i32> = GucSetting::<i32>::new(DEFAULT_RETENTION_SECONDS);

pub fn define_settings() {
    GucRegistry::define_int_guc(
        c"idempotency.default_retention",
        c"How long claims of undeclared scopes are kept before idem_purge may delete them.",
        c"Declared scopes (idem_declare_scope) use broker + DLQ retention + replay window + buffer instead.",
        &DEFAULT_RETENTION,
        1,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
}

/// A retention setting's seconds as an interval. Whole days stay days, so the setting reads
/// back as '7 days' rather than '168:00:00'.
pub fn seconds_interval(seconds: i32) -> Interval {
    Interval::new(0, seconds / 86_400, i64::from(seconds % 86_400) * 1_000_000)
        .expect("a positive int4 number of seconds is a valid interval")
}

fn default_retention() -> Interval {
    seconds_interval(DEFAULT_RETENTION.get())
}

static LATE: Statement = Statement {
    sql: "SELECT $2 OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) COALESCE(s.retention, $3)), \
                 COALESCE(s.late_replay, 'error'), COALESCE(s.retention, $3)::text \
          FROM (VALUES (1)) AS one(x) \
          LEFT JOIN idempotency.scopes AS s ON s.scope_id OPERATOR(pg_catalog.=) $1",
    args: &[pg_sys::INT8OID, pg_sys::TIMESTAMPTZOID, pg_sys::INTERVALOID],
};

/// A new claim for a message sent before its scope's retention began: the record of an
/// earlier delivery may have been purged, so "new" cannot be trusted. Raises ID004, or warns
/// with it when the scope was declared with late_replay => 'warn'.
pub fn check_late_replay(scope: &Scope<'_>, sent_at: TimestampWithTimeZone) -> Result<()> {
    let args = [DatumWithOid::from(scope.id), DatumWithOid::from(sent_at), DatumWithOid::from(default_retention())];
    let (late, mode, retention) =
        LATE.run(&args, |rows| (rows.get::<bool>(0, 1), rows.get::<String>(0, 2), rows.get::<String>(0, 3)))?;
    if late != Some(true) {
        return Ok(());
    }
    let report = IdemError::new(
        SqlState::LateReplay,
        format!("message is older than the retention of scope \"{}\" ({})", abbreviate(scope.name), retention.unwrap_or_default()),
    )
    .detail(format!("It was sent at {sent_at}; the claim of an earlier delivery may already have been purged, so a duplicate of it can no longer be recognised."))
    .hint("Replay old messages only after idem_declare_scope gives the scope a replay window that covers them.");
    if mode.as_deref() == Some("warn") {
        warn(report);
        Ok(())
    } else {
        Err(report)
    }
}

#[pg_extern(sql = false)]
fn idem_default_retention() -> Interval {
    default_retention()
}
