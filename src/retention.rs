//! Retention: how long a claim must outlive its message. Retention = broker retention + DLQ
//! retention + replay window + buffer, declared per scope (sql/retention.sql); undeclared
//! scopes use `idempotency.default_retention`. The purge itself is SQL (a procedure that
//! commits between batches); here live the setting and the late-replay guard of a claim.

use pgrx::datum::{DatumWithOid, Interval, TimestampWithTimeZone};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

use crate::digest::{abbreviate, Scope};
use crate::error::{sqlstate_entry, warn, IdemError, Result, SqlState};
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

// Late means sent before the purge's cutoff, reckoned as the purge reckons it (sql/
// idempotency--0.4.0--0.5.0.sql, idempotency.expired_before): retention subtracted in UTC, so
// that a day is 24 hours whatever the session's TimeZone and its daylight-saving changes. From
// the clock, not the transaction's start: a purge that committed while this transaction ran
// has cut at a later time than its start, and may have removed the claim of an earlier delivery.
// Written out rather than calling that function, which the SQL of older releases lacks.
static LATE: Statement = Statement {
    sql: "SELECT $2 OPERATOR(pg_catalog.<) pg_catalog.timezone('UTC', \
                 pg_catalog.timezone('UTC', pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.-) COALESCE(s.retention, $3)), \
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

// The setting as postgresql.conf, ALTER DATABASE and ALTER ROLE left it for this database.
static STORED_DEFAULT_RETENTIONS: Statement = Statement {
    sql: "SELECT pg_catalog.split_part(c, '=', 2) \
          FROM pg_catalog.pg_db_role_setting AS s, pg_catalog.unnest(s.setconfig) AS c \
          WHERE s.setdatabase OPERATOR(pg_catalog.=) ANY (ARRAY[0, $1]::pg_catalog.oid[]) \
            AND pg_catalog.lower(pg_catalog.split_part(c, '=', 1)) OPERATOR(pg_catalog.=) 'idempotency.default_retention'",
    args: &[pg_sys::OIDOID],
};

/// The longest retention any role's session in this database may use for undeclared scopes:
/// the purge runs as a role of its own (pg_cron's, a superuser), while a consumer's role may
/// have a longer one of its own (ALTER ROLE … SET), by which its late-replay guard trusts
/// claims the purge would otherwise remove. A stored value no session could parse is skipped,
/// as those sessions fall back to the default.
fn longest_default_retention() -> Result<Interval> {
    // SAFETY: reads the backend's database OID, set once connected.
    let database = unsafe { pg_sys::MyDatabaseId };
    let stored: Vec<String> = STORED_DEFAULT_RETENTIONS.run(&[DatumWithOid::from(database)], |rows| {
        (0..rows.len()).filter_map(|i| rows.get::<String>(i, 1)).collect()
    })?;
    let longest = stored
        .iter()
        .filter_map(|value| {
            let value = std::ffi::CString::new(value.as_str()).ok()?;
            let mut seconds = 0;
            // SAFETY: parses a C string into an int, as the setting's own check would.
            let parsed = unsafe {
                pg_sys::parse_int(value.as_ptr(), &mut seconds, pg_sys::GUC_UNIT_S as i32, std::ptr::null_mut())
            };
            (parsed && seconds >= 1).then_some(seconds)
        })
        .fold(DEFAULT_RETENTION.get(), i32::max);
    Ok(seconds_interval(longest))
}

#[pg_extern(sql = false)]
fn idem_longest_default_retention() -> Option<Interval> {
    crate::error::finish(longest_default_retention())
}
sqlstate_entry!(
    idem_longest_default_retention_entry,
    pg_finfo_idem_longest_default_retention_entry,
    idem_longest_default_retention_wrapper
);
